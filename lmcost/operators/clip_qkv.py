"""QKV clipping (DBRX): queries, keys and values clamped to [-c, c] after their projections.

transformers' DbrxAttention runs ``qkv_states.clamp(min=-clip_qkv, max=clip_qkv)`` on the fused Wqkv output
[b,s,(h + 2 h_kv) d_h] before splitting it and applying RoPE (vLLM's DBRX clamps the same tensor in place).
"""

from __future__ import annotations

from lmcost.operators.ops import OpClass, OpCost

#: A clamp is a max and a min per element.
CLAMP_FLOPS = 2


def clip_qkv(cfg, x, n) -> list[OpCost]:
    """The clamp of one layer's q, k and v (``cfg.attention.clip_qkv``; none when it is null).

    Shapes: q [n, h*d_h] (activation dtype), k and v [n, h_kv*d_h] each (they go on to the cache: KV dtype),
    n = b*s tokens; each is read and written once. FLOPs: 2 per element (max, then min).
    Source: transformers' DbrxAttention.forward (the clamp of the Wqkv output).
    """
    if cfg.attention.clip_qkv is None:
        return []
    q, kv = n * x.h * x.d_h, 2 * n * x.h_kv * x.d_h
    return [OpCost("attn.clip_qkv", OpClass.ELEMENTWISE, flops=CLAMP_FLOPS * (q + kv),
                   act_read_bytes=q * x.B_a, act_write_bytes=q * x.B_a,
                   kv_read_bytes=kv * x.B_kv, kv_write_bytes=kv * x.B_kv,
                   shapes="q [b,s,h*d_h], k, v [b,s,h_kv*d_h] clamped to [-clip_qkv, clip_qkv]")]
