"""One rank's slice of the reference decoder (:mod:`lmcost.profiling.decoder`) under a TP/EP/PP/DP layout,
for the gloo runs of :mod:`lmcost.profiling.distributed` (whose docstring states the scheme): the weights a
rank keeps (:func:`_shard_attention`, :func:`_shard_ffn`, :class:`_ShardedMoE`), its blocks with their
all-reduces (:class:`_Block`), and its pipeline stage (:class:`_Stage`: embedding, layers, sends, lm_head);
where a rank sits in the layout (:class:`_Layout`: TP innermost, then DP, then PP).
"""

from __future__ import annotations
import copy
from contextlib import nullcontext
from dataclasses import dataclass
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from lmcost.profiling.decoder_attention import MLAttention
from lmcost.profiling.decoder_ffn import MoE


# ---------------------------------------------------------------------------------------------------
# Where a rank sits


@dataclass(frozen=True)
class _Layout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def ep_over_dp(self) -> bool:
        return self.ep > 1 and self.tp == 1

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(stage, replica, tp rank) of a global rank: TP innermost, then DP, then PP."""
        stage, rest = divmod(rank, self.tp * self.dp)
        replica, tp_rank = divmod(rest, self.tp)
        return stage, replica, tp_rank

    def rank(self, stage: int, replica: int, tp_rank: int) -> int:
        return (stage * self.dp + replica) * self.tp + tp_rank


# ---------------------------------------------------------------------------------------------------
# Sharding the weights of one rank


def _param(t):
    return None if t is None else nn.Parameter(t.contiguous().clone(), requires_grad=False)


def _clone(module: nn.Module, **attrs) -> nn.Module:
    """A shallow copy of ``module`` with its own parameter/buffer tables, then ``attrs`` set on it
    (tensors of parameter names wrapped as parameters), so the decoder's own forward runs the slice."""
    new = copy.copy(module)
    new._parameters, new._buffers, new._modules = dict(module._parameters), dict(module._buffers), dict(module._modules)
    for k, v in attrs.items():
        setattr(new, k, _param(v) if k in new._parameters else v)
    return new


def _rows(w, n: int, i: int):
    return None if w is None else w.chunk(n, 0)[i]


def _cols(w, n: int, i: int):
    return w.chunk(n, -1)[i]


def _shard_attention(attn, tp: int, r: int, b: int):
    """(attention module of TP rank r of tp, holding b sequences of cache; its o_proj bias, added after
    the all_reduce)."""
    C = attn.cache_tensors()[0].shape[1]
    if isinstance(attn, MLAttention):
        h = attn.h // tp
        q = dict(w_q_b=_rows(attn.w_q_b, tp, r)) if attn.q_lora else dict(w_q=_rows(attn.w_q, tp, r))
        w_kv_b = attn._w_heads().chunk(tp, 0)[r].reshape(h * (attn.d_nope + attn.d_v), attn.d_c)
        cache = torch.zeros(b, C, attn.d_c + attn.d_r, dtype=attn.kv_cache.dtype)
        new = _clone(attn, h=h, w_kv_b=w_kv_b, wo=_cols(attn.wo, tp, r), bo=None, kv_cache=cache, **q)
        return new, attn.bo
    h, d_h = attn.h // tp, attn.d_h
    if attn.h_kv >= tp:
        kv, kv0 = attn.h_kv // tp, r * attn.h_kv // tp
    else:  # tp > h_kv: the one KV head this rank's h/tp query heads share (head j uses KV head j // (h/h_kv))
        kv, kv0 = 1, (r * h) // (attn.h // attn.h_kv)
    kv_rows = slice(kv0 * d_h, (kv0 + kv) * d_h)
    pick = lambda t: None if t is None else t[kv_rows]  # noqa: E731
    cache = lambda: torch.zeros(b, C, kv, d_h, dtype=attn.k_cache.dtype)  # noqa: E731
    new = _clone(attn, h=h, h_kv=kv, wq=_rows(attn.wq, tp, r), bq=_rows(attn.bq, tp, r),
                 wk=pick(attn.wk), bk=pick(attn.bk), wv=pick(attn.wv), bv=pick(attn.bv),
                 wo=_cols(attn.wo, tp, r), bo=None, k_cache=cache(), v_cache=cache())
    return new, attn.bo


def _shard_ffn(ffn, tp: int, r: int):
    """(FFN module with d_ff/tp of the width: gate/up rows, down columns; its down bias, added once)."""
    gate = dict(w_gate=_rows(ffn.w_gate, tp, r), b_gate=_rows(ffn.b_gate, tp, r)) if ffn.gated else {}
    new = _clone(ffn, w_up=_rows(ffn.w_up, tp, r), b_up=_rows(ffn.b_up, tp, r), w_down=_cols(ffn.w_down, tp, r),
                 b_down=None, **gate)
    return new, ffn.b_down


