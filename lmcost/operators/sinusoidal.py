"""Sinusoidal positions (Vaswani et al. 2017, section 3.5): a fixed table of sines and cosines, no parameters,
added to the token embeddings. XGLM (XGLMSinusoidalPositionalEmbedding, fairseq's table, offset by 2) and CTRL
(its ``positional_encoding`` buffer) build it once as a buffer; lmcost's ``positions: sinusoidal``."""

from __future__ import annotations

from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost


def sinusoidal_positions(x, n) -> OpCost:
    """x [b,s,d] + table rows [s,d] of the positions p..p+s-1 (the same rows for every sequence).

    Returns: one add per element (n*d FLOPs, n = b*s tokens); reads x and the s*d table rows (a buffer in the
    activation dtype, not a weight: 0 params, as transformers registers it), writes [b,s,d]."""
    return OpCost("pos_embed", OpClass.EMBEDDING, flops=FLOPS_PER_ELEMENT["add"] * n * x.d,
                  act_read_bytes=(n + x.s) * x.d * x.B_a, act_write_bytes=n * x.d * x.B_a,
                  shapes="x [b,s,d] + sin/cos table rows [s,d] (a buffer)", kind="add")
