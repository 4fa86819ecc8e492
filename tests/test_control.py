"""Controlled runs (issue 13): the thread count, the reference kernel and the busy verdict."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
import torch  # noqa: E402

from lmcost.errors import LmcostError  # noqa: E402
from lmcost.profiling.control import (REFERENCE_TOLERANCE, SPREAD_TOLERANCE, StepTimes, physical_cores,  # noqa: E402
                                      set_threads, spread)


def test_physical_cores_agree_with_proc_cpuinfo():
    # An independent count: /proc/cpuinfo's (physical id, core id) pairs of the CPUs this process may use.
    allowed = os.sched_getaffinity(0)
    pairs, cpu = set(), None
    with open("/proc/cpuinfo") as f:
        blocks = f.read().strip().split("\n\n")
    for block in blocks:
        fields = dict(line.split(":", 1) for line in block.splitlines() if ":" in line)
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        cpu = int(fields["processor"])
        if cpu in allowed:
            pairs.add((fields.get("physical id", "0"), fields.get("core id", str(cpu))))
    assert physical_cores() == len(pairs)


def test_set_threads_sets_torch_and_refuses_nonsense():
    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and torch.get_num_threads() == 1
        assert set_threads(None) == physical_cores() == torch.get_num_threads()
        for bad in (0, -2, 10_000):
            with pytest.raises(LmcostError, match="--threads"):
                set_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_spread_is_range_over_median():
    # (1.5 - 1.0) / median 1.1 = 0.4545...
    assert spread([1.0, 1.1, 1.5]) == pytest.approx(0.5 / 1.1)
    assert spread([2.0]) == 0.0


def test_a_quiet_run_and_the_two_ways_a_run_is_busy():
    quiet = StepTimes(1, (1.00e-3, 1.05e-3), wall={"prefill": [10e-3, 10.5e-3, 10.2e-3],
                                                   "decode": [1e-3, 1.1e-3, 1e-3, 1.05e-3, 1e-3, 1.02e-3]})
    assert quiet.drift() == pytest.approx(0.05) and quiet.busy() == []
    # The reference kernel slowed 30% between before and after (tolerance 15%).
    drifted = StepTimes(1, (1.0e-3, 1.3e-3), wall=quiet.wall)
    assert REFERENCE_TOLERANCE < 0.3 and drifted.busy() == ["the reference kernel moved 30% (1 -> 1.3 ms; tolerance 15%)"]
    # Decode repeats: per-repeat means 1.0, 2.0, 1.0 ms (two steps each): spread (2 - 1) / 1 = 100%.
    spread_out = StepTimes(1, (1e-3, 1e-3), wall={"prefill": [10e-3, 10e-3, 10e-3],
                                                  "decode": [1e-3, 1e-3, 2e-3, 2e-3, 1e-3, 1e-3]})
    assert SPREAD_TOLERANCE < 1.0 and spread_out.busy() == ["decode repeats spread 100% (tolerance 20%)"]


def test_step_times_round_trip_and_the_gap_outside_scopes():
    st = StepTimes(2, (1e-3, 1e-3), wall={"prefill": [5e-3]}, scoped={"prefill": [6e-3, 7e-3, 6.5e-3]},
                   scope_sum={"prefill": [5e-3, 6.5e-3, 5.9e-3]})
    # Gaps per repeat: 1.0, 0.5, 0.6 ms: the median is 0.6 ms.
    assert st.gap_s("prefill") == pytest.approx(0.6e-3)
    assert StepTimes.from_dict(st.to_dict()) == st
    with pytest.raises(ValueError):
        StepTimes.from_dict({**st.to_dict(), "reference_s": [1.0]})
