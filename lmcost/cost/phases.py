"""Timing and totalling the operator records of a phase (:mod:`lmcost.cost.compile` makes them).

Totals come from one place, :func:`totals`: FLOPs and bytes are summed as Python ints for int
workloads (exact at any size: no int64 to wrap) and as float64 for grids (exact below 2^53; a grid is a
sweep for plots and searches, where float64's 16 digits are the precision asked for). Times are
float64 seconds either way. :class:`PhaseCost` keeps one phase's per-op times at one workload (what
``estimate`` reports per operator and per class); :func:`grid` sweeps a phase over batch sizes and tokens.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.basics.results import Result
from lmcost.cost.compile import PhaseGraph, Records, phase_graph, phase_records
from lmcost.cost.efficiency import band_factors, expected_times
from lmcost.cost.roofline import OpTime, bound, intensity
from lmcost.cost.timing import OpStatics
from lmcost.operators.ops import OpCost
from lmcost.operators.workload import Settings
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.operators.workload import check_api_types, check_count, check_positions, require_decoder


@dataclass(frozen=True, kw_only=True, slots=True)
class Totals(Result):
    """A phase's totals over its ops, each op times its count (:func:`totals`).

    FLOPs and bytes are Python ints for an int workload (exact at any size; floats where a dtype has
    fractional bytes), float64 arrays over a grid; times are seconds, floats or arrays like them.
    """

    #: FLOPs and bytes moved (weights, activations and KV cache, read and written).
    flops: Any
    bytes: Any
    #: The two roofline terms summed over ops (s): FLOPs at each op's peak, bytes at the bandwidth.
    compute_s: Any
    memory_s: Any
    #: The sum over ops of each op's time under the time model asked for (s).
    time_s: Any
    #: The roofline with no overlap (s): each op's compute plus memory (at least the kernel floor), summed; an
    #: upper bound on the roofline time, not on the calibrated time (``estimate --json``'s ``time_upper_s``).
    upper_s: Any


@dataclass(frozen=True, kw_only=True, slots=True)
class OpTimes(Result):
    """Seconds of one execution of every op (:func:`op_times`): arrays [ops] for a scalar workload,
    [ops, *workload] for a grid. The calibrated fields are None unless that model was asked for."""

    #: The roofline's terms (s): FLOPs at the op's peak, bytes at the bandwidth (0 for a collective).
    compute_s: np.ndarray
    memory_s: np.ndarray
    #: Their max, at least the kernel floor (s); a collective's own roofline time.
    roofline_s: np.ndarray
    #: Their sum, at least the kernel floor (s): the no-overlap bound.
    upper_s: np.ndarray
    #: The calibrated expectation (:func:`lmcost.cost.efficiency.expected_times`) and its error band (s).
    calibrated_s: np.ndarray | None = None
    calibrated_low_s: np.ndarray | None = None
    calibrated_high_s: np.ndarray | None = None

    def to_dict(self) -> dict:
        """{key: array} of the times computed (the calibrated ones only where asked for)."""
        return {k: v for k, v in Result.to_dict(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True, slots=True)
class PhaseTotals(Totals):
    """:class:`Totals` of one phase at one scalar workload with both time models' totals
    (:meth:`PhaseCost.totals`); ``time_s`` is the chosen model's (s)."""

    #: The roofline time (s).
    roofline_s: float
    #: The calibrated time (s; the roofline's where the GPU has no efficiency block) and its expected
    #: error band (s): low, high.
    calibrated_s: float
    calibrated_low_s: float
    calibrated_high_s: float

    def to_dict(self) -> dict:
        """{key: value} in the order PhaseCost's totals always had."""
        return {k: getattr(self, k) for k in ("flops", "bytes", *PhaseCost._KEYS, "time_s")}


def _floats(values, shape=None) -> np.ndarray:
    """Values over ops (Python ints of any size, floats or arrays) as one float64 array [ops, *shape]."""
    if shape is None:
        return np.array(values, dtype=float)
    out = np.empty((len(values),) + tuple(shape))
    for i, v in enumerate(values):
        out[i] = v
    return out


