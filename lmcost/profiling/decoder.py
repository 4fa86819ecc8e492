"""A PyTorch reference decoder built from the same :class:`~lmcost.model.config.ArchConfig` as the analytic model.

Every analytic operator of :func:`lmcost.graph.forward.forward_ops` runs inside a
``torch.profiler.record_function`` scope of exactly its name (``layers.attn.q_proj``,
``layers.moe.expert.down``, ...), so a profile lines up with the prediction operator by operator. In a
flash kernel the softmax is fused into ``attn.sdpa`` and has no scope of its own.

Attention kernels (``kernel``): ``flash`` calls SDPA with the backend pinned for the run
(:mod:`lmcost.profiling.backends`; the model's ``sdpa_backend`` attribute names it, and a call it
cannot run raises instead of falling back), except absorbed MLA, which no SDPA backend runs without
repeating the latent per head (d_qk = d_c + d_r != d_v = d_c): there ``attn.sdpa`` is explicit
matmuls over the latent, read once, in tiles of queries that skip the keys they cannot see
(:func:`_latent_attention`), as the analytic flash record counts. ``naive`` runs the score matrix in full.

What it is:

- Parameters: one tensor per analytic weight, ``sum(p.numel())`` = ``param_counts(cfg)["total"]``.
  MLA stores one ``kv_b_proj`` weight [h*(d_nope+d_v), d_c]; absorbed mode reads W_UK and W_UV as views
  of it. Weights are random (seeded; fan-in scaled, so activations stay O(1) in bf16/fp16).
- A preallocated KV cache, so that decode steps have fixed shapes. Global layers: K and V
  [max_batch, max_context, h_kv, d_h]; local layers: a rolling buffer of min(max_context, w) positions
  (position j in slot j mod C); MLA: one buffer [max_batch, C, d_c + d_r] per layer holding the latent
  and the shared RoPE key side by side (the layout MLA kernels read; ``latent``/``k_rope`` are its views).
  ``sum(t.nbytes for t in kv_cache_tensors())`` = ``kv_bytes(cfg, Precision(dtype, dtype, dtype),
  max_batch, max_context)``.
- ``forward(ids [b, s], start_pos)`` runs s new tokens at positions start_pos..start_pos+s-1 of the first
  b sequences, writes their K/V (latent) into the cache, attends causally to the cached keys (local
  layers: the last w keys of each query) and returns logits [b, s, V]. ``causal: false`` attends to
  every key of the pass (local: |key - query| < w); ``embeddings: false`` is a bare layer stack that
  maps hidden states [b, s, d] to hidden states (no embed, final norm or lm_head). Dropout is a
  training op: an inference forward has none.

Where the work happens (it is what the analytic op of the same name describes):

- ``attn.k_proj``/``attn.v_proj`` (MLA: ``attn.kv_a_proj``) write the new tokens into the cache;
  ``attn.k_norm``, ``attn.kv_a_norm`` and ``attn.rope`` update them there in place; the attention
  kernel reads the keys back from the cache: t keys (global) or min(t, w) keys (local) in a decode
  step, as the analytic ``min(t, s + w - 1)``.
- One exception, on local layers only: a pass of s > 1 tokens whose positions run past the rolling
  buffer (start_pos + s > C) needs s + min(start_pos, w - 1) keys, more than the C = w slots hold,
  and its own writes would overwrite keys its first queries still need. There K and V stay
  activations through the projections, norm and RoPE, and the attention kernel (``attn.sdpa``,
  ``attn.score``/``attn.value``; MLA naive: ``attn.kv_b_proj``) reads the min(start_pos, w - 1) older
  keys from the buffer, appends the new ones, then writes the last min(s, C) new tokens into the buffer.
  The kernel still reads min(t, s + w - 1) keys per query block.
- GQA/MQA: the decoder never copies K/V per query head: flash passes ``enable_gqa`` to SDPA (whose
  math backend, if pinned, repeats them internally); the naive kernel folds the g query heads of a
  group into g*s rows of one matmul per K/V head (it does copy K and V once into [b*h_kv, t, d] for
  bmm, as the cache is token-major [b, t, h_kv, d], the layout flash kernels read).
- RoPE: rotate-half (GPT-NeoX/Llama) on the first r dims of each head, base 10000, on every layer but
  the ``_nope`` kinds; softmax scale 1/sqrt(d_h) (MLA: 1/sqrt(d_nope + d_r)); norms eps 1e-5; GELU in its
  tanh form. ``qk_norm: l2`` is a weightless RMSNorm per head on the RoPE layers; temperature tuning
  scales the queries of NoPE layers with Llama 4's defaults (floor_scale 8192, attn_scale 0.1).
- Chunked layers (Llama 4): a rolling buffer of min(max_context, C) slots, position j in slot j mod C, so
  the current chunk is slots 0..j mod C; a pass crossing a chunk boundary gathers the older keys of its
  first chunk and appends its own (:func:`_chunk_plan`), reading t - floor((t - s)/C)*C keys.
- Sinks (gpt-oss) and soft-capping (Gemma-2): SDPA takes neither, so with either the flash kernel is
  explicit matmuls over every key read in the ``attn.sdpa`` scope (``sdpa_backend`` ``explicit``), the
  sink logit appended to each row of scores before the softmax and dropped after it; the naive kernel caps
  in ``attn.softcap`` and appends the sink inside ``attn.softmax`` (``attn.sinks`` has no scope).
  ``final_logit_softcap`` runs in ``logit_softcap`` after the lm_head.
- MoE: softmax router (with a bias under ``router_bias``), top-k (weights not renormalised; gpt-oss
  softmaxes the top k logits and Llama 4 sigmoids them: the same cost here); experts with a bias on each
  matrix under ``expert_bias`` (addmm); gpt-oss's clamped SwiGLU under ``ffn.swiglu_limit``; ``moe.topk`` also sorts the token-expert
  pairs by expert; the first expert scope gathers the tokens of the k*b*s pairs, and each expert scope
  (``moe.expert.gate``...) loops over the experts actually hit; ``moe.combine`` weights and scatters
  the expert outputs and adds the (optionally sigmoid-gated) shared experts.

torch is imported only inside :mod:`lmcost.profiling`; the analytic core never needs it.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision, canonical
from lmcost.graph.ffn import NONLINEARITY
from lmcost.graph.forward import KERNELS, MLA_MODES, Dims, forward_ops
from lmcost.profiling.backends import EXPLICIT, VARIANTS, sdpa_backend
from lmcost.profiling.torch_dtypes import TORCH_DTYPES

#: lmcost dtype name of each torch dtype the decoder runs in.
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

ROPE_BASE = 10000.0
NORM_EPS = 1e-5


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")  # the tanh form, as the analytic 8 FLOPs per element count


NONLINEAR_FN = {"relu": F.relu, "relu2": lambda x: F.relu(x).square(), "gelu": _gelu_tanh, "silu": F.silu, "sigmoid": torch.sigmoid}


def dtype_name(dtype) -> str:
    """The lmcost name (fp32, bf16, fp16) of a torch dtype or dtype string."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype {dtype} is not supported by the reference decoder; use fp32, bf16 or fp16")
        return DTYPE_NAMES[dtype]
    name = canonical(dtype)
    if name not in TORCH_DTYPES:
        raise ValueError(f"dtype {dtype} is not supported by the reference decoder; use fp32, bf16 or fp16")
    return name


