"""Hugging Face mappings of hybrid families whose recurrent layers are linear attention (a gated delta rule,
lightning attention, Kimi delta attention) beside softmax attention.

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields, called by :func:`lmcost.model.hf.families.from_hf_config`.

Accepted families, each checked exactly against transformers (tests/test_linear_attention.py,
test_params.py, test_flop_oracle.py): parameters of the default config on the meta device, matmul FLOPs
of a tiny instance in prefill and decode, and the bytes of the cache object after a prefill and a decode step.
- ``qwen3_5_text``: Qwen3.5's decoder (transformers Qwen3_5TextModel): Qwen3-Next's pre-norm layers of a
  gated DeltaNet or gated attention, each with a dense SwiGLU MLP. Its DeltaNet projects q|k|v, z, b and a
  with four GEMMs (Qwen3-Next: two, qkvz and ba) of the same total width, counted as Qwen3-Next's two;
  its multimodal RoPE (mrope_section) rotates the same partial head as 1-D RoPE.
- ``qwen3_5_moe_text``: the same with a MoE in every layer (softmax top-k, renormalised, and a
  sigmoid-gated shared expert).
The multimodal wrappers ``qwen3_5`` and ``qwen3_5_moe`` (registered in :mod:`lmcost.model.hf.hybrid`)
map to these decoders.
- ``minimax``: layers alternating softmax attention and lightning attention (a new mixer,
  :func:`lmcost.operators.linear_attention.lightning_ops`), each with Mixtral's MoE.
- ``olmo_hybrid``: gated DeltaNet layers (six projections, counted as Qwen3-Next's two of the same width)
  beside OLMo 3's attention (norms on the sublayers' outputs, q/k norms over all heads), SwiGLU MLPs.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import activation, mapped_layer_types, rotary_fraction
from lmcost.model.hf.registry import family, mapped_in


def _refuse(r, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


def gated_deltanet_fields(r) -> dict:
    """The gated DeltaNet's widths as Qwen3-Next's and Qwen3.5's configs name them (their defaults: 16 key
    heads, 32 value heads, both 128 wide, a conv of 4 taps) -> :class:`lmcost.model.mixers.GatedDeltaNet` fields."""
    return dict(n_k_heads=r.get("linear_num_key_heads", 16), n_v_heads=r.get("linear_num_value_heads", 32),
                d_k=r.get("linear_key_head_dim", 128), d_v=r.get("linear_value_head_dim", 128),
                d_conv=r.get("linear_conv_kernel_dim", 4))


def qwen_hybrid_layers(r, n_layers: int) -> tuple[int, list[str]]:
    """(num_hidden_layers, each layer's kind) of Qwen3-Next and Qwen3.5: ``layer_types``, else every
    full_attention_interval-th layer attention and the rest gated DeltaNet (their config classes'
    __post_init__). ``n_layers``: the config class's default. Raises: LmcostError naming layer_types for a
    type other than linear_attention and full_attention, or hidden_act for an activation other than SiLU
    (it is also the DeltaNet conv's)."""
    n_layers = r.get("num_hidden_layers", n_layers)
    types = r.get("layer_types", None, kind=list)
    every = r.count("full_attention_interval", 4)
    if types is None:
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
    mixers = mapped_layer_types(r, types, n_layers, {"linear_attention": "gated_deltanet", "full_attention": "global"})
    if r.get("hidden_act", "silu") != "silu":
        _refuse(r, "hidden_act", "only SiLU is modelled (the MLP's and the DeltaNet conv's activation)",
                "set hidden_act: silu")
    return n_layers, mixers


def _qwen3_5(r, d: int, n_layers: int, kv_heads: int) -> dict:
    """The fields Qwen3_5TextConfig and Qwen3_5MoeTextConfig share (their defaults differ only in the widths
    passed in): layer kinds (every full_attention_interval-th layer attention, as their __post_init__
    derives them), gated attention with per-head q/k norms and partial RoPE, the gated DeltaNet."""
    n_layers, mixers = qwen_hybrid_layers(r, n_layers)
    bias = r.get("attention_bias", False)
    return dict(d_model=r.get("hidden_size", d), n_layers=n_layers, vocab_size=r.get("vocab_size", 248320),
                attention=dict(n_heads=r.get("num_attention_heads", 16), n_kv_heads=r.get("num_key_value_heads", kv_heads),
                               head_dim=r.get("head_dim", 256), qkv_bias=bias, out_bias=bias, qk_norm="head",
                               output_gate=True),
                recurrent=dict(layer_pattern=mixers, gated_deltanet=gated_deltanet_fields(r)),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 0.25),
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("qwen3_5_text")
def qwen3_5_text(r, mt: str) -> dict:
    """Qwen3_5TextConfig -> ArchConfig fields (transformers Qwen3_5TextModel, Qwen3.5-9B's widths by default:
    pre-norm layers of a gated DeltaNet or gated attention, each with a dense SwiGLU MLP of intermediate_size)."""
    out = _qwen3_5(r, 4096, 32, 4)
    out["ffn"] = dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 12288))
    return out


