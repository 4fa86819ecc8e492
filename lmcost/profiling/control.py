"""Controlled measured runs: the intra-op thread count, a reference kernel timed before and after, and
the verdict on whether the machine stayed quiet while lmcost measured.

A measured time is only worth comparing with a prediction if the machine ran the same way throughout.
Two cheap witnesses say when it did not:
- the **reference kernel** (a fixed fp32 ``torch.mm``, :data:`REFERENCE_N` square; median of
  :data:`REFERENCE_CALLS` calls) timed just before and just after the run: another process taking cores
  or memory bandwidth in between moves it by more than :data:`REFERENCE_TOLERANCE`;
- the **spread of the repeats**: (max - min) / median of the per-repeat step times beyond
  :data:`SPREAD_TOLERANCE` means some repeats ran slower than others.

Either makes the run *busy*: its report says so, and ``validate --retries`` measures it again.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import LmcostError

#: Side of the reference kernel's square fp32 matmul (2 * 512^3 = 268 MFLOP: a few milliseconds on one
#: CPU core; on a GPU, 4x the side).
REFERENCE_N = 512
#: Calls of the reference kernel per reading; the median is the reading.
REFERENCE_CALLS = 15
#: The largest relative change of the reference kernel between before and after a quiet run. A CPU
#: core's clock and a shared cache move a ~1 ms kernel by a few percent; another busy process by tens.
REFERENCE_TOLERANCE = 0.15
#: The largest (max - min) / median of a phase's per-repeat step times in a quiet run.
SPREAD_TOLERANCE = 0.20


def physical_cores() -> int:
    """Physical cores this process may run on: the CPUs of its affinity mask, counted once per
    (package, core) pair from Linux's ``/sys/devices/system/cpu/cpu<N>/topology``; where that is
    unreadable, the CPUs of the mask. Hyperthreads of one core share its arithmetic units, so one
    intra-op thread per physical core is the fastest steady setting."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = list(range(os.cpu_count() or 1))
    cores = set()
    for c in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add(((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip()))
        except OSError:
            return max(1, len(cpus))
    return max(1, len(cores))


def set_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count: ``threads``, or :func:`physical_cores` if None. Returns it.

    Raises: LmcostError (field ``--threads``) for a count below 1 or above 4096.
    """
    n = physical_cores() if threads is None else threads
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096:
        raise LmcostError("--threads", f"{threads!r} is not a thread count", "give a whole number from 1 (default: one per physical core)")
    torch.set_num_threads(n)
    return n


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reference_time(device: str) -> float:
    """Seconds of the reference kernel on ``device``: the median of :data:`REFERENCE_CALLS` synchronised
    calls of an fp32 ``torch.mm`` of :data:`REFERENCE_N` square (4x the side on CUDA), after two warm-up calls."""
    n = REFERENCE_N * (4 if device.startswith("cuda") else 1)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    times = []
    with torch.inference_mode():
        for i in range(REFERENCE_CALLS + 2):
            _sync(device)
            t0 = time.perf_counter()
            torch.mm(a, b)
            _sync(device)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def spread(values) -> float:
    """(max - min) / median of ``values`` (a relative range; 0 for fewer than two values)."""
    v = [float(x) for x in values]
    if len(v) < 2:
        return 0.0
    m = statistics.median(v)
    return (max(v) - min(v)) / m if m > 0 else 0.0


@dataclass
class StepTimes:
    """What a controlled run measured end to end, per phase (``prefill``, ``decode``).

    ``wall``: seconds of each prefill (one per repeat) and of each decode step (``steps`` per repeat)
    of the unprofiled repeats (synchronised ``perf_counter`` on CPU, CUDA events on a GPU).
    ``scoped``: per profiled repeat, seconds of the phase's step scope per step (the profiler's clock:
    it includes the profiler's own cost). ``scope_sum``: per profiled repeat, the sum of its operator
    scopes per step. ``reference_s``: the reference kernel before and after. ``threads``: intra-op
    threads of the run.
    """

    threads: int
    reference_s: tuple[float, float]
    wall: dict[str, list[float]] = field(default_factory=dict)
    scoped: dict[str, list[float]] = field(default_factory=dict)
    scope_sum: dict[str, list[float]] = field(default_factory=dict)

    def wall_s(self, phase: str) -> float:
        """Median wall seconds of one ``phase`` step (a prefill; one decode step)."""
        return statistics.median(self.wall[phase])

    def drift(self) -> float:
        """Relative change of the reference kernel from before to after the run."""
        before, after = self.reference_s
        return abs(after / before - 1) if before > 0 else 0.0

    def busy(self) -> list[str]:
        """Why the machine looked busy during the run (empty if it looked quiet)."""
        out = []
        if self.drift() > REFERENCE_TOLERANCE:
            before, after = self.reference_s
            out.append(f"the reference kernel moved {100 * self.drift():.0f}% ({before * 1e3:.3g} -> {after * 1e3:.3g} ms; "
                       f"tolerance {100 * REFERENCE_TOLERANCE:.0f}%)")
        for phase, values in self.wall.items():
            # Decode: the spread of per-repeat means (a single step is too short to judge by).
            per_repeat = values if phase == "prefill" else self._repeat_means(values)
            s = spread(per_repeat)
            if s > SPREAD_TOLERANCE:
                out.append(f"{phase} repeats spread {100 * s:.0f}% (tolerance {100 * SPREAD_TOLERANCE:.0f}%)")
        return out

    def _repeat_means(self, values: list[float]) -> list[float]:
        n = len(self.wall.get("prefill", [])) or 1
        k = max(1, len(values) // n)
        return [statistics.fmean(values[i:i + k]) for i in range(0, len(values), k)]

    def gap_s(self, phase: str) -> float:
        """Median seconds per step of the profiled step outside every operator scope (dispatch, launch
        gaps, the Python between operators): scoped step less the sum of its operator scopes."""
        return statistics.median(s - o for s, o in zip(self.scoped[phase], self.scope_sum[phase]))

    def to_dict(self) -> dict:
        return dict(threads=self.threads, reference_s=list(self.reference_s), wall=self.wall, scoped=self.scoped,
                    scope_sum=self.scope_sum)

    @classmethod
    def from_dict(cls, d: dict) -> "StepTimes":
        """Raises: KeyError, TypeError or ValueError for a record not written by :meth:`to_dict`."""
        ref = tuple(float(x) for x in d["reference_s"])
        if len(ref) != 2:
            raise ValueError("reference_s")
        lists = {}
        for key in ("wall", "scoped", "scope_sum"):
            lists[key] = {str(k): [float(x) for x in v] for k, v in d[key].items()}
        return cls(int(d["threads"]), ref, **lists)
