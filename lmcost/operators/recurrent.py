"""Operators of the constant-state token mixers of hybrid models: Mamba-2 (SSD), LFM2's gated short
convolution and the gated DeltaNet, per layer, for a pass of s new tokens per sequence at context t.

Conventions (as :mod:`lmcost.operators.attention`): n = b*s tokens; 2 FLOPs per multiply-accumulate; the
projections are GEMMs (:func:`lmcost.operators.ops.linear`, counted with the other matmuls); the convolution,
scan and gating are ops of their own (class ``recurrent``, or ``norm`` for the gated norm).

State. Each of these layers keeps, per sequence, a state whose size does not grow with the context:
- a convolution state: the last d_conv inputs of each conv channel, [C, d_conv] (transformers'
  ``LinearAttentionLayer.conv_states`` keeps d_conv columns, in the activation dtype: B_kv here);
- Mamba-2: the SSM state [n_heads, head_dim, d_state]; gated DeltaNet: [n_v_heads, d_k, d_v]. Both in
  fp32 (``STATE_BYTES``): transformers' scans run in float32 and cache their final state as it is.
A pass reads the state it starts from (when t > s: a decode step or a later chunk of a prefill) and
writes the state it ends at; these are KV-cache bytes (``kv_read_bytes``/``kv_write_bytes``).

Sources: Dao & Gu 2024, "Transformers are SSMs" (Mamba-2): section 6 (the SSD algorithm in chunks of Q,
its Listing 1 is transformers' torch path) and section 7 (the Mamba-2 block); Yang, Kautz & Hatamizadeh
2024, "Gated Delta Networks" (eq. 10 and section 3.3); Liquid AI, LFM2 (the gated short-conv operator:
y = C * conv(B * x), Lfm2ShortConv in transformers).
"""

from __future__ import annotations

from lmcost.basics.notation import minimum
from lmcost.model.config import RECURRENT_KINDS  # noqa: F401 (re-exported: the kinds this module costs)
from lmcost.operators import linear_attention
from lmcost.operators import rnn
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear

#: Bytes per element of an SSM / delta-rule state (float32, as transformers and mamba_ssm keep it).
STATE_BYTES = 4


def _starts_from_state(x):
    """1 when the pass continues a sequence (t > s: it reads the state), 0 for a prefill from empty (t = s)."""
    return minimum(1, x.t - x.s)


def _chunks(s, Q):
    """Chunks of Q positions covering s (the last one zero-padded): ceil(s / Q)."""
    return (s + Q - 1) // Q


def conv_channels(cfg, kind: str) -> int:
    """Channels of the depthwise causal conv of a ``kind`` layer (C): Mamba-2 d_in + 2*g*N (x, B, C);
    short conv d (B*x); gated DeltaNet 2*h_k*d_k + h_v*d_v (q, k, v)."""
    if kind == "mamba":  # Mamba-1: lmcost.operators.ssm
        from lmcost.operators import ssm
        return ssm.conv_channels(cfg, kind)
    r = cfg.recurrent
    if kind in rnn.KINDS:  # RG-LRU, ... (lmcost.operators.rnn)
        return rnn.conv_channels(cfg, kind)
    if kind == "mamba2":
        m = r.mamba2
        return m.n_heads * m.head_dim + 2 * m.n_groups * m.d_state
    if kind == "short_conv":
        return cfg.d_model
    if kind == "gated_deltanet":
        g = r.gated_deltanet
        return 2 * g.n_k_heads * g.d_k + g.n_v_heads * g.d_v
    raise ValueError(f"not a recurrent mixer: {kind!r}")


