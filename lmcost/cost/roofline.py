"""The roofline: an operator takes as long as the slower of its compute and its memory traffic.

time = max(FLOPs / peak, bytes / bandwidth) (Williams, Waterman & Patterson 2009, "Roofline"),
and at least the measured per-kernel floor on a calibrated device.
peak is the tensor-core rate of the dtype a matmul multiplies in (:func:`gemm_dtype`: the activation
dtype, or a quantization recipe's compute dtype for the GEMMs over its quantized weights), the vector
(fp32 CUDA-core) rate for everything else. The sum of the two terms is the roofline with no overlap at all: an
upper bound on the roofline time, not on the calibrated time (``estimate --json``'s ``time_upper_s``).
An op is memory-bound exactly when its arithmetic intensity FLOPs/bytes is below peak/bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.hardware.gpu import GPU
from lmcost.model.quant import gemm_recipe
from lmcost.operators.ops import OpCost


@dataclass(frozen=True)
class OpTime:
    """Roofline timing of one op (one execution). Seconds; scalars or arrays like the op's dims.

    ``floor_s`` is the device's smallest kernel time where it was measured (``lmcost calibrate``):
    no kernel finishes faster, however little it does. Datasheet GPUs have none (0).
    """

    compute_s: Any
    memory_s: Any
    floor_s: float = 0.0

    @property
    def time_s(self):
        """max(compute, memory, floor): the roofline time (s)."""
        t = np.maximum(self.compute_s, self.memory_s)
        return np.maximum(t, self.floor_s) if self.floor_s else t

    @property
    def upper_s(self):
        """compute + memory (at least the floor): the roofline with no overlap (s), an upper bound on
        :attr:`time_s`, not on a calibrated time (which can exceed it)."""
        t = self.compute_s + self.memory_s
        return np.maximum(t, self.floor_s) if self.floor_s else t


def gemm_dtype(op: OpCost, gpu: GPU, precision: Precision) -> str:
    """The dtype whose tensor peak the matmul ``op`` runs at on ``gpu``: for a GEMM over a weight stored
    in a quantization recipe's low-precision format (``op.quant``), the recipe's compute dtype there
    (:meth:`lmcost.model.quant.Recipe.gemm_dtype`: fp8 for W8A8, fp4 for NVFP4 or MXFP4 W4A4, the activation dtype
    for weight-only recipes or where the GPU lacks the recipe's tensor cores); else the activation dtype.
    The one rule the roofline and the efficiency model read (an efficiency block's GEMM fraction applies
    to this dtype's peak). Meaningless for a non-matmul op (it runs at the vector rate)."""
    if op.quant:
        return gemm_recipe(op.quant).gemm_dtype(gpu.peak_tflops, precision.activations)
    return precision.activations


def peak_for(op: OpCost, gpu: GPU, precision: Precision) -> float:
    """FLOP/s available to ``op``: the tensor rate of its :func:`gemm_dtype`, or the vector rate."""
    return gpu.peak_flops(gemm_dtype(op, gpu, precision)) if op.matmul else gpu.vector_flops


def op_time(op: OpCost, gpu: GPU, precision: Precision) -> OpTime:
    """Roofline time of one execution of ``op`` on ``gpu`` (seconds).

    Raises: LmcostError if the GPU has no peak for the activation dtype.
    """
    return OpTime(compute_s=op.flops / peak_for(op, gpu, precision), memory_s=op.bytes / gpu.bandwidth,
                  floor_s=(gpu.kernel_floor_us or 0.0) * 1e-6)


def intensity(flops, bytes_):
    """Arithmetic intensity, FLOPs per byte. Zero bytes: inf if there are FLOPs, else 0."""
    if isinstance(flops, (int, float)) and isinstance(bytes_, (int, float)):
        return flops / bytes_ if bytes_ > 0 else (float("inf") if flops > 0 else 0.0)
    flops, bytes_ = np.asarray(flops, dtype=float), np.asarray(bytes_, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(bytes_ > 0, flops / np.where(bytes_ > 0, bytes_, 1), np.where(flops > 0, np.inf, 0.0))
    return out if out.ndim else float(out)


def bound(compute_s, memory_s):
    """'memory' where memory time exceeds compute time, else 'compute'."""
    if isinstance(compute_s, float) and isinstance(memory_s, float):
        return "memory" if memory_s > compute_s else "compute"
    out = np.where(np.asarray(memory_s) > np.asarray(compute_s), "memory", "compute")
    return out if out.ndim else str(out)
