"""Operators of the linear-attention mixers of hybrid models: MiniMax's lightning attention, per layer, for a
pass of s new tokens per sequence at context t (conventions as :mod:`lmcost.operators.recurrent`, whose
``recurrent_ops``, ``conv_channels`` and ``state_elements`` hand these kinds here: n = b*s tokens; 2 FLOPs per
multiply-accumulate; the projections are GEMMs; the products of the rule itself are one ``matmul`` op).

State. A layer keeps, per sequence, a state that does not grow with the context (a KV-cache read when the
pass continues a sequence, t > s, and a write at its end):
- lightning attention: KᵀV summed with decay, [h, d_h, d_h], in the model dtype (B_kv): transformers'
  MiniMaxLightningAttention builds it in the value states' dtype and MiniMaxCache keeps it as it is.

Sources: MiniMax et al. 2025, "MiniMax-01: Scaling Foundation Models with Lightning Attention" (arXiv
2501.08313), section 2.2.1 and Algorithm 1 (lightning attention: intra-block masked QKᵀV, inter-block
through the KᵀV state); transformers' MiniMaxLightningAttention (the torch path the oracle counts).
"""

from __future__ import annotations

from lmcost.basics.notation import minimum
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear, norm

#: The constant-state mixers this module costs (entries of ``recurrent.layer_pattern``).
LINEAR_KINDS = ("lightning",)


def _continues(x):
    """1 when the pass continues a sequence (t > s: it starts from the cached state), 0 for a prefill from
    empty (t = s); ints, numpy arrays or sympy alike."""
    return minimum(1, x.t - x.s)


def state_elements(cfg, kind: str) -> tuple[int, int, int]:
    """Per sequence and layer: (conv state elements, conv width, recurrent state elements), as
    :func:`lmcost.operators.recurrent.state_elements`. Lightning: (0, 0, h*d_h*d_h).
    Raises: ValueError for a kind not in LINEAR_KINDS."""
    if kind == "lightning":
        m = cfg.recurrent.lightning
        return 0, 0, m.n_heads * m.head_dim * m.head_dim
    raise ValueError(f"not a linear-attention mixer: {kind!r}")


def state_bytes(cfg, kind: str, B_kv):
    """Bytes of state one sequence keeps in one ``kind`` layer. Lightning: h*d_h*d_h * B_kv (the model dtype).
    Raises: ValueError for a kind not in LINEAR_KINDS."""
    conv, _, rec = state_elements(cfg, kind)
    return (conv + rec) * B_kv


def lightning_rule_macs(x, h, dh, B):
    """MACs of lightning attention's products over b sequences of s new tokens, h heads of width d_h, blocks of B.

    - a prefill from empty (t = s), transformers' blocked loop: per head and block of c positions (the
      last one c = s mod B, not padded) QKᵀ c²*d_h, (QKᵀ ⊙ decay)·V c²*d_h, (Q ⊙ decay)·S c*d_h², the
      block's (K ⊙ decay)ᵀ·V c*d_h²: s // B full blocks and one of s mod B;
    - a pass that continues a sequence (t > s: a decode step, or a later chunk of a prefill), the
      recurrence per token: S = λ S + kᵀv (d_h² MACs, an outer product) and o = q S (d_h²).
    Returns: b*h*[(1 - c)*(q*(2B²d_h + 2B d_h²) + 2r²d_h + 2r d_h²) + c*2*s*d_h²] with q = s // B,
    r = s - q*B and c = 1 when t > s, else 0.
    """
    c = _continues(x)
    q = x.s // B
    r = x.s - q * B
    blocked = q * (2 * B * B * dh + 2 * B * dh * dh) + 2 * r * r * dh + 2 * r * dh * dh
    return x.b * h * ((1 - c) * blocked + c * 2 * x.s * dh * dh)


