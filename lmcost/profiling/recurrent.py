"""The reference decoder's constant-state mixers and hybrid block (see :mod:`lmcost.operators.recurrent`, the
analytic operators they run under the same ``record_function`` names).

- :class:`Mamba2Mixer`: in_proj; the depthwise causal conv (+ SiLU) as K shifted multiply-adds (vector
  work, as the analytic ``mixer.conv``: no convolution kernel FlopCounterMode would count), reading the
  conv state [C, K] of the sequence when the pass continues it; the SSD scan of Dao & Gu 2024, Listing 1
  (transformers' torch path, the same einsums, so the same matmul FLOPs as the analytic ``mixer.ssm``),
  from the cached SSM state [H, P, N] (fp32); a decode step runs the recurrence h = exp(dt*A)*h + dt*B*x,
  y = h·C + D*x; gated RMSNorm; out_proj.
- :class:`GatedDeltaNetMixer`: Qwen3-Next's gated DeltaNet: in_proj_qkvz, in_proj_ba, conv (+ SiLU) over
  q, k, v with its state, the chunked delta rule (transformers' torch_chunk_gated_delta_rule: the same
  matmuls as the analytic ``mixer.delta_rule``; its unit-triangular solves and decays in
  ``mixer.delta_state``, which it enters twice) or a decode step's recurrence, from the cached state
  [h_v, d_k, d_v] (fp32); gated RMSNorm per head; out_proj.
- :class:`ShortConvMixer`: LFM2's in_proj -> B, C, x; B*x; conv with its state [d, K]; C*.; out_proj.
- :class:`HybridBlock`: a pre-norm block with an optional mixer (attention, one of the above, or none)
  and an optional FFN (dense, MoE or none), as :func:`lmcost.operators.forward.block_ops` writes it.

Arguments named as in :mod:`lmcost.profiling.decoder`: ``init`` its seeded weight source (``_Init``), ``P``
its pass (``_Pass``: b, s, start position p), ``sc`` the scope opener of the block.

Scopes: ``mixer.ssm_state`` holds the discretization (softplus(dt + dt_bias), dt*x, dt*A), the chunk
decays and, in a decode step, the state update; ``mixer.ssm`` the einsums, the output decay and D skip,
and the write of the final state. Conv states hold the last d_conv inputs of each channel (transformers'
layout), in the model dtype; SSM states are fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from lmcost.model.config import ArchConfig
from lmcost.operators.recurrent import RECURRENT_KINDS
from lmcost.profiling.linear_attention import LINEAR_KINDS, linear_attention_mixer
from lmcost.profiling.rnn import RNN_FFNS, RNN_MIXERS

#: RMSNorm epsilon of the gated norms, as the reference decoder's norms (lmcost.profiling.decoder_common.NORM_EPS;
#: this module imports nothing from the decoder, which imports it: the decoder passes its modules in).
NORM_EPS = 1e-5


class _Empty(nn.Module):
    """A block without a mixer: holds no cache."""

    def cache_tensors(self):
        return []

    def state_tensors(self):
        return []


def _causal_conv(sc_name, sc, u_new, state, b, p, weight, bias, act):
    """Depthwise causal conv over u_new [b, C, s], K taps, continuing ``state`` [max_b, C, K] (the last K
    inputs of each channel) when p > 0; writes the new last K inputs into the state. Returns [b, C, s]."""
    K = weight.shape[-1]
    s = u_new.shape[-1]
    with sc(sc_name):
        prev = state[:b] if p > 0 else torch.zeros_like(state[:b])
        u = torch.cat([prev.to(u_new.dtype), u_new], -1)          # [b, C, K + s]
        with torch.no_grad():  # the state is a cache, not part of an autograd graph
            state[:b].copy_(u[..., -K:])
        u = u[..., 1:]                                             # the K - 1 inputs before the first new one
        out = u[..., :s] * weight[:, 0:1]
        for k in range(1, K):
            out = out + u[..., k:k + s] * weight[:, k:k + 1]
        if bias is not None:
            out = out + bias[:, None]
        return act(out) if act is not None else out


def _segsum(x):
    """Stable segment sums [..., T] -> [..., T, T] (Dao & Gu 2024, Listing 1; transformers' segment_sum)."""
    T = x.size(-1)
    x = x[..., None].expand(*x.size(), T)
    mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    ss = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=0)
    return ss.masked_fill(~mask, -torch.inf)