def analytic_names(cfg: ArchConfig, kernel: str = "flash", mla_mode: str = "absorbed") -> set[str]:
    """The operator names of ``forward_ops`` that have a profiler scope: all of them, less the fused
    ``attn.softmax`` and ``attn.softcap`` of a flash kernel and ``attn.sinks`` (inside the softmax)."""
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1), kernel, mla_mode)
    return {op.name for op in ops if not ((kernel == "flash" and op.role in ("attn.softmax", "attn.softcap"))
                                          or op.role == "attn.sinks")}


def scope_names(model: "ReferenceDecoder") -> set[str]:
    """The profiler scope names ``model``'s forward opens (= :func:`analytic_names` of its config)."""
    return analytic_names(model.cfg, model.kernel, model.mla_mode)


def _group_prefixes(cfg: ArchConfig) -> dict[tuple[str, str], str]:
    """(attention kind, ffn kind) -> the group prefix ``forward_ops`` gives that layer's ops."""
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1))
    groups = list(dict.fromkeys(op.group for op in ops if op.group))
    kinds = [(a, f) for a, f, _ in cfg.layer_groups()]
    if len(groups) != len(kinds):
        raise AssertionError(f"layer groups {kinds} do not line up with op groups {groups}")
    return dict(zip(kinds, groups))


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


def _explicit(q, k, v, plan: _Plan, scale: float, sinks=None, softcap=None) -> torch.Tensor:
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
          sinks=None, softcap=None) -> torch.Tensor:
    """The attention kernel. q [b, s, h, d_qk]; keys() [b, t_k, h_kv, d_qk]; values() [b, t_k, h_kv, d_v]
    (called inside the scope that reads them). Returns o [b, s, h*d_v]. With ``sinks`` [h] or ``softcap``
    the flash kernel is explicit matmuls in the ``attn.sdpa`` scope (:func:`_explicit`), and the naive one
    caps its scores in ``attn.softcap`` and appends the sink logit inside ``attn.softmax``."""
    b, s, h, dq = q.shape
    if P.kernel == "flash" and (sinks is not None or softcap is not None):
        with sc("attn.sdpa"):
            return _explicit(q, keys(), values(), plan, scale, sinks, softcap)
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
        if plan.masked_out is not None and softcap is None:
            scores.view(b, hkv, g, s, t_k).masked_fill_(plan.masked_out, float("-inf"))
    if softcap is not None:
        with sc("attn.softcap"):
            scores = torch.tanh(scores / softcap) * softcap
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
    (:func:`lmcost.graph.attention.attention_core` with kv_streams=1): exactly with q_block = 1, plus
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


# ---------------------------------------------------------------------------------------------------
# Modules


class _Init:
    """Seeded random weights, drawn on the target device: N(0, 1/fan_in) matrices, N(0, 0.02) biases,
    norm weights 1 + N(0, 0.05), embeddings N(0, 1)."""

    def __init__(self, seed: int, device, dtype):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device, self.dtype = torch.device(device), dtype

    def matrix(self, *shape, fan_in=None) -> nn.Parameter:
        fan_in = fan_in or shape[-1]
        return self.normal(shape, fan_in ** -0.5)

    def normal(self, shape, std) -> nn.Parameter:
        # Drawn in fp32 and rounded, so a bf16/fp16 model has the fp32 model's weights, rounded.
        t = torch.empty(shape, device=self.device, dtype=torch.float32).normal_(0.0, std, generator=self.gen)
        return nn.Parameter(t.to(self.dtype), requires_grad=False)

    def bias(self, n, on: bool = True) -> Optional[nn.Parameter]:
        return self.normal((n,), 0.02) if on else None

    def ones(self, n) -> nn.Parameter:
        w = self.normal((n,), 0.05)
        with torch.no_grad():
            w.add_(1.0)
        return w