def lightning_ops(cfg, x) -> list[OpCost]:
    """Lightning attention (MiniMax-01, section 2.2.1; HF MiniMaxLightningAttention torch path).

    h heads of width d_h (D = h*d_h), blocks of B = block_size; per head a fixed decay λ = exp(-slope).
    - ``mixer.qkv_proj`` GEMM d -> 3D, then ``mixer.qkv_act`` SiLU over 3D;
    - ``mixer.lightning`` (matmul): the products of :func:`lightning_rule_macs`; it reads q, k, v and
      writes o [b, s, D];
    - ``mixer.lightning_state`` (vector work): prefill from empty, per head and block of c the decay mask
      on QKᵀ (c²), the query and key decays (2*c*d_h), inter + intra (c*d_h) and the state's decay and
      sum (2*d_h²); a pass that continues, per token and head λ*S + kᵀv (2*d_h²). It reads the state
      [h, d_h, d_h] (B_kv) when t > s and writes it;
    - ``mixer.norm`` RMSNorm over D (weight [D]); ``mixer.output_gate`` GEMM d -> D and ``mixer.gate``
      sigmoid(g) * y (5 FLOPs per element); ``mixer.out_proj`` GEMM D -> d.
    """
    m = cfg.recurrent.lightning
    h, dh, B = m.n_heads, m.head_dim, m.block_size
    D, n, b = h * dh, x.b * x.s, x.b
    c = _continues(x)
    q = x.s // B
    r = x.s - q * B
    blocked = q * (B * B + 3 * B * dh + 2 * dh * dh) + r * r + 3 * r * dh + 2 * dh * dh
    vec = b * h * ((1 - c) * blocked + c * 2 * x.s * dh * dh)
    state = D * dh * x.B_kv
    return [linear("mixer.qkv_proj", n, x.d, 3 * D, x.B_w, x.B_a, shapes="x [b,s,d] @ W [d,3*h*d_h] -> q, k, v"),
            elementwise("mixer.qkv_act", n * 3 * D, 1, FLOPS_PER_ELEMENT["silu"], x.B_a, OpClass.RECURRENT,
                        shapes="silu(q, k, v) [b,s,3*h*d_h]", kind="silu"),
            OpCost("mixer.lightning", OpClass.RECURRENT, flops=2 * lightning_rule_macs(x, h, dh, B),
                   act_read_bytes=3 * n * D * x.B_a, act_write_bytes=n * D * x.B_a, matmul=True,
                   shapes="blocks of B: QKᵀ, (QKᵀ⊙M)V, (Q⊙λ)S, (K⊙λ)ᵀV; a step S = λS + kᵀv, o = qS",
                   kind="lightning"),
            OpCost("mixer.lightning_state", OpClass.RECURRENT, flops=vec,
                   kv_read_bytes=b * state * c, kv_write_bytes=b * state,
                   shapes="decay masks; state [b,h,d_h,d_h] read and written", kind="lightning_state"),
            norm("mixer.norm", "rmsnorm", False, n, D, x.B_w, x.B_a, shapes="rmsnorm o [b,s,h*d_h]"),
            linear("mixer.output_gate", n, x.d, D, x.B_w, x.B_a, shapes="x [b,s,d] @ W_g [d,h*d_h]"),
            elementwise("mixer.gate", n * D, 2, FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["mul"], x.B_a,
                        OpClass.RECURRENT, shapes="sigmoid(g) * o [b,s,h*d_h]", kind="sigmoid_mul"),
            linear("mixer.out_proj", n, D, x.d, x.B_w, x.B_a, shapes="o [b,s,h*d_h] @ W_out [h*d_h,d]")]


def linear_attention_ops(cfg, x, kind: str) -> list[OpCost]:
    """The operators of one linear-attention mixer of kind ``kind`` (LINEAR_KINDS), from its normed input
    [b,s,d] to its output [b,s,d]. Raises: ValueError for another kind."""
    if kind == "lightning":
        return lightning_ops(cfg, x)
    raise ValueError(f"not a linear-attention mixer: {kind!r}")