def state_elements(cfg, kind: str) -> tuple[int, int, int]:
    """Per sequence and layer: (conv state elements, conv width d_conv, recurrent state elements).

    Mamba-2: (C*d_conv, d_conv, n_heads*head_dim*d_state); short conv: (d*d_conv, d_conv, 0);
    gated DeltaNet: (C*d_conv, d_conv, n_v_heads*d_k*d_v).
    """
    if kind == "mamba":  # Mamba-1: lmcost.operators.ssm
        from lmcost.operators import ssm
        return ssm.state_elements(cfg, kind)
    r = cfg.recurrent
    if kind in rnn.KINDS:
        return rnn.state_elements(cfg, kind)
    if kind == "mamba2":
        m = r.mamba2
        return conv_channels(cfg, kind) * m.d_conv, m.d_conv, m.n_heads * m.head_dim * m.d_state
    if kind == "short_conv":
        return conv_channels(cfg, kind) * r.short_conv.d_conv, r.short_conv.d_conv, 0
    if kind == "gated_deltanet":
        g = r.gated_deltanet
        return conv_channels(cfg, kind) * g.d_conv, g.d_conv, g.n_v_heads * g.d_k * g.d_v
    return linear_attention.state_elements(cfg, kind)  # lightning, ...: ValueError for an unknown kind


def state_bytes(cfg, kind: str, B_kv):
    """Bytes of state one sequence keeps in one ``kind`` layer: conv state * B_kv + recurrent state * 4
    (:func:`lmcost.operators.linear_attention.state_bytes` for its kinds)."""
    if kind in linear_attention.LINEAR_KINDS:
        return linear_attention.state_bytes(cfg, kind, B_kv)
    if kind in rnn.KINDS:
        return rnn.state_bytes(cfg, kind, B_kv)
    conv, _, rec = state_elements(cfg, kind)
    return conv * B_kv + rec * STATE_BYTES


def conv_op(x, channels, K, bias: bool, act: str | None, state_bytes_) -> OpCost:
    """A depthwise causal conv1d of K taps over ``channels`` channels of n = b*s tokens (+ its activation).

    Shapes: u [b, C, s] (after the d_conv - 1 cached inputs) * w [C, K] -> [b, C, s].
    Returns: 2*K FLOPs per output element (+1 with bias, + FLOPS_PER_ELEMENT[act] with an activation);
    reads u and the weights, writes the output; reads the conv state when t > s and writes it
    (``state_bytes_`` per sequence).
    """
    n = x.b * x.s
    per = 2 * K + (1 if bias else 0) + (FLOPS_PER_ELEMENT[act] if act else 0)
    params = channels * K + (channels if bias else 0)
    return OpCost("mixer.conv", OpClass.RECURRENT, flops=per * n * channels, weight_bytes=params * x.B_w,
                  act_read_bytes=n * channels * x.B_a, act_write_bytes=n * channels * x.B_a,
                  kv_read_bytes=x.b * state_bytes_ * _starts_from_state(x), kv_write_bytes=x.b * state_bytes_,
                  params=params, shapes=f"depthwise causal conv u [b,C,s] * w [C,{K}] -> [b,C,s]", kind="conv1d")


def gated_rmsnorm(name: str, x, n_rows, width, B_w, B_a) -> OpCost:
    """RMSNorm(y * SiLU(z)) * w over ``width`` (Mamba-2, in n_groups groups) or RMSNorm(y) * w * SiLU(z)
    (gated DeltaNet, per value head): the same work in either order.

    Returns: (4 SiLU + 1 multiply + 4 RMSNorm) FLOPs per element; reads y and z, writes the output;
    weight [width]. Source: Dao & Gu 2024, section 7.3 (the extra normalization, gated); Yang et al. 2024,
    section 3.4 (output gate and norm).
    """
    el = n_rows * width
    return OpCost(name, OpClass.NORM, flops=(FLOPS_PER_ELEMENT["silu"] + 1 + FLOPS_PER_ELEMENT["rmsnorm"]) * el,
                  weight_bytes=width * B_w, act_read_bytes=2 * el * B_a, act_write_bytes=el * B_a, params=width,
                  shapes="rmsnorm(y * silu(z)) * w [b,s,width]", kind="gated_rmsnorm")


