"""KV-cache size: what attention keeps per token and per sequence, summed over layers.

MHA/MQA/GQA keep K and V: 2*h_kv*d_h elements per token per layer; MLA keeps the latent and the
shared RoPE key: d_c + d_r (DeepSeek-V2, section 2.1.2). A local layer keeps at most w tokens.
Totals: 2*b*t*L*h_kv*d_h*B_kv and L*b*t*(d_c + d_r)*B_kv bytes when no layer slides.
"""

from __future__ import annotations

from collections import OrderedDict

from .attention import cached_tokens, kv_width
from .dtypes import Precision
from .graph import Dims
from .tracing import Tracer, compile_outputs

#: Compiled KV formulas: (config identity, precision, block_size) -> (config, function of (b, t)).
_COMPILED: OrderedDict = OrderedDict()


def kv_bytes(cfg, precision: Precision, b, t, block_size: int | None = None):
    """KV-cache bytes for b sequences at context t (ints or arrays), all layers.

    With ``block_size``, each sequence's tokens in each layer are rounded up to whole blocks, as a
    paged cache allocates them (Kwon et al. 2023, vLLM, section 4.1): ceil(tokens / block) * block.
    The formula (:func:`kv_formula`) is traced once per config, precision and block size and compiled
    (:mod:`lmcost.tracing`): the same arithmetic, in the same order, without rebuilding the dims.
    """
    key = (id(cfg), precision, block_size)
    hit = _COMPILED.get(key)
    if hit is None or hit[0] is not cfg:
        tracer = Tracer()
        fn = compile_outputs(tracer, ("b", "t"), [[kv_formula(cfg, precision, tracer.var("b"), tracer.var("t"),
                                                               block_size)]], f"{cfg.name} KV cache")
        hit = _COMPILED[key] = (cfg, fn)
        if len(_COMPILED) > 64:
            _COMPILED.popitem(last=False)
    return hit[1](b, t)[0][0]


def kv_formula(cfg, precision: Precision, b, t, block_size: int | None = None):
    """:func:`kv_bytes` written out over dims (ints, arrays, symbols or traced dims)."""
    x = Dims.of(cfg, precision, b, 1, t)

    def held(local):
        n = cached_tokens(x, local)
        return n if block_size is None else (n + block_size - 1) // block_size * block_size

    return sum(n * x.b * held(kind == "local") * kv_width(cfg, x) * x.B_kv for kind, _, n in cfg.layer_groups())


def kv_bytes_per_token(cfg, precision: Precision):
    """KV-cache bytes one token adds in every layer (below any sliding window)."""
    return kv_bytes(cfg, precision, 1, 1)
