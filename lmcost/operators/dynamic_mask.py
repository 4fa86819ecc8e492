"""Dynamic mask attention (Doge; transformers ``DogeAttention``, ``prepare_dynamic_mask``): a learned bias per key
and KV head added to the scores, computed from the values.

Each pass projects the values of every key it reads, v [b,t,h_kv*d_h] (the cached ones and its own), to one
logit per KV head, dt = v @ W_dt [h_kv*d_h, h_kv] (+ bias), and turns it into a bias exp(A * softplus(dt))
[b,h_kv,t] (A [h_kv] learned); every query head of a KV head adds it to its scores. Past keep_window_size keys,
only the keep_window_size keys of largest bias stay unmasked (a top-k per row); transformers still computes
every score (the mask is added to a dense score matrix), and so does lmcost. The bias is recomputed from the
values each pass: the cache keeps K and V only.

FLOPs: 2*b*t*h_kv*d_h*h_kv (``attn.dt_proj``, a matmul over the t keys read); 5 per bias element (softplus 3,
multiply, exp) and 1 per score it is added to (``attn.dynamic_mask``, elementwise).
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ops import OpClass, OpCost, linear


def dynamic_mask_ops(cfg, x, h_kv, d_h, t_k) -> list[OpCost]:
    """The dynamic mask of one layer with ``h_kv`` KV heads of width ``d_h`` reading ``t_k`` keys per sequence
    (x.t; min(t, s + w - 1) on a sliding layer, as transformers' sliding cache returns them): ``attn.dt_proj``
    (reads the keys' values from the cache) and ``attn.dynamic_mask`` (A [h_kv] params; the bias over
    [b,h_kv,t_k], added to the [b,h,s,t_k] scores). Empty unless ``attention.dynamic_mask``."""
    a = cfg.attention
    if not a.dynamic_mask:
        return []
    n_keys = x.b * t_k
    dt = linear("attn.dt_proj", n_keys, h_kv * d_h, h_kv, x.B_w, x.B_a, a.qkv_bias,
                shapes="v [b,t,h_kv*d_h] @ W_dt [h_kv*d_h,h_kv] -> dt [b,t,h_kv]")
    dt = replace(dt, act_read_bytes=0, kv_read_bytes=n_keys * h_kv * d_h * x.B_kv)
    bias, scores = n_keys * h_kv, x.b * x.h * x.s * t_k
    return [dt, OpCost("attn.dynamic_mask", OpClass.ELEMENTWISE, flops=5 * bias + scores,
                       act_read_bytes=bias * x.B_a, act_write_bytes=bias * x.B_a, weight_bytes=h_kv * x.B_w,
                       params=h_kv, shapes="exp(A [h_kv] * softplus(dt)) [b,h_kv,t], added to the scores [b,h,s,t]")]
