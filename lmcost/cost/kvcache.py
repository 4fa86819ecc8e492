"""KV-cache size: what attention keeps per token and per sequence, summed over layers.

MHA/MQA/GQA keep K and V: 2*h_kv*d_h elements per token per layer; MLA keeps the latent and the
shared RoPE key: d_c + d_r (DeepSeek-V2, section 2.1.2), and under DSA the indexer's key too. A local layer keeps at most w tokens.
Totals: 2*b*t*L*h_kv*d_h*B_kv and L*b*t*(d_c + d_r)*B_kv bytes when no layer slides.
Hybrid stacks: a constant-state layer (Mamba-2, short conv, gated DeltaNet) keeps per sequence its conv
state and SSM/delta-rule state whatever t (:func:`lmcost.operators.recurrent.state_bytes`), counted here too.
"""

from __future__ import annotations

from collections import OrderedDict

from lmcost.operators.attention import cached_tokens, kv_width
from lmcost.basics.dtypes import Precision
from lmcost.operators.forward import Dims
from lmcost.operators.per_layer import is_kv_shared, layer_dims
from lmcost.operators.recurrent import RECURRENT_KINDS, state_bytes
from lmcost.operators.sparse_attention import index_cache_bytes
from lmcost.basics.tracing import Tracer, compile_outputs

#: Compiled KV formulas: (config identity, precision, block_size) -> (config, function of (b, t)).
_COMPILED: OrderedDict = OrderedDict()


def kv_bytes(cfg, precision: Precision, b, t, block_size: int | None = None):
    """KV-cache bytes for b sequences at context t (ints or arrays), all layers.

    With ``block_size``, each sequence's tokens in each layer are rounded up to whole blocks, as a
    paged cache allocates them (Kwon et al. 2023, vLLM, section 4.1): ceil(tokens / block) * block.
    The formula (:func:`kv_formula`) is traced once per config, precision and block size and compiled
    (:mod:`lmcost.basics.tracing`): the same arithmetic, in the same order, without rebuilding the dims.
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

    def held(kind):  # an attention kind (ATTENTION_KINDS): local/chunked layers hold a window
        n = cached_tokens(x, kind)
        return n if block_size is None else (n + block_size - 1) // block_size * block_size

    total = 0
    for kind, _, n in cfg.layer_groups():
        if kind in RECURRENT_KINDS:  # a constant-size state per sequence (conv + SSM/delta-rule state)
            total = total + n * x.b * state_bytes(cfg, kind, x.B_kv)
        elif kind != "none" and not is_kv_shared(kind):  # a KV-shared layer caches nothing (Gemma 3n/4)
            total = total + n * x.b * held(kind) * kv_width(cfg, layer_dims(cfg, x, kind)) * x.B_kv
            if cfg.attention.sparse is not None:  # DSA's index keys, beside K/V (lmcost.operators.sparse_attention)
                total = total + n * x.b * held(kind) * index_cache_bytes(cfg, x)
    return total


def state_bytes_per_sequence(cfg, precision: Precision) -> int:
    """Bytes of constant-size state (conv states + SSM/delta-rule states, :mod:`lmcost.operators.recurrent`) one
    sequence keeps over all layers of a hybrid stack, whatever its context; 0 without such layers."""
    return sum(n * state_bytes(cfg, kind, precision.B_kv) for kind, _, n in cfg.layer_groups()
               if kind in RECURRENT_KINDS)


def kv_bytes_per_token(cfg, precision: Precision):
    """KV-cache bytes one token adds in every layer (below any sliding window); a hybrid stack's
    constant-size state (:func:`state_bytes_per_sequence`) is not per token and is left out."""
    return kv_bytes(cfg, precision, 1, 1) - state_bytes_per_sequence(cfg, precision)
