"""One pass of the reference decoder (:mod:`lmcost.profiling.decoder`) through its KV cache: which slots
every layer of a kind (global, local, chunked) reads and writes (:class:`_Plan`, :class:`_Pass`), and the
attention kernels over them: SDPA pinned to a backend, explicit matmuls (sinks, soft-capping, naive), and
absorbed MLA's tiles over the latent (:func:`_latent_attention`).
"""

from __future__ import annotations

import math

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F



# ---------------------------------------------------------------------------------------------------
# One pass: what every layer of a kind (global/local) reads and writes


@dataclass
class _Plan:
    """How a layer with a cache of C positions handles one pass of s tokens at start_pos p.

    direct: the new tokens go into slots write_at..write_at+s-1 (contiguous) in the projection
    scopes, and the kernel reads slots 0..n_keys-1. Otherwise (local layer, s > 1, p + s > C) the
    kernel gathers n_old older keys (slots old_slots, in position order), appends the s new ones and
    writes new[:, new_from:] into new_slots.
    mask: bool [s, n_keys], True where a query attends (None: every key read is visible);
    causal: the mask is exactly lower-triangular over s = n_keys keys (SDPA's is_causal);
    tiled: the mask is causal (a window or a cache offset besides), so a flash kernel computes only
    the keys each block of queries sees (:func:`_tiles`, cached per block size in ``tiles``).
    """

    direct: bool
    n_keys: int
    write_at: int = 0
    n_old: int = 0
    old_slots: Optional[torch.Tensor] = None
    new_slots: Optional[torch.Tensor] = None
    new_from: int = 0
    mask: Optional[torch.Tensor] = None
    masked_out: Optional[torch.Tensor] = None
    causal: bool = False
    tiled: bool = False
    tiles: dict = field(default_factory=dict)

    @property
    def variant(self) -> str:
        """The SDPA call this pass makes (:data:`lmcost.profiling.backends.VARIANTS`)."""
        return "causal" if self.causal else "masked" if self.mask is not None else "full"


def _plan(p: int, s: int, C: int, w: Optional[int], causal: bool, device) -> _Plan:
    """Bidirectional attention (``causal=False``) drops the causal condition: a query sees every key of
    the pass within the window, |key - query| < w on a local layer."""
    t = p + s
    if w is None or s == 1 or t <= C:
        n_keys = min(t, C)
        if s == 1 or (not causal and w is None):
            # Global: positions 0..t-1. Local: the buffer holds the last min(t, C) <= w positions,
            # all inside the window of position p. Every key read is visible.
            return _Plan(True, n_keys, write_at=p % C)
        plan = _Plan(True, n_keys, write_at=p)  # t <= C: slot j holds position j
        kpos = torch.arange(t)
    else:
        n_old = min(p, w - 1)
        kpos = torch.arange(p - n_old, t)
        n_write = min(s, C)
        plan = _Plan(False, n_old + s, n_old=n_old, old_slots=(kpos[:n_old] % C).to(device),
                     new_slots=(torch.arange(t - n_write, t) % C).to(device), new_from=s - n_write)
    qpos = torch.arange(p, t)
    mask = kpos[None, :] <= qpos[:, None] if causal else torch.ones(s, kpos.numel(), dtype=torch.bool)
    if w is not None:
        mask &= (kpos[None, :] - qpos[:, None]).abs() < w
    if bool(mask.all()):
        return plan  # every key visible: no mask
    plan.causal = kpos.numel() == s and bool(torch.equal(mask, torch.ones(s, s, dtype=torch.bool).tril()))
    plan.tiled = causal
    plan.mask = mask.to(device)
    plan.masked_out = (~mask).to(device)
    return plan


