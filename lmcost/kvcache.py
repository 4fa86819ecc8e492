"""KV-cache size: what attention keeps per token and per sequence, summed over layers.

MHA/MQA/GQA keep K and V: 2*h_kv*d_h elements per token per layer; MLA keeps the latent and the
shared RoPE key: d_c + d_r (DeepSeek-V2, section 2.1.2). A local layer keeps at most w tokens.
Totals: 2*b*t*L*h_kv*d_h*B_kv and L*b*t*(d_c + d_r)*B_kv bytes when no layer slides.
"""

from __future__ import annotations

from .attention import cached_tokens, kv_width
from .dtypes import Precision
from .graph import Dims


def kv_bytes(cfg, precision: Precision, b, t, block_size: int | None = None):
    """KV-cache bytes for b sequences at context t (ints or arrays), all layers.

    With ``block_size``, each sequence's tokens in each layer are rounded up to whole blocks, as a
    paged cache allocates them (Kwon et al. 2023, vLLM, section 4.1): ceil(tokens / block) * block.
    """
    x = Dims.of(cfg, precision, b, 1, t)

    def held(local):
        n = cached_tokens(x, local)
        return n if block_size is None else (n + block_size - 1) // block_size * block_size

    return sum(n * x.b * held(kind == "local") * kv_width(cfg, x) * x.B_kv for kind, _, n in cfg.layer_groups())


def kv_bytes_per_token(cfg, precision: Precision):
    """KV-cache bytes one token adds in every layer (below any sliding window)."""
    return kv_bytes(cfg, precision, 1, 1)
