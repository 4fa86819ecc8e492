"""What a training step's kernel features change, in one call each for :func:`lmcost.apps.train.train_step`:
the per-op times (fp8 GEMMs, :mod:`lmcost.cost.fp8_training`; the attention kernel's backward and ring
attention's overlap, :mod:`lmcost.cost.attention_training`) and the memory they add (fp8 weight copies,
redundant experts: :mod:`lmcost.cost.redundant_experts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.cost.attention_training import backward_scaled, ring_exposed
from lmcost.cost.feature_figures import FEATURE_FIGURES, FeatureFigures
from lmcost.cost.fp8_training import (check_fp8, fp8_gemm_mask, fp8_gemm_times, fp8_recipe, fp8_weight_copy_bytes,
                                      quantize_ops, states_precision)
from lmcost.cost.redundant_experts import redundant_expert_bytes


@dataclass(frozen=True)
class KernelFeatures:
    """One microbatch's per-op seconds over their layers with the features applied (``per_op``, along the
    path through all stages, as :class:`lmcost.cost.phases.PhaseCost`'s ``times["time_s"]``), and the parts
    they add or hide (s, the same path): fp8 quantize kernels per microbatch (``quantize_s``) and per step
    (``weight_cast_s``: the weights' casts, once per step with TE's cache), ring attention's K/V sends
    exposed and hidden under the blocks' attention. ``kernel_s``: ``per_op`` before the overlap (every
    send in full): what each op's kernels take, for the step's table by operator class."""

    per_op: np.ndarray
    kernel_s: np.ndarray
    quantize_s: float = 0.0
    weight_cast_s: float = 0.0
    ring_exposed_s: float = 0.0
    ring_hidden_s: float = 0.0


def kernel_features(rec, per_op, gpu, model: str, precision: str,
                    figures: FeatureFigures = FEATURE_FIGURES) -> KernelFeatures:
    """``per_op`` (seconds over layers of the training records ``rec`` on ``gpu``, under ``model``) with,
    in this order: the fp8 GEMMs of an fp8 ``precision`` recipe at the fp8 peak, each flash backward at its
    kernel family's backward rate (calibrated only: the roofline has no fractions), and ring attention's
    sends less what the blocks' attention hides. ``gpu``: with its attention family selected
    (:func:`lmcost.apps.setup.select_efficiency`).
    Returns: :class:`KernelFeatures`. Raises: LmcostError (precision) for an fp8 recipe on a GPU without
    an fp8 rate."""
    from lmcost.cost.phases import op_totals

    ops = rec.graph.templates
    out = np.array(per_op, dtype=float)
    q_s = w_s = 0.0
    recipe = fp8_recipe(precision)
    if recipe is not None:
        check_fp8(precision, gpu)
        scale = figures.fp8_block_gemm_scale if recipe.block else figures.fp8_gemm_scale
        out = np.where(fp8_gemm_mask(ops), fp8_gemm_times(rec, gpu, model, scale), out)
        acts, weights = quantize_ops(rec, recipe)
        q_s = op_totals(acts, gpu, Precision(), model).time_s if acts else 0.0
        w_s = op_totals(weights, gpu, Precision(), model).time_s if weights else 0.0
    if model == "calibrated" and gpu.efficiency is not None:
        out = backward_scaled(ops, out, figures.backward_fraction(gpu.efficiency.kernel))
    kernels = out
    out, exposed, hidden = ring_exposed(ops, kernels, rec.cols.count, figures.ring_overlap)
    return KernelFeatures(out, kernels, float(q_s), float(w_s), exposed, hidden)


def class_rows(rec, gpu, precision: Precision, model: str, kernel_s) -> list[dict]:
    """:meth:`lmcost.cost.phases.PhaseCost.classes` of the training records ``rec`` with each op's time
    ``kernel_s`` (seconds over its layers, :attr:`KernelFeatures.kernel_s`) instead of the plain model's."""
    from lmcost.cost.phases import PhaseCost

    counts = np.array(rec.cols.count, dtype=float)
    per_run = np.divide(kernel_s, counts, out=np.zeros(len(counts)), where=counts > 0)
    return PhaseCost(rec, gpu, precision, "train", model, times={f"{model}_s": per_run}).classes()


def feature_memory(cfg, layout, *, precision: str, optimizer: str, zero: int, redundant: int = 0,
                   frozen: bool = False) -> dict:
    """Bytes per GPU the features add, busiest stage: ``fp8_weight_copy_bytes`` (an fp8 recipe's weight
    copies and transposes, sharded over dp under ZeRO-3) and ``redundant_experts_bytes`` (``redundant``
    replicas per EP group, with their fp8 copies under an fp8 recipe). ``layout``: the layout whose dp is the
    gradient group (dp x cp), cp 1, as :func:`lmcost.cost.optimizers.model_states` is given it.
    Returns: {key: bytes}, 0 where a feature is off."""
    from lmcost.cost.optimizers import param_tensors

    recipe = fp8_recipe(precision)
    if recipe is None and not redundant:
        return dict(fp8_weight_copy_bytes=0, redundant_experts_bytes=0)
    stages = param_tensors(cfg, layout)
    fp8 = max(fp8_weight_copy_bytes(st, recipe, layout.dp if zero >= 3 else 1) for st in stages) if recipe else 0
    expert_dp = layout.dp // layout.ep if layout.ep_mode == "dp" else layout.dp
    extra = redundant_expert_bytes(stages, redundant, layout.ep, optimizer_name=optimizer,
                                   precision=states_precision(precision), zero=zero, expert_dp=expert_dp,
                                   frozen=frozen, copy_bytes=2 * (1 + recipe.weight_scale) if recipe else 0.0)
    return dict(fp8_weight_copy_bytes=fp8, redundant_experts_bytes=extra)

