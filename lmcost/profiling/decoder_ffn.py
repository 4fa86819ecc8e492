"""The reference decoder's feed-forward layers (:mod:`lmcost.profiling.decoder`): plain or gated
(:class:`FFN`) and mixture of experts (:class:`MoE`: router, top-k, the experts hit, shared experts).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig
from lmcost.operators.ffn import NONLINEARITY
from lmcost.profiling.classic import XIELU
from lmcost.profiling.decoder_common import NONLINEAR_FN, Norm, _Init
from lmcost.profiling.decoder_kernels import _Pass


class FFN(nn.Module):
    """Plain act(x W_up) W_down or gated (act(x W_gate) * x W_up) W_down, scopes ``{prefix}gate``..."""

    def __init__(self, cfg: ArchConfig, init: _Init, d_ff: int, bias: bool, prefix: str = "ffn."):
        super().__init__()
        d = cfg.d_model
        self.prefix, self.gated = prefix, cfg.gated
        self.act = XIELU(init) if cfg.ffn.activation == "xielu" else NONLINEAR_FN[NONLINEARITY[cfg.ffn.activation]]
        self.glu = _gated_fn(cfg, self.act)
        if self.gated:
            self.w_gate, self.b_gate = init.matrix(d_ff, d), init.bias(d_ff, bias)
        self.w_up, self.b_up = init.matrix(d_ff, d), init.bias(d_ff, bias)
        self.w_down, self.b_down = init.matrix(d, d_ff), init.bias(d, bias)
        self.sub_norm = Norm(init, cfg.norm, d_ff, cfg.norm_bias) if cfg.sub_norms else None  # BitNet

    def forward(self, x, P: _Pass, sc):
        p = self.prefix
        if self.gated:
            with sc(f"{p}gate"):
                g = F.linear(x, self.w_gate, self.b_gate)
        with sc(f"{p}up"):
            u = F.linear(x, self.w_up, self.b_up)
        with sc(f"{p}act"):
            a = self.glu(g, u) if self.gated else self.act(u)
        if self.sub_norm is not None:
            with sc(f"{p}sub_norm"):
                a = self.sub_norm(a)
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
    per-expert biases, gpt-oss), shared experts, combine. With Z zero-computation experts (LongCat-Flash) the
    router scores E + Z and a pick of expert E.. returns the token itself, weighted in the combine."""

    def __init__(self, cfg: ArchConfig, init: _Init):
        super().__init__()
        m, d = cfg.moe, cfg.d_model
        self.E, self.k, self.d_e, self.gated = m.n_experts, m.top_k, m.d_ff_expert, cfg.gated
        self.Z = m.zero_experts
        self.act = NONLINEAR_FN[NONLINEARITY[cfg.ffn.activation]]
        self.glu = _gated_fn(cfg, self.act)
        self.w_router = init.matrix(m.n_experts + self.Z, d)  # (E + Z) x d
        self.b_router = init.bias(m.n_experts + self.Z, m.router_bias)
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
            if self.Z:  # the pairs on identity experts sort last: the experts run the first sum(counts[:E])
                counts, ffn_pairs = counts[:self.E], sum(counts[:self.E])
                id_token, id_weight = pair_token[ffn_pairs:], pair_weight[ffn_pairs:]
                pair_token, pair_weight = pair_token[:ffn_pairs], pair_weight[:ffn_pairs]
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
            if self.Z:
                out.index_add_(0, id_token, x2.index_select(0, id_token) * id_weight[:, None])
            if self.shared is not None:
                out += sh * torch.sigmoid(sg) if self.w_shared_gate is not None else sh
            return out.view(b, s, d)
