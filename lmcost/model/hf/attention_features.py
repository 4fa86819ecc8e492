"""Hugging Face mappings of families whose attention needs more than a table entry
(:class:`lmcost.model.hf.llama_like.FamilySpec`): attention sinks, chunked local attention, NoPE layers.

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields, called by :func:`lmcost.model.hf.families.from_hf_config`; the reader
(:class:`lmcost.model.hf.reader.Reader`) records the keys used, so a key no mapping reads is still refused.

The reference for each mapping is the family's transformers config class (defaults, derived fields) and
model (which weights exist, which layers apply RoPE or a window); each was checked exactly against it:
parameters on the meta device, FlopCounterMode matmul FLOPs of a tiny instance and the KV cache
transformers allocates (tests/test_attention_features.py, tests/test_params.py, tests/test_flop_oracle.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import activation, mapped_layer_types
from lmcost.model.hf.registry import Wrapper, family, register

#: transformers' layer_types -> the mask of lmcost's attention kinds (:data:`lmcost.model.config.ATTENTION_KINDS`).
_MASKS = {"full_attention": "global", "sliding_attention": "local", "chunked_attention": "chunked"}


def _period(kinds: list[str]) -> list[str]:
    """The shortest pattern p with kinds[i] == p[i % len(p)] for every layer (layer_pattern repeats)."""
    for n in range(1, len(kinds) + 1):
        if all(k == kinds[i % n] for i, k in enumerate(kinds)):
            return kinds[:n]
    return kinds


def _layer_types(r, n_layers: int, allowed: tuple[str, ...], default: list[str]) -> list[str]:
    """``layer_types`` as a list of masks (global/local/chunked), or ``default`` (the config class's
    derivation) when absent. Raises: LmcostError for a wrong length or a type the family's model lacks."""
    types = r.get("layer_types", None, kind=list)
    if types is None:
        return default
    return mapped_layer_types(r, types, n_layers, {t: _MASKS[t] for t in allowed})


def _rope_flags(r, n_layers: int) -> list[bool]:
    """Per layer whether it applies RoPE: ``no_rope_layers`` (1: RoPE, 0: NoPE, despite its name) or, absent
    or empty, every ``no_rope_layer_interval``-th layer without (Llama4TextConfig, SmolLM3Config)."""
    flags = r.get("no_rope_layers", None, kind=list)
    every = r.get("no_rope_layer_interval", 4)
    if not flags:  # Llama4TextConfig: an empty list also takes the default
        every = r.count("no_rope_layer_interval", 4)
        return [(i + 1) % every != 0 for i in range(n_layers)]
    if len(flags) != n_layers or any(f not in (0, 1) or isinstance(f, bool) for f in flags):
        raise LmcostError(f"{r.source}: no_rope_layers", f"must be {n_layers} entries of 0 or 1",
                          "give 1 (RoPE) or 0 (NoPE) per layer, or remove it")
    return [f == 1 for f in flags]


def _kv_heads(r, h: int, default: int) -> int:
    """num_key_value_heads: the class default when absent; an explicit null means MHA (the config classes'
    __post_init__ set it to num_attention_heads)."""
    if "num_key_value_heads" in r.data and r.data["num_key_value_heads"] is None:
        r.used.add("num_key_value_heads")
        return h
    return r.get("num_key_value_heads", default)


def _kinds(masks: list[str], rope: list[bool]) -> list[str]:
    return [m if on else f"{m}_nope" for m, on in zip(masks, rope)]


