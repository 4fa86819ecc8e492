"""The reference decoder's MoE sublayer with the variants of :mod:`lmcost.operators.moe_variants`: the dense FFN
beside the MoE (``moe.shortcut``, LongCat-Flash's ScMoE) and an RMSNorm on the MoE block's output
(``moe.post_norm``, A.X-K1), a bias [d] on the MoE block's output (``moe.output_bias``, JetMoE). Zero-computation experts run inside :class:`lmcost.profiling.decoder_ffn.MoE`.
"""

from __future__ import annotations

from torch import nn

from lmcost.model.config import ArchConfig
from lmcost.profiling.decoder_common import Norm, _Init
from lmcost.profiling.decoder_ffn import FFN, MoE
from lmcost.profiling.decoder_kernels import _Pass


def moe_sublayer(cfg: ArchConfig, init: _Init) -> nn.Module:
    """The MoE sublayer of ``cfg``: :class:`MoE`, or :class:`MoEVariants` when it has a shortcut or a post-norm."""
    m = cfg.moe
    return MoEVariants(cfg, init) if (m.shortcut or m.post_norm or m.output_bias) else MoE(cfg, init)


class MoEVariants(nn.Module):
    """x [b,s,d] -> the dense FFN of x (scopes ``ffn.*``) + the MoE of x (``moe.*``, then ``moe.post_norm``),
    added under ``moe.shortcut_residual``: the ops of :func:`lmcost.operators.moe_variants.moe_layer_ops` in order."""

    def __init__(self, cfg: ArchConfig, init: _Init):
        super().__init__()
        m = cfg.moe
        self.dense = FFN(cfg, init, cfg.ffn.d_ff, cfg.ffn.bias) if m.shortcut else None
        self.moe = MoE(cfg, init)
        self.post_norm = Norm(init, "rmsnorm", cfg.d_model) if m.post_norm else None
        self.output_bias = init.bias(cfg.d_model, m.output_bias)  # JetMoE

    def forward(self, x, P: _Pass, sc):
        f = self.dense(x, P, sc) if self.dense is not None else None
        y = self.moe(x, P, sc)
        if self.output_bias is not None:
            with sc("moe.output_bias"):
                y = y + self.output_bias
        if self.post_norm is not None:
            with sc("moe.post_norm"):
                y = self.post_norm(y)
        if f is None:
            return y
        with sc("moe.shortcut_residual"):
            return f + y