class Norm(nn.Module):
    """RMSNorm, or LayerNorm with or without bias, over the last ``width`` elements."""

    def __init__(self, init: _Init, kind: str, width: int, bias: bool = False, weight: bool = True):
        """``weight=False``: no learned weight or bias (OLMo-1's LayerNorm)."""
        super().__init__()
        self.kind, self.width = kind, width
        self.weight = init.ones(width) if weight else None
        self.bias = init.bias(width, kind == "layernorm" and bias and weight)

    def forward(self, x):
        if self.kind == "rmsnorm":
            return F.rms_norm(x, (self.width,), self.weight, NORM_EPS)
        return F.layer_norm(x, (self.width,), self.weight, self.bias, NORM_EPS)


def _cache(shape, dtype, device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


class Attention(nn.Module):
    """MHA/GQA/MQA, global, sliding-window or chunked, with optional QK-norm, (partial) RoPE or none on
    this layer (a ``_nope`` kind), sinks, soft-capped scores and (on NoPE layers) temperature tuning."""

    #: Llama 4's temperature tuning constants (Llama4TextConfig defaults; they change no cost).
    FLOOR_SCALE, ATTN_SCALE = 8192, 0.1

    def __init__(self, cfg: ArchConfig, init: _Init, local, max_batch: int, max_context: int):
        """``local``: the layer's attention kind (ATTENTION_KINDS) or a bool (sliding window or not)."""
        super().__init__()
        a = cfg.attention
        kind = local if isinstance(local, str) else ("local" if local else "global")
        mask = kind.removesuffix("_nope")
        self.rope = not kind.endswith("_nope")
        local = mask == "local"
        self.plan_key = "chunked" if mask == "chunked" else local
        self.local, self.h, self.h_kv, self.d_h = local, a.n_heads, cfg.h_kv, cfg.d_h
        self.w = a.sliding_window if local else None
        self.sinks = init.normal((a.n_heads,), 1.0) if a.sinks else None
        self.softcap = a.logit_softcap
        self.temperature = a.temperature_tuning and not self.rope
        d, hd, kvd = cfg.d_model, self.h * self.d_h, self.h_kv * self.d_h
        self.gated = a.output_gate  # Qwen3-Next: q_proj yields each head's query, then its output gate
        qd = 2 * hd if self.gated else hd
        self.wq, self.bq = init.matrix(qd, d), init.bias(qd, a.qkv_bias)
        self.wk, self.bk = init.matrix(kvd, d), init.bias(kvd, a.qkv_bias)
        self.wv, self.bv = init.matrix(kvd, d), init.bias(kvd, a.qkv_bias)
        self.qk_norm = a.qk_norm if (a.qk_norm != "l2" or self.rope) else "none"
        if self.qk_norm in ("head", "full"):
            full = a.qk_norm == "full"
            self.q_norm = Norm(init, "rmsnorm", hd if full else self.d_h)
            self.k_norm = Norm(init, "rmsnorm", kvd if full else self.d_h)
        self.wo, self.bo = init.matrix(d, hd), init.bias(d, a.out_bias)
        C = min(max_context, self.w) if local else max_context
        if mask == "chunked":
            C = min(max_context, a.chunk_size)
        shape = (max_batch, C, self.h_kv, self.d_h)
        self.register_buffer("k_cache", _cache(shape, init.dtype, init.device), persistent=False)
        self.register_buffer("v_cache", _cache(shape, init.dtype, init.device), persistent=False)

    def cache_tensors(self):
        return [self.k_cache, self.v_cache]

    def _qk_norm(self, norm: Norm, x):
        if self.qk_norm == "l2":  # Llama4TextL2Norm: x * rsqrt(mean(x^2) + eps) per head, no weight
            return F.rms_norm(x, (self.d_h,), None, NORM_EPS)
        if self.qk_norm == "head":
            return norm(x)
        return norm(x.reshape(*x.shape[:2], -1)).view(x.shape)

    def forward(self, x, P: _Pass, sc):
        b, s = x.shape[:2]
        plan: _Plan = P.plans[self.plan_key]
        with sc("attn.q_proj"):
            if self.gated:
                qg = F.linear(x, self.wq, self.bq).view(b, s, self.h, 2 * self.d_h)
                q, gate = qg[..., :self.d_h].contiguous(), qg[..., self.d_h:]
            else:
                q = F.linear(x, self.wq, self.bq).view(b, s, self.h, self.d_h)
        with sc("attn.k_proj"):
            k = F.linear(x, self.wk, self.bk).view(b, s, self.h_kv, self.d_h)
            if plan.direct:
                self.k_cache[:b, plan.write_at:plan.write_at + s] = k
                k = self.k_cache[:b, plan.write_at:plan.write_at + s]
        with sc("attn.v_proj"):
            v = F.linear(x, self.wv, self.bv).view(b, s, self.h_kv, self.d_h)
            if plan.direct:
                self.v_cache[:b, plan.write_at:plan.write_at + s] = v
                v = self.v_cache[:b, plan.write_at:plan.write_at + s]
        if self.qk_norm != "none":
            with sc("attn.q_norm"):
                q = self._qk_norm(getattr(self, "q_norm", None), q)
            with sc("attn.k_norm"):
                k.copy_(self._qk_norm(getattr(self, "k_norm", None), k))
        if P.cos is not None and self.rope:
            with sc("attn.rope"):
                _rotate(q, P.cos, P.sin)
                _rotate(k, P.cos, P.sin)
        if self.temperature:
            with sc("attn.q_scale"):
                pos = torch.arange(P.p, P.p + s, device=q.device, dtype=torch.float32)
                scale = torch.log1p(torch.floor((pos + 1.0) / self.FLOOR_SCALE)) * self.ATTN_SCALE + 1.0
                q = q * scale.to(q.dtype)[None, :, None, None]
        if plan.direct:
            keys = lambda: self.k_cache[:b, :plan.n_keys]  # noqa: E731
            values = lambda: self.v_cache[:b, :plan.n_keys]  # noqa: E731
        else:
            keys = lambda: _assemble(self.k_cache, k, plan)  # noqa: E731
            values = lambda: _assemble(self.v_cache, v, plan)  # noqa: E731
        o = _core(sc, P, plan, q, keys, values, self.d_h ** -0.5, self.sinks, self.softcap)
        if self.gated:
            with sc("attn.gate"):
                o = o * torch.sigmoid(gate.reshape(b, s, self.h * self.d_h))
        with sc("attn.o_proj"):
            return F.linear(o, self.wo, self.bo)


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, section 2.1), absorbed or naive (set per pass)."""

    def __init__(self, cfg: ArchConfig, init: _Init, local: bool, max_batch: int, max_context: int):
        super().__init__()
        a, m = cfg.attention, cfg.attention.mla
        self.local, self.h = local, a.n_heads
        self.w = a.sliding_window if local else None
        self.d_c, self.d_r, self.d_nope, self.d_v = m.kv_lora_rank, m.qk_rope_head_dim, m.qk_nope_head_dim, m.v_head_dim
        d, h, dqk = cfg.d_model, self.h, self.d_nope + self.d_r
        self.q_lora = m.q_lora_rank
        if self.q_lora:
            self.w_q_a, self.b_q_a = init.matrix(m.q_lora_rank, d), init.bias(m.q_lora_rank, a.qkv_bias)
            self.q_a_norm = Norm(init, "rmsnorm", m.q_lora_rank)
            self.w_q_b = init.matrix(h * dqk, m.q_lora_rank)
        else:
            self.w_q = init.matrix(h * dqk, d)  # the analytic q_proj of MLA has no bias
        self.w_kv_a, self.b_kv_a = init.matrix(self.d_c + self.d_r, d), init.bias(self.d_c + self.d_r, a.qkv_bias)
        self.kv_a_norm = Norm(init, "rmsnorm", self.d_c)
        self.w_kv_b = init.matrix(h * (self.d_nope + self.d_v), self.d_c)  # W_UK and W_UV, one matrix
        self.wo, self.bo = init.matrix(d, h * self.d_v), init.bias(d, a.out_bias)
        C = min(max_context, self.w) if local else max_context
        self.register_buffer("kv_cache", _cache((max_batch, C, self.d_c + self.d_r), init.dtype, init.device),
                             persistent=False)

    @property
    def latent(self):
        """The cached latent c_KV [max_batch, C, d_c] (a view of the layer's cache buffer)."""
        return self.kv_cache[..., :self.d_c]

    @property
    def k_rope(self):
        """The cached shared RoPE key [max_batch, C, d_r] (a view of the layer's cache buffer)."""
        return self.kv_cache[..., self.d_c:]

    def cache_tensors(self):
        return [self.kv_cache]

    def _w_heads(self):
        return self.w_kv_b.view(self.h, self.d_nope + self.d_v, self.d_c)

    def forward(self, x, P: _Pass, sc):
        b, s = x.shape[:2]
        h, d_c, d_nope = self.h, self.d_c, self.d_nope
        plan: _Plan = P.plans[self.local]
        if self.q_lora:
            with sc("attn.q_a_proj"):
                cq = F.linear(x, self.w_q_a, self.b_q_a)
            with sc("attn.q_a_norm"):
                cq = self.q_a_norm(cq)
            with sc("attn.q_b_proj"):
                q = F.linear(cq, self.w_q_b).view(b, s, h, d_nope + self.d_r)
        else:
            with sc("attn.q_proj"):
                q = F.linear(x, self.w_q).view(b, s, h, d_nope + self.d_r)
        # Under autograd (a training step) the norm keeps its input for backward, so the normalised latent
        # is a new tensor, written to the cache after; otherwise it is normalised in place in the cache.
        training = torch.is_grad_enabled()
        with sc("attn.kv_a_proj"):
            c = F.linear(x, self.w_kv_a, self.b_kv_a)
            if plan.direct and not training:
                self.kv_cache[:b, plan.write_at:plan.write_at + s] = c
                c = self.kv_cache[:b, plan.write_at:plan.write_at + s]
        with sc("attn.kv_a_norm"):
            if training:
                c = torch.cat([self.kv_a_norm(c[..., :d_c]), c[..., d_c:]], -1)
                if plan.direct:
                    self.kv_cache[:b, plan.write_at:plan.write_at + s] = c
                    c = self.kv_cache[:b, plan.write_at:plan.write_at + s]
            else:
                c[..., :d_c].copy_(self.kv_a_norm(c[..., :d_c]))
        if P.cos is not None:
            with sc("attn.rope"):
                _rotate(q[..., d_nope:], P.cos, P.sin)
                _rotate(c[..., d_c:].unsqueeze(2), P.cos, P.sin)
        memo = []

        def span():  # [b, t_k, d_c + d_r]: the latent and RoPE key of every key the kernel reads
            if not memo:
                memo.append(self.kv_cache[:b, :plan.n_keys] if plan.direct else _assemble(self.kv_cache, c, plan))
            return memo[0]

        scale = (d_nope + self.d_r) ** -0.5
        n = b * s
        if P.mla_mode == "absorbed":
            with sc("attn.q_absorb"):
                w_uk = self._w_heads()[:, :d_nope, :]                          # [h, d_nope, d_c]
                q_lat = torch.bmm(q[..., :d_nope].reshape(n, h, d_nope).transpose(0, 1), w_uk)  # [h, n, d_c]
                q = torch.cat([q_lat.transpose(0, 1).reshape(b, s, h, d_c), q[..., d_nope:]], -1)
            if P.kernel == "flash":
                o = _latent_attention(sc, P, plan, q, span, d_c, scale)
            else:
                o = _core(sc, P, plan, q, lambda: span().unsqueeze(2), lambda: span()[..., :d_c].unsqueeze(2), scale)
            with sc("attn.out_absorb"):
                w_uv = self._w_heads()[:, d_nope:, :].transpose(1, 2)         # [h, d_c, d_v]
                o = torch.bmm(o.view(n, h, d_c).transpose(0, 1), w_uv)        # [h, n, d_v]
                o = o.transpose(0, 1).reshape(b, s, h * self.d_v)
        else:
            with sc("attn.kv_b_proj"):
                sp = span()
                t_k = sp.shape[1]
                kv = F.linear(sp[..., :d_c], self.w_kv_b).view(b, t_k, h, d_nope + self.d_v)

            def keys():
                return torch.cat([kv[..., :d_nope], sp[..., d_c:].unsqueeze(2).expand(b, t_k, h, self.d_r)], -1)

            o = _core(sc, P, plan, q, keys, lambda: kv[..., d_nope:], scale)
        with sc("attn.o_proj"):
            return F.linear(o, self.wo, self.bo)


class FFN(nn.Module):
    """Plain act(x W_up) W_down or gated (act(x W_gate) * x W_up) W_down, scopes ``{prefix}gate``..."""

    def __init__(self, cfg: ArchConfig, init: _Init, d_ff: int, bias: bool, prefix: str = "ffn."):
        super().__init__()
        d = cfg.d_model
        self.prefix, self.gated = prefix, cfg.gated
        self.act = NONLINEAR_FN[NONLINEARITY[cfg.ffn.activation]]
        self.glu = _gated_fn(cfg, self.act)
        if self.gated:
            self.w_gate, self.b_gate = init.matrix(d_ff, d), init.bias(d_ff, bias)
        self.w_up, self.b_up = init.matrix(d_ff, d), init.bias(d_ff, bias)
        self.w_down, self.b_down = init.matrix(d, d_ff), init.bias(d, bias)

    def forward(self, x, P: _Pass, sc):
        p = self.prefix
        if self.gated:
            with sc(f"{p}gate"):
                g = F.linear(x, self.w_gate, self.b_gate)
        with sc(f"{p}up"):
            u = F.linear(x, self.w_up, self.b_up)
        with sc(f"{p}act"):
            a = self.glu(g, u) if self.gated else self.act(u)
        with sc(f"{p}down"):
            return F.linear(a, self.w_down, self.b_down)


def _gated_fn(cfg: ArchConfig, act: Callable) -> Callable:
    """(gate, up) -> the gated activation: act(gate) * up, or gpt-oss's clamped SwiGLU
    (transformers GptOssExperts._apply_gate): g = min(gate, l), (clamp(up, -l, l) + 1) * g * sigmoid(alpha*g)."""
    limit, alpha = cfg.ffn.swiglu_limit, cfg.ffn.swiglu_alpha
    if limit is None:
        return lambda g, u: act(g) * u

    def clamped(g, u):
        g = g.clamp(max=limit)
        return (u.clamp(-limit, limit) + 1) * (g * torch.sigmoid(g * alpha))

    return clamped


class MoE(nn.Module):
    """Router (with its bias, gpt-oss), softmax top-k, routed experts (a loop over the experts hit, with
    per-expert biases, gpt-oss), shared experts, combine."""

    def __init__(self, cfg: ArchConfig, init: _Init):
        super().__init__()
        m, d = cfg.moe, cfg.d_model
        self.E, self.k, self.d_e, self.gated = m.n_experts, m.top_k, m.d_ff_expert, cfg.gated
        self.act = NONLINEAR_FN[NONLINEARITY[cfg.ffn.activation]]
        self.glu = _gated_fn(cfg, self.act)
        self.w_router = init.matrix(m.n_experts, d)  # E x d
        self.b_router = init.bias(m.n_experts, m.router_bias)
        if self.gated:
            self.w_gate = init.matrix(m.n_experts, m.d_ff_expert, d)
        self.w_up = init.matrix(m.n_experts, m.d_ff_expert, d)
        self.w_down = init.matrix(m.n_experts, d, m.d_ff_expert)
        eb = m.expert_bias
        self.b_gate = init.normal((m.n_experts, m.d_ff_expert), 0.02) if (eb and self.gated) else None
        self.b_up = init.normal((m.n_experts, m.d_ff_expert), 0.02) if eb else None
        self.b_down = init.normal((m.n_experts, d), 0.02) if eb else None
        self.shared = FFN(cfg, init, m.d_sh, False, prefix="moe.shared.") if m.d_sh else None
        self.w_shared_gate = init.matrix(1, d) if (m.d_sh and m.shared_expert_gate) else None

    def _experts(self, x, weights, counts, d_out, bias=None):
        """x [k*n, d_in] sorted by expert @ weights[e].T (+ bias[e]) per expert hit -> [k*n, d_out]. Under
        autograd the products are concatenated (an out= matmul has no backward); in inference they write one
        buffer (addmm with the expert's bias, which FlopCounterMode counts as the plain product)."""
        if torch.is_grad_enabled():
            parts, start = [], 0
            for e, c in enumerate(counts):
                if c:
                    y = x[start:start + c] @ weights[e].t()
                    parts.append(y + bias[e] if bias is not None else y)
                    start += c
            return torch.cat(parts) if parts else x.new_empty(0, d_out)
        out = torch.empty(x.shape[0], d_out, dtype=x.dtype, device=x.device)
        start = 0
        for e, c in enumerate(counts):
            if c:
                if bias is not None:
                    torch.addmm(bias[e], x[start:start + c], weights[e].t(), out=out[start:start + c])
                else:
                    torch.mm(x[start:start + c], weights[e].t(), out=out[start:start + c])
                start += c
        return out

    def forward(self, x, P: _Pass, sc):
        b, s, d = x.shape
        x2 = x.reshape(b * s, d)
        with sc("moe.router"):
            logits = F.linear(x2, self.w_router, self.b_router)
        with sc("moe.topk"):
            weight, idx = torch.softmax(logits, dim=-1).topk(self.k, dim=-1)   # [n, k]
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)                             # pairs sorted by expert
            counts = torch.bincount(flat, minlength=self.E).tolist()
            pair_token = order // self.k
            pair_weight = weight.reshape(-1)[order]
        if self.gated:
            with sc("moe.expert.gate"):
                xs = x2.index_select(0, pair_token)
                g = self._experts(xs, self.w_gate, counts, self.d_e, self.b_gate)
        with sc("moe.expert.up"):
            if not self.gated:
                xs = x2.index_select(0, pair_token)
            u = self._experts(xs, self.w_up, counts, self.d_e, self.b_up)
        with sc("moe.expert.act"):
            a = self.glu(g, u) if self.gated else self.act(u)
        with sc("moe.expert.down"):
            y = self._experts(a, self.w_down, counts, d, self.b_down)
        if self.shared is not None:
            sh = self.shared(x2, P, sc)
            if self.w_shared_gate is not None:
                with sc("moe.shared.gate_proj"):
                    sg = F.linear(x2, self.w_shared_gate)
        with sc("moe.combine"):
            out = torch.zeros_like(x2).index_add_(0, pair_token, y * pair_weight[:, None])
            if self.shared is not None:
                out += sh * torch.sigmoid(sg) if self.w_shared_gate is not None else sh
            return out.view(b, s, d)


