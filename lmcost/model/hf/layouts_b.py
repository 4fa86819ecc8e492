"""Hugging Face mappings of MoE and attention layouts of their own, each built from mechanisms lmcost already
models (GQA with a window per layer type, per-head q/k norms, routed and shared experts, the gated DeltaNet) or
from one small one (Laguna's softplus output gate, :mod:`lmcost.operators.output_gate`).

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields, called by :func:`lmcost.model.hf.families.from_hf_config`; the reader records
the keys used, so a key no mapping reads is still refused. The reference for each is the family's transformers
5.24 config class (defaults, derived fields) and model (which weights exist); each was checked exactly against
it: parameters of the default config on the meta device (tests/test_params.py), FlopCounterMode matmul FLOPs of
a tiny instance in prefill and decode (tests/test_flop_oracle.py), and the bytes of the cache object transformers
fills (tests/test_layouts_b.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import Reader, activation, mapped_layer_types, rotary_fraction
from lmcost.model.hf.registry import family, mapped_in

#: layer_types of these families -> lmcost's attention kinds.
_WINDOW_TYPES = {"sliding_attention": "local", "full_attention": "global"}


def _first(r: Reader, keys: tuple[str, ...], default):
    """The value under the first of ``keys`` (a canonical key, then its attribute_map aliases) that is set, else
    ``default``, as a config class without accept_kwargs sets it (MellumConfig: the field wins); every key is read
    (so an alias is not refused as unknown)."""
    values = [r.get(k, None, kind=int) for k in keys]
    return next((v for v in values if v is not None), default)


def _alias_wins(r: Reader, canon: str, aliases: tuple[str, ...], default, kind: type = int):
    """The value of ``canon`` as a config class with ``@strict(accept_kwargs=True)`` and an attribute_map sets it
    (SarvamMoEConfig, SolarOpenConfig): the field first, then each alias present, in the file's order, over it
    (so the last alias given wins; checked against transformers in tests/test_layouts_b.py)."""
    value = r.get(canon, default, kind=kind)
    for key in r.data:
        if key in aliases and r.get(key, None, kind=kind) is not None:
            value = r.data[key]
    return value


def _kv_heads(r: Reader, h: int, default: int) -> int:
    """num_key_value_heads: the class default when absent; an explicit null is MHA (the config classes' check
    num_attention_heads % num_key_value_heads would fail on it, and PreTrainedConfig sets it to the heads)."""
    if "num_key_value_heads" in r.data and r.data["num_key_value_heads"] is None:
        r.used.add("num_key_value_heads")
        return h
    return r.get("num_key_value_heads", default)


def _windows(r: Reader, n_layers: int, default_window: int | None, default: list[str]) -> tuple[int | None, list[str]]:
    """(sliding_window, per-layer kinds) from layer_types (full/sliding; absent: ``default``, the config class's
    derivation). A sliding layer without a window attends to every key (the attention modules pass
    sliding_window None), so without a window every layer is global.
    Raises: LmcostError for a layer_types of the wrong length or with another type."""
    window = r.get("sliding_window", default_window, kind=int)
    if "sliding_window" in r.data and r.data["sliding_window"] is None:
        window = None
    types = r.get("layer_types", None, kind=list)
    kinds = default if types is None else mapped_layer_types(r, types, n_layers, _WINDOW_TYPES)
    if not window:
        return None, ["global"] * n_layers
    return (window if "local" in kinds else None), kinds


def _dense_layers(r: Reader, n_layers: int, default: list[str]) -> list[int]:
    """Indices of the dense layers of mlp_layer_types ("dense"/"sparse" per layer; absent: ``default``).
    Raises: LmcostError for a wrong length or another entry."""
    types = r.get("mlp_layer_types", None, kind=list)
    if types is None:
        types = default
    if len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
        raise LmcostError(f"{r.source}: mlp_layer_types", f"must be {n_layers} entries of dense or sparse",
                          "give one entry per layer (num_hidden_layers), or remove mlp_layer_types")
    return [i for i, t in enumerate(types) if t == "dense"]


def _period(kinds: list[str]) -> list[str]:
    """The shortest pattern p with kinds[i] == p[i % len(p)] for every layer (layer_pattern repeats)."""
    for n in range(1, len(kinds) + 1):
        if all(k == kinds[i % n] for i, k in enumerate(kinds)):
            return kinds[:n]
    return kinds


@family("solar_open")
def solar_open(r: Reader, mt: str) -> dict:
    """Solar Open (upstage/Solar-Open-100B; transformers SolarOpenConfig/SolarOpenForCausalLM): Llama attention
    (a bias on q, k and v with attention_bias; o_proj has none), every layer GLM-4.5's MoE (Glm4MoeMoE: a
    sigmoid router over n_routed_experts of moe_intermediate_size, top num_experts_per_tok, plus
    n_shared_experts x moe_intermediate_size as one shared MLP; the router's correction bias is a buffer),
    RoPE on partial_rotary_factor of each head (default the whole head).

    Read without a cost: intermediate_size, first_k_dense_replace, use_qk_norm and num_mtp_layers, which
    SolarOpenConfig removes from GLM-4.5's config and its model never reads (every layer is a MoE, no q/k norm,
    no MTP head). The schema's dense FFN is then unused; its width is moe_intermediate_size.
    """
    n_layers = r.get("num_hidden_layers", 48)
    h = r.get("num_attention_heads", 64)
    d = r.get("hidden_size", 4096)
    for key in ("intermediate_size", "first_k_dense_replace", "use_qk_norm", "num_mtp_layers"):
        r.get(key, None)
    d_e = r.get("moe_intermediate_size", 1280)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 196608),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 8), head_dim=r.get("head_dim", 128),
                               qkv_bias=r.get("attention_bias", False), out_bias=False),
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=d_e),
                moe=dict(n_experts=_alias_wins(r, "n_routed_experts", ("num_local_experts",), 128),
                         top_k=r.get("num_experts_per_tok", 8), d_ff_expert=d_e,
                         n_shared_experts=r.get("n_shared_experts", 1)),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 1.0),
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("sarvam_moe")
def sarvam_moe(r: Reader, mt: str) -> dict:
    """Sarvam-MoE (sarvamai/sarvam-30b; transformers SarvamMoEConfig, built by Glm4MoeForCausalLM): GLM-4.5 with
    RoPE on the whole head (partial_rotary_factor 1.0), per-head q/k RMSNorm (use_qk_norm, on by default),
    64-wide heads; a bias on q, k and v with attention_bias (alias use_qkv_bias), none on o; the first
    first_k_dense_replace layers a SwiGLU MLP of intermediate_size, the others n_routed_experts (aliases
    num_local_experts, num_experts) of moe_intermediate_size, top num_experts_per_tok, plus n_shared_experts
    (alias num_shared_experts) x moe_intermediate_size as one shared MLP. num_mtp_layers: no MTP head is built.
    """
    n_layers = r.get("num_hidden_layers", 19)
    h = r.get("num_attention_heads", 64)
    d = r.get("hidden_size", 4096)
    r.get("num_mtp_layers", None)
    bias = _alias_wins(r, "attention_bias", ("use_qkv_bias",), False, kind=bool)
    shared = _alias_wins(r, "n_shared_experts", ("num_shared_experts",), 1)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 262144),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=r.get("head_dim", 64),
                               qkv_bias=bias, out_bias=False,
                               qk_norm="head" if r.get("use_qk_norm", True) else "none"),
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 8192)),
                moe=dict(n_experts=_alias_wins(r, "n_routed_experts", ("num_local_experts", "num_experts"), 128),
                         top_k=r.get("num_experts_per_tok", 6), d_ff_expert=r.get("moe_intermediate_size", 1024),
                         n_shared_experts=shared, first_dense_layers=r.get("first_k_dense_replace", 1)),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 1.0),
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("mellum")
def mellum(r: Reader, mt: str) -> dict:
    """Mellum 2 (JetBrains/Mellum2-12B-A2.5B-Base; transformers MellumConfig/MellumForCausalLM): Qwen3-MoE
    attention (per-head q/k RMSNorm, a bias on q, k, v and o with attention_bias) with a window on the
    sliding_attention layers of layer_types (default all full), RoPE per layer type as Laguna's
    (:func:`_rotary_of`), and per mlp_layer_types a MoE of
    num_local_experts (alias num_experts) of moe_intermediate_size, top num_experts_per_tok, no shared expert
    (default all sparse) or a SwiGLU MLP of intermediate_size. The MTP layer (num_mtp_layers, mtp_layer_types,
    mtp_mlp_layer_types) is not built by transformers (its weights are ignored on load): read, not counted.
    """
    n_layers = r.get("num_hidden_layers", 28)
    h = r.get("num_attention_heads", 32)
    d = r.get("hidden_size", 2304)
    for key in ("num_mtp_layers", "mtp_layer_types", "mtp_mlp_layer_types"):
        r.get(key, None)
    window, kinds = _windows(r, n_layers, 1024, ["global"] * n_layers)
    dense = _dense_layers(r, n_layers, ["sparse"] * n_layers)
    bias = r.get("attention_bias", False)
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 98304),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=r.get("head_dim", 128),
                              qkv_bias=bias, out_bias=bias, qk_norm="head", sliding_window=window,
                              layer_pattern=_period(kinds)),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 7168)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               rotary_fraction=_rotary_of(r, kinds, {"full_attention": 1.0, "sliding_attention": 1.0}),
               tie_embeddings=r.get("tie_word_embeddings", False))
    n_experts = _first(r, ("num_local_experts", "num_experts"), 64)
    top_k = r.get("num_experts_per_tok", 8)
    d_e = r.get("moe_intermediate_size", 896)
    if len(dense) < n_layers:
        out["moe"] = dict(n_experts=n_experts, top_k=top_k, d_ff_expert=d_e, dense_layers=dense)
    return out


def _rotary_of(r: Reader, kinds: list[str], defaults: dict[str, float]) -> float:
    """The partial rotary factor of a config whose rope_parameters are per layer type ({"full_attention": {...},
    "sliding_attention": {...}}; LagunaRotaryEmbedding, int(head_dim * factor) rotated dims): the full-attention
    layers' factor when the model has any, else the sliding layers'. lmcost has one rotary width per model, so
    where both kinds are present with different factors the sliding layers' RoPE (elementwise, no parameters,
    no matmul) is counted at the full layers' width."""
    rope = r.data.get("rope_parameters")
    kind = "full_attention" if "global" in kinds else "sliding_attention"
    params = rope.get(kind) if isinstance(rope, dict) else None
    if isinstance(params, dict):
        value = params.get("partial_rotary_factor", 1.0)
    elif isinstance(rope, dict) and rope and not any(isinstance(v, dict) for v in rope.values()):
        value = rope.get("partial_rotary_factor", defaults[kind])  # one set for every layer
    else:
        value = defaults[kind]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise LmcostError(f"{r.source}: rope_parameters.{kind}.partial_rotary_factor", f"must be in (0, 1], got {value!r:.40}",
                          "give the share of each head RoPE rotates (1.0: all of it)")
    return float(value)


