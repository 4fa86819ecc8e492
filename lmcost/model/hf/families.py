"""Map a Hugging Face ``config.json`` onto :class:`lmcost.model.config.ArchConfig`.

Only field mapping lives here: each supported ``model_type`` names the keys it reads and the
defaults its ``transformers`` config class uses when a key is absent (the reference for what a field
means). A key that changes the cost and that the mapping does not read is an error, not a silent
default; keys that do not change FLOPs, bytes or parameters (token ids, dropout, epsilons, RoPE
frequencies and scaling, soft-capping where the model is not mapped with it, initialisation) are listed in ``NO_COST`` and skipped, and those
that change nothing counted in one family's model only (Granite's multipliers) in ``FAMILY_NO_COST``.
A ``quantization_config`` selects the checkpoint's recipe (:func:`lmcost.graph.quant.from_hf`) or is refused.
"""

from __future__ import annotations

from pydantic import ValidationError

from lmcost.model.config import ArchConfig
from lmcost.basics.errors import LmcostError, from_validation_error
from lmcost.model.hf.reader import (NO_COST, _activation, _bias, _experts, _is, _NO_COST_PATTERN, _Reader,  # noqa: F401
                        _rotary_fraction, _top_k, mapped_layer_types)

#: layer_types of the sliding-window families -> lmcost's attention kinds.
WINDOW_TYPES = {"sliding_attention": "local", "full_attention": "global"}

GATED_FAMILIES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma", "gemma2",
                  "gemma3_text", "phi3", "olmo2", "deepseek_v2", "deepseek_v3"}
