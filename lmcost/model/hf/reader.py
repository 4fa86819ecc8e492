"""Reading a Hugging Face ``config.json``: the keys that cost nothing, a reader that records the keys it
used (so a mapping refuses what it did not read) with transformers' defaults and JSON type checks, and
the helpers every family's mapping shares (activations, biases, rotary fraction, expert counts).

Every family's mapping (:mod:`lmcost.model.hf.registry`) reads through this module; :mod:`lmcost.model.hf.families`
dispatches to them.
"""

from __future__ import annotations

import math
import re

from lmcost.basics.errors import LmcostError
from lmcost.model.config import MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, MAX_WIDTH

#: Keys that change nothing lmcost counts.
NO_COST = {
    "architectures", "model_type", "_name_or_path", "torch_dtype", "dtype", "transformers_version",
    "initializer_range", "use_cache", "pretraining_tp", "rope_theta", "rope_scaling", "rope_parameters",
    "max_position_embeddings", "original_max_position_embeddings", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "scoring_func", "topk_method", "n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob",
    "ep_size", "aux_loss_alpha", "seq_aux", "input_jitter_noise", "layerdrop", "init_std", "n_ctx", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
    "use_mrope", "rope_local_base_freq", "cache_implementation", "rotary_emb_base", "use_qk_norm_scale",
    "num_nextn_predict_layers", "is_decoder", "tokenizer_class", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "classifier_dropout", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout", "embd_pdrop", "resid_pdrop",
    "attn_pdrop", "hidden_dropout", "attention_dropout", "embedding_dropout", "hidden_dropout_prob",
    "auto_map", "use_bfloat16",
    # training and tooling flags published files carry, which transformers' models never read
    "gradient_checkpointing", "for_llm_compressor", "init_method", "normalization_function",
    "return_dict", "tie_encoder_decoder",
    "max_window_layers", "use_sliding_window", "mscale", "mscale_all_dim",
    "task_specific_params", "id2label", "label2id", "problem_type", "finetuning_task", "prefix",
    "output_attentions", "output_hidden_states", "chunk_size_feed_forward", "is_encoder_decoder",
    "tie_word_embeddings_comment", "attn_implementation", "use_return_dict",
    "rope_interleave", "layer_types_comment",
    "apply_residual_connection_post_layernorm",  # Falcon: which tensor feeds the residual, same cost
}
_NO_COST_PATTERN = re.compile(r".*(_token_id|dropout|dropout_prob|_pdrop|_eps|epsilon)$")

#: HF activation names -> (plain kind, gated kind).
_ACT = {"silu": ("silu", "swiglu"), "swish": ("silu", "swiglu"), "relu": ("relu", "reglu"), "relu2": ("relu2", None),
        "gelu": ("gelu", "geglu"), "gelu_new": ("gelu", "geglu"), "gelu_pytorch_tanh": ("gelu", "geglu"),
        "gelu_fast": ("gelu", "geglu"), "gelu_python": ("gelu", "geglu"), "sigmoid": (None, "glu")}


def _is(value, kind: type) -> bool:
    """isinstance, with JSON's distinctions: a bool is not a number, an int is a float."""
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


#: Widths and counts that are whole numbers >= 1 in every family: checked where they are read, so the
#: error names the config's key (not lmcost's field it becomes, d_model or n_layers).
WIDTH_KEYS = {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
              "vocab_size", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions",
              "n_inner", "num_layers", "num_heads", "ffn_dim", "moe_intermediate_size", "num_experts_per_tok",
              "num_local_experts", "n_routed_experts", "window_size"}
#: Widths and counts no transformers config class takes as null (its strict dataclass annotates them ``int``, not
#: ``int | None``): a null is refused where it is read, not taken for absent and defaulted. Left out, as some classes
#: derive them from a null: head_dim, intermediate_size, n_inner, num_key_value_heads, moe_intermediate_size, the
#: expert counts and max_position_embeddings (no cost).
NOT_NULL_KEYS = {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "n_embd", "n_layer", "n_head",
                 "n_positions", "num_layers", "num_heads", "d_model", "n_layers", "n_heads", "ffn_dim", "window_size",
                 "state_size", "d_state", "expand"}