@family("gpt_oss")
def gpt_oss(r, mt: str) -> dict:
    """gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b model card", arXiv 2508.10925, section 2;
    transformers GptOssConfig/GptOssForCausalLM): GQA with a bias on q, k, v and o (attention_bias),
    a learned sink logit per head, layers alternating sliding (sliding_window, 128) and full attention
    (layer_types; derived: even layers slide), every layer a mixture of experts with a router bias and
    per-expert biases (gate_up_proj_bias [E, 2*d_ff], down_proj_bias [E, d]), the clamped SwiGLU
    (swiglu_limit, swiglu_alpha), no shared expert, untied lm_head.

    Keys read without a cost: hidden_act (GptOssExperts applies its own SwiGLU whatever it says),
    experts_per_token (a duplicate of num_experts_per_tok in the published config.json that GptOssConfig
    does not read; it must agree), initial_context_length (the pre-YaRN context, a RoPE parameter).
    """
    n_layers = r.get("num_hidden_layers", 36)
    h = r.get("num_attention_heads", 64)
    d = r.get("hidden_size", 2880)
    head_dim = r.get("head_dim", 64)
    if "head_dim" in r.data and r.data["head_dim"] is None:
        head_dim = d // h  # GptOssConfig: an explicit null derives hidden_size // heads
    r.get("hidden_act", "silu", kind=str)
    r.get("initial_context_length", None, kind=int)
    top_k = r.get("num_experts_per_tok", 4)
    dup = r.get("experts_per_token", None, kind=int)
    if dup is not None and dup != top_k:
        raise LmcostError(f"{r.source}: experts_per_token", f"{dup} differs from num_experts_per_tok={top_k}, "
                          "which the model uses", "remove experts_per_token or make the two agree")
    window = r.get("sliding_window", 128, kind=int)
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"),
                         ["local" if (i + 1) % 2 else "global" for i in range(n_layers)])
    if window is None:
        masks = ["global"] * n_layers  # GptOssAttention: a sliding layer without a window sees every key
    bias = r.get("attention_bias", True)
    d_ff = r.get("intermediate_size", 2880)
    limit, alpha = r.get("swiglu_limit", 7.0, kind=float), r.get("swiglu_alpha", 1.702, kind=float)
    n_experts = r.get("num_local_experts", None, kind=int)
    if n_experts is None:
        n_experts = r.get("num_experts", 128, kind=int)  # attribute_map alias
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 201088),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 8), head_dim=head_dim,
                               qkv_bias=bias, out_bias=bias, sinks=True,
                               sliding_window=window if "local" in masks else None, layer_pattern=_period(masks)),
                ffn=dict(activation="swiglu", d_ff=d_ff, swiglu_limit=float(limit), swiglu_alpha=float(alpha)),
                moe=dict(n_experts=n_experts, top_k=top_k, d_ff_expert=d_ff, router_bias=True, expert_bias=True),
                norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("llama4_text")