def sum_of_max(lines: list[tuple], n: int):
    """sum over k = 0 .. n-1 of max over lines of (a + slope * k): the upper envelope of lines is convex
    and piecewise affine, so between consecutive crossings one line holds it and its terms sum as an
    arithmetic series (count * a + slope * (k0 + k1) * count / 2).

    ``a`` and ``slope`` are floats (returns a float) or arrays (returns each element's sum, with the same
    arithmetic in the same order as alone: a crossing outside the range is an empty segment, adding 0).
    """
    shape = np.broadcast_shapes(*(np.shape(v) for line in lines for v in line))
    one = shape == ()
    shape = shape or (1,)
    a = np.stack([np.broadcast_to(np.asarray(line[0], dtype=float), shape) for line in lines])
    s = np.stack([np.broadcast_to(np.asarray(line[1], dtype=float), shape) for line in lines])
    cuts = [np.zeros(shape, dtype=np.int64), np.full(shape, n, dtype=np.int64)]
    for i, j in itertools.combinations(range(len(lines)), 2):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            k = (a[j] - a[i]) / (s[i] - s[j])
        inside = (s[i] != s[j]) & (0 < k) & (k < n - 1)
        cuts.append(np.where(inside, np.where(inside, k, 0).astype(np.int64) + 1, n))
    cuts = np.sort(np.stack(cuts), axis=0)
    out = np.zeros(shape)
    for k0, k1 in zip(cuts[:-1], cuts[1:]):  # terms k0 .. k1 - 1, the line on top at their middle
        top = np.argmax(a + s * ((k0 + k1 - 1) / 2), axis=0)[None]
        a_top, slope = np.take_along_axis(a, top, 0)[0], np.take_along_axis(s, top, 0)[0]
        count = k1 - k0
        out = out + (count * a_top + slope * (k0 + k1 - 1) * count / 2)
    return float(out[0]) if one else out


def op_times(rec: Records, gpu: GPU, precision: Precision, models=("roofline", "calibrated")) -> OpTimes:
    """Seconds of one execution of every op, as arrays [ops] (scalar workload) or [ops, *workload].

    Returns: :class:`OpTimes` with the roofline terms ``compute_s``, ``memory_s``, ``roofline_s`` (their max, at
    least the kernel floor), ``upper_s`` (their sum), and ``calibrated_s`` if asked for
    (:func:`lmcost.cost.efficiency.expected_times`) with its error band ``calibrated_low_s`` and
    ``calibrated_high_s`` (the time times its class's band, :func:`lmcost.cost.efficiency.band_factors`;
    the low end never below the roofline).
    """
    shape = rec.shape
    st = rec.graph.statics(gpu, precision)
    if shape is not None:
        lift = (-1,) + (1,) * len(shape)
        st = st.map(lambda v: v.reshape(lift))
    flops, bytes_ = _floats(rec.cols.flops, shape), _floats(rec.cols.bytes, shape)
    t = OpTime(compute_s=flops / st.peak, memory_s=bytes_ / st.bandwidth_roof, floor_s=st.floor_s)
    out = dict(compute_s=t.compute_s, memory_s=t.memory_s, roofline_s=t.time_s, upper_s=t.upper_s)
    if "calibrated" in models:
        if st.eff is None:
            for key in ("calibrated_s", "calibrated_low_s", "calibrated_high_s"):
                out[key] = out["roofline_s"].copy()
        else:
            m, n, k = (_floats(c, shape) for c in (rec.cols.m, rec.cols.n, rec.cols.k))
            cal = np.asarray(expected_times(flops, bytes_, _floats(rec.cols.kernels, shape), m, n, k, st,
                                            out["roofline_s"]))
            lo, hi = band_factors(st, n)
            out["calibrated_s"] = cal
            out["calibrated_low_s"] = np.minimum(cal, np.maximum(cal * lo, out["roofline_s"]))
            out["calibrated_high_s"] = cal * hi
    if st.comm.any():
        _comm_into(out, rec, rec.graph.statics(gpu, precision), shape)
    return OpTimes(**out)


