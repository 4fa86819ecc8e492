"""The reference decoder's Mamba-1 mixer (see :mod:`lmcost.operators.ssm`, the analytic operators it runs under the
same ``record_function`` names), built by :class:`lmcost.profiling.recurrent.HybridBlock` for ``mamba`` layers.

:class:`MambaMixer`: in_proj -> x, z; the depthwise causal conv (+ SiLU) over x with its conv state [E, K]
(:func:`lmcost.profiling.recurrent._causal_conv`); x_proj -> dt, B, C (RMSNorms on each with ``bc_dt_norm``);
dt_proj; the selective scan of Gu & Dao 2023, Algorithm 2, from the cached SSM state [E, N] (fp32):
h_t = exp(dt_t*A) h_{t-1} + dt_t*B_t*x_t (``mixer.ssm_state``), y_t = h_t·C_t (``mixer.ssm``: one matmul of
[b, E, N] by [b, N] per position, as transformers' loop, so the same matmul FLOPs); y + D*x, * SiLU(z);
out_proj. Positions are scanned in blocks of SCAN_BLOCK (the states of a block are kept for its y = h·C).
Weights as transformers' MambaMixer (dt_proj's bias is the scan's delta bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig

#: RMSNorm epsilon of the dt/B/C norms (the reference decoder's, lmcost.profiling.recurrent.NORM_EPS).
NORM_EPS = 1e-5
#: Positions whose states are held at once in a prefill's scan ([b, SCAN_BLOCK, E, N] fp32).
SCAN_BLOCK = 64


class MambaMixer(nn.Module):
    """A Mamba-1 mixer (see the module docstring). ``conv`` is the causal conv of
    :mod:`lmcost.profiling.recurrent` (passed in: that module imports this one)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int, conv):
        super().__init__()
        m, d = cfg.recurrent.mamba, cfg.d_model
        self.E, self.N, self.R, self.K, self.norm, self.conv = m.d_inner, m.d_state, m.dt_rank, m.d_conv, m.bc_dt_norm, conv
        E, N, R = self.E, self.N, self.R
        self.w_in, self.b_in = init.matrix(2 * E, d), init.bias(2 * E, m.proj_bias)
        self.w_conv, self.b_conv = init.matrix(E, self.K, fan_in=self.K), init.bias(E, m.conv_bias)
        self.w_x = init.matrix(R + 2 * N, E)
        self.w_norm = init.ones(R + 2 * N) if m.bc_dt_norm == "weighted" else None  # dt, B, C norms' weights
        self.w_dt, self.b_dt = init.matrix(E, R), init.normal((E,), 0.5)
        self.A_log = init.normal((E, N), 0.5)
        self.D = init.ones(E)
        self.w_out, self.b_out = init.matrix(d, E), init.bias(d, m.proj_bias)
        self.register_buffer("conv_state", torch.zeros(max_batch, E, self.K, dtype=init.dtype, device=init.device),
                             persistent=False)
        self.register_buffer("ssm_state", torch.zeros(max_batch, E, N, dtype=torch.float32, device=init.device),
                             persistent=False)

    def cache_tensors(self):
        return [self.conv_state, self.ssm_state]

    def state_tensors(self):
        """The fp32 SSM states (the conv states are in the model dtype)."""
        return [self.ssm_state]

    def _norms(self, dt, B, C):
        R, N = self.R, self.N
        w = self.w_norm if self.w_norm is not None else None
        parts = [(dt, slice(0, R)), (B, slice(R, R + N)), (C, slice(R + N, R + 2 * N))]
        return [F.rms_norm(t.float(), (t.shape[-1],), None, NORM_EPS).to(t.dtype) * (w[sl] if w is not None else 1)
                for t, sl in parts]

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        E, N, R = self.E, self.N, self.R
        with sc("mixer.in_proj"):
            xs, z = F.linear(x, self.w_in, self.b_in).split([E, E], dim=-1)
        xs = self.conv("mixer.conv", sc, xs.transpose(1, 2), self.conv_state, b, P.p, self.w_conv, self.b_conv,
                       F.silu).transpose(1, 2)                                              # [b, s, E]
        with sc("mixer.x_proj"):
            dt, B, C = F.linear(xs, self.w_x).split([R, N, N], dim=-1)
        if self.norm != "none":
            with sc("mixer.bc_dt_norm"):
                dt, B, C = self._norms(dt, B, C)
        with sc("mixer.dt_proj"):
            dt = F.linear(dt, self.w_dt)                                                    # [b, s, E], bias below
        with sc("mixer.ssm_state"):
            delta = F.softplus(dt.float() + self.b_dt.float())                              # [b, s, E]
            A = -torch.exp(self.A_log.float())                                              # [E, N]
            h = self.ssm_state[:b].clone() if P.p > 0 else torch.zeros_like(self.ssm_state[:b])
        ys = []
        for t0 in range(0, s, SCAN_BLOCK):
            t1 = min(s, t0 + SCAN_BLOCK)
            with sc("mixer.ssm_state"):
                dA = torch.exp(delta[:, t0:t1, :, None] * A)                                # [b, T, E, N]
                dBx = (delta[:, t0:t1] * xs[:, t0:t1].float())[..., None] * B[:, t0:t1, None, :].float()
                hs = []
                for t in range(t1 - t0):
                    h = dA[:, t] * h + dBx[:, t]
                    hs.append(h)
                hs = torch.stack(hs, 1)                                                     # [b, T, E, N]
            with sc("mixer.ssm"):
                ys.append(torch.matmul(hs, C[:, t0:t1, :, None].float())[..., 0])           # [b, T, E]
        with torch.no_grad():
            self.ssm_state[:b].copy_(h)
        with sc("mixer.ssm_state"):
            y = (torch.cat(ys, 1) + xs.float() * self.D.float()) * F.silu(z.float())
        with sc("mixer.out_proj"):
            return F.linear(y.to(x.dtype), self.w_out, self.b_out)
