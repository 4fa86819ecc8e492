"""Parameter counts, read off the operators that own the weights (no second, hand-kept formula): the
records of the compiled decode graph (:func:`lmcost.cost.compile.phase_graph`), built once per config."""

from __future__ import annotations

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.operators.forward import total
from lmcost.cost.compile import phase_graph


_CACHE: dict = {}


def param_counts(cfg: ArchConfig, precision: Precision = Precision()) -> dict:
    """Parameter counts (elements): total, embedding (+learned positions), lm_head (0 when tied),
    per_block (one layer of each group of identical layers), active_per_token (routed experts: k of E).

    Counted once per config (a config is immutable); each call returns a fresh dict.
    """
    hit = _CACHE.get(id(cfg))
    if hit is None or hit[0] is not cfg:
        if len(_CACHE) > 64:
            _CACHE.clear()
        hit = _CACHE[id(cfg)] = (cfg, _count(cfg, precision))
    out = dict(hit[1])
    out["per_block"] = dict(out["per_block"])
    return out


def _count(cfg: ArchConfig, precision: Precision) -> dict:
    # The decode graph's records (the same compiled graph estimate evaluates): params are static fields.

    ops = phase_graph(cfg, precision, "decode").templates
    per_block = {}
    for op in ops:
        if op.group:
            per_block[op.group] = per_block.get(op.group, 0) + op.params
    return dict(
        total=int(total(ops, "params")),
        embedding=int(sum(op.params for op in ops if op.role in ("embed", "pos_embed"))),
        lm_head=int(sum(op.params for op in ops if op.role == "lm_head")),
        per_block={k: int(v) for k, v in per_block.items()},
        vision=cfg.vision_params,
        active_per_token=int(sum((op.params if op.active_params is None else op.active_params) * op.count
                                 for op in ops)),
    )
