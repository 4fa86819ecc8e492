"""The reference decoder's attention layers (:mod:`lmcost.profiling.decoder`): MHA/GQA/MQA with their
variants (:class:`Attention`) and multi-head latent attention (:class:`MLAttention`), each opening a
profiler scope per analytic operator and running its kernel from :mod:`lmcost.profiling.decoder_kernels`.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig
from lmcost.profiling.decoder_common import NORM_EPS, Norm, _cache, _Init
from lmcost.profiling.mixture_of_attention import MoAHeads
from lmcost.profiling.classic import Differential
from lmcost.profiling.decoder_kernels import _assemble, _core, _latent_attention, _Pass, _Plan, _rotate, alibi_slopes


class Attention(nn.Module):
    """MHA/GQA/MQA, global, sliding-window or chunked, with optional QK-norm, (partial) RoPE or none on
    this layer (a ``_nope`` kind), sinks, soft-capped scores, ALiBi biases, (on NoPE layers) temperature tuning,
    an output gate (Qwen3-Next's sigmoid gate from q_proj, Laguna's softplus gate from g_proj) and clipped
    q/k/v (DBRX)."""

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
        if local and a.local_kv_heads:  # MiMo-V2-Flash: its sliding layers' own KV heads
            self.h_kv = a.local_kv_heads
        self.d_v = a.v_head_dim or self.d_h  # MiMo-V2-Flash: value heads narrower than q/k heads
        self.w = a.sliding_window if local else None
        self.sinks = init.normal((a.n_heads,), 1.0) if a.sinks is True or (a.sinks == "local" and local) else None
        self.softcap = a.logit_softcap
        self.alibi = alibi_slopes(a.n_heads).to(init.device) if cfg.positions == "alibi" else None
        self.temperature = a.temperature_tuning and not self.rope
        self.clip = a.clip_qkv  # DBRX: q, k, v clamped to [-clip, clip] (lmcost.operators.clip_qkv)
        d, hd, kvd = cfg.d_model, self.h * self.d_h, self.h_kv * self.d_h
        self.gated = a.output_gate  # Qwen3-Next: q_proj yields each head's query, then its output gate
        qd = 2 * hd if self.gated else hd
        self.gate_bias = init.bias(self.h, a.output_gate_bias)  # Beam: a bias per head on the gate
        self.softplus_gate = a.softplus_gate  # Laguna: g_proj [d, h or h*d_h], o * softplus(gate)
        if self.softplus_gate:
            self.wg = init.matrix(self.h if self.softplus_gate == "head" else hd, d)
        if a.dynamic_mask:  # Doge: dt_proj [h_kv, h_kv*d_h] (+ bias) and A [h_kv]
            self.w_dt, self.b_dt = init.matrix(self.h_kv, self.h_kv * self.d_h), init.bias(self.h_kv, a.qkv_bias)
            self.A = init.normal((self.h_kv,), 1.0)
        self.dynamic_mask = a.dynamic_mask
        self.moa = MoAHeads(cfg, init) if a.moa_experts else None  # JetMoE: query and output experts
        if self.moa is None:
            self.wq, self.bq = init.matrix(qd, d), init.bias(qd, a.qkv_bias)
        self.wk, self.bk = init.matrix(kvd, d), init.bias(kvd, a.qkv_bias)
        self.wv, self.bv = init.matrix(self.h_kv * self.d_v, d), init.bias(self.h_kv * self.d_v, a.qkv_bias)
        self.qk_norm = a.qk_norm if (a.qk_norm != "l2" or self.rope) else "none"
        if self.qk_norm in ("head", "full", "head_layernorm"):
            full, kind = a.qk_norm == "full", "layernorm" if a.qk_norm == "head_layernorm" else "rmsnorm"
            self.q_norm = Norm(init, kind, hd if full else self.d_h, bias=kind == "layernorm")
            self.k_norm = Norm(init, kind, kvd if full else self.d_h, bias=kind == "layernorm")
        if self.moa is None:
            self.wo, self.bo = init.matrix(d, self.h * self.d_v), init.bias(d, a.out_bias)
        self.sub_norm = Norm(init, cfg.norm, self.h * self.d_v, cfg.norm_bias) if cfg.sub_norms else None  # BitNet
        self.diff = Differential(init, self.d_h) if a.differential else None  # DiffLlama
        C = min(max_context, self.w) if local else max_context
        if mask == "chunked":
            C = min(max_context, a.chunk_size)
        shape = (max_batch, C, self.h_kv, self.d_h)
        self.register_buffer("k_cache", _cache(shape, init.dtype, init.device), persistent=False)
        self.register_buffer("v_cache", _cache((*shape[:3], self.d_v), init.dtype, init.device), persistent=False)

    def cache_tensors(self):
        return [self.k_cache, self.v_cache]

    def _dynamic_mask(self, v, sc):
        """Doge's dynamic mask (transformers DogeAttention): the values of the keys read, v [b, t_k, h_kv, d_h] ->
        a bias exp(A * softplus(v W_dt + b_dt)) [b, t_k, h_kv] per key and KV head (keep_window_size not applied:
        a top-k mask past it changes no cost)."""
        with sc("attn.dt_proj"):
            dt = F.linear(v.reshape(*v.shape[:2], -1), self.w_dt, self.b_dt)
        with sc("attn.dynamic_mask"):
            return torch.exp(self.A * F.softplus(dt))

    def _qk_norm(self, norm: Norm, x):
        if self.qk_norm == "l2":  # Llama4TextL2Norm: x * rsqrt(mean(x^2) + eps) per head, no weight
            return F.rms_norm(x, (self.d_h,), None, NORM_EPS)
        if self.qk_norm in ("head", "head_layernorm"):
            return norm(x)
        return norm(x.reshape(*x.shape[:2], -1)).view(x.shape)

    def forward(self, x, P: _Pass, sc):
        b, s = x.shape[:2]
        plan: _Plan = P.plans[self.plan_key]
        with nullcontext() if self.moa is not None else sc("attn.q_proj"):
            if self.moa is not None:  # JetMoE: scopes of its own (attn.router, attn.topk, attn.q_proj)
                q = self.moa.query(x, sc)
            elif self.gated:
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
            v = F.linear(x, self.wv, self.bv).view(b, s, self.h_kv, self.d_v)
            if plan.direct:
                self.v_cache[:b, plan.write_at:plan.write_at + s] = v
                v = self.v_cache[:b, plan.write_at:plan.write_at + s]
        if self.clip is not None:
            with sc("attn.clip_qkv"):
                for t in (q, k, v):  # in place: k and v may be views of the cache
                    t.clamp_(-self.clip, self.clip)
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
        key_bias = self._dynamic_mask(values(), sc) if self.dynamic_mask else None
        if self.diff is not None:  # one attention call per half of the value heads, then their combination
            halves = [self.diff.half(values, i, self.h_kv) for i in (0, 1)]
            o1, o2 = (_core(sc, P, plan, q, keys, v, self.d_h ** -0.5) for v in halves)
            with sc("attn.diff"):
                o = self.diff(o1, o2, self.h)
        else:
            o = _core(sc, P, plan, q, keys, values, self.d_h ** -0.5, self.sinks, self.softcap, self.alibi, key_bias)
        if self.gated:
            with sc("attn.gate"):
                if self.gate_bias is not None:
                    gate = gate + self.gate_bias[None, None, :, None]
                o = o * torch.sigmoid(gate.reshape(b, s, self.h * self.d_h))
        if self.softplus_gate:
            with sc("attn.g_proj"):
                g = F.linear(x, self.wg)
            with sc("attn.gate"):
                g = F.softplus(g.float()).to(o.dtype)
                o = (o.view(b, s, self.h, self.d_h) * g.view(b, s, self.h, -1)).view(b, s, -1)
        if self.sub_norm is not None:
            with sc("attn.sub_norm"):
                o = self.sub_norm(o)
        if self.moa is not None:
            return self.moa.output(o, sc)
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

    def _select(self, x, cq, P: _Pass, sc, plan: _Plan) -> _Plan:
        """The keys each query attends to: the pass's plan (DSA's indexer narrows it:
        :class:`lmcost.profiling.sparse_attention.SparseMLAttention`)."""
        return plan

    #: Absorbed MLA's flash kernel over the latent (DSA's: a gather of each query's top-k keys).
    _latent = staticmethod(_latent_attention)

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
        plan = self._select(x, cq if self.q_lora else None, P, sc, plan)
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
                o = self._latent(sc, P, plan, q, span, d_c, scale)
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