#: The optional widths above that a family's transformers config class still annotates ``int`` (5.24): a null there
#: is refused too (elsewhere it is the class's "derive it" default). key -> those model types.
NOT_NULL_IN = {
    "head_dim": frozenset({
        "beam", "cohere2_moe", "cwm", "deepseek_v32", "flint", "gemma", "gemma2", "gemma3_text", "gemma3n_text",
        "gemma4_text", "gemma4_unified_text", "glm4", "glm_moe_dsa", "gpt_oss", "helium", "hy_v3", "kolibri1",
        "laguna", "lara_mini", "llama4_text", "longcat_flash", "mamba2", "mellum", "mimo_v2_flash",
        "minimax_m2", "ministral3", "nemotron_h", "qwen3", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next",
        "sarvam_moe", "solar_open", "vaultgemma"}),
    "intermediate_size": frozenset({
        "afmoe", "apertus", "apertus1p5_text", "arcee", "aria_text", "axk1", "bamba", "beam", "biogpt",
        "bitnet", "cohere", "cohere2", "cohere2_moe", "cohere_compass_text", "cwm", "deepseek_v2",
        "deepseek_v3", "deepseek_v32", "diffllama", "doge", "dots1", "ernie4_5", "ernie4_5_moe", "exaone",
        "exaone4", "exaone_moe", "flex_olmo", "flint", "gemma", "gemma2", "gemma3_text", "gemma3n_text",
        "gemma4_text", "gemma4_unified_text", "glm", "glm4", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa",
        "gpt_neox", "gpt_oss", "granite", "granite_swa", "granitemoe", "granitemoe_swa", "granitemoehybrid",
        "granitemoeshared", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "hy_v3", "hyperclovax", "internlm3",
        "iquestcoder", "jais2", "jamba", "jetmoe", "laguna", "lfm2", "lfm2_moe", "llama", "llama4_text",
        "mellum", "mimo_v2_flash", "minicpm3", "minimax", "minimax_m2", "ministral", "ministral3", "mistral",
        "mixtral", "nanochat", "nemotron", "nemotron_h", "olmo", "olmo2", "olmo3", "olmo_hybrid", "olmoe",
        "persimmon", "phi", "phi3", "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_5_text", "qwen3_moe",
        "qwen3_next", "recurrent_gemma", "sarvam_mla", "sarvam_moe", "seed_oss", "smollm3", "stablelm",
        "starcoder2", "vaultgemma", "youtu"}),
    "moe_intermediate_size": frozenset({
        "afmoe", "axk1", "beam", "deepseek_v2", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe",
        "exaone_moe", "flint", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "hy_v3", "kolibri1", "laguna",
        "lara_mini", "lfm2_moe", "mellum", "mimo_v2_flash", "nemotron_h", "qwen2_moe", "qwen3_5_moe_text",
        "qwen3_moe", "qwen3_next", "sarvam_mla", "sarvam_moe", "solar_open"}),
    "num_key_value_heads": frozenset({
        "axk1", "beam", "cwm", "deepseek_v32", "exaone4", "exaone_moe", "flint", "gemma", "gemma2",
        "gemma3_text", "gemma3n_text", "gemma4_text", "gemma4_unified_text", "glm4", "glm4_moe",
        "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "helium", "hy_v3", "jamba", "jetmoe", "kolibri1", "laguna",
        "lara_mini", "lfm2", "lfm2_moe", "llama4_text", "mellum", "mimo_v2_flash", "minimax", "minimax_m2",
        "ministral", "ministral3", "mistral", "mixtral", "nemotron_h", "phimoe", "qwen3_5_moe_text",
        "qwen3_5_text", "qwen3_moe", "qwen3_next", "sarvam_moe", "solar_open", "stablelm", "starcoder2",
        "vaultgemma", "youtu"}),
    "num_experts_per_tok": frozenset({
        "axk1", "beam", "cohere2_moe", "deepseek_v32", "doge", "exaone_moe", "flex_olmo", "flint", "glm4_moe",
        "glm4_moe_lite", "glm_moe_dsa", "gpt_oss", "jamba", "jetmoe", "kolibri1", "laguna", "lara_mini",
        "lfm2_moe", "llama4_text", "mellum", "mimo_v2_flash", "minimax", "minimax_m2", "mixtral", "nemotron_h",
        "olmoe", "phimoe", "qwen2_moe", "qwen3_5_moe_text", "qwen3_moe", "qwen3_next", "sarvam_moe",
        "solar_open"}),
    "n_routed_experts": frozenset({
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa",
        "longcat_flash", "mimo_v2_flash", "nemotron_h", "sarvam_mla", "sarvam_moe", "solar_open"}),
    "num_local_experts": frozenset(['gpt_oss', 'jetmoe', 'llama4_text', 'minimax', 'minimax_m2', 'mixtral', 'phimoe']),
}
#: Keys where 0 means "none" (transformers' Qwen2MoeConfig writes sliding_window 0 when use_sliding_window is
#: false, as others write null) and a negative value means nothing: a whole number >= 0, at most its _TOP.
OFF_AT_ZERO_KEYS = {"sliding_window"}

