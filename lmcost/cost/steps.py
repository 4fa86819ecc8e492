"""A phase's time summed over consecutive token counts (:func:`time_over_steps`): the decode steps of a
generation, context first, first + 1, ..., last, which TPOT averages.

The ops whose cost does not change with the context cost the same at every step (taken once, times the
steps). Of the others (attention over the context), an op whose FLOPs and bytes are affine in the context
has a time that is, over a run of steps, the max of a few affine lines (the roofline's compute, memory
and floor; the calibrated model's fixed cost plus compute or memory at achieved rates): its sum over
the run is that of their upper envelope, in closed form (:func:`lmcost.cost.phases.sum_of_max`). Every
other op is evaluated at each step, in chunks.
"""

from __future__ import annotations

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.cost.compile import phase_graph
from lmcost.cost.efficiency import band_factors, expected_terms
from lmcost.cost.phases import PhaseCost, op_times, sum_of_max
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.operators.workload import Settings

#: The calibrated times :func:`time_over_steps` sums in closed form past its first chunk.
_CALIBRATED = ("calibrated_s", "calibrated_low_s", "calibrated_high_s")
#: Where a calibrated term is checked to be affine over the closed run (fractions of its length: uneven,
#: so no symmetric curve passes), and how close to its chord it must be there (relative).
_PROBES, _AFFINE_TOL = (0.013, 0.29, 0.5, 0.71, 0.987), 1e-13
#: Further probes for an op not affine by its formula (min(context, window)): eleven more, at uneven
#: fractions, so a kink, a period or a curve shows between some two of them.
_MORE_PROBES = (0.0371, 0.113, 0.1618, 0.2236, 0.3733, 0.4142, 0.577, 0.6180, 0.7937, 0.866, 0.9411)


def time_over_steps(cfg: ArchConfig, gpu: GPU, precision: Precision, phase: str, b, first: int, last: int,
                    settings: Settings = Settings(), at_any: "PhaseCost | dict | None" = None, chunk: int = 1 << 16,
                    key: str | None = None):
    """Sum of the times (s, under ``settings.model``) of ``phase`` at tokens = first, first + 1, ..., last
    (the decode steps of a generation).

    Ops whose cost does not change with the tokens (every GEMM of a decode step) cost the same at every
    step: their time is taken once, from ``at_any`` (this phase's :class:`PhaseCost` at any tokens, if the
    caller has one; for an array ``b``, :func:`op_times` of this phase at ``b`` and any tokens) and
    multiplied by the number of steps. Of the others (attention over the context):
    - roofline: an op affine in the tokens is summed in closed form over every step
      (:func:`sum_of_max` of its compute, memory and floor lines: exact up to rounding);
    - calibrated: the first ``chunk`` steps are evaluated one by one, as always (so a generation of up
      to ``chunk`` + 1 tokens sums exactly the values it always did, in the same order); past them an op
      is summed in closed form when it is affine in the tokens, not a GEMM (a GEMM's tile quantization is
      a saw-tooth in the context) nor a collective, its achieved bandwidth is the same at both ends of the
      run (a decode kernel's occupancy only rises with the context, so it is the same throughout), and
      each of its terms (:func:`lmcost.cost.efficiency.expected_terms`) lies on its chord at five
      probes to 1e-13 (each term is a ratio of polynomials of degree two over one in the step: on a line
      at three points is a line). Its time at each step is then the max of affine lines (fixed + compute,
      fixed + memory and the roofline's lines; ``calibrated_low_s`` the first two times the band's low
      factor, ``calibrated_high_s`` all times the high one), and their sum is :func:`sum_of_max`'s:
      equal to the step-by-step sum to about 1e-15 relative (tests/test_exact_totals.py holds 1e-12);
    - every other op is evaluated at each step, in chunks of ``chunk`` steps so memory stays bounded.
    ``key``: sum this time of :func:`op_times` instead (``calibrated_low_s``, ``calibrated_high_s``:
    the ends of the calibrated time's band; needs ``settings.model`` calibrated).
    ``b``: an int (returns a float), or a 1-D int array of batch sizes (returns an array of sums, each
    equal bit for bit to the sum at that batch alone: the same per-op values, added in the same order).
    """
    key = key or f"{settings.model}_s"
    vector = np.ndim(b) > 0
    if last < first:
        return np.zeros(np.shape(b)) if vector else 0.0
    graph = phase_graph(cfg, precision, phase, settings)
    vary, fixed = graph.with_tokens, graph.fixed
    steps = last - first + 1
    if vector:  # the fixed ops per batch: each batch's row summed as PhaseCost.total_of sums one workload
        if at_any is None:
            at_any = op_times(graph.at(b, first), gpu, precision, (settings.model,))
        idx = list(fixed)
        total_s = (np.vecdot(np.ascontiguousarray(getattr(at_any, key)[idx].T), graph.subset(fixed).counts) * steps
                   if fixed else np.zeros(np.shape(b)))
    else:
        if at_any is None:
            at_any = PhaseCost(graph.at(b, first), gpu, precision, phase, settings.model)
        total_s = at_any.total_of(fixed, key) * steps if fixed else 0.0
    if not vary:
        return total_s
    sub = graph.subset(vary)
    counts = sub.counts
    keep = np.ones(len(vary), dtype=bool)  # the ops summed step by step
    tail = last + 1  # steps from here on are summed in closed form (calibrated), save the ops in ``rest``
    if settings.model == "roofline" and steps > 2:  # affine ops: an exact sum of a piecewise-affine envelope
        st = sub.statics(gpu, precision)
        r0, r1 = graph.at_tokens_only(b, first), graph.at_tokens_only(b, first + 1)
        affine = set(graph.affine)
        for j, i in enumerate(vary):
            if i not in affine:
                continue
            f0, f1, b0, b1 = r0.cols.flops[j], r1.cols.flops[j], r0.cols.bytes[j], r1.cols.bytes[j]
            lines = [(f0 / st.peak[j], (f1 - f0) / st.peak[j]),
                     (b0 * (1 / st.bandwidth_roof), (b1 - b0) * (1 / st.bandwidth_roof))]
            if st.floor_s:
                lines.append((st.floor_s, 0.0))
            total_s = total_s + counts[j] * sum_of_max(lines, steps)
        keep = np.array([i not in affine for i in vary])
        if not keep.any():
            return total_s
        if steps > chunk:  # the others (a sliding window's min(context, window)) as the calibrated ones are
            tail = first + chunk
            total_s = _tail(graph, gpu, precision, b, tail, last, key, keep, chunk, total_s)
    elif settings.model == "calibrated" and key in _CALIBRATED and steps > chunk:
        tail = first + chunk
        total_s = _tail(graph, gpu, precision, b, tail, last, key, np.ones(len(vary), dtype=bool), chunk, total_s)
    return _stepwise(graph, gpu, precision, b, first, min(last, tail - 1), key, keep, chunk, total_s)