@family("qwen3_5_moe_text")
def qwen3_5_moe_text(r, mt: str) -> dict:
    """Qwen3_5MoeTextConfig -> ArchConfig fields (transformers Qwen3_5MoeTextModel, Qwen3.5-35B-A3B's widths by
    default: as qwen3_5_text with a MoE in every layer: num_experts SwiGLU experts of moe_intermediate_size,
    top num_experts_per_tok, and a sigmoid-gated shared expert of shared_expert_intermediate_size)."""
    out = _qwen3_5(r, 2048, 40, 2)
    d_e = r.get("moe_intermediate_size", 512)
    out["ffn"] = dict(activation=activation(r, "hidden_act", "silu", True), d_ff=d_e)
    out["moe"] = dict(n_experts=r.get("num_experts", 256), top_k=r.get("num_experts_per_tok", 8), d_ff_expert=d_e,
                      d_ff_shared=r.get("shared_expert_intermediate_size", 512), shared_expert_gate=True)
    return out


#: MiniMaxConfig's residual weights: x * alpha + f(x) * beta after each sublayer (two multiplies per element
#: of the residual, not counted: lmcost's residual add is one FLOP per element); no parameters, no matmuls.
_MINIMAX_RESIDUAL_WEIGHTS = ("full_attn_alpha_factor", "full_attn_beta_factor", "linear_attn_alpha_factor",
                             "linear_attn_beta_factor", "mlp_alpha_factor", "mlp_beta_factor")


@family("minimax")
def minimax(r, mt: str) -> dict:
    """MiniMaxConfig -> ArchConfig fields (transformers MiniMaxModel, MiniMax-Text-01's layout at Mixtral's widths
    by default: layers alternating GQA softmax attention with RoPE and lightning attention (layer_types;
    default: even layers full), each with Mixtral's MoE (softmax top-k, renormalised). Lightning attention
    uses the attention's heads and head width. MiniMaxDecoderLayer adds its residual after the input norm
    (the residual is norm(x)): the same norms and adds as a pre-norm block.
    Refused: hidden_act other than SiLU (it is also lightning attention's q, k, v activation); a
    sliding_window (MiniMax's softmax layers mask to it, but MiniMaxCache keeps and scores every key)."""
    for key in _MINIMAX_RESIDUAL_WEIGHTS:
        r.get(key, None, kind=float)
    n_layers = r.get("num_hidden_layers", 32)
    types = r.get("layer_types", None, kind=list)
    if types is None:  # MiniMaxConfig.__post_init__
        types = ["full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n_layers)]
    mixers = mapped_layer_types(r, types, n_layers, {"linear_attention": "lightning", "full_attention": "global"})
    if r.get("hidden_act", "silu") != "silu":
        _refuse(r, "hidden_act", "only SiLU is modelled (the experts' and lightning attention's activation)",
                "set hidden_act: silu")
    if r.get("sliding_window", None, kind=int):
        _refuse(r, "sliding_window", "MiniMax's window masks scores but MiniMaxCache keeps every key (neither a "
                "global nor a local layer)", "set sliding_window to null or write an lmcost YAML")
    d, h = r.get("hidden_size", 4096), r.get("num_attention_heads", 32)
    head_dim = r.get("head_dim", None, kind=int) or d // h  # MiniMaxAttention and MiniMaxLightningAttention
    kv = r.get("num_key_value_heads", None, kind=int) or h
    d_e = r.get("intermediate_size", 14336)
    n_experts = r.get("num_local_experts", None, kind=int)
    if n_experts is None:
        n_experts = r.get("num_experts", 8)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 32000),
                attention=dict(n_heads=h, n_kv_heads=kv, head_dim=head_dim),
                ffn=dict(activation="swiglu", d_ff=d_e),
                moe=dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 2), d_ff_expert=d_e),
                recurrent=dict(layer_pattern=mixers,
                               lightning=dict(n_heads=h, head_dim=head_dim, block_size=r.get("block_size", 256))),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 1.0),
                tie_embeddings=r.get("tie_word_embeddings", False))


