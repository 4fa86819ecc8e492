"""The reference decoder's recurrent (RNN-style) mixers (see :mod:`lmcost.operators.rnn`, the analytic operators
they run under the same ``record_function`` names), built by :class:`lmcost.profiling.recurrent.HybridBlock`.

- :class:`RGLRUMixer`: Griffin's recurrent block (De et al. 2024, section 2.4; weights and order as
  transformers' RecurrentGemmaRecurrentBlock): y = GeLU(W_y x); u = conv(W_x x), a depthwise causal conv of K
  taps with bias as K shifted multiply-adds (vector work, as the analytic ``mixer.conv``), continuing its
  state of the last K - 1 inputs [W, K - 1] (model dtype); the RG-LRU's gates as block-diagonal baddbmm
  (the analytic ``mixer.input_gate``/``mixer.a_gate`` matmuls); a = exp(-8 r softplus(Λ)),
  h_t = a h_{t-1} + sqrt(1 - a²) (i u_t), with a = 0 and the multiplier 1 at position 0 (transformers'
  reset), run over the positions in fp32 from the cached state h [W]; W_out (h * y).

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


#: The rnn mixers by kind (:data:`lmcost.operators.rnn.KINDS`), as HybridBlock builds them.
RNN_MIXERS = {"rg_lru": RGLRUMixer}
