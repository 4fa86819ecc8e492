"""Redundant experts (EPLB: DeepSeek-V3 technical report, section 3.4; DeepSeek's ``eplb``): N extra
replicas of routed experts per expert-parallel group, spread over its ep ranks, so that hot experts'
tokens split between copies.

Memory: the busiest rank holds ceil(N / ep) replicas in each MoE layer of its stage, each an expert's
weights, and (trained) its gradients, master copy and optimizer states, sharded by ZeRO as the rank's
own experts are (over the dp / ep expert-data-parallel ranks).

Load balance: the tokens of the busiest rank after EPLB depend on the routing's skew, which lmcost does
not model; the imbalance a run keeps is an input (``--ep-imbalance``, :class:`lmcost.operators.parallel.Layout`:
the busiest rank's tokens over the mean, 1 = balanced, as NVIDIA's force-balanced benchmark runs are).
Neither the replicas' gradient all-reduce nor EPLB's re-placement is charged.
"""

from __future__ import annotations

import math

from lmcost.basics.errors import LmcostError
from lmcost.cost.optimizers import ParamTensor, optimizer, train_precision


def check_redundant(cfg, layout, n: int) -> None:
    """Raises: LmcostError (redundant_experts) for a negative count, or replicas on a model without routed
    experts or without expert parallelism (ep = 1: nothing to balance between ranks)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise LmcostError("redundant_experts", f"must be a whole number 0 or more, got {n!r}", "give 0 or more")
    if n and cfg.moe is None:
        raise LmcostError("redundant_experts", f"{cfg.name} has no routed experts", "drop `redundant_experts`")
    if n and layout.ep == 1:
        raise LmcostError("redundant_experts", "replicas balance experts between expert-parallel ranks, and ep is 1",
                          "add `ep`, or drop `redundant_experts`")


def redundant_expert_bytes(stages: list, n: int, ep: int, *, optimizer_name: str = "adamw",
                           precision: str = "bf16-mixed", zero: int = 0, expert_dp: int = 1,
                           frozen: bool = False, copy_bytes: float = 0.0) -> int:
    """Bytes the busiest rank holds for its ceil(n / ep) replicas (module docstring).

    ``stages``: :func:`lmcost.cost.optimizers.param_tensors` of the layout (each rank's E/ep experts per
    stage: tensors ``moe.expert.*`` [E/ep, rows, cols] over ``count`` layers); ``precision``: a model-states
    recipe; ``zero``: the ZeRO stage, sharding over ``expert_dp`` ranks; ``frozen``: weights only (LoRA's
    frozen base); ``copy_bytes``: bytes per replica weight element of a copy the recipe keeps beside the
    weights (an fp8 recipe's fp8 copy and transpose, :func:`lmcost.cost.fp8_training.fp8_weight_copy_bytes`), sharded
    as the weights are. Per replica element: weights B_w (/expert_dp under ZeRO-3), gradients B_g (ZeRO-2), master
    copy B_m and optimizer states (ZeRO-1) as the optimizer keeps them for a tensor of that shape.
    Returns: bytes (int), the largest over stages; 0 for n = 0."""
    if not n:
        return 0
    r = math.ceil(n / ep)
    opt, prec = optimizer(optimizer_name), train_precision(precision)

    def sh(amount, stage):
        return math.ceil(amount / expert_dp) if zero >= stage else amount

    best = 0
    for tensors in stages:
        total = 0
        for t in tensors:
            if not t.role.startswith("moe.expert."):
                continue
            shape = (r, *t.shape[1:])
            elems = math.prod(shape) * t.count
            total += sh(elems * prec.B_w, 3)
            if t.role.endswith(".weight"):
                total += math.ceil(sh(elems, 3) * copy_bytes)
            if frozen:
                continue
            states, _ = opt.per_tensor(ParamTensor(t.role, shape, t.count), shape, prec.B_s)
            total += sh(elems * prec.B_g, 2) + sh(elems * prec.B_m, 1) + sh(states * t.count, 1)
        best = max(best, total)
    return int(best)
