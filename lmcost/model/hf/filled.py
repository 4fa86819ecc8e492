"""Families whose transformers config class leaves a width or setting unset that its model needs (so its
defaults build no model), mapped from the configs users have, which set it.

Each mapping refuses, naming the key, a config that leaves the setting unset (transformers cannot build or
run that model either), and otherwise reuses known mechanisms. Checked exactly against transformers on
configs with the missing settings filled in (tests/data/filled-defaults.json, from the published
checkpoints: parameters on the meta device, FlopCounterMode matmul FLOPs in prefill and decode, the cache
object's bytes; tests/test_params.py, tests/test_flop_oracle.py, tests/test_hybrid.py, tests/test_filled.py):

- ``dbrx`` (DbrxConfig, DBRX): GQA with q, k, v clamped to [-clip_qkv, clip_qkv] (required), LayerNorms
  without bias, 16 fine-grained experts in every layer; the widths in nested attn_config and ffn_config.
- ``nemotron`` (NemotronConfig, Nemotron-4, Minitron): Llama with LayerNorm1P (weight and bias), a plain
  squared-ReLU MLP and RoPE on half of each head; num_key_value_heads required.
- ``hunyuan_v1_dense``, ``hunyuan_v1_moe`` (Hunyuan-7B, Hunyuan-A13B): Llama with per-head q/k RMSNorm
  (after RoPE); head_dim required; the MoE's experts and its always-on shared MLP all intermediate_size wide.
- ``lfm2_moe`` (LFM2-8B-A1B): LFM2's short-conv and attention layers with num_dense_layers dense SwiGLU
  FFNs, then a sigmoid-routed MoE; layer_types required.
- ``cohere_compass_text`` (Cohere's North decoders): Cohere2's parallel block, RoPE per layer type as
  rope_parameters gives it (a null entry: NoPE), which is required for every layer type present.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.attention_features import _kv_heads, _period
from lmcost.model.hf.llama_like import FamilySpec
from lmcost.model.hf.reader import Reader, activation, expert_count, mapped_layer_types
from lmcost.model.hf.registry import family, register

#: The model types of this file whose layers carry constant-size state (tests/test_hybrid.py walks them too).
HYBRIDS = ("lfm2_moe",)


def _missing(r: Reader, key: str, why: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", f"missing or null: {why}", fix)


def required(key: str, config_class: str):
    """A table entry's check (:data:`lmcost.model.hf.llama_like.Check`): ``key`` must be set, as ``config_class``
    leaves it null and its model cannot be built without it. Raises: LmcostError naming the key."""

    def check(r: Reader, mt: str, out: dict) -> None:
        r.used.add(key)
        if r.data.get(key) is None:
            _missing(r, key, f"{config_class} leaves it unset and its model cannot be built without it",
                     f"set {key} (see the model card)")

    return check


def _hunyuan_key(r: Reader, canon: str, alias: str) -> str:
    """The key HunYuanMoEV1Config takes a setting from: its attribute_map alias where both are given (the alias
    is set last), else the canonical key."""
    r.used.update((canon, alias))
    return alias if r.data.get(alias) is not None else canon


def _one_top_k(r: Reader, n_layers: int) -> int:
    """moe_topk (alias num_experts_per_tok): a whole number, or one per layer (HunYuanMoEV1Gate indexes it by
    layer); lmcost models one top-k. Raises: LmcostError for a list that differs between layers or is shorter."""
    key = _hunyuan_key(r, "moe_topk", "num_experts_per_tok")
    k = r.data.get(key)
    if isinstance(k, list):
        if len(k) < n_layers or len({repr(v) for v in k}) != 1:
            raise LmcostError(f"{r.source}: {key}", f"{k!r:.40} is not one top-k for all {n_layers} layers",
                              "give one whole number (a top-k per layer is not modelled)")
        r.data = {**r.data, key: k[0]}
    return r.count(key, 1)


def hunyuan_moe_layers(r: Reader, n_layers: int, d_ff: int) -> dict:
    """HunYuanMoEV1Moe in every layer: num_experts (alias num_local_experts) experts of intermediate_size, top
    moe_topk by a softmax gate without bias, plus a shared MLP of intermediate_size on every token (summed)."""
    return dict(n_experts=r.count(_hunyuan_key(r, "num_experts", "num_local_experts"), 1),
                top_k=_one_top_k(r, n_layers), d_ff_expert=d_ff, d_ff_shared=d_ff)


_HUNYUAN = dict(head_dim="required", qk_norm="head", mlp_bias=None)

for _spec in (
    # NemotronConfig derives head_dim = hidden_size // heads (floored) and leaves num_key_value_heads null;
    # NemotronLayerNorm1P has a weight and a bias (it scales by 1 + weight).
    FamilySpec(model_type="nemotron", head_dim="floor", norm="layernorm", norm_bias=True, gated=False,
               activation_default="relu2", rotary=0.5,
               checks=(required("num_key_value_heads", "NemotronConfig"),)),
    FamilySpec(model_type="hunyuan_v1_dense", **_HUNYUAN),
    FamilySpec(model_type="hunyuan_v1_moe", **_HUNYUAN, moe=hunyuan_moe_layers),
):
    register(_spec)


def _sub(r: Reader, key: str) -> Reader:
    """A reader of the nested config ``key`` (DBRX's attn_config, ffn_config); absent: the class's defaults."""
    data = r.get(key, {}, kind=dict)
    return Reader({"model_type": r.data["model_type"], **data}, f"{r.source}: {key}")


@family("dbrx")
def dbrx(r: Reader, mt: str) -> dict:
    """DbrxConfig -> ArchConfig fields (transformers DbrxModel: pre-norm blocks of LayerNorms without bias,
    GQA of kv_n_heads through one fused Wqkv whose output is clamped to [-clip_qkv, clip_qkv], then RoPE; a
    MoE of moe_num_experts gated experts of ffn_hidden_size, top moe_top_k by a softmax router without bias,
    in every block; an untied lm_head). Keys: d_model, n_heads, n_layers, max_seq_len (or their attribute_map
    names hidden_size, num_attention_heads, num_hidden_layers, max_position_embeddings), vocab_size, and
    attn_config and ffn_config.
    Raises: LmcostError for a null clip_qkv (DbrxAttention's clamp cannot run without a bound), an
    attn_config without rope_theta (DbrxAttention reads it; the model cannot be built without it), or
    tie_word_embeddings true (DbrxConfig refuses it)."""
    d = expert_count(r, "d_model", "hidden_size", 2048)  # canonical key, else its attribute_map alias
    h = expert_count(r, "n_heads", "num_attention_heads", 16)
    n_layers = expert_count(r, "n_layers", "num_hidden_layers", 24)
    trained = expert_count(r, "max_seq_len", "max_position_embeddings", 2048)
    r.get("num_key_value_heads", None, kind=int)  # DbrxConfig overwrites it with attn_config.kv_n_heads
    if r.get("tie_word_embeddings", False):
        raise LmcostError(f"{r.source}: tie_word_embeddings", "DbrxConfig refuses tied embeddings",
                          "set tie_word_embeddings to false")
    attn, ffn = _sub(r, "attn_config"), _sub(r, "ffn_config")
    clip = attn.get("clip_qkv", None, kind=float)
    if clip is None:
        _missing(attn, "clip_qkv", "DbrxAttention clamps q, k and v to it and cannot run without it",
                 "set attn_config.clip_qkv (DBRX's is 8)")
    if attn.data.get("rope_theta") is None:
        _missing(attn, "rope_theta", "DbrxAttention reads it and its model cannot be built without it",
                 "set attn_config.rope_theta (DBRX's is 500000)")
    attn.get("rope_theta", kind=float)
    h_kv = attn.get("kv_n_heads", 1)
    act = ffn.get("ffn_act_fn", {"name": "silu"}, kind=dict)  # DbrxExpertGLU reads only its name
    act_name = activation(Reader({"name": act.get("name", "silu")}, f"{ffn.source}.ffn_act_fn"), "name", "silu", True)
    d_e = ffn.get("ffn_hidden_size", 3584)
    moe = dict(n_experts=ffn.get("moe_num_experts", 4), top_k=ffn.get("moe_top_k", 1), d_ff_expert=d_e)
    ffn.get("hidden_size", None, kind=int)  # DbrxConfig overwrites it with d_model
    for key in ("moe_loss_weight", "moe_normalize_expert_weights"):  # the aux loss; a p-norm of the k weights
        ffn.get(key, None, kind=float)
    attn.done("dbrx"), ffn.done("dbrx")
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 32000), max_positions=trained,
                attention=dict(n_heads=h, n_kv_heads=h_kv, clip_qkv=clip),
                ffn=dict(activation=act_name, d_ff=d_e), moe=moe,
                norm="layernorm", norm_bias=False, block="pre_norm", positions="rope", tie_embeddings=False)


@family("lfm2_moe")
def lfm2_moe(r: Reader, mt: str) -> dict:
    """Lfm2MoeConfig -> ArchConfig fields (transformers Lfm2MoeModel: LFM2's pre-norm layers of a gated short
    conv or GQA attention with per-head q/k RMSNorm, each with a SwiGLU FFN of intermediate_size on the first
    num_dense_layers layers, else a MoE of num_experts experts of moe_intermediate_size, top num_experts_per_tok
    by sigmoid scores plus a bias buffer (use_expert_bias: no parameter)).
    Raises: LmcostError without layer_types (Lfm2MoeConfig derives none, and its layers need one each)."""
    n_layers = r.get("num_hidden_layers", 32)
    types = r.get("layer_types", None, kind=list)
    if types is None:
        _missing(r, "layer_types", "Lfm2MoeConfig derives no layer types and its model cannot be built without them",
                 "give layer_types, conv or full_attention for each layer (see the model card)")
    mixers = mapped_layer_types(r, types, n_layers, {"full_attention": "global", "conv": "short_conv"})
    dense = r.get("num_dense_layers", 2)
    if dense < 0:
        raise LmcostError(f"{r.source}: num_dense_layers", f"must be >= 0, got {dense}", "give 0 for none")
    r.get("use_expert_bias", True)  # a buffer added to the routing scores: no parameter
    legacy_tie = r.get("tie_embedding", None, kind=bool)  # Lfm2MoeConfig pops it into tie_word_embeddings
    tie = r.get("tie_word_embeddings", True)
    h = r.get("num_attention_heads", 32)
    out = dict(d_model=r.get("hidden_size", 2048), n_layers=n_layers, vocab_size=r.get("vocab_size", 65536),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8), qk_norm="head"),
               ffn=dict(activation="swiglu", d_ff=r.get("intermediate_size", 7168)),
               recurrent=dict(layer_pattern=mixers,
                              short_conv=dict(d_conv=r.get("conv_L_cache", 3), bias=r.get("conv_bias", False))),
               norm="rmsnorm", block="pre_norm", positions="rope",
               tie_embeddings=legacy_tie if legacy_tie is not None else tie)
    moe = dict(n_experts=r.get("num_experts", 32), top_k=r.get("num_experts_per_tok", 4),
               d_ff_expert=r.get("moe_intermediate_size", 1792), first_dense_layers=dense)
    if dense < n_layers:
        out["moe"] = moe
    return out


@family("cohere_compass_text")
def cohere_compass_text(r: Reader, mt: str) -> dict:
    """CohereCompassTextConfig -> ArchConfig fields (transformers CohereCompassForCausalLM: Cohere's parallel
    block, one LayerNorm without bias feeding attention and a SwiGLU MLP; layers full or sliding by
    layer_types (absent: all full; the class never derives a pattern), each rotated by RoPE iff
    rope_parameters has a non-null entry for its layer type; head_dim is always hidden_size // heads;
    logit_scale multiplies the logits by a scalar and pooling chooses an embedding pooling: neither counted).
    Raises: LmcostError for rope_parameters without an entry per layer type present (the model reads one
    each: transformers cannot build it), or sliding layers without a sliding_window."""
    n_layers = r.get("num_hidden_layers", 40)
    h, d = r.get("num_attention_heads", 64), r.get("hidden_size", 8192)
    r.get("head_dim", None, kind=int)  # overwritten with hidden_size // heads
    r.get("logit_scale", None, kind=float)
    r.get("pooling", None, kind=str)
    r.used.update({"sliding_window_pattern", "_sliding_window_pattern"})  # never read: layer_types is set first
    types = r.get("layer_types", None, kind=list) or ["full_attention"] * n_layers
    masks = mapped_layer_types(r, types, n_layers, {"full_attention": "global", "sliding_attention": "local"})
    rope = r.data.get("rope_parameters") or {}
    for t in dict.fromkeys(types):
        if not isinstance(rope, dict) or t not in rope or not isinstance(rope[t], (dict, type(None))):
            raise LmcostError(f"{r.source}: rope_parameters", f"no entry for layer type {t!r}: the "
                              "cohere_compass_text model reads one per layer type",
                              f'give rope_parameters {{"{t}": {{"rope_type": "default", "rope_theta": ...}}}} '
                              "(null: no RoPE on those layers)")
    window = r.get("sliding_window", 4096, kind=int)
    if "sliding_window" in r.data and r.data["sliding_window"] is None:  # an explicit null: no window
        window = None
    if "local" in masks and window is None:
        _missing(r, "sliding_window", "the sliding layers of layer_types need a window", "set sliding_window")
    kinds = [m if rope[t] is not None else f"{m}_nope" for m, t in zip(masks, types)]
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 256000),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=d // h, qkv_bias=bias,
                               out_bias=bias, sliding_window=window if "local" in masks else None,
                               layer_pattern=_period(kinds)),
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 22528)),
                norm="layernorm", norm_bias=False, block="parallel", parallel_shared_norm=True, positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", True))