def _comm_into(out: dict, rec: Records, st: OpStatics, shape) -> None:
    """Communication ops' seconds (:mod:`lmcost.cost.collectives`) written into op_times' arrays, in place:
    no compute or memory term; their roofline and calibrated times are the collective's."""
    payload = rec.cols.comm_bytes
    by_coll: dict = {}  # ops running the same collective are timed in one call, their payloads stacked
    for i in np.flatnonzero(st.comm):
        by_coll.setdefault(id(st.collectives[i]), (st.collectives[i], []))[1].append(i)
    for coll, idx in by_coll.values():
        t = coll.times(np.stack([np.broadcast_to(np.asarray(payload[i], dtype=float), shape or ()) for i in idx]))
        for key in ("compute_s", "memory_s"):
            out[key][idx] = 0.0
        out["roofline_s"][idx] = out["upper_s"][idx] = t["roofline_s"]
        if "calibrated_s" in out:
            for key in ("calibrated_s", "calibrated_low_s", "calibrated_high_s"):
                out[key][idx] = t[key]


def totals(rec: Records, gpu: GPU, precision: Precision, model: str = "roofline") -> Totals:
    """Totals of a phase over all ops, each times its count: the one way totals are made.

    Returns: :class:`Totals`: flops (FLOPs) and bytes (bytes), Python ints for an int workload (exact at
    any size), float64 arrays for a grid; compute_s and memory_s (the two roofline terms summed over ops,
    s), time_s (sum of per-op times under ``model``, s), upper_s (no-overlap roofline bound, s).
    """
    shape = rec.shape
    if shape is None:  # a scalar workload: PhaseCost's totals (exact ints), as estimate reports them
        t = PhaseCost(rec, gpu, precision, rec.graph.phase, model).totals()
        return Totals(flops=t.flops, bytes=t.bytes, compute_s=t.compute_s, memory_s=t.memory_s, time_s=t.time_s,
                      upper_s=t.upper_s)
    if len(shape) > 1 or shape[0] * rec.n_ops > _STACKED:
        return _grid_totals(rec, gpu, precision, model)
    # A short 1-D sweep (contexts of one batch): every op at once, as a stack [ops, points].
    t = op_times(rec, gpu, precision, (model,))
    c = np.array(rec.cols.count, dtype=float)[:, None]
    total = lambda a: np.sum(a * c, axis=0)
    return Totals(flops=total(_floats(rec.cols.flops, shape)), bytes=total(_floats(rec.cols.bytes, shape)),
                  compute_s=total(t.compute_s), memory_s=total(t.memory_s), time_s=total(getattr(t, f"{model}_s")),
                  upper_s=total(t.upper_s))


#: Largest ops x points evaluated as one stack (beyond it, op by op: see _grid_totals).
_STACKED = 1 << 22


def _grid_totals(rec: Records, gpu: GPU, precision: Precision, model: str) -> Totals:
    """:func:`totals` over a grid, one op at a time (a stack of every op's grid would not fit in
    memory at 1024 x 1024). Each op's values keep their own shape ([B,1] for an op that depends on the
    batch only) and are added, in place, to running sums kept per (shape, layer count); the sums are
    multiplied by their counts and broadcast together once at the end."""
    st = rec.graph.statics(gpu, precision)
    floor = st.floor_s
    keys = [f.name for f in fields(Totals)]
    sums: dict = {}
    cols = rec.cols
    counts, flops, byts = cols.count, cols.flops, cols.bytes
    inv_bw = 1.0 / st.bandwidth_roof
    for i in range(rec.n_ops):
        f, by = np.asarray(flops[i], dtype=float), np.asarray(byts[i], dtype=float)
        t = OpTime(compute_s=f * (1.0 / st.peak[i]), memory_s=by * inv_bw, floor_s=floor)
        time = t.time_s
        if st.comm[i]:
            c = st.collectives[i].times(np.asarray(cols.comm_bytes[i], dtype=float))
            t = OpTime(np.zeros_like(f), np.zeros_like(by), 0.0)
            time = c[f"{model}_s"]
            values = (f, by, t.compute_s, t.memory_s, np.asarray(time, dtype=float), np.asarray(c["roofline_s"]))
        elif model == "calibrated" and st.eff is not None:
            time = expected_times(f, by, cols.kernels[i], cols.m[i], cols.n[i], cols.k[i], st.map(lambda v: v[i]), time)
        if not st.comm[i]:
            values = (f, by, t.compute_s, t.memory_s, np.asarray(time, dtype=float), t.upper_s)
        shape = np.broadcast_shapes(*(v.shape for v in values))
        acc = sums.get((shape, counts[i]))
        if acc is None:
            sums[(shape, counts[i])] = [np.array(np.broadcast_to(v, shape), dtype=float) for v in values]
        else:
            for a, v in zip(acc, values):
                np.add(a, v, out=a)
    out = {}
    for j, key in enumerate(keys):
        total = np.zeros(())
        for (_, count), acc in sums.items():
            total = total + (acc[j] * count if count != 1 else acc[j])
        out[key] = total
    return Totals(**out)


