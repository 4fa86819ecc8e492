"""The two time models, peers chosen in one place: the roofline (a lower bound, :mod:`lmcost.roofline`)
and the calibrated expectation (:mod:`lmcost.efficiency`), for one operator or for every operator of
a phase at once (:func:`op_statics` gathers what each op needs that does not change with the workload).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from .efficiency import Efficiency, expected_times, is_gemm, kernel_class
from .roofline import op_time, peak_for

#: The two prediction modes: the roofline lower bound, and the expected time under the efficiency model.
TIME_MODELS = ("roofline", "calibrated")


def op_statics(ops, gpu, precision, eff: Optional[Efficiency] = None) -> dict:
    """What the efficiency model needs of each op that does not depend on the workload, as arrays over
    ``ops`` (OpCost records, or their traced templates): the peak it runs at, whether it is a GEMM, its
    compute fraction, achieved bandwidth (B/s), per-kernel overhead (s), and whether it runs inside
    another op's kernel; and the roofline's bandwidth (B/s) and kernel floor (s). ``eff`` defaults to
    the GPU's block; with none, only the roofline figures are filled.

    Raises: LmcostError if the GPU has no peak for the activation dtype.
    """
    eff = eff or gpu.efficiency
    out = dict(peak=np.array([peak_for(op, gpu, precision) for op in ops], dtype=float), eff=eff,
               bandwidth_roof=gpu.bandwidth, floor_s=(gpu.kernel_floor_us or 0.0) * 1e-6)
    if eff is None:
        return out
    gemm = [op.matmul and is_gemm(op) for op in ops]
    frac = [eff.gemm.peak_fraction if g else eff.attention_peak_fraction if op.matmul else eff.vector_fraction
            for op, g in zip(ops, gemm)]
    cls = [kernel_class(op) for op in ops]
    out.update(gemm=np.array(gemm, dtype=bool), frac=np.array(frac, dtype=float),
               bandwidth=np.array([gpu.bandwidth * eff.bw_fraction(op.kind, c) for op, c in zip(ops, cls)]),
               overhead_s=np.array([eff.overhead_s(op.kind, c) for op, c in zip(ops, cls)]),
               inside=np.array([isinstance(op.kernels, int) and op.kernels == 0 for op in ops], dtype=bool))
    return out


def expected_time(op, gpu, precision, eff: Optional[Efficiency] = None):
    """Expected seconds of one execution of ``op`` under the efficiency model (scalars or arrays),
    never less than its roofline time: :func:`expected_times` for one op.

    Falls back to the roofline time (:func:`lmcost.roofline.op_time`) when the GPU has no efficiency.
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
