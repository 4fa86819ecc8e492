"""Assembling the operators of a phase: the forward pass (:mod:`lmcost.operators.forward`) or a training step
(:mod:`lmcost.operators.training`) at a phase's dims, sharded over a layout, its weights in the recipe's formats,
fused as the settings say, with the communication a layout issues."""

from __future__ import annotations

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.operators.forward import Dims, forward_ops
from lmcost.operators.fusion import apply_fusion
from lmcost.operators.ops import OpCost
from lmcost.operators.parallel import communication, shard
from lmcost.operators.quant import rescale
from lmcost.operators.training import train_ops
from lmcost.operators.workload import Settings
from lmcost.model.config import ArchConfig
from lmcost.model.quant import check_train, effective

PHASES = ("prefill", "decode")
#: Phases phase_ops knows: a training step is forward + backward over s = t tokens.
ALL_PHASES = PHASES + ("train",)


def phase_dims(cfg: ArchConfig, precision: Precision, phase: str, b, tokens) -> Dims:
    """Dims of a phase: prefill of ``tokens`` (s = t = tokens) or a decode step at context ``tokens``."""
    if phase == "prefill":
        return Dims.of(cfg, precision, b, tokens, tokens)
    if phase == "decode":
        return Dims.of(cfg, precision, b, 1, tokens)
    if phase == "train":
        return Dims.of(cfg, precision, b, tokens, tokens)
    raise LmcostError("phase", f"unknown phase {phase!r}", f"use one of {', '.join(ALL_PHASES)}")


def build_ops(cfg: ArchConfig, x: Dims, phase: str, settings: Settings = Settings()) -> list[OpCost]:
    """The operators of one phase at dims ``x`` (numbers, arrays, sympy Symbols or traced dims): the
    forward pass with ``settings``' fusions, or a training step (:mod:`lmcost.operators.training`). Under a
    quantization recipe (``settings.quant``, else ``cfg.quant``) each weight read is in its tensor's format.
    Raises: LmcostError for ``settings.quant`` in a training step."""
    if phase == "train":
        check_train(settings.quant)
        layout = settings.layout
        return train_ops(cfg, shard(cfg, x, layout, "train"), settings.kernel, settings.mla_for("prefill"), layout)
    layout = settings.layout
    x = shard(cfg, x, layout, phase)
    ops = forward_ops(cfg, x, settings.kernel, settings.mla_for(phase), settings.logits)
    quant = effective(cfg, settings.quant)
    if quant:  # weights read in the recipe's format of each tensor (lmcost.operators.quant), before any fusion sums them
        ops = rescale(cfg, quant, ops, x.B_w)
    return communication(cfg, apply_fusion(ops, settings.fusion, settings.kernel), x, layout, settings.logits, phase)