#: Llama-like families whose transformers model differs from Llama only in what the table below says
#: (issue 14). Each was checked against transformers: parameters of the default config on the meta
#: device and FlopCounterMode matmul FLOPs of a tiny instance, exactly (tests/test_params.py,
#: tests/test_flop_oracle.py). Keys, for each family (absent: as Llama):
#:   head_dim: the config class's head_dim when the key is absent (a null still derives d / heads;
#:     ...: required);
#:   qkv/out/mlp: the key giving the q/k/v, o_proj and MLP bias, with its default (None: no bias, and
#:     the key is not read, so a config that carries it is refused); an alias key per attribute_map;
#:   qk_norm, block, norm, norm_bias, gated, act_default, tie: as the schema's fields;
#:   rotary: partial_rotary_factor's default (read from rope_parameters, then the top level);
#:   moe: how its experts are named and laid out (see _map_new, which also holds the per-family checks);
#:   act_key: the key naming the activation (default hidden_act);
#:   window: "all" (sliding_window, if set, on every layer) or "types" (layer_types says which layers
#:     slide; without it, ``pattern`` repeats, as the config class derives it); absent: no window;
#:   aliases: {canonical key: attribute_map alias} (the canonical key wins where both are present);
#:   ignores: keys the config class has and the model never reads (they change nothing);
#:   qk_norm_key: (key, kind): qk_norm is ``kind`` when the key is true (else none);
#:   softcap: (attention, final) soft-capping defaults, as Gemma 2 (see _softcaps);
#:   no_bias_keys: bias flags lmcost does not model, refused when true (lm_head_bias);
#:   refuse: {key: what}: flags of a feature lmcost does not model, refused when true;
#:   block_key: (key, default, block if true, block if false): the block layout a flag chooses;
#:   moe as a dict: {"every": (experts key, alias, experts default, top-k default)}: every layer a
#:     mixture of experts of width intermediate_size, with "shared": the key of a shared expert's
#:     width (0: none); {"deepseek": (experts, top-k, shared experts, leading dense layers)}: the
#:     defaults of DeepSeek-V3-style keys (n_routed_experts, moe_intermediate_size, n_shared_experts,
#:     first_k_dense_replace).
NEW_FAMILIES: dict[str, dict] = {
    "internlm3": dict(head_dim=128, qkv=("attention_bias", False, "qkv_bias"), out="qkv",
                      mlp=("mlp_bias", False, "bias")),  # LlamaModel: one bias flag for q, k, v and o
    # Qwen2 attention with q/k/v bias forced off; MinistralConfig skips Mistral's derivation of head_dim,
    # so its model cannot be built without one (Ministral-8B's config.json gives 128).
    "ministral": dict(head_dim=..., qkv=None, out=None, mlp=None),
    "helium": dict(head_dim=128, qkv=("attention_bias", False), out=None, mlp=("mlp_bias", False)),
    "granite": dict(qkv=("attention_bias", False), out="qkv", mlp=("mlp_bias", False)),
    "seed_oss": dict(head_dim=128, qkv=("attention_bias", True), out=("attention_out_bias", False),
                     mlp=("mlp_bias", False)),
    "glm": dict(head_dim=128, qkv=("attention_bias", True), out=None, mlp=None, rotary=0.5),
    "glm4": dict(head_dim=128, qkv=("attention_bias", True), out=None, mlp=None, rotary=0.5, block="sandwich"),
    "ernie4_5": dict(head_dim=128, qkv=("use_bias", False), out="qkv", mlp=("use_bias", False), tie=True),
    "olmo3": dict(qkv=("attention_bias", False), out="qkv", mlp=None, qk_norm="full", block="post_norm"),
    "cohere": dict(qkv=("attention_bias", False), out="qkv", mlp=None, norm="layernorm", block="parallel",
                   tie=True),
    "starcoder2": dict(qkv=("use_bias", True), out="qkv", mlp=("use_bias", True), norm="layernorm",
                       norm_bias=True, gated=False, act_default="gelu_pytorch_tanh", tie=True),
    "qwen3_moe": dict(qkv=("attention_bias", False), out="qkv", mlp=None, qk_norm="head", moe="qwen3_moe"),
    "olmoe": dict(qkv=("attention_bias", False), out="qkv", mlp=None, qk_norm="full", moe="olmoe"),
    "granitemoe": dict(qkv=("attention_bias", False), out="qkv", mlp=None, moe="granitemoe"),
    # Qwen3 attention, DeepSeek-V3-style experts (first_k_dense_replace dense layers, shared experts of
    # n_shared_experts x moe_intermediate_size). Dots1Config leaves the expert counts unset and its model
    # cannot be built without them: they are required here.
    "dots1": dict(qkv=("attention_bias", False), out="qkv", mlp=None, qk_norm="head", moe="dots1"),
    # Llama itself under other names (LlamaModel for exaone; IQuestCoder's and CWM's copies of it).
    "exaone": dict(qkv=("attention_bias", False), out="qkv", mlp=("mlp_bias", False),
                   aliases={"num_hidden_layers": "num_layers", "hidden_act": "activation_function"}),
    "iquestcoder": dict(head_dim=128, qkv=("attention_bias", False), out="qkv", mlp=("mlp_bias", False)),
    # CwmConfig: layer_types, else every 4th layer (from layer 0) global, the others slide.
    "cwm": dict(head_dim=128, qkv=None, out=None, mlp=("mlp_bias", False), window="types",
                pattern=["global", "local", "local", "local"]),
    # Mistral attention without biases; sliding_window (null by default) on every layer.
    "ministral3": dict(head_dim=128, qkv=None, out=None, mlp=None, window="all"),
    # Gemma-2 attention with pre-norms only (no post-norms); layer_types, else even layers slide.
    "vaultgemma": dict(head_dim=256, qkv=("attention_bias", False), out="qkv", mlp=None,
                       act_key="hidden_activation", act_default="gelu_pytorch_tanh", tie=True,
                       window="types", pattern=["local", "global"], softcap=(50.0, 30.0)),
    # Llama with a plain (ungated) squared-ReLU MLP: up, relu2, down.
    "arcee": dict(qkv=("attention_bias", False), out="qkv", mlp=("mlp_bias", False), gated=False,
                  act_default="relu2"),
    # Mixtral's experts behind LayerNorms with bias; attention_bias on q, k, v and o.
    "phimoe": dict(qkv=("attention_bias", False), out="qkv", mlp=None, norm="layernorm", norm_bias=True,
                   window="all", no_bias_keys=("lm_head_bias",), moe={"every": ("num_local_experts", "num_experts", 16, 2)}),
    # Qwen3-style projections with RMSNorm over all heads' q and k (full), experts in every layer.
    "minimax_m2": dict(head_dim=128, qkv=None, out=None, mlp=None, qk_norm="full",
                       moe={"every": ("num_local_experts", "num_experts", 256, 8)}),
    # OLMo-2's norm placement and q/k norms with OLMoE's experts.
    "flex_olmo": dict(qkv=("attention_bias", False), out="qkv", mlp=None, qk_norm="full", block="post_norm",
                      moe={"every": ("num_experts", "num_local_experts", 7, 5)}),
    # GraniteMoE with an optional shared gated MLP of width shared_intermediate_size on every token.
    "granitemoeshared": dict(qkv=("attention_bias", False), out="qkv", mlp=None,
                             moe={"every": ("num_local_experts", "num_experts", 8, 2), "shared": "shared_intermediate_size"}),
    # GLM-4.5: DeepSeek-V3's expert layout with GLM's half-width RoPE; q/k/v bias, no o bias; a head_dim
    # not in the config is hidden_size // heads (floored: the default config's 4096 / 96 -> 42).
    "glm4_moe": dict(head_dim="floor", qkv=("attention_bias", False), out=None, mlp=None, rotary=0.5,
                     qk_norm_key=("use_qk_norm", "head"), moe={"deepseek": (128, 8, 1, 1)}),
    # Llama with RMSNorms after attention and MLP too (sandwich) when use_post_norm, Granite's multipliers.
    "hyperclovax": dict(qkv=("attention_bias", False), out="qkv", mlp=("mlp_bias", False),
                        block_key=("use_post_norm", True, "sandwich", "pre_norm")),
    # StableLM-2: LayerNorms with bias, RoPE on a quarter of each head, q/k/v bias by a flag, no o or MLP
    # bias; one shared norm feeding attention and MLP in parallel with use_parallel_residual.
    "stablelm": dict(qkv=("use_qkv_bias", False), out=None, mlp=None, norm="layernorm", norm_bias=True,
                     rotary=0.25, block_key=("use_parallel_residual", False, "parallel", "pre_norm"),
                     refuse={"qk_layernorm": "per-head LayerNorms with weights of their own on q and k"}),
    # ERNIE-4.5 with experts in layers moe_layer_start_index..end_index (every moe_layer_interval-th),
    # shared experts of moe_num_shared_experts x moe_intermediate_size, and a learned expert-score
    # correction bias [E] in the router (counted as a router bias). use_bias (q/k/v/o, MLPs, lm_head) is
    # refused: Ernie4_5_MoeMLP's experts take none.
    "ernie4_5_moe": dict(qkv=None, out=None, mlp=None, tie=True, moe="ernie4_5_moe",
                         refuse={"use_bias": "biases on the projections, MLPs and lm_head"},
                         aliases={"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"}),
    # OLMo-1: Llama with LayerNorms that have no weight or bias; clip_qkv (a clamp) is not modelled.
    "olmo": dict(qkv=("attention_bias", False), out="qkv", mlp=None, norm="layernorm", norm_weight=False,
                 refuse={"clip_qkv": "clamping q, k and v"}),
    # Arcee's MLP with LayerNorms (with bias) and biases by default.
    "jais2": dict(qkv=("attention_bias", True), out="qkv", mlp=("mlp_bias", True), gated=False,
                  act_default="relu2", norm="layernorm", norm_bias=True),
}
#: Per family: keys that change nothing lmcost counts in that family's model (Granite's multipliers
#: and Cohere's logit_scale are one scalar multiply of the embeddings, residual branches, attention
#: scores (in place of 1/sqrt(d_h)) or logits; lmcost counts none of them).
FAMILY_NO_COST = {
    "granite": ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"),
    "granitemoe": ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"),
    "granitemoeshared": ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"),
    "hyperclovax": ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"),
    "cohere": ("logit_scale",),
}
SUPPORTED = sorted(GATED_FAMILIES | {"falcon", "gpt2", "gpt-sw3", "gpt_bigcode", "gpt_neox", "gptj", "codegen",
                                     "openai-gpt", "phi", "gpt_neo", "opt", "biogpt"} | set(NEW_FAMILIES))
