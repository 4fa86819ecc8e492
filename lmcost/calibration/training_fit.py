"""The fit of a training step's system figures on published runs (issue 26), pure: sampled step times in,
figures and their leave-one-source-out error out. :mod:`lmcost.apps.train_fit` runs lmcost train to sample.

**What is fitted** (each figure physical, and informed by the rows named):

- ``sustained_clock`` per GPU generation (:data:`FAMILY`: A100 40/80GB together, H100 SXM; only those of
  :data:`FITTED_CLOCKS`), the fraction of boost the SMs hold through a step (0.5-1): every dense-model
  throughput row on that generation informs it;
- ``step_efficiency`` per framework class (deepspeed, fsdp, fsdp-compile, eager), the whole-step fraction of
  the single-kernel rates its compute reaches (0.25-1): every dense-model throughput row run by that
  framework on those generations.
  Megatron's is held at 1 (:data:`GAUGE`): a clock and an efficiency both divide compute time, so one of
  them must be fixed for the pair to be identifiable; Megatron-Core/TE runs the fused kernels that the
  single-kernel fractions (the GPU's efficiency block) were measured on, so its step is taken as those
  kernels and the clock carries what a long run loses on that GPU.

The other system figures (kernel launch, SM contention, prefetch, buckets) keep their cited priors.

**Objective**: the mean over sources of each source's mean |ln(predicted / published)| (each source weighs
the same whatever its row count), plus a weak pull to the priors, ``PULL`` x sum of ln(figure / prior)^2.

**Speed**: lmcost train runs once per row at each point of a small grid of (clock, efficiency)
(:data:`CLOCK_SAMPLES` x :data:`EFFICIENCY_SAMPLES`); a trial's step time is interpolated bilinearly in
(1 / clock, 1 / efficiency) between them (compute time is linear in both; exposed communication, which
shrinks as compute grows, is piecewise linear between samples), so a coordinate descent over fine grids
(:func:`descend`, :mod:`lmcost.calibration.collective_fit`'s pattern) costs no further train runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

#: The sample grid of the step times (train runs per row: their product).
CLOCK_SAMPLES = (1.0, 0.8, 0.6)
EFFICIENCY_SAMPLES = (1.0, 0.7, 0.4)
#: The search grids of the descent.
CLOCK_GRID = np.round(np.arange(0.50, 1.0001, 0.01), 2)
EFFICIENCY_GRID = np.round(np.arange(0.25, 1.0001, 0.01), 2)
#: GPU generation of a GPU file (one sustained clock each); a GPU not named is its own generation.
FAMILY = {"a100-40gb": "a100", "a100-80gb": "a100", "h100-sxm": "h100", "b200": "b200", "gb200": "gb200"}
#: The generations whose sustained clock is fitted: those whose GPU files carry fitted kernel efficiencies
#: (an ``efficiency`` block). On B200, GB200 and RTX 4090 lmcost times kernels without fitted fractions, so
#: a clock fitted there would carry the kernels' own shortfall, not a clock: their runs are left out of the
#: fit (:func:`fitted_runs`) and keep the prior clock 1. MoE runs are left out of the fit too (scored, not
#: fitted): their steps carry terms lmcost times from priors only (token dispatch and permutation, grouped
#: expert GEMMs, routing imbalance), and a clock bent to them would move every dense step on that GPU.
FITTED_CLOCKS = ("a100", "h100")
#: The framework whose step efficiency is held at its prior (the module docstring: the clock's gauge).
GAUGE = "megatron"
#: Weight of the pull to the priors, per figure: (ln x / prior)^2 (a 10% move costs 0.0002, against a mean
#: |ln error| of the order of 0.1).
PULL = 0.02
#: A descent step keeps a figure unless the loss falls by more than this.
MIN_GAIN = 1e-6


def family(gpu: str) -> str:
    """The GPU generation whose sustained clock ``gpu`` (an lmcost GPU name) takes."""
    return FAMILY.get(gpu, gpu)


@dataclass
class Samples:
    """Sampled step times of throughput runs: ``times[i, a, b]`` (s, any unit common to a row) of run i at
    CLOCK_SAMPLES[a] and EFFICIENCY_SAMPLES[b]; ``published[i]`` the published time in the same unit (so
    predicted/published throughput = published / predicted time); ``source``, ``gpu`` (generation) and
    ``framework`` per run; ``rows``: the data row numbers of each run; ``dense``: whether each run's model
    has no MoE layers (empty: all dense)."""

    times: np.ndarray
    published: np.ndarray
    source: list[str]
    gpu: list[str]
    framework: list[str]
    rows: list[tuple[int, ...]] = field(default_factory=list)
    dense: list[bool] = field(default_factory=list)

    def subset(self, keep: np.ndarray) -> "Samples":
        """The runs where ``keep`` (bool array) holds."""
        idx = np.flatnonzero(keep)
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return Samples(self.times[idx], self.published[idx], pick(self.source), pick(self.gpu), pick(self.framework),
                       pick(self.rows) if self.rows else [], pick(self.dense) if self.dense else [])


def _interp(x: np.ndarray, knots: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation of ``values[..., k]`` at ``x`` (per run, broadcast) over increasing
    ``knots``, extrapolated linearly past both ends."""
    k = np.clip(np.searchsorted(knots, x) - 1, 0, len(knots) - 2)
    x0, x1 = knots[k], knots[k + 1]
    w = (x - x0) / (x1 - x0)
    v0 = np.take_along_axis(values, k[..., None], -1)[..., 0]
    v1 = np.take_along_axis(values, (k + 1)[..., None], -1)[..., 0]
    return v0 + w * (v1 - v0)


