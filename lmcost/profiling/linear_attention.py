"""The reference decoder's linear-attention mixers (see :mod:`lmcost.operators.linear_attention`, the analytic
operators they run under the same ``record_function`` names).

- :class:`LightningMixer`: MiniMax's lightning attention, weights and layout as transformers'
  MiniMaxLightningAttention (qkv_proj grouped per head [q, k, v], output_gate, out_proj, an RMSNorm over
  all heads): SiLU on q, k, v; a prefill from empty runs transformers' blocked loop (blocks of block_size,
  the last one unpadded: intra-block (QKᵀ ⊙ decay)·V, inter-block (Q ⊙ decay)·S, the state update
  (K ⊙ decay)ᵀ·V); a pass that continues a sequence steps the recurrence S = λS + kᵀv, o = qS per token,
  from the cached state [h, d_h, d_h] (model dtype); norm; sigmoid gate; out_proj.

The per-head decay slope is a buffer: MiniMax's slope of layer i of L, base^(j+1) * (1 - i/(L-1) + 1e-5)
for head j (base 2^(-8/h)), computed here for layer 0 (the costs do not depend on it; a test copies a
layer's slopes in to compare with transformers).

Arguments named as in :mod:`lmcost.profiling.recurrent`: ``init`` the decoder's seeded weight source,
``P`` its pass (b, s, start position p), ``sc`` the scope opener of the block.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmcost.model.config import ArchConfig
from lmcost.operators.linear_attention import LINEAR_KINDS  # noqa: F401 (re-exported: the kinds built here)

#: RMSNorm epsilon, as the reference decoder's norms (lmcost.profiling.decoder_common.NORM_EPS).
NORM_EPS = 1e-5


class LightningMixer(nn.Module):
    """MiniMax's lightning attention (see the module's docstring and
    :func:`lmcost.operators.linear_attention.lightning_ops`)."""

    def __init__(self, cfg: ArchConfig, init, max_batch: int):
        super().__init__()
        m, d = cfg.recurrent.lightning, cfg.d_model
        self.h, self.dh, self.B = m.n_heads, m.head_dim, m.block_size
        D = self.h * self.dh
        self.w_qkv = init.matrix(3 * D, d)
        self.w_gate = init.matrix(D, d)
        self.w_out = init.matrix(d, D)
        self.w_norm = init.ones(D)
        base = 2.0 ** (-8.0 / self.h)
        slope = base ** torch.arange(1, self.h + 1, dtype=torch.float32) * (1 + 1e-5)
        self.register_buffer("slope", slope.to(init.device)[:, None, None], persistent=False)  # [h, 1, 1]
        self.register_buffer("state", torch.zeros(max_batch, self.h, self.dh, self.dh, dtype=init.dtype,
                                                  device=init.device), persistent=False)

    def cache_tensors(self):
        return [self.state]

    def state_tensors(self):
        return []  # in the model dtype, as MiniMaxCache keeps it (not an fp32 state)

    def forward(self, x, P, sc):
        b, s = x.shape[:2]
        h, dh = self.h, self.dh
        with sc("mixer.qkv_proj"):
            qkv = F.linear(x, self.w_qkv)
        with sc("mixer.qkv_act"):
            qkv = F.silu(qkv)
        q, k, v = (t.transpose(1, 2) for t in qkv.view(b, s, h, 3 * dh).split(dh, dim=3))   # [b, h, s, dh]
        o = self._step(sc, q, k, v, b, s) if P.p > 0 else self._blocked(sc, q, k, v, b, s)
        o = o.transpose(1, 2).reshape(b, s, h * dh)
        with sc("mixer.norm"):
            o = F.rms_norm(o, (h * dh,), None, NORM_EPS) * self.w_norm
        with sc("mixer.output_gate"):
            g = F.linear(x, self.w_gate)
        with sc("mixer.gate"):
            o = torch.sigmoid(g) * o
        with sc("mixer.out_proj"):
            return F.linear(o, self.w_out)

    def _step(self, sc, q, k, v, b, s):
        """The recurrence per token from the cached state: S = λS + kᵀv, o = qS."""
        S, out = self.state[:b].clone(), []
        with sc("mixer.lightning_state"):
            ratio = torch.exp(-self.slope).to(S.dtype)
        for i in range(s):
            with sc("mixer.lightning"):
                kv = k[:, :, i:i + 1].transpose(-1, -2) @ v[:, :, i:i + 1]
            with sc("mixer.lightning_state"):
                S = ratio * S + kv
            with sc("mixer.lightning"):
                out.append(q[:, :, i:i + 1] @ S)
        with torch.no_grad():
            self.state[:b].copy_(S)
        return torch.cat(out, dim=2)

    def _blocked(self, sc, q, k, v, b, s):
        """transformers' blocked loop from a zero state (blocks of B, the last one of s mod B unpadded)."""
        S, out = torch.zeros_like(self.state[:b]), []
        for start in range(0, s, self.B):
            c = min(self.B, s - start)
            qc, kc, vc = (t[:, :, start:start + c] for t in (q, k, v))
            with sc("mixer.lightning_state"):
                pos = torch.arange(1, c + 1, device=q.device, dtype=torch.float32)
                q_decay = torch.exp(-self.slope * pos[:, None]).to(q.dtype)                 # [h, c, 1]
                k_decay = torch.exp(-self.slope * (c - pos[:, None])).to(q.dtype)
                diff = pos[:, None] - pos[None, :]
                mask = torch.exp(torch.where(diff >= 0, -self.slope * diff, float("-inf"))).to(q.dtype)   # [h, c, c]
                block_decay = torch.exp(-self.slope * c).to(q.dtype)
            with sc("mixer.lightning"):
                scores = qc @ kc.transpose(-1, -2)
            with sc("mixer.lightning_state"):
                scores = scores * mask
            with sc("mixer.lightning"):
                intra = scores @ vc
                inter = (qc * q_decay) @ S
            with sc("mixer.lightning_state"):
                out.append(inter + intra)
            with sc("mixer.lightning"):
                kv = (kc * k_decay).transpose(-1, -2) @ vc
            with sc("mixer.lightning_state"):
                S = S * block_decay + kv
        with torch.no_grad():
            self.state[:b].copy_(S)
        return torch.cat(out, dim=2)


def linear_attention_mixer(cfg: ArchConfig, init, kind: str, max_batch: int) -> nn.Module:
    """The reference mixer of a LINEAR_KINDS layer. Raises: ValueError for another kind."""
    if kind == "lightning":
        return LightningMixer(cfg, init, max_batch)
    raise ValueError(f"not a linear-attention mixer: {kind!r}")