#: Families whose transformers model applies ``sliding_window`` (others ignore the key).
WINDOWED = {"mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma2", "gemma3_text", "phi3",
            "ministral", "olmo3", "qwen3_moe", "starcoder2", "dots1"}

def _layer_pattern(r: _Reader, mt: str, n_layers: int):
    """Per-layer local/global pattern and window, as the transformers config classes derive them."""
    types = r.get("layer_types", None, kind=list)
    window = r.get("sliding_window", None, kind=int)
    if mt not in WINDOWED:
        return None, None  # e.g. LlamaConfig accepts sliding_window but the model never uses it
    if mt in ("qwen3_moe", "starcoder2"):
        # Their attention takes config.sliding_window on every layer (layer_types is not read);
        # Qwen3MoeConfig keeps the window only with use_sliding_window.
        if mt == "qwen3_moe" and not r.get("use_sliding_window", False):
            return None, None
        return window, None
    if mt in ("ministral", "olmo3") and not window:
        return None, None  # a sliding layer without a window attends to everything: all layers global
    if mt == "dots1" and types is None:
        first = r.get("max_window_layers", 62)  # Dots1Config: layers at index >= max_window_layers slide
        return window, ["global" if i < first else "local" for i in range(n_layers)]
    if mt == "olmo3" and types is None:
        return window, ["local"] * 3 + ["global"]  # Olmo3Config: every 4th layer is global
    every = r.count("sliding_window_pattern", r.count("_sliding_window_pattern", 6))
    if types is not None:
        pattern = mapped_layer_types(r, types, n_layers, WINDOW_TYPES)
        return (window if "local" in pattern else None), pattern
    if not window:
        return None, None
    if mt in ("qwen2", "qwen3", "qwen2_moe"):
        # Qwen2Config: layers at index >= max_window_layers use the window, only if use_sliding_window.
        if not r.get("use_sliding_window", False):
            return None, None
        first = r.get("max_window_layers", 28)
        return window, ["global" if i < first else "local" for i in range(n_layers)]
    if mt == "gemma2":
        return window, ["local", "global"]  # Gemma2Config: even layers slide, odd are global
    if mt == "gemma3_text":
        # Gemma3TextConfig: every `sliding_window_pattern`-th layer (default 6) is global
        return window, ["local"] * (every - 1) + ["global"]
    return window, None  # mistral, mixtral, phi3: every layer slides


def _softcaps(r: _Reader, attention: dict, out: dict, defaults: tuple) -> None:
    """Soft-capping, c * tanh(x / c), on the attention scores and the logits (Gemma 2): elementwise, no
    parameters, with the config class's ``defaults`` (attention, final); an explicit null is no capping
    (the models test ``is not None``), not the class default."""
    for (key, field, into), default in zip((("attn_logit_softcapping", "logit_softcap", attention),
                                            ("final_logit_softcapping", "final_logit_softcap", out)), defaults):
        into[field] = None if (key in r.data and r.data[key] is None) else r.get(key, default, kind=float)