def predicted_times(s: Samples, clock: np.ndarray, efficiency: np.ndarray) -> np.ndarray:
    """Each run's step time at its ``clock`` and ``efficiency`` (arrays over runs), interpolated in
    (1/clock, 1/efficiency) from the samples."""
    ic, ie = 1 / np.asarray(CLOCK_SAMPLES), 1 / np.asarray(EFFICIENCY_SAMPLES)
    by_eff = np.stack([_interp(1 / clock, ic, s.times[:, :, b]) for b in range(len(ie))], -1)
    return _interp(1 / efficiency, ie, by_eff)


def figures_per_run(s: Samples, figures: dict) -> tuple[np.ndarray, np.ndarray]:
    """(clock, efficiency) arrays over runs from ``figures`` ({"clock:<gen>": x, "eff:<framework>": y}, a
    figure missing: its prior 1)."""
    clock = np.array([figures.get(f"clock:{g}", 1.0) for g in s.gpu])
    eff = np.array([figures.get(f"eff:{f}", 1.0) for f in s.framework])
    return clock, eff


def ratios(s: Samples, figures: dict) -> np.ndarray:
    """predicted / published throughput of each run under ``figures``."""
    return s.published / predicted_times(s, *figures_per_run(s, figures))


def loss(s: Samples, figures: dict) -> float:
    """The objective (module docstring): mean over sources of the mean |ln ratio|, plus the pull."""
    err = np.abs(np.log(ratios(s, figures)))
    src = np.array(s.source)
    per = [float(err[src == x].mean()) for x in sorted(set(s.source))]
    return sum(per) / max(1, len(per)) + PULL * sum(math.log(v) ** 2 for v in figures.values())


def fitted_runs(s: Samples) -> Samples:
    """The runs the fit uses: dense models on a generation of :data:`FITTED_CLOCKS`."""
    dense = s.dense or [True] * len(s.gpu)
    return s.subset(np.array([g in FITTED_CLOCKS and d for g, d in zip(s.gpu, dense)], dtype=bool))


def free_figures(s: Samples) -> list[str]:
    """The figures the runs of ``s`` inform: a clock per generation present, an efficiency per framework
    present (not :data:`GAUGE`)."""
    return sorted({f"clock:{g}" for g in s.gpu}) + sorted({f"eff:{f}" for f in s.framework if f != GAUGE})


def descend(s: Samples, start: dict | None = None, rounds: int = 4) -> dict:
    """Coordinate descent of :func:`loss` over the figures of :func:`free_figures`, each over its grid
    (CLOCK_GRID, EFFICIENCY_GRID), from ``start`` (default: every prior, 1). Returns {figure: value}."""
    f = {k: (start or {}).get(k, 1.0) for k in free_figures(s)}
    for _ in range(rounds):
        moved = False
        for k in list(f):
            grid = CLOCK_GRID if k.startswith("clock:") else EFFICIENCY_GRID
            now = loss(s, f)
            trial = [loss(s, {**f, k: float(x)}) for x in grid]
            best = int(np.argmin(trial))
            if now - trial[best] > MIN_GAIN:
                f[k], moved = float(grid[best]), True
        if not moved:
            break
    return f


def loso(s: Samples) -> tuple[np.ndarray, dict]:
    """Leave-one-source-out: for each source, the figures fitted on the other sources' runs (a figure they do
    not inform: its prior), and that source's runs predicted with them. Returns (ratio of each run,
    {source: the figures fitted without it})."""
    out = np.full(len(s.source), np.nan)
    fits = {}
    src = np.array(s.source)
    for x in sorted(set(s.source)):
        f = descend(s.subset(src != x))
        fits[x] = f
        held = s.subset(src == x)
        out[src == x] = ratios(held, f)
    return out, fits
