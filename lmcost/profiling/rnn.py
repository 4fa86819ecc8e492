"""The reference decoder's recurrent (RNN-style) mixers (see :mod:`lmcost.operators.rnn`, the analytic operators
they run under the same ``record_function`` names), built by :class:`lmcost.profiling.recurrent.HybridBlock`.

- :class:`RGLRUMixer`: Griffin's recurrent block (De et al. 2024, section 2.4; weights and order as
  transformers' RecurrentGemmaRecurrentBlock): y = GeLU(W_y x); u = conv(W_x x), a depthwise causal conv of K
  taps with bias as K shifted multiply-adds (vector work, as the analytic ``mixer.conv``), continuing its
  state of the last K - 1 inputs [W, K - 1] (model dtype); the RG-LRU's gates as block-diagonal baddbmm
  (the analytic ``mixer.input_gate``/``mixer.a_gate`` matmuls); a = exp(-8 r softplus(Λ)),
  h_t = a h_{t-1} + sqrt(1 - a²) (i u_t), with a = 0 and the multiplier 1 at position 0 (transformers'
  reset), run over the positions in fp32 from the cached state h [W]; W_out (h * y).
- :class:`RWKV4TimeMix` and :class:`RWKV4ChannelMix`: RWKV-4's time mixing (the mixer) and channel mixing (the
  FFN of the same block; weights and order as transformers' RwkvSelfAttention and RwkvFeedForward): token
  shifts from the cached previous x (both kept by the mixer, model dtype, so the decoder's cache is the
  mixer's), the WKV recurrence in its stable form (rwkv_linear_attention_cpu) from the cached numerator,
  denominator and max (fp32).

Arguments as in :mod:`lmcost.profiling.recurrent`: ``init`` the decoder's seeded weight source, ``P`` its
pass (b, s, start position p), ``sc`` the block's scope opener.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig


class RGLRUMixer(nn.Module):
    """Griffin's RG-LRU recurrent block (see the module docstring)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        g, d = cfg.recurrent.rg_lru, cfg.d_model
        self.W, self.nb, self.K = g.width, g.n_blocks, g.d_conv
        bw = self.W // self.nb
        self.w_y, self.b_y = init.matrix(self.W, d), init.bias(self.W)
        self.w_x, self.b_x = init.matrix(self.W, d), init.bias(self.W)
        self.w_conv, self.b_conv = init.matrix(self.W, self.K, fan_in=self.K), init.bias(self.W)
        self.w_i, self.b_i = init.matrix(self.nb, bw, bw), init.normal((self.nb, bw), 0.02)
        self.w_a, self.b_a = init.matrix(self.nb, bw, bw), init.normal((self.nb, bw), 0.02)
        self.lam = init.normal((self.W,), 0.5)
        self.w_out, self.b_out = init.matrix(d, self.W), init.bias(d)
        self.register_buffer("conv_state", torch.zeros(max_batch, self.W, self.K - 1, dtype=init.dtype,
                                                       device=init.device), persistent=False)
        self.register_buffer("lru_state", torch.zeros(max_batch, self.W, dtype=torch.float32, device=init.device),
                             persistent=False)

    def cache_tensors(self):
        return [self.conv_state, self.lru_state]

    def state_tensors(self):
        """The fp32 RG-LRU states (the conv states are in the model dtype)."""
        return [self.lru_state]

    def _conv(self, sc, u_new, b, p):
        """Depthwise causal conv over u_new [b, W, s], continuing the last K - 1 inputs when p > 0."""
        K, s = self.K, u_new.shape[-1]
        with sc("mixer.conv"):
            prev = self.conv_state[:b] if p > 0 else torch.zeros_like(self.conv_state[:b])
            u = torch.cat([prev.to(u_new.dtype), u_new], -1)                  # [b, W, K - 1 + s]
            if K > 1:
                with torch.no_grad():
                    self.conv_state[:b].copy_(u[..., -(K - 1):])
            out = u[..., :s] * self.w_conv[:, 0:1]
            for k in range(1, K):
                out = out + u[..., k:k + s] * self.w_conv[:, k:k + 1]
            return out + self.b_conv[:, None]

    def _gate(self, sc, name, u, w, bias):
        """A block-diagonal projection (baddbmm over the n_blocks blocks, as RecurrentGemmaRglru): [b, s, W]."""
        b, s, W = u.shape
        with sc(name):
            blocks = u.reshape(b * s, self.nb, W // self.nb).permute(1, 0, 2)
            return torch.baddbmm(bias[:, None, :], blocks, w).transpose(0, 1).reshape(b, s, W)

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        with sc("mixer.linear_y"):
            y = F.linear(x, self.w_y, self.b_y)
        with sc("mixer.y_act"):
            y = F.gelu(y, approximate="tanh")
        with sc("mixer.linear_x"):
            u = F.linear(x, self.w_x, self.b_x)
        u = self._conv(sc, u.transpose(1, 2), b, P.p).transpose(1, 2)         # [b, s, W]
        gi = self._gate(sc, "mixer.input_gate", u, self.w_i, self.b_i)
        ga = self._gate(sc, "mixer.a_gate", u, self.w_a, self.b_a)
        with sc("mixer.rg_lru"):
            log_a = -8.0 * torch.sigmoid(ga) * F.softplus(self.lam)
            a, a2 = torch.exp(log_a), torch.exp(2 * log_a)
            mult = torch.sqrt(1 - a2)
            if P.p == 0:  # position 0 starts the sequence: no decay of a state, no normalisation
                a, mult = a.clone(), mult.clone()
                a[:, 0], mult[:, 0] = 0.0, 1.0
            xs = u * torch.sigmoid(gi) * mult.to(u.dtype)
            h = self.lru_state[:b].clone() if P.p > 0 else torch.zeros_like(self.lru_state[:b])
            out = torch.empty_like(xs)
            for t in range(s):
                h = a[:, t].float() * h + xs[:, t].float()
                out[:, t] = h.to(xs.dtype)
            with torch.no_grad():
                self.lru_state[:b].copy_(h)
        with sc("mixer.gate_out"):
            o = out * y
        with sc("mixer.linear_out"):
            return F.linear(o, self.w_out, self.b_out)


def _token_shift(sc, name, x, prev_state, b, p, mixes):
    """RWKV's token shift: x [b, s, d] and x_prev (the previous position's x; the cached one at the first new
    position when p > 0, else zeros), each mu in ``mixes`` giving x * mu + x_prev * (1 - mu); writes the last
    x into ``prev_state`` [max_b, d]. Returns the mixes."""
    with sc(name):
        first = prev_state[:b, None].to(x.dtype) if p > 0 else torch.zeros_like(x[:, :1])
        prev = torch.cat([first, x[:, :-1]], 1)
        with torch.no_grad():
            prev_state[:b].copy_(x[:, -1])
        return [x * mu + prev * (1 - mu) for mu in mixes]


class RWKV4TimeMix(nn.Module):
    """RWKV-4's time mixing (see the module docstring); owns its block's cache: x_prev of the time and the
    channel mixing [max_b, d] and the WKV state [max_b, 3, A] (numerator, denominator, max; fp32)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        d = cfg.d_model
        A = cfg.recurrent.rwkv4.width or d
        self.decay, self.first = init.normal((A,), 0.5), init.normal((A,), 0.5)
        self.mu_k, self.mu_v, self.mu_r = (init.normal((d,), 0.3) for _ in range(3))
        self.w_k, self.w_v, self.w_r = init.matrix(A, d), init.matrix(A, d), init.matrix(A, d)
        self.w_o = init.matrix(d, A)
        kw = dict(dtype=init.dtype, device=init.device)
        self.register_buffer("att_prev", torch.zeros(max_batch, d, **kw), persistent=False)
        self.register_buffer("ffn_prev", torch.zeros(max_batch, d, **kw), persistent=False)
        self.register_buffer("wkv_state", torch.zeros(max_batch, 3, A, dtype=torch.float32, device=init.device),
                             persistent=False)

    def cache_tensors(self):
        return [self.att_prev, self.ffn_prev, self.wkv_state]

    def state_tensors(self):
        return [self.wkv_state]

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        xk, xv, xr = _token_shift(sc, "mixer.token_shift", x, self.att_prev, b, P.p, (self.mu_k, self.mu_v, self.mu_r))
        with sc("mixer.key"):
            k = F.linear(xk, self.w_k)
        with sc("mixer.value"):
            v = F.linear(xv, self.w_v)
        with sc("mixer.receptance"):
            r = F.linear(xr, self.w_r)
        with sc("mixer.wkv"):
            if P.p > 0:
                num, den, mx = (t.clone() for t in self.wkv_state[:b].unbind(1))
            else:
                num = torch.zeros_like(k[:, 0], dtype=torch.float32)
                den, mx = torch.zeros_like(num), torch.full_like(num, -1e38)
            w, u = -torch.exp(self.decay.float()), self.first.float()
            out = torch.empty_like(k)
            for t in range(s):
                kt, vt = k[:, t].float(), v[:, t].float()
                m = torch.maximum(mx, kt + u)
                e1, e2 = torch.exp(mx - m), torch.exp(kt + u - m)
                out[:, t] = ((e1 * num + e2 * vt) / (e1 * den + e2)).to(out.dtype)
                m2 = torch.maximum(mx + w, kt)
                e1, e2 = torch.exp(mx + w - m2), torch.exp(kt - m2)
                num, den, mx = e1 * num + e2 * vt, e1 * den + e2, m2
            with torch.no_grad():
                self.wkv_state[:b].copy_(torch.stack([num, den, mx], 1))
        with sc("mixer.gate_out"):
            o = torch.sigmoid(r) * out
        with sc("mixer.output"):
            return F.linear(o, self.w_o)


class RWKV4ChannelMix(nn.Module):
    """RWKV-4's channel mixing, the FFN of a block whose mixer (:class:`RWKV4TimeMix`) keeps its x_prev."""

    def __init__(self, cfg: ArchConfig, init, mixer: RWKV4TimeMix):
        super().__init__()
        d, f = cfg.d_model, cfg.ffn.d_ff
        self.mixer = [mixer]  # a list: the mixer is the block's module, not this one's
        self.mu_k, self.mu_r = init.normal((d,), 0.3), init.normal((d,), 0.3)
        self.w_k, self.w_v, self.w_r = init.matrix(f, d), init.matrix(d, f), init.matrix(d, d)

    def forward(self, x, P, sc):
        b = x.shape[0]
        xk, xr = _token_shift(sc, "ffn.token_shift", x, self.mixer[0].ffn_prev, b, P.p, (self.mu_k, self.mu_r))
        with sc("ffn.key"):
            k = F.linear(xk, self.w_k)
        with sc("ffn.act"):
            k = torch.relu(k).square()
        with sc("ffn.value"):
            v = F.linear(k, self.w_v)
        with sc("ffn.receptance"):
            r = F.linear(xr, self.w_r)
        with sc("ffn.gate"):
            return torch.sigmoid(r) * v


#: The rnn mixers by kind (:data:`lmcost.operators.rnn.KINDS`), as HybridBlock builds them.
RNN_MIXERS = {"rg_lru": RGLRUMixer, "rwkv4": RWKV4TimeMix}
#: The rnn FFNs by kind (:data:`lmcost.operators.rnn.FFN_KINDS`): built with the block's mixer, which keeps their state.
RNN_FFNS = {"rwkv4_channel": RWKV4ChannelMix}


#: The mLSTM kernels' epsilon (transformers' xLSTMConfig.eps default) and its head LayerNorm's (the decoder's norms').
MLSTM_EPS, HEAD_NORM_EPS = 1e-6, 1e-5


class MLSTMMixer(nn.Module):
    """xLSTM's mLSTM layer (weights as transformers' xLSTMLayer, weight_mode single, fused into W_qkvo and W_if;
    see :func:`lmcost.operators.rnn.mlstm_ops`): floor(s/L) chunks in the chunkwise form of
    mlstm_chunkwise_native_autograd, then the positions left one step at a time as
    mlstm_recurrent_step_native (the same matmuls), from the cached state (C, n, m), kept in the model dtype
    as xLSTMCache keeps it."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        m, d = cfg.recurrent.mlstm, cfg.d_model
        self.h, self.L, self.cap = m.n_heads, m.chunk_size, m.gate_softcap
        self.qk, self.v = m.qk_dim, m.v_dim
        self.dk, self.dv = m.qk_dim // m.n_heads, m.v_dim // m.n_heads
        self.w_qkvo = init.matrix(2 * self.qk + 2 * self.v, d)
        self.w_if, self.b_if = init.matrix(2 * self.h, d), init.bias(2 * self.h)
        self.w_norm = init.ones(self.v)
        self.w_out = init.matrix(d, self.v)
        kw = dict(dtype=init.dtype, device=init.device)
        self.register_buffer("c_state", torch.zeros(max_batch, self.h, self.dk, self.dv, **kw), persistent=False)
        self.register_buffer("n_state", torch.zeros(max_batch, self.h, self.dk, **kw), persistent=False)
        self.register_buffer("m_state", torch.zeros(max_batch, self.h, 1, **kw), persistent=False)

    def cache_tensors(self):
        return [self.c_state, self.n_state, self.m_state]

    def state_tensors(self):
        return []  # all in the model dtype

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        h, dk, dv = self.h, self.dk, self.dv
        with sc("mixer.qkvo_proj"):
            q, k, v, o = F.linear(x, self.w_qkvo).split([self.qk, self.qk, self.v, self.v], -1)
        with sc("mixer.if_proj"):
            gi, gf = F.linear(x, self.w_if, self.b_if).split([h, h], -1)
        if self.cap is not None:
            with sc("mixer.gate_cap"):
                gi, gf = (self.cap * torch.tanh(g / self.cap) for g in (gi, gf))
        q, k, v = (t.reshape(b, s, h, -1).transpose(1, 2) for t in (q, k, v))
        gi, gf = gi.transpose(1, 2), gf.transpose(1, 2)                        # [b, h, s]
        if P.p > 0:
            state = (self.c_state[:b].float(), self.n_state[:b].float(), self.m_state[:b].float())
        else:
            state = (q.new_zeros(b, h, dk, dv, dtype=torch.float32), q.new_zeros(b, h, dk, dtype=torch.float32),
                     q.new_zeros(b, h, 1, dtype=torch.float32))
        c = s // self.L if s > 1 else 0
        outs = []
        if c:
            hc, state = self._chunkwise(sc, q[:, :, :c * self.L], k[:, :, :c * self.L], v[:, :, :c * self.L],
                                        gi[..., :c * self.L], gf[..., :c * self.L], state)
            outs.append(hc)
        for t in range(c * self.L, s):
            ht, state = self._step(sc, q[:, :, t], k[:, :, t], v[:, :, t], gi[..., t, None], gf[..., t, None], state)
            outs.append(ht[:, :, None])
        with torch.no_grad():
            for buf, val in zip(self.cache_tensors(), state):
                buf[:b].copy_(val)
        hs = torch.cat(outs, 2).transpose(1, 2)                               # [b, s, h, dv]
        with sc("mixer.norm"):
            hn = F.layer_norm(hs, (dv,), None, None, HEAD_NORM_EPS).reshape(b, s, self.v) * self.w_norm
        with sc("mixer.gate_out"):
            y = torch.sigmoid(o) * hn
        with sc("mixer.out_proj"):
            return F.linear(y, self.w_out)

    def _step(self, sc, q, k, v, gi, gf, state):
        """mlstm_recurrent_step_native: q, k [b, h, dk], v [b, h, dv], gates [b, h, 1]."""
        C, n, m = state
        with sc("mixer.mlstm_state"):
            f_log = F.logsigmoid(gf.float())
            m_new = torch.maximum(f_log + m, gi.float())
            f_act, i_act = torch.exp(f_log + m - m_new), torch.exp(gi.float() - m_new)
            qs = q * self.dk ** -0.5
        with sc("mixer.mlstm"):
            kv = k[:, :, :, None] @ v[:, :, None, :]
        with sc("mixer.mlstm_state"):
            C = f_act[..., None] * C + i_act[..., None] * kv.float()
            n = f_act * n + i_act * k.float()
        with sc("mixer.mlstm"):
            num = (qs[:, :, None, :] @ C.to(q.dtype)).squeeze(2).float()
            qn = (qs[:, :, None, :] @ n[..., None].to(q.dtype)).squeeze(2).float()
        with sc("mixer.mlstm_state"):
            out = num / (torch.maximum(qn.abs(), torch.exp(-m_new)) + MLSTM_EPS)
        return out.to(q.dtype), (C, n, m_new)

    def _chunkwise(self, sc, q, k, v, gi, gf, state):
        """mlstm_chunkwise_native_autograd over c chunks of L: q, k [b, h, c*L, dk], v [b, h, c*L, dv]."""
        b, h, S, dk = q.shape
        L, nc, dv = self.L, S // self.L, v.shape[-1]
        C, n, m = state
        with sc("mixer.mlstm_state"):
            vi, vb = gi.reshape(b, h, nc, L), F.logsigmoid(gf.reshape(b, h, nc, L)).cumsum(-1)
            va = vb[..., -1:] - vb + vi
            g, a_max = vb[..., -1], va.max(-1).values
            m = m.squeeze(-1)
        Cs, ns, ms = [], [], []
        for j in range(nc):
            Cs.append(C), ns.append(n), ms.append(m)
            with sc("mixer.mlstm_state"):
                m_next = torch.maximum(g[..., j] + m, a_max[..., j])
                kg = k[:, :, j * L:(j + 1) * L] * torch.exp(va[..., j, :] - m_next[..., None])[..., None].to(k.dtype)
                gbar = torch.exp(g[..., j] + m - m_next)[..., None]
            with sc("mixer.mlstm"):
                upd = kg.transpose(-2, -1) @ v[:, :, j * L:(j + 1) * L]
            with sc("mixer.mlstm_state"):
                C = gbar[..., None] * C + upd.float()
                n = gbar * n + kg.transpose(-2, -1).sum(-1).float()
                m = m_next
        with sc("mixer.mlstm_state"):
            Ck, nk, mk = torch.stack(Cs, 2).to(q.dtype), torch.stack(ns, 2).to(q.dtype), torch.stack(ms, 2)
            qc, kc, vc = q.view(b, h, nc, L, dk), k.view(b, h, nc, L, dk), v.view(b, h, nc, L, dv)
            tril = torch.tril(torch.ones(L, L, dtype=torch.bool, device=q.device))
            log_d = torch.where(tril, vb[..., :, None] - vb[..., None, :], -float("inf")) + vi[..., None, :]
            m_inter = vb + mk[..., None]
            m_comb = torch.maximum(m_inter, log_d.max(-1).values)[..., None]
            dmat = torch.exp(log_d - m_comb)
            scale = dk ** -0.5
        with sc("mixer.mlstm"):
            smat = (qc @ kc.transpose(-2, -1)) * scale
        with sc("mixer.mlstm_state"):
            mmat = smat * dmat.to(smat.dtype)
            qg = qc * torch.exp(m_inter[..., None] - m_comb).to(q.dtype) * scale
        with sc("mixer.mlstm"):
            num = qg @ Ck + mmat @ vc
            den = qg @ nk[..., None]
        with sc("mixer.mlstm_state"):
            den = den + mmat.sum(-1, keepdim=True)
            out = num / (torch.maximum(den.abs(), torch.exp(-m_comb)) + MLSTM_EPS)
        return out.reshape(b, h, S, dv), (C, n, m[..., None])


RNN_MIXERS["mlstm"] = MLSTMMixer