def _map(r: _Reader, mt: str) -> dict:
    r.must_not("add_cross_attention", "cross-attention")
    r.must_not("use_bidirectional_attention", "bidirectional (non-causal) attention")
    if mt in ("gpt2", "gpt-sw3", "gpt_bigcode"):
        # gpt-sw3 is GPT2Config and GPT2LMHeadModel under another name. GPTBigCode (StarCoder) is GPT-2
        # with multi-query attention when multi_query (one K/V head: c_attn is d + 2 d_h wide).
        d, h = r.get("n_embd", 768), r.get("n_head", 12)
        bigcode = mt == "gpt_bigcode"
        h_kv = 1 if bigcode and r.get("multi_query", True) else h
        if bigcode:
            # GPTBigCodeConfig overwrites num_key_value_heads from multi_query; the softmax flags set
            # its precision, not its cost.
            r.used.update(("num_key_value_heads", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32"))
        return dict(d_model=d, n_layers=r.get("n_layer", 12), vocab_size=r.get("vocab_size", 50257),
                    attention=dict(n_heads=h, n_kv_heads=h_kv if h_kv != h else None, qkv_bias=True, out_bias=True),
                    ffn=dict(activation=_activation(r, "activation_function",
                                                    "gelu_pytorch_tanh" if bigcode else "gelu_new", False),
                             d_ff=r.get("n_inner", 4 * d), bias=True),
                    norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                    max_positions=r.get("n_positions", 1024), tie_embeddings=r.get("tie_word_embeddings", True))
    if mt in ("gptj", "codegen"):
        # GPT-J and CodeGen: one LayerNorm feeding attention and MLP in parallel; RoPE on the first
        # rotary_dim dims of each head (all of them if null); no attention biases (CodeGen fuses q, k, v
        # into one GEMM of the same FLOPs); MLP and lm_head biases.
        d, h = r.get("n_embd", 4096), r.get("n_head", 16)
        r.used.add("rotary")  # EleutherAI's GPT-J-6B file says rotary: true; GPTJConfig has no such field
        rot = r.get("rotary_dim", None, kind=int) if "rotary_dim" in r.data else 64
        if rot is not None and not 0 < rot <= d // h:
            raise LmcostError(f"{r.source}: rotary_dim", f"{rot} is not in 1..{d // h} (the head width)",
                              "give the rotated width of each head, or null for all of it")
        return dict(d_model=d, n_layers=r.get("n_layer", 28), vocab_size=r.get("vocab_size", 50400),
                    attention=dict(n_heads=h),
                    ffn=dict(activation=_activation(r, "activation_function", "gelu_new", False),
                             d_ff=r.get("n_inner", 4 * d), bias=True),
                    norm="layernorm", norm_bias=True, block="parallel", positions="rope",
                    rotary_fraction=(rot or d // h) / (d // h), max_positions=r.get("n_positions", 2048),
                    tie_embeddings=r.get("tie_word_embeddings", False), lm_head_bias=True)
    if mt == "openai-gpt":
        # GPT-1 (Radford et al. 2018): post-norm blocks, learned positions, no final norm, d_ff = 4d.
        d = r.get("n_embd", 768)
        return dict(d_model=d, n_layers=r.get("n_layer", 12), vocab_size=r.get("vocab_size", 40478),
                    attention=dict(n_heads=r.get("n_head", 12), qkv_bias=True, out_bias=True),
                    ffn=dict(activation=_activation(r, "afn", "gelu", False), d_ff=4 * d, bias=True),
                    norm="layernorm", norm_bias=True, block="post_norm", final_norm=False, positions="learned",
                    max_positions=r.get("n_positions", 512), tie_embeddings=r.get("tie_word_embeddings", True))
    if mt == "gpt_neo":
        # GPT-Neo: GPT-2 blocks without q/k/v biases, local layers seeing the last window_size keys.
        # GPTNeoConfig rebuilds attention_layers from attention_types ([[kinds, repeats], ...]).
        types = r.get("attention_types", [[["global", "local"], 12]], kind=list)
        r.used.add("attention_layers")
        try:
            kinds = [k for kinds_, n in types for _ in range(n) for k in kinds_]
        except (TypeError, ValueError):
            raise LmcostError(f"{r.source}: attention_types", f"must be [[kinds, repeats], ...], got {types!r:.40}",
                              'write e.g. [[["global", "local"], 12]]') from None
        n_layers = r.get("num_layers", 24)
        if set(kinds) - {"global", "local"} or len(kinds) != n_layers:
            raise LmcostError(f"{r.source}: attention_types", f"gives {len(kinds)} layers of kinds "
                              f"{sorted(set(map(str, kinds)))}, for num_layers={n_layers}",
                              "give global/local kinds covering every layer")
        d = r.get("hidden_size", 2048)
        window = r.get("window_size", 256)
        return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 50257),
                    attention=dict(n_heads=r.get("num_heads", 16), out_bias=True,
                                   sliding_window=window if "local" in kinds else None, layer_pattern=kinds),
                    ffn=dict(activation=_activation(r, "activation_function", "gelu_new", False),
                             d_ff=r.get("intermediate_size", 4 * d), bias=True),
                    norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                    max_positions=r.get("max_position_embeddings", 2048),
                    tie_embeddings=r.get("tie_word_embeddings", True))
    if mt == "opt":
        # OPT: learned positions whose table has 2 rows more than max_position_embeddings (a padding
        # offset: position_offset), pre- or post-norm
        # by do_layer_norm_before, a final norm only with pre-norm. The 350m model's project_in/out
        # (word_embed_proj_dim != hidden_size) is not modelled.
        d = r.get("hidden_size", 768)
        if r.get("word_embed_proj_dim", d) != d:
            raise LmcostError(f"{r.source}: word_embed_proj_dim", "projections in and out of the embedding width "
                              "are not modelled", "set word_embed_proj_dim to hidden_size or write an lmcost YAML")
        pre = r.get("do_layer_norm_before", True)
        final = not r.get("_remove_final_layer_norm", False) and pre
        bias = r.get("enable_bias", True)
        return dict(d_model=d, n_layers=r.get("num_hidden_layers", 12), vocab_size=r.get("vocab_size", 50272),
                    attention=dict(n_heads=r.get("num_attention_heads", 12), qkv_bias=bias, out_bias=bias),
                    ffn=dict(activation=_activation(r, "activation_function", "relu", False),
                             d_ff=r.get("ffn_dim", 3072), bias=bias),
                    norm="layernorm", norm_bias=True, norm_weight=r.get("layer_norm_elementwise_affine", True),
                    block="pre_norm" if pre else "post_norm", final_norm=final,
                    positions="learned", max_positions=r.get("max_position_embeddings", 2048), position_offset=2,
                    tie_embeddings=r.get("tie_word_embeddings", True))
    if mt == "biogpt":
        # BioGPT: OPT's pre-norm block and offset position table (2 rows more), embeddings scaled by
        # sqrt(d) (scale_embedding: one multiply, not counted), biases everywhere, tied lm_head.
        r.get("scale_embedding", True)
        return dict(d_model=r.get("hidden_size", 1024), n_layers=r.get("num_hidden_layers", 24),
                    vocab_size=r.get("vocab_size", 42384),
                    attention=dict(n_heads=r.get("num_attention_heads", 16), qkv_bias=True, out_bias=True),
                    ffn=dict(activation=_activation(r, "hidden_act", "gelu", False),
                             d_ff=r.get("intermediate_size", 4096), bias=True),
                    norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                    max_positions=r.get("max_position_embeddings", 1024), position_offset=2,
                    tie_embeddings=r.get("tie_word_embeddings", True))
    if mt == "phi":
        # Phi-1/1.5/2: a parallel block behind one LayerNorm, biases everywhere (lm_head too), RoPE on
        # partial_rotary_factor of each head.
        r.must_not("qk_layernorm", "per-head LayerNorms on q and k")
        h = r.get("num_attention_heads", 32)
        return dict(d_model=r.get("hidden_size", 2048), n_layers=r.get("num_hidden_layers", 24),
                    vocab_size=r.get("vocab_size", 51200),
                    attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h), qkv_bias=True, out_bias=True),
                    ffn=dict(activation=_activation(r, "hidden_act", "gelu_new", False),
                             d_ff=r.get("intermediate_size", 8192), bias=True),
                    norm="layernorm", norm_bias=True, block="parallel", positions="rope",
                    rotary_fraction=_rotary_fraction(r, 0.5), tie_embeddings=r.get("tie_word_embeddings", False),
                    lm_head_bias=True)
    if mt == "falcon":
        if r.get("alibi", False):
            raise LmcostError(f"{r.source}: alibi", "ALiBi positions are not modelled", "use a RoPE Falcon config")
        d, h = r.get("hidden_size", 4544), r.get("num_attention_heads", 71)
        new_arch = r.get("new_decoder_architecture", False)
        two_norms = r.get("num_ln_in_parallel_attn", None) in (None, 2)  # FalconConfig: None means 2
        num_kv = r.get("num_kv_heads", h)  # FalconConfig reads it only with new_decoder_architecture
        multi_query = r.get("multi_query", True)  # FalconConfig reads it only without the new architecture
        h_kv = num_kv if new_arch else (1 if multi_query else h)
        bias = r.get("bias", False)
        parallel_attn = r.get("parallel_attn", True)  # the new architecture is always parallel
        parallel = new_arch or parallel_attn
        return dict(d_model=d, n_layers=r.get("num_hidden_layers", 32), vocab_size=r.get("vocab_size", 65024),
                    attention=dict(n_heads=h, n_kv_heads=h_kv, qkv_bias=bias, out_bias=bias),
                    ffn=dict(activation=_activation(r, "activation", "gelu", False),
                             d_ff=r.get("ffn_hidden_size", 4 * d), bias=bias),
                    norm="layernorm", norm_bias=True, block="parallel" if parallel else "pre_norm",
                    parallel_shared_norm=not (new_arch and two_norms),
                    positions="rope", tie_embeddings=r.get("tie_word_embeddings", True))
    if mt == "gpt_neox":
        bias = r.get("attention_bias", True)
        return dict(d_model=r.get("hidden_size"), n_layers=r.get("num_hidden_layers"),
                    vocab_size=r.get("vocab_size"),
                    attention=dict(n_heads=r.get("num_attention_heads"), qkv_bias=bias, out_bias=bias),
                    ffn=dict(activation=_activation(r, "hidden_act", "gelu", False),
                             d_ff=r.get("intermediate_size"), bias=True),
                    norm="layernorm", norm_bias=True,
                    block="parallel" if r.get("use_parallel_residual", True) else "pre_norm",
                    parallel_shared_norm=False, positions="rope",
                    rotary_fraction=r.get("rotary_pct", r.get("partial_rotary_factor", 0.25)),
                    tie_embeddings=r.get("tie_word_embeddings", False))

    if mt in NEW_FAMILIES:
        return _map_new(r, mt)
    if mt in CODED_FAMILIES:
        return CODED_FAMILIES[mt](r, mt)

    # The Llama-like families: RMSNorm, gated FFN, RoPE.
    n_layers = r.get("num_hidden_layers")
    h = r.get("num_attention_heads")
    window, pattern = _layer_pattern(r, mt, n_layers)
    # A config without head_dim takes its class's default: 256 for the Gemmas, 128 for Qwen3 (not d / h).
    attention = dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h),
                     head_dim=r.get("head_dim", {"gemma": 256, "gemma2": 256, "gemma3_text": 256, "qwen3": 128}.get(mt)),
                     sliding_window=window, layer_pattern=pattern)
    bias = r.get("qkv_bias", True) if mt == "qwen2_moe" else r.get("attention_bias", mt == "qwen2")
    attention["qkv_bias"] = bias
    attention["out_bias"] = bias and mt not in ("qwen2", "qwen2_moe")  # Qwen2: bias on q, k, v only
    if mt in ("qwen3", "gemma3_text"):
        attention["qk_norm"] = "head"
    elif mt == "olmo2":
        attention["qk_norm"] = "full"
    # Gemma-2/3 models apply hidden_activation, Gemma-1 hidden_act; their configs may carry both.
    act_key = "hidden_activation" if mt in ("gemma2", "gemma3_text") else "hidden_act"
    act_default = "gelu_pytorch_tanh" if mt.startswith("gemma") else "silu"
    if mt.startswith("gemma"):
        r.get("hidden_act" if act_key == "hidden_activation" else "hidden_activation", None)
    out = dict(d_model=r.get("hidden_size"), n_layers=n_layers, vocab_size=r.get("vocab_size"),
               attention=attention,
               ffn=dict(activation=_activation(r, act_key, act_default, True), d_ff=r.get("intermediate_size"),
                        bias=r.get("mlp_bias", False)),
               norm="rmsnorm", block={"gemma2": "sandwich", "gemma3_text": "sandwich", "olmo2": "post_norm"}.get(mt, "pre_norm"),
               positions="rope", tie_embeddings=r.get("tie_word_embeddings", mt.startswith("gemma")))
    if mt in ("gemma2", "gemma3_text"):
        # as Gemma2Config (50, 30) and Gemma3TextConfig (none) default
        _softcaps(r, attention, out, {"gemma2": (50.0, 30.0), "gemma3_text": (None, None)}[mt])
    if mt == "phi3":
        out["rotary_fraction"] = r.get("partial_rotary_factor", 1.0)
    if mt in ("deepseek_v2", "deepseek_v3"):
        attention.pop("head_dim")
        qk = r.get("qk_head_dim", None)  # derived in transformers: qk_nope_head_dim + qk_rope_head_dim
        if qk is not None and qk != r.get("qk_nope_head_dim") + r.get("qk_rope_head_dim"):
            raise LmcostError(f"{r.source}: qk_head_dim", f"{qk} is not qk_nope_head_dim + qk_rope_head_dim",
                              "remove qk_head_dim or make it the sum")
        attention["mla"] = dict(q_lora_rank=r.get("q_lora_rank", None), kv_lora_rank=r.get("kv_lora_rank"),
                                qk_nope_head_dim=r.get("qk_nope_head_dim"), qk_rope_head_dim=r.get("qk_rope_head_dim"),
                                v_head_dim=r.get("v_head_dim"))
        n_experts = r.get("n_routed_experts")
        top_k = _top_k(r, "DeepseekV2Config") if mt == "deepseek_v2" else r.get("num_experts_per_tok")
        out["moe"] = dict(n_experts=n_experts, top_k=top_k,
                          d_ff_expert=r.get("moe_intermediate_size"), n_shared_experts=r.get("n_shared_experts", 0),
                          first_dense_layers=r.get("first_k_dense_replace", 0), layer_freq=r.get("moe_layer_freq", 1))
    elif mt == "mixtral":
        out["moe"] = dict(n_experts=r.get("num_local_experts", 8), top_k=r.get("num_experts_per_tok", 2),
                          d_ff_expert=out["ffn"]["d_ff"])
    elif mt == "qwen2_moe":
        step, only = r.count("decoder_sparse_step", 1), r.layers("mlp_only_layers", n_layers)
        dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0]
        out["moe"] = dict(n_experts=r.get("num_experts", 60), top_k=r.get("num_experts_per_tok", 4),
                          d_ff_expert=r.get("moe_intermediate_size", 1408),
                          d_ff_shared=r.get("shared_expert_intermediate_size", 5632), shared_expert_gate=True,
                          dense_layers=dense)
    return out