def mamba2_ops(cfg, x) -> list[OpCost]:
    """A Mamba-2 mixer (Dao & Gu 2024, section 7; HF NemotronHMamba2Mixer / Mamba2Mixer torch path).

    H heads of width P, state N, g groups of B/C, conv K taps, chunks of Q: d_in = H*P, C = d_in + 2*g*N.
    - ``mixer.in_proj`` GEMM d -> 2*d_in + 2*g*N + H (z, x, B, C, dt);
    - ``mixer.conv``: depthwise conv of K taps + SiLU over C channels; conv state [C, K];
    - ``mixer.ssm`` (matmul): prefill, the chunked SSD of Listing 1 (section 6), with c = ceil(s/Q) chunks
      per sequence, in MACs: C·Bᵀ c*Q²*H*N, its product with x c*Q²*H*P, chunk states c*Q*H*P*N, the
      inter-chunk recurrence (c+1)²*H*P*N, state-to-output c*Q*H*P*N. Decode (s = 1): y = h·C, H*P*N MACs;
    - ``mixer.ssm_state`` (vector work): prefill, the decay mask and its product with C·Bᵀ (2*c*Q²*H),
      B decay (c*Q*H*N), output decay and sum (2*c*Q*H*P), discretization dt*x and the D skip (3*s*d_in);
      decode, h = exp(dt*A)*h + (dt*B)*x: 3*H*P*N + H*N, and the D skip 2*d_in. It reads the SSM state
      [H, P, N] (fp32) when t > s and writes it; it owns A_log, dt_bias and D (3*H parameters);
    - ``mixer.norm``: gated RMSNorm over d_in; ``mixer.out_proj`` GEMM d_in -> d.
    """
    m = cfg.recurrent.mamba2
    H, P, N, G, K, Q = m.n_heads, m.head_dim, m.d_state, m.n_groups, m.d_conv, m.chunk_size
    d_in, n, b = H * P, x.b * x.s, x.b
    C = conv_channels(cfg, "mamba2")
    state = H * P * N * STATE_BYTES
    ops = [linear("mixer.in_proj", n, x.d, 2 * d_in + 2 * G * N + H, x.B_w, x.B_a, m.proj_bias,
                  shapes="x [b,s,d] @ W_in [d,2*d_in+2*g*N+H] -> z, x, B, C, dt"),
           conv_op(x, C, K, m.conv_bias, "silu", C * K * x.B_kv)]
    io = n * (d_in + 2 * G * N + H) * x.B_a  # x, B, C, dt read by the scan
    if isinstance(x.s, int) and x.s == 1:
        macs, vec = b * H * P * N, b * (3 * H * P * N + H * N + 2 * d_in)
        shapes = "y [b,H,P] = h [b,H,P,N] @ C [b,H,N] (recurrent step)"
    else:
        c = _chunks(x.s, Q)
        macs = b * (c * Q * Q * H * (N + P) + 2 * c * Q * H * P * N + (c + 1) * (c + 1) * H * P * N)
        vec = b * (2 * c * Q * Q * H + c * Q * H * N + 2 * c * Q * H * P + 3 * x.s * d_in)
        shapes = "SSD in chunks of Q: C·Bᵀ, (·L) x, chunk states, inter-chunk recurrence, C·states"
    ops += [OpCost("mixer.ssm", OpClass.RECURRENT, flops=2 * macs, act_read_bytes=io,
                   act_write_bytes=n * d_in * x.B_a, shapes=shapes, matmul=True, kind="ssd"),
            OpCost("mixer.ssm_state", OpClass.RECURRENT, flops=vec, params=3 * H, weight_bytes=3 * H * x.B_w,
                   kv_read_bytes=b * state * _starts_from_state(x), kv_write_bytes=b * state,
                   shapes="discretize, decay, D skip; SSM state [b,H,P,N] fp32 read and written", kind="ssm_state"),
            gated_rmsnorm("mixer.norm", x, n, d_in, x.B_w, x.B_a),
            linear("mixer.out_proj", n, d_in, x.d, x.B_w, x.B_a, m.proj_bias, shapes="y [b,s,d_in] @ W_out [d_in,d]")]
    return ops


