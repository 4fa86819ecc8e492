"""The reference decoder's mixture of attention heads (JetMoE; :mod:`lmcost.operators.mixture_of_attention`): the
router, query experts, output experts and their combine, around the attention kernel of
:class:`lmcost.profiling.decoder_attention.Attention` (which holds the shared K/V projections and the cache).

As transformers' ``JetMoeMoA``: softmax over each token's top-k router logits; a token's k experts give it k*h_kv
query heads, slot j's KV head i at head j*h_kv + i (K/V repeated k times, ``repeat``, not interleaved). The kernel
groups a KV head's query heads together (head i*k + j), so the queries are transposed into that order and the
output back; the permutations are copies inside the projection scopes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig
from lmcost.profiling.decoder_common import _Init
from lmcost.profiling.decoder_ffn import MoE


class MoAHeads(nn.Module):
    """Router [E, d], query experts [E, h_kv*d_h, d], output experts [E, d, h_kv*d_h], an output bias [d] with
    ``attention.out_bias``: scopes ``attn.router``, ``attn.topk``, ``attn.q_proj`` (:meth:`query`) and
    ``attn.o_proj``, ``attn.combine`` (:meth:`output`)."""

    def __init__(self, cfg: ArchConfig, init: _Init):
        super().__init__()
        a, d = cfg.attention, cfg.d_model
        self.E, self.h_kv, self.d_h = a.moa_experts, cfg.h_kv, cfg.d_h
        self.k, self.w = a.n_heads // self.h_kv, self.h_kv * self.d_h
        self.w_router = init.matrix(self.E, d)
        self.w_q = init.matrix(self.E, self.w, d)
        self.w_o = init.matrix(self.E, d, self.w)
        self.b_o = init.bias(d, a.out_bias)
        self._routing = None

    def query(self, x, sc):
        """x [b, s, d] -> q [b, s, h, d_h], the heads of KV head i at i*k..i*k+k-1; keeps the routing for
        :meth:`output`."""
        b, s, d = x.shape
        x2 = x.reshape(b * s, d)
        with sc("attn.router"):
            logits = F.linear(x2, self.w_router)
        with sc("attn.topk"):
            top, idx = logits.topk(self.k, dim=-1)                       # [n, k]
            weight = torch.softmax(top, dim=-1)
            flat = idx.reshape(-1)
            order = torch.argsort(flat, stable=True)                     # (token, slot) pairs sorted by expert
            counts = torch.bincount(flat, minlength=self.E).tolist()
        with sc("attn.q_proj"):
            ys = MoE._experts(None, x2.index_select(0, order // self.k), self.w_q, counts, self.w)
            q = torch.empty_like(ys).index_copy_(0, order, ys)           # back to (token, slot) order
            q = q.view(b, s, self.k, self.h_kv, self.d_h).transpose(2, 3).reshape(b, s, self.k * self.h_kv, self.d_h)
        self._routing = (order, counts, weight)
        return q

    def output(self, o, sc):
        """o [b, s, h*d_h] (the kernel's head order) -> [b, s, d]: each pair's output expert, weighted, summed."""
        b, s = o.shape[:2]
        order, counts, weight = self._routing
        with sc("attn.o_proj"):
            pairs = o.view(b, s, self.h_kv, self.k, self.d_h).transpose(2, 3).reshape(b * s * self.k, self.w)
            ys = MoE._experts(None, pairs.index_select(0, order), self.w_o, counts, self.w_o.shape[1])
        with sc("attn.combine"):
            out = torch.zeros(b * s, ys.shape[1], dtype=o.dtype, device=o.device)
            out.index_add_(0, order // self.k, ys * weight.reshape(-1)[order][:, None].to(ys.dtype))
            if self.b_o is not None:
                out += self.b_o
        return out.view(b, s, -1)