def _spec_pattern(r: _Reader, spec: dict, n_layers: int):
    """(window, layer pattern) of a NEW_FAMILIES entry with a ``window`` rule (see the table's keys)."""
    window = r.get("sliding_window", None, kind=int)
    if spec["window"] == "all" or not window:
        r.get("layer_types", None, kind=list)
        return window, None  # "all": every layer slides; no window: a sliding layer sees everything
    types = r.get("layer_types", None, kind=list)
    if types is None:
        return window, list(spec["pattern"])
    pattern = mapped_layer_types(r, types, n_layers, WINDOW_TYPES)
    return (window if "local" in pattern else None), pattern


def _block(r: _Reader, spec: dict) -> str:
    """A NEW_FAMILIES entry's block layout: fixed (``block``) or chosen by a flag (``block_key``)."""
    if "block_key" in spec:
        key, default, if_true, if_false = spec["block_key"]
        return if_true if r.get(key, default) else if_false
    return spec.get("block", "pre_norm")


def _qk_norm(r: _Reader, spec: dict) -> str:
    """A NEW_FAMILIES entry's q/k norm: fixed (``qk_norm``) or switched by a key (``qk_norm_key``)."""
    if "qk_norm_key" in spec:
        key, kind = spec["qk_norm_key"]
        return kind if r.get(key, False) else "none"
    return spec.get("qk_norm", "none")