@family("laguna")
def laguna(r: Reader, mt: str) -> dict:
    """Laguna (poolside/laguna-XS.2; transformers LagunaConfig/LagunaForCausalLM): GQA with per-head q/k RMSNorm,
    a bias on q, k, v and o with attention_bias, a window on the sliding_attention layers of layer_types
    (default all full), and a softplus output gate (g_proj: one gate per head with gating true or "per-head",
    else one per element: :mod:`lmcost.operators.output_gate`); per mlp_layer_types (default the first dense)
    a SwiGLU MLP of intermediate_size, or num_experts routed experts of moe_intermediate_size (a sigmoid router
    with a learned correction bias [E], a parameter: counted as a router bias), top num_experts_per_tok, plus a
    shared SwiGLU MLP of shared_expert_intermediate_size. RoPE per layer type (:func:`_rotary_of`).

    Read without a cost: moe_routed_scaling_factor (a scalar) and moe_router_logit_softcapping (a tanh on the E
    router logits of each token, not counted). Refused: num_attention_heads_per_layer with different counts
    (lmcost has one head count per model) and moe_apply_router_weight_on_input (transformers refuses it).
    """
    n_layers = r.get("num_hidden_layers", 40)
    h = r.get("num_attention_heads", 48)
    d = r.get("hidden_size", 2048)
    per_layer = r.get("num_attention_heads_per_layer", None, kind=list)
    if per_layer is not None:
        if len(per_layer) != n_layers or len(set(map(repr, per_layer))) != 1:
            raise LmcostError(f"{r.source}: num_attention_heads_per_layer", "a head count per layer that differs "
                              "between layers is not modelled (one head count per model)",
                              "give every layer the same count, or write an lmcost YAML of one group of layers")
        h = per_layer[0]
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise LmcostError(f"{r.source}: num_attention_heads_per_layer", f"entry {h!r:.20} is not a head count",
                              "give whole numbers >= 1")
    r.must_not("moe_apply_router_weight_on_input", "scaling the experts' input by the router weight")
    r.get("moe_routed_scaling_factor", 1.0, kind=float)
    r.get("moe_router_logit_softcapping", 0.0, kind=float)
    gating = r.get("gating", True, kind=object)
    if gating not in (True, False, "per-head", "per-element"):
        raise LmcostError(f"{r.source}: gating", f"unknown gating {gating!r:.40}",
                          "use true, \"per-head\" or \"per-element\"")
    window, kinds = _windows(r, n_layers, 512, ["global"] * n_layers)
    dense = _dense_layers(r, n_layers, ["dense"] + ["sparse"] * (n_layers - 1))
    bias = r.get("attention_bias", False)
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 100352),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 8), head_dim=r.get("head_dim", 128),
                              qkv_bias=bias, out_bias=bias, qk_norm="head", sliding_window=window,
                              layer_pattern=_period(kinds),
                              softplus_gate="head" if gating in (True, "per-head") else "element"),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 8192)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               rotary_fraction=_rotary_of(r, kinds, {"full_attention": 0.5, "sliding_attention": 1.0}),
               tie_embeddings=r.get("tie_word_embeddings", False))
    moe = dict(n_experts=r.get("num_experts", 256), top_k=r.get("num_experts_per_tok", 8),
               d_ff_expert=r.get("moe_intermediate_size", 512), router_bias=True, dense_layers=dense)
    shared = r.get("shared_expert_intermediate_size", 512)
    if shared:  # 0: LagunaMLP of width 0, no weights
        moe["d_ff_shared"] = shared
    if len(dense) < n_layers:
        out["moe"] = moe
    return out


