"""Attention operators of one layer: MHA, MQA, GQA and MLA, global or sliding-window, flash or naive.

Notation: see :mod:`lmcost.basics.notation`. A pass processes s new tokens per sequence against a context
of t tokens (the new ones included), so prefill is s = t = prompt and a decode step is s = 1.

Conventions:
- Causal masking. A fused (flash) kernel computes only the query-key pairs the mask keeps: the
  query at position j (1-based) sees j keys, so a pass over positions t-s+1..t computes
  s*t - s*(s-1)/2 pairs (about half of s*t in prefill). A naive kernel computes all s*t scores
  and writes the [b,h,s,t] score matrix to memory, then reads it back (Dao et al. 2022, section 3).
- A local layer sees at most w keys: the query at position j sees min(j, w). The kernel reads
  min(t, s + w - 1) keys of K/V, and the cache holds min(t, w) tokens (Beltagy et al. 2020).
- GQA/MQA: each K/V head serves h/h_kv query heads, so K/V reads are b*t*h_kv*d_h each, in the
  kernel as in the cache (Ainslie et al. 2023).
- The K/V projections write their output into the cache (KV-cache dtype); the kernel reads it back.
- MLA (DeepSeek-V2, section 2.1, eqs. 9-19): the cache holds the latent c_KV [d_c] and a shared RoPE
  key [d_r] per token. ``absorbed``: W_UK is folded into the query and W_UV into the output, and
  attention runs over the latent directly (an MQA over width d_c + d_r). ``naive``: the latent of all
  t tokens is up-projected to per-head K and V every pass, then ordinary MHA runs.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.basics.notation import half, minimum
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear, norm
from lmcost.operators.dynamic_mask import dynamic_mask_ops
from lmcost.operators.differential import combine, two_calls
from lmcost.operators.layer_heads import layer_sinks, value_width
from lmcost.operators.mixture_of_attention import moa_output_ops, moa_query_ops
from lmcost.operators.output_gate import softplus_gate_ops
from lmcost.operators.clip_qkv import clip_qkv
from lmcost.operators.sub_norms import sub_norm


def kv_elements(x, mla: bool, v_dim=None) -> tuple:
    """Elements of (K, V) one token keeps per layer, which the attention kernel reads back: the one place
    K/V sizes are written (the KV cache, the attention ops and ``lmcost op attention`` ask it).

    GQA/MQA/MHA: (h_kv*d_h, h_kv*d_h), or (h_kv*d_h, h_kv*v_dim) with value heads of their own width
    (:mod:`lmcost.operators.layer_heads`). MLA: (d_c + d_r, 0): the latent c_KV and the shared RoPE key are
    the keys, and the latent doubles as the values, read once (DeepSeek-V2, section 2.1.2).
    """
    if mla:
        return x.d_c + x.d_r, 0
    return x.h_kv * x.d_h, x.h_kv * (x.d_h if v_dim is None else v_dim)


def kv_width(cfg, x) -> object:
    """Elements of KV cache per token per layer: 2*h_kv*d_h (K and V), h_kv*(d_h + d_v) with value heads of their
    own width (:mod:`lmcost.operators.layer_heads`), or d_c + d_r for MLA. ``x``: a layer's own dims
    (:func:`lmcost.operators.per_layer.layer_dims`) where they differ by layer."""
    k, v = kv_elements(x, cfg.attention.mla is not None, value_width(cfg, x))
    return k + v


def mask_kind(local) -> str:
    """The mask of a layer: ``global``, ``local`` or ``chunked``, from a bool (local or not) or an attention
    kind of :data:`lmcost.model.config.ATTENTION_KINDS` (``local_nope`` -> ``local``; a KV-shared ``local_shared`` ->
    ``local``)."""
    if isinstance(local, str):
        return local.removesuffix("_shared").removesuffix("_nope")
    return "local" if local else "global"


def cached_tokens(x, local):
    """Tokens per sequence a layer holds in its cache at context t: t, min(t, w) if local, min(t, C) if
    chunked (a rolling buffer of one chunk: position j in slot j mod C, so the current chunk sits in slots
    0..(t-1) mod C; transformers' cache for chunked layers is a sliding window of C, cache_utils.py).
    ``local``: a bool or an attention kind."""
    m = mask_kind(local)
    return minimum(x.t, x.w) if m == "local" else minimum(x.t, x.C) if m == "chunked" else x.t


def _keys_read(x, local):
    """Keys per sequence the kernel reads: t; min(t, s + w - 1) on a local layer; on a chunked layer the
    keys from the start of the first query's chunk to t: t - floor((t - s)/C)*C (decode: ((t-1) mod C) + 1); under
    DSA's sparse kernel (``topk``, w = top_k) the distinct keys the s queries select, at most min(t, s*w)."""
    m = mask_kind(local)
    if m == "topk":  # DSA's sparse kernel (lmcost.operators.sparse_attention): w = top_k keys anywhere before
        return minimum(x.t, x.s * x.w)
    if m == "local":
        return minimum(x.t, x.s + x.w - 1)
    if m == "chunked":
        return x.t - (x.t - x.s) // x.C * x.C
    return x.t


def _causal_pairs(x, local):
    """Query-key pairs per sequence and head that survive the causal (and window or chunk) mask.

    Global: sum_{j=t-s+1}^{t} j = s*t - s*(s-1)/2.
    Local: sum_{j=t-s+1}^{t} min(j, w) = S(t) - S(t-s), where S(n) = sum_{j=1}^{n} min(j, w)
    = m*(m+1)/2 + (n - m)*w with m = min(n, w).
    Chunked (Llama 4's chunked attention: the query at position j sees the ((j-1) mod C) + 1 keys of its
    chunk): S(t) - S(t-s) with S(n) = sum_{j=1}^{n} (((j-1) mod C) + 1) = (n // C)*C*(C+1)/2 + r*(r+1)/2,
    r = n mod C (whole chunks, then the part of the last one).
    DSA's top-k (``topk``, w = top_k): the query at position j attends to min(j, w) keys, the local sum.
    """
    m = mask_kind(local)
    if not (isinstance(x.cp, int) and x.cp == 1):
        # Context parallel prefill: the whole pass is S = s*cp queries; each rank computes 1/cp of its pairs.
        S = x.s * x.cp
        return (S * x.t - half(S * (S - 1))) / x.cp
    if m == "global":
        return x.s * x.t - half(x.s * (x.s - 1))
    if m == "chunked":
        def Sc(n):
            r = n % x.C
            return (n // x.C) * half(x.C * (x.C + 1)) + half(r * (r + 1))

        return Sc(x.t) - Sc(x.t - x.s)
    if isinstance(x.s, int) and x.s == 1:
        return minimum(x.t, x.w)  # the same sum for one query (a decode step), in its simplest form

    def S(n):
        m = minimum(n, x.w)
        return half(m * (m + 1)) + (n - m) * x.w

    return S(x.t) - S(x.t - x.s)


def attention_core(x, local, kernel: str, h, qk_dim, v_dim, q_bytes, k_bytes, v_bytes,
          causal: bool = True, dropout: bool = False, kv_streams=None, sinks: bool = False,
          softcap: bool = False, alibi: bool = False) -> list[OpCost]:
    """The attention kernel: scores, softmax, weighted sum of values.

    Shapes: q [b,h,s,qk_dim] @ kᵀ [b,h_kv,qk_dim,t_k] -> scores [b,h,s,t_k];
            p [b,h,s,t_k] @ v [b,h_kv,t_k,v_dim] -> o [b,h,s,v_dim]; t_k = keys read.
    ``q_bytes``, ``k_bytes``, ``v_bytes``: bytes of Q read and of K, V read (the caller knows
    how many heads and which dtype they have).
    Returns: flash: ``attn.sdpa`` (2*b*h*P*(qk_dim + v_dim) FLOPs over P causal pairs; reads Q, K, V,
    writes O) and ``attn.softmax`` (5*b*h*P FLOPs done inside the same kernel: no bytes).
    The flash record's ``mnk`` is its attention shape, which the efficiency model reads
    (:mod:`lmcost.cost.efficiency`): m = b*h_kv KV streams, n = s queries per sequence and head,
    k = m * P_seq (P_seq: pairs per sequence and head), so the mean keys per query is L = k / (m*n)
    and a decode step has n = 1. ``kv_streams``: KV heads streamed per sequence (default h_kv; absorbed
    MLA: 1 latent; MLA up-projected: h).
    naive: ``attn.score``, ``attn.softmax``, ``attn.value`` over all s*t_k pairs, with the score
    matrix written and read (activation dtype). Bidirectional attention (``causal=False``) computes
    all s*t_k pairs in either kernel. ``dropout`` (training) adds a dropout over the naive kernel's
    probabilities (1 FLOP per element, a 1-byte mask read); flash applies it inside the kernel.
    ``local``: a bool or an attention kind (``chunked``...; see :func:`mask_kind`).
    ``softcap`` (Gemma-2's attn_logit_softcapping): scores become c*tanh(scores/c) before the softmax,
    3 FLOPs per score (divide, tanh, multiply): ``attn.softcap``, an elementwise kernel over the written
    score matrix in the naive kernel (transformers' eager path; its SDPA path cannot cap), inside the
    kernel in flash (FlashAttention-2's ``softcap``: no memory traffic).
    ``alibi`` (BLOOM, MPT; Press et al. 2022, "Train Short, Test Long", section 3): each score gains
    -m_h * (i - j), a per-head slope times the query-key distance, before the softmax: ``attn.alibi``, 2 FLOPs
    per score (multiply, add), an elementwise pass over the written score matrix in the naive kernel
    (transformers' baddbmm of the bias), inside the kernel in flash (FlashAttention-2's ``alibi_slopes``).
    ``sinks`` (gpt-oss): ``attn.sinks``, one learned logit per head joining each query's softmax (the
    gpt-oss model card, section 2.1; transformers GptOssAttention): h parameters, and the softmax of each
    of the b*h*s rows takes one more logit (5 FLOPs), inside the softmax's kernel.
    """
    b, s, B_a = x.b, x.s, x.B_a
    o_bytes = b * s * h * v_dim * B_a
    if kernel == "flash":
        P_seq = _causal_pairs(x, local) if causal else s * _keys_read(x, local)
        P = b * h * P_seq
        streams = b * (x.h_kv if kv_streams is None else kv_streams)
        return [
            OpCost("attn.sdpa", OpClass.ATTENTION, flops=2 * P * qk_dim + 2 * P * v_dim,
                   act_read_bytes=q_bytes, kv_read_bytes=k_bytes + v_bytes, act_write_bytes=o_bytes,
                   shapes="softmax(q [b,h,s,d_qk] @ kᵀ [b,h_kv,d_qk,t]) @ v [b,h_kv,t,d_v] -> [b,h,s,d_v]",
                   matmul=True, kind="sdpa", mnk=(streams, s, streams * P_seq),
                   q_per_stream=h // (x.h_kv if kv_streams is None else kv_streams) or 1),
        ] + ([OpCost("attn.softcap", OpClass.ELEMENTWISE, flops=FLOPS_PER_ELEMENT["softcap"] * P,
                     shapes="c * tanh(scores / c), inside attn.sdpa", kernels=0)] if softcap else []) + (
            [OpCost("attn.alibi", OpClass.ELEMENTWISE, flops=FLOPS_PER_ELEMENT["alibi"] * P,
                    shapes="scores - m_h * (i - j), inside attn.sdpa", kernels=0)] if alibi else []) + [
            OpCost("attn.softmax", OpClass.SOFTMAX, flops=FLOPS_PER_ELEMENT["softmax"] * P,
                   shapes="inside attn.sdpa: no memory traffic of its own", kernels=0),
        ] + _sinks(x, h, sinks)
    scores = b * h * s * _keys_read(x, local)
    return [
        OpCost("attn.score", OpClass.ATTENTION, flops=2 * scores * qk_dim,
               act_read_bytes=q_bytes, kv_read_bytes=k_bytes, act_write_bytes=scores * B_a,
               shapes="q [b,h,s,d_qk] @ kᵀ [b,h_kv,d_qk,t] -> [b,h,s,t]", matmul=True),
    ] + ([OpCost("attn.softcap", OpClass.ELEMENTWISE, flops=FLOPS_PER_ELEMENT["softcap"] * scores,
                 act_read_bytes=scores * B_a, act_write_bytes=scores * B_a,
                 shapes="c * tanh(scores / c) [b,h,s,t]")] if softcap else []) + (
        [OpCost("attn.alibi", OpClass.ELEMENTWISE, flops=FLOPS_PER_ELEMENT["alibi"] * scores,
                act_read_bytes=scores * B_a, act_write_bytes=scores * B_a,
                shapes="scores [b,h,s,t] - m_h [h] * (i - j) [s,t]")] if alibi else []) + [
        OpCost("attn.softmax", OpClass.SOFTMAX, flops=FLOPS_PER_ELEMENT["softmax"] * scores,
               act_read_bytes=scores * B_a, act_write_bytes=scores * B_a, shapes="[b,h,s,t] -> [b,h,s,t]"),
    ] + _sinks(x, h, sinks) + ([OpCost("attn.dropout", OpClass.ELEMENTWISE, flops=scores, act_read_bytes=scores * B_a + scores,
                 act_write_bytes=scores * B_a, shapes="p [b,h,s,t] * mask / (1 - p_drop)")] if dropout else []) + [
        OpCost("attn.value", OpClass.ATTENTION, flops=2 * scores * v_dim,
               act_read_bytes=scores * B_a, kv_read_bytes=v_bytes, act_write_bytes=o_bytes,
               shapes="p [b,h,s,t] @ v [b,h_kv,t,d_v] -> [b,h,s,d_v]", matmul=True),
    ]


def _sinks(x, h, on: bool) -> list[OpCost]:
    """The attention sinks of one layer (see :func:`attention_core`): params h, read once per pass (their
    bytes are weights), 5 FLOPs for the extra logit of each of the b*h*s softmax rows; inside the softmax."""
    if not on:
        return []
    return [OpCost("attn.sinks", OpClass.SOFTMAX, flops=FLOPS_PER_ELEMENT["softmax"] * x.b * h * x.s,
                   weight_bytes=h * x.B_w, params=h, kernels=0,
                   shapes="sink logit [h] joins the softmax of each row [b,h,s]: inside attn.softmax")]


def _qk_norm(cfg, x, n, h_q, h_k, rope_layer: bool = True) -> list[OpCost]:
    """QK-norm (RMSNorm on queries and keys): per head over d_h (Qwen3, Gemma-3) or over the
    whole projection h*d_h (OLMo-2). Weights [d_h] or [h*d_h] each for q and k. ``l2`` (Llama 4's
    Llama4TextL2Norm, x * rsqrt(mean(x^2) + eps) per head, no weight: 3 FLOPs per element) runs only on
    layers with RoPE (``rope_layer``), as Llama4TextAttention does."""
    mode = cfg.attention.qk_norm
    if mode == "none":
        return []
    if mode == "l2":
        if not rope_layer:
            return []
        return [OpCost(name, OpClass.NORM, flops=FLOPS_PER_ELEMENT["l2norm"] * n * heads * x.d_h,
                       act_read_bytes=n * heads * x.d_h * x.B_a, act_write_bytes=n * heads * x.d_h * x.B_a,
                       shapes="x [b,s,heads,d_h] * rsqrt(mean(x^2)) (no weight)", kind="rmsnorm")
                for name, heads in (("attn.q_norm", h_q), ("attn.k_norm", h_k))]
    if mode == "head_layernorm":  # Persimmon: LayerNorm with weight and bias [d_h] on each head of q and k
        return [norm("attn.q_norm", "layernorm", True, n * h_q, x.d_h, x.B_w, x.B_a),
                norm("attn.k_norm", "layernorm", True, n * h_k, x.d_h, x.B_w, x.B_a)]
    if mode == "head":
        return [norm("attn.q_norm", "rmsnorm", False, n * h_q, x.d_h, x.B_w, x.B_a),
                norm("attn.k_norm", "rmsnorm", False, n * h_k, x.d_h, x.B_w, x.B_a)]
    return [norm("attn.q_norm", "rmsnorm", False, n, h_q * x.d_h, x.B_w, x.B_a),
            norm("attn.k_norm", "rmsnorm", False, n, h_k * x.d_h, x.B_w, x.B_a)]


def rope(x, n, q_elems, k_elems, B_k) -> OpCost:
    """RoPE on the rotary part of queries and keys (in place; keys sit in the cache).

    Shapes: q [b,s,h,r], k [b,s,h_kv,r], cos/sin [s,r] -> same shapes (MLA: r = d_r, and k is the
    one shared RoPE key [b,s,d_r]).
    Returns: 3 FLOPs per rotated element (x*cos + rot(x)*sin). Source: Su et al. 2021, eq. 34.
    """
    f = FLOPS_PER_ELEMENT["rope"] * n * (q_elems + k_elems)
    return OpCost("attn.rope", OpClass.ELEMENTWISE, flops=f,
                  act_read_bytes=n * q_elems * x.B_a + 2 * x.s * x.r * x.B_a, act_write_bytes=n * q_elems * x.B_a,
                  kv_read_bytes=n * k_elems * B_k, kv_write_bytes=n * k_elems * B_k,
                  shapes="q, k rotary parts rotated by cos/sin [s,r]", kind="rope", row_width=q_elems + k_elems)


def attention_ops(cfg, x, local, kernel: str = "flash", mla_mode: str = "absorbed",
                  train: bool = False) -> list[OpCost]:
    """All attention operators of one layer, from its input x [b,s,d] to its output [b,s,d].

    Args: cfg an ArchConfig; x the dims (:class:`lmcost.operators.forward.Dims`); local the layer's attention kind
    (:data:`lmcost.model.config.ATTENTION_KINDS`: its mask, and no RoPE on a ``_nope`` kind) or a bool (whether
    the layer uses the sliding window); kernel ``flash`` or ``naive``; mla_mode ``absorbed`` or ``naive``.
    A NoPE layer of a model with ``temperature_tuning`` (Llama 4) scales its queries:
    ``attn.q_scale``, per position log1p(floor((pos+1)/floor_scale))*attn_scale + 1 (4 FLOPs per token:
    divide, floor, log1p, multiply-add... counted as 4), then q *= scale (1 FLOP per query element).
    With ``output_gate`` (Qwen3-Next), q_proj is twice as wide and ``attn.gate`` multiplies the output by
    sigmoid(gate) before o_proj. With ``clip_qkv`` (DBRX), ``attn.clip_qkv`` clamps q, k and v after their
    projections (:mod:`lmcost.operators.clip_qkv`).
    Returns: a list of OpCost (FLOPs, bytes) for one layer.
    """
    if cfg.attention.mla is not None:
        return _mla_ops(cfg, x, local, kernel, mla_mode, train)
    kind = local if isinstance(local, str) else mask_kind(local)
    rope_layer = not kind.endswith("_nope")
    a, n = cfg.attention, x.b * x.s
    h, h_kv, d_h, d_v = x.h, x.h_kv, x.d_h, value_width(cfg, x)
    gate = 2 if a.output_gate else 1  # Qwen3-Next: q_proj also yields the output gate
    ops = (moa_query_ops(cfg, x, n) if a.moa_experts else [  # JetMoE: query experts
        linear("attn.q_proj", n, x.d, gate * h * d_h, x.B_w, x.B_a, a.qkv_bias,
               shapes="x [b,s,d] @ W_q [d,2*h*d_h] -> q, gate" if a.output_gate else "x [b,s,d] @ W_q [d,h*d_h]"),
    ]) + [
        linear("attn.k_proj", n, x.d, h_kv * d_h, x.B_w, x.B_a, a.qkv_bias, out_bytes=x.B_kv,
               shapes="x [b,s,d] @ W_k [d,h_kv*d_h] -> K cache"),
        linear("attn.v_proj", n, x.d, h_kv * d_v, x.B_w, x.B_a, a.qkv_bias, out_bytes=x.B_kv,
               shapes="x [b,s,d] @ W_v [d,h_kv*d_v] -> V cache" if a.v_head_dim else "x [b,s,d] @ W_v [d,h_kv*d_h] -> V cache"),
    ]
    ops += clip_qkv(cfg, x, n)
    ops += _qk_norm(cfg, x, n, h, h_kv, rope_layer)
    if cfg.positions == "rope" and rope_layer:
        ops.append(rope(x, n, h * x.r, h_kv * x.r, x.B_kv))
    if a.temperature_tuning and not rope_layer:
        ops.append(OpCost("attn.q_scale", OpClass.ELEMENTWISE, flops=n * h * d_h + 4 * n,
                          act_read_bytes=n * h * d_h * x.B_a, act_write_bytes=n * h * d_h * x.B_a,
                          shapes="q [b,s,h,d_h] * (log1p(floor((pos+1)/floor_scale))*attn_scale + 1) [b,s]"))
    t_k = _keys_read(x, kind)
    ops += dynamic_mask_ops(cfg, x, h_kv, d_h, t_k)  # Doge
    k_el, v_el = kv_elements(x, mla=False, v_dim=d_v)
    core = attention_core(x, kind, kernel, h, d_h, d_v,
                 q_bytes=n * h * d_h * x.B_a,
                 k_bytes=x.b * t_k * k_el * x.B_kv, v_bytes=x.b * t_k * (half(v_el) if a.differential else v_el) * x.B_kv,
                 causal=cfg.causal, dropout=train and cfg.dropout, sinks=layer_sinks(cfg, kind),
                 softcap=a.logit_softcap is not None, alibi=cfg.positions == "alibi")
    ops += two_calls(core) + [combine(x, n, h, d_h)] if a.differential else core  # DiffLlama: one call per V half
    if a.output_gate:  # sigmoid (4 FLOPs) and multiply (1) per output element, reading o and the gate
        gate_op = elementwise("attn.gate", n * h * d_h, 2, FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["mul"],
                              x.B_a, shapes="o [b,s,h*d_h] * sigmoid(gate [b,s,h*d_h])", kind="sigmoid_mul")
        ops.append(gate_bias(gate_op, x, n, h, d_h) if a.output_gate_bias else gate_op)
    ops += softplus_gate_ops(cfg, x, n)  # Laguna
    ops += sub_norm(cfg, x, n, h * d_v, "attn.")  # BitNet's attn_sub_norm
    if a.moa_experts:  # JetMoE: output experts
        return ops + moa_output_ops(cfg, x, n)
    ops.append(linear("attn.o_proj", n, h * d_v, x.d, x.B_w, x.B_a, a.out_bias,
                      shapes="o [b,s,h*d_v] @ W_o [h*d_v,d]" if a.v_head_dim else "o [b,s,h*d_h] @ W_o [h*d_h,d]"))
    return ops


def gate_bias(gate_op: OpCost, x, n, h, d_h) -> OpCost:
    """``attn.gate`` with Beam's per-head gate bias (transformers BeamAttention: sigmoid(gate + gate_bias[h]),
    the bias broadcast over d_h): h parameters read once (weights), one add per gate element, in the same kernel."""
    return replace(gate_op, flops=gate_op.flops + n * h * d_h, params=h, weight_bytes=h * x.B_w,
                   shapes="o [b,s,h*d_h] * sigmoid(gate [b,s,h*d_h] + bias [h])")


def _mla_ops(cfg, x, local: bool, kernel: str, mla_mode: str, train: bool = False) -> list[OpCost]:
    """Multi-head latent attention (DeepSeek-V2, section 2.1; weights named as in HF's DeepseekV3Attention)."""
    a, n, h = cfg.attention, x.b * x.s, x.h
    d_qk = x.d_nope + x.d_r
    ops = []
    if a.mla.q_lora_rank:
        ops += [linear("attn.q_a_proj", n, x.d, x.d_q, x.B_w, x.B_a, a.qkv_bias, shapes="x [b,s,d] @ W_DQ [d,d_q]"),
                norm("attn.q_a_norm", "rmsnorm", False, n, x.d_q, x.B_w, x.B_a),
                linear("attn.q_b_proj", n, x.d_q, h * d_qk, x.B_w, x.B_a, shapes="c_q [b,s,d_q] @ W_UQ [d_q,h*(d_nope+d_r)]")]
    else:
        ops.append(linear("attn.q_proj", n, x.d, h * d_qk, x.B_w, x.B_a, shapes="x [b,s,d] @ W_q [d,h*(d_nope+d_r)]"))
    ops += [linear("attn.kv_a_proj", n, x.d, x.d_c + x.d_r, x.B_w, x.B_a, a.qkv_bias, out_bytes=x.B_kv,
                   shapes="x [b,s,d] @ W_DKV [d,d_c+d_r] -> latent cache"),
            norm("attn.kv_a_norm", "rmsnorm", False, n, x.d_c, x.B_w, x.B_a)]
    if cfg.positions == "rope":
        ops.append(rope(x, n, h * x.d_r, x.d_r, x.B_kv))
    t_k = _keys_read(x, local)
    if mla_mode == "absorbed":
        # W_UK [h, d_nope, d_c] folds into the query, W_UV [h, d_c, d_v] into the output (eq. 10-11).
        ops.append(_owned(linear("attn.q_absorb", n * h, x.d_nope, x.d_c, x.B_w, x.B_a,
                                 shapes="q_nope [b,s,h,d_nope] @ W_UK [h,d_nope,d_c] -> [b,s,h,d_c]"), h))
        ops += attention_core(x, local, kernel, h, x.d_c + x.d_r, x.d_c,
                     q_bytes=n * h * (x.d_c + x.d_r) * x.B_a,
                     k_bytes=x.b * t_k * kv_elements(x, mla=True)[0] * x.B_kv,
                     # flash reads the latent once, as keys and values; a naive value matmul reads it again
                     v_bytes=x.b * t_k * x.d_c * x.B_kv if kernel == "naive" else 0,
                     causal=cfg.causal, dropout=train and cfg.dropout, kv_streams=1)
        ops.append(_owned(linear("attn.out_absorb", n * h, x.d_c, x.d_v, x.B_w, x.B_a,
                                 shapes="o [b,s,h,d_c] @ W_UV [h,d_c,d_v] -> [b,s,h,d_v]"), h))
    else:
        # Up-project the cached latent of every key: c [b,t,d_c] @ W_UKV [d_c, h*(d_nope+d_v)].
        up = linear("attn.kv_b_proj", x.b * t_k, x.d_c, h * (x.d_nope + x.d_v), x.B_w, x.B_a,
                    shapes="c_KV [b,t,d_c] @ W_UKV [d_c,h*(d_nope+d_v)] -> k_nope, v [b,t,h,*]")
        ops.append(replace(up, act_read_bytes=0, kv_read_bytes=x.b * t_k * x.d_c * x.B_kv))
        ops += attention_core(x, local, kernel, h, d_qk, x.d_v,
                     q_bytes=n * h * d_qk * x.B_a,
                     k_bytes=x.b * t_k * (h * x.d_nope * x.B_a + x.d_r * x.B_kv),
                     v_bytes=x.b * t_k * h * x.d_v * x.B_a, causal=cfg.causal, dropout=train and cfg.dropout,
                     kv_streams=h)
    ops.append(linear("attn.o_proj", n, h * x.d_v, x.d, x.B_w, x.B_a, a.out_bias, shapes="o [b,s,h*d_v] @ W_o [h*d_v,d]"))
    return ops


def _owned(op: OpCost, heads) -> OpCost:
    """A per-head matmul built by ``linear`` with one head's weight: scale weights to all heads."""
    return replace(op, weight_bytes=op.weight_bytes * heads, params=op.params * heads)