def _map_new(r: _Reader, mt: str) -> dict:
    """The Llama-like families of NEW_FAMILIES: RoPE, pre-norm unless said otherwise."""
    spec = NEW_FAMILIES[mt]
    for canon, alias in spec.get("aliases", {}).items():
        if alias in r.data:
            r.used.add(alias)
            if r.data.get(canon) is None:
                r.data = {**r.data, canon: r.data[alias]}
    r.used.update(spec.get("ignores", ()))
    for key in FAMILY_NO_COST.get(mt, ()):
        r.get(key, None, kind=float)
    n_layers = r.get("num_hidden_layers")
    h = r.get("num_attention_heads")
    d = r.get("hidden_size")
    window, pattern = _spec_pattern(r, spec, n_layers) if "window" in spec else _layer_pattern(r, mt, n_layers)
    for key in spec.get("no_bias_keys", ()):
        r.must_not(key, "a bias on this projection")
    for key, what in spec.get("refuse", {}).items():
        r.must_not(key, what)
    if spec.get("head_dim") is ...:
        head_dim = r.get("head_dim", kind=int)  # required
    elif spec.get("head_dim") == "floor":
        head_dim = r.get("head_dim", d // h, kind=int)
    elif "head_dim" in r.data and r.data["head_dim"] is None:
        head_dim = r.get("head_dim", None)  # an explicit null: every config class derives d / heads
    else:
        head_dim = r.get("head_dim", spec.get("head_dim"), kind=int)
    if mt in ("helium", "olmoe") and head_dim is not None and head_dim * h != d:
        # Helium's o_proj and OLMoE's q_norm are sized by hidden_size, not heads x head_dim.
        raise LmcostError(f"{r.source}: head_dim", f"{head_dim} x {h} heads is not hidden_size={d}, "
                          f"which the {mt} model assumes", "remove head_dim or make it hidden_size / heads")
    if mt == "cohere":
        r.must_not("use_qk_norm", "Cohere's per-head LayerNorm on q and k")
    if mt == "olmoe" and r.get("clip_qkv", None, kind=float) is not None:
        raise LmcostError(f"{r.source}: clip_qkv", "clamping q, k and v is not modelled",
                          "set clip_qkv to null or write an lmcost YAML")
    qkv_bias = _bias(r, spec["qkv"])
    out_bias = qkv_bias if spec["out"] == "qkv" else _bias(r, spec["out"])
    mlp_bias = _bias(r, spec["mlp"])
    if mt == "internlm3" and qkv_bias != mlp_bias:
        raise LmcostError(f"{r.source}: qkv_bias", "differs from bias, which InternLM3Config refuses",
                          "give qkv_bias and bias the same value")
    attention = dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h), head_dim=head_dim,
                     qkv_bias=qkv_bias, out_bias=out_bias, qk_norm=_qk_norm(r, spec),
                     sliding_window=window, layer_pattern=pattern)
    gated = spec.get("gated", True)
    d_ff = r.get("intermediate_size")
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size"), attention=attention,
               ffn=dict(activation=_activation(r, spec.get("act_key", "hidden_act"), spec.get("act_default", "silu"), gated),
                        d_ff=d_ff, bias=mlp_bias),
               norm=spec.get("norm", "rmsnorm"), norm_bias=spec.get("norm_bias", False),
               norm_weight=spec.get("norm_weight", True), block=_block(r, spec), positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", spec.get("tie", False)))
    if "rotary" in spec:
        out["rotary_fraction"] = _rotary_fraction(r, spec["rotary"])
    if "softcap" in spec:
        _softcaps(r, attention, out, spec["softcap"])
    moe = spec.get("moe")
    if moe == "qwen3_moe":
        # Qwen3MoeDecoderLayer: a sparse block unless listed in mlp_only_layers or off decoder_sparse_step.
        n_experts = _experts(r, "num_local_experts", "num_experts", 128)
        step, only = r.count("decoder_sparse_step", 1), r.layers("mlp_only_layers", n_layers)
        dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0 or n_experts == 0]
        moe_fields = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 8),
                          d_ff_expert=r.get("moe_intermediate_size", 768), dense_layers=dense)
        if len(dense) < n_layers:  # else every layer is dense: a dense model
            out["moe"] = moe_fields
    elif moe == "dots1":
        n_experts = _experts(r, "n_routed_experts", "num_local_experts", ...)
        out["moe"] = dict(n_experts=n_experts, top_k=_top_k(r, "Dots1Config"),
                          d_ff_expert=r.get("moe_intermediate_size", 1408),
                          n_shared_experts=r.get("n_shared_experts", kind=int),
                          first_dense_layers=r.get("first_k_dense_replace", 0))
    elif moe == "ernie4_5_moe":
        start, end = r.get("moe_layer_start_index", 1), r.get("moe_layer_end_index", -1)
        end = n_layers - 1 if end == -1 else end  # Ernie4_5_MoeConfig: -1 is the last layer
        every = r.count("moe_layer_interval", 1)
        dense = [i for i in range(n_layers) if not ((i + 1) % every == 0 and start <= i <= end)]
        if len(dense) < n_layers:
            out["moe"] = dict(n_experts=r.get("moe_num_experts", 64), top_k=r.get("moe_k", 6),
                              d_ff_expert=r.get("moe_intermediate_size", 1536),
                              n_shared_experts=r.get("moe_num_shared_experts", 2), dense_layers=dense,
                              router_bias=True)
        r.get("moe_norm_min", None, kind=float)  # an epsilon of the routing weights' normalisation
    elif isinstance(moe, dict) and "every" in moe:
        canon, alias, e_default, k_default = moe["every"]
        out["moe"] = dict(n_experts=_experts(r, canon, alias, e_default),
                          top_k=r.get("num_experts_per_tok", k_default), d_ff_expert=d_ff)
        shared = r.get(moe["shared"], 0) if "shared" in moe else 0
        if shared:
            out["moe"]["d_ff_shared"] = shared
    elif isinstance(moe, dict) and "deepseek" in moe:
        e_default, k_default, shared_default, first_default = moe["deepseek"]
        out["moe"] = dict(n_experts=_experts(r, "n_routed_experts", "num_local_experts", e_default),
                          top_k=r.get("num_experts_per_tok", k_default),
                          d_ff_expert=r.get("moe_intermediate_size", kind=int),
                          n_shared_experts=r.get("n_shared_experts", shared_default),
                          first_dense_layers=r.get("first_k_dense_replace", first_default))
    elif moe in ("olmoe", "granitemoe"):
        # Every layer is a mixture of experts of width intermediate_size, no shared expert.
        canon, alias, default = (("num_experts", "num_local_experts", 64) if moe == "olmoe"
                                 else ("num_local_experts", "num_experts", 8))
        n_experts = _experts(r, canon, alias, default)
        out["moe"] = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 8 if moe == "olmoe" else 2),
                          d_ff_expert=d_ff)
    return out


