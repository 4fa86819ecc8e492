"""The two time models, peers chosen in one place: the roofline (a lower bound, :mod:`lmcost.cost.roofline`)
and the calibrated expectation (:mod:`lmcost.cost.efficiency`), for one operator or for every operator of
a phase at once (:func:`op_statics` gathers what each op needs that does not change with the workload).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lmcost.cost.efficiency import expected_times, is_gemm, kernel_class

from lmcost.hardware.efficiency import Efficiency
from lmcost.cost.collectives import collective
from lmcost.cost.roofline import op_time, peak_for
from lmcost.graph.ops import OpClass
from lmcost.graph.parallel import Layout, cluster_for, group_nodes
from lmcost.graph.workload import TIME_MODELS


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
            key = (op.collective, op.ranks, min(op.ranks, group_nodes(layout, op.comm_group, cluster.gpus_per_node)))
            if key not in made:
                made[key] = collective(key[0], key[1], cluster, nodes=key[2])
            out[i] = made[key]
    return out


def op_statics(ops, gpu, precision, eff: Optional[Efficiency] = None, layout=None) -> dict:
    """What the efficiency model needs of each op that does not depend on the workload, as arrays over
    ``ops`` (OpCost records, or their traced templates): the peak it runs at, whether it is a GEMM or a
    flash kernel, its compute fraction (and a flash kernel's prefill ramp l_half), achieved bandwidth
    (B/s), per-kernel overhead (s), whether it runs inside another op's kernel, the selected decode
    figures (bandwidth, overhead, keys per split, SM count) and its error band (low, high; a flash
    kernel's for prefill and for decode); and the roofline's bandwidth (B/s) and kernel floor (s).
    ``eff`` defaults to the GPU's block; with none, only the roofline figures are filled.
    ``collectives``: per op, the :class:`lmcost.cost.collectives.Collective` a communication op runs on the
    cluster of ``layout`` (None for every other op); ``comm``: which ops communicate.

    Raises: LmcostError if the GPU has no peak for the activation dtype, or a communication op's
    cluster cannot be found.
    """
    eff = eff or gpu.efficiency
    colls = collectives_of(ops, gpu, layout)
    out = dict(peak=np.array([peak_for(op, gpu, precision) for op in ops], dtype=float), eff=eff,
               bandwidth_roof=gpu.bandwidth, floor_s=(gpu.kernel_floor_us or 0.0) * 1e-6,
               collectives=colls, comm=np.array([c is not None for c in colls], dtype=bool))
    if eff is None:
        return out
    gemm = [op.matmul and is_gemm(op) for op in ops]
    sdpa = [op.kind == "sdpa" and op.mnk is not None for op in ops]
    cls = [kernel_class(op) for op in ops]
    pre, dec = eff.prefill_figures(), eff.decode_figures()
    frac, l_half, bandwidth, overhead, bands = [], [], [], [], []
    for op, g, a, c in zip(ops, gemm, sdpa, cls):
        kf = None if (g or a) else eff.kind_figures(op.kind, c)
        bw, ov = eff.bw_fraction(op.kind, c), eff.overhead_s(op.kind, c)
        if a and pre is not None:
            frac.append(pre.peak_fraction)
            l_half.append(pre.l_half)
            ov = pre.overhead_us * 1e-6
        else:
            frac.append(eff.gemm.peak_fraction if g else eff.attention_peak_fraction if op.matmul else eff.vector_fraction)
            l_half.append(0.0)
        if kf is not None:
            bw, ov = kf.bandwidth_fraction, kf.overhead_us * 1e-6
        bandwidth.append(gpu.bandwidth * bw)
        overhead.append(ov)
        # A flash kernel's in-kernel softmax is part of that kernel: its band is the kernel's.
        host = a or (op.op_class.value == "softmax" and isinstance(op.kernels, int) and op.kernels == 0)
        bands.append(eff.band("gemm" if g else "attention_prefill" if host else _band_class(op)))
    dec_band = eff.band("attention_decode")
    n_ops = len(ops)
    out.update(gemm=np.array(gemm, dtype=bool), sdpa=np.array(sdpa, dtype=bool), frac=np.array(frac, dtype=float),
               l_half=np.array(l_half, dtype=float), bandwidth=np.array(bandwidth, dtype=float),
               overhead_s=np.array(overhead, dtype=float),
               inside=np.array([isinstance(op.kernels, int) and op.kernels == 0 for op in ops], dtype=bool),
               has_decode=np.full(n_ops, dec is not None), sm_count=float(eff.gemm.sm_count),
               split_tokens=np.full(n_ops, float(dec.split_tokens if dec else 0)),
               dec_bandwidth=np.full(n_ops, gpu.bandwidth * (dec.bandwidth_fraction if dec else 1.0)),
               dec_overhead_s=np.full(n_ops, (dec.overhead_us if dec else 0.0) * 1e-6),
               band_low=np.array([b[0] for b in bands]), band_high=np.array([b[1] for b in bands]),
               dec_band_low=np.full(n_ops, dec_band[0]), dec_band_high=np.full(n_ops, dec_band[1]))
    return out


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
    statics = {k: (v[0] if isinstance(v, np.ndarray) else v) for k, v in op_statics([op], gpu, precision, eff).items()}
    if statics["eff"] is None:
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
