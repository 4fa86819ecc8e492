"""The two time models, peers chosen in one place: the roofline (a lower bound, :mod:`lmcost.cost.roofline`)
and the calibrated expectation (:mod:`lmcost.cost.efficiency`), for one operator or for every operator of
a phase at once (:func:`op_statics` gathers what each op needs that does not change with the workload).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Optional

import numpy as np

from lmcost.basics.results import Result
from lmcost.cost.efficiency import ACT_QUANT_BYTES, expected_times, is_gemm, kernel_class

from lmcost.hardware.efficiency import Efficiency
from lmcost.cost.collectives import collective
from lmcost.cost.roofline import op_time, peak_for
from lmcost.operators.ops import OpClass
from lmcost.operators.parallel import Layout, cluster_for, group_nodes, group_stride
from lmcost.operators.workload import TIME_MODELS


@dataclass(frozen=True, kw_only=True, slots=True)
class OpStatics(Result):
    """What the time models need of each op of a list that does not change with the workload
    (:func:`op_statics`). Arrays run over the ops (1-D, or lifted to [ops, 1, ...] to broadcast over a
    grid, :meth:`map`); the rest are one value for all of them. The efficiency fields are None when
    the GPU has no efficiency block (only the roofline's figures are filled)."""

    #: FLOP/s each op runs at: the tensor rate of the activation dtype for a matmul, else the vector rate.
    peak: np.ndarray
    #: The GPU's efficiency block (None: roofline only).
    eff: Optional[Efficiency]
    #: The roofline's bandwidth (B/s) and its kernel floor (s; 0 where none was measured).
    bandwidth_roof: float
    floor_s: float
    #: Per op, the :class:`lmcost.cost.collectives.Collective` a communication op runs (None for the
    #: others: an object array), and which ops communicate (bool).
    collectives: np.ndarray
    comm: np.ndarray
    #: Whether each op runs a GEMM kernel, a flash (sdpa) kernel (bool).
    gemm: Optional[np.ndarray] = None
    sdpa: Optional[np.ndarray] = None
    #: Achieved fraction of ``peak`` (1), and a flash kernel's prefill ramp l_half (keys per query; 0 else).
    frac: Optional[np.ndarray] = None
    l_half: Optional[np.ndarray] = None
    #: A flash kernel's query heads per KV stream (its thread blocks run per query head; 1 else).
    q_per_stream: Optional[np.ndarray] = None
    #: Achieved bandwidth (B/s) and per-kernel overhead (s).
    bandwidth: Optional[np.ndarray] = None
    overhead_s: Optional[np.ndarray] = None
    #: Whether an op runs inside another op's kernel (a flash kernel's softmax: it costs its roofline).
    inside: Optional[np.ndarray] = None
    #: The selected decode-attention figures: present (bool), the GEMM block's SM count, keys per split,
    #: bandwidth (B/s) and overhead (s).
    has_decode: Optional[np.ndarray] = None
    sm_count: Optional[float] = None
    split_tokens: Optional[np.ndarray] = None
    dec_bandwidth: Optional[np.ndarray] = None
    dec_overhead_s: Optional[np.ndarray] = None
    #: Microseconds per thread block of a flash kernel, in prefill (the selected prefill figures') and in
    #: decode (:func:`lmcost.cost.efficiency.attention_cta_time`; 0: none).
    pre_cta_us: Optional[np.ndarray] = None
    dec_cta_us: Optional[np.ndarray] = None
    #: Per GEMM, bytes per M*K element of the engine's activation-quantization pass (0: none;
    #: :func:`lmcost.cost.efficiency.activation_quant_time`).
    quant_bytes: Optional[np.ndarray] = None
    #: The calibrated time's error band (low, high multipliers), and a flash kernel's in decode.
    band_low: Optional[np.ndarray] = None
    band_high: Optional[np.ndarray] = None
    dec_band_low: Optional[np.ndarray] = None
    dec_band_high: Optional[np.ndarray] = None

    def map(self, fn) -> "OpStatics":
        """These statics with ``fn`` applied to every array over ops (slicing, reshaping, indexing)."""
        return replace(self, **{f.name: fn(v) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), np.ndarray)})

    def then(self, other: "OpStatics") -> "OpStatics":
        """These ops' statics followed by ``other``'s (same GPU and precision: the scalars are these)."""
        return replace(self, **{f.name: np.concatenate([v, getattr(other, f.name)]) for f in fields(self)
                                if isinstance(v := getattr(self, f.name), np.ndarray)})

    def to_dict(self) -> dict:
        """The fields as a dict (the efficiency fields only where the GPU has a block)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if self.eff is not None or f.name in _ROOFLINE_STATICS}


_ROOFLINE_STATICS = ("peak", "eff", "bandwidth_roof", "floor_s", "collectives", "comm")


def collectives_of(ops, gpu, layout: Layout | None):
    """Per op, the collective a communication op runs (:func:`lmcost.cost.collectives.collective`, placed on
    the cluster of ``layout``), None for the others: an object array over ``ops``."""
    out = np.empty(len(ops), dtype=object)
    if not any(op.op_class is OpClass.COMMUNICATION for op in ops):
        return out
    cluster = cluster_for(layout, gpu)
    layout = layout or Layout()
    made: dict = {}  # one Collective per (kind, ranks, nodes): ops sharing it are timed together
    for i, op in enumerate(ops):
        if op.op_class is OpClass.COMMUNICATION:
            key = (op.collective, op.ranks, min(op.ranks, group_nodes(layout, op.comm_group, cluster.gpus_per_node)),
                   group_stride(layout, op.comm_group))
            if key not in made:  # the fabric the group sees: an NVLink-bridged pair, n - 1 links of a mesh
                made[key] = collective(key[0], key[1], cluster.for_group(*key[1:]), nodes=key[2])
            out[i] = made[key]
    return out


def op_statics(ops, gpu, precision, eff: Optional[Efficiency] = None, layout=None) -> OpStatics:
    """What the efficiency model needs of each op that does not depend on the workload, as arrays over
    ``ops`` (OpCost records, or their traced templates): the peak it runs at, whether it is a GEMM or a
    flash kernel, its compute fraction (and a flash kernel's prefill ramp l_half), achieved bandwidth
    (B/s), per-kernel overhead (s), whether it runs inside another op's kernel, the selected decode
    figures (bandwidth, overhead, keys per split, SM count) and its error band (low, high; a flash
    kernel's for prefill and for decode); and the roofline's bandwidth (B/s) and kernel floor (s).
    ``eff`` defaults to the GPU's block; with none, only the roofline figures are filled.
    ``collectives``: per op, the :class:`lmcost.cost.collectives.Collective` a communication op runs on the
    cluster of ``layout`` (None for every other op); ``comm``: which ops communicate.
    Returns: :class:`OpStatics` (its fields name each figure and its unit).

    Raises: LmcostError if the GPU has no peak for the activation dtype, or a communication op's
    cluster cannot be found.
    """
    eff = eff or gpu.efficiency
    colls = collectives_of(ops, gpu, layout)
    roof = dict(peak=np.array([peak_for(op, gpu, precision) for op in ops], dtype=float), eff=eff,
                bandwidth_roof=gpu.bandwidth, floor_s=(gpu.kernel_floor_us or 0.0) * 1e-6,
                collectives=colls, comm=np.array([c is not None for c in colls], dtype=bool))
    if eff is None:
        return OpStatics(**roof)
    gemm = [op.matmul and is_gemm(op) for op in ops]
    sdpa = [op.kind == "sdpa" and op.mnk is not None for op in ops]
    cls = [kernel_class(op) for op in ops]
    pre, dec = eff.prefill_figures(), eff.decode_figures()
    frac, l_half, bandwidth, overhead, bands = [], [], [], [], []
    for op, g, a, c in zip(ops, gemm, sdpa, cls):
        kf = None if (g or a) else eff.kind_figures(op.kind, c)
        bw, ov = eff.bw_fraction(op.kind, c), eff.overhead_s(op.kind, c)
        if g and eff.gemm_dtype_overhead_us:
            ov = eff.gemm_overhead_s(precision.activations)
        if a and pre is not None:
            frac.append(pre.peak_fraction)
            l_half.append(pre.l_half)
            ov = pre.overhead_us * 1e-6
        else:
            frac.append(eff.gemm_fraction(precision.activations) if g else eff.attention_peak_fraction if op.matmul else eff.vector_fraction)
            l_half.append(0.0)
        if kf is not None:
            bw, ov = kf.bandwidth_fraction, kf.overhead_us * 1e-6 + _row_s(kf, op)
            if hasattr(kf, "fraction_on"):  # an engine's row kernel (RowKindFigures): its rate on this GPU
                bw = kf.fraction_on(gpu.bandwidth, eff.gemm.sm_count)
        bandwidth.append(gpu.bandwidth * bw)
        overhead.append(ov)
        # A flash kernel's in-kernel softmax is part of that kernel: its band is the kernel's.
        host = a or (op.op_class.value == "softmax" and isinstance(op.kernels, int) and op.kernels == 0)
        band_class = "gemm" if g else "attention_prefill" if host else _band_class(op)
        # an engine's band of a norm/elementwise class is its designs'; an op they do not cost keeps torch's
        own = band_class in eff.own_bands and not hasattr(kf, "fraction_on") and not (g or host)
        bands.append(tuple(eff.own_bands[band_class]) if own else eff.band(band_class))
    dec_band = eff.band("attention_decode")
    q = precision.activations  # the dtype the per-dtype GEMM figures are keyed by (gemm_overhead_s)
    n_ops = len(ops)
    return OpStatics(**roof, gemm=np.array(gemm, dtype=bool), sdpa=np.array(sdpa, dtype=bool),
                     frac=np.array(frac, dtype=float), l_half=np.array(l_half, dtype=float),
                     q_per_stream=np.array([float(getattr(op, "q_per_stream", 1) or 1) for op in ops]),
                     bandwidth=np.array(bandwidth, dtype=float), overhead_s=np.array(overhead, dtype=float),
                     inside=np.array([isinstance(op.kernels, int) and op.kernels == 0 for op in ops], dtype=bool),
                     has_decode=np.full(n_ops, dec is not None), sm_count=float(eff.gemm.sm_count),
                     split_tokens=np.full(n_ops, float(dec.split_tokens if dec else 0)),
                     dec_bandwidth=np.full(n_ops, gpu.bandwidth * (dec.bandwidth_fraction if dec else 1.0)),
                     dec_overhead_s=np.full(n_ops, (dec.overhead_us if dec else 0.0) * 1e-6),
                     quant_bytes=np.array([ACT_QUANT_BYTES[q] if g and q in eff.gemm_quantize_dtypes else 0.0
                                           for g in gemm], dtype=float),
                     pre_cta_us=np.full(n_ops, pre.cta_us if pre is not None else 0.0),
                     dec_cta_us=np.full(n_ops, dec.cta_us if dec is not None else 0.0),
                     band_low=np.array([b[0] for b in bands]), band_high=np.array([b[1] for b in bands]),
                     dec_band_low=np.full(n_ops, dec_band[0]), dec_band_high=np.full(n_ops, dec_band[1]))


def _row_s(kf, op) -> float:
    """Seconds a one-block-per-row kernel takes to walk one row: ``row_ns`` of its figures
    (:class:`lmcost.hardware.engine_memory.RowKindFigures`; 0 for every other figure) times the op's row width."""
    row_ns = getattr(kf, "row_ns", 0.0)
    return row_ns * 1e-9 * float(op.row_width) if row_ns and op.row_width else 0.0


def _band_class(op) -> str:
    """The band class of a non-GEMM, non-flash op: norms, elementwise kernels (activations, adds, RoPE),
    softmax; embedding, routing and the rest take the widest band (their class had no measured rows)."""
    c = op.op_class.value
    return c if c in ("norm", "elementwise", "softmax") else "other"


def expected_time(op, gpu, precision, eff: Optional[Efficiency] = None):
    """Expected seconds of one execution of ``op`` under the efficiency model (scalars or arrays),
    never less than its roofline time: :func:`expected_times` for one op.

    Falls back to the roofline time (:func:`lmcost.cost.roofline.op_time`) when the GPU has no efficiency.
    Raises: LmcostError if the GPU has no peak for the activation dtype.
    """
    roofline = op_time(op, gpu, precision).time_s
    statics = op_statics([op], gpu, precision, eff).map(lambda v: v[0])
    if statics.eff is None:
        return roofline
    m, n, k = op.mnk if op.mnk is not None else (1, 1, 1)
    return expected_times(op.flops, op.bytes, op.kernels, m, n, k, statics, roofline)


def predict_time(op, gpu, precision, model: str = "roofline"):
    """Seconds of one execution of ``op``: the roofline bound or the calibrated expectation.

    Raises: ValueError for an unknown model (the CLI offers only TIME_MODELS).
    """
    if model == "roofline":
        return op_time(op, gpu, precision).time_s
    if model == "calibrated":
        return expected_time(op, gpu, precision)
    raise ValueError(f"model must be one of {TIME_MODELS}, got {model!r}")
