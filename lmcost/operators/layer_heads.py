"""Attention heads that differ by layer or by role: value heads narrower than the query/key heads, more KV heads
and attention sinks on the sliding-window layers only (MiMo-V2-Flash; transformers ``MiMoV2FlashAttention``).

Shapes of such a layer (h query heads of width d_h; h_kv' KV heads, h_kv' = local_kv_heads on a local layer and
n_kv_heads elsewhere; values of width d_v = v_head_dim):
q_proj [d, h*d_h], k_proj [d, h_kv'*d_h], v_proj [d, h_kv'*d_v], o_proj [h*d_v, d]; scores q [b,h,s,d_h] @ kᵀ
[b,h_kv',d_h,t], output p [b,h,s,t] @ v [b,h_kv',t,d_v] -> [b,h,s,d_v]. The cache keeps h_kv'*(d_h + d_v)
elements per token per layer. MiMo-V2-Flash also scales its values by a constant (attention_value_scale): one
multiply per value element, not counted (no matmul, fused into v_proj's epilogue in any serving kernel).
A layer's KV heads h_kv' are set with the other per-layer widths by :func:`lmcost.operators.per_layer.layer_dims`.
"""

from __future__ import annotations

from lmcost.model.schema import mask_of


def value_width(cfg, x):
    """Per-head value width: x.d_v where ``attention.v_head_dim`` is set (non-MLA), else d_h."""
    return x.d_v if cfg.attention.v_head_dim else x.d_h


def layer_sinks(cfg, kind) -> bool:
    """Whether a layer of attention kind ``kind`` (or a bool: local or not) has sinks: ``attention.sinks`` true,
    or ``local`` and the layer slides."""
    s = cfg.attention.sinks
    if s == "local":
        local = mask_of(kind) == "local" if isinstance(kind, str) else bool(kind)
        return local
    return bool(s)