#: Widths a config class gives when its key is absent, for the classes whose files often leave them out
#: (a wrapper's ``text_config`` carries only what differs from the class: google/gemma-3-4b-it's gives 5
#: keys). From Gemma3TextConfig and MistralConfig in transformers 5.24.
CLASS_DEFAULTS = {
    "gemma3_text": dict(vocab_size=262208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                        num_attention_heads=8, num_key_value_heads=4, head_dim=256, sliding_window=4096),
    "mistral": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, sliding_window=4096),
}

#: Multimodal wrappers whose ``text_config`` is the decoder: model_type -> (the text config's model_type
#: when it names none, whether the wrapper's own tie_word_embeddings decides the lm_head's tying).
#: lmcost counts the decoder; the vision tower and projector are not counted, and the source says so.
#: Gemma3ForConditionalGeneration and Mistral3's ties follow the wrapper's key (checked against
#: transformers); Llama4/Qwen3.5's causal-LM classes are the text decoder alone.
WRAPPERS = {"gemma3": ("gemma3_text", True), "mistral3": ("mistral", True), "llama4": ("llama4_text", False),
            "qwen3_5": ("qwen3_5_text", False), "qwen3_5_moe": ("qwen3_5_moe_text", False)}


def _unwrap(data: dict, source: str) -> ArchConfig:
    """The decoder of a multimodal wrapper config (see WRAPPERS): its text_config, mapped, with the
    wrapper's quantization_config and (where the wrapper's model ties by it) tie_word_embeddings."""
    mt = data["model_type"]
    text = data.get("text_config") or {}
    if not isinstance(text, dict):
        raise LmcostError(f"{source}: text_config", f"must be a mapping, got {text!r:.40}",
                          "write text_config as the decoder's JSON object")
    inner, top_ties = WRAPPERS[mt]
    text = {**text, "model_type": text.get("model_type") or inner}
    if text["model_type"] not in SUPPORTED:
        raise LmcostError(f"{source}: text_config.model_type", f"the {mt} decoder is {text['model_type']!r}, "
                          "which lmcost does not model", "write an lmcost YAML of the decoder")
    if top_ties and data.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = data["tie_word_embeddings"]
    if data.get("quantization_config") is not None:
        text["quantization_config"] = data["quantization_config"]
    if data.get("_name_or_path"):
        text["_name_or_path"] = data["_name_or_path"]
    cfg = from_hf_config(text, f"{source}: text_config")
    from lmcost.model.vision import wrapper_vision_params

    vision = wrapper_vision_params(mt, data, cfg.d_model, source)
    extra = [k for k in ("vision_config", "audio_config") if k in data]
    note = f"; its {' and '.join(k.removesuffix('_config') for k in extra)} tower is not counted" if extra else ""
    if vision:
        note = f"; its vision tower and projector ({vision:,} parameters) are not in the decoder's costs"
    name = cfg.name if data.get("_name_or_path") else str(source).rstrip("/").split("/")[-1].removesuffix(".json")
    return cfg.model_copy(update={"name": name, "vision_params": vision,
                                  "source": f"Hugging Face config.json ({mt}: the decoder, "
                                            f"text_config {text['model_type']}{note})"})


