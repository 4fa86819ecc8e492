"""A PyTorch reference decoder built from the same :class:`~lmcost.model.config.ArchConfig` as the analytic model.

Every analytic operator of :func:`lmcost.operators.forward.forward_ops` runs inside a
``torch.profiler.record_function`` scope of exactly its name (``layers.attn.q_proj``,
``layers.moe.expert.down``, ...), so a profile lines up with the prediction operator by operator. In a
flash kernel the softmax is fused into ``attn.sdpa`` and has no scope of its own.

Attention kernels (``kernel``): ``flash`` calls SDPA with the backend pinned for the run
(:mod:`lmcost.profiling.backends`; the model's ``sdpa_backend`` attribute names it, and a call it
cannot run raises instead of falling back), except absorbed MLA, which no SDPA backend runs without
repeating the latent per head (d_qk = d_c + d_r != d_v = d_c): there ``attn.sdpa`` is explicit
matmuls over the latent, read once, in tiles of queries that skip the keys they cannot see
(:func:`~lmcost.profiling.decoder_kernels._latent_attention`), as the analytic flash record counts. ``naive`` runs the score matrix in full.

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
  first chunk and appends its own (:func:`~lmcost.profiling.decoder_kernels._chunk_plan`), reading t - floor((t - s)/C)*C keys.
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
  the expert outputs and adds the (optionally sigmoid-gated) shared experts. Zero-computation experts
  (``moe.zero_experts``): the router scores E + Z, the pairs on an identity expert skip the expert scopes
  and join ``moe.combine`` as the token itself; the shortcut MoE and the post-MoE norm:
  :mod:`lmcost.profiling.moe_variants`.

The rooms: this module assembles blocks and the model; a layer's parts are in
:mod:`~lmcost.profiling.decoder_attention` (attention, MLA), :mod:`~lmcost.profiling.decoder_ffn` (FFN, MoE),
:mod:`~lmcost.profiling.recurrent` (constant-state mixers) and :mod:`~lmcost.profiling.decoder_common`
(weights, norms, cache buffers); what a pass reads and the attention kernels are in
:mod:`~lmcost.profiling.decoder_kernels`.

torch is imported only inside :mod:`lmcost.profiling`; the analytic core never needs it.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision, canonical
from lmcost.operators.forward import KERNELS, MLA_MODES, Dims, forward_ops
from lmcost.profiling.backends import EXPLICIT, VARIANTS, sdpa_backend
from lmcost.profiling.classic import sinusoid_table
from lmcost.profiling.decoder_attention import Attention, MLAttention
from lmcost.profiling.decoder_common import ROPE_BASE, Norm, _Init
from lmcost.profiling.decoder_ffn import FFN
from lmcost.profiling.moe_variants import moe_sublayer
from lmcost.profiling.sparse_attention import SparseMLAttention
from lmcost.profiling.decoder_kernels import _chunk_plan, _Pass, _plan, latent_q_block
from lmcost.profiling.torch_dtypes import TORCH_DTYPES

#: lmcost dtype name of each torch dtype the decoder runs in.
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


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
    ``attn.softmax``, ``attn.softcap`` and ``attn.alibi`` of a flash kernel and ``attn.sinks`` (inside the softmax)."""
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1), kernel, mla_mode)
    return {op.name for op in ops if not ((kernel == "flash" and op.role in ("attn.softmax", "attn.softcap", "attn.alibi"))
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


class Block(nn.Module):
    """One transformer block: pre_norm, post_norm, sandwich or parallel (see lmcost.operators.forward.block_ops)."""

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
        attn_cls = SparseMLAttention if cfg.attention.sparse is not None else attn_cls  # DSA: MLA + indexer
        self.attn = attn_cls(cfg, init, kind == "local" if attn_cls is MLAttention else kind, max_batch, max_context)
        if cfg.block == "sandwich":
            self.attn_post_norm = norm()
        if not self.parallel_shared:
            self.ffn_norm = norm()
        self.ffn = moe_sublayer(cfg, init) if moe else FFN(cfg, init, cfg.ffn.d_ff, cfg.ffn.bias)
        if cfg.block == "sandwich":
            self.ffn_post_norm = norm()
        self.attn_scale = init.ones(cfg.d_model) if cfg.residual_scale else None  # Doge: w [d] * x + f(x)
        self.ffn_scale = init.ones(cfg.d_model) if cfg.residual_scale else None

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
            x = x + a if self.attn_scale is None else self.attn_scale * x + a  # Doge: a learned scale on the skip
        with sc("ffn_norm"):
            h = self.ffn_norm(x)
        f = self.ffn(h, P, sc)
        if self.kind == "sandwich":
            with sc("ffn_post_norm"):
                f = self.ffn_post_norm(f)
        with sc("ffn_residual"):
            return x + f if self.ffn_scale is None else self.ffn_scale * x + f


class ReferenceDecoder(nn.Module):
    """The decoder of one ArchConfig with a preallocated KV cache; see the module docstring.

    ``sdpa_backend`` (attribute): the SDPA backend every attention call of a run is pinned to, found
    once for the model's shapes, dtype and device (:func:`lmcost.profiling.backends.sdpa_backend`):
    one name (``flash_attention``, ``efficient_attention``, ``cudnn_attention``, ``math``), or
    ``causal=NAME,masked=NAME,full=NAME`` when the call variants need different ones, or
    ``explicit`` when attention runs as the decoder's own matmuls with no SDPA call (the naive
    kernel; absorbed MLA, see :func:`~lmcost.profiling.decoder_kernels._latent_attention`). ``q_block`` (attribute): queries per tile of
    the absorbed MLA flash kernel (None: :func:`~lmcost.profiling.decoder_kernels.latent_q_block`).
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
        self.embed_norm = Norm(init, cfg.norm, d, cfg.norm_bias, cfg.norm_weight) if cfg.embedding_norm else None
        self.pos_embed = (init.normal((cfg.max_positions + cfg.position_offset, d), 1.0)
                          if cfg.positions == "learned" else None)
        if cfg.positions == "sinusoidal":  # a buffer, not a parameter (XGLM, CTRL)
            self.register_buffer("pos_table", sinusoid_table(max_context, d).to(device=device, dtype=dtype),
                                 persistent=False)
        prefixes = _group_prefixes(cfg)
        if cfg.recurrent is not None:  # a hybrid stack: pre-norm blocks of any mixer and FFN (or none)
            from lmcost.profiling.recurrent import HybridBlock

            parts = dict(Norm=Norm, Attention=Attention, MLAttention=MLAttention, FFN=FFN, MoE=moe_sublayer)
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
                or a.logit_softcap is not None or a.dynamic_mask:  # SDPA has no sinks or soft-capping: explicit matmuls
            self.sdpa_backend = EXPLICIT
            return
        if mla is not None:  # up-projected MLA: h heads of K [d_nope + d_r] and V [d_v]
            shape = dict(heads=cfg.attention.n_heads, kv_heads=cfg.attention.n_heads,
                         d_qk=mla.qk_nope_head_dim + mla.qk_rope_head_dim, d_v=mla.v_head_dim)
        else:
            shape = dict(heads=cfg.attention.n_heads, kv_heads=cfg.h_kv, d_qk=cfg.d_h, d_v=a.v_head_dim or cfg.d_h)
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
            if self.embed_norm is not None:  # BLOOM's word_embeddings_layernorm
                with record_function("embed_norm"):
                    x = self.embed_norm(x)
        if self.pos_embed is not None:
            with record_function("pos_embed"):
                x = x + self.pos_embed[p:p + s]
        elif self.cfg.positions == "sinusoidal":
            with record_function("pos_embed"):
                x = x + self.pos_table[p:p + s]
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
