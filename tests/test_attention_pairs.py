"""The flash attention FLOP count (causal pairs) against counts that never read lmcost's formula.

lmcost's ``attn.sdpa`` record (lmcost.operators.attention.attention_core) counts 2·b·h·P·(d_qk + d_v) FLOPs
(QKᵀ and PV, 2 FLOPs per MAC; 4·b·h·P·d_h when d_qk = d_v = d_h) over the P query-key pairs per
sequence and head the mask keeps, and 5·b·h·P for its fused softmax. Three independent counts:

1. The pairs of a boolean mask built with torch over positions: query j (0-based, the last s of t
   positions) sees key i iff i <= j (causal) and j - i < w (a sliding window): causal prefill,
   a chunk over a cache (prefill with an offset), a decode step, windows narrower and wider than the
   context, GQA and MLA head shapes. Bidirectional attention counts every key read by every query.
2. torch.utils.flop_counter.FlopCounterMode over attention done one query row at a time, each row
   multiplying only its visible keys (FlopCounterMode counts SDPA in full s x t, so SDPA cannot be the
   oracle); the rows give SDPA's output with the same mask.
3. The reference decoder's absorbed MLA flash kernel (explicit matmuls over the latent, in tiles of
   queries that read only the keys they see) under FlopCounterMode: with one query per tile its
   FLOPs are exactly the analytic flash count; with bigger tiles, the analytic count plus the masked
   part of each tile, counted from the mask.
"""

from __future__ import annotations

import pytest

from lmcost.operators.attention import attention_ops
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.operators.forward import Dims, forward_ops

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcost.profiling.decoder import build_decoder  # noqa: E402

B = 2
GQA = dict(n_heads=4, n_kv_heads=2, head_dim=8)
MLA = dict(n_heads=4, mla=dict(kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12))

# (name, s new tokens, context t, window w or None)
PASSES = [
    ("prefill", 16, 16, None), ("chunk", 5, 16, None), ("decode", 1, 16, None),
    ("local prefill", 16, 16, 4), ("local chunk", 5, 16, 4), ("local decode", 1, 16, 4),
    ("local decode, t < w", 1, 3, 4), ("window wider than the context", 16, 16, 64), ("window 1", 6, 9, 1),
]


def visible(s: int, t: int, w, causal: bool = True) -> torch.Tensor:
    """bool [s, t]: query j in t-s..t-1 sees key i in 0..t-1 (causal: i <= j; window: |j - i| < w)."""
    q = torch.arange(t - s, t)[:, None]
    k = torch.arange(t)[None, :]
    mask = k <= q if causal else torch.ones(s, t, dtype=torch.bool)
    if w is not None:
        mask &= (q - k).abs() < w
    return mask


def config(attention: dict, w, causal: bool = True) -> ArchConfig:
    return ArchConfig.model_validate(dict(name="pairs", d_model=64, n_layers=1, vocab_size=128, causal=causal,
                                          attention=dict(**attention, sliding_window=w), ffn=dict(activation="swiglu", d_ff=96)))


def sdpa_record(cfg: ArchConfig, s: int, t: int, local: bool):
    ops = attention_ops(cfg, Dims.of(cfg, Precision(), B, s, t), local, kernel="flash")
    return next(op for op in ops if op.name == "attn.sdpa"), next(op for op in ops if op.name == "attn.softmax")


@pytest.mark.parametrize("attention", [GQA, MLA], ids=["gqa", "mla"])
@pytest.mark.parametrize("name,s,t,w", PASSES, ids=[p[0] for p in PASSES])
def test_flash_flops_are_the_masked_pairs(attention, name, s, t, w):
    cfg = config(attention, w)
    pairs = int(visible(s, t, w).sum())
    h = cfg.attention.n_heads
    if cfg.attention.mla:  # absorbed: keys are the latent and the RoPE key, values the latent
        m = cfg.attention.mla
        d_qk, d_v = m.kv_lora_rank + m.qk_rope_head_dim, m.kv_lora_rank
    else:
        d_qk = d_v = cfg.d_h
    sdpa, softmax = sdpa_record(cfg, s, t, local=w is not None)
    assert sdpa.flops == 2 * B * h * pairs * (d_qk + d_v)
    assert softmax.flops == 5 * B * h * pairs
    if d_qk == d_v:
        assert sdpa.flops == 4 * B * h * pairs * d_qk