def roofline_grid(graph: PhaseGraph, b, tokens, gpu: GPU, precision: Precision) -> Totals:
    """Roofline :func:`totals` of ``graph`` over a grid (b and tokens broadcast), from a function of its own
    (:meth:`lmcost.cost.compile.PhaseGraph.grid_forms`): each op costs a few array operations, its compute
    and memory times its bases times a coefficient (count and peak folded in) plus a constant, and their
    max is added to the time.
    """
    fn, forms, names = graph.grid_forms()
    shape = np.broadcast_shapes(np.shape(b), np.shape(tokens))
    atom_vals, tot_vals = fn(b, tokens)
    atom_vals = [np.asarray(v, dtype=float) for v in atom_vals]
    st = graph.statics(gpu, precision)
    floor, inv_bw = st.floor_s, 1.0 / st.bandwidth_roof
    time, upper = np.zeros(shape), (np.zeros(shape) if floor else None)
    comm_s = compute_mixed = 0.0

    def seconds(form, w):
        terms, const = form
        out = const * w
        for j, c in terms:
            out = out + atom_vals[j] * (c * w)
        return out

    for op, (f_form, b_form, c_form), peak, coll in zip(graph.templates, forms, st.peak, st.collectives):
        if coll is not None:  # a collective: its own time at its payload, no compute or memory term
            c = coll.times(np.asarray(seconds(c_form, 1.0), dtype=float))["roofline_s"] * op.count
            time += c
            if floor:
                upper += c
            comm_s = comm_s + c
            continue
        t = OpTime(seconds(f_form, op.count / peak), seconds(b_form, op.count * inv_bw), floor * op.count)
        time += t.time_s
        compute_mixed = compute_mixed + t.compute_s
        if floor:
            upper += t.upper_s
    tot = {k: np.asarray(v, dtype=float) for k, v in zip(names, tot_vals)}
    vector = tot["flops"] - tot["flops_matmul"]
    peak_mm = next((p for op, p in zip(graph.templates, st.peak) if op.matmul), 1.0)
    peak_vec = next((p for op, p in zip(graph.templates, st.peak) if not op.matmul), 1.0)
    if all(p == peak_mm for op, p in zip(graph.templates, st.peak) if op.matmul):
        compute_s = tot["flops_matmul"] / peak_mm + vector / peak_vec
    else:  # a recipe's GEMMs at their own peak (lmcost.cost.roofline.gemm_dtype): each op's FLOPs at its peak
        compute_s = compute_mixed
    memory_s = tot["bytes"] * inv_bw
    return Totals(flops=tot["flops"], bytes=tot["bytes"], compute_s=compute_s, memory_s=memory_s, time_s=time,
                  # With no floor each op's no-overlap bound is compute + memory (OpTime.upper_s): sum them.
                  upper_s=upper if floor else compute_s + memory_s + comm_s)


