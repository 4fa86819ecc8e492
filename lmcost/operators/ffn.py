"""Feed-forward operators of one layer: plain and gated FFNs, and mixture-of-experts.

Plain: y = act(x W_up) W_down, two matrices [d, d_ff] and [d_ff, d] (Vaswani et al. 2017, eq. 2).
Gated: y = (act(x W_gate) * x W_up) W_down, three matrices (Shazeer 2020, "GLU Variants Improve
Transformer", eqs. 5-6): GLU (sigmoid), ReGLU (ReLU), GeGLU (GELU), SwiGLU (SiLU).
MoE: a router scores E experts per token, each token runs through its top-k experts, optionally
also through shared experts (Fedus et al. 2021; Jiang et al. 2024, Mixtral; DeepSeek-V2 section 2.2).
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear
from lmcost.operators.sub_norms import sub_norm
from lmcost.operators.xielu import xielu
from lmcost.operators.zero_experts import ffn_experts_per_token, routed_experts

#: The nonlinearity each FFN kind applies (gated kinds apply it to the gate).
#: relu2 is the squared ReLU, relu(x)^2 (So et al. 2021, "Primer", section 3; Nemotron-4, Arcee).
NONLINEARITY = {"relu": "relu", "relu2": "relu2", "gelu": "gelu", "silu": "silu",
                "glu": "sigmoid", "reglu": "relu", "geglu": "gelu", "swiglu": "silu", "xielu": "xielu",
                "relu2_glu": "relu2"}


def dense_ffn_ops(cfg, x, n_tok, d_ff, prefix: str = "ffn.", bias: bool | None = None) -> list[OpCost]:
    """A dense FFN on ``n_tok`` tokens of width d with inner width ``d_ff``.

    Shapes: x [n_tok,d] @ W_up [d,d_ff] (and W_gate) -> [n_tok,d_ff]; act; @ W_down [d_ff,d] -> [n_tok,d].
    Returns: FLOPs 2*n_tok*d*d_ff per matrix (3 matrices gated, 2 plain) plus the activation
    (FLOPS_PER_ELEMENT of the nonlinearity, +1 for the gating multiply, per inner element).
    """
    bias = cfg.ffn.bias if bias is None else bias
    act = NONLINEARITY[cfg.ffn.activation]
    ops = []
    if cfg.gated:
        ops.append(linear(f"{prefix}gate", n_tok, x.d, d_ff, x.B_w, x.B_a, bias, shapes="x [b,s,d] @ W_gate [d,d_ff]"))
    ops.append(linear(f"{prefix}up", n_tok, x.d, d_ff, x.B_w, x.B_a, bias, shapes="x [b,s,d] @ W_up [d,d_ff]"))
    if cfg.ffn.swiglu_limit is not None:
        # gpt-oss (transformers GptOssExperts._apply_gate): (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, l)
        ops.append(elementwise(f"{prefix}act", n_tok * d_ff, 2, FLOPS_PER_ELEMENT["swiglu_clamped"], x.B_a,
                               shapes="(clamp(up) + 1) * min(gate, l) * sigmoid(alpha * min(gate, l)) [b,s,d_ff]",
                               kind="silu_mul"))
    elif act == "xielu":  # Apertus: two learned scalars per layer (lmcost.operators.xielu)
        ops.append(xielu(f"{prefix}act", n_tok * d_ff, x.B_w, x.B_a))
    else:
        ops.append(activation(f"{prefix}act", n_tok * d_ff, act, cfg.gated, x.B_a,
                              shapes=f"{act}(gate) * up [b,s,d_ff]" if cfg.gated else f"{act}(up) [b,s,d_ff]", row_width=d_ff))
    ops += sub_norm(cfg, x, n_tok, d_ff, prefix)  # BitNet's ffn_sub_norm
    ops.append(linear(f"{prefix}down", n_tok, d_ff, x.d, x.B_w, x.B_a, bias, shapes="h [b,s,d_ff] @ W_down [d_ff,d]"))
    return ops


def activation(name: str, n_elements, act: str, gated: bool, B_a, shapes: str = "", row_width=0) -> OpCost:
    """The FFN's nonlinearity over ``n_elements`` outputs, one kernel.

    Gated (kind ``<act>_mul``, e.g. vLLM's silu_and_mul): act(gate) * up, reading gate and up, writing
    the product: FLOPS_PER_ELEMENT[act] + 1 FLOPs per element. Plain (kind ``act``): act(x), one input.
    :func:`lmcost.operators.fusion.unfused_gated` gives the two-kernel form. ``row_width``: outputs per token
    (d_ff; :class:`lmcost.operators.ops.OpCost`).
    """
    if gated:
        return elementwise(name, n_elements, 2, FLOPS_PER_ELEMENT[act] + FLOPS_PER_ELEMENT["mul"], B_a,
                           shapes=shapes, kind=f"{act}_mul", row_width=row_width)
    return elementwise(name, n_elements, 1, FLOPS_PER_ELEMENT[act], B_a, shapes=shapes, kind=act, row_width=row_width)


def router_topk(name: str, n_tok, E, k, B_a) -> OpCost:
    """Routing weights over E experts per token and their top k: softmax (5 FLOPs per logit) over
    [n_tok, E] read, weights and indices [n_tok, k] written."""
    return OpCost(name, OpClass.MOE_ROUTING, flops=FLOPS_PER_ELEMENT["softmax"] * n_tok * E,
                  act_read_bytes=n_tok * E * B_a, act_write_bytes=2 * n_tok * k * B_a,
                  shapes="softmax/sigmoid over [b,s,E], top-k -> weights, indices [b,s,k]", kind="topk")


def expected_experts(E, k, n_tok):
    """Expected distinct experts that n_tok tokens touch when each picks k of E uniformly:
    E * (1 - (1 - k/E)^n_tok). One expert is missed by one token with probability 1 - k/E."""
    return E * (1 - (1 - k / E) ** n_tok)


def moe_ops(cfg, x) -> list[OpCost]:
    """One MoE layer: router, top-k, routed experts, shared experts, combine.

    The routed experts run k*b*s token-expert pairs in all, so their FLOPs are those of a dense FFN
    of width d_e over k*b*s tokens; their weight reads are those of the experts the batch touches,
    expected_experts(E, k, b*s) of E (decode at batch 1 reads k experts; a big batch reads all E).
    Params count all E experts.

    Under expert parallelism (x.ep > 1, :mod:`lmcost.operators.parallel`) this rank holds E/ep experts; the
    group routes N = ep_tokens*b*s tokens, so the rank runs k*N/ep pairs (times the imbalance of the
    busiest rank) and touches expected_experts(E, k, N)/ep of its experts.
    """
    m, n = cfg.moe, x.b * x.s
    k, E_r = ffn_experts_per_token(cfg, x), routed_experts(cfg, x)  # k and E but with zero-computation experts
    if isinstance(x.ep, int) and x.ep == 1:
        pairs, touched, owned = k * n, expected_experts(x.E, k, n), x.E
    else:
        group = x.ep_tokens * n
        pairs = k * group * x.imbalance / x.ep
        touched, owned = expected_experts(x.E, k, group) / x.ep, x.E // x.ep
    ops = [linear("moe.router", n, x.d, E_r, x.B_w, x.B_a, m.router_bias, op_class=OpClass.MOE_ROUTING,
                  shapes="x [b,s,d] @ W_router [d,E] -> logits [b,s,E]"),
           router_topk("moe.topk", n, E_r, x.k, x.B_a)]
    # expert_bias (gpt-oss): each expert's gate/up/down carry a bias, owned per expert as its matrix is
    for op in dense_ffn_ops(cfg, x, pairs, x.d_e, prefix="moe.expert.", bias=m.expert_bias):
        if op.op_class is OpClass.GEMM:
            # An eager runtime (transformers, the reference decoder) runs one GEMM per expert hit,
            # each over its share of the k*b*s pairs; fusion "moe_grouped" makes it one kernel.
            m_, n_, k_ = op.mnk
            op = replace(op, weight_bytes=op.weight_bytes * touched, params=op.params * owned,
                         active_params=op.params * k, mnk=(m_ / touched, n_, k_), kernels=touched)
        ops.append(op)
    if m.d_sh:
        ops += dense_ffn_ops(cfg, x, n, x.d_sh, prefix="moe.shared.", bias=False)
        if m.shared_expert_gate:
            ops.append(linear("moe.shared.gate_proj", n, x.d, 1, x.B_w, x.B_a, op_class=OpClass.MOE_ROUTING,
                              shapes="x [b,s,d] @ W [d,1] -> sigmoid gate of the shared expert"))
    inputs = x.k + (1 if m.d_sh else 0)
    ops.append(elementwise("moe.combine", n * x.d, inputs, 2 * inputs - 1, x.B_a,
                           shapes="sum_k weight_k * expert_k(x) [b,s,d]", kind="combine"))
    return ops
