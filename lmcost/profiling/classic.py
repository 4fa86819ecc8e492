"""Reference modules of the older decoders' mechanisms (:mod:`lmcost.model.hf.classic`): xIELU, Apertus's FFN
activation with two learned scalars (:mod:`lmcost.operators.xielu`), and the fixed sinusoidal position table of
XGLM and CTRL (:mod:`lmcost.operators.sinusoidal`), and DiffLlama's differential attention's combination
(:mod:`lmcost.operators.differential`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.profiling.decoder_common import NORM_EPS, _Init


class XIELU(nn.Module):
    """xIELU as transformers' ``XIELUActivation._xielu_python`` computes it: alpha_p, alpha_n parameters [1]
    each (initialised as transformers does, softplus^-1 of 0.8 and of 0.8 - beta), beta 0.5 and eps -1e-6
    fixed. x [...] -> [...]."""

    BETA, EPS = 0.5, -1e-6

    def __init__(self, init: _Init):
        super().__init__()
        raw = lambda v: math.log(math.expm1(v))  # noqa: E731  (softplus^-1)
        self.alpha_p = nn.Parameter(torch.full((1,), raw(0.8), device=init.device, dtype=init.dtype),
                                    requires_grad=False)
        self.alpha_n = nn.Parameter(torch.full((1,), raw(0.8 - self.BETA), device=init.device, dtype=init.dtype),
                                    requires_grad=False)

    def forward(self, x):
        a_p, a_n = F.softplus(self.alpha_p), self.BETA + F.softplus(self.alpha_n)
        return torch.where(x > 0, a_p * x * x + self.BETA * x,
                           (torch.expm1(torch.clamp(x, max=self.EPS)) - x) * a_n + self.BETA * x)


def sinusoid_table(rows: int, d: int) -> torch.Tensor:
    """The sinusoidal table [rows, d] (fp32) of CTRL's ``positional_encoding``: angle p / 10000^(2*(i//2)/d) for
    dim i, the sines of the even dims then the cosines of the odd ones, concatenated (Vaswani et al. 2017,
    section 3.5)."""
    pos = torch.arange(rows, dtype=torch.float64)[:, None]
    i = torch.arange(d, dtype=torch.float64)[None, :]
    angle = pos / torch.pow(10000.0, 2 * torch.div(i, 2, rounding_mode="floor") / d)
    return torch.cat([angle[:, 0::2].sin(), angle[:, 1::2].cos()], -1).float()


class Differential(nn.Module):
    """DiffLlamaAttention's combination of its two attention calls: lambda_q1, lambda_k1, lambda_q2, lambda_k2
    [d_h] (N(0, 0.1), transformers' lambda_std_dev), lambda_init fixed at layer 0's 0.8 - 0.6 * exp(0) = 0.2 (the
    reference's layers do not know their index; it changes no cost)."""

    LAMBDA_INIT = 0.2

    def __init__(self, init: _Init, d_h: int):
        super().__init__()
        self.d_h = d_h
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (init.normal((d_h,), 0.1) for _ in range(4))

    @staticmethod
    def half(values, i: int, h_kv: int):
        """values() -> [b, t, h_kv, d]: half ``i`` of the value heads, repeated back to h_kv heads (as
        transformers' ``torch.chunk(v, 2, dim=1)`` then ``repeat(1, 2, 1, 1)``), read when called."""
        return lambda: values()[:, :, i * (h_kv // 2):(i + 1) * (h_kv // 2)].repeat(1, 1, 2, 1)

    def forward(self, o1, o2, h: int):
        """o1, o2 [b, s, h*d_h] -> [b, s, h*d_h]: per head pair j (of h/2), the 2*d_h outputs [o1|o2] of head j minus
        lambda times those of head h/2 + j, a weightless RMSNorm over 2*d_h, times (1 - lambda_init)."""
        b, s, _ = o1.shape
        cat = torch.cat([o1.view(b, s, h, self.d_h), o2.view(b, s, h, self.d_h)], -1)
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=torch.float32))
               - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=torch.float32)) + self.LAMBDA_INIT)
        o = cat[:, :, :h // 2] - lam.to(o1.dtype) * cat[:, :, h // 2:]
        o = F.rms_norm(o, (2 * self.d_h,), None, NORM_EPS) * (1 - self.LAMBDA_INIT)
        return o.reshape(b, s, h * self.d_h)