def from_hf_config(data: dict, source: str = "config.json") -> ArchConfig:
    """An ArchConfig from the fields of a Hugging Face ``config.json``.

    A multimodal wrapper (WRAPPERS: gemma3, mistral3, llama4, ...) maps to its decoder, ``text_config``.
    Raises: LmcostError for an unknown ``model_type`` (listing the supported ones), a missing
    required field, a field whose value is not modelled (ALiBi, an unknown activation), or a field
    the mapping does not understand.
    """
    mt = data.get("model_type")
    if mt in WRAPPERS:
        return _unwrap(data, source)
    if mt not in SUPPORTED:
        from lmcost.model.hf.verdicts import REFUSED

        if mt in REFUSED:
            raise LmcostError(f"{source}: model_type", f"{mt} is not modelled: {REFUSED[mt]}",
                              "write an lmcost YAML of the architecture (see lmcost/data/models/llama-3-8b.yaml)")
        raise LmcostError(f"{source}: model_type", f"unknown model_type {mt!r}",
                          f"supported: {', '.join(SUPPORTED)}; or write an lmcost YAML")
    r = _Reader({**CLASS_DEFAULTS.get(mt, {}), **data}, source)
    fields = _map(r, mt)
    if fields.get("positions", "rope") != "learned" and "max_positions" not in fields:
        # RoPE has no table, but the context a model was trained for is worth a warning past it.
        trained = r.get("max_position_embeddings", None, kind=int)
        if trained is not None:
            fields["max_positions"] = trained
    qc = r.get("quantization_config", None, kind=dict)
    if qc is not None:
        from lmcost.model.quant import from_hf

        fields["quant"] = from_hf(qc, source)
    left = r.leftover()
    if left:
        raise LmcostError(f"{source}: {left[0]}", f"field not understood by the {mt} mapping",
                          "remove it if it does not change the architecture, or write an lmcost YAML")
    name = str(data.get("_name_or_path") or source).rstrip("/").split("/")[-1].removesuffix(".json")
    try:
        return ArchConfig.model_validate({"name": name, "source": f"Hugging Face config.json ({mt})", **fields})
    except ValidationError as e:
        raise from_validation_error(e, source) from None


# Families whose mapping needs code of its own, each module a registry {model_type: function(reader,
# model_type) -> ArchConfig fields}: hybrids with recurrent-state layers, and families with attention
# features beyond the table (sinks, chunked attention, NoPE layers). Imported last: they use _Reader.
from lmcost.model.hf.hybrid import FAMILIES as _HYBRID  # noqa: E402
from lmcost.model.hf.special import FAMILIES as _SPECIAL  # noqa: E402

CODED_FAMILIES = {**_HYBRID, **_SPECIAL}
SUPPORTED = sorted(set(SUPPORTED) | set(CODED_FAMILIES))


def accepted_types() -> list[str]:
    """Every model_type lmcost maps: the families (SUPPORTED) and the multimodal wrappers whose decoder
    is one of them (WRAPPERS)."""
    return sorted(set(SUPPORTED) | {w for w, (inner, _) in WRAPPERS.items() if inner in SUPPORTED})


if __name__ == "__main__":  # python -m lmcost.model.hf.families: the list the README carries between its hf-types markers
    from lmcost.model.hf.verdicts import types_markdown

    print(types_markdown(accepted_types()))