def llama4_text(r, mt: str) -> dict:
    """Llama 4's text model (transformers Llama4TextConfig/Llama4ForCausalLM; Meta's Llama-4-Scout and
    Maverick): chunked local attention (attention_chunk_size) on the RoPE layers and global NoPE layers
    (no_rope_layers / no_rope_layer_interval; layer_types as Llama4TextConfig derives it), an L2 qk-norm
    without weights on the RoPE layers (use_qk_norm), temperature tuning of the queries on the NoPE layers
    (attn_temperature_tuning; floor_scale and attn_scale change no count), MoE layers (moe_layers, or every
    interleave_moe_layer_step-th) of num_local_experts routed experts of intermediate_size (top
    num_experts_per_tok, sigmoid gate) plus one shared expert of the same width, dense layers of
    intermediate_size_mlp.

    Not modelled: Llama4TextMoe multiplies each expert's input by its router score instead of its output
    (an elementwise op of the same size) and, in transformers, runs every expert on every token (a dense
    bmm): lmcost counts the top-k dispatch a serving engine runs. Raises: LmcostError for chunked layers
    without attention_chunk_size, or layer types other than full/chunked.
    """
    n_layers = r.get("num_hidden_layers", 48)
    h = r.get("num_attention_heads", 40)
    d = r.get("hidden_size", 5120)
    head_dim = r.get("head_dim", 128)
    if "head_dim" in r.data and r.data["head_dim"] is None:
        head_dim = d // h
    rope = _rope_flags(r, n_layers)
    chunk = r.get("attention_chunk_size", 8192, kind=int)
    if "attention_chunk_size" in r.data and r.data["attention_chunk_size"] is None:
        chunk = None
    masks = _layer_types(r, n_layers, ("chunked_attention", "full_attention"),
                         ["chunked" if on and chunk is not None else "global" for on in rope])
    if "chunked" in masks and chunk is None:
        raise LmcostError(f"{r.source}: attention_chunk_size", "missing, but layer_types has chunked layers",
                          "set attention_chunk_size (8192 for Llama 4) or make those layers full_attention")
    r.get("floor_scale", 8192, kind=float)
    r.get("attn_scale", 0.1, kind=float)
    step = r.count("interleave_moe_layer_step", 1)
    moe_layers = r.get("moe_layers", None, kind=list)
    if moe_layers is None:
        moe_layers = list(range(step - 1, n_layers, step))
    d_e = r.get("intermediate_size", 8192)
    act = r.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise LmcostError(f"{r.source}: hidden_act", f"activation {act!r:.40} is not modelled for llama4_text",
                          "use silu")
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 202048),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 8), head_dim=head_dim,
                              qkv_bias=r.get("attention_bias", False), out_bias=r.get("attention_bias", False),
                              qk_norm="l2" if r.get("use_qk_norm", True) else "none",
                              chunk_size=chunk if "chunked" in masks else None,
                              temperature_tuning=r.get("attn_temperature_tuning", True),
                              layer_pattern=_period(_kinds(masks, rope))),
               ffn=dict(activation="swiglu", d_ff=r.get("intermediate_size_mlp", 16384)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", False))
    if any(not isinstance(i, int) or isinstance(i, bool) for i in moe_layers):
        raise LmcostError(f"{r.source}: moe_layers", "must be a list of layer indices", "list whole numbers")
    if any(0 <= i < n_layers for i in moe_layers):
        out["moe"] = dict(n_experts=r.get("num_local_experts", 16), top_k=r.get("num_experts_per_tok", 1),
                          d_ff_expert=d_e, n_shared_experts=1,
                          dense_layers=[i for i in range(n_layers) if i not in moe_layers])
    return out


@family("smollm3")
def smollm3(r, mt: str) -> dict:
    """SmolLM3 (transformers SmolLM3Config/SmolLM3ForCausalLM; HuggingFaceTB/SmolLM3-3B): Llama with
    every no_rope_layer_interval-th layer (or per no_rope_layers) without RoPE, sliding windows (with
    use_sliding_window) on the NoPE layers as SmolLM3Config derives layer_types, bias flags attention_bias
    (q, k, v, o) and mlp_bias, tied embeddings by default.

    Raises: LmcostError for sliding layers while use_sliding_window is false (transformers would give such a
    layer a sliding cache but global attention).
    """
    n_layers = r.get("num_hidden_layers", 36)
    h = r.get("num_attention_heads", 16)
    d = r.get("hidden_size", 2048)
    head_dim = r.get("head_dim", None, kind=int)  # SmolLM3Attention: getattr(config, "head_dim", d // h)
    rope = _rope_flags(r, n_layers)
    use_window = r.get("use_sliding_window", False)
    window = r.get("sliding_window", None, kind=int)
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"),
                         ["local" if (use_window and window is not None and not on) else "global" for on in rope])
    if "local" in masks and not (use_window and window is not None):
        raise LmcostError(f"{r.source}: layer_types", "has sliding layers, but use_sliding_window is false or "
                          "sliding_window is missing", "set use_sliding_window and sliding_window, or use full_attention")
    act = r.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise LmcostError(f"{r.source}: hidden_act", f"activation {act!r:.40} is not modelled for smollm3", "use silu")
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 128256),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=head_dim,
                               qkv_bias=bias, out_bias=bias, sliding_window=window if "local" in masks else None,
                               layer_pattern=_period(_kinds(masks, rope))),
                ffn=dict(activation="swiglu", d_ff=r.get("intermediate_size", 11008), bias=r.get("mlp_bias", False)),
                norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", True))


def _gated(r, model_type: str) -> str:
    """hidden_act of a gated MLP (gate_proj, up_proj, down_proj, no bias), as lmcost's gated activation."""
    return activation(r, "hidden_act", "silu", True)


