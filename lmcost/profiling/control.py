"""Controlled measured runs: the intra-op thread count, a reference kernel timed before and after, and
the verdict on whether the machine stayed quiet while lmcost measured.

A measured time is only worth comparing with a prediction if the machine ran the same way throughout.
Two cheap witnesses say when it did not:
- the **reference kernel** (a fixed fp32 ``torch.mm``, :data:`REFERENCE_N` square; the fastest of
  :data:`REFERENCE_CALLS` calls) timed just before and just after the run: another process taking cores
  or memory bandwidth in between, or the host slowing the machine, moves it by more than
  :data:`REFERENCE_TOLERANCE`;
- the **spread of the steps**: the typical (median) step of a phase running more than
  :data:`SPREAD_TOLERANCE` slower than the reported figure means the steps did not run alike.

Either makes the run *busy*: its report says so, and ``validate --retries`` measures it again.

Every measured figure is then the mean over the **faster half of the steps** of its phase (whole
steps, chosen by the sum of their operator scopes, so a phase's operators add up to real steps;
:func:`fast_half`): noise only slows a run, so the fast steps are the ones a second run reproduces,
and a mean over half the steps, not the fastest one, keeps a lucky step out of the figure. On this
project's 2-core VM, quiet, the same 512^3 matmul reads 1.7 ms or 2.2-2.6 ms for seconds at a time
(the host's doing: medians of 50 calls a second apart moved 17% from one to the next at the median,
42% at most; sampled every 50 ms, the fastest of 5 calls ranged 1.7-6.4 ms, switching within 100 ms);
the faster half of the steps sits in the fast state far more often than a median does. Two
consecutive ``validate tiny-gqa tiny-moe tiny-mla`` there, reporting the fastest step, differed by
up to 63 percentage points in a class where a busy spell made one lucky step the figure.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lmcost.basics.errors import LmcostError

#: Side of the reference kernel's square fp32 matmul (2 * 512^3 = 268 MFLOP: a few milliseconds on one
#: CPU core; on a GPU, 4x the side).
REFERENCE_N = 512
#: Calls of the compute reference per reading; the fastest is the reading.
REFERENCE_CALLS = 15
#: MiB copied by the memory reference (16x on CUDA).
REFERENCE_COPY_MIB = 64
#: The largest relative change of a reference kernel between before and after a quiet run. On a
#: dedicated machine a few-ms kernel moves a few percent; this project's VM switches between states
#: whose readings differ by 25-35% (see :data:`STATE_TOLERANCE`), and a run that saw a switch is busy.
REFERENCE_TOLERANCE = 0.10
#: The largest relative difference of a run's reference kernels from its calibration's: the same
#: machine state. This project's VM, quiet, has two states of its memory reference about 35% apart
#: (8.5 and 11-12 ms) and of its compute reference about 25% apart (1.7 and 2.1 ms), each lasting
#: seconds; within a state the readings stay within a few percent.
STATE_TOLERANCE = 0.10
#: The largest (median - min) / min of a phase's step times in a quiet run.
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

    Raises: LmcostError (field ``threads``) for a count below 1 or above 4096.
    """
    n = physical_cores() if threads is None else threads
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4096:
        raise LmcostError("threads", f"{threads!r} is not a thread count",
                          "give a whole number from 1 to 4096 (default: one per physical core)")
    torch.set_num_threads(n)
    return n


