"""A training step's additive parts and its hardware FLOPs (for :func:`lmcost.apps.train.train_step`).

- **additive parts** (:func:`step_parts`): the step is the sum of what runs one after another on a GPU:
  the pipeline (every stage-microbatch's forward, backward and recompute, with the model-parallel
  collectives, kernel launches, clock, overlap schemes and their SM contention, fp8 quantize kernels and
  the bubble: all of these are inside it), then the exposed data-parallel communication, the exposed
  parameter gathers, the optimizer step, the SM contention of the DP collectives hidden under compute, the
  framework's per-step cost and the fp8 weight casts. ``step_s`` is their sum, so that the parts add up
  exactly; the other parts (``parts_s``) are details inside the pipeline or the DP schedule.
- **overlap per microbatch** (:func:`overlap_hidden_s`): a scheme hides, in each stage-microbatch, at
  most that microbatch's collectives and at most the compute they run under (:func:`lmcost.cost.train_system.hidden_by`),
  so over a step at most the communication the step's microbatches run: m / pp paths' worth. The fill and
  drain (the bubble) keep their collectives: the other direction's microbatch that would hide them is not there.
- **hardware FLOPs** (:func:`hardware_flops`): the FLOPs the mean rank runs (under ``--ep-imbalance`` the
  busiest expert-parallel rank runs ``imbalance`` x the mean's expert pairs, which sets the time, but the
  work is the same: the mean counts it once), split into the fp8 GEMMs' and the rest, so that HFU takes
  each FLOP at its own dtype's peak (:func:`hfu`).
"""

from __future__ import annotations

import numpy as np

from lmcost.operators.ops import OpClass, OpCost

#: Op-role prefix (forward; ``bwd.`` before it for the backward) of the routed experts, whose pairs scale with
#: the expert-parallel imbalance (:func:`lmcost.operators.ffn.moe_ffn_ops`).
EXPERT_ROLE = "moe.expert."


def step_parts(*, pipeline_s: float, dp_comm_exposed_s: float, param_gather_exposed_s: float, optimizer_s: float,
               dp_hidden_s: float, sm_contention: float, framework_step_s: float,
               fp8_weight_cast_s: float) -> tuple[dict, float]:
    """The step's additive parts (seconds, per GPU; the module docstring) and the step, their sum in order.

    ``dp_hidden_s``: the DP collectives run under compute (s), slowing it by ``sm_contention`` (f, the SMs
    they hold: :mod:`lmcost.cost.train_system`). Returns: (dict pipeline_s, dp_comm_exposed_s,
    param_gather_exposed_s, optimizer_s, dp_sm_contention_s, framework_step_s, fp8_weight_cast_s; step_s).
    Raises: nothing."""
    parts = dict(pipeline_s=pipeline_s, dp_comm_exposed_s=dp_comm_exposed_s,
                 param_gather_exposed_s=param_gather_exposed_s, optimizer_s=optimizer_s,
                 dp_sm_contention_s=dp_hidden_s * sm_contention, framework_step_s=framework_step_s,
                 fp8_weight_cast_s=fp8_weight_cast_s)
    return parts, sum(parts.values())


def overlap_hidden_s(hidden_path_s: float, microbatches: int, pp: int) -> float:
    """Seconds a step's overlap schemes hide on one GPU: ``hidden_path_s`` (one microbatch's path through
    all stages, already capped at its collectives and at the compute they run under) x m microbatches / pp
    stages; the bubble's stage-microbatches hide nothing (the module docstring). Raises: nothing."""
    return hidden_path_s * microbatches / pp


def hardware_flops(ops, flops, again, recompute_flops: float, imbalance: float, fp8_mask=None) -> tuple[float, float]:
    """One microbatch path's hardware FLOPs on the mean rank, with its recompute: (all, the fp8 GEMMs').

    ``flops``: each op's FLOPs over its layers (busiest rank: expert ops carry ``imbalance``); ``again``: the
    indices of the forward ops recomputed, whose FLOPs total ``recompute_flops`` (fewer than theirs where
    only some layers recompute: scaled alike); ``fp8_mask``: bools over ops, the GEMMs an fp8 recipe runs
    in fp8 (None: none). Expert ops (:data:`EXPERT_ROLE`) count 1 / ``imbalance`` of theirs: the mean rank's.
    Raises: nothing."""
    raw = np.asarray(flops, dtype=float)
    mean = raw * np.array([1.0 / imbalance if op.role.removeprefix("bwd.").startswith(EXPERT_ROLE) else 1.0
                           for op in ops])
    mask = np.zeros(len(raw), dtype=bool) if fp8_mask is None else np.asarray(fp8_mask, dtype=bool)
    idx = np.asarray(again, dtype=int)
    re_raw = float(raw[idx].sum()) if len(idx) else 0.0
    scale = recompute_flops / re_raw if re_raw else 0.0
    total = float(mean.sum()) + (float(mean[idx].sum()) * scale if len(idx) else 0.0)
    fp8 = float(mean[mask].sum()) + (float(mean[idx][mask[idx]].sum()) * scale if len(idx) else 0.0)
    return total, fp8


def hfu(hardware_flops_per_gpu: float, fp8_flops_per_gpu: float, step_s: float, peak: float,
        fp8_peak: float | None) -> float:
    """Hardware FLOPs utilisation: the seconds the step's FLOPs need at each one's own dense peak (the fp8
    GEMMs' ``fp8_flops_per_gpu`` at ``fp8_peak``, the rest at ``peak``, FLOP/s) over ``step_s``; at most 1
    whenever the step is no faster than its roofline. Raises: nothing."""
    fp8 = fp8_flops_per_gpu / fp8_peak if fp8_peak and fp8_flops_per_gpu else 0.0
    return ((hardware_flops_per_gpu - fp8_flops_per_gpu) / peak + fp8) / step_s


def optimizer_op(states) -> OpCost:
    """The optimizer step on this GPU's shard (``states``: :class:`lmcost.cost.optimizers.ModelStates`),
    memory-bound: every state byte read and written, the
    gradients read, the working weights written; 12 vector FLOPs per updated parameter (AdamW's moment
    updates, bias corrections, the division and the decoupled weight decay; Loshchilov & Hutter 2019)."""
    upd = states.updated_params
    state = states.master_bytes + states.optimizer_bytes
    return OpCost("optimizer.step", OpClass.ELEMENTWISE, flops=12 * upd,
                  act_read_bytes=state + states.grads_bytes, act_write_bytes=state + states.weights_shard_bytes,
                  shapes="states, grads -> states, weights (this GPU's shard)", kind="add")