class _ShardedMoE:
    """The routed experts e0..e0+E_loc-1 (each with d_e/etp of its width) and the shared experts (a
    sharded FFN) of one rank. TP modes return the partial sum to all-reduce; EP over DP exchanges
    rows with all_to_all and returns the whole output for the rank's tokens."""

    def __init__(self, moe: MoE, e0: int, n_local: int, etp: int, er: int, shared_tp: int, r: int, ep_group=None):
        self.moe, self.e0, self.E_loc, self.ep_group = moe, e0, n_local, ep_group
        experts = slice(e0, e0 + n_local)
        self.w_gate = moe.w_gate[experts].chunk(etp, 1)[er] if moe.gated else None
        self.w_up = moe.w_up[experts].chunk(etp, 1)[er]
        self.w_down = moe.w_down[experts].chunk(etp, 2)[er]
        self.shared = _shard_ffn(moe.shared, shared_tp, r)[0] if moe.shared is not None else None

    def _experts(self, xs, counts):
        """xs [rows, d] sorted by local expert, counts[e] rows each -> the experts' outputs [rows, d]."""
        m = self.moe
        d_e = self.w_up.shape[1]
        u = MoE._experts(m, xs, self.w_up, counts, d_e)
        a = m.act(MoE._experts(m, xs, self.w_gate, counts, d_e)) * u if m.gated else m.act(u)
        return MoE._experts(m, a, self.w_down, counts, xs.shape[1])

    def __call__(self, x, P, sc):
        m = self.moe
        b, s, d = x.shape
        x2 = x.reshape(b * s, d)
        weight, idx = torch.softmax(F.linear(x2, m.w_router), dim=-1).topk(m.k, dim=-1)  # [n, k], as MoE.forward
        flat = idx.reshape(-1)
        if self.ep_group is None:  # tokens replicated: keep the pairs routed to this rank's experts
            pairs = ((flat >= self.e0) & (flat < self.e0 + self.E_loc)).nonzero().squeeze(1)
            local = flat[pairs] - self.e0
            order = torch.argsort(local, stable=True)
            pairs = pairs[order]
            counts = torch.bincount(local, minlength=self.E_loc).tolist()
            y = self._experts(x2.index_select(0, pairs // m.k), counts)
        else:
            pairs = torch.argsort(flat, stable=True)   # by expert, hence by destination rank
            ep = m.E // self.E_loc
            send = torch.bincount(flat, minlength=m.E).view(ep, self.E_loc)  # [destination, its local expert]
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send, group=self.ep_group)         # counts, [source, my local expert]
            out_splits, in_splits = send.sum(1).tolist(), recv.sum(1).tolist()
            xs = x2.index_select(0, pairs // m.k)                            # [n*k, d], sent in order
            got = x2.new_empty(sum(in_splits), d)
            dist.all_to_all_single(got, xs, in_splits, out_splits, group=self.ep_group)  # dispatch
            eid = torch.repeat_interleave(torch.arange(self.E_loc).repeat(ep), recv.reshape(-1))
            order = torch.argsort(eid, stable=True)
            ys = torch.empty_like(got)
            ys[order] = self._experts(got[order], recv.sum(0).tolist())
            y = x2.new_empty(xs.shape)
            dist.all_to_all_single(y, ys, out_splits, in_splits, group=self.ep_group)    # combine
        out = torch.zeros_like(x2).index_add_(0, pairs // m.k, y * weight.reshape(-1)[pairs][:, None])
        if self.shared is not None:
            sh = self.shared(x2, P, sc)
            out += sh * torch.sigmoid(F.linear(x2, m.w_shared_gate)) if m.w_shared_gate is not None else sh
        return out.view(b, s, d)


class _Block:
    """One block of the rank: the decoder's norms (replicated), its sharded attention and FFN/MoE, and
    the all_reduce after each (one per parallel block), with the row-parallel biases added after it."""

    def __init__(self, blk, attn, attn_bias, ffn, ffn_bias, reduce):
        self.blk, self.attn, self.attn_bias, self.ffn, self.ffn_bias, self.reduce = (
            blk, attn, attn_bias, ffn, ffn_bias, reduce)

    def _out(self, y, *biases):
        y = self.reduce(y)
        for bias in biases:
            if bias is not None:
                y = y + bias
        return y

    def __call__(self, x, P):
        blk, sc = self.blk, self.blk.sc
        attn = lambda h: self._out(self.attn(h, P, sc), self.attn_bias)  # noqa: E731
        ffn = lambda h: self._out(self.ffn(h, P, sc), self.ffn_bias)  # noqa: E731
        if blk.kind == "parallel":
            ha = hf = blk.norm(x) if blk.parallel_shared else None
            if not blk.parallel_shared:
                ha, hf = blk.attn_norm(x), blk.ffn_norm(x)
            return x + self._out(self.attn(ha, P, sc) + self.ffn(hf, P, sc), self.attn_bias, self.ffn_bias)
        if blk.kind == "post_norm":
            x = blk.attn_norm(x + attn(x))
            return blk.ffn_norm(x + ffn(x))
        a = attn(blk.attn_norm(x))
        if blk.kind == "sandwich":
            a = blk.attn_post_norm(a)
        x = x + a
        f = ffn(blk.ffn_norm(x))
        if blk.kind == "sandwich":
            f = blk.ffn_post_norm(f)
        return x + f


class _Stage:
    """What one rank runs: its stage's layers for its replica's batch slice, sharded over its TP group."""

    def __init__(self, full, L: _Layout, rank: int, b: int, groups: dict):
        import numpy as np

        cfg, m = full.cfg, full.cfg.moe
        self.full, self.L, self.b = full, L, b
        stage, replica, r = L.coords(rank)
        self.r, self.tp_group, self.pp_group = r, groups["tp"], groups["pp"]
        self.first, self.last = stage == 0, stage == L.pp - 1
        self.prev = L.rank(stage - 1, replica, r) if not self.first else None
        self.next = L.rank(stage + 1, replica, r) if not self.last else None
        V = cfg.vocab_size
        self.v0, self.v_loc = r * V // L.tp, V // L.tp
        self.embed = _rows(full.embed, L.tp, r) if self.first else None
        head = full.embed if full.lm_head is None else full.lm_head
        self.lm_head = _rows(head, L.tp, r) if self.last else None
        reduce = self._all_reduce if L.tp > 1 else (lambda y: y)
        self.blocks = []
        for i in np.array_split(np.arange(cfg.n_layers), L.pp)[stage]:
            blk = full.layers[int(i)]
            attn, attn_bias = _shard_attention(blk.attn, L.tp, r, b)
            if isinstance(blk.ffn, MoE):
                if L.ep_over_dp:
                    E_loc = m.n_experts // L.ep
                    ffn = _ShardedMoE(blk.ffn, replica * E_loc, E_loc, 1, 0, 1, 0, ep_group=groups["ep"])
                else:
                    etp = L.tp // L.ep
                    E_loc = m.n_experts // L.ep
                    ffn = _ShardedMoE(blk.ffn, (r // etp) * E_loc, E_loc, etp, r % etp, L.tp, r)
                ffn_bias = None
            else:
                ffn, ffn_bias = _shard_ffn(blk.ffn, L.tp, r)
            self.blocks.append(_Block(blk, attn, attn_bias, ffn, ffn_bias, reduce))

    def _all_reduce(self, y):
        y = y.contiguous()
        dist.all_reduce(y, group=self.tp_group)
        return y

    def forward(self, ids, p: int):
        """Logits [b, s, V] on the last stage (None elsewhere) of ids [b, s] at positions p..p+s-1."""
        full, b, s, d = self.full, ids.shape[0], ids.shape[1], self.full.cfg.d_model
        if self.first:
            if self.L.tp > 1:  # vocab-parallel lookup: the rows this rank holds, zeros elsewhere, summed
                local = ids - self.v0
                miss = (local < 0) | (local >= self.v_loc)
                x = F.embedding(local.masked_fill(miss, 0), self.embed).masked_fill(miss[..., None], 0.0)
                x = self._all_reduce(x)
            else:
                x = F.embedding(ids, self.embed)
            if full.pos_embed is not None:
                x = x + full.pos_embed[p:p + s]
        else:
            x = torch.empty(b, s, d, dtype=full.dtype)
            dist.recv(x, src=self.prev, group=self.pp_group)
        P = full._pass(b, s, p)
        with full._pin_all() if full._pin_all else nullcontext():
            for blk in self.blocks:
                x = blk(x, P)
        if not self.last:
            dist.send(x.contiguous(), dst=self.next, group=self.pp_group)
            return None
        if full.final_norm is not None:
            x = full.final_norm(x)
        logits = F.linear(x, self.lm_head)
        if self.L.tp == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.L.tp)]
        dist.all_gather(parts, logits.contiguous(), group=self.tp_group)
        return torch.cat(parts, -1)
