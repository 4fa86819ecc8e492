"""Operators of the recurrent (RNN-style) token mixers: Griffin's RG-LRU block (RecurrentGemma) and RWKV-4's time
and channel mixing (transformers' ``rwkv``), per layer, for a pass of s new tokens per sequence at context t. Conventions, state and names as
:mod:`lmcost.operators.recurrent`, whose dispatch (``conv_channels``, ``state_elements``, ``recurrent_ops``)
sends these kinds here.

Sources: De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention for Efficient Language
Models", section 2.4 (the recurrent block, fig. 2) and section 2.4's eq. 1-4 (the RG-LRU); transformers'
RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru (the layout and what its cache holds). Peng et al. 2023,
"RWKV: Reinventing RNNs for the Transformer Era", section 4 (RWKV-4: token shift, eq. 11-17; the WKV
operator, eq. 14, in its numerically stable form, appendix); transformers' RwkvSelfAttention, RwkvFeedForward
and rwkv_linear_attention_cpu (the layout, the state and the per-token arithmetic).
"""

from __future__ import annotations

from lmcost.operators import recurrent as _rec
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear

#: The mixer kinds this module costs (entries of :data:`lmcost.model.mixers.RECURRENT_KINDS`).
KINDS = ("rg_lru", "rwkv4")
#: The FFN kinds this module costs (entries of :data:`lmcost.model.mixers.FFN_KINDS`): RWKV-4's channel mixing.
FFN_KINDS = ("rwkv4_channel",)

#: FLOPs per element of the RG-LRU's vector work (De et al. 2024, eq. 1-4, as RecurrentGemmaRglru computes
#: it): the two gate sigmoids (2 * 4), log a = -8 * r * softplus(Λ) (2: softplus(Λ) is per channel, not per
#: token), a = exp(log a) (1), a² = exp(2 log a) (2), sqrt(1 - a²) (2), (x * i) * sqrt(1 - a²) (2), the
#: recurrence h = a * h + x (2).
RG_LRU_FLOPS = 2 * FLOPS_PER_ELEMENT["sigmoid"] + 2 + 1 + 2 + 2 + 2 + 2


#: FLOPs per element of RWKV-4's WKV step (rwkv_linear_attention_cpu, the stable form of Peng et al. 2023, eq.
#: 14): the output, m = max(μ, k + u) (2), e1 = exp(μ - m) (2), e2 = exp(k + u - m) (3), e1 a + e2 v (3),
#: e1 b + e2 (2), their quotient (1); the state, m' = max(μ + w, k) (2), e1 = exp(μ + w - m') (3),
#: e2 = exp(k - m') (2), a = e1 a + e2 v (3), b = e1 b + e2 (2): 25.
WKV_FLOPS = 25
#: FLOPs per element of a token-shift mix x * μ + x_prev * (1 - μ) ((1 - μ) is per channel): 3.
SHIFT_MIX_FLOPS = 3


def _rwkv_width(cfg) -> int:
    return cfg.recurrent.rwkv4.width or cfg.d_model


def conv_channels(cfg, kind: str) -> int:
    """Channels of the depthwise causal conv of a ``kind`` layer: RG-LRU its width (W_x's output); RWKV-4's
    token shifts (a 2-tap conv, x and the previous x) d_model in each of the time and channel mixing."""
    if kind == "rg_lru":
        return cfg.recurrent.rg_lru.width
    if kind == "rwkv4":
        return 2 * cfg.d_model
    raise ValueError(f"not an rnn mixer: {kind!r}")