#: The upper bound of each width key that is not a width (lmcost.model.config's physical bounds).
_TOP = {"vocab_size": MAX_VOCAB, "num_hidden_layers": MAX_LAYERS, "n_layer": MAX_LAYERS, "num_layers": MAX_LAYERS,
        "max_position_embeddings": MAX_POSITIONS, "n_positions": MAX_POSITIONS,
        # a window past the positions is the configs' way of saying "unused" (Qwen2.5: 131072 over 32768)
        "sliding_window": MAX_POSITIONS, "window_size": MAX_POSITIONS}

#: RoPE types transformers knows (modeling_rope_utils.ROPE_INIT_FUNCTIONS of 5.24, ``default``, and the legacy
#: names its standardisation maps: ``su`` -> longrope, ``mrope`` -> default).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "su", "mrope")
#: torch dtypes a checkpoint is stored in (``torch_dtype``/``dtype``; ``auto``: transformers picks), with or
#: without the ``torch.`` prefix.
TORCH_DTYPES = ("auto", "float32", "float", "float16", "half", "bfloat16", "float64", "double", "float8_e4m3fn",
                "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "int8",
                "uint8", "int16", "int32", "int64", "bool")
#: Keys that cost nothing but must still be a meaningful number: a frequency base > 0.
_POSITIVE = ("rope_theta", "rope_local_base_freq", "rotary_emb_base")


def check_values(data: dict, source: str) -> None:
    """Refuse values of a config.json that mean nothing, even in keys that cost nothing (NO_COST): a nan
    anywhere, an inf (JSON's NaN/Infinity) anywhere but in a limit, a RoPE base that is not > 0, a rope_scaling/rope_parameters of an
    unknown type or with a factor that is not > 0, an unknown torch_dtype, a negative epsilon, a dropout
    outside [0, 1]. transformers itself loads such a file and fails (or computes nan) only when run.
    Raises: LmcostError naming the key.
    """
    def walk(v, path):
        # inf is a bound's "none" (Mamba-2's time_step_limit defaults to [0.0, inf]); nan is never a number
        if isinstance(v, float) and (math.isnan(v) or (math.isinf(v) and "limit" not in path)):
            raise LmcostError(f"{source}: {path}", f"must be a finite number, got {v}", "give a number (not NaN or Infinity)")
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else str(k))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    walk(data, "")
    for key in _POSITIVE:
        _positive(data.get(key), key, source)
    for key in ("rope_scaling", "rope_parameters"):
        rope = data.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise LmcostError(f"{source}: {key}", f"must be a mapping, got {rope!r:.40}", f"write {key} as a JSON object")
        # transformers 5: one set per layer type ({"full_attention": {...}, "sliding_attention": {...}})
        sets = rope.items() if rope and all(isinstance(x, dict) for x in rope.values()) else [("", rope)]
        for name, params in sets:
            where = f"{key}.{name}" if name else key
            kind = params.get("rope_type", params.get("type"))
            if kind is not None and kind not in ROPE_TYPES:
                raise LmcostError(f"{source}: {where}.rope_type", f"unknown RoPE type {kind!r:.40}",
                                  f"use one of {', '.join(ROPE_TYPES)}")
            for k in ("factor", "rope_theta"):
                _positive(params.get(k), f"{where}.{k}", source)
    for key in ("torch_dtype", "dtype"):
        v = data.get(key)
        if v is not None and (not isinstance(v, str) or v.removeprefix("torch.") not in TORCH_DTYPES):
            raise LmcostError(f"{source}: {key}", f"unknown torch dtype {v!r:.40}",
                              f"use one of {', '.join(TORCH_DTYPES)}")
    for key, v in data.items():
        if not _is(v, float):
            continue
        if re.search(r"(_eps|epsilon)$", key) and v < 0:
            raise LmcostError(f"{source}: {key}", f"a norm's epsilon must be >= 0, got {v}", "give the model card's value, e.g. 1e-5")
        if re.search(r"(dropout|dropout_prob|_pdrop)$", key) and not 0 <= v <= 1:
            raise LmcostError(f"{source}: {key}", f"a dropout probability must be in [0, 1], got {v}", "give 0 for none")


