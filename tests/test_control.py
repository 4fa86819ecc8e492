"""Controlled runs (issue 13): the thread count, the reference kernel and the busy verdict."""

from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")
import torch  # noqa: E402

from lmcost.basics.errors import LmcostError  # noqa: E402
from lmcost.profiling.control import (REFERENCE_TOLERANCE, SPREAD_TOLERANCE, StepTimes, physical_cores,  # noqa: E402
                                      fast_half, quick, set_threads, spread)


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
            with pytest.raises(LmcostError, match="^threads: "):
                set_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_the_reported_figure_is_the_mean_of_the_faster_half_and_the_spread_is_the_median_over_it():
    # 5 samples: the faster half is ceil(5/2) = 3 of them, 1.0, 1.1, 1.5 (indices 1, 3, 2): mean 1.2;
    # the median 1.5: spread (1.5 - 1.2) / 1.2 = 0.25.
    values = [3.0, 1.0, 1.5, 1.1, 2.0]
    assert fast_half(values) == [1, 3, 2] and fast_half([2.0, 1.0]) == [1]
    assert quick(values) == pytest.approx(1.2) and spread(values) == pytest.approx(0.25)
    assert spread([2.0]) == 0.0


REF = {"compute": (1.00e-3, 1.05e-3), "memory": (10e-3, 10.2e-3)}
QUIET = {"prefill": [10e-3, 10.5e-3, 10.2e-3], "decode": [1e-3, 1.1e-3, 1e-3, 1.05e-3, 1e-3, 1.02e-3]}


def test_a_quiet_run_and_the_ways_a_run_is_busy():
    quiet = StepTimes(1, REF, wall=QUIET)
    assert quiet.drift() == pytest.approx(0.05) and quiet.busy() == []
    # The memory reference slowed 30% between before and after (tolerance 10%).
    drifted = StepTimes(1, {**REF, "memory": (10e-3, 13e-3)}, wall=QUIET)
    assert REFERENCE_TOLERANCE < 0.3 and drifted.busy() == ["the memory reference moved 30% (10 -> 13 ms; tolerance 10%)"]
    # Decode steps 1, 1, 1, 2, 2, 2 ms: the faster half's mean 1 ms, the median 1.5 ms: 50% slower.
    uneven = StepTimes(1, REF, wall={"prefill": QUIET["prefill"], "decode": [1e-3, 1e-3, 2e-3, 2e-3, 2e-3, 1e-3]})
    assert SPREAD_TOLERANCE < 0.5 and uneven.busy() == ["the typical decode step ran 50% slower than the reported figure "
                                                        "(tolerance 20%)"]
    # Steady, but in another state than its calibration: the compute reference's best, 1.0 ms, against
    # 0.7 ms when calibrated is 43% slower (tolerance 10%).
    unlike = StepTimes(1, REF, wall=QUIET, baseline_s={"compute": 0.7e-3, "memory": 10e-3})
    assert unlike.busy() == ["the compute reference ran 43% slower than in the calibration (0.7 -> 1 ms; tolerance 10%)"]


def test_step_times_round_trip_and_the_gap_outside_scopes():
    st = StepTimes(2, REF, wall={"prefill": [5e-3]}, scoped={"prefill": [6e-3, 7e-3, 6.5e-3]},
                   scope_sum={"prefill": [5e-3, 6.5e-3, 5.9e-3]})
    # Gaps per step: 1.0, 0.5, 0.6 ms: the median is 0.6 ms.
    assert st.gap_s("prefill") == pytest.approx(0.6e-3)
    assert StepTimes.from_dict(st.to_dict()) == st
    with pytest.raises(ValueError):
        StepTimes.from_dict({**st.to_dict(), "reference_s": {"compute": [1.0]}})


@pytest.mark.parametrize("edit", [
    {"wall": {"prefill": [-1.0], "decode": [1e-3]}},      # a negative time
    {"wall": {"prefill": [0.0], "decode": [1e-3]}},       # a step of no time
    {"wall": {"prefill": [True], "decode": [1e-3]}},      # a bool is not a time
    {"wall": {"prefill": [float("inf")], "decode": [1e-3]}},
    {"wall": {"prefill": [], "decode": [1e-3]}},          # a phase with no step
    {"wall": {"warmup": [1e-3]}},                         # not a phase
    {"reference_s": {"compute": [-1e-3, 1e-3]}},
    {"scope_sum": {"prefill": [-1e-3]}},
    {"threads": 0}, {"threads": True}, {"threads": "1"},
    {"waited_s": -1.0},
])
def test_a_tampered_record_is_refused(edit):
    good = StepTimes(1, REF, wall={"prefill": [5e-3], "decode": [1e-3]}, scoped={"prefill": [6e-3]},
                     scope_sum={"prefill": [5e-3]}).to_dict()
    assert StepTimes.from_dict(good).wall["prefill"] == [5e-3]
    with pytest.raises((ValueError, TypeError, KeyError)):
        StepTimes.from_dict({**good, **edit})


def test_settle_waits_for_the_calibrated_state_and_fast_state_is_the_faster_half(monkeypatch):
    from lmcost.profiling import control

    # Readings: 2.1 ms, then 2.0 ms (both >10% from a 1.7 ms baseline), then 1.8 ms (5.9%: within).
    readings = iter([{"compute": 2.1e-3}, {"compute": 2.0e-3}, {"compute": 1.8e-3}, {"compute": 9.9}])
    monkeypatch.setattr(control, "reference_times", lambda device: next(readings))
    last, waited = control.settle("cpu", {"compute": 1.7e-3}, timeout_s=60)
    assert last == {"compute": 1.8e-3} and waited >= 0
    # No baseline: one reading, no wait.
    readings = iter([{"compute": 2.1e-3}, {"compute": 9.9}])
    assert control.settle("cpu", None, timeout_s=60)[0] == {"compute": 2.1e-3}
    # The fast state over readings 3, 1, 2, 4 ms (the clock stays at 0 for three checks of a 1 s window,
    # then reads 10 s: four readings): the faster half (1, 2) averages 1.5 ms.
    readings = iter([{"compute": x} for x in (3e-3, 1e-3, 2e-3, 4e-3)])
    clock = iter([0.0, 0.0, 0.0, 0.0, 10.0])
    monkeypatch.setattr(control.time, "perf_counter", lambda: next(clock))
    assert control.fast_state("cpu", seconds=1.0) == {"compute": pytest.approx(1.5e-3)}