def _windowed_nope(r, n_layers: int, every_default: int) -> tuple[list[str], int | None]:
    """Cohere2/EXAONE-4 layers: layer_types (or every sliding_window_pattern-th layer full, the configs'
    derivation), sliding layers with RoPE and full layers without (both models rotate only on sliding layers
    when a window is set). Raises: LmcostError for sliding layers without a window."""
    window = r.get("sliding_window", 4096, kind=int)
    if "sliding_window" in r.data and r.data["sliding_window"] is None:
        window = None
    every = r.data.get("sliding_window_pattern", r.data.get("_sliding_window_pattern", every_default))
    r.used.update({"sliding_window_pattern", "_sliding_window_pattern"})
    default = None
    if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
        default = ["local" if (i + 1) % every else "global" for i in range(n_layers)]
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"), default)
    if masks is None:
        raise LmcostError(f"{r.source}: sliding_window_pattern", f"must be a whole number >= 1, got {every!r:.40}",
                          "give layer_types, or the period of the full-attention layers (4)")
    if window is None:
        raise LmcostError(f"{r.source}: sliding_window", "missing: the model would apply neither windows nor the "
                          "NoPE layers its layer types describe", "set sliding_window (4096) or write an lmcost YAML")
    kinds = [m if m == "local" else "global_nope" for m in masks]
    return kinds, (window if "local" in masks else None)


@family("cohere2")
def cohere2(r, mt: str) -> dict:
    """Cohere2 (Command R7B, Command A; transformers Cohere2Config/Cohere2ForCausalLM): Cohere's parallel block
    (one LayerNorm without bias feeding attention and MLP), sliding-window layers with RoPE and every
    4th layer (layer_types) global without RoPE, q/k/v/o bias attention_bias, tied embeddings by default.
    head_dim: Cohere2Config always sets hidden_size // heads (a head_dim key is overridden); logit_scale
    multiplies the logits by a scalar (not counted, as for cohere)."""
    n_layers = r.get("num_hidden_layers", 40)
    h = r.get("num_attention_heads", 64)
    d = r.get("hidden_size", 8192)
    r.get("head_dim", None, kind=int)
    r.get("logit_scale", 0.0625, kind=float)
    kinds, window = _windowed_nope(r, n_layers, 4)
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 256000),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 64), head_dim=d // h, qkv_bias=bias,
                               out_bias=bias, sliding_window=window, layer_pattern=_period(kinds)),
                ffn=dict(activation=_gated(r, mt), d_ff=r.get("intermediate_size", 22528)),
                norm="layernorm", norm_bias=False, block="parallel", parallel_shared_norm=True, positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("exaone4")
def exaone4(r, mt: str) -> dict:
    """EXAONE 4.0 (transformers Exaone4Config/Exaone4ForCausalLM): per-head RMSNorm on q and k, OLMo-2's
    norms on the sublayer outputs (post_norm), sliding-window layers with RoPE and every
    sliding_window_pattern-th layer (layer_types) global without RoPE, no biases, untied lm_head.
    Raises: LmcostError without a sliding_window (Exaone4Config cannot derive its layers then)."""
    n_layers = r.get("num_hidden_layers", 32)
    h = r.get("num_attention_heads", 32)
    kinds, window = _windowed_nope(r, n_layers, 4)
    return dict(d_model=r.get("hidden_size", 4096), n_layers=n_layers, vocab_size=r.get("vocab_size", 102400),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 32), head_dim=r.get("head_dim", None, kind=int),
                               qk_norm="head", sliding_window=window, layer_pattern=_period(kinds)),
                ffn=dict(activation=_gated(r, mt), d_ff=r.get("intermediate_size", 16384)),
                norm="rmsnorm", block="post_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", False))


#: Llama 4's multimodal wrapper: Llama4ForCausalLM is the text decoder alone, so its text_config ties.
register(Wrapper(model_type="llama4", text_type="llama4_text", ties=False))
