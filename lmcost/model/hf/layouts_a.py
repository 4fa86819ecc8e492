"""Hugging Face mappings of MoE and attention layouts of their own, built from mechanisms lmcost already has
(per-layer dense/sparse MLPs, sliding and NoPE layers, q/k norms, sinks, shared experts, gated attention
outputs, with Beam's per-head gate bias added to the schema: ``attention.output_gate_bias``): Aria's text decoder, Beam, Cohere2-MoE, EXAONE-MoE (K-EXAONE), Flint and Hunyuan HY-V3.

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``. The reference of
each is its transformers 5.24 config class (defaults, derived ``layer_types``/``mlp_layer_types``) and model
(which weights exist, which layers rotate or slide); each was checked exactly against it: parameters on the
meta device, FlopCounterMode matmul FLOPs of a tiny instance in prefill and decode, and the KV cache
transformers allocates (tests/test_params.py, tests/test_flop_oracle.py, tests/test_layouts_a.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.attention_features import _kinds, _kv_heads, _layer_types, _period, _windowed_nope
from lmcost.model.hf.reader import Reader, activation
from lmcost.model.hf.registry import family, mapped_in


def _refuse(r: Reader, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


def mlp_dense_layers(r: Reader, n_layers: int, default: list[str]) -> list[int]:
    """The dense layers of ``mlp_layer_types`` (one "dense" or "sparse" per layer), or of ``default`` (the
    config class's derivation) when absent. Raises: LmcostError for another entry or another length."""
    types = r.get("mlp_layer_types", None, kind=list)
    if types is None:
        types = default
    if len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
        _refuse(r, "mlp_layer_types", f"must be {n_layers} entries of \"dense\" or \"sparse\"",
                "give one entry per layer, or remove mlp_layer_types")
    return [i for i, t in enumerate(types) if t == "dense"]


def _with_moe(out: dict, moe: dict, n_layers: int) -> dict:
    """``out`` with its ``moe`` section when a layer is sparse (every layer dense: a dense model)."""
    if len(moe["dense_layers"]) < n_layers:
        out["moe"] = moe
    return out


def _window(r: Reader, default: int) -> int | None:
    """sliding_window, the class default when absent; an explicit null is no window (not the default)."""
    if "sliding_window" in r.data and r.data["sliding_window"] is None:
        r.used.add("sliding_window")
        return None
    return r.get("sliding_window", default, kind=int)


def _silu_only(r: Reader, mt: str, why: str) -> str:
    act = r.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        _refuse(r, "hidden_act", f"activation {act!r:.40} is not modelled for {mt} ({why})", "use silu")
    return "swiglu"


@family("cohere2_moe")
def cohere2_moe(r: Reader, mt: str) -> dict:
    """Cohere2-MoE (transformers Cohere2MoeConfig/Cohere2MoeForCausalLM; Command A+): Cohere2's parallel block
    (one norm feeding attention and the MLP: RMSNorm when rms_norm_eps is set, else a LayerNorm without bias),
    sliding-window layers with RoPE and every sliding_window_pattern-th layer global without RoPE, a prefix of
    first_k_dense_replace dense layers (their own period, prefix_dense_sliding_window_pattern; with a period of
    1 they are global and rotate, Cohere2MoeAttention.force_rope), dense MLPs of prefix_dense_intermediate_size
    (null: intermediate_size), then Mixtral-style experts of intermediate_size with num_shared_experts shared
    ones fused into one gated MLP of intermediate_size x num_shared_experts, averaged with (or added to) the
    routed output (an elementwise op). q/k/v/o bias attention_bias; logit_scale scales the logits (not counted).
    Raises: LmcostError for sliding layers without a sliding_window, or an expert selection it does not know.
    """
    n_layers = r.get("num_hidden_layers", 40)
    h = r.get("num_attention_heads", 64)
    d = r.get("hidden_size", 8192)
    r.get("logit_scale", 0.0625, kind=float)
    d_ff = r.get("intermediate_size", 22528)
    # a kwarg the config class pops (its derivations read it) and does not keep
    first_dense = r.get("first_k_dense_replace", 0, kind=int)
    prefix_every, every = r.count("prefix_dense_sliding_window_pattern", 1), r.count("sliding_window_pattern", 4)
    derived = (["local" if (i + 1) % prefix_every else "global" for i in range(min(first_dense, n_layers))]
               + ["local" if (i + 1) % every else "global" for i in range(n_layers - first_dense)])
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"), derived)
    dense = mlp_dense_layers(r, n_layers, ["dense" if i < first_dense else "sparse" for i in range(n_layers)])
    window = _window(r, 4096)
    if "local" in masks and window is None:
        _refuse(r, "sliding_window", "missing, but layer_types has sliding layers (the model would neither slide "
                "nor rotate them)", "set sliding_window (4096) or make those layers full_attention")
    rope = [m == "local" or (i in dense and prefix_every == 1) for i, m in enumerate(masks)]
    for key, allowed in (("expert_selection_fn", ("softmax", "sigmoid")),
                         ("shared_expert_combination_strategy", ("average", "sum"))):
        if r.get(key, allowed[0]) not in allowed:
            _refuse(r, key, f"{r.data[key]!r:.40} is not one of {', '.join(allowed)}", f"use {allowed[0]}")
    bias = r.get("attention_bias", False)
    norm = "layernorm" if r.get("rms_norm_eps", None, kind=float) is None else "rmsnorm"
    shared = r.get("num_shared_experts", 0)
    moe = dict(n_experts=r.get("num_experts", 8), top_k=r.get("num_experts_per_tok", 2), d_ff_expert=d_ff,
               dense_layers=dense)
    if shared:
        moe["d_ff_shared"] = d_ff * shared
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 256000),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=r.get("head_dim", 128),
                              qkv_bias=bias, out_bias=bias, sliding_window=window if "local" in masks else None,
                              layer_pattern=_period(_kinds(masks, rope))),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True),
                        d_ff=r.get("prefix_dense_intermediate_size", None, kind=int) or d_ff),
               norm=norm, norm_bias=False, block="parallel", parallel_shared_norm=True, positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", True))
    return _with_moe(out, moe, n_layers)