class Mamba2Mixer(nn.Module):
    """A Mamba-2 mixer (weights as transformers' Mamba2Mixer; see the module docstring)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        m, d = cfg.recurrent.mamba2, cfg.d_model
        self.H, self.P, self.N, self.G, self.K, self.Q = m.n_heads, m.head_dim, m.d_state, m.n_groups, m.d_conv, m.chunk_size
        self.d_in = self.H * self.P
        self.C = self.d_in + 2 * self.G * self.N
        proj = 2 * self.d_in + 2 * self.G * self.N + self.H
        self.w_in, self.b_in = init.matrix(proj, d), init.bias(proj, m.proj_bias)
        self.w_conv, self.b_conv = init.matrix(self.C, self.K, fan_in=self.K), init.bias(self.C, m.conv_bias)
        self.A_log = init.normal((self.H,), 0.5)
        self.dt_bias = init.normal((self.H,), 0.5)
        self.D = init.ones(self.H)
        self.w_norm = init.ones(self.d_in)
        self.w_out, self.b_out = init.matrix(d, self.d_in), init.bias(d, m.proj_bias)
        self.register_buffer("conv_state", torch.zeros(max_batch, self.C, self.K, dtype=init.dtype, device=init.device),
                             persistent=False)
        self.register_buffer("ssm_state", torch.zeros(max_batch, self.H, self.P, self.N, dtype=torch.float32,
                                                      device=init.device), persistent=False)

    def cache_tensors(self):
        return [self.conv_state, self.ssm_state]

    def state_tensors(self):
        """The fp32 SSM states (the rest of cache_tensors is in the model dtype)."""
        return [self.ssm_state]

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        H, Pd, N, G, d_in = self.H, self.P, self.N, self.G, self.d_in
        with sc("mixer.in_proj"):
            zxbcdt = F.linear(x, self.w_in, self.b_in)
        z, xBC, dt = zxbcdt.split([d_in, self.C, H], dim=-1)
        xBC = _causal_conv("mixer.conv", sc, xBC.transpose(1, 2), self.conv_state, b, P.p, self.w_conv, self.b_conv,
                           F.silu).transpose(1, 2)
        xs, B, C = xBC.split([d_in, G * N, G * N], dim=-1)
        A = -torch.exp(self.A_log.float())
        if s == 1:
            with sc("mixer.ssm_state"):
                state = self.ssm_state[:b]
                if P.p == 0:
                    state.zero_()
                dt1 = F.softplus(dt[:, 0].float() + self.dt_bias.float())                    # [b, H]
                x1 = xs[:, 0].float().view(b, H, Pd)
                B1 = B[:, 0].float().view(b, G, 1, N).expand(b, G, H // G, N).reshape(b, H, N)
                state.mul_(torch.exp(dt1 * A)[..., None, None]).add_((dt1[..., None] * x1)[..., None] * B1[:, :, None, :])
            with sc("mixer.ssm"):
                C1 = C[:, 0].float().view(b, G, 1, N).expand(b, G, H // G, N).reshape(b, H, N)
                y = torch.einsum("bhpn,bhn->bhp", state, C1) + x1 * self.D.float()[:, None]
                y = y.reshape(b, 1, d_in).to(x.dtype)
        else:
            y = self._ssd(sc, xs, dt, A, B, C, b, s, P.p)
        with sc("mixer.norm"):
            g = (y * F.silu(z)).view(b, s, G, d_in // G)
            y = F.rms_norm(g, (d_in // G,), None, NORM_EPS).view(b, s, d_in) * self.w_norm
        with sc("mixer.out_proj"):
            return F.linear(y, self.w_out, self.b_out)

    def _ssd(self, sc, xs, dt, A, B, C, b, s, p):
        """The chunked SSD (Dao & Gu 2024, Listing 1, as transformers' torch_forward), from the cached state."""
        H, Pd, N, G, Q = self.H, self.P, self.N, self.G, self.Q
        pad = (Q - s % Q) % Q
        c = (s + pad) // Q

        def chunks(t):  # [b, s, ...] -> [b, c, Q, ...], zero-padded
            t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
            return t.reshape(b, c, Q, *t.shape[2:])

        with sc("mixer.ssm_state"):
            dt = F.softplus(dt.float() + self.dt_bias.float())                                # [b, s, H]
            x0 = xs.float().view(b, s, H, Pd)
            x = chunks(x0 * dt[..., None])
            Ac = chunks(A * dt).permute(0, 3, 1, 2)                                           # [b, H, c, Q]
            A_cumsum = torch.cumsum(Ac, dim=-1)
            L = torch.exp(_segsum(Ac))
            decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
            decay_chunk = torch.exp(_segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
            state_decay_out = torch.exp(A_cumsum)
        with sc("mixer.ssm"):
            Bh = chunks(B.float().view(b, s, G, N).repeat_interleave(H // G, dim=2))
            Ch = chunks(C.float().view(b, s, G, N).repeat_interleave(H // G, dim=2))
            Gm = torch.einsum("bclhn,bcshn->bclsh", Ch, Bh)
            M = Gm * L.permute(0, 2, 3, 4, 1)
            Y_diag = torch.einsum("bclsh,bcshp->bclhp", M, x)
            B_decay = Bh * decay_states.permute(0, -2, -1, 1)[..., None]
            states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)
            init = self.ssm_state[:b, None] if p > 0 else torch.zeros_like(states[:, :1])
            states = torch.cat([init, states], dim=1)
            new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
            states, final = new_states[:, :-1], new_states[:, -1]
            with torch.no_grad():
                self.ssm_state[:b].copy_(final)
            C_states = torch.einsum("bclhn,bchpn->bclhp", Ch, states)
            Y_off = C_states * state_decay_out.permute(0, 2, 3, 1)[..., None]
            y = (Y_diag + Y_off).reshape(b, c * Q, H, Pd)[:, :s] + x0 * self.D.float()[:, None]
            return y.reshape(b, s, H * Pd).to(xs.dtype)


def _l2norm(x, eps=1e-6):
    """x / sqrt(sum(x^2) + eps) over the last dim (FLA's and transformers' l2norm)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


class GatedDeltaNetMixer(nn.Module):
    """A gated DeltaNet (weights and layout as transformers' Qwen3NextGatedDeltaNet: in_proj_qkvz grouped per
    key head [q, k, v, z], in_proj_ba per key head [b, a]; see :func:`lmcost.operators.recurrent.gated_deltanet_ops`).
    Prefill: the chunked delta rule of transformers' torch_chunk_gated_delta_rule (chunks of 64, the same
    matmuls), from the cached state; a decode step: the recurrence, elementwise."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        g, d = cfg.recurrent.gated_deltanet, cfg.d_model
        self.hk, self.hv, self.dk, self.dv, self.K, self.Q = g.n_k_heads, g.n_v_heads, g.d_k, g.d_v, g.d_conv, g.chunk_size
        self.C = 2 * self.hk * self.dk + self.hv * self.dv
        self.w_qkvz = init.matrix(2 * self.hk * self.dk + 2 * self.hv * self.dv, d)
        self.w_ba = init.matrix(2 * self.hv, d)
        self.w_conv = init.matrix(self.C, self.K, fan_in=self.K)
        self.A_log = init.normal((self.hv,), 0.5)
        self.dt_bias = init.normal((self.hv,), 0.5)
        self.w_norm = init.ones(self.dv)
        self.w_out = init.matrix(d, self.hv * self.dv)
        self.register_buffer("conv_state", torch.zeros(max_batch, self.C, self.K, dtype=init.dtype, device=init.device),
                             persistent=False)
        self.register_buffer("rec_state", torch.zeros(max_batch, self.hv, self.dk, self.dv, dtype=torch.float32,
                                                      device=init.device), persistent=False)

    def cache_tensors(self):
        return [self.conv_state, self.rec_state]

    def state_tensors(self):
        return [self.rec_state]

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        hk, hv, dk, dv = self.hk, self.hv, self.dk, self.dv
        r = hv // hk
        with sc("mixer.in_proj_qkvz"):
            qkvz = F.linear(x, self.w_qkvz).view(b, s, hk, 2 * dk + 2 * r * dv)
        with sc("mixer.in_proj_ba"):
            ba = F.linear(x, self.w_ba).view(b, s, hk, 2 * r)
        q, k, v, z = torch.split(qkvz, [dk, dk, r * dv, r * dv], dim=3)
        bb, a = torch.split(ba, [r, r], dim=3)
        mixed = torch.cat([q.reshape(b, s, -1), k.reshape(b, s, -1), v.reshape(b, s, -1)], -1).transpose(1, 2)
        mixed = _causal_conv("mixer.conv", sc, mixed, self.conv_state, b, P.p, self.w_conv, None, F.silu).transpose(1, 2)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        dtype = x.dtype
        with sc("mixer.delta_state"):
            beta = bb.reshape(b, s, hv).sigmoid()
            g = -self.A_log.float().exp() * F.softplus(a.reshape(b, s, hv).float() + self.dt_bias)
            q = q.reshape(b, s, hk, dk).repeat_interleave(r, dim=2)
            k = k.reshape(b, s, hk, dk).repeat_interleave(r, dim=2)
            q, k, v, beta, g = [t.transpose(1, 2).to(torch.float32) for t in (q, k, v.reshape(b, s, hv, dv), beta, g)]
            q = _l2norm(q) * dk ** -0.5
            k = _l2norm(k)
        if s == 1:
            o = self._step(sc, q, k, v, beta, g, b, P.p)
        else:
            o = self._chunked(sc, q, k, v, beta, g, b, s, P.p)
        o = o.transpose(1, 2).to(dtype)                                            # [b, s, hv, dv]
        with sc("mixer.norm"):
            y = F.rms_norm(o, (dv,), None, NORM_EPS) * self.w_norm
            y = (y * F.silu(z.reshape(b, s, hv, dv))).reshape(b, s, hv * dv)
        with sc("mixer.out_proj"):
            return F.linear(y, self.w_out)

    def _step(self, sc, q, k, v, beta, g, b, p):
        with sc("mixer.delta_rule"):
            S = self.rec_state[:b]
            if p == 0:
                S.zero_()
            q, k, v, beta, g = q[:, :, 0], k[:, :, 0], v[:, :, 0], beta[:, :, 0], g[:, :, 0]
            S.mul_(g.exp()[..., None, None])
            delta = (v - (S * k[..., None]).sum(-2)) * beta[..., None]
            S.add_(k[..., None] * delta[..., None, :])
            return (S * q[..., None]).sum(-2)[:, :, None]                           # [b, hv, 1, dv]

    def _chunked(self, sc, q, k, v, beta, g, b, s, p):
        Q = self.Q
        with sc("mixer.delta_state"):
            pad = (Q - s % Q) % Q
            q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
            beta, g = (F.pad(t, (0, pad)) for t in (beta, g))
            v_beta, k_beta = v * beta[..., None], k * beta[..., None]
            q, k, k_beta, v_beta = [t.reshape(b, self.hv, -1, Q, t.shape[-1]) for t in (q, k, k_beta, v_beta)]
            g = g.reshape(b, self.hv, -1, Q)
            upper = torch.ones(Q, Q, dtype=torch.bool, device=q.device).triu(1)
            cum = g.cumsum(dim=3)
            pair = (cum.unsqueeze(4) - cum.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
        with sc("mixer.delta_rule"):
            ut = (k_beta @ k.transpose(-1, -2)) * pair
            intra = (q @ k.transpose(-1, -2)) * pair
        with sc("mixer.delta_state"):
            decayed_k_beta = k_beta * cum.exp()[..., None]
            new_v = torch.linalg.solve_triangular(ut, v_beta, upper=False, unitriangular=True)
            k_cum = torch.linalg.solve_triangular(ut, decayed_k_beta, upper=False, unitriangular=True)
            q = q * cum.exp()[..., None]
            k = k * (cum[..., -1:] - cum).exp()[..., None]
            chunk_decay = cum[..., -1].exp()[..., None, None]
        with sc("mixer.delta_rule"):
            S = self.rec_state[:b].clone() if p > 0 else torch.zeros_like(self.rec_state[:b])
            out = torch.zeros_like(new_v)
            for i in range(q.shape[2]):
                v_new = new_v[:, :, i] - k_cum[:, :, i] @ S
                out[:, :, i] = q[:, :, i] @ S + intra[:, :, i] @ v_new
                S = S * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
            with torch.no_grad():
                self.rec_state[:b].copy_(S)
            return out.reshape(b, self.hv, -1, self.dv)[:, :, :s]


class ShortConvMixer(nn.Module):
    """LFM2's gated short convolution (weights as transformers' Lfm2ShortConv)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        sc_, d = cfg.recurrent.short_conv, cfg.d_model
        self.d, self.K = d, sc_.d_conv
        self.w_in, self.b_in = init.matrix(3 * d, d), init.bias(3 * d, sc_.bias)
        self.w_conv, self.b_conv = init.matrix(d, self.K, fan_in=self.K), init.bias(d, sc_.bias)
        self.w_out, self.b_out = init.matrix(d, d), init.bias(d, sc_.bias)
        self.register_buffer("conv_state", torch.zeros(max_batch, d, self.K, dtype=init.dtype, device=init.device),
                             persistent=False)

    def cache_tensors(self):
        return [self.conv_state]

    def state_tensors(self):
        return []

    def forward(self, x, P, sc):
        b = x.shape[0]
        with sc("mixer.in_proj"):
            Bm, Cm, xs = F.linear(x, self.w_in, self.b_in).transpose(1, 2).chunk(3, dim=1)   # [b, d, s] each
        with sc("mixer.gate_in"):
            u = Bm * xs
        y = _causal_conv("mixer.conv", sc, u, self.conv_state, b, P.p, self.w_conv, self.b_conv, None)
        with sc("mixer.gate_out"):
            y = (Cm * y).transpose(1, 2)
        with sc("mixer.out_proj"):
            return F.linear(y, self.w_out, self.b_out)


class HybridBlock(nn.Module):
    """A pre-norm block of a hybrid stack: [mixer_norm|attn_norm, mixer, residual] if it has a mixer, then
    [ffn_norm, ffn, ffn_residual] if it has an FFN. ``attn`` is the mixer (it owns the layer's cache).
    ``parts``: the decoder's Norm, Attention, MLAttention, FFN and MoE classes, by name."""

    def __init__(self, cfg: ArchConfig, init, kind: str, ffn: str, prefix: str, max_batch: int,
                 max_context: int, parts: dict):
        super().__init__()
        self.prefix, self.mixer_kind = prefix, kind
        self.norm_name = "mixer" if kind in RECURRENT_KINDS else "attn"
        if kind == "mamba2":
            self.attn = Mamba2Mixer(cfg, init, max_batch)
        elif kind == "short_conv":
            self.attn = ShortConvMixer(cfg, init, max_batch)
        elif kind == "gated_deltanet":
            self.attn = GatedDeltaNetMixer(cfg, init, max_batch)
        elif kind in LINEAR_KINDS:  # lightning, ...: lmcost.profiling.linear_attention
            self.attn = linear_attention_mixer(cfg, init, kind, max_batch)
        elif kind == "mamba":  # Mamba-1: lmcost.profiling.ssm
            from lmcost.profiling.ssm import MambaMixer
            self.attn = MambaMixer(cfg, init, max_batch, _causal_conv)
        elif kind in RNN_MIXERS:  # lmcost.profiling.rnn: RG-LRU, ...
            self.attn = RNN_MIXERS[kind](cfg, init, max_batch)
        elif kind == "none":
            self.attn = _Empty()
        elif cfg.attention.mla is not None:
            self.attn = parts["MLAttention"](cfg, init, kind == "local", max_batch, max_context)
        else:
            self.attn = parts["Attention"](cfg, init, kind, max_batch, max_context)
        if kind != "none":
            self.attn_norm = parts["Norm"](init, cfg.norm, cfg.d_model, cfg.norm_bias, cfg.norm_weight)
        self.ffn = None
        if ffn != "none":
            self.ffn_norm = parts["Norm"](init, cfg.norm, cfg.d_model, cfg.norm_bias, cfg.norm_weight)
            self.ffn = (RNN_FFNS[ffn](cfg, init, self.attn) if ffn in RNN_FFNS  # RWKV: state kept by the mixer
                        else parts["MoE"](cfg, init) if ffn == "moe" else parts["FFN"](cfg, init, cfg.ffn.d_ff, cfg.ffn.bias))

    def sc(self, name):
        return record_function(f"{self.prefix}.{name}")

    def forward(self, x, P):
        sc = self.sc
        if self.mixer_kind != "none":
            with sc(f"{self.norm_name}_norm"):
                h = self.attn_norm(x)
            a = self.attn(h, P, sc)
            with sc(f"{self.norm_name}_residual"):
                x = x + a
        if self.ffn is not None:
            with sc("ffn_norm"):
                h = self.ffn_norm(x)
            f = self.ffn(h, P, sc)
            with sc("ffn_residual"):
                x = x + f
        return x
