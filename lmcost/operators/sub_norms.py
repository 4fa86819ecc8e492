"""Sub-layer norms (BitNet b1.58, Ma et al. 2024 and Wang et al. 2023 "BitNet", section 2: SubLN; transformers'
BitNetAttention.attn_sub_norm and BitNetMLP.ffn_sub_norm): a norm of the attention output [b,s,h*d_h] before
o_proj, and of the gated product [b,s,d_ff] before the down projection (``sub_norms: true``)."""

from __future__ import annotations

from lmcost.operators.ops import OpCost, norm


def sub_norm(cfg, x, n_tok, width, prefix: str) -> list[OpCost]:
    """``{prefix}sub_norm``: the model's norm (``cfg.norm``, with its bias) over ``width`` elements of each of
    ``n_tok`` tokens, when ``cfg.sub_norms``; else nothing. Shapes: [n_tok, width] -> [n_tok, width]; weight
    [width] (:func:`lmcost.operators.ops.norm`'s FLOPs and bytes)."""
    if not cfg.sub_norms:
        return []
    return [norm(f"{prefix}sub_norm", cfg.norm, cfg.norm_bias, n_tok, width, x.B_w, x.B_a,
                 shapes=f"[b,s,{width}] before the next projection")]