def state_elements(cfg, kind: str) -> tuple[int, int, int]:
    """Per sequence and layer: (conv state elements, conv width d_conv, recurrent state elements).

    RG-LRU: (W * (d_conv - 1), d_conv, W): transformers' RecurrentGemmaRecurrentBlock keeps the last
    d_conv - 1 conv inputs [b, W, d_conv - 1] in the activation dtype (``conv1d_state``) and the RG-LRU
    state h [b, W] in float32 (``rg_lru.recurrent_states``).
    RWKV-4: (2d, 2, 3*width): the previous token's x [d] of the time mixing and of the channel mixing, in the
    activation dtype (RwkvModel's state[1] and state[0], [b, d, L]), and the WKV state (numerator,
    denominator, running max) [3, width] in float32 (state[2:5]). The layer's channel mixing (its FFN)
    keeps one of the two shift states, counted here with its mixer's.
    """
    if kind == "rg_lru":
        g = cfg.recurrent.rg_lru
        return g.width * (g.d_conv - 1), g.d_conv, g.width
    if kind == "rwkv4":
        return 2 * cfg.d_model, 2, 3 * _rwkv_width(cfg)
    raise ValueError(f"not an rnn mixer: {kind!r}")


def _block_diagonal(name: str, n, width: int, blocks: int, x, shapes: str) -> OpCost:
    """A block-diagonal projection with bias: ``blocks`` blocks of [width/blocks, width/blocks] (torch.baddbmm
    in RecurrentGemmaRglru): 2*n*width*(width/blocks) FLOPs, weight width*(width/blocks) + bias width.
    Reads x [n, width], writes [n, width]."""
    op = linear(name, n, width // blocks, width, x.B_w, x.B_a, True, shapes=shapes)
    return OpCost(**{**op.__dict__, "act_read_bytes": n * width * x.B_a})


def rg_lru_ops(cfg, x) -> list[OpCost]:
    """Griffin's recurrent block (De et al. 2024, section 2.4, fig. 2; HF RecurrentGemmaRecurrentBlock).

    Width W (lru_width), n_blocks blocks of width W/n_blocks in the gates, conv of K taps, n = b*s tokens.
    - ``mixer.linear_y`` GEMM d -> W (+ bias), then ``mixer.y_act`` GeLU (tanh) over [n, W];
    - ``mixer.linear_x`` GEMM d -> W (+ bias);
    - ``mixer.conv``: depthwise causal conv of K taps (+ bias, no activation) over W channels; its state,
      the last K - 1 inputs [W, K - 1] in the activation dtype (B_kv), read when t > s and written;
    - ``mixer.input_gate``, ``mixer.a_gate``: the RG-LRU's gates i = sigmoid(u W_i + b_i) and
      r = sigmoid(u W_a + b_a), each block-diagonal (baddbmm over n_blocks blocks): matmuls of
      2*n*W*(W/n_blocks) FLOPs, W*(W/n_blocks) + W parameters each;
    - ``mixer.rg_lru`` (vector work, :data:`RG_LRU_FLOPS` per element): a = exp(-8 r softplus(Λ)),
      h_t = a h_{t-1} + sqrt(1 - a²) (i * u_t), sequential over the s positions in both phases (no
      chunked form: transformers loops over t); it owns Λ (W parameters) and reads the state h [W]
      (fp32) when t > s and writes it;
    - ``mixer.gate_out`` h * y; ``mixer.linear_out`` GEMM W -> d (+ bias).
    """
    g = cfg.recurrent.rg_lru
    W, nb, K = g.width, g.n_blocks, g.d_conv
    n, b = x.b * x.s, x.b
    state = W * _rec.STATE_BYTES
    return [linear("mixer.linear_y", n, x.d, W, x.B_w, x.B_a, True, shapes="x [b,s,d] @ W_y [d,W] -> y"),
            elementwise("mixer.y_act", n * W, 1, FLOPS_PER_ELEMENT["gelu"], x.B_a, OpClass.RECURRENT,
                        shapes="gelu_tanh(y) [b,s,W]", kind="gelu"),
            linear("mixer.linear_x", n, x.d, W, x.B_w, x.B_a, True, shapes="x [b,s,d] @ W_x [d,W] -> u"),
            _rec.conv_op(x, W, K, True, None, W * (K - 1) * x.B_kv),
            _block_diagonal("mixer.input_gate", n, W, nb, x, f"u [{nb},b*s,W/{nb}] @ W_i [{nb},W/{nb},W/{nb}] + b_i"),
            _block_diagonal("mixer.a_gate", n, W, nb, x, f"u [{nb},b*s,W/{nb}] @ W_a [{nb},W/{nb},W/{nb}] + b_a"),
            OpCost("mixer.rg_lru", OpClass.RECURRENT, flops=RG_LRU_FLOPS * n * W, params=W, weight_bytes=W * x.B_w,
                   act_read_bytes=3 * n * W * x.B_a, act_write_bytes=n * W * x.B_a,
                   kv_read_bytes=b * state * _rec._starts_from_state(x), kv_write_bytes=b * state,
                   shapes="a = exp(-8 r softplus(Λ)); h = a h + sqrt(1 - a²) (i u); state h [b,W] fp32",
                   kind="rg_lru"),
            elementwise("mixer.gate_out", n * W, 2, FLOPS_PER_ELEMENT["mul"], x.B_a, OpClass.RECURRENT,
                        shapes="h * y [b,s,W]", kind="mul"),
            linear("mixer.linear_out", n, W, x.d, x.B_w, x.B_a, True, shapes="o [b,s,W] @ W_out [W,d]")]


def _shift(name: str, x, n_mix: int, state_bytes_) -> OpCost:
    """RWKV's token shift: ``n_mix`` mixes x * μ + x_prev * (1 - μ) over [n, d] (x_prev the previous token's x:
    the cached one for the first new token when t > s); μ [n_mix, d] parameters; reads x and x_prev, writes
    the mixes; reads the cached x [d] (``state_bytes_`` per sequence) when t > s and writes the last one."""
    n = x.b * x.s
    return OpCost(name, OpClass.RECURRENT, flops=n_mix * SHIFT_MIX_FLOPS * n * x.d, params=n_mix * x.d,
                  weight_bytes=n_mix * x.d * x.B_w, act_read_bytes=2 * n * x.d * x.B_a,
                  act_write_bytes=n_mix * n * x.d * x.B_a, kv_read_bytes=x.b * state_bytes_ * _rec._starts_from_state(x),
                  kv_write_bytes=x.b * state_bytes_, shapes=f"{n_mix} x (x * mu + x_prev * (1 - mu)) [b,s,d]",
                  kind="token_shift")


def rwkv4_time_ops(cfg, x) -> list[OpCost]:
    """RWKV-4's time mixing (Peng et al. 2023, section 4.1, eq. 11-14 and 16; HF RwkvSelfAttention with
    rwkv_linear_attention_cpu), width A (attention_hidden_size), n = b*s tokens.

    - ``mixer.token_shift``: the k, v, r mixes of x and the previous x (:func:`_shift`; 3d parameters); its
      state x_prev [d] (B_kv);
    - ``mixer.key``, ``mixer.value``, ``mixer.receptance``: GEMMs d -> A, no bias;
    - ``mixer.wkv`` (vector work, :data:`WKV_FLOPS` per element of [n, A], sequential over the positions):
      wkv_t = (a + e^{u+k_t} v_t) / (b + e^{u+k_t}) with a, b decayed by e^{-e^w} each step, in the stable
      form with a running max; owns w (time_decay) and u (time_first), 2A parameters; reads the state
      (a, b, max) [3, A] fp32 when t > s and writes it;
    - ``mixer.gate_out``: sigmoid(r) * wkv (5 FLOPs per element); ``mixer.output`` GEMM A -> d, no bias.
    """
    A, n, b = _rwkv_width(cfg), x.b * x.s, x.b
    state = 3 * A * _rec.STATE_BYTES
    return [_shift("mixer.token_shift", x, 3, x.d * x.B_kv),
            linear("mixer.key", n, x.d, A, x.B_w, x.B_a, shapes="xk [b,s,d] @ W_k [d,A]"),
            linear("mixer.value", n, x.d, A, x.B_w, x.B_a, shapes="xv [b,s,d] @ W_v [d,A]"),
            linear("mixer.receptance", n, x.d, A, x.B_w, x.B_a, shapes="xr [b,s,d] @ W_r [d,A]"),
            OpCost("mixer.wkv", OpClass.RECURRENT, flops=WKV_FLOPS * n * A, params=2 * A, weight_bytes=2 * A * x.B_w,
                   act_read_bytes=2 * n * A * x.B_a, act_write_bytes=n * A * x.B_a,
                   kv_read_bytes=b * state * _rec._starts_from_state(x), kv_write_bytes=b * state,
                   shapes="wkv = (a + e^(u+k) v) / (b + e^(u+k)); state (a, b, max) [b,3,A] fp32", kind="wkv"),
            elementwise("mixer.gate_out", n * A, 2, FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["mul"], x.B_a,
                        OpClass.RECURRENT, shapes="sigmoid(r) * wkv [b,s,A]", kind="sigmoid_mul"),
            linear("mixer.output", n, A, x.d, x.B_w, x.B_a, shapes="o [b,s,A] @ W_o [A,d]")]


def rwkv4_channel_ops(cfg, x) -> list[OpCost]:
    """RWKV-4's channel mixing, the FFN of its layers (Peng et al. 2023, section 4.1, eq. 15 and 17; HF
    RwkvFeedForward), width d_ff (ffn.d_ff, HF intermediate_size), n = b*s tokens.

    - ``ffn.token_shift``: the k, r mixes (:func:`_shift`; 2d parameters); its state x_prev [d] (B_kv);
    - ``ffn.key`` GEMM d -> d_ff; ``ffn.act`` squared ReLU (2 FLOPs per element); ``ffn.value`` GEMM d_ff -> d;
    - ``ffn.receptance`` GEMM d -> d; ``ffn.gate`` sigmoid(r) * v (5 FLOPs per element). No biases.
    """
    n, d, f = x.b * x.s, x.d, x.d_ff
    return [_shift("ffn.token_shift", x, 2, d * x.B_kv),
            linear("ffn.key", n, d, f, x.B_w, x.B_a, shapes="xk [b,s,d] @ W_k [d,d_ff]"),
            elementwise("ffn.act", n * f, 1, FLOPS_PER_ELEMENT["relu2"], x.B_a, shapes="relu(k)^2 [b,s,d_ff]",
                        kind="relu2"),
            linear("ffn.value", n, f, d, x.B_w, x.B_a, shapes="k [b,s,d_ff] @ W_v [d_ff,d]"),
            linear("ffn.receptance", n, d, d, x.B_w, x.B_a, shapes="xr [b,s,d] @ W_r [d,d]"),
            elementwise("ffn.gate", n * d, 2, FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["mul"], x.B_a,
                        shapes="sigmoid(r) * v [b,s,d]", kind="sigmoid_mul")]


def rnn_ffn_ops(cfg, x, ffn: str) -> list[OpCost]:
    """The operators of an rnn FFN kind (:data:`FFN_KINDS`), from its normed input [b,s,d] to its output.
    Raises: ValueError for another kind."""
    if ffn == "rwkv4_channel":
        return rwkv4_channel_ops(cfg, x)
    raise ValueError(f"not an rnn ffn: {ffn!r}")


def rnn_ops(cfg, x, kind: str) -> list[OpCost]:
    """The operators of one rnn mixer of kind ``kind`` (:data:`KINDS`), from its normed input [b,s,d] to its
    output [b,s,d]. Raises: ValueError for another kind."""
    if kind == "rg_lru":
        return rg_lru_ops(cfg, x)
    if kind == "rwkv4":
        return rwkv4_time_ops(cfg, x)
    raise ValueError(f"not an rnn mixer: {kind!r}")
