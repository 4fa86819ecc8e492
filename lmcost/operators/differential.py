"""Differential attention (Ye et al. 2024, "Differential Transformer", section 2.1, eq. 1-3; transformers'
DiffLlamaAttention): two softmax maps over the same q and k, the second subtracted with a learned weight.

transformers computes it as two standard attention calls sharing q and K, one over each half of the KV heads'
values (each half repeated back to h_kv heads): o_1, o_2 [b,s,h,d_h]. Concatenated to [b,s,h,2*d_h] and split
along the heads, head pair i gives (o[i] - lambda * o[h/2 + i]) [2*d_h], normalised by a weightless RMSNorm over
2*d_h and scaled by (1 - lambda_init); lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) +
lambda_init, four learned vectors [d_h] per layer (``attention.differential``).
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpCost, elementwise

#: FLOPs per output element of the combination: o_1 - lambda * o_2 (2), the weightless RMSNorm over 2*d_h (3, as
#: Llama 4's L2 norm), the scale by (1 - lambda_init) (1). lambda itself is per layer, not per element.
DIFF_FLOPS = 2 + FLOPS_PER_ELEMENT["l2norm"] + 1
#: Learned vectors [d_h] per layer: lambda_q1, lambda_k1, lambda_q2, lambda_k2.
LAMBDA_VECTORS = 4


def two_calls(core: list[OpCost]) -> list[OpCost]:
    """The attention kernel's ops (:func:`lmcost.operators.attention.attention_core`, built with the V bytes of
    one half of the value heads) run twice, once per half: FLOPs, bytes and kernels doubled. Each call computes
    the full q kᵀ scores and their softmax again, as DiffLlamaAttention's two calls do."""
    return [replace(op, flops=2 * op.flops, act_read_bytes=2 * op.act_read_bytes, act_write_bytes=2 * op.act_write_bytes,
                    kv_read_bytes=2 * op.kv_read_bytes, kernels=2 * op.kernels) for op in core]


def combine(x, n, h, d_h) -> OpCost:
    """``attn.diff``: (o_1 - lambda * o_2), RMSNorm over 2*d_h, times (1 - lambda_init), over n*h*d_h output
    elements, reading both calls' outputs; owns the 4*d_h lambda parameters (read once)."""
    op = elementwise("attn.diff", n * h * d_h, 2, DIFF_FLOPS, x.B_a,
                     shapes="(o1 - lambda * o2) [b,s,h/2,2*d_h] -> rmsnorm * (1 - lambda_init) -> [b,s,h*d_h]")
    return replace(op, params=LAMBDA_VECTORS * d_h, weight_bytes=LAMBDA_VECTORS * d_h * x.B_w)
