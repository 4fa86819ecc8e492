"""fp8 training recipes (NVIDIA Transformer Engine, DeepSeek-V3): GEMMs in fp8, the rest in bf16.

A recipe runs every GEMM inside the layers (forward Y = X W, dgrad dX = dY Wᵀ, wgrad dW = Xᵀ dY) on fp8
operands at the GPU's fp8 tensor rate, and everything else (attention, norms, activations, the lm_head
and the router, which Megatron-Core keeps in bf16) as bf16 mixed precision does. Its costs over
``bf16-mixed``:

- **GEMM time**: the same calibrated model as every GEMM (:mod:`lmcost.cost.efficiency`: tile and wave
  quantization of the shape, the GPU's fitted fraction) at the ``fp8`` peak of the GPU's YAML, the way the
  inference path costs fp8 GEMMs (the activation dtype's peak, :func:`lmcost.cost.roofline.peak_for`),
  times a recipe's GEMM scale (:class:`lmcost.cost.feature_figures.FeatureFigures`). The GEMM's bytes stay
  those of bf16 operands (an upper bound on a compute-bound kernel's traffic).
- **quantize kernels** (Transformer Engine docs, "Using FP8 with Transformer Engine": ``cast_transpose``
  writes a tensor's fp8 copy and its fp8 transpose in one pass, the amax taken in the same kernel): per
  GEMM, its input X [M, K] before the forward (X for the forward, Xᵀ for the wgrad), the output gradient
  dY [M, N] before the backward (dY for the dgrad, dYᵀ for the wgrad), and the weight W [N, K] (W and Wᵀ),
  memory-bound: read 2 bytes (bf16), write 1 + 1 bytes (fp8 copy and transpose) plus the scales per element
  (:data:`FP8_RECIPES`); per-tensor current scaling reads the input once more for its amax. The weights
  are cast once per step (``fp8_weight_cache``). Charged as separate kernels: TE fuses some casts into the
  preceding norm (``LayerNormLinear``), so this is an upper bound.
- **memory**: TE keeps an fp8 copy of every such weight and of its transpose beside the bf16 weights
  (``fp8_weight_copy_bytes``); gradients, master copy and optimizer states are bf16-mixed's. Activations are
  counted as bf16 (TE saves some GEMM inputs in fp8: an upper bound).

MFU stays against the bf16 dense peak: the convention of NVIDIA's fp8 tables (NeMo and Megatron-Bridge
publish model TFLOP/s of fp8 runs; the fitting set's MFUs divide by 989 TFLOP/s, the H100's bf16 peak).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.efficiency import is_gemm
from lmcost.operators.ops import OpClass, OpCost

#: GEMM roles that stay in bf16 under Transformer Engine (Megatron-Core's output layer and router).
BF16_GEMMS = ("lm_head", "moe.router")
#: The dtypes an fp8 GEMM is timed in: fp8 compute (the GPU's fp8 peak), bf16 operands in the records.
FP8_COMPUTE = Precision("bf16", "fp8", "bf16")
#: The bf16 mixed-precision recipe an fp8 recipe keeps its model states in (lmcost.cost.optimizers).
STATES_RECIPE = "bf16-mixed"


@dataclass(frozen=True)
class Fp8Recipe:
    """One fp8 recipe: scale bytes per element of a quantized activation or gradient (``act_scale``) and of
    a weight (``weight_scale``), extra reads of the bf16 input per cast (``amax_reads``: a separate amax
    pass), whether its GEMMs take the block-scaled GEMM scale (``block``), and ``source``."""

    name: str
    act_scale: float
    weight_scale: float
    amax_reads: int
    block: bool
    source: str


FP8_RECIPES: dict[str, Fp8Recipe] = {r.name: r for r in (
    Fp8Recipe("fp8-delayed", 0.0, 0.0, 0, False,
              "Transformer Engine DelayedScaling (its default on Hopper): one fp32 scale per tensor from an amax "
              "history, the amax taken inside the cast kernel"),
    Fp8Recipe("fp8-current", 0.0, 0.0, 1, False,
              "Transformer Engine Float8CurrentScaling (Megatron-Bridge's per-tensor recipe): the scale from the "
              "tensor's own amax, a read of the input before the cast"),
    Fp8Recipe("fp8-block", 4 / 128, 4 / (128 * 128), 0, True,
              "DeepSeek-V3 technical report section 3.3.2 (Transformer Engine Float8BlockScaling): fp32 scales per "
              "1x128 tile of activations and gradients, per 128x128 block of weights"),
    Fp8Recipe("mxfp8", 1 / 32, 1 / 32, 0, True,
              "OCP Microscaling (MX) v1.0, MXFP8 (Transformer Engine MXFP8BlockScaling, Blackwell): one 1-byte "
              "E8M0 scale per 32 elements"),
)}


def fp8_recipe(precision: str) -> Fp8Recipe | None:
    """The fp8 recipe a training ``precision`` names, or None (a bf16/fp16/fp32 recipe)."""
    return FP8_RECIPES.get(precision)


def states_precision(precision: str) -> str:
    """The model-states recipe of ``precision`` (:data:`lmcost.cost.optimizers.PRECISIONS`): bf16-mixed for an
    fp8 recipe, else ``precision`` itself."""
    return STATES_RECIPE if precision in FP8_RECIPES else precision


def check_fp8(precision: str, gpu) -> None:
    """Raises: LmcostError (precision) if ``precision`` is an fp8 recipe and ``gpu`` has no fp8 tensor rate
    (``peak_tflops.fp8`` in its YAML: Ada, Hopper, Blackwell have one; Ampere does not)."""
    if precision in FP8_RECIPES and "fp8" not in gpu.peak_tflops:
        raise LmcostError("precision", f"{gpu.name} has no fp8 tensor-core rate for {precision}",
                          "use `precision` bf16-mixed, or a GPU with fp8 (Hopper, Ada, Blackwell)")


def fp8_gemm_mask(ops) -> np.ndarray:
    """Which ops of a training graph run in fp8 (bool over ``ops``): the GEMMs and their backward, but
    not the lm_head and router (:data:`BF16_GEMMS`) or a flash kernel."""
    return np.array([bool(op.matmul) and is_gemm(op) and op.role.removeprefix("bwd.") not in BF16_GEMMS
                     for op in ops], dtype=bool)


def fp8_gemm_times(rec, gpu, model: str, scale: float) -> np.ndarray:
    """Seconds over their layers of every op of ``rec`` (a training phase's records) with the matmuls at the
    GPU's fp8 peak times ``scale``: :class:`lmcost.cost.phases.PhaseCost` of the same records on a copy of
    ``gpu`` whose fp8 peak is scaled, with fp8 the compute dtype. Only the ops of :func:`fp8_gemm_mask` are
    meant to be read. Raises: LmcostError if the GPU has no fp8 peak."""
    from lmcost.cost.phases import PhaseCost

    peaks = dict(gpu.peak_tflops)
    peaks["fp8"] = peaks["fp8"] * scale
    fast = gpu.model_copy(update={"peak_tflops": peaks}) if scale != 1 else gpu
    return PhaseCost(rec, fast, FP8_COMPUTE, "train", model).times["time_s"]


def quantize_ops(rec, recipe: Fp8Recipe, b_in: float = 2) -> tuple[list[OpCost], list[OpCost]]:
    """The cast-transpose kernels of one microbatch's fp8 GEMMs (module docstring), as OpCost records over
    their layers: (activation and gradient casts, weight casts). Per forward GEMM of M x N x K (one kernel;
    ``kernels`` of them, experts), X [M, K] and dY [M, N] are read at ``b_in`` bytes per element (bf16: 2),
    plus ``amax_reads`` more, and written as fp8 copy and transpose, 2 x (1 + act_scale) bytes per element;
    W [N, K] likewise with ``weight_scale``. 2 FLOPs per element (the amax's compare, the scaling)."""
    ops, cols = rec.graph.templates, rec.cols
    mask = fp8_gemm_mask(ops)
    acts, weights = [], []
    read = b_in * (1 + recipe.amax_reads)
    for i, op in enumerate(ops):
        if not mask[i] or op.role.startswith("bwd."):
            continue
        m, n, k, kern, count = (cols.m[i], cols.n[i], cols.k[i], cols.kernels[i], cols.count[i])
        casts = (("x", m * k * kern, recipe.act_scale, acts), ("dy", m * n * kern, recipe.act_scale, acts),
                 ("w", n * k * kern, recipe.weight_scale, weights))
        for what, elems, scale, out in casts:
            name = f"fp8.cast_transpose.{what}.{op.role}"
            out.append(OpCost(name, OpClass.ELEMENTWISE, flops=2 * elems, act_read_bytes=read * elems,
                              act_write_bytes=2 * (1 + scale) * elems, count=count,
                              shapes="bf16 [rows, cols] -> fp8 copy + fp8 transpose (+ scales)"))
    return acts, weights


def fp8_weight_copy_bytes(tensors: list, recipe: Fp8Recipe, shards: int = 1) -> int:
    """Bytes of Transformer Engine's fp8 weight copies on one GPU: for every GEMM weight inside the layers
    (``tensors``: :class:`lmcost.cost.optimizers.ParamTensor` of one stage; 2-D matrices and 3-D expert
    stacks, not the embedding, lm_head or router), an fp8 copy and an fp8 transpose, 2 x (1 +
    weight_scale) bytes per element, ceil-divided over ``shards`` (ZeRO-3: the dp ranks)."""
    elems = sum(t.numel * t.count for t in tensors
                if t.role.endswith(".weight") and len(t.shape) >= 2
                and t.role.rsplit(".", 1)[0] not in ("embed", "pos_embed", *BF16_GEMMS))
    return math.ceil(math.ceil(elems / shards) * 2 * (1 + recipe.weight_scale))
