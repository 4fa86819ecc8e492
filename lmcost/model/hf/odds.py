"""Hugging Face mappings of decoders with a layout of their own, each needing one small mechanism:
MiMo-V2-Flash's value heads narrower than its query/key heads, with more KV heads and sinks on its sliding layers
(:mod:`lmcost.operators.layer_heads`), JetMoE's mixture of attention heads
(:mod:`lmcost.operators.mixture_of_attention`), and Doge's dynamic mask attention and learned residual scales
(:mod:`lmcost.operators.dynamic_mask`, :mod:`lmcost.operators.residual_scale`).

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields, called by :func:`lmcost.model.hf.families.from_hf_config`; the reader records
the keys used, so a key no mapping reads is still refused. The reference for each is the family's transformers
5.24 config class (defaults, derived fields) and model (which weights exist); each is checked exactly against
it: parameters on the meta device (tests/test_params.py), FlopCounterMode matmul FLOPs of a tiny instance in
prefill and decode (tests/test_flop_oracle.py), and the bytes of the cache object transformers fills
(tests/test_odds.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.layouts_b import _dense_layers, _kv_heads, _period, _rotary_of, _windows
from lmcost.model.hf.reader import Reader, activation, rotary_fraction
from lmcost.model.hf.registry import family, mapped_in


@family("mimo_v2_flash")
def mimo_v2_flash(r: Reader, mt: str) -> dict:
    """MiMo-V2-Flash (XiaomiMiMo/MiMo-V2-Flash; transformers MiMoV2FlashConfig/MiMoV2FlashForCausalLM): GQA with
    q/k heads of head_dim and value heads of v_head_dim (v_proj [d, h_kv*v_head_dim], o_proj [h*v_head_dim, d],
    no bias on o; a bias on q, k, v with attention_bias); the sliding_attention layers of layer_types (default:
    layer 0 and every 6th full, the rest sliding) have twice num_key_value_heads and a learned sink per head.
    Per mlp_layer_types (default the first dense) a SwiGLU MLP of intermediate_size, or n_routed_experts (alias
    num_local_experts) of moe_intermediate_size, top num_experts_per_tok, with DeepSeek-V3's sigmoid router (its
    correction bias is a buffer) and no shared expert. RoPE per layer type (partial_rotary_factor, default 0.334).

    The window: sliding_window, or sliding_window_size + 1 where a file gives it (the config class's rule).
    Read without a cost: attention_value_scale (a constant times each value), and first_k_dense_replace,
    n_shared_experts, use_qk_norm and num_mtp_layers, which MiMoV2FlashConfig removes from GLM-4.5's config and
    its model never reads (the MTP layers are not built: their weights are ignored on load).
    """
    n_layers = r.get("num_hidden_layers", 48)
    h = r.get("num_attention_heads", 64)
    for key in ("first_k_dense_replace", "n_shared_experts", "use_qk_norm", "num_mtp_layers"):
        r.get(key, None)
    r.get("attention_value_scale", 0.707, kind=float)
    default_kinds = ["global" if i == 0 or (i + 1) % 6 == 0 else "local" for i in range(n_layers)]
    window_size = r.get("sliding_window_size", None, kind=int)
    if window_size is not None:
        r.data = {**r.data, "sliding_window": window_size + 1}
    window, kinds = _windows(r, n_layers, 129, default_kinds)
    if window is None and "sliding_attention" in (r.get("layer_types", None, kind=list) or ["sliding_attention"]):
        raise LmcostError(f"{r.source}: sliding_window", "null, but the sliding_attention layers keep their own KV "
                          "heads and sinks: full attention with a second head layout is not modelled",
                          "give the window (129 in MiMo-V2-Flash)")
    dense = _dense_layers(r, n_layers, ["dense"] + ["sparse"] * (n_layers - 1))
    h_kv = _kv_heads(r, h, 4)
    bias = r.get("attention_bias", False)
    out = dict(d_model=r.get("hidden_size", 4096), n_layers=n_layers, vocab_size=r.get("vocab_size", 152576),
               attention=dict(n_heads=h, n_kv_heads=h_kv, head_dim=r.get("head_dim", 192),
                              v_head_dim=r.get("v_head_dim", 128), qkv_bias=bias, out_bias=False,
                              sliding_window=window, layer_pattern=_period(kinds),
                              local_kv_heads=2 * h_kv if "local" in kinds else None,
                              sinks="local" if "local" in kinds else False),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 16384)),
               norm="rmsnorm", block="pre_norm", positions="rope",
               rotary_fraction=_rotary_of(r, kinds, {"full_attention": 0.334, "sliding_attention": 0.334}),
               tie_embeddings=r.get("tie_word_embeddings", False))
    moe = dict(n_experts=r.get("n_routed_experts", r.get("num_local_experts", 256)),
               top_k=r.get("num_experts_per_tok", 8), d_ff_expert=r.get("moe_intermediate_size", 2048),
               dense_layers=dense)
    if len(dense) < n_layers:  # every layer dense: the experts' keys are read, and build nothing
        out["moe"] = moe
    return out


@family("jetmoe")
def jetmoe(r: Reader, mt: str) -> dict:
    """JetMoE (jetmoe/jetmoe-8b; transformers JetMoeConfig/JetMoeForCausalLM): every layer a mixture of attention
    heads (:mod:`lmcost.operators.mixture_of_attention`: num_local_experts query/output experts of
    num_key_value_heads heads of kv_channels (alias head_dim), top num_experts_per_tok, one kv_proj shared by them,
    a bias [d] on the output) and a MoE of num_local_experts GLU experts of intermediate_size (activation_function),
    top num_experts_per_tok, no shared expert, a bias [d] on its output; softmax routers without bias, RMSNorm
    before each, RoPE on the whole head, a tied lm_head by default.

    The query heads are num_key_value_heads * num_experts_per_tok, as JetMoeConfig derives num_attention_heads; a
    num_attention_heads in the file is kept by the config class but never read by its model: read without a cost. aux_loss_coef (the routers' load-balancing loss) costs
    nothing here.
    """
    h_kv = r.get("num_key_value_heads", 16)
    top_k = r.get("num_experts_per_tok", 2)
    n_experts = r.get("num_local_experts", 8)
    r.get("num_attention_heads", None)
    r.get("aux_loss_coef", 0.01, kind=float)  # the load-balancing loss's weight: training only
    d_h = r.get("kv_channels", r.get("head_dim", 128))
    d_ff = r.get("intermediate_size", 5632)
    return dict(d_model=r.get("hidden_size", 2048), n_layers=r.get("num_hidden_layers", 12),
                vocab_size=r.get("vocab_size", 32000),
                attention=dict(n_heads=h_kv * top_k, n_kv_heads=h_kv, head_dim=d_h, out_bias=True,
                               moa_experts=n_experts),
                ffn=dict(activation=activation(r, "activation_function", "silu", True), d_ff=d_ff),
                moe=dict(n_experts=n_experts, top_k=top_k, d_ff_expert=d_ff, output_bias=True),
                norm="rmsnorm", block="pre_norm", positions="rope", tie_embeddings=r.get("tie_word_embeddings", True))


@family("doge")
def doge(r: Reader, mt: str) -> dict:
    """Doge (SmallDoge/Doge-320M; transformers DogeConfig/DogeForCausalLM): pre-norm layers of dynamic mask
    attention (:mod:`lmcost.operators.dynamic_mask`: GQA with per-head q/k RMSNorm, a bias on q, k, v, o and
    dt_proj with attention_bias, dt_proj [h_kv*d_h, h_kv] and A [h_kv]) and a SwiGLU MLP of intermediate_size (a
    bias with mlp_bias), each residual add weighting its skip by a learned [d] (:mod:`lmcost.operators.residual_scale`);
    RoPE, an untied lm_head by default. num_key_value_heads null: MHA; head_dim: hidden_size / heads unless set.

    Read without a cost: keep_window_size (transformers computes every score, then masks all but the
    keep_window_size keys of largest bias), and the cross-domain MoE's widths while is_moe is false. Refused:
    is_moe (the cross-domain MoE: product-key retrieval experts beside a shared MLP). A sliding_window makes every
    layer slide (DogeModel's one mask for all layers).
    """
    r.must_not("is_moe", "the cross-domain MoE (product-key retrieval experts of one hidden unit each)")
    for key in ("num_experts", "num_experts_per_tok", "norm_topk_prob", "router_aux_loss_coef"):
        r.get(key, None)
    r.get("keep_window_size", 2048, kind=int)
    d, h = r.get("hidden_size", 1024), r.get("num_attention_heads", 8)
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 32), vocab_size=r.get("vocab_size", 32768),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=r.get("head_dim", d // h),
                               qkv_bias=bias, out_bias=bias, qk_norm="head", dynamic_mask=True,
                               sliding_window=r.get("sliding_window", None, kind=int) or None),
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 2048),
                         bias=r.get("mlp_bias", False)),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 1.0),
                residual_scale=True, tie_embeddings=r.get("tie_word_embeddings", False))


#: The model types this file maps (tests/test_odds.py walks them).
FAMILIES = mapped_in(__name__)
