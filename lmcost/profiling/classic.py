"""Reference modules of the older decoders' mechanisms (:mod:`lmcost.model.hf.classic`): xIELU, Apertus's FFN
activation with two learned scalars (:mod:`lmcost.operators.xielu`), and the fixed sinusoidal position table of
XGLM and CTRL (:mod:`lmcost.operators.sinusoidal`)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.profiling.decoder_common import _Init


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
