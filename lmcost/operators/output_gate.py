"""Laguna's softplus output gate (transformers LagunaAttention, ``gating``): a projection of the layer's input
to one gate per head (``head``) or per output element (``element``), and the attention output multiplied by
softplus of it before o_proj.

Shapes: x [b,s,d] @ W_g [d,g] -> gate [b,s,g], g = h (head) or h*d_h (element);
o [b,s,h,d_h] * softplus(gate) [b,s,h,1 or d_h] -> [b,s,h*d_h].
"""

from __future__ import annotations

from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, linear

#: softplus(x) = log(1 + exp(x)): exp, add, log, counted as one FLOP each (as sigmoid's 4 in ops.FLOPS_PER_ELEMENT).
SOFTPLUS_FLOPS = 3


def softplus_gate_ops(cfg, x, n) -> list[OpCost]:
    """The gate of one layer over n = b*s tokens, or [] without ``attention.softplus_gate``.

    Returns: ``attn.g_proj``, a GEMM of 2*n*d*g FLOPs and d*g parameters (no bias, as LagunaAttention's
    g_proj); ``attn.gate``, one elementwise kernel: softplus of the n*g gates (SOFTPLUS_FLOPS each) and one
    multiply per output element (n*h*d_h), reading o and the gates, writing the gated output.
    """
    mode = cfg.attention.softplus_gate
    if mode is None:
        return []
    g = x.h if mode == "head" else x.h * x.d_h
    out = n * x.h * x.d_h
    return [
        linear("attn.g_proj", n, x.d, g, x.B_w, x.B_a, shapes=f"x [b,s,d] @ W_g [d,{'h' if mode == 'head' else 'h*d_h'}]"),
        OpCost("attn.gate", OpClass.ELEMENTWISE, flops=SOFTPLUS_FLOPS * n * g + FLOPS_PER_ELEMENT["mul"] * out,
               act_read_bytes=(out + n * g) * x.B_a, act_write_bytes=out * x.B_a,
               shapes="o [b,s,h,d_h] * softplus(gate) " + ("[b,s,h,1]" if mode == "head" else "[b,s,h,d_h]"),
               kind="softplus_mul"),
    ]