class Block(nn.Module):
    """One transformer block: pre_norm, post_norm, sandwich or parallel (see lmcost.graph.forward.block_ops)."""

    def __init__(self, cfg: ArchConfig, init: _Init, kind: str, moe: bool, prefix: str,
                 max_batch: int, max_context: int):
        """``kind``: the layer's token mixer (ArchConfig.layer_kinds: ``global``/``local`` attention)."""
        super().__init__()
        self.prefix, self.kind = prefix, cfg.block
        self.parallel_shared = cfg.block == "parallel" and cfg.parallel_shared_norm

        def norm():
            return Norm(init, cfg.norm, cfg.d_model, cfg.norm_bias, cfg.norm_weight)

        if self.parallel_shared:
            self.norm = norm()
        else:
            self.attn_norm = norm()
        attn_cls = MLAttention if cfg.attention.mla is not None else Attention
        self.attn = attn_cls(cfg, init, kind == "local" if attn_cls is MLAttention else kind, max_batch, max_context)
        if cfg.block == "sandwich":
            self.attn_post_norm = norm()
        if not self.parallel_shared:
            self.ffn_norm = norm()
        self.ffn = MoE(cfg, init) if moe else FFN(cfg, init, cfg.ffn.d_ff, cfg.ffn.bias)
        if cfg.block == "sandwich":
            self.ffn_post_norm = norm()

    def sc(self, name):
        return record_function(f"{self.prefix}.{name}")

    def forward(self, x, P: _Pass):
        sc = self.sc
        if self.kind == "parallel":
            if self.parallel_shared:
                with sc("norm"):
                    ha = hf = self.norm(x)
            else:
                with sc("attn_norm"):
                    ha = self.attn_norm(x)
                with sc("ffn_norm"):
                    hf = self.ffn_norm(x)
            a = self.attn(ha, P, sc)
            f = self.ffn(hf, P, sc)
            with sc("residual"):
                return x + a + f
        if self.kind == "post_norm":
            a = self.attn(x, P, sc)
            with sc("attn_residual"):
                x = x + a
            with sc("attn_norm"):
                x = self.attn_norm(x)
            f = self.ffn(x, P, sc)
            with sc("ffn_residual"):
                x = x + f
            with sc("ffn_norm"):
                return self.ffn_norm(x)
        with sc("attn_norm"):
            h = self.attn_norm(x)
        a = self.attn(h, P, sc)
        if self.kind == "sandwich":
            with sc("attn_post_norm"):
                a = self.attn_post_norm(a)
        with sc("attn_residual"):
            x = x + a
        with sc("ffn_norm"):
            h = self.ffn_norm(x)
        f = self.ffn(h, P, sc)
        if self.kind == "sandwich":
            with sc("ffn_post_norm"):
                f = self.ffn_post_norm(f)
        with sc("ffn_residual"):
            return x + f