@pytest.mark.parametrize("w", [None, 4])
def test_bidirectional_flash_flops_are_every_key_read(w):
    s = t = 12
    cfg = config(GQA, w, causal=False)
    keys_read = int(visible(s, t, w, causal=False).any(0).sum())  # keys some query sees
    sdpa, _ = sdpa_record(cfg, s, t, local=w is not None)
    assert sdpa.flops == 4 * B * cfg.attention.n_heads * s * keys_read * cfg.d_h


def row_attention(q, k, v, mask):
    """Attention one query row at a time over only its visible keys. q [b, h, s, d], k/v [b, h, t, d]."""
    rows = []
    for j in range(q.shape[2]):
        keys = mask[j].nonzero().flatten()
        kj, vj = k[:, :, keys], v[:, :, keys]
        p = torch.softmax(q[:, :, j:j + 1] @ kj.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        rows.append(p @ vj)
    return torch.cat(rows, 2)


@pytest.mark.parametrize("name,s,t,w", PASSES, ids=[p[0] for p in PASSES])
def test_flash_flops_equal_a_flop_counter_over_the_visible_pairs(name, s, t, w):
    cfg = config(GQA, w)
    h, h_kv, d = cfg.attention.n_heads, cfg.h_kv, cfg.d_h
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, h, s, d, generator=g)
    k, v = (torch.randn(B, h_kv, t, d, generator=g).repeat_interleave(h // h_kv, 1) for _ in range(2))
    mask = visible(s, t, w)
    with FlopCounterMode(display=False) as counter:
        out = row_attention(q, k, v, mask)
    torch.testing.assert_close(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    sdpa, _ = sdpa_record(cfg, s, t, local=w is not None)
    assert counter.get_total_flops() == sdpa.flops


# The decoder: one global and one local MLA layer (w = 4), prefill 9 from 0, a chunk of 5 at position 9
# (the local layer gathers older keys from its rolling buffer), a decode step at context 15.
MLA_LAYERS = dict(attention=dict(**MLA, sliding_window=4, layer_pattern=["global", "local"]), ffn=dict(activation="swiglu", d_ff=96))
STEPS = [(0, 9), (9, 5), (14, 1)]  # (start position, new tokens)


def tile_pairs(mask: torch.Tensor, q_block: int) -> int:
    """Pairs a flash kernel computes in tiles of q_block queries, each over the keys from the first its
    queries see to the last: the tile's rectangle, masked part included."""
    total = 0
    for r0 in range(0, mask.shape[0], q_block):
        cols = mask[r0:r0 + q_block].any(0).nonzero().flatten()
        total += mask[r0:r0 + q_block].shape[0] * int(cols[-1] - cols[0] + 1)
    return total


@pytest.mark.parametrize("q_block", [1, 4, None])
def test_latent_flash_kernel_flops_are_the_causal_pairs(q_block):
    cfg = ArchConfig.model_validate(dict(name="mla", d_model=64, n_layers=2, vocab_size=128, **MLA_LAYERS))
    model = build_decoder(cfg, max_batch=B, max_context=16, kernel="flash", mla_mode="absorbed", q_block=q_block)
    m, h = cfg.attention.mla, cfg.attention.n_heads
    per_pair = 2 * B * h * (2 * m.kv_lora_rank + m.qk_rope_head_dim)  # QKᵀ over d_c + d_r, PV over d_c
    ids = torch.randint(0, 128, (B, 15), generator=torch.Generator().manual_seed(1))
    for p, s in STEPS:
        t = p + s
        with FlopCounterMode(display=False) as counter:
            model(ids[:, p:t], p)
        ops = forward_ops(cfg, Dims.of(cfg, Precision(), B, s, t), "flash", "absorbed")
        analytic = sum(op.flops * op.count for op in ops if op.matmul)
        extra = 0
        for w in (None, 4):
            mask = visible(s, t, w)
            mask = mask[:, mask.any(0).nonzero().flatten()]  # the keys the kernel reads (in position order)
            computed = tile_pairs(mask, q_block or 32) if s > 1 else int(mask.shape[1])
            extra += per_pair * (computed - int(mask.sum()))
        if q_block == 1:
            assert extra == 0
        assert counter.get_total_flops() == analytic + extra, (p, s)