def sync(device: str) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on a CPU, where calls return when done."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def call_times(fn, device: str, calls: int, warmup: int = 2) -> list[float]:
    """Seconds of each of ``calls`` synchronised calls of ``fn`` (``perf_counter``), after ``warmup``
    calls (gpt-fast style)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def reference_times(device: str) -> dict[str, float]:
    """Seconds of the two reference kernels on ``device``, each the fastest of its calls:
    ``compute``, an fp32 ``torch.mm`` of :data:`REFERENCE_N` square (4x the side on CUDA;
    :data:`REFERENCE_CALLS` calls), which sits in the core's caches; ``memory``, a copy of
    :data:`REFERENCE_COPY_MIB` MiB (16x on CUDA; 5 calls), beyond the private caches, which contends
    with the neighbours for the shared last-level cache and DRAM. A host that lends the cores or the
    memory system elsewhere slows one or both."""
    cuda = device.startswith("cuda")
    n = REFERENCE_N * (4 if cuda else 1)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device)
    b = torch.randn(n, n, generator=g).to(device)
    src = torch.ones(REFERENCE_COPY_MIB * (16 if cuda else 1) * 2**18, device=device)
    dst = torch.empty_like(src)
    with torch.inference_mode():
        return {"compute": min(call_times(lambda: torch.mm(a, b), device, REFERENCE_CALLS)),
                "memory": min(call_times(lambda: dst.copy_(src), device, 5))}


def unlike(reading: dict[str, float], baseline: dict[str, float]) -> list[str]:
    """The reference kernels of ``reading`` more than :data:`STATE_TOLERANCE` away from ``baseline``."""
    return [k for k, base in baseline.items() if k in reading and base > 0 and abs(reading[k] / base - 1) > STATE_TOLERANCE]


def settle(device: str, baseline: dict[str, float] | None, timeout_s: float) -> tuple[dict[str, float], float]:
    """Read the reference kernels until they are within tolerance of ``baseline`` (the calibration's:
    the machine back in the state it was calibrated in) or ``timeout_s`` passes. A shared host moves
    between states lasting seconds (see the module docstring), so waiting a few seconds for the
    calibrated one is cheaper than measuring in another. Returns (the last reading, seconds waited)."""
    t0 = time.perf_counter()
    reading = reference_times(device)
    while baseline and unlike(reading, baseline) and time.perf_counter() - t0 < timeout_s:
        reading = reference_times(device)
    return reading, time.perf_counter() - t0


def fast_state(device: str, seconds: float = 3.0) -> dict[str, float]:
    """The machine's fast state: per reference kernel, the mean of the faster half of its readings over
    ``seconds`` (a shared host switches states every few seconds; noise only slows; the faster half,
    not the fastest, is a state it returns to). ``calibrate`` measures in this state (:func:`settle`
    before each stage) and records it; ``validate`` waits for it."""
    t0 = time.perf_counter()
    readings = [reference_times(device)]
    while time.perf_counter() - t0 < seconds:
        readings.append(reference_times(device))
    return {k: quick([r[k] for r in readings]) for k in readings[0]}


def fast_half(values) -> list[int]:
    """Indices of the faster half of ``values`` (ceil(n / 2) of them, the fastest first)."""
    order = sorted(range(len(values)), key=lambda i: float(values[i]))
    return order[: (len(order) + 1) // 2]


def quick(values) -> float:
    """The reported value of ``values`` (seconds): the mean of its faster half (:func:`fast_half`)."""
    return statistics.fmean(float(values[i]) for i in fast_half(values))


def spread(values) -> float:
    """(median - q) / q of ``values``, q the reported value (:func:`quick`): how much slower the
    typical sample ran than the reported figure (0 for fewer than two values)."""
    v = [float(x) for x in values]
    if len(v) < 2:
        return 0.0
    low = quick(v)
    return (statistics.median(v) - low) / low if low > 0 else 0.0


@dataclass
class StepTimes:
    """What a controlled run measured end to end, per phase (``prefill``, ``decode``).

    ``reference_s``: per reference kernel (``compute``, ``memory``: :func:`reference_times`), its
    seconds before and after the run. ``wall``: seconds of each prefill (one per repeat) and of each
    decode step (``steps`` per repeat, in order) of the unprofiled repeats (synchronised
    ``perf_counter`` on CPU, CUDA events on a GPU). ``scoped``: per profiled step, seconds of the step
    scope (the profiler's clock: it includes the profiler's own cost). ``scope_sum``: per profiled
    step, the sum of its operator scopes. ``threads``: intra-op threads of the run. ``waited_s``: how
    long the run waited for its reference kernels to match the calibration's (:func:`settle`). ``baseline_s``: the
    reference kernels of the calibration the run is predicted with (not part of the trace), if any.
    """

    threads: int
    reference_s: dict[str, tuple[float, float]]
    waited_s: float = 0.0
    wall: dict[str, list[float]] = field(default_factory=dict)
    scoped: dict[str, list[float]] = field(default_factory=dict)
    scope_sum: dict[str, list[float]] = field(default_factory=dict)
    baseline_s: dict[str, float] | None = None

    def wall_s(self, phase: str) -> float:
        """Wall seconds of a ``phase`` step (a prefill; one decode step): :func:`quick` of its steps."""
        return quick(self.wall[phase])

    def drift(self) -> float:
        """The largest relative change of a reference kernel from before to after the run."""
        return max((abs(after / before - 1) for before, after in self.reference_s.values() if before > 0), default=0.0)

    def busy(self) -> list[str]:
        """Why the machine looked busy during the run, or unlike the calibration it is predicted with
        (empty if neither)."""
        out = []
        for kind, (before, after) in self.reference_s.items():
            d = abs(after / before - 1) if before > 0 else 0.0
            if d > REFERENCE_TOLERANCE:
                out.append(f"the {kind} reference moved {100 * d:.0f}% ({before * 1e3:.3g} -> {after * 1e3:.3g} ms; "
                           f"tolerance {100 * REFERENCE_TOLERANCE:.0f}%)")
        best = {kind: min(pair) for kind, pair in self.reference_s.items()}
        for kind in unlike(best, self.baseline_s or {}):
            base, now = self.baseline_s[kind], best[kind]
            out.append(f"the {kind} reference ran {abs(100 * (now / base - 1)):.0f}% "
                       f"{'slower' if now > base else 'faster'} than in the calibration "
                       f"({base * 1e3:.3g} -> {now * 1e3:.3g} ms; tolerance {100 * STATE_TOLERANCE:.0f}%)")
        for phase, values in self.wall.items():
            s = spread(values)
            if s > SPREAD_TOLERANCE:
                out.append(f"the typical {phase} step ran {100 * s:.0f}% slower than the reported figure "
                           f"(tolerance {100 * SPREAD_TOLERANCE:.0f}%)")
        return out

    def gap_s(self, phase: str) -> float:
        """Median seconds per step of the profiled step outside every operator scope (dispatch, launch
        gaps, the Python between operators): scoped step less the sum of its operator scopes."""
        return statistics.median(s - o for s, o in zip(self.scoped[phase], self.scope_sum[phase]))

    def to_dict(self) -> dict:
        return dict(threads=self.threads, reference_s={k: list(v) for k, v in self.reference_s.items()},
                    waited_s=self.waited_s, wall=self.wall, scoped=self.scoped, scope_sum=self.scope_sum)

    @classmethod
    def from_dict(cls, d: dict) -> "StepTimes":
        """Raises: KeyError, TypeError or ValueError for a record not written by :meth:`to_dict`: a
        missing key, a time that is not a finite number (a bool is not one), a reference or wall time
        that is not positive, a negative scope time, a thread count below 1."""
        def seconds(x, positive: bool) -> float:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0 or (positive and x == 0):
                raise ValueError(f"{x!r} is not a time")
            return float(x)

        ref = {str(k): tuple(seconds(x, True) for x in v) for k, v in d["reference_s"].items()}
        if not ref or any(len(v) != 2 for v in ref.values()):
            raise ValueError("reference_s")
        lists = {}
        for key in ("wall", "scoped", "scope_sum"):
            lists[key] = {str(k): [seconds(x, key == "wall") for x in v] for k, v in d[key].items()}
        if set(lists["wall"]) - {"prefill", "decode"} or any(not v for v in lists["wall"].values()):
            raise ValueError("wall")
        threads = d["threads"]
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError("threads")
        return cls(threads, ref, seconds(d.get("waited_s", 0.0), False), **lists)
