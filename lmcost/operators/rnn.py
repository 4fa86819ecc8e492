"""Operators of the recurrent (RNN-style) token mixers: Griffin's RG-LRU block (RecurrentGemma) and RWKV-4's time
and channel mixing (transformers' ``rwkv``) and xLSTM's mLSTM, per layer, for a pass of s new tokens per sequence at
context t. Conventions, state and names as
:mod:`lmcost.operators.recurrent`, whose dispatch (``conv_channels``, ``state_elements``, ``recurrent_ops``)
sends these kinds here.

Sources: De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention for Efficient Language
Models", section 2.4 (the recurrent block, fig. 2) and section 2.4's eq. 1-4 (the RG-LRU); transformers'
RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru (the layout and what its cache holds). Peng et al. 2023,
"RWKV: Reinventing RNNs for the Transformer Era", section 4 (RWKV-4: token shift, eq. 11-17; the WKV
operator, eq. 14, in its numerically stable form, appendix); transformers' RwkvSelfAttention, RwkvFeedForward
and rwkv_linear_attention_cpu (the layout, the state and the per-token arithmetic). Beck et al. 2024, "xLSTM:
Extended Long Short-Term Memory", section 2.3 (the mLSTM), and Beck et al. 2025, "xLSTM 7B" (the block
transformers implements); its chunkwise and recurrent kernels (mlstm_chunkwise_native_autograd,
mlstm_recurrent_step_native in transformers' modeling_xlstm: the matmuls counted here).
"""

from __future__ import annotations

from lmcost.operators import recurrent as _rec
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear, norm