#: OlmoHybridConfig's initialisation ranges of A_log and dt_bias: no cost.
_OLMO_HYBRID_INIT = ("linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max", "linear_dt_init_floor")


@family("olmo_hybrid")
def olmo_hybrid(r, mt: str) -> dict:
    """OlmoHybridConfig -> ArchConfig fields (transformers OlmoHybridModel: layers of a gated DeltaNet (pre-norm,
    as Llama's layer) or OLMo 3's attention (norms on the sublayers' outputs, RMSNorm over all heads' q and
    k, RoPE when rope_parameters has a rope_theta), each with a SwiGLU MLP; layer_types, else every 4th layer
    attention). Its DeltaNet projects q, k, v, a, b and the gate with six GEMMs of Qwen3-Next's total width
    (counted as its two) and, with linear_allow_neg_eigval, doubles beta (one multiply per head and token,
    not counted). The norms after the sublayers are the same norms and FLOPs as a pre-norm block's.
    Widths OlmoHybridConfig derives when absent: KV and DeltaNet heads = num_attention_heads, d_k =
    int(0.75 * hidden_size / key heads), d_v = 2 * d_k."""
    for key in _OLMO_HYBRID_INIT:
        r.get(key, None, kind=float)
    r.get("linear_allow_neg_eigval", True)
    n_layers = r.get("num_hidden_layers", 32)
    types = r.get("layer_types", None, kind=list)
    if types is None:  # OlmoHybridConfig.__post_init__
        types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(n_layers)]
        if "full_attention" not in types:
            types[-1] = "full_attention"
    mixers = mapped_layer_types(r, types, n_layers, {"linear_attention": "gated_deltanet", "full_attention": "global"})
    if r.get("hidden_act", "silu") != "silu":
        _refuse(r, "hidden_act", "only SiLU is modelled (the MLP's and the DeltaNet conv's activation)",
                "set hidden_act: silu")
    d, h = r.get("hidden_size", 3840), r.get("num_attention_heads", 30)
    hk = r.get("linear_num_key_heads", None, kind=int) or h
    hv = r.get("linear_num_value_heads", None, kind=int) or h
    dk = r.get("linear_key_head_dim", None, kind=int) or int(0.75 * d / hk)
    dv = r.get("linear_value_head_dim", None, kind=int) or 2 * dk
    rope = r.data.get("rope_parameters") or r.data.get("rope_scaling") or {}
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 100352),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", None, kind=int) or h,
                               qkv_bias=bias, out_bias=bias, qk_norm="full"),
                ffn=dict(activation="swiglu", d_ff=r.get("intermediate_size", 11008)),
                recurrent=dict(layer_pattern=mixers,
                               gated_deltanet=dict(n_k_heads=hk, n_v_heads=hv, d_k=dk, d_v=dv,
                                                   d_conv=r.get("linear_conv_kernel_dim", 4))),
                norm="rmsnorm", block="pre_norm",
                positions="rope" if isinstance(rope, dict) and rope.get("rope_theta") is not None else "none",
                tie_embeddings=r.get("tie_word_embeddings", False))


#: The model types this file maps (tests/test_linear_attention.py walks them).
FAMILIES = mapped_in(__name__)
