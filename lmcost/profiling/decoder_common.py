"""What every layer of the reference decoder (:mod:`lmcost.profiling.decoder`) builds on: seeded weights,
norms, cache buffers, the nonlinearities, RoPE's base and the norms' epsilon.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn



ROPE_BASE = 10000.0
NORM_EPS = 1e-5


def _gelu_tanh(x):
    return F.gelu(x, approximate="tanh")  # the tanh form, as the analytic 8 FLOPs per element count


NONLINEAR_FN = {"relu": F.relu, "relu2": lambda x: F.relu(x).square(), "gelu": _gelu_tanh, "silu": F.silu, "sigmoid": torch.sigmoid}


class _Init:
    """Seeded random weights, drawn on the target device: N(0, 1/fan_in) matrices, N(0, 0.02) biases,
    norm weights 1 + N(0, 0.05), embeddings N(0, 1)."""

    def __init__(self, seed: int, device, dtype):
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self.device, self.dtype = torch.device(device), dtype

    def matrix(self, *shape, fan_in=None) -> nn.Parameter:
        fan_in = fan_in or shape[-1]
        return self.normal(shape, fan_in ** -0.5)

    def normal(self, shape, std) -> nn.Parameter:
        # Drawn in fp32 and rounded, so a bf16/fp16 model has the fp32 model's weights, rounded.
        t = torch.empty(shape, device=self.device, dtype=torch.float32).normal_(0.0, std, generator=self.gen)
        return nn.Parameter(t.to(self.dtype), requires_grad=False)

    def bias(self, n, on: bool = True) -> Optional[nn.Parameter]:
        return self.normal((n,), 0.02) if on else None

    def ones(self, n) -> nn.Parameter:
        w = self.normal((n,), 0.05)
        with torch.no_grad():
            w.add_(1.0)
        return w


class Norm(nn.Module):
    """RMSNorm, or LayerNorm with or without bias, over the last ``width`` elements."""

    def __init__(self, init: _Init, kind: str, width: int, bias: bool = False, weight: bool = True):
        """``weight=False``: no learned weight or bias (OLMo-1's LayerNorm)."""
        super().__init__()
        self.kind, self.width = kind, width
        self.weight = init.ones(width) if weight else None
        self.bias = init.bias(width, kind == "layernorm" and bias and weight)

    def forward(self, x):
        if self.kind == "rmsnorm":
            return F.rms_norm(x, (self.width,), self.weight, NORM_EPS)
        return F.layer_norm(x, (self.width,), self.weight, self.bias, NORM_EPS)


def _cache(shape, dtype, device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)