#: The mixer kinds this module costs (entries of :data:`lmcost.model.mixers.RECURRENT_KINDS`).
KINDS = ("rg_lru", "rwkv4", "mlstm")
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
    mLSTM: (0, 0, qk_dim*v_dim/h + qk_dim + h): per head C [qk_dim/h, v_dim/h], n [qk_dim/h] and m [1]
    (transformers' xLSTMCache.rnn_state, in the model dtype: :func:`state_bytes`).
    """

    if kind == "rg_lru":
        g = cfg.recurrent.rg_lru
        return g.width * (g.d_conv - 1), g.d_conv, g.width
    if kind == "rwkv4":
        return 2 * cfg.d_model, 2, 3 * _rwkv_width(cfg)
    if kind == "mlstm":
        m = cfg.recurrent.mlstm
        return 0, 0, m.qk_dim * m.v_dim // m.n_heads + m.qk_dim + m.n_heads
    raise ValueError(f"not an rnn mixer: {kind!r}")


def state_bytes(cfg, kind: str, B_kv):
    """Bytes of state one sequence keeps in one ``kind`` layer: conv state * B_kv + recurrent state * 4 (fp32),
    but an mLSTM's memory in the model dtype (B_kv), as xLSTMCache allocates it."""
    conv, _, rec = state_elements(cfg, kind)
    return (conv + rec) * B_kv if kind == "mlstm" else conv * B_kv + rec * _rec.STATE_BYTES


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
                  act_write_bytes=n_mix * n * x.d * x.B_a,
                  kv_read_bytes=x.b * state_bytes_ * _rec._starts_from_state(x), kv_write_bytes=x.b * state_bytes_, shapes=f"{n_mix} x (x * mu + x_prev * (1 - mu)) [b,s,d]",
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


#: Vector FLOPs of the mLSTM kernels (per head), beside their matmuls: a step (mlstm_recurrent_step_native): the
#: gates (logsigmoid, max, two exps: 10), C = f C + i (k vᵀ) (3 per element), n = f n + i k (3 per element), the
#: q scale (1 per element), |q·n| vs exp(-m) + eps (4), h = num / denom (1 per element); a chunk of L
#: (mlstm_chunkwise_*): the log-decay matrix masked, stabilised and exponentiated and S * D (8 per pair), the
#: gated q and k (3 per element of q and k), the state decay and add (3 per element of C), the sum and division
#: of the output (3 per element of h), and the per-position gates and maxima (10).
def _mlstm_vector(dk: int, dv: int, L: int, chunks, steps):
    return (steps * (3 * dk * dv + 4 * dk + dv + 14)
            + chunks * (8 * L * L + 3 * L * dk * 2 + 3 * dk * dv + 3 * L * dv + 10 * L))


def mlstm_ops(cfg, x) -> list[OpCost]:
    """xLSTM's mLSTM layer (Beck et al. 2024, section 2.3; HF xLSTMLayer in inference mode), h heads, widths
    qk_dim (d_k = qk_dim/h per head) and v_dim (d_v = v_dim/h), chunks of L, n = b*s tokens.

    - ``mixer.qkvo_proj`` GEMM d -> 2*qk_dim + 2*v_dim (q, k, v, output gate); ``mixer.if_proj`` GEMM
      d -> 2h with bias (input, forget gates); ``mixer.gate_cap`` their soft cap (3 FLOPs per element; with
      gate_softcap);
    - ``mixer.mlstm`` (matmul): transformers' inference path runs c = floor(s/L) chunks in the chunkwise form and
      the r = s - c*L positions left step by step (wrap_chunkwise_arbitrary_sequence_length; a decode step is
      one step). MACs per head and sequence: a chunk, Kᵀ V L*d_k*d_v (the state update), Q Kᵀ L²*d_k,
      Q C L*d_k*d_v, (S ⊙ D) V L²*d_v, Q n L*d_k; a step, k vᵀ d_k*d_v, q C d_k*d_v, q·n d_k;
    - ``mixer.mlstm_state`` (vector work, :func:`_mlstm_vector`): reads the state (C, n, m) [h, d_k*d_v + d_k + 1]
      (model dtype) when t > s and writes it;
    - ``mixer.norm``: LayerNorm per head over d_v (weight [v_dim], no bias); ``mixer.gate_out`` sigmoid(o) * h
      (5 FLOPs per element); ``mixer.out_proj`` GEMM v_dim -> d.
    """
    m = cfg.recurrent.mlstm
    h, L = m.n_heads, m.chunk_size
    dk, dv = m.qk_dim // h, m.v_dim // h
    n, b = x.b * x.s, x.b
    c = x.s // L
    r = x.s - c * L
    macs = b * h * (c * (2 * L * dk * dv + L * L * (dk + dv) + L * dk) + r * (2 * dk * dv + dk))
    state = state_bytes(cfg, "mlstm", x.B_kv)
    return [linear("mixer.qkvo_proj", n, x.d, 2 * m.qk_dim + 2 * m.v_dim, x.B_w, x.B_a,
                   shapes="x [b,s,d] @ W [d,2*qk+2*v] -> q, k, v, o"),
            linear("mixer.if_proj", n, x.d, 2 * h, x.B_w, x.B_a, True, shapes="x [b,s,d] @ W [d,2h] + b -> i, f"),
            *([elementwise("mixer.gate_cap", n * 2 * h, 1, FLOPS_PER_ELEMENT["softcap"], x.B_a, OpClass.RECURRENT,
                           shapes="c * tanh(g / c) [b,s,2h]", kind="softcap")] if m.gate_softcap is not None else []),
            OpCost("mixer.mlstm", OpClass.RECURRENT, flops=2 * macs, matmul=True,
                   act_read_bytes=n * (2 * m.qk_dim + m.v_dim + 2 * h) * x.B_a, act_write_bytes=n * m.v_dim * x.B_a,
                   shapes="chunks of L: Kᵀ V, Q Kᵀ, Q C, (S ⊙ D) V, Q n; the rest stepwise: k vᵀ, q C, q·n",
                   kind="mlstm"),
            OpCost("mixer.mlstm_state", OpClass.RECURRENT, flops=b * h * _mlstm_vector(dk, dv, L, c, r),
                   kv_read_bytes=b * state * _rec._starts_from_state(x), kv_write_bytes=b * state,
                   shapes="gates, decays, normaliser; state (C, n, m) [b,h,d_k*d_v+d_k+1] read and written",
                   kind="mlstm_state"),
            norm("mixer.norm", "layernorm", False, n, m.v_dim, x.B_w, x.B_a,
                 shapes="layernorm per head [b,s,h,d_v] * w [v_dim]"),
            elementwise("mixer.gate_out", n * m.v_dim, 2, FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["mul"],
                        x.B_a, OpClass.RECURRENT, shapes="sigmoid(o) * h [b,s,v_dim]", kind="sigmoid_mul"),
            linear("mixer.out_proj", n, m.v_dim, x.d, x.B_w, x.B_a, shapes="h [b,s,v_dim] @ W_out [v_dim,d]")]


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
    if kind == "mlstm":
        return mlstm_ops(cfg, x)
    raise ValueError(f"not an rnn mixer: {kind!r}")