def _positive(v, key: str, source: str) -> None:
    if v is not None and (not _is(v, float) or not v > 0):
        raise LmcostError(f"{source}: {key}", f"must be a number > 0, got {v!r:.40}",
                          "give the model card's value, or remove it")


class Reader:
    """Reads keys of one config, remembering which it used, with transformers' defaults."""

    def __init__(self, data: dict, source: str):
        self.data, self.source, self.used = data, source, {"model_type"}

    def get(self, key: str, default=..., kind: type | None = None):
        """The value of ``key`` (a null means absent, but for NOT_NULL_KEYS), else ``default`` (``...``: required).

        Its type is checked against ``kind``, or else against the default's type (an int default takes
        ints, never a bool; a float default takes ints too), so a string or a list where the mapping
        expects a number is one line here, not an error deep in the arithmetic.
        Raises: LmcostError for a missing required key, a null in NOT_NULL_KEYS or a value of the wrong type.
        """
        self.used.add(key)
        if key in self.data and self.data[key] is None and (
                key in NOT_NULL_KEYS or self.data.get("model_type") in NOT_NULL_IN.get(key, ())):
            raise LmcostError(f"{self.source}: {key}", "must be a whole number >= 1, got null",
                              f"write {key} as a positive whole number (see the model card), or remove it")
        if key in self.data and self.data[key] is not None:
            value = self.data[key]
            want = kind or (type(default) if default is not ... and default is not None else None)
            if key in OFF_AT_ZERO_KEYS and _is(value, int) and value < 0:
                raise LmcostError(f"{self.source}: {key}", f"must be a whole number of tokens >= 1, got {value}",
                                  "write the window, or null (or 0) for none")
            if key in WIDTH_KEYS or (key in OFF_AT_ZERO_KEYS and value != 0):
                self._width(key, value)
            if want is not None and not _is(value, want):
                names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
                         list: "a list"}
                raise LmcostError(f"{self.source}: {key}", f"must be {names.get(want, want.__name__)}, "
                                  f"got {value!r:.40}", f"write {key} as {names.get(want, want.__name__)}")
            return value
        if default is ...:
            raise LmcostError(f"{self.source}: {key}", "missing", f"add {key} to the config (see the model card)")
        return default

    def count(self, key: str, default: int) -> int:
        """A period, head count or factor (``get`` with an int ``default``) that must be at least 1.
        Raises: LmcostError for 0 or a negative value (a period of 0 would divide by zero)."""
        return self._at_least_one(key, self.get(key, default, kind=int))

    def _at_least_one(self, key: str, value):
        if not _is(value, int) or value < 1:
            raise LmcostError(f"{self.source}: {key}", f"must be a whole number >= 1, got {value!r:.40}",
                              f"write {key} as a positive whole number (see the model card)")
        return value

    def _width(self, key: str, value):
        """A width, count or length (WIDTH_KEYS): at least 1, at most its physical bound (:data:`_TOP`, else
        MAX_WIDTH). Raises: LmcostError naming the key."""
        self._at_least_one(key, value)
        top = _TOP.get(key, MAX_WIDTH)
        if value > top:
            raise LmcostError(f"{self.source}: {key}", f"{value:,} is past any model (at most {top:,})",
                              f"write {key} as in the model card")
        return value

    def layers(self, key: str, n_layers: int) -> list[int]:
        """A list of layer indices (``mlp_only_layers``, ``attn_layer_indices``): whole numbers in
        0..n_layers - 1 (absent or null: none). Raises: LmcostError for any other entry."""
        value = self.get(key, [], kind=list)
        for i in value:
            if not _is(i, int) or not 0 <= i < n_layers:
                raise LmcostError(f"{self.source}: {key}", f"entry {i!r:.20} is not a layer index in 0..{n_layers - 1}",
                                  f"list layer indices of this {n_layers}-layer model")
        return value

    def must_not(self, key: str, what: str):
        """A flag lmcost does not model: absent or false is fine, true is an error."""
        if self.get(key, False):
            raise LmcostError(f"{self.source}: {key}", f"{what} is not modelled", f"set {key} to false or write an lmcost YAML")

    def leftover(self) -> list[str]:
        return [k for k in self.data if k not in self.used and k not in NO_COST and not _NO_COST_PATTERN.match(k)]

    def done(self, mt: str) -> None:
        """Refuse the first key no mapping read (:meth:`leftover`): a key that may change the model is never
        ignored. ``mt``: the model_type whose mapping read this config (or this nested section of it).
        Raises: LmcostError naming ``<source>: <key>``."""
        left = self.leftover()
        if left:
            raise LmcostError(f"{self.source}: {left[0]}", f"field not understood by the {mt} mapping",
                              "remove it if it does not change the architecture, or write an lmcost YAML")