class ReferenceDecoder(nn.Module):
    """The decoder of one ArchConfig with a preallocated KV cache; see the module docstring.

    ``sdpa_backend`` (attribute): the SDPA backend every attention call of a run is pinned to, found
    once for the model's shapes, dtype and device (:func:`lmcost.profiling.backends.sdpa_backend`):
    one name (``flash_attention``, ``efficient_attention``, ``cudnn_attention``, ``math``), or
    ``causal=NAME,masked=NAME,full=NAME`` when the call variants need different ones, or
    ``explicit`` when attention runs as the decoder's own matmuls with no SDPA call (the naive
    kernel; absorbed MLA, see :func:`_latent_attention`). ``q_block`` (attribute): queries per tile of
    the absorbed MLA flash kernel (None: :func:`latent_q_block`).
    """

    def __init__(self, cfg: ArchConfig, *, max_batch: int, max_context: int, dtype=torch.float32, device="cpu",
                 seed: int = 0, kernel: str = "flash", mla_mode: str = "absorbed",
                 sdpa_backend: Optional[str] = None, q_block: Optional[int] = None):
        super().__init__()
        if kernel not in KERNELS or mla_mode not in MLA_MODES:
            raise ValueError(f"kernel in {KERNELS}, mla_mode in {MLA_MODES}")
        if max_batch < 1 or max_context < 1:
            raise ValueError("max_batch and max_context must be >= 1")
        dtype = TORCH_DTYPES[dtype_name(dtype)]
        self.cfg, self.kernel, self.mla_mode = cfg, kernel, mla_mode
        self.max_batch, self.max_context, self.dtype = max_batch, max_context, dtype
        init = _Init(seed, device, dtype)
        d, V = cfg.d_model, cfg.vocab_size
        self.embed = init.normal((V, d), 1.0) if cfg.embeddings else None
        self.pos_embed = (init.normal((cfg.max_positions + cfg.position_offset, d), 1.0)
                          if cfg.positions == "learned" else None)
        prefixes = _group_prefixes(cfg)
        if cfg.recurrent is not None:  # a hybrid stack: pre-norm blocks of any mixer and FFN (or none)
            from lmcost.profiling.recurrent import HybridBlock

            parts = dict(Norm=Norm, Attention=Attention, MLAttention=MLAttention, FFN=FFN, MoE=MoE)
            self.layers = nn.ModuleList(HybridBlock(cfg, init, a, f, prefixes[(a, f)], max_batch, max_context, parts)
                                        for a, f in cfg.layer_kinds())
        else:
            self.layers = nn.ModuleList(
                Block(cfg, init, a, f == "moe", prefixes[(a, f)], max_batch, max_context)
                for a, f in cfg.layer_kinds())
        self.final_norm = Norm(init, cfg.norm, d, cfg.norm_bias, cfg.norm_weight) if (cfg.final_norm and cfg.embeddings) else None
        self.lm_head = None if (cfg.tie_embeddings or not cfg.embeddings) else init.matrix(V, d)
        self.lm_head_bias = init.bias(V, cfg.embeddings and cfg.lm_head_bias)
        r = cfg.d_rot
        if cfg.positions == "rope":  # r // 2 rotated pairs (an odd last rotary dim, or r = 0, is left as is)
            half = r // 2
            inv = 1.0 / ROPE_BASE ** (torch.arange(half, dtype=torch.float64) / half)
            ang = torch.arange(max_context, dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat([ang, ang], -1)
            self.register_buffer("rope_cos", ang.cos().to(device=device, dtype=dtype), persistent=False)
            self.register_buffer("rope_sin", ang.sin().to(device=device, dtype=dtype), persistent=False)
        else:
            self.rope_cos = self.rope_sin = None
        self._plans: dict = {}
        if q_block is not None and q_block < 1:
            raise ValueError("q_block must be >= 1")
        self.q_block = q_block
        self._pin_backends(device, sdpa_backend)

    def _pin_backends(self, device, prefer: Optional[str]) -> None:
        """Find and record the SDPA backend of each call variant (see the class docstring)."""
        cfg, mla = self.cfg, self.cfg.attention.mla
        self._pins: dict = {}
        self._pin_all = None
        a = cfg.attention
        if self.kernel == "naive" or (mla is not None and self.mla_mode == "absorbed") or a.sinks \
                or a.logit_softcap is not None:  # SDPA has no sinks or soft-capping: explicit matmuls
            self.sdpa_backend = EXPLICIT
            return
        if mla is not None:  # up-projected MLA: h heads of K [d_nope + d_r] and V [d_v]
            shape = dict(heads=cfg.attention.n_heads, kv_heads=cfg.attention.n_heads,
                         d_qk=mla.qk_nope_head_dim + mla.qk_rope_head_dim, d_v=mla.v_head_dim)
        else:
            shape = dict(heads=cfg.attention.n_heads, kv_heads=cfg.h_kv, d_qk=cfg.d_h, d_v=cfg.d_h)
        names = {}
        for variant in VARIANTS if cfg.causal else ("masked", "full"):
            names[variant], self._pins[variant] = sdpa_backend(device, self.dtype, variant=variant, prefer=prefer,
                                                               **shape)
        if len(set(names.values())) == 1:
            self.sdpa_backend = next(iter(names.values()))
            self._pin_all = next(iter(self._pins.values()))
        else:
            self.sdpa_backend = ",".join(f"{v}={n}" for v, n in names.items())

    # ---- cache ----
    def kv_cache_tensors(self) -> list[torch.Tensor]:
        """Every preallocated KV-cache buffer (model dtype), and the conv (model dtype) and SSM (fp32) states
        of a hybrid stack's constant-state layers (:mod:`lmcost.profiling.recurrent`)."""
        return [t for layer in self.layers for t in layer.attn.cache_tensors()]

    def reset_cache(self) -> None:
        """Zero every cache buffer (a fresh batch of sequences)."""
        for t in self.kv_cache_tensors():
            t.zero_()

    def scope_names(self) -> set[str]:
        return scope_names(self)

    def trainable(self) -> "ReferenceDecoder":
        """Let every weight require a gradient (to profile forward + backward); returns self."""
        for prm in self.parameters():
            prm.requires_grad_(True)
        return self

    def _pass(self, b: int, s: int, p: int) -> _Pass:
        device = self.kv_cache_tensors()[0].device
        key = (s, p, str(device))
        plans = self._plans.get(key)
        if plans is None:
            w = self.cfg.attention.sliding_window
            causal = self.cfg.causal
            plans = {False: _plan(p, s, self.max_context, None, causal, device)}
            if w is not None:
                plans[True] = _plan(p, s, min(self.max_context, w), w, causal, device)
            if self.cfg.attention.chunk_size is not None:
                plans["chunked"] = _chunk_plan(p, s, self.cfg.attention.chunk_size, causal, device)
            if len(self._plans) > 64:
                self._plans.clear()
            self._plans[key] = plans
        cos = sin = None
        if self.rope_cos is not None:
            cos, sin = self.rope_cos[p:p + s], self.rope_sin[p:p + s]
        q_block = self.q_block or latent_q_block(s, device)
        return _Pass(b, s, p, self.kernel, self.mla_mode, plans, cos, sin,
                     pins=None if self._pin_all else self._pins, q_block=q_block)

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Logits [b, s, V] of s new tokens per sequence at positions start_pos..start_pos+s-1.

        A bare layer stack (``embeddings: false``) takes hidden states [b, s, d] instead of token ids
        and returns the output of its last block [b, s, d]. Weights do not require gradients, so no
        autograd graph is built; :meth:`trainable` turns them on to profile a training step.
        """
        b, s = input_ids.shape[:2]
        p = int(start_pos)
        if not 1 <= b <= self.max_batch:
            raise ValueError(f"batch {b} outside 1..{self.max_batch} (max_batch)")
        if s < 1 or p < 0 or p + s > self.max_context:
            raise ValueError(f"positions {p}..{p + s - 1} outside the cache of {self.max_context} (max_context)")
        if self.pos_embed is not None and p + s > self.pos_embed.shape[0]:
            raise ValueError(f"positions up to {p + s - 1} exceed the {self.pos_embed.shape[0]} learned positions")
        P = self._pass(b, s, p)
        with self._pin_all() if self._pin_all else nullcontext():  # one backend for every call: pinned once
            return self._forward(input_ids, P)

    def _forward(self, input_ids: torch.Tensor, P: _Pass) -> torch.Tensor:
        b, s, p = P.b, P.s, P.p
        if self.embed is None:
            x = input_ids
            if x.shape != (b, s, self.cfg.d_model) or not x.is_floating_point():
                raise ValueError(f"a bare layer stack (embeddings: false) takes hidden states [b, s, {self.cfg.d_model}]")
        else:
            with record_function("embed"):
                x = F.embedding(input_ids, self.embed)
        if self.pos_embed is not None:
            with record_function("pos_embed"):
                x = x + self.pos_embed[p:p + s]
        for layer in self.layers:
            x = layer(x, P)
        if self.embed is None:
            return x
        if self.final_norm is not None:
            with record_function("final_norm"):
                x = self.final_norm(x)
        with record_function("lm_head"):
            logits = F.linear(x, self.embed if self.lm_head is None else self.lm_head, self.lm_head_bias)
        c = self.cfg.final_logit_softcap
        if c is None:
            return logits
        with record_function("logit_softcap"):
            return torch.tanh(logits / c) * c


def build_decoder(cfg: ArchConfig, *, max_batch: int, max_context: int, dtype=torch.float32, device="cpu",
                  seed: int = 0, kernel: str = "flash", mla_mode: str = "absorbed", sdpa_backend: Optional[str] = None,
                  q_block: Optional[int] = None) -> ReferenceDecoder:
    """A :class:`ReferenceDecoder` of ``cfg`` with random weights (seeded) and a preallocated KV cache
    for ``max_batch`` sequences of ``max_context`` positions, in eval mode on ``device``.

    ``sdpa_backend``: the SDPA backend to pin (a name of :data:`lmcost.profiling.backends.BACKENDS`;
    None: the first that runs the model's attention here); the chosen one is the model's
    ``sdpa_backend`` attribute. ``q_block``: queries per tile of the absorbed MLA flash kernel.
    Raises: ValueError if the kernel, MLA mode, sizes or ``q_block`` are out of range, or the SDPA
    backend asked for cannot run the model's attention on ``device`` (torch's reason in the message).
    """
    return ReferenceDecoder(cfg, max_batch=max_batch, max_context=max_context, dtype=dtype, device=device,
                            seed=seed, kernel=kernel, mla_mode=mla_mode, sdpa_backend=sdpa_backend,
                            q_block=q_block).eval()
