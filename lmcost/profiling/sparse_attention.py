"""The reference decoder's DSA layer (:mod:`lmcost.profiling.decoder`): MLA with DeepSeek-V3.2's lightning indexer,
each analytic operator of :mod:`lmcost.operators.sparse_attention` in a profiler scope of its name.

The indexer (DeepseekV32Indexer in transformers): q_I = c_q W_qI [b,s,H,D] from MLA's normed query latent; the index
key k_I = LayerNorm(x W_k) [b,s,D], written into the layer's index cache [max_batch, max_context, D] (model dtype,
``index_cache: kv``) and rotated there (RoPE on its first d_r dims, rotate-half, as the decoder's other RoPE); head
weights w = x W_w [b,s,H]; scores I = sum_h w_h * relu(q_I,h . k_I / sqrt(D)) over every cached key, the causal mask,
and the top min(top_k, t) keys of each query. Both kernels score all t keys per query (FlopCounterMode counts the
two matmuls in full, the analytic ``naive`` indexer; the analytic ``flash`` indexer counts the causal pairs a fused
kernel computes).

The attention over the selected keys: ``naive`` scatters the indices into a [b,s,t] mask (``attn.index_mask``) and
runs MLA's dense kernel under it, as transformers' eager path does; ``flash`` with absorbed MLA gathers each query's
min(top_k, t) selected latents and attends to those only (:func:`_gather_attention`: 2*b*s*h*min(top_k, t)*(2*d_c +
d_r) FLOPs, the analytic sparse count exactly in a decode step, and in a prefill once every query is past top_k;
the queries before it are padded to min(top_k, t) keys, masked); flash with naive MLA runs SDPA under the mask.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

import torch
import torch.nn.functional as F

from lmcost.model.config import ArchConfig
from lmcost.profiling.decoder_attention import MLAttention
from lmcost.profiling.decoder_common import Norm, _cache, _Init
from lmcost.profiling.decoder_kernels import _Pass, _Plan, _rotate


class SparseMLAttention(MLAttention):
    """MLA with a DSA indexer (global layers: the schema refuses windows with ``attention.sparse``)."""

    def __init__(self, cfg: ArchConfig, init: _Init, local, max_batch: int, max_context: int):
        """Raises: ValueError for an fp8 or bf16 index cache other than the model's dtype (not built here)."""
        super().__init__(cfg, init, False, max_batch, max_context)
        sp = cfg.attention.sparse
        if sp.index_cache != "kv":
            raise ValueError(f"index_cache {sp.index_cache}: the reference decoder keeps index keys in its own dtype "
                             "(index_cache: kv)")
        self.H, self.D, self.top_k = sp.index_heads, sp.index_head_dim, sp.top_k
        d = cfg.d_model
        self.w_iq = init.matrix(self.H * self.D, self.q_lora)
        self.w_ik = init.matrix(self.D, d)
        self.ik_norm = Norm(init, "layernorm", self.D, bias=True)
        self.w_iw = init.matrix(self.H, d)
        self.register_buffer("index_cache", _cache((max_batch, max_context, self.D), init.dtype, init.device),
                             persistent=False)

    def cache_tensors(self):
        return [self.kv_cache, self.index_cache]

    def _select(self, x, cq, P: _Pass, sc, plan: _Plan) -> _Plan:
        """Run the indexer; return the plan with each query's selected keys as its mask: ``mask`` [b,1,s,t] (True:
        attended), ``masked_out`` [b,1,1,s,t], and ``indices`` [b,s,min(top_k,t)] with ``selected`` [b,s,k] for the
        gather kernel."""
        b, s = x.shape[:2]
        H, D, t = self.H, self.D, P.p + s
        with sc("attn.indexer.q_proj"):
            q = F.linear(cq, self.w_iq).view(b, s, H, D)
        with sc("attn.indexer.k_proj"):
            k = F.linear(x, self.w_ik)
        with sc("attn.indexer.k_norm"):
            self.index_cache[:b, P.p:t] = self.ik_norm(k)
        if P.cos is not None:
            with sc("attn.indexer.rope"):
                _rotate(q, P.cos, P.sin)
                _rotate(self.index_cache[:b, P.p:t].unsqueeze(2), P.cos, P.sin)
        with sc("attn.indexer.weights_proj"):
            w = F.linear(x, self.w_iw) * H ** -0.5
        causal = torch.arange(t, device=x.device)[None, :] <= torch.arange(P.p, t, device=x.device)[:, None]  # [s, t]
        flash = P.kernel == "flash"
        with sc("attn.indexer.score"):
            scores = torch.bmm(q.reshape(b, s * H, D), self.index_cache[:b, :t].transpose(1, 2))  # [b, s*H, t]
            with sc("attn.indexer.relu"):
                scores = torch.relu(scores * D ** -0.5)
            if flash:  # one fused kernel: the head-weighted sum in the score's scope
                index = torch.bmm(w.reshape(b * s, 1, H), scores.view(b * s, H, t)).view(b, s, t)
        if not flash:
            with sc("attn.indexer.weight_sum"):
                index = torch.bmm(w.reshape(b * s, 1, H), scores.view(b * s, H, t)).view(b, s, t)
        with sc("attn.indexer.topk"):
            index = index.masked_fill(~causal, float("-inf"))
            indices = index.topk(min(self.top_k, t), dim=-1).indices                          # [b, s, k]
            selected = causal[None].expand(b, s, t).gather(-1, indices)                      # valid picks
        if flash and P.mla_mode == "absorbed":  # the gather kernel reads the indices
            out = replace(plan, mask=None, masked_out=None, causal=False, tiled=False, tiles={})
            out.indices, out.selected = indices, selected
            return out
        # transformers' path (and SDPA's, for flash over naive MLA): the indices scattered into a mask
        with (nullcontext() if flash else sc("attn.index_mask")):
            keep = torch.zeros(b, s, t, dtype=torch.bool, device=x.device).scatter_(-1, indices, True) & causal
        return replace(plan, mask=keep[:, None], masked_out=~keep[:, None, None], causal=False, tiled=False, tiles={})

    @staticmethod
    def _latent(sc, P: _Pass, plan: _Plan, q, span, d_c: int, scale: float):
        return _gather_attention(sc, plan, q, span, d_c, scale)


def _gather_attention(sc, plan, q, span, d_c: int, scale: float):
    """DSA's sparse absorbed-MLA kernel (FlashMLA's sparse decoding, in matmuls): per query, its k selected
    latents gathered from the cache, scores over them (the h heads as rows), softmax, the weighted latent.

    Shapes: q [b, s, h, d_c + d_r]; span() [b, t, d_c + d_r]; plan.indices [b, s, k], plan.selected [b, s, k]
    (False: a pick past the query, when the query has fewer than k keys). Returns o_lat [b, s, h*d_c].
    FLOPs: 2*b*s*h*k*(d_c + d_r + d_c).
    """
    b, s, h, dq = q.shape
    with sc("attn.sdpa"):
        kv = span()
        k = plan.indices.shape[-1]
        keys = kv.gather(1, plan.indices.reshape(b, s * k, 1).expand(b, s * k, dq)).view(b * s, k, dq)
        zero = torch.zeros((), dtype=q.dtype, device=q.device).expand(b * s, h, k)
        scores = torch.baddbmm(zero, q.reshape(b * s, h, dq), keys.transpose(1, 2), beta=0, alpha=scale)
        scores = scores.masked_fill(~plan.selected.reshape(b * s, 1, k), float("-inf"))
        o = torch.bmm(torch.softmax(scores, dim=-1), keys[..., :d_c])
        return o.view(b, s, h * d_c)