@family("exaone_moe")
def exaone_moe(r: Reader, mt: str) -> dict:
    """EXAONE-MoE (K-EXAONE; transformers ExaoneMoeConfig/ExaoneMoeForCausalLM): EXAONE-4 attention (per-head
    RMSNorm on q and k; sliding-window layers with RoPE, every sliding_window_pattern-th layer global without
    RoPE, as layer_types) in OLMoE's pre-norm block, the first first_k_dense_replace layers (or
    mlp_layer_types) a dense SwiGLU MLP of intermediate_size, the others DeepSeek-V3-style experts:
    num_experts of moe_intermediate_size (top num_experts_per_tok, sigmoid router whose correction bias is a
    buffer, not a parameter) and num_shared_experts shared ones fused into one MLP. No biases, untied lm_head.
    Raises: LmcostError without a sliding_window (ExaoneMoeConfig cannot derive its layers then)."""
    n_layers = r.get("num_hidden_layers", 32)
    h = r.get("num_attention_heads", 32)
    kinds, window = _windowed_nope(r, n_layers, 4)
    first_dense = r.get("first_k_dense_replace", 1, kind=int)
    dense = mlp_dense_layers(r, n_layers, ["dense" if i < first_dense else "sparse" for i in range(n_layers)])
    moe = dict(n_experts=r.get("num_experts", 64), top_k=r.get("num_experts_per_tok", 8),
               d_ff_expert=r.get("moe_intermediate_size", 1024), n_shared_experts=r.get("num_shared_experts", 1),
               dense_layers=dense)
    out = dict(d_model=r.get("hidden_size", 4096), n_layers=n_layers, vocab_size=r.get("vocab_size", 102400),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 32), head_dim=r.get("head_dim", None, kind=int),
                              qk_norm="head", sliding_window=window, layer_pattern=_period(kinds)),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 16384)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", False))
    return _with_moe(out, moe, n_layers)


@family("hy_v3")
def hy_v3(r: Reader, mt: str) -> dict:
    """Hunyuan HY-V3 (Hy3-preview; transformers HYV3Config/HYV3ForCausalLM): Llama attention with per-head
    RMSNorm on q and k (Apertus's) and a q/k/v/o bias by attention_bias, pre-norm blocks, the layers of
    mlp_layer_types (derived: the first dense) a SwiGLU MLP of intermediate_size, the others num_experts
    (alias num_local_experts) experts of moe_intermediate_size (top num_experts_per_tok, sigmoid router; its
    correction bias a buffer) plus a shared SwiGLU MLP of moe_intermediate_size x num_shared_experts (0:
    intermediate_size, as HYV3MLP's ``intermediate_size or config.intermediate_size`` reads it). No sliding
    windows. router_scaling_factor and enable_moe_fp32_combine change no count.
    Raises: LmcostError for mlp_bias (a bias on the dense and shared MLPs, not on the experts: not modelled)."""
    r.must_not("mlp_bias", "a bias on the dense and shared MLPs (the routed experts have none)")
    r.get("router_scaling_factor", None, kind=float)
    r.get("enable_moe_fp32_combine", True)
    n_layers = r.get("num_hidden_layers", 80)
    h = r.get("num_attention_heads", 64)
    d_ff = r.get("intermediate_size", 13312)
    n_experts = r.get("num_experts", None, kind=int) or r.get("num_local_experts", 192, kind=int)
    d_e = r.get("moe_intermediate_size", 1536)
    dense = mlp_dense_layers(r, n_layers, ["dense"] + ["sparse"] * (n_layers - 1))
    bias = r.get("attention_bias", False)
    moe = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 8), d_ff_expert=d_e,
               d_ff_shared=d_e * r.get("num_shared_experts", 1) or d_ff, dense_layers=dense)
    out = dict(d_model=r.get("hidden_size", 4096), n_layers=n_layers, vocab_size=r.get("vocab_size", 120832),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 8), head_dim=r.get("head_dim", 128),
                              qkv_bias=bias, out_bias=bias, qk_norm="head"),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=d_ff),
               norm="rmsnorm", block="pre_norm", positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", False))
    return _with_moe(out, moe, n_layers)