def grid(cfg: ArchConfig, gpu: GPU, precision: Precision, phase: str, batch, tokens,
         settings: Settings = Settings(), frame: bool = True):
    """One phase over every (batch, tokens) pair of two 1-D arrays, evaluated in one vectorised pass
    (float64: exact below 2^53 FLOPs or bytes per point).

    Returns: DataFrame (or, with ``frame=False``, a dict of 1-D arrays) with columns batch, tokens,
    flops, bytes, arithmetic_intensity, time_s, compute_s, memory_s, upper_s, bound; one row per pair
    (len(batch) * len(tokens) rows, batch-major).
    Raises: LmcostError for a batch or token count outside [1, 2^31], tokens past learned positions, or
    a decode phase of a bidirectional model; TypeError for an argument of the wrong kind.
    """
    check_api_types(cfg, gpu, precision, settings)
    if phase == "decode":
        require_decoder(cfg)
    for name, values in (("batch", batch), ("tokens", tokens)):
        arr = np.asarray(values)
        if arr.size == 0 or arr.ndim != 1:
            raise LmcostError(name, "must be a non-empty 1-D list of counts", f"give at least one {name}")
        if arr.dtype.kind not in "iuf":
            raise LmcostError(name, f"must be whole numbers, got {arr.dtype} values", f"give {name} as ints")
        bad = arr[(arr < 1) | (arr > 2**31) | (arr != np.floor(arr))]
        if bad.size:
            check_count(name, bad.ravel().tolist()[0])
    check_positions(cfg, int(np.max(tokens)), "tokens")
    b = np.asarray(batch, dtype=float)[:, None]
    n = np.asarray(tokens, dtype=float)[None, :]
    graph = phase_graph(cfg, precision, phase, settings)
    if settings.model == "roofline":
        tot = roofline_grid(graph, b, n, gpu, precision)
    else:
        tot = totals(graph.at(b, n), gpu, precision, settings.model)
    shape = (b.shape[0], n.shape[1])
    cols = {k: np.broadcast_to(v, shape).ravel() for k, v in tot.to_dict().items()}
    compute, memory = cols["compute_s"], cols["memory_s"]
    data = {"batch": np.repeat(np.asarray(batch, dtype=np.int64), shape[1]),
            "tokens": np.tile(np.asarray(tokens, dtype=np.int64), shape[0]),
            **cols, "arithmetic_intensity": intensity(cols["flops"], cols["bytes"])}
    if not frame:
        data["bound"] = np.where(memory > compute, "memory", "compute")
        return data
    import pandas as pd

    df = pd.DataFrame(data)
    df["bound"] = pd.Categorical.from_codes((memory > compute).astype(np.int8), ["compute", "memory"])
    return df


