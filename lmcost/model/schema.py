"""The widths, bounds and strict base every section of an lmcost model schema shares, and the attention layer
kinds (the entries of a layer pattern), imported by :mod:`lmcost.model.config` and :mod:`lmcost.model.mixers`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: Upper bounds that are physical, not a guess at the next model: a width past them (a head_dim of 2^31)
#: is a typo, and its costs (exabytes per layer) mean nothing. Widths and head counts: 2^20 = 1,048,576
#: (the widest published models are near 2^15: d_ff 53,248 in Llama-3.1-405B, 73,728 in Nemotron-4-340B);
#: vocabularies 2^24 (16.8M; the largest published near 2^18: Gemma's 262,144); positions (a context,
#: a window, a chunk) 2^31, the largest token count lmcost takes anywhere.
MAX_WIDTH = 2**20
MAX_VOCAB = 2**24
MAX_POSITIONS = 2**31
#: Layers: a loop runs over them, so a typo like 10^20 must not hang the tool.
MAX_LAYERS = 100_000
#: A width or count of elements (d_model, d_ff, head_dim, heads, experts, ranks).
PositiveInt = Annotated[int, Field(gt=0, le=MAX_WIDTH)]
#: A count of positions (context, sliding window, chunk).
Positions = Annotated[int, Field(gt=0, le=MAX_POSITIONS)]
LayerCount = Annotated[int, Field(gt=0, le=MAX_LAYERS)]


class _Strict(BaseModel):
    # strict: `d_ff: true` or `n_heads: "32"` is an error, not 1 or 32; nan and inf are no number a
    # formula can use (a soft-cap of inf, a SwiGLU limit of nan).
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


#: Entries of ``attention.layer_pattern``: the mask of the layer (``global``: every earlier key; ``local``:
#: the last sliding_window keys; ``chunked``: the keys of the query's own chunk of chunk_size positions,
#: Llama 4) and, with ``_nope``, a layer that applies no RoPE (Llama 4, SmolLM3).
ATTENTION_KINDS = ("global", "local", "chunked", "global_nope", "local_nope", "chunked_nope")


def mask_of(kind: str) -> str:
    """The mask of an attention layer kind (``global``/``local``/``chunked``): ``local_nope`` -> ``local``, and
    a KV-shared layer's ``local_shared`` -> ``local`` (:mod:`lmcost.model.layer_sharing`)."""
    return kind.removesuffix("_shared").removesuffix("_nope")


def has_rope(kind: str) -> bool:
    """Whether a layer of this attention kind applies RoPE (if the model has RoPE): not the ``_nope`` kinds."""
    return not kind.endswith("_nope")