@family("aria_text")
def aria_text(r: Reader, mt: str) -> dict:
    """Aria's text decoder (rhymes-ai/Aria; transformers AriaTextConfig/AriaTextForCausalLM): Llama attention
    (q/k/v/o bias attention_bias), every layer a mixture of moe_num_experts SiLU-gated experts of
    intermediate_size (top moe_topk, softmax over the chosen logits) plus a shared gated MLP of
    intermediate_size x moe_num_shared_experts. Raises: LmcostError for mlp_bias (a bias on the shared MLP
    only) and for a hidden_act other than SiLU (the routed experts are always SiLU-gated, the shared one
    follows hidden_act: one activation is modelled per model)."""
    r.must_not("mlp_bias", "a bias on the shared experts' MLP (the routed experts have none)")
    n_layers = r.get("num_hidden_layers", 32)
    h = r.get("num_attention_heads", 32)
    d_ff = r.get("intermediate_size", 4096)
    bias = r.get("attention_bias", False)
    moe = dict(n_experts=r.get("moe_num_experts", 8), top_k=r.get("moe_topk", 2), d_ff_expert=d_ff)
    shared = r.get("moe_num_shared_experts", 2)
    if shared:
        moe["d_ff_shared"] = d_ff * shared
    return dict(d_model=r.get("hidden_size", 4096), n_layers=n_layers, vocab_size=r.get("vocab_size", 32000),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=r.get("head_dim", None, kind=int),
                               qkv_bias=bias, out_bias=bias),
                ffn=dict(activation=_silu_only(r, mt, "its routed experts are always SiLU-gated"), d_ff=d_ff),
                moe=moe, norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("flint")
def flint(r: Reader, mt: str) -> dict:
    """Flint (RecursiveSI/flint; transformers FlintConfig/FlintForCausalLM): Qwen3-MoE attention (per-head
    RMSNorm on q and k, q/k/v/o bias attention_bias) with a learned sink logit per head (gpt-oss's), global
    layers without RoPE (the first two, every fourth from layer 1 and the last, as layer_types) and
    sliding-window layers with it; dense SwiGLU MLPs of intermediate_size on mlp_only_layers (default 0 and
    1) and off decoder_sparse_step, the other layers num_experts experts of moe_intermediate_size (top
    num_experts_per_tok, sigmoid router) plus an ungated shared SwiGLU MLP of shared_expert_intermediate_size.
    Raises: LmcostError for sliding layers without a sliding_window."""
    n_layers = r.get("num_hidden_layers", 49)
    h = r.get("num_attention_heads", 32)
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"),
                         ["global" if i < 2 or i % 4 == 1 or i == n_layers - 1 else "local" for i in range(n_layers)])
    window = _window(r, 513)
    if "local" in masks and window is None:
        _refuse(r, "sliding_window", "missing, but layer_types has sliding layers (the model would neither slide "
                "nor rotate them)", "set sliding_window (513) or make those layers full_attention")
    only = r.get("mlp_only_layers", None, kind=list)
    only = [0, 1] if only is None else r.layers("mlp_only_layers", n_layers)
    step, n_experts = r.count("decoder_sparse_step", 1), r.get("num_experts", 256)
    dense = [i for i in range(n_layers) if i in only or n_experts == 0 or (i + 1) % step]
    bias = r.get("attention_bias", False)
    moe = dict(n_experts=max(n_experts, 1), top_k=r.get("num_experts_per_tok", 6),
               d_ff_expert=r.get("moe_intermediate_size", 512), dense_layers=dense)
    shared = r.get("shared_expert_intermediate_size", 1024)
    if shared:
        moe["d_ff_shared"] = shared
    out = dict(d_model=r.get("hidden_size", 2048), n_layers=n_layers, vocab_size=r.get("vocab_size", 150144),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=r.get("head_dim", 128),
                              qkv_bias=bias, out_bias=bias, qk_norm="head", sinks=True,
                              sliding_window=window if "local" in masks else None,
                              layer_pattern=_period([m if m == "local" else "global_nope" for m in masks])),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 6144)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", False))
    return _with_moe(out, moe, n_layers)