class PhaseCost:
    """One phase at one scalar workload on one GPU: every op's cost over its layers, and their totals.

    ``times``: per-op seconds over all layers (arrays over ops) for ``compute_s``, ``memory_s``,
    ``roofline_s``, ``upper_s``, ``calibrated_s``; ``time_s`` is ``model``'s. FLOPs and bytes stay
    exact ints (floats where a dtype has fractional bytes).
    """

    _KEYS = ("compute_s", "memory_s", "roofline_s", "upper_s", "calibrated_s", "calibrated_low_s", "calibrated_high_s")

    def __init__(self, rec: Records, gpu: GPU, precision: Precision, phase: str, model: str = "roofline",
                 times: dict | None = None):
        self.rec, self.phase, self.model, self.gpu, self.precision = rec, phase, model, gpu, precision
        counts = rec.cols.count
        self.counts = np.array(counts, dtype=float)
        # Seconds of one execution of each op, by key: the roofline terms and ``model``'s time now; the
        # other model's time when first asked for (a planner reading TTFT and TPOT never pays for it).
        self._t = times if times is not None else op_times(rec, gpu, precision, (model,)).to_dict()
        self.flops = [f * n for f, n in zip(rec.cols.flops, counts)]
        self.bytes = [b * n for b, n in zip(rec.cols.bytes, counts)]

    @classmethod
    def of_phases(cls, recs: list[Records], gpu: GPU, precision: Precision, phases: list[str],
                  model: str = "roofline") -> list["PhaseCost"]:
        """One PhaseCost per (records, phase), their op times computed in one vectorised pass."""
        joined = recs[0]
        for r in recs[1:]:
            joined = joined.then(r)
        t = op_times(joined, gpu, precision, (model,))
        out, start = [], 0
        for rec, phase in zip(recs, phases):
            part = {k: v[start:start + rec.n_ops] for k, v in t.to_dict().items()}
            out.append(cls(rec, gpu, precision, phase, model, part))
            start += rec.n_ops
        for cost in out:  # the other time model, when first asked of one, is computed for all at once
            cost._group = (joined, out)
        return out

    def _per_run(self, key: str) -> np.ndarray:
        """Seconds of one execution of each op under ``key`` (computing the other time model if needed)."""
        if key not in self._t:
            joined, members = getattr(self, "_group", (self.rec, [self]))
            t, start = op_times(joined, self.gpu, self.precision, ("calibrated",)), 0
            for m in members:
                for k, v in t.to_dict().items():
                    m._t.setdefault(k, v[start:start + m.rec.n_ops])
                start += m.rec.n_ops
        return self._t[key]

    def time_s(self) -> float:
        """The phase's time under ``model`` (s): the sum over ops of each op's time times its count."""
        return float(self._per_run(f"{self.model}_s") @ self.counts)

    @property
    def times(self) -> dict:
        """Per-op seconds over all layers, by key (and ``time_s``, the model's)."""
        out = {k: self._per_run(k) * self.counts for k in self._KEYS}
        out["time_s"] = out[f"{self.model}_s"]
        return out

    def totals(self) -> PhaseTotals:
        """Totals over ops (:class:`PhaseTotals`): flops, bytes (exact), compute_s, memory_s, time_s
        (``model``), upper_s, and both models' times roofline_s and calibrated_s, with calibrated_low_s
        and calibrated_high_s, the calibrated time's error band (s)."""
        times = {k: float(self._per_run(k) @ self.counts) for k in self._KEYS}
        return PhaseTotals(flops=exact_sum(self.flops), bytes=exact_sum(self.bytes), **times,
                           time_s=times[f"{self.model}_s"])

    def summary(self) -> dict:
        """:meth:`totals` with the arithmetic intensity and bound: the JSON object ``estimate --json``
        reports for a phase (its keys are that contract: a dict, as the CLI reads it). ``time_upper_s`` is
        the roofline with no overlap: each op's compute_s + memory_s (at least the kernel floor), summed (s).
        It bounds the roofline time ``time_roofline_s`` from above, not the expected time: it is neither the
        calibrated time's upper band nor above it (Llama-3-8B decode on H100, b=1, t=768: 4.53 ms against a
        calibrated 8.15 ms). The name is kept for JSON consumers."""
        t = self.totals()
        return dict(flops=t.flops, bytes=t.bytes, arithmetic_intensity=intensity(t.flops, t.bytes),
                    time_s=t.time_s, time_roofline_s=t.roofline_s, time_calibrated_s=t.calibrated_s,
                    time_upper_s=t.upper_s, compute_s=t.compute_s, memory_s=t.memory_s,
                    bound=bound(t.compute_s, t.memory_s))

    def classes(self) -> list[dict]:
        """Per operator class (in order of first appearance): FLOPs, bytes (exact), time under
        ``model``, and their shares of the phase (fractions)."""
        groups: dict = {}
        times = (self._per_run(f"{self.model}_s") * self.counts).tolist()
        sent = [p * n for p, n in zip(self.rec.cols.comm_bytes, self.rec.cols.count)]
        colls = self.rec.graph.statics(self.gpu, self.precision).collectives
        wire = [0 if c is None else s * c.bus_factor() for s, c in zip(sent, colls)]
        for cls, f, b, t, c, w in zip(self.rec.graph.classes, self.flops, self.bytes, times, sent, wire):
            g = groups.get(cls)
            if g is None:
                g = groups[cls] = dict(phase=self.phase, op_class=cls, flops=[], bytes=[], time_s=[], comm_bytes=[],
                                       wire_bytes=[])
            g["flops"].append(f)
            g["bytes"].append(b)
            g["time_s"].append(t)
            g["comm_bytes"].append(c)
            g["wire_bytes"].append(w)
        out = list(groups.values())
        for g in out:
            g["flops"], g["bytes"] = exact_sum(g["flops"]), exact_sum(g["bytes"])
            # communication: the payload (nccl-tests' size) and the bus bytes (size x bus factor: what each
            # GPU moves over its links, equal for an all-reduce and its reduce-scatter + all-gather)
            g["comm_bytes"], g["wire_bytes"] = exact_sum(g["comm_bytes"]), math.fsum(g["wire_bytes"])
            if g["op_class"] != "communication":
                del g["comm_bytes"], g["wire_bytes"]
            g["time_s"] = math.fsum(g["time_s"])
        _shares(out)
        return out

    def total_of(self, idx, key: str | None = None) -> float:
        """Seconds under ``model`` (or of the time ``key``, e.g. calibrated_high_s) of the ops at ``idx``,
        over their layers."""
        idx = list(idx)
        return float(self._per_run(key or f"{self.model}_s")[idx] @ self.counts[idx])

    def rows(self) -> list[dict]:
        """One row per operator: ``flops``, ``bytes`` and the times are totals over its ``count`` layers;
        ``flops_per_layer``, ``bytes_per_layer`` and ``time_s_per_layer`` are one layer's (what
        ``--detail`` prints); both models' times, intensity and bound."""
        rec, t = self.rec, {k: v.tolist() for k, v in self.times.items()}
        cols = rec.cols
        flops1, bytes1 = cols.flops, cols.bytes
        rows = []
        colls = rec.graph.statics(self.gpu, self.precision).collectives
        for i, op in enumerate(rec.graph.templates):
            c = cols.count[i]
            coll = colls[i]
            rows.append(dict(phase=self.phase, name=op.name, op_class=op.op_class.value, count=c,
                             flops=self.flops[i], bytes=self.bytes[i], weight_bytes=cols.weight_bytes[i] * c,
                             act_bytes=(cols.act_read_bytes[i] + cols.act_write_bytes[i]) * c,
                             kv_bytes=(cols.kv_read_bytes[i] + cols.kv_write_bytes[i]) * c,
                             compute_s=t["compute_s"][i], memory_s=t["memory_s"][i], time_s=t["time_s"][i],
                             roofline_s=t["roofline_s"][i], calibrated_s=t["calibrated_s"][i],
                             upper_s=t["upper_s"][i], arithmetic_intensity=intensity(flops1[i], bytes1[i]),
                             bound=(coll.bound(float(cols.comm_bytes[i])) if coll is not None
                                    else "memory" if t["memory_s"][i] > t["compute_s"][i] else "compute"),
                             comm_bytes=cols.comm_bytes[i] * c,
                             shapes=op.shapes, role=op.role, flops_per_layer=flops1[i], bytes_per_layer=bytes1[i],
                             time_s_per_layer=t["time_s"][i] / c if c else 0.0))
        return rows