def activation(r: Reader, key: str, default: str, gated: bool) -> str:
    """The config's activation under ``key`` (absent: ``default``) as lmcost's kind, gated (swiglu, geglu, ...) or
    plain (silu, gelu, ...). Raises: LmcostError naming ``key`` for an activation lmcost does not model."""
    name = r.get(key, default)
    if name not in _ACT or _ACT[name][1 if gated else 0] is None:
        raise LmcostError(f"{r.source}: {key}", f"activation {name!r} is not modelled",
                          f"use one of {', '.join(k for k, v in _ACT.items() if v[1 if gated else 0])}")
    return _ACT[name][1 if gated else 0]


def rotary_fraction(r: Reader, default: float) -> float:
    """partial_rotary_factor as transformers resolves it: rope_parameters (or rope_scaling), then the
    top-level key, then the config class's default."""
    top = r.get("partial_rotary_factor", None, kind=float)
    rope = r.data.get("rope_scaling") or r.data.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise LmcostError(f"{r.source}: rope_parameters", f"must be a mapping, got {rope!r:.40}",
                          "write rope_parameters as a JSON object")
    value = rope.get("partial_rotary_factor")
    if value is None:
        value = top if top is not None else default
    if not _is(value, float):
        raise LmcostError(f"{r.source}: partial_rotary_factor", f"must be a number, got {value!r:.40}",
                          "write partial_rotary_factor as a number in (0, 1]")
    return value


def required_top_k(r: Reader, config_class: str) -> int:
    """num_experts_per_tok where the config class has no default (None): its router's topk cannot run."""
    if r.data.get("num_experts_per_tok") is None:
        r.used.add("num_experts_per_tok")
        raise LmcostError(f"{r.source}: num_experts_per_tok",
                          f"missing or null: {config_class} has no default, and its router cannot choose "
                          "experts without it",
                          "set num_experts_per_tok to the experts each token uses (see the model card)")
    return r.get("num_experts_per_tok", kind=int)


def expert_count(r: Reader, canon: str, alias: str, default: int) -> int:
    """The expert count under its canonical key or its attribute_map alias (the canonical one wins); ``default``
    ``...``: required."""
    n, a = r.get(canon, None, kind=int), r.get(alias, None, kind=int)
    if n is None and a is None and default is ...:
        return r.get(canon, kind=int)  # required: says it is missing
    return n if n is not None else (a if a is not None else default)


#: transformers' remap_legacy_layer_types: names published files still use (Granite-4.0-H: mamba, attention).
LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}


def mapped_layer_types(r: Reader, types: list, n_layers: int, kinds: dict) -> list:
    """A config's ``layer_types`` (read by the caller) mapped through ``kinds`` (HF type -> lmcost kind),
    after transformers' legacy renames, one entry per layer.
    Raises: LmcostError naming layer_types for a type not in ``kinds`` or a count other than n_layers."""
    types = [LEGACY_LAYER_TYPES.get(t, t) if isinstance(t, str) else t for t in types]
    for t in types:
        if t not in kinds:
            raise LmcostError(f"{r.source}: layer_types", f"layer type {t!r:.40} is not modelled for {r.data['model_type']}",
                              f"use {' and '.join(kinds)}, or write an lmcost YAML")
    if len(types) != n_layers:  # as the config classes' validate_layer_type refuses
        raise LmcostError(f"{r.source}: layer_types", f"{len(types)} entries for {n_layers} layers",
                          "give one entry per layer (num_hidden_layers), or remove layer_types")
    return [kinds[t] for t in types]
