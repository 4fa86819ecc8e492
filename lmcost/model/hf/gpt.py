"""The GPT-style families, each with a mapping of its own: learned or rotary positions, LayerNorms with bias,
plain (ungated) MLPs, and the block layouts of their time (post-norm GPT-1, pre-norm GPT-2, the parallel
blocks of GPT-J, GPT-NeoX, Phi and Falcon).

Each function maps one family's config (transformers' config class: defaults, derived fields, the weights its
model builds) and was checked exactly against that model: parameters of the default config on the meta
device and FlopCounterMode matmul FLOPs of a tiny instance (tests/test_params.py, tests/test_flop_oracle.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import Reader, activation, rotary_fraction
from lmcost.model.hf.registry import family


def _gpt2_fields(r: Reader, d: int, h: int, h_kv: int, act_default: str) -> dict:
    """GPT-2's block: pre-norm, biases everywhere, learned positions (n_positions rows), d_ff n_inner or 4d."""
    return dict(d_model=d, n_layers=r.get("n_layer", 12), vocab_size=r.get("vocab_size", 50257),
                attention=dict(n_heads=h, n_kv_heads=h_kv if h_kv != h else None, qkv_bias=True, out_bias=True),
                ffn=dict(activation=activation(r, "activation_function", act_default, False),
                         d_ff=r.get("n_inner", 4 * d), bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                max_positions=r.get("n_positions", 1024), tie_embeddings=r.get("tie_word_embeddings", True))


@family("gpt2", "gpt-sw3")
def gpt2(r: Reader, mt: str) -> dict:
    """GPT-2 (Radford et al. 2019; GPT2Config). gpt-sw3 is GPT2Config and GPT2LMHeadModel under another name."""
    d, h = r.get("n_embd", 768), r.get("n_head", 12)
    return _gpt2_fields(r, d, h, h, "gelu_new")


@family("gpt_bigcode")
def gpt_bigcode(r: Reader, mt: str) -> dict:
    """GPTBigCode (StarCoder): GPT-2 with multi-query attention when multi_query (one K/V head: c_attn is d + 2 d_h
    wide). GPTBigCodeConfig overwrites num_key_value_heads from multi_query; the softmax flags set its precision,
    not its cost."""
    d, h = r.get("n_embd", 768), r.get("n_head", 12)
    h_kv = 1 if r.get("multi_query", True) else h
    r.used.update(("num_key_value_heads", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32"))
    return _gpt2_fields(r, d, h, h_kv, "gelu_pytorch_tanh")


@family("gptj", "codegen")
def gptj(r: Reader, mt: str) -> dict:
    """GPT-J and CodeGen: one LayerNorm feeding attention and MLP in parallel; RoPE on the first rotary_dim dims of
    each head (all of them if null); no attention biases (CodeGen fuses q, k, v into one GEMM of the same FLOPs);
    MLP and lm_head biases. Raises: LmcostError for a rotary_dim outside 1..head width."""
    d, h = r.get("n_embd", 4096), r.get("n_head", 16)
    r.used.add("rotary")  # EleutherAI's GPT-J-6B file says rotary: true; GPTJConfig has no such field
    rot = r.get("rotary_dim", None, kind=int) if "rotary_dim" in r.data else 64
    if rot is not None and not 0 < rot <= d // h:
        raise LmcostError(f"{r.source}: rotary_dim", f"{rot} is not in 1..{d // h} (the head width)",
                          "give the rotated width of each head, or null for all of it")
    return dict(d_model=d, n_layers=r.get("n_layer", 28), vocab_size=r.get("vocab_size", 50400),
                attention=dict(n_heads=h),
                ffn=dict(activation=activation(r, "activation_function", "gelu_new", False),
                         d_ff=r.get("n_inner", 4 * d), bias=True),
                norm="layernorm", norm_bias=True, block="parallel", positions="rope",
                rotary_fraction=(rot or d // h) / (d // h), max_positions=r.get("n_positions", 2048),
                tie_embeddings=r.get("tie_word_embeddings", False), lm_head_bias=True)


@family("openai-gpt")
def openai_gpt(r: Reader, mt: str) -> dict:
    """GPT-1 (Radford et al. 2018): post-norm blocks, learned positions, no final norm, d_ff = 4d."""
    d = r.get("n_embd", 768)
    return dict(d_model=d, n_layers=r.get("n_layer", 12), vocab_size=r.get("vocab_size", 40478),
                attention=dict(n_heads=r.get("n_head", 12), qkv_bias=True, out_bias=True),
                ffn=dict(activation=activation(r, "afn", "gelu", False), d_ff=4 * d, bias=True),
                norm="layernorm", norm_bias=True, block="post_norm", final_norm=False, positions="learned",
                max_positions=r.get("n_positions", 512), tie_embeddings=r.get("tie_word_embeddings", True))


@family("gpt_neo")
def gpt_neo(r: Reader, mt: str) -> dict:
    """GPT-Neo: GPT-2 blocks without q/k/v biases, local layers seeing the last window_size keys. GPTNeoConfig
    rebuilds attention_layers from attention_types ([[kinds, repeats], ...]).
    Raises: LmcostError for attention_types that are malformed or do not cover num_layers."""
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
                ffn=dict(activation=activation(r, "activation_function", "gelu_new", False),
                         d_ff=r.get("intermediate_size", 4 * d), bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                max_positions=r.get("max_position_embeddings", 2048),
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("opt")
def opt(r: Reader, mt: str) -> dict:
    """OPT: learned positions whose table has 2 rows more than max_position_embeddings (a padding offset:
    position_offset), pre- or post-norm by do_layer_norm_before, a final norm only with pre-norm.
    Raises: LmcostError for word_embed_proj_dim != hidden_size (the 350m model's project_in/out, not modelled)."""
    d = r.get("hidden_size", 768)
    if r.get("word_embed_proj_dim", d) != d:
        raise LmcostError(f"{r.source}: word_embed_proj_dim", "projections in and out of the embedding width "
                          "are not modelled", "set word_embed_proj_dim to hidden_size or write an lmcost YAML")
    pre = r.get("do_layer_norm_before", True)
    final = not r.get("_remove_final_layer_norm", False) and pre
    bias = r.get("enable_bias", True)
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 12), vocab_size=r.get("vocab_size", 50272),
                attention=dict(n_heads=r.get("num_attention_heads", 12), qkv_bias=bias, out_bias=bias),
                ffn=dict(activation=activation(r, "activation_function", "relu", False),
                         d_ff=r.get("ffn_dim", 3072), bias=bias),
                norm="layernorm", norm_bias=True, norm_weight=r.get("layer_norm_elementwise_affine", True),
                block="pre_norm" if pre else "post_norm", final_norm=final,
                positions="learned", max_positions=r.get("max_position_embeddings", 2048), position_offset=2,
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("biogpt")
def biogpt(r: Reader, mt: str) -> dict:
    """BioGPT: OPT's pre-norm block and offset position table (2 rows more), embeddings scaled by sqrt(d)
    (scale_embedding: one multiply, not counted), biases everywhere, tied lm_head."""
    r.get("scale_embedding", True)
    return dict(d_model=r.get("hidden_size", 1024), n_layers=r.get("num_hidden_layers", 24),
                vocab_size=r.get("vocab_size", 42384),
                attention=dict(n_heads=r.get("num_attention_heads", 16), qkv_bias=True, out_bias=True),
                ffn=dict(activation=activation(r, "hidden_act", "gelu", False),
                         d_ff=r.get("intermediate_size", 4096), bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="learned",
                max_positions=r.get("max_position_embeddings", 1024), position_offset=2,
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("phi")
def phi(r: Reader, mt: str) -> dict:
    """Phi-1/1.5/2: a parallel block behind one LayerNorm, biases everywhere (lm_head too), RoPE on
    partial_rotary_factor of each head. Raises: LmcostError for qk_layernorm (per-head LayerNorms, not modelled)."""
    r.must_not("qk_layernorm", "per-head LayerNorms on q and k")
    h = r.get("num_attention_heads", 32)
    return dict(d_model=r.get("hidden_size", 2048), n_layers=r.get("num_hidden_layers", 24),
                vocab_size=r.get("vocab_size", 51200),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h), qkv_bias=True, out_bias=True),
                ffn=dict(activation=activation(r, "hidden_act", "gelu_new", False),
                         d_ff=r.get("intermediate_size", 8192), bias=True),
                norm="layernorm", norm_bias=True, block="parallel", positions="rope",
                rotary_fraction=rotary_fraction(r, 0.5), tie_embeddings=r.get("tie_word_embeddings", False),
                lm_head_bias=True)


@family("falcon")
def falcon(r: Reader, mt: str) -> dict:
    """Falcon (FalconConfig): multi-query attention (or num_kv_heads with new_decoder_architecture), parallel
    attention and MLP behind one shared LayerNorm, or two with the new architecture (num_ln_in_parallel_attn);
    RoPE, or ALiBi with ``alibi`` (Falcon-RW)."""
    alibi = r.get("alibi", False)
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
                ffn=dict(activation=activation(r, "activation", "gelu", False),
                         d_ff=r.get("ffn_hidden_size", 4 * d), bias=bias),
                norm="layernorm", norm_bias=True, block="parallel" if parallel else "pre_norm",
                parallel_shared_norm=not (new_arch and two_norms),
                positions="alibi" if alibi else "rope", tie_embeddings=r.get("tie_word_embeddings", True))


@family("gpt_neox")
def gpt_neox(r: Reader, mt: str) -> dict:
    """GPT-NeoX (Pythia): parallel attention and MLP with a norm each (use_parallel_residual), RoPE on rotary_pct
    of each head, biases on attention (attention_bias) and the MLP."""
    bias = r.get("attention_bias", True)
    return dict(d_model=r.get("hidden_size"), n_layers=r.get("num_hidden_layers"),
                vocab_size=r.get("vocab_size"),
                attention=dict(n_heads=r.get("num_attention_heads"), qkv_bias=bias, out_bias=bias),
                ffn=dict(activation=activation(r, "hidden_act", "gelu", False),
                         d_ff=r.get("intermediate_size"), bias=True),
                norm="layernorm", norm_bias=True,
                block="parallel" if r.get("use_parallel_residual", True) else "pre_norm",
                parallel_shared_norm=False, positions="rope",
                rotary_fraction=r.get("rotary_pct", r.get("partial_rotary_factor", 0.25)),
                tie_embeddings=r.get("tie_word_embeddings", False))
