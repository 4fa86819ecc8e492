"""Learned residual scales (Doge; transformers ``DogeDecoderLayer.input_residual``/``post_attention_residual``):
each sublayer's skip is weighted per channel, x' = w * x + f(norm(x)), w [d] learned, one per residual add.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ops import OpCost


def scaled_residual(cfg, x, op: OpCost) -> OpCost:
    """A residual add [b,s,d] (``op``) with ``residual_scale``: w [d] params read once, one multiply more per
    element (w * x + f); ``op`` itself without it."""
    if not cfg.residual_scale:
        return op
    n = x.b * x.s
    return replace(op, flops=op.flops + n * x.d, params=x.d, weight_bytes=x.d * x.B_w,
                   shapes="w [d] * x + f(x) [b,s,d]")