def short_conv_ops(cfg, x) -> list[OpCost]:
    """LFM2's gated short convolution (Liquid AI LFM2; HF Lfm2ShortConv): y = W_out (C * conv(B * x)).

    - ``mixer.in_proj`` GEMM d -> 3d (B, C, x); ``mixer.gate_in`` B*x (1 FLOP per element);
    - ``mixer.conv``: depthwise causal conv of d_conv taps over d channels, no activation; state [d, d_conv];
    - ``mixer.gate_out`` C*conv; ``mixer.out_proj`` GEMM d -> d. Biases on all three with ``bias``.
    """
    sc, n, d = cfg.recurrent.short_conv, x.b * x.s, x.d
    return [linear("mixer.in_proj", n, d, 3 * d, x.B_w, x.B_a, sc.bias, shapes="x [b,s,d] @ W_in [d,3d] -> B, C, x"),
            elementwise("mixer.gate_in", n * d, 2, FLOPS_PER_ELEMENT["mul"], x.B_a, OpClass.RECURRENT,
                        shapes="B * x [b,s,d]", kind="mul"),
            conv_op(x, d, sc.d_conv, sc.bias, None, d * sc.d_conv * x.B_kv),
            elementwise("mixer.gate_out", n * d, 2, FLOPS_PER_ELEMENT["mul"], x.B_a, OpClass.RECURRENT,
                        shapes="C * conv [b,s,d]", kind="mul"),
            linear("mixer.out_proj", n, d, d, x.B_w, x.B_a, sc.bias, shapes="y [b,s,d] @ W_out [d,d]")]


def recurrent_ops(cfg, x, kind: str) -> list[OpCost]:
    """The operators of one constant-state mixer of kind ``kind`` (``mamba2``, ``short_conv``,
    ``gated_deltanet``, ``mamba``), from its normed input [b,s,d] to its output [b,s,d].
    Raises: ValueError for another kind."""
    if kind in rnn.KINDS:
        return rnn.rnn_ops(cfg, x, kind)
    if kind == "mamba2":
        return mamba2_ops(cfg, x)
    if kind == "mamba":  # Mamba-1: lmcost.operators.ssm
        from lmcost.operators import ssm
        return ssm.mamba_ops(cfg, x)
    if kind == "short_conv":
        return short_conv_ops(cfg, x)
    if kind == "gated_deltanet":
        return gated_deltanet_ops(cfg, x)
    return linear_attention.linear_attention_ops(cfg, x, kind)  # lightning, ...: ValueError for an unknown kind


