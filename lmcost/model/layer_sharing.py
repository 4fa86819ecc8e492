"""Schema of the Gemma 3n / Gemma 4 layer mechanisms: KV sharing across layers, K=V attention, global layers of
their own width, and per-layer input embeddings (PLE). Their operators: :mod:`lmcost.operators.per_layer`.

- KV sharing (``attention.kv_shared_layers`` = N): the last N layers compute no keys or values and keep no
  cache; each attends over the K/V of the last earlier layer of its own mask (transformers
  Gemma4TextConfig.kv_sharing_modes, Gemma3nTextAttention). Their layer kind carries the suffix ``_shared``
  (``local_shared``, ``global_shared``), which :meth:`lmcost.model.config.ArchConfig.layer_kinds` adds.
- K=V (``attention.k_eq_v: global``): the global layers have no v_proj; the key projection's output, before
  the key norm and RoPE, is the values (Gemma4TextAttention's ``use_alternative_attention``).
- ``attention.v_norm``: an RMSNorm without weight on each value head (Gemma 3n, Gemma 4).
- ``attention.global_head_dim`` / ``global_n_kv_heads``: the global layers' own head width and K/V heads
  (Gemma 4's global_head_dim and num_global_key_value_heads, per_layer_config in transformers 5.24).
- ``ffn.kv_shared_double``: the FFN of a KV-shared layer is twice as wide (Gemma 4's use_double_wide_mlp).
- AltUp and LAuReL (``altup``, :class:`AltUp`): Gemma 3n's K-copy residual stream and low-rank residual.
- PLE (``per_layer_input``): a second embedding table [V_p, L*p] and a projection d -> L*p give each layer
  a [b,s,p] input; each layer gates it and adds a projection back to d (Gemma4TextModel.get_per_layer_inputs,
  project_per_layer_inputs; Gemma4TextDecoderLayer).
"""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field

from lmcost.model.schema import MAX_VOCAB, PositiveInt, _Strict, mask_of

#: The suffix of the layer kind of a layer that reuses an earlier layer's K/V.
SHARED = "_shared"


class PerLayerInput(_Strict):
    """Per-layer input embeddings (Gemma 3n/4's PLE): ``width`` p per layer, a table of ``vocab`` rows.

    Model: e = table[ids] [b,s,L*p] (scaled by sqrt(p)); c = RMSNorm_p((x0 @ W_proj [d,L*p]) / sqrt(d)) per layer;
    input_i = (c_i + e_i) / sqrt(2). Layer i, after its FFN: y += RMSNorm_d(act(y @ W_gate [d,p]) * input_i @ W_up [p,d]).
    """

    width: PositiveInt
    vocab: Annotated[int, Field(gt=0, le=MAX_VOCAB)]
    #: The gate's activation (Gemma's hidden_activation).
    activation: Literal["gelu", "silu", "relu"] = "gelu"


class AltUp(_Strict):
    """Alternating updates (Baykal et al. 2023, "AltUp", NeurIPS; transformers Gemma3nTextAltUp): the residual
    stream is ``n_inputs`` copies [K,b,s,d]; each layer predicts all K from a router over the active copy
    (RMSNorm, d -> K, tanh, K -> K^2 coefficients, [b,s,d,K] @ [b,s,K,K]), runs its block on the active one and
    corrects the K copies by the innovation (K -> K coefficients). The model projects the embedding into K-1
    more copies (K-1 linears d -> d) and back after the last layer, then averages them. With ``laurel_rank``,
    each layer adds LAuReL's low-rank residual (Menghani et al. 2024, "LAuReL"; Gemma3nTextLaurelBlock):
    x + RMSNorm(x @ W_left [d,r] @ W_right [r,d]) beside attention."""

    n_inputs: Annotated[int, Field(ge=2, le=64)]
    #: Scale the corrected active copy by a learned [d] before the per-layer input (altup_correct_scale).
    correct_scale: bool = True
    laurel_rank: Optional[PositiveInt] = None


def shared_kinds(kinds: list[tuple[str, str]], n_shared: int) -> list[tuple[str, str]]:
    """Per-layer (mixer, ffn) kinds with the last ``n_shared`` mixers marked ``_shared``."""
    if not n_shared:
        return kinds
    first = len(kinds) - n_shared
    return [(m + SHARED if i >= first else m, f) for i, (m, f) in enumerate(kinds)]


def check_sharing(cfg) -> None:
    """An ArchConfig's KV sharing, K=V, global widths and PLE are consistent. Raises: ValueError (the schema's
    validation) for global K/V heads that do not divide the heads, any of them with MLA, every layer shared, a shared layer has no earlier layer of its mask to read from, or KV sharing or
    PLE sits in a hybrid stack."""
    a = cfg.attention
    n = a.kv_shared_layers
    if a.global_n_kv_heads is not None and a.n_heads % a.global_n_kv_heads:
        raise ValueError(f"attention: global_n_kv_heads={a.global_n_kv_heads} does not divide n_heads={a.n_heads}; "
                         "set it to a divisor of n_heads")
    if (n or a.k_eq_v != "none" or a.v_norm or a.global_head_dim or a.global_n_kv_heads) and a.mla is not None:
        raise ValueError("attention: KV sharing, K=V, v_norm and global-layer widths are not modelled with mla; "
                         "remove them or the mla section")
    if cfg.recurrent is not None and (n or cfg.per_layer_input is not None):
        raise ValueError("recurrent: KV sharing and per-layer inputs are not modelled in a hybrid stack; "
                         "remove attention.kv_shared_layers and per_layer_input")
    if cfg.altup is not None and (cfg.block != "sandwich" or cfg.recurrent is not None or cfg.moe is not None
                                  or not cfg.embeddings or cfg.per_layer_input is None):
        raise ValueError("altup: modelled as Gemma 3n's blocks only (sandwich norms, dense FFNs, embeddings and "
                         "per_layer_input); remove altup or write those")
    if not n:
        return
    if n >= cfg.n_layers:
        raise ValueError(f"attention: kv_shared_layers={n} leaves no layer computing K/V of {cfg.n_layers}; "
                         "use fewer shared layers")
    kinds = [m for m, _ in cfg.layer_kinds()]
    own = {mask_of(m) for m in kinds if not m.endswith(SHARED)}
    for m in kinds:
        if m.endswith(SHARED) and mask_of(m) not in own:
            raise ValueError(f"attention: a KV-shared {mask_of(m)} layer has no earlier {mask_of(m)} layer to "
                             "reuse K/V from; lower kv_shared_layers")


def reference_decoder_lacks(cfg) -> list[str]:
    """The mechanisms of this module ``cfg`` uses, which the reference decoder (:mod:`lmcost.profiling.decoder`)
    does not build yet: empty when it can run ``cfg``."""
    a = cfg.attention
    named = [("KV sharing across layers", a.kv_shared_layers), ("K=V attention", a.k_eq_v != "none"),
             ("value norms", a.v_norm), ("global layers of their own width", a.global_head_dim or a.global_n_kv_heads),
             ("per-layer inputs", cfg.per_layer_input is not None), ("AltUp/LAuReL", cfg.altup is not None),
             ("normed MoE branches", cfg.moe is not None and cfg.moe.normed_branches)]
    return [name for name, on in named if on]
