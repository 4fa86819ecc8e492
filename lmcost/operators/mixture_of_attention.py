"""Mixture of attention heads (MoA; Zhang et al. 2022, "Mixture of Attention Heads", section 3; JetMoE, Shen et al.
2024, section 2.2; transformers ``JetMoeMoA`` and ``JetMoeAttention``).

A router [d, E] scores E attention experts per token and picks its top k = h / h_kv. Expert e owns a query
projection W_q^e [d, h_kv*d_h] and an output projection W_o^e [h_kv*d_h, d]; K and V are one projection
[d, 2*h_kv*d_h] shared by every expert. A token's k experts give it h = k*h_kv query heads, each group of h_kv
attending to the shared K/V (so the kernel is GQA with h query heads and h_kv KV heads, and the cache keeps
h_kv heads); each expert's output projection maps its h_kv heads back to d, weighted by its routing weight and
summed, plus one bias [d].

Shapes: router x [b,s,d] @ W_r [d,E] -> [b,s,E]; q pairs [k*b*s, d] @ W_q^e -> [k*b*s, h_kv*d_h] = q [b,s,h*d_h];
o [b,s,h*d_h] = [k*b*s, h_kv*d_h] pairs @ W_o^e -> [k*b*s, d] -> weighted sum [b,s,d] (+ bias [d]).
FLOPs: 2*b*s*d*E (router), 2*k*b*s*d*h_kv*d_h = 2*b*s*d*h*d_h per projection (as a dense q_proj or o_proj of h
heads); weights read: the experts the batch touches (:func:`lmcost.operators.ffn.expected_experts`), as for an
MoE FFN; params: E times each expert's matrix.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ffn import expected_experts, router_topk
from lmcost.operators.ops import OpClass, OpCost, elementwise, linear


def _experts(op: OpCost, E, k, touched) -> OpCost:
    """``op`` (one expert's matmul over all k*b*s pairs) as the E experts of which the batch touches ``touched``: weights
    read per touched expert, params E times, active params k times, one GEMM per expert hit (as an eager runtime
    runs them: transformers' JetMoeParallelExperts)."""
    m_, n_, k_ = op.mnk
    return replace(op, weight_bytes=op.weight_bytes * touched, params=op.params * E, active_params=op.params * k,
                   mnk=(m_ / touched, n_, k_), kernels=touched)


def moa_query_ops(cfg, x, n) -> list[OpCost]:
    """The router and the query experts of a MoA layer, from its normed input [b,s,d] to q [b,s,h*d_h]."""
    E, k = cfg.attention.moa_experts, x.h // x.h_kv
    touched = expected_experts(E, k, n)
    return [linear("attn.router", n, x.d, E, x.B_w, x.B_a, op_class=OpClass.MOE_ROUTING,
                   shapes="x [b,s,d] @ W_router [d,E] -> logits [b,s,E]"),
            router_topk("attn.topk", n, E, k, x.B_a),
            _experts(linear("attn.q_proj", k * n, x.d, x.h_kv * x.d_h, x.B_w, x.B_a,
                            shapes="x [k*b*s,d] @ W_q^e [d,h_kv*d_h] -> q [b,s,h*d_h]"), E, k, touched)]


def moa_output_ops(cfg, x, n) -> list[OpCost]:
    """The output experts of a MoA layer, from the attention output [b,s,h*d_v] to [b,s,d]: each pair's matmul,
    then the weighted sum of the k experts' outputs plus the bias [d] (``attn.combine``, 2k FLOPs per output
    element, reading the k outputs; the bias is d params)."""
    E, k = cfg.attention.moa_experts, x.h // x.h_kv
    touched = expected_experts(E, k, n)
    o = _experts(linear("attn.o_proj", k * n, x.h_kv * x.d_h, x.d, x.B_w, x.B_a,
                        shapes="o [k*b*s,h_kv*d_h] @ W_o^e [h_kv*d_h,d] -> [k*b*s,d]"), E, k, touched)
    combine = elementwise("attn.combine", n * x.d, k, 2 * k, x.B_a,
                          shapes="sum_k weight_k * o_k [b,s,d] + bias [d]", kind="combine")
    bias = x.d if cfg.attention.out_bias else 0
    return [o, replace(combine, params=bias, weight_bytes=bias * x.B_w)]