def gated_deltanet_ops(cfg, x) -> list[OpCost]:
    """A gated DeltaNet mixer (Yang et al. 2024, "Gated Delta Networks"; HF Qwen3NextGatedDeltaNet torch path).

    h_k key heads and h_v value heads (each key head serves h_v/h_k value heads), widths d_k, d_v; conv K
    taps; chunks of Q = chunk_size (64, transformers' torch_chunk_gated_delta_rule and FLA). Per token:
    S_t = exp(g_t) S_{t-1} (I - beta_t k_t k_tᵀ) + beta_t v_t k_tᵀ, o_t = S_t q_t (eq. 10), S [h_v, d_k, d_v].
    - ``mixer.in_proj_qkvz`` GEMM d -> 2*h_k*d_k + 2*h_v*d_v; ``mixer.in_proj_ba`` GEMM d -> 2*h_v (beta, gate);
    - ``mixer.conv``: depthwise conv of K taps + SiLU over C = 2*h_k*d_k + h_v*d_v channels (q, k, v); state [C, K];
    - ``mixer.delta_rule``: prefill, the chunked form (section 3.3, the WY/UT transform; transformers' torch
      code), with c = ceil(s/Q) chunks per sequence and value head, in MACs per chunk: K·(beta K)ᵀ and Q·Kᵀ
      2*Q²*d_k; the inter-chunk reads of the state (K_cumdecay·S, Q·S) 2*Q*d_k*d_v; the intra-chunk
      output Q²*d_v; the state update Kᵀ·V_new Q*d_k*d_v: matmuls. A decode step (s = 1) runs the
      recurrence above elementwise (decay d_k*d_v, S·k 2*d_k*d_v, delta 2*d_v, rank-1 update 2*d_k*d_v,
      S·q 2*d_k*d_v: 7*d_k*d_v + 2*d_v FLOPs per head): vector work, no matmul;
    - ``mixer.delta_state`` (vector work): L2 norms of q and k (3 FLOPs per element, over h_v heads after
      the GQA-style repeat), the gates (beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias): 10 per
      head), and in prefill per chunk and value head the two unit-triangular solves of the UT transform
      (Q²*(d_k + d_v): Q(Q-1)/2 MACs per column), the decay masks (3*Q²), the decayed q, k, beta k,
      beta v (3*Q*d_k + Q*d_v) and the state decay (d_k*d_v). It reads the state [h_v, d_k, d_v] (fp32)
      when t > s and writes it; it owns A_log and dt_bias (2*h_v parameters);
    - ``mixer.norm``: gated RMSNorm per value head over d_v (weight [d_v]); ``mixer.out_proj`` GEMM h_v*d_v -> d.
    """
    g = cfg.recurrent.gated_deltanet
    hk, hv, dk, dv, K, Q = g.n_k_heads, g.n_v_heads, g.d_k, g.d_v, g.d_conv, g.chunk_size
    n, b = x.b * x.s, x.b
    C = conv_channels(cfg, "gated_deltanet")
    state = hv * dk * dv * STATE_BYTES
    gates = n * hv * (6 * dk + 10)  # l2norm of q and k after the repeat to h_v heads, beta and g
    if isinstance(x.s, int) and x.s == 1:
        rule = OpCost("mixer.delta_rule", OpClass.RECURRENT, flops=b * hv * (7 * dk * dv + 2 * dv),
                      act_read_bytes=n * (C + 2 * hv) * x.B_a, act_write_bytes=n * hv * dv * x.B_a,
                      shapes="S = exp(g) S (I - beta k kᵀ) + beta v kᵀ; o = S q (recurrent step)", kind="delta_rule")
        vec = gates
    else:
        c = _chunks(x.s, Q)
        macs = b * hv * c * (2 * Q * Q * dk + Q * Q * dv + 3 * Q * dk * dv)
        rule = OpCost("mixer.delta_rule", OpClass.RECURRENT, flops=2 * macs,
                      act_read_bytes=n * (C + 2 * hv) * x.B_a, act_write_bytes=n * hv * dv * x.B_a,
                      shapes="chunks of Q: K·(βK)ᵀ, Q·Kᵀ, K_cumdecay·S, Q·S, A·V_new, Kᵀ·V_new", matmul=True,
                      kind="delta_rule")
        vec = gates + b * hv * c * (Q * Q * (dk + dv) + 3 * Q * Q + 3 * Q * dk + Q * dv + dk * dv)
    return [linear("mixer.in_proj_qkvz", n, x.d, 2 * hk * dk + 2 * hv * dv, x.B_w, x.B_a,
                   shapes="x [b,s,d] @ W [d,2*h_k*d_k+2*h_v*d_v] -> q, k, v, z"),
            linear("mixer.in_proj_ba", n, x.d, 2 * hv, x.B_w, x.B_a, shapes="x [b,s,d] @ W [d,2*h_v] -> beta, a"),
            conv_op(x, C, K, False, "silu", C * K * x.B_kv),
            rule,
            OpCost("mixer.delta_state", OpClass.RECURRENT, flops=vec, params=2 * hv, weight_bytes=2 * hv * x.B_w,
                   kv_read_bytes=b * state * _starts_from_state(x), kv_write_bytes=b * state,
                   shapes="l2norm q, k; gates; UT solves; decays; state [b,h_v,d_k,d_v] fp32 read and written",
                   kind="delta_state"),
            gated_rmsnorm("mixer.norm", x, n * hv, dv, x.B_w, x.B_a),
            linear("mixer.out_proj", n, hv * dv, x.d, x.B_w, x.B_a, shapes="o [b,s,h_v*d_v] @ W_out [h_v*d_v,d]")]
