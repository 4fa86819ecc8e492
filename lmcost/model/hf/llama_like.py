"""The Llama-like families as table entries: a :class:`FamilySpec` says how a family differs from Llama (RMSNorm,
pre-norm, a gated SiLU MLP, RoPE, no biases), and :meth:`FamilySpec.__call__` maps a config through it.

Each entry was checked against its transformers model: parameters of the default config on the meta device
and FlopCounterMode matmul FLOPs of a tiny instance, exactly (tests/test_params.py, tests/test_flop_oracle.py),
with the flags it reads flipped (tests/test_hf_types.py). The dense families are here; the mixture-of-experts ones,
with their expert layouts, in :mod:`lmcost.model.hf.moe`; the sliding-window rules in :mod:`lmcost.model.hf.windows`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lmcost.basics.errors import LmcostError
from lmcost.model.hf import windows
from lmcost.model.hf.reader import Reader, activation, rotary_fraction
from lmcost.model.hf.registry import Wrapper, register


@dataclass(frozen=True)
class Flag:
    """A bias flag: its config ``key``, the config class's ``default``, and an attribute_map ``alias`` read when
    the key is absent (transformers reads the canonical key where both are present)."""

    key: str
    default: bool
    alias: str | None = None

    def read(self, r: Reader) -> bool:
        if self.alias and self.key not in r.data:
            return r.get(self.alias, self.default)
        if self.alias:
            r.get(self.alias, None)  # both spellings present: transformers reads the canonical one
        return r.get(self.key, self.default)


@dataclass(frozen=True)
class Switch:
    """A layout a boolean key chooses: ``on`` when ``key`` (absent: ``default``) is true, else ``off``."""

    key: str
    default: bool
    on: str
    off: str

    def read(self, r: Reader) -> str:
        return self.on if r.get(self.key, self.default) else self.off


@dataclass(frozen=True)
class Softcaps:
    """Soft-capping defaults, c * tanh(x / c), of the config class (Gemma 2): on the attention scores
    (``attn_logit_softcapping``) and on the logits (``final_logit_softcapping``); None: no capping."""

    attention: float | None
    final: float | None


#: A mixture-of-experts layout (:mod:`lmcost.model.hf.moe`): (reader, n_layers, d_ff) -> the ArchConfig's moe
#: fields, or None when every layer is dense.
MoeLayout = Callable[[Reader, int, int], "dict | None"]
#: A family's own refusal, run after the table's mapping: (reader, model_type, fields) -> None or LmcostError.
Check = Callable[[Reader, str, dict], None]

LLAMA_QKV_BIAS = Flag("attention_bias", False)
LLAMA_MLP_BIAS = Flag("mlp_bias", False)
#: Granite's multipliers: one scalar multiply of the embeddings, residual branches, attention scores (in place
#: of 1/sqrt(d_h)) or logits; lmcost counts none of them.
GRANITE_SCALARS = ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier")


@dataclass(frozen=True, kw_only=True)
class FamilySpec:
    """How one Llama-like family's ``config.json`` maps; every field left out is as Llama. Register it with
    :func:`lmcost.model.hf.registry.register` and :func:`lmcost.model.hf.families.from_hf_config` maps the type.

    Keys read: num_hidden_layers, num_attention_heads, hidden_size, intermediate_size, vocab_size (required),
    num_key_value_heads (absent: the head count), head_dim, tie_word_embeddings, and those the fields name.
    """

    #: The config's model_type.
    model_type: str
    #: head_dim when the key is absent: a width, None (hidden_size / heads, derived by the schema), "required"
    #: (the config class leaves it unset and its model cannot be built without it) or "floor" (hidden_size //
    #: heads, floored, as GLM-4.5's class derives it).
    head_dim: int | None | Literal["required", "floor"] = None
    #: What an explicit null head_dim means: False, hidden_size / heads (the config classes' derivation);
    #: True, the same as an absent key (the mapping of Gemma and Qwen3 reads it so).
    null_head_dim_is_default: bool = False
    #: The q/k/v bias flag; None: the model has no such bias and the key is not read (so a config with it is refused).
    qkv_bias: Flag | None = LLAMA_QKV_BIAS
    #: The o_proj bias flag: "qkv" (the same flag as q/k/v), a Flag of its own, or None (no bias).
    out_bias: Flag | Literal["qkv"] | None = "qkv"
    #: The MLP bias flag (up, gate and down), or None (no bias).
    mlp_bias: Flag | None = LLAMA_MLP_BIAS
    #: Norm on q and k (the schema's qk_norm: none, head, full), fixed or switched by a key.
    qk_norm: str | Switch = "none"
    #: The block layout (the schema's block: pre_norm, post_norm, sandwich, parallel), fixed or switched by a key.
    block: str | Switch = "pre_norm"
    #: The schema's norm kind (rmsnorm, layernorm), whether it has a bias and whether it has a weight.
    norm: str = "rmsnorm"
    norm_bias: bool = False
    norm_weight: bool = True
    #: A gated MLP (gate, up, down) or a plain one (up, down).
    gated: bool = True
    #: The key naming the activation, and the config class's default.
    activation_key: str = "hidden_act"
    activation_default: str = "silu"
    #: tie_word_embeddings' default in the config class.
    tie: bool = False
    #: partial_rotary_factor's default (None: RoPE on the whole head, the key not read), and where it is read:
    #: "rope_parameters", as transformers 5 resolves it (rope_parameters or rope_scaling, then the top level),
    #: or "top_level" (the key alone, Phi-3's mapping).
    rotary: float | None = None
    rotary_source: Literal["rope_parameters", "top_level"] = "rope_parameters"
    #: Which layers slide, and over how wide a window (:mod:`lmcost.model.hf.windows`).
    window: windows.WindowRule = windows.ignored
    #: Soft-capping of scores and logits (Gemma 2); None: the keys are not read.
    softcaps: Softcaps | None = None
    #: Multi-head latent attention (DeepSeek-V2): widths from q_lora_rank, kv_lora_rank, qk_nope_head_dim,
    #: qk_rope_head_dim, v_head_dim; head_dim is read and not used.
    mla: bool = False
    #: The expert layout (:mod:`lmcost.model.hf.moe`); None: a dense model.
    moe: MoeLayout | None = None
    #: {canonical key: attribute_map alias}: the alias is read where the canonical key is absent or null.
    aliases: Mapping[str, str] = field(default_factory=dict)
    #: Keys the config class has and the model never reads (they change nothing); not type-checked.
    ignores: tuple[str, ...] = ()
    #: Keys that change nothing lmcost counts in this family's model, read and checked as numbers (Granite's
    #: multipliers, Cohere's logit_scale).
    no_cost: tuple[str, ...] = ()
    #: Bias flags lmcost does not model, refused when true (lm_head_bias).
    no_bias_keys: tuple[str, ...] = ()
    #: {key: what}: flags of a feature lmcost does not model, refused when true.
    refuse: Mapping[str, str] = field(default_factory=dict)
    #: Widths the config class gives when its key is absent, for classes whose files often leave them out (a
    #: wrapper's text_config carries only what differs from the class).
    class_defaults: Mapping[str, Any] = field(default_factory=dict)
    #: The family's own refusals, run after the mapping (:data:`Check`).
    checks: tuple[Check, ...] = ()

    def __call__(self, r: Reader, mt: str) -> dict:
        """The ArchConfig fields of the config ``r`` reads. Raises: LmcostError as the reader, the rules and the
        checks do (a missing required key, a value of the wrong type, a refused flag)."""
        return _map(self, r, mt)


def _head_dim(spec: FamilySpec, r: Reader, d: int, h: int):
    if spec.head_dim == "required":
        return r.get("head_dim", kind=int)
    if spec.head_dim == "floor":
        return r.get("head_dim", d // h, kind=int)
    if "head_dim" in r.data and r.data["head_dim"] is None and not spec.null_head_dim_is_default:
        return r.get("head_dim", None)  # an explicit null: the config class derives d / heads
    return r.get("head_dim", spec.head_dim, kind=int)


def _softcaps(r: Reader, attention: dict, out: dict, caps: Softcaps) -> None:
    """Soft-capping on the scores and the logits: elementwise, no parameters; an explicit null is no capping
    (the models test ``is not None``), not the class default."""
    for key, name, into, default in (("attn_logit_softcapping", "logit_softcap", attention, caps.attention),
                                     ("final_logit_softcapping", "final_logit_softcap", out, caps.final)):
        into[name] = None if (key in r.data and r.data[key] is None) else r.get(key, default, kind=float)


def _mla(r: Reader, attention: dict) -> None:
    """Multi-head latent attention's widths (DeepseekV2Config/DeepseekV3Config) in place of head_dim.
    Raises: LmcostError for a qk_head_dim other than qk_nope_head_dim + qk_rope_head_dim (transformers derives it)."""
    attention.pop("head_dim")
    qk = r.get("qk_head_dim", None)
    if qk is not None and qk != r.get("qk_nope_head_dim") + r.get("qk_rope_head_dim"):
        raise LmcostError(f"{r.source}: qk_head_dim", f"{qk} is not qk_nope_head_dim + qk_rope_head_dim",
                          "remove qk_head_dim or make it the sum")
    attention["mla"] = dict(q_lora_rank=r.get("q_lora_rank", None), kv_lora_rank=r.get("kv_lora_rank"),
                            qk_nope_head_dim=r.get("qk_nope_head_dim"), qk_rope_head_dim=r.get("qk_rope_head_dim"),
                            v_head_dim=r.get("v_head_dim"))


def _map(spec: FamilySpec, r: Reader, mt: str) -> dict:
    if spec.class_defaults:
        r.data = {**spec.class_defaults, **r.data}
    for canon, alias in spec.aliases.items():
        if alias in r.data:
            r.used.add(alias)
            if r.data.get(canon) is None:
                r.data = {**r.data, canon: r.data[alias]}
    r.used.update(spec.ignores)
    for key in spec.no_cost:
        r.get(key, None, kind=float)
    n_layers = r.get("num_hidden_layers")
    h = r.get("num_attention_heads")
    d = r.get("hidden_size")
    window, pattern = spec.window(r, n_layers)
    for key in spec.no_bias_keys:
        r.must_not(key, "a bias on this projection")
    for key, what in spec.refuse.items():
        r.must_not(key, what)
    head_dim = _head_dim(spec, r, d, h)
    qkv_bias = spec.qkv_bias.read(r) if spec.qkv_bias else False
    out_bias = qkv_bias if spec.out_bias == "qkv" else (spec.out_bias.read(r) if spec.out_bias else False)
    attention = dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h), head_dim=head_dim,
                     qkv_bias=qkv_bias, out_bias=out_bias,
                     qk_norm=spec.qk_norm.read(r) if isinstance(spec.qk_norm, Switch) else spec.qk_norm,
                     sliding_window=window, layer_pattern=pattern)
    d_ff = r.get("intermediate_size")
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size"), attention=attention,
               ffn=dict(activation=activation(r, spec.activation_key, spec.activation_default, spec.gated),
                        d_ff=d_ff, bias=spec.mlp_bias.read(r) if spec.mlp_bias else False),
               norm=spec.norm, norm_bias=spec.norm_bias, norm_weight=spec.norm_weight,
               block=spec.block.read(r) if isinstance(spec.block, Switch) else spec.block, positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", spec.tie))
    if spec.rotary is not None:
        out["rotary_fraction"] = (rotary_fraction(r, spec.rotary) if spec.rotary_source == "rope_parameters"
                                  else r.get("partial_rotary_factor", spec.rotary))
    if spec.softcaps is not None:
        _softcaps(r, attention, out, spec.softcaps)
    if spec.mla:
        _mla(r, attention)
    if spec.moe is not None:
        moe = spec.moe(r, n_layers, d_ff)
        if moe is not None:
            out["moe"] = moe
    for check in spec.checks:
        check(r, mt, out)
    return out


def width_is_heads_times_head_dim(r: Reader, mt: str, out: dict) -> None:
    """Helium's o_proj and OLMoE's q_norm are sized by hidden_size, not heads x head_dim: the two must agree."""
    att, d = out["attention"], out["d_model"]
    if att["head_dim"] is not None and att["head_dim"] * att["n_heads"] != d:
        raise LmcostError(f"{r.source}: head_dim", f"{att['head_dim']} x {att['n_heads']} heads is not "
                          f"hidden_size={d}, which the {mt} model assumes",
                          "remove head_dim or make it hidden_size / heads")


def _one_internlm3_bias(r: Reader, mt: str, out: dict) -> None:
    if out["attention"]["qkv_bias"] != out["ffn"]["bias"]:
        raise LmcostError(f"{r.source}: qkv_bias", "differs from bias, which InternLM3Config refuses",
                          "give qkv_bias and bias the same value")


#: Widths of MistralConfig when its key is absent (transformers 5.24): mistral3's text_config often gives few keys.
MISTRAL_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                        num_attention_heads=32, num_key_value_heads=8, sliding_window=4096)
#: Widths of Gemma3TextConfig (transformers 5.24): google/gemma-3-4b-it's text_config gives 5 keys.
GEMMA3_DEFAULTS = dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                       num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096)
#: Gemma's MLP: GELU (tanh), tied embeddings, 256-wide heads; Gemma-2/3 models apply hidden_activation,
#: Gemma-1 hidden_act, and their configs may carry both.
_GEMMA = dict(head_dim=256, null_head_dim_is_default=True, activation_default="gelu_pytorch_tanh", tie=True)
_GEMMA2 = dict(_GEMMA, activation_key="hidden_activation", ignores=("hidden_act",), block="sandwich")
_NO_BIAS = dict(qkv_bias=None, out_bias=None, mlp_bias=None)

for _spec in (
    FamilySpec(model_type="llama"),
    FamilySpec(model_type="mistral", window=windows.all_slide, class_defaults=MISTRAL_DEFAULTS),
    # Qwen2: a bias on q, k and v only.
    FamilySpec(model_type="qwen2", qkv_bias=Flag("attention_bias", True), out_bias=None,
               window=windows.qwen2_upper_layers),
    FamilySpec(model_type="qwen3", head_dim=128, null_head_dim_is_default=True, qk_norm="head",
               window=windows.qwen2_upper_layers),
    FamilySpec(model_type="gemma", **_GEMMA, ignores=("hidden_activation",)),
    FamilySpec(model_type="gemma2", **_GEMMA2, window=windows.alternating, softcaps=Softcaps(50.0, 30.0)),
    FamilySpec(model_type="gemma3_text", **_GEMMA2, qk_norm="head", window=windows.every_nth_global,
               softcaps=Softcaps(None, None), class_defaults=GEMMA3_DEFAULTS),
    FamilySpec(model_type="phi3", window=windows.all_slide, rotary=1.0, rotary_source="top_level"),
    FamilySpec(model_type="olmo2", qk_norm="full", block="post_norm"),
    # LlamaModel with one bias flag for q, k, v and o.
    FamilySpec(model_type="internlm3", head_dim=128, qkv_bias=Flag("attention_bias", False, "qkv_bias"),
               mlp_bias=Flag("mlp_bias", False, "bias"), checks=(_one_internlm3_bias,)),
    # Qwen2 attention with q/k/v bias forced off; MinistralConfig skips Mistral's derivation of head_dim, so its
    # model cannot be built without one (Ministral-8B's config.json gives 128).
    FamilySpec(model_type="ministral", head_dim="required", **_NO_BIAS, window=windows.all_slide_if_windowed),
    FamilySpec(model_type="helium", head_dim=128, out_bias=None, checks=(width_is_heads_times_head_dim,)),
    FamilySpec(model_type="granite", no_cost=GRANITE_SCALARS),
    FamilySpec(model_type="seed_oss", head_dim=128, qkv_bias=Flag("attention_bias", True),
               out_bias=Flag("attention_out_bias", False)),
    FamilySpec(model_type="glm", head_dim=128, qkv_bias=Flag("attention_bias", True), out_bias=None, mlp_bias=None,
               rotary=0.5),
    FamilySpec(model_type="glm4", head_dim=128, qkv_bias=Flag("attention_bias", True), out_bias=None,
               mlp_bias=None, rotary=0.5, block="sandwich"),
    FamilySpec(model_type="ernie4_5", head_dim=128, qkv_bias=Flag("use_bias", False), mlp_bias=Flag("use_bias", False),
               tie=True),
    FamilySpec(model_type="olmo3", mlp_bias=None, qk_norm="full", block="post_norm",
               window=windows.olmo3_fourth_global),
    FamilySpec(model_type="cohere", mlp_bias=None, norm="layernorm", block="parallel", tie=True,
               no_cost=("logit_scale",), refuse={"use_qk_norm": "Cohere's per-head LayerNorm on q and k"}),
    FamilySpec(model_type="starcoder2", qkv_bias=Flag("use_bias", True), mlp_bias=Flag("use_bias", True),
               norm="layernorm", norm_bias=True, gated=False, activation_default="gelu_pytorch_tanh", tie=True,
               window=windows.every_layer),
    # Llama itself under other names (LlamaModel for exaone; IQuestCoder's and CWM's copies of it).
    FamilySpec(model_type="exaone", aliases={"num_hidden_layers": "num_layers", "hidden_act": "activation_function"}),
    FamilySpec(model_type="iquestcoder", head_dim=128),
    # CwmConfig: layer_types, else every 4th layer (from layer 0) global, the others slide.
    FamilySpec(model_type="cwm", head_dim=128, qkv_bias=None, out_bias=None,
               window=windows.layer_types_or(["global", "local", "local", "local"])),
    # Mistral attention without biases; sliding_window (null by default) on every layer.
    FamilySpec(model_type="ministral3", head_dim=128, **_NO_BIAS, window=windows.every_layer),
    # Gemma-2 attention with pre-norms only (no post-norms); layer_types, else even layers slide.
    FamilySpec(model_type="vaultgemma", head_dim=256, mlp_bias=None, activation_key="hidden_activation",
               activation_default="gelu_pytorch_tanh", tie=True, window=windows.layer_types_or(["local", "global"]),
               softcaps=Softcaps(50.0, 30.0)),
    # Llama with a plain (ungated) squared-ReLU MLP: up, relu2, down.
    FamilySpec(model_type="arcee", gated=False, activation_default="relu2"),
    # Llama with RMSNorms after attention and MLP too (sandwich) when use_post_norm, Granite's multipliers.
    FamilySpec(model_type="hyperclovax", block=Switch("use_post_norm", True, "sandwich", "pre_norm"),
               no_cost=GRANITE_SCALARS),
    # StableLM-2: LayerNorms with bias, RoPE on a quarter of each head, q/k/v bias by a flag, no o or MLP bias;
    # one shared norm feeding attention and MLP in parallel with use_parallel_residual.
    FamilySpec(model_type="stablelm", qkv_bias=Flag("use_qkv_bias", False), out_bias=None, mlp_bias=None,
               norm="layernorm", norm_bias=True, rotary=0.25,
               block=Switch("use_parallel_residual", False, "parallel", "pre_norm"),
               refuse={"qk_layernorm": "per-head LayerNorms with weights of their own on q and k"}),
    # OLMo-1: Llama with LayerNorms that have no weight or bias; clip_qkv (a clamp) is not modelled.
    FamilySpec(model_type="olmo", mlp_bias=None, norm="layernorm", norm_weight=False,
               refuse={"clip_qkv": "clamping q, k and v"}),
    # Arcee's MLP with LayerNorms (with bias) and biases by default.
    FamilySpec(model_type="jais2", qkv_bias=Flag("attention_bias", True), mlp_bias=Flag("mlp_bias", True),
               gated=False, activation_default="relu2", norm="layernorm", norm_bias=True),
):
    register(_spec)

#: Multimodal wrappers of these decoders: Gemma3ForConditionalGeneration and Mistral3 tie lm_head by the wrapper's
#: own tie_word_embeddings (checked against transformers in tests/test_hf_types.py).
register(Wrapper(model_type="gemma3", text_type="gemma3_text", ties=True, own=("mm_tokens_per_image",)))
register(Wrapper(model_type="mistral3", text_type="mistral", ties=True, aliases=("ministral", "ministral3"),
                 own=("projector_hidden_act", "vision_feature_layer", "multimodal_projector_bias",
                      "spatial_merge_size", "vision_feature_select_strategy")))