def _chunk_plan(p: int, s: int, C: int, causal: bool, device) -> _Plan:
    """A chunked layer (Llama 4): the query at position j sees the keys of its own chunk of C positions,
    [floor(j / C)*C, j]. The cache is a rolling buffer of C slots (position j in slot j mod C), so the
    current chunk always sits in slots 0..j mod C. A pass within one chunk writes its tokens at p mod C and
    reads slots 0..t-1 - c0 (c0: the chunk start of position p); a pass that crosses a chunk boundary
    gathers the p - c0 older keys of the first chunk (slots 0..p-c0-1), appends its own and writes its
    last min(s, C) tokens. Keys read: t - c0 = t - floor((t - s)/C)*C, as the analytic count.
    Raises: ValueError for a bidirectional chunked layer (not modelled)."""
    if not causal:
        raise ValueError("chunked attention is modelled for causal layers only")
    t = p + s
    c0 = p // C * C
    kpos = torch.arange(c0, t)
    if t <= c0 + C:
        plan = _Plan(True, t - c0, write_at=p - c0)
    else:
        n_write = min(s, C)
        plan = _Plan(False, t - c0, n_old=p - c0, old_slots=torch.arange(p - c0).to(device),
                     new_slots=(torch.arange(t - n_write, t) % C).to(device), new_from=s - n_write)
    qpos = torch.arange(p, t)
    mask = (kpos[None, :] <= qpos[:, None]) & (kpos[None, :] // C == qpos[:, None] // C)
    if bool(mask.all()):
        return plan
    plan.causal = kpos.numel() == s and bool(torch.equal(mask, torch.ones(s, s, dtype=torch.bool).tril()))
    plan.tiled = True
    plan.mask = mask.to(device)
    plan.masked_out = (~mask).to(device)
    return plan


@dataclass
class _Pass:
    b: int
    s: int
    p: int
    kernel: str
    mla_mode: str
    plans: dict          # {False: global plan, True: local plan, "chunked": chunked plan}
    cos: Optional[torch.Tensor]   # [s, r] rows of the rotary tables (None without RoPE)
    sin: Optional[torch.Tensor]
    pins: Optional[dict] = None   # {variant: pin()} when SDPA calls pin backends per call (else pinned per forward)
    q_block: int = 1              # queries per tile of the latent flash kernel (_latent_attention)


def _assemble(buf: torch.Tensor, new: torch.Tensor, plan: _Plan) -> torch.Tensor:
    """Deferred plan: older keys from the rolling buffer, then the new ones; then write the new ones."""
    b = new.shape[0]
    span = torch.cat([buf[:b].index_select(1, plan.old_slots), new], 1) if plan.n_old else new
    buf[:b].index_copy_(1, plan.new_slots, new[:, plan.new_from:])
    return span


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """RoPE (rotate-half form) on x [..., s, heads, r] in place; cos/sin [s, r]."""
    r = cos.shape[-1]
    x = x[..., :r]
    c, sn = cos[:, None, :], sin[:, None, :]
    x1, x2 = x[..., : r // 2], x[..., r // 2:]
    x.copy_(x * c + torch.cat([-x2, x1], -1) * sn)


def alibi_slopes(h: int) -> torch.Tensor:
    """ALiBi's per-head slopes [h] (fp32): the geometric sequence 2^(-8/n * i), i = 1..n, for the n = 2^k <= h
    heads, then every other slope of the sequence for 2n heads for the rest (Press et al. 2022, section 3 and
    its code; transformers' bloom ``_get_alibi_slopes``)."""
    n = 2 ** math.floor(math.log2(h))
    base = [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]
    extra = [2.0 ** (-4.0 * i / n) for i in range(1, 2 * (h - n), 2)]
    return torch.tensor(base + extra, dtype=torch.float32)


def _alibi_bias(scores, slopes, b, hkv, g, s, t_k):
    """Add ALiBi's bias m_h * j (key position j; the query's own -m_h * i is the same for its whole row, which the
    softmax ignores, as transformers' BLOOM does) to scores [b*h_kv, g*s, t_k] of a global layer whose keys
    are positions 0..t_k-1."""
    bias = slopes.view(1, hkv, g, 1, 1) * torch.arange(t_k, device=scores.device, dtype=torch.float32)
    return (scores.view(b, hkv, g, s, t_k) + bias.to(scores.dtype)).view(b * hkv, g * s, t_k)


def _key_bias(scores, bias, b, hkv, g, s, t_k):
    """Add Doge's dynamic mask, a bias per key and KV head (bias [b, t_k, h_kv]), to scores [b*h_kv, g*s, t_k]."""
    return (scores.view(b, hkv, g, s, t_k) + bias.permute(0, 2, 1)[:, :, None, None, :].to(scores.dtype)).view(
        b * hkv, g * s, t_k)


def _explicit(q, k, v, plan: _Plan, scale: float, sinks=None, softcap=None, alibi=None, key_bias=None) -> torch.Tensor:
    """Attention as explicit matmuls over every key read (no SDPA: it has no sink or soft-cap input), the
    g query heads of a K/V head folded into the rows. q [b, s, h, d_qk]; k, v [b, t_k, h_kv, d]; sinks [h]
    (a logit joining each row's softmax, dropped after it: transformers' GptOss eager_attention_forward);
    softcap c: scores = c * tanh(scores / c) before the mask (Gemma-2). Returns o [b, s, h*d_v]."""
    b, s, h, dq = q.shape
    t_k, hkv, dv = k.shape[1], k.shape[2], v.shape[-1]
    g = h // hkv
    qh = q.reshape(b, s, hkv, g, dq).permute(0, 2, 3, 1, 4).reshape(b * hkv, g * s, dq)
    scores = torch.bmm(qh, k.permute(0, 2, 3, 1).reshape(b * hkv, dq, t_k)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi is not None:
        scores = _alibi_bias(scores, alibi, b, hkv, g, s, t_k)
    if key_bias is not None:
        scores = _key_bias(scores, key_bias, b, hkv, g, s, t_k)
    if plan.masked_out is not None:
        scores.view(b, hkv, g, s, t_k).masked_fill_(plan.masked_out, float("-inf"))
    if sinks is not None:
        sink = sinks.view(1, hkv, g, 1, 1).expand(b, hkv, g, s, 1).reshape(b * hkv, g * s, 1)
        probs = torch.softmax(torch.cat([scores, sink.to(scores.dtype)], -1), dim=-1)[..., :t_k]
    else:
        probs = torch.softmax(scores, dim=-1)
    o = torch.bmm(probs, v.permute(0, 2, 1, 3).reshape(b * hkv, t_k, dv))
    return o.view(b, hkv, g, s, dv).permute(0, 3, 1, 2, 4).reshape(b, s, h * dv)


def _core(sc, P: _Pass, plan: _Plan, q: torch.Tensor, keys: Callable, values: Callable, scale: float,
          sinks=None, softcap=None, alibi=None, key_bias=None) -> torch.Tensor:
    """The attention kernel. q [b, s, h, d_qk]; keys() [b, t_k, h_kv, d_qk]; values() [b, t_k, h_kv, d_v]
    (called inside the scope that reads them). Returns o [b, s, h*d_v]. With ``sinks`` [h] or ``softcap``
    the flash kernel is explicit matmuls in the ``attn.sdpa`` scope (:func:`_explicit`), and the naive one
    caps its scores in ``attn.softcap``, adds ALiBi's bias (``alibi``: slopes [h]) in ``attn.alibi`` and appends the
    sink logit inside ``attn.softmax``."""
    b, s, h, dq = q.shape
    if P.kernel == "flash" and (sinks is not None or softcap is not None or alibi is not None or key_bias is not None):
        with sc("attn.sdpa"):
            return _explicit(q, keys(), values(), plan, scale, sinks, softcap, alibi, key_bias)
    if P.kernel == "flash":
        # The backend is pinned outside the scope: entering sdpa_kernel costs tens of microseconds.
        with (P.pins[plan.variant]() if P.pins else nullcontext()), sc("attn.sdpa"):
            k, v = keys(), values()
            hkv, dv = k.shape[2], v.shape[-1]
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                attn_mask=None if plan.causal else plan.mask, is_causal=plan.causal, scale=scale,
                enable_gqa=hkv != h)
            return o.transpose(1, 2).reshape(b, s, h * dv)
    with sc("attn.score"):
        k = keys()
        t_k, hkv = k.shape[1], k.shape[2]
        g = h // hkv
        # The g query heads sharing a K/V head become g*s rows of one matmul: K is never repeated.
        qh = q.reshape(b, s, hkv, g, dq).permute(0, 2, 3, 1, 4).reshape(b * hkv, g * s, dq)
        kt = k.permute(0, 2, 3, 1).reshape(b * hkv, dq, t_k)
        zero = torch.zeros((), dtype=q.dtype, device=q.device).expand(b * hkv, g * s, t_k)
        scores = torch.baddbmm(zero, qh, kt, beta=0, alpha=scale)
        if key_bias is not None:  # Doge's dynamic mask, before the causal mask
            scores = _key_bias(scores, key_bias, b, hkv, g, s, t_k)
        if plan.masked_out is not None and softcap is None and alibi is None:
            scores.view(b, hkv, g, s, t_k).masked_fill_(plan.masked_out, float("-inf"))
    if softcap is not None:
        with sc("attn.softcap"):
            scores = torch.tanh(scores / softcap) * softcap
            if plan.masked_out is not None and alibi is None:
                scores.view(b, hkv, g, s, t_k).masked_fill_(plan.masked_out, float("-inf"))
    if alibi is not None:
        with sc("attn.alibi"):
            scores = _alibi_bias(scores, alibi, b, hkv, g, s, t_k)
            if plan.masked_out is not None:
                scores.view(b, hkv, g, s, t_k).masked_fill_(plan.masked_out, float("-inf"))
    with sc("attn.softmax"):
        if sinks is not None:
            sink = sinks.view(1, hkv, g, 1, 1).expand(b, hkv, g, s, 1).reshape(b * hkv, g * s, 1)
            probs = torch.softmax(torch.cat([scores, sink.to(scores.dtype)], -1), dim=-1)[..., :t_k]
        else:
            probs = torch.softmax(scores, dim=-1)
    with sc("attn.value"):
        v = values()
        dv = v.shape[-1]
        vh = v.permute(0, 2, 1, 3).reshape(b * hkv, t_k, dv)
        o = torch.bmm(probs, vh)
        return o.view(b, hkv, g, s, dv).permute(0, 3, 1, 2, 4).reshape(b, s, h * dv)


def latent_q_block(s: int, device) -> int:
    """Queries per tile of the latent flash kernel: torch's CPU flash kernel tiles by 32 queries below 192,
    64 below 768, else 256 (``cpu_flash_attention``'s q_split_size in ATen, FlashAttentionKernel.cpp);
    FlashAttention-2 on a GPU by 128 (its block_m for head dims up to 128)."""
    if str(device).startswith("cuda"):
        return 128
    return 32 if s < 192 else 64 if s < 768 else 256


def _tiles(plan: _Plan, s: int, q_block: int) -> list[tuple]:
    """The blocks a flash kernel computes: (r0, r1, c0, c1, masked_out) for queries r0..r1-1 against
    keys c0..c1-1, the keys that block sees; masked_out bool [r1-r0, c1-c0] (None: all visible).

    A causal pass (``plan.tiled``) skips the keys no query of a block sees: the block of queries
    r0..r1-1 reads keys from the first visible to its last query to the last visible to its last
    query, so it computes sum over blocks of (r1-r0)*(c1-c0) pairs: the causal (and window) pairs
    plus the half-masked diagonal of each block, as the flash kernels do; ``q_block=1`` computes
    exactly the visible pairs. Any other pass is one block over every key read (the analytic count of a
    bidirectional pass is all s*t_k pairs).
    """
    if not plan.tiled:
        return [(0, s, 0, plan.n_keys, plan.masked_out)]
    tiles = plan.tiles.get(q_block)
    if tiles is None:
        mask = plan.mask.cpu()
        tiles = []
        for r0 in range(0, s, q_block):
            r1 = min(r0 + q_block, s)
            cols = mask[r0:r1].any(0).nonzero()
            c0, c1 = int(cols[0]), int(cols[-1]) + 1
            out = ~mask[r0:r1, c0:c1]
            tiles.append((r0, r1, c0, c1, out.to(plan.mask.device) if bool(out.any()) else None))
        plan.tiles[q_block] = tiles
    return tiles


def _latent_attention(sc, P: _Pass, plan: _Plan, q: torch.Tensor, span: Callable, d_c: int,
                      scale: float) -> torch.Tensor:
    """Absorbed MLA as a flash kernel runs it: explicit matmuls over the latent, read once per tile.

    Shapes: q [b, s, h, d_c + d_r] (the absorbed query: q_nope W_UK, then the RoPE part);
    span() [b, t_k, d_c + d_r] (the latent c_KV and the shared RoPE key of every key read, as cached);
    per tile of queries r0..r1 and keys c0..c1 (:func:`_tiles`), the h heads folded into the rows:
    scores = q [b, (r1-r0)*h, d_c+d_r] @ spanᵀ [b, d_c+d_r, c1-c0] = q_lat @ c_KVᵀ + q_rope @ k_ropeᵀ
    (scaled, masked), p = softmax(scores), o_lat = p [b, (r1-r0)*h, c1-c0] @ c_KV [b, c1-c0, d_c].
    The latent is shared by all heads: never repeated per head (an MQA with one KV stream of width
    d_c + d_r whose values are its first d_c columns).
    Returns: o_lat [b, s, h*d_c] (model dtype).
    FLOPs: 2*b*h*(d_c + d_r + d_c) per computed pair, as the analytic ``attn.sdpa`` counts per causal pair
    (:func:`lmcost.operators.attention.attention_core` with kv_streams=1): exactly with q_block = 1, plus
    the diagonal blocks' masked half otherwise. Softmax and masking run in the same ``attn.sdpa`` scope.
    """
    b, s, h, dq = q.shape
    with sc("attn.sdpa"):
        kv = span()
        outs = []
        for r0, r1, c0, c1, masked_out in _tiles(plan, s, P.q_block):
            rows, keys = q[:, r0:r1].reshape(b, (r1 - r0) * h, dq), kv[:, c0:c1]
            zero = torch.zeros((), dtype=q.dtype, device=q.device).expand(b, rows.shape[1], c1 - c0)
            scores = torch.baddbmm(zero, rows, keys.transpose(1, 2), beta=0, alpha=scale)
            if masked_out is not None:
                scores.view(b, r1 - r0, h, c1 - c0).masked_fill_(masked_out[:, None, :], float("-inf"))
            outs.append(torch.bmm(torch.softmax(scores, dim=-1), keys[..., :d_c]))
        o = outs[0] if len(outs) == 1 else torch.cat(outs, 1)
        return o.view(b, s, h * d_c)