def _stepwise(graph, gpu, precision, b, first, last, key, keep, chunk, total_s):
    """``total_s`` plus the sum over tokens = first .. last of the times ``key`` of the ops that change
    with the tokens where ``keep`` (a bool array over them), evaluated at each step, ``chunk`` at a time."""
    counts = graph.subset(graph.with_tokens).counts
    model = "calibrated" if key in _CALIBRATED else "roofline"
    for start in range(first, last + 1, chunk):
        points = np.arange(start, min(start + chunk, last + 1), dtype=float)
        if np.ndim(b) == 0:
            t = op_times(graph.at_tokens_only(b, points), gpu, precision, (model,))
            total_s += float(np.sum((getattr(t, key) * counts[:, None])[keep]))
            continue
        group = max(1, chunk // len(points))  # batches evaluated together: at most ``chunk`` points at once
        for g in range(0, len(b), group):
            bs = np.asarray(b[g:g + group])
            t = op_times(graph.at_tokens_only(bs[:, None], points[None, :]), gpu, precision, (model,))
            # [kept ops, batch, steps] -> one contiguous [kept ops, steps] block per batch, summed as above
            per_b = np.ascontiguousarray(np.moveaxis((getattr(t, key) * counts[:, None, None])[keep], 1, 0))
            total_s[g:g + group] += per_b.reshape(len(bs), -1).sum(axis=1)
    return total_s


def _tail(graph, gpu, precision, b, first, last, key, among, chunk, total_s):
    """``total_s`` plus the sum over tokens = first .. last of the calibrated times ``key`` of the ops
    ``among`` (a bool array over the ops that change with the tokens): those affine over the run in
    closed form (:func:`_closed_tail`), the others over each half of the run in turn, down to runs of
    ``chunk`` steps summed step by step. An op that is affine piece by piece (a sliding window's keys,
    min(context, window): affine up to the window, constant past it) is so closed on every half but
    the one that holds its kink: about 2 log2(steps / chunk) closed sums and one chunk of steps, where
    it took every step."""
    if last - first + 1 <= chunk:
        return _stepwise(graph, gpu, precision, b, first, last, key, among, chunk, total_s)
    closed, tail_s = _closed_tail(graph, gpu, precision, b, first, last, key, among)
    total_s = total_s + tail_s
    if (rest := among & ~closed).any():
        mid = (first + last) // 2
        total_s = _tail(graph, gpu, precision, b, first, mid, key, rest, chunk, total_s)
        total_s = _tail(graph, gpu, precision, b, mid + 1, last, key, rest, chunk, total_s)
    return total_s


def _closed_tail(graph, gpu, precision, b, first, last, key, among=None):
    """(closed, seconds): which ops that change with the tokens :func:`time_over_steps` sums in closed
    form over tokens = first .. last under the calibrated time ``key`` (a bool array over them; only
    ``among`` them, if given), and their sum there, each op times its count (a float, or an array over
    the batches ``b``). An op whose FLOPs and bytes are affine in the tokens by their formula is tested
    at :data:`_PROBES`; one that is not (min(context, window)) only where it lies on its chord at
    :data:`_MORE_PROBES` too, over a run where it is affine (past its window)."""
    n = last - first + 1
    k = np.array([0.0, *(round(p * (n - 1)) for p in _PROBES + _MORE_PROBES), n - 1.0])  # step 0, probes, last
    rec = graph.at_tokens_only(np.asarray(b)[..., None], first + k)  # fields [ops, (batch,) points]
    sub = graph.subset(graph.with_tokens)
    st = sub.statics(gpu, precision)
    shape = rec.shape
    lifted = st.map(lambda v: v.reshape((-1,) + (1,) * len(shape)))
    col = lambda c: np.stack([np.broadcast_to(np.asarray(v, dtype=float), shape) for v in c])
    flops, bytes_ = col(rec.cols.flops), col(rec.cols.bytes)
    roof = [flops / lifted.peak, bytes_ / lifted.bandwidth_roof]  # op_times' roofline terms
    if lifted.floor_s:
        roof.append(np.full_like(flops, lifted.floor_s))
    affine = np.array([i in set(graph.affine) for i in graph.with_tokens])
    closed = ~st.comm & (np.ones(len(affine), dtype=bool) if among is None else among)
    own = []  # the calibrated model's own lines (an op inside another's kernel costs its roofline)
    if st.eff is None or key not in _CALIBRATED:  # the roofline's time (every calibrated one, without a block)
        bandwidth, (lo, hi), inside = np.ones_like(flops), (1.0, 1.0), np.ones(len(closed), dtype=bool)
    else:
        m, nn, kk = (col(c) for c in (rec.cols.m, rec.cols.n, rec.cols.k))
        fixed, compute, memory, bandwidth = expected_terms(flops, bytes_, col(rec.cols.kernels), m, nn, kk, lifted)
        own, inside = [fixed + compute, fixed + memory], np.asarray(st.inside, dtype=bool)
        lo, hi = (np.broadcast_to(f, flops.shape)[..., 0] for f in band_factors(lifted, nn))
        closed &= ~st.gemm & np.all((lo >= 0) & (lo <= 1) & (hi >= 0), axis=tuple(range(1, lo.ndim)))
    closed &= np.all(bandwidth[..., 0] == bandwidth[..., -1], axis=tuple(range(1, flops.ndim - 1)))
    lines = []
    for v, needed in [(v, ~inside) for v in own] + [(v, np.ones_like(inside)) for v in roof]:
        slope = (v[..., -1] - v[..., 0]) / (n - 1)
        off = np.abs(v[..., 1:-1] - (v[..., :1] + slope[..., None] * k[1:-1]))
        near = off <= _AFFINE_TOL * np.abs(v).max(axis=-1, keepdims=True)
        few = len(_PROBES)  # the formula-affine ops are held to the first probes only (as they always were)
        closed &= ~needed | np.where(affine, np.all(near[..., :few], axis=tuple(range(1, flops.ndim))),
                                     np.all(near, axis=tuple(range(1, flops.ndim))))
        lines.append((v[..., 0], slope))
    # fixed + compute and fixed + memory times a factor (the low end's, the high end's), then the roofline's
    scale = {"calibrated_s": (1.0, 1.0), "calibrated_low_s": (lo, 1.0), "calibrated_high_s": (hi, hi),
             "roofline_s": (1.0, 1.0)}[key]
    total = np.zeros(np.shape(b))
    for j in np.flatnonzero(closed):
        pick = lambda x: x[j] if np.ndim(x) else x
        mine = [] if inside[j] else [(a[j] * pick(scale[0]), s[j] * pick(scale[0])) for a, s in lines[:len(own)]]
        mine += [(a[j] * pick(scale[1]), s[j] * pick(scale[1])) for a, s in lines[len(own):]]
        total = total + sub.counts[j] * sum_of_max(mine, n)
    return closed, (float(total) if np.ndim(b) == 0 else total)
