"""Operators of Gemma 3n / Gemma 4's layer mechanisms (schema: :mod:`lmcost.model.layer_sharing`): KV sharing
across layers, K=V attention, global layers of their own width, and per-layer input embeddings (PLE).

Sources: transformers 5.24 ``models/gemma4/modeling_gemma4.py`` (Gemma4TextAttention, Gemma4TextMLP,
Gemma4TextDecoderLayer, Gemma4TextModel.get_per_layer_inputs / project_per_layer_inputs) and
``cache_utils.get_layer_types_and_kwargs`` (a KV-shared layer's cache is a DummyLayer: it stores nothing).
2 FLOPs per MAC, as everywhere (:func:`lmcost.operators.ops.linear`).
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.model.layer_sharing import SHARED
from lmcost.operators.attention import mask_kind, rope
from lmcost.operators.ffn import activation
from lmcost.operators.ops import elementwise, linear, lookup, norm
from lmcost.operators.sparse_attention import layer_attention_ops as dense_or_sparse


def is_kv_shared(kind: str) -> bool:
    """Whether a layer of this kind reuses an earlier layer's K/V (computes none, caches none)."""
    return kind.endswith(SHARED)


def layer_dims(cfg, x, kind: str):
    """The dims ``x`` as a layer of ``kind`` sees them, the one place per-layer widths are set (the block's
    operators, the KV cache and memory read them): a global layer takes ``attention.global_head_dim``
    (d_h, and the rotary width r = d_h * rotary_fraction) and ``global_n_kv_heads`` (h_kv); a local layer takes
    ``attention.local_kv_heads`` (MiMo-V2-Flash, :mod:`lmcost.operators.layer_heads`), written as a multiple of
    x.h_kv where it is one (so it follows tensor parallelism's split of h_kv); a KV-shared layer with
    ``ffn.kv_shared_double`` has an FFN of 2*d_ff (and, in Gemma 4's MoE layout, a shared expert of 2*d_sh).
    Other layers: ``x`` itself. Apply it once per layer: it scales h_kv and d_ff."""
    a = cfg.attention
    changes = {}
    if mask_kind(kind) == "local" and a.local_kv_heads is not None:
        base = cfg.h_kv
        changes["h_kv"] = x.h_kv * (a.local_kv_heads // base) if a.local_kv_heads % base == 0 else a.local_kv_heads
    if mask_kind(kind) == "global":
        if a.global_head_dim is not None:
            changes.update(d_h=a.global_head_dim, r=int(a.global_head_dim * cfg.rotary_fraction)
                           if cfg.positions == "rope" else 0)
        if a.global_n_kv_heads is not None:
            changes["h_kv"] = a.global_n_kv_heads
    if is_kv_shared(kind) and cfg.ffn.kv_shared_double:
        changes["d_ff"] = 2 * x.d_ff
        if cfg.moe is not None and cfg.moe.normed_branches:  # Gemma 4's dense MLP is the shared expert
            changes["d_sh"] = 2 * x.d_sh
    return replace(x, **changes) if changes else x


def layer_attention_ops(cfg, x, kind: str, kernel: str, mla_mode: str, train: bool):
    """The attention operators of a layer of ``kind`` (:func:`lmcost.operators.attention.attention_ops`, or DSA's
    :func:`lmcost.operators.sparse_attention.layer_attention_ops`), with
    Gemma's mechanisms applied:

    - KV-shared layer: no k_proj, v_proj or k_norm (their 2*b*s*d*h_kv*d_h FLOPs each are gone), RoPE on the
      queries only; the kernel reads the producer's K/V as any layer reads its own (same mask, same t).
    - K=V on a global layer: no v_proj; values are the key projection's output.
    - ``v_norm``: a weightless RMSNorm over each value head, 3 FLOPs per element ([b,s,h_kv,d_h]), writing V
      into the cache, on the layers that compute K/V.
    Shapes and FLOPs otherwise as attention_ops.
    """
    a = cfg.attention
    base = kind.removesuffix(SHARED)
    ops = dense_or_sparse(cfg, x, base, kernel, mla_mode, train)  # DSA's indexer where attention.sparse is set
    shared = is_kv_shared(kind)
    k_eq_v = a.k_eq_v == "global" and mask_kind(base) == "global"
    if not (shared or k_eq_v or a.v_norm):
        return ops
    n = x.b * x.s
    drop = {"attn.k_proj", "attn.v_proj", "attn.k_norm"} if shared else ({"attn.v_proj"} if k_eq_v else set())
    out = []
    for op in ops:
        if op.role in drop:
            continue
        if shared and op.role == "attn.rope":
            op = rope(x, n, x.h * x.r, 0, x.B_kv)
        out.append(op)
        if op.role == "attn.k_proj" and a.v_norm:
            v = norm("attn.v_norm", "rmsnorm", False, n * x.h_kv, x.d_h, x.B_w, x.B_a, weight=False,
                     shapes="v [b,s,h_kv,d_h] * rsqrt(mean(v^2)) (no weight) -> V cache")
            out.append(replace(v, act_write_bytes=0, kv_write_bytes=n * x.h_kv * x.d_h * x.B_kv))
    return out


def per_layer_input_ops(cfg, x) -> list:
    """The model-level half of PLE (Gemma4TextModel.get_per_layer_inputs and project_per_layer_inputs): each
    layer's input [b,s,L,p] from the token ids and the embedded tokens x0 [b,s,d].

    Ops: ``ple.embed`` gathers [b,s,L*p] of the table [V_p, L*p] (V_p*L*p params); ``ple.model_proj``
    x0 @ W [d, L*p] (2*b*s*d*L*p FLOPs, d*L*p params); ``ple.proj_norm`` RMSNorm over p of each of the b*s*L
    slices (p params), after a scale by 1/sqrt(d) (``ple.proj_scale``, 1 FLOP per element); ``ple.combine``
    (proj + emb) / sqrt(2), 2 FLOPs per element. None without ``cfg.per_layer_input``.
    """
    ple = cfg.per_layer_input
    if ple is None:
        return []
    n, w = x.b * x.s, x.L * ple.width
    return [
        lookup("ple.embed", n, w, ple.vocab, x.B_w, x.B_a, shapes="table [V_p,L*p] gathered at [b,s] -> [b,s,L*p]"),
        linear("ple.model_proj", n, x.d, w, x.B_w, x.B_a, shapes="x0 [b,s,d] @ W_ple [d,L*p] -> [b,s,L*p]"),
        elementwise("ple.proj_scale", n * w, 1, 1, x.B_a, shapes="[b,s,L*p] / sqrt(d)"),
        norm("ple.proj_norm", "rmsnorm", False, n * x.L, ple.width, x.B_w, x.B_a, shapes="[b,s,L,p] -> [b,s,L,p]"),
        elementwise("ple.combine", n * w, 2, 2, x.B_a, shapes="(proj + emb) [b,s,L,p] / sqrt(2)"),
    ]


def per_layer_block_ops(cfg, x) -> list:
    """The per-layer half of PLE, after the layer's FFN (Gemma4TextDecoderLayer.forward): y [b,s,d] +
    RMSNorm_d(act(y @ W_gate [d,p]) * input_i [b,s,p] @ W_proj [p,d]) (:func:`per_layer_gate_ops`). None without
    ``cfg.per_layer_input``, or with ``cfg.altup`` (Gemma 3n's block adds it to its copies itself)."""
    if cfg.per_layer_input is None or cfg.altup is not None:
        return []
    return per_layer_gate_ops(cfg, x, 1)


def per_layer_gate_ops(cfg, x, streams: int) -> list:
    """A layer's use of its per-layer input, added to ``streams`` residual streams [b,s,d] (Gemma 4: 1; Gemma 3n:
    AltUp's copies 1..K-1).

    Ops: ``ple.gate`` (2*b*s*d*p FLOPs, d*p params), ``ple.act`` (act and multiply per [b,s,p] element, a gated
    activation's kernel), ``ple.proj`` (2*b*s*p*d, p*d params), ``ple.post_norm`` (RMSNorm, d params),
    ``ple.residual`` (streams x b*s*d adds).
    """
    ple = cfg.per_layer_input
    n, p = x.b * x.s, ple.width
    return [
        linear("ple.gate", n, x.d, p, x.B_w, x.B_a, shapes="y [b,s,d] @ W_gate [d,p]"),
        activation("ple.act", n * p, ple.activation, True, x.B_a, shapes=f"{ple.activation}(gate) * input_i [b,s,p]"),
        linear("ple.proj", n, p, x.d, x.B_w, x.B_a, shapes="[b,s,p] @ W_proj [p,d]"),
        norm("ple.post_norm", cfg.norm, cfg.norm_bias, n, x.d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]"),
        elementwise("ple.residual", streams * n * x.d, 2, 1, x.B_a, shapes="streams [.,b,s,d] + f(y) [b,s,d]",
                    kind="add"),
    ]


def normed_branch_ops(cfg, x) -> list:
    """What Gemma 4's MoE layer adds to :func:`lmcost.operators.ffn.moe_ops` (its dense MLP is the shared expert
    there; Gemma4TextDecoderLayer.forward, Gemma4TextRouter): ``moe.shared_post_norm`` on the MLP's output,
    ``moe.experts_pre_norm`` on the layer input the experts read and ``moe.experts_post_norm`` on their output
    (RMSNorms, d params each); the router's weightless RMSNorm and learned scale over its input
    (``moe.router_norm``: 3 + 2 FLOPs per element, d params) and its per-expert scale of the k weights
    (``moe.expert_scale``: E params, 1 FLOP per weight). None unless ``cfg.moe.normed_branches``."""
    if cfg.moe is None or not cfg.moe.normed_branches:
        return []
    n = x.b * x.s
    router = norm("moe.router_norm", "rmsnorm", False, n, x.d, x.B_w, x.B_a, weight=False,
                  shapes="x [b,s,d] * rsqrt(mean(x^2)) * scale [d] / sqrt(d)")
    scale = elementwise("moe.expert_scale", n * x.k, 1, 1, x.B_a, shapes="weights [b,s,k] * scale[idx] [E]")
    return [norm(name, "rmsnorm", False, n, x.d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]")
            for name in ("moe.shared_post_norm", "moe.experts_pre_norm", "moe.experts_post_norm")] + [
        replace(router, flops=router.flops + 2 * n * x.d, params=x.d, weight_bytes=x.d * x.B_w),
        replace(scale, params=x.E, weight_bytes=x.E * x.B_w)]