#: LaraMini's layer_types -> lmcost's mixers: its full-attention layers get no rotary embedding (LaraMiniModel
#: passes position_embeddings to the sliding layers only).
_LARA_KINDS = {"linear_attention": "gated_deltanet", "sliding_attention": "local", "full_attention": "global_nope"}


@family("lara_mini")
def lara_mini(r: Reader, mt: str) -> dict:
    """Lara-4-Mini (translated/Lara-4-Mini-Base; transformers LaraMiniConfig/LaraMiniForCausalLM): pre-norm
    layers of a Qwen3.5 gated DeltaNet (linear_attention: separate q/k/v, z, b and a projections, the same
    widths and FLOPs as Qwen3-Next's fused ones), sliding-window attention with RoPE (sliding_attention) or
    global attention without RoPE (full_attention), both Qwen3 attention (per-head q/k RMSNorm, a bias on q, k,
    v and o with attention_bias); layer_types by default the released period [linear, sliding, linear, full,
    sliding]. Every layer a MoE (Flint's block): num_experts of moe_intermediate_size, softmax top
    num_experts_per_tok, plus an ungated shared SwiGLU MLP of shared_expert_intermediate_size.

    Read without a cost: intermediate_size, decoder_sparse_step, mlp_only_layers (LaraMiniConfig removes them
    from Qwen3-Next's config; its model never reads them); the schema's dense FFN is unused (its width is
    moe_intermediate_size). Refused: hidden_act other than SiLU (also the DeltaNet conv's activation).
    """
    n_layers = r.get("num_hidden_layers", 34)
    types = r.get("layer_types", None, kind=list)
    if types is None:
        period = ["linear_attention", "sliding_attention", "linear_attention", "full_attention", "sliding_attention"]
        types = [period[i % 5] for i in range(n_layers)]
    mixers = mapped_layer_types(r, types, n_layers, _LARA_KINDS)
    if r.get("hidden_act", "silu") != "silu":
        raise LmcostError(f"{r.source}: hidden_act", "only SiLU is modelled (the MoE's and the DeltaNet conv's "
                          "activation)", "set hidden_act: silu")
    for key in ("intermediate_size", "decoder_sparse_step", "mlp_only_layers"):
        r.get(key, None)
    h = r.get("num_attention_heads", 16)
    bias = r.get("attention_bias", False)
    window = r.get("sliding_window", 512, kind=int)
    if "local" in mixers and not window:
        raise LmcostError(f"{r.source}: sliding_window", "missing, but layer_types has sliding_attention layers",
                          "set sliding_window (512 for Lara-4-Mini)")
    d_e = r.get("moe_intermediate_size", 512)
    moe = dict(n_experts=r.get("num_experts", 128), top_k=r.get("num_experts_per_tok", 4), d_ff_expert=d_e)
    shared = r.get("shared_expert_intermediate_size", 512)
    if shared:
        moe["d_ff_shared"] = shared
    return dict(d_model=r.get("hidden_size", 1024), n_layers=n_layers, vocab_size=r.get("vocab_size", 151936),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=r.get("head_dim", 128),
                               qkv_bias=bias, out_bias=bias, qk_norm="head",
                               sliding_window=window if "local" in mixers else None),
                ffn=dict(activation="swiglu", d_ff=d_e), moe=moe,
                recurrent=dict(layer_pattern=_period(mixers),
                               gated_deltanet=dict(n_k_heads=r.get("linear_num_key_heads", 8),
                                                   n_v_heads=r.get("linear_num_value_heads", 16),
                                                   d_k=r.get("linear_key_head_dim", 128),
                                                   d_v=r.get("linear_value_head_dim", 128),
                                                   d_conv=r.get("linear_conv_kernel_dim", 4))),
                norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", True))


#: The model types this file maps (tests/test_layouts_b.py walks them).
FAMILIES = mapped_in(__name__)