def exact_sum(values):
    """The sum of per-op FLOPs or bytes: exact for ints (Python ints never wrap), correctly rounded
    (math.fsum) where some are floats (MoE expert reads are expectations; int4 has fractional bytes)."""
    values = list(values)
    total = sum(values)  # an int exactly when every value is one
    return total if type(total) is int else math.fsum(values)


def _shares(groups: list[dict]) -> None:
    """Add flops_share and time_share (fractions of their phase) to per-class rows, in place."""
    for phase in dict.fromkeys(g["phase"] for g in groups):
        mine = [g for g in groups if g["phase"] == phase]
        for col, share in (("flops", "flops_share"), ("time_s", "time_share")):
            total = sum(g[col] for g in mine)
            for g in mine:
                g[share] = g[col] / total if total > 0 else 0.0


def op_table(ops, gpu: GPU, precision: Precision, phase: str, model: str = "roofline"):
    """:meth:`PhaseCost.rows` of ``ops`` (Records or a list of OpCost) as a DataFrame."""
    import pandas as pd

    rec = ops if isinstance(ops, Records) else Records.of_ops(list(ops))
    return pd.DataFrame(PhaseCost(rec, gpu, precision, phase, model).rows())


def op_totals(ops: list[OpCost], gpu: GPU, precision: Precision, model: str = "roofline") -> Totals:
    """:func:`totals` of a list of OpCost (scalar or array dims)."""
    return totals(Records.of_ops(list(ops)), gpu, precision, model)


def phase_totals(cfg, gpu: GPU, precision: Precision, phase: str, b, tokens, settings: Settings = Settings()) -> Totals:
    """:func:`totals` of one phase at batch ``b`` and ``tokens`` (ints, or arrays broadcast together)."""
    return totals(phase_records(cfg, precision, phase, b, tokens, settings), gpu, precision, settings.model)