def _beam_rope(r: Reader, masks: list[str]) -> list[bool]:
    """Per layer whether Beam rotates it: rope_parameters is keyed by layer type, and a type whose entry is null
    runs without positions (BeamModel; the class default: sliding layers rotate, full layers do not).
    Raises: LmcostError for a rope_parameters not keyed by layer type (BeamModel indexes it by type)."""
    rope = r.get("rope_parameters", None, kind=dict)
    if rope is None:
        rope = {"sliding_attention": {}, "full_attention": None}
    types = {"local": "sliding_attention", "global": "full_attention"}
    missing = [types[m] for m in masks if types[m] not in rope]
    if missing or any(k not in types.values() for k in rope):
        _refuse(r, "rope_parameters", "must be keyed by layer type (sliding_attention, full_attention), "
                "each a RoPE set or null (no positions)", "write it as BeamConfig does, or remove it")
    return [rope[types[m]] is not None for m in masks]


@family("beam")
def beam(r: Reader, mt: str) -> dict:
    """Beam (reflection/Beam-1.0; transformers BeamConfig/BeamForCausalLM): Qwen3-MoE attention (per-head RMSNorm
    on q and k, no bias) with a sigmoid output gate from its own gate_proj [d, h*d_h] plus a
    bias per head (gate_bias [h]: lmcost's output_gate, whose q_proj carries the gate's columns, and
    output_gate_bias); sliding-window layers with RoPE and every 6th and the last layer full attention without
    RoPE (rope_parameters null for the type), whose queries are scaled by (1 + (pos + 1)/2048)^0.1 (counted as
    the temperature tuning of NoPE layers: one multiply per query element); norms before and after each
    sublayer (sandwich), the residual adds scaled by depth (scalars, not counted); the layers of
    mlp_layer_types (derived: the first 3) a SwiGLU MLP of intermediate_size, the others num_experts experts of
    moe_intermediate_size (top num_experts_per_tok, DeepSeek-V3's grouped sigmoid router, its correction bias
    a buffer); the logits soft-capped at final_logit_softcapping.
    Raises: LmcostError for sliding layers without a sliding_window, rope_parameters not keyed by layer type, or
    attention_bias (on q, k, v and o but not on the gate: not modelled)."""
    n_layers = r.get("num_hidden_layers", 52)
    h = r.get("num_attention_heads", 48)
    derived = ["local" if (i + 1) % 6 else "global" for i in range(n_layers)]
    derived[-1] = "global"
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"), derived)
    window = _window(r, 512)
    if "local" in masks and window is None:
        _refuse(r, "sliding_window", "missing, but layer_types has sliding layers", "set sliding_window (512)")
    rope = _beam_rope(r, masks)
    dense = mlp_dense_layers(r, n_layers, ["dense" if i < 3 else "sparse" for i in range(n_layers)])
    cap = r.get("final_logit_softcapping", None, kind=float) if "final_logit_softcapping" in r.data else 30.0
    # q/k/v/o take it, the gate_proj does not: lmcost's gated q_proj would carry it on the gate's columns too
    r.must_not("attention_bias", "a bias on q, k, v and o but not on the output gate's projection")
    moe = dict(n_experts=r.get("num_experts", 256), top_k=r.get("num_experts_per_tok", 8),
               d_ff_expert=r.get("moe_intermediate_size", 2560), dense_layers=dense)
    out = dict(d_model=r.get("hidden_size", 5120), n_layers=n_layers, vocab_size=r.get("vocab_size", 151936),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8), head_dim=r.get("head_dim", 128),
                              qk_norm="head", output_gate=True, output_gate_bias=True,
                              temperature_tuning=not all(rope),
                              sliding_window=window if "local" in masks else None,
                              layer_pattern=_period(_kinds(masks, rope))),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 20480)),
               norm="rmsnorm", block="sandwich", positions="rope", final_logit_softcap=cap,
               tie_embeddings=r.get("tie_word_embeddings", False))
    return _with_moe(out, moe, n_layers)


#: The model types this file maps (tests/test_layouts_a.py walks them).
FAMILIES = mapped_in(__name__)
