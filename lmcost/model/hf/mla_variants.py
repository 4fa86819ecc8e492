"""Hugging Face mappings of the multi-head-latent-attention and mixture-of-experts variants of their own: MLA
decoders beside DeepSeek-V2/V3 (Youtu, MiniCPM3, GLM-4.x-Lite, Sarvam, A.X-K1), LongCat-Flash (zero-computation
experts and the shortcut MoE, :mod:`lmcost.operators.moe_variants`), and two MoE decoders with sandwich norms
(Kolibri-1's windowed NoPE attention, AFMoE's gated attention).

Each registers as it is imported (:mod:`lmcost.model.hf.registry`). The reference for each mapping is its
transformers 5.24 config class (defaults, derived fields) and model (which weights exist, which layers route):
parameters on the meta device, FlopCounterMode matmul FLOPs of a tiny instance (prefill and decode) and the bytes
of the cache object it fills, exactly (tests/test_params.py, tests/test_flop_oracle.py, tests/test_mla_variants.py).
Scalar multipliers (muP's embedding, residual and logit scales; LongCat's LoRA scales) are one multiply of a
tensor each and, as Granite's, not counted.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.attention_features import _kv_heads, _layer_types, _period, _windowed_nope
from lmcost.model.hf.llama_like import FamilySpec, MoeLayout, _mla
from lmcost.model.hf.moe import deepseek_layers
from lmcost.model.hf.reader import Reader, activation, expert_count
from lmcost.model.hf.registry import family, register

#: MLA widths of each config class when its key is absent (transformers 5.24): a q_lora_rank left out means the
#: class's rank, not a plain q_proj.
_MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _mla_defaults(*widths) -> dict:
    return dict(zip(_MLA_KEYS, widths))


def mlp_layer_types(experts: int, top_k: int, d_expert: int, *, legacy: bool = False, post_norm: bool = False
                    ) -> MoeLayout:
    """DeepSeek-V3's experts (n_routed_experts, alias num_local_experts; num_experts_per_tok; moe_intermediate_size;
    n_shared_experts shared experts of that width) in the layers ``mlp_layer_types`` marks ``sparse``; absent, the
    config class's derivation: layer 0 dense, the rest sparse (Glm4MoeLiteConfig), or with ``legacy``
    first_k_dense_replace (1) and moe_layer_freq (1) as AXK1Config converts them. ``post_norm``: an RMSNorm on
    each MoE block's output (A.X-K1). Raises: LmcostError naming mlp_layer_types for a wrong length or entry."""

    def layout(r: Reader, n_layers: int, d_ff: int) -> dict | None:
        types = r.get("mlp_layer_types", None, kind=list)
        if types is None and legacy:
            first, freq = r.get("first_k_dense_replace", 1, kind=int), r.count("moe_layer_freq", 1)
            types = ["sparse" if i >= first and i % freq == 0 else "dense" for i in range(n_layers)]
        elif types is None:
            types = ["dense"] + ["sparse"] * (n_layers - 1)
        if len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise LmcostError(f"{r.source}: mlp_layer_types", f"must be {n_layers} entries of dense or sparse",
                              "give one entry per layer, or remove mlp_layer_types")
        dense = [i for i, t in enumerate(types) if t == "dense"]
        if len(dense) == n_layers:
            return None
        moe = dict(n_experts=expert_count(r, "n_routed_experts", "num_local_experts", experts),
                   top_k=r.get("num_experts_per_tok", top_k), d_ff_expert=r.get("moe_intermediate_size", d_expert),
                   n_shared_experts=r.get("n_shared_experts", 1), dense_layers=dense)
        return {**moe, "post_norm": True} if post_norm else moe

    return layout


def _q_lora_required(r: Reader, mt: str, out: dict) -> None:
    """A.X-K1 and LongCat-Flash always project q through a LoRA (no q_proj): a null rank builds no model."""
    if out["attention"]["mla"]["q_lora_rank"] is None:
        raise LmcostError(f"{r.source}: q_lora_rank", f"null, but the {mt} model always uses a q LoRA",
                          "set q_lora_rank (1536 in A.X-K1 and LongCat-Flash)")


_NO_MLP_BIAS = dict(mlp_bias=None)

for _spec in (
    # Youtu-LLM: DeepSeek-V3's MLA in a dense Llama stack (Qwen3's MLP, no bias), tied embeddings.
    FamilySpec(model_type="youtu", mla=True, **_NO_MLP_BIAS, tie=True, ignores=("embedding_initializer_range",),
               class_defaults=_mla_defaults(1536, 512, 128, 64, 128)),
    # MiniCPM3: DeepSeek-V2's MLA, dense, with muP scalars on the embeddings, residual branches and logits.
    FamilySpec(model_type="minicpm3", mla=True, tie=True, no_cost=("scale_emb", "scale_depth", "dim_model_base"),
               class_defaults=_mla_defaults(768, 256, 64, 32, 64)),
    # GLM-4.x-Lite (GLM-4.7-Flash): DeepSeek-V3's MLA and experts, the layers' kinds listed in mlp_layer_types.
    FamilySpec(model_type="glm4_moe_lite", mla=True, **_NO_MLP_BIAS, moe=mlp_layer_types(64, 4, 1536),
               class_defaults=_mla_defaults(768, 512, 192, 64, 256)),
    # Sarvam-105B: DeepseekV3ForCausalLM itself under SarvamMLAConfig's defaults and aliases; q_head_dim is a
    # legacy duplicate of qk_head_dim that the config class drops.
    FamilySpec(model_type="sarvam_mla", mla=True, **_NO_MLP_BIAS, moe=deepseek_layers(None),
               aliases={"n_routed_experts": "num_experts", "n_shared_experts": "num_shared_experts"},
               ignores=("q_head_dim", "num_mtp_layers", "num_local_experts"),
               class_defaults=dict(_mla_defaults(None, 512, 128, 64, 128), n_routed_experts=128,
                                   first_k_dense_replace=1)),
    # A.X-K1: DeepSeek-V3 with an RMSNorm on each MoE block's output and always a q LoRA.
    FamilySpec(model_type="axk1", mla=True, **_NO_MLP_BIAS, moe=mlp_layer_types(192, 8, 2048, legacy=True,
                                                                                  post_norm=True),
               checks=(_q_lora_required,), class_defaults=_mla_defaults(1536, 512, 128, 64, 128)),
):
    register(_spec)


@family("kolibri1")
def kolibri1(r: Reader, mt: str) -> dict:
    """Kolibri-1 (Aleph Alpha; transformers Kolibri1Config/Kolibri1ForCausalLM): EXAONE-4's attention (per-head
    RMSNorm on q and k; sliding layers with RoPE, every 5th layer, layer_types, global without), GLM-4's
    sandwich norms, every layer a mixture of num_local_experts (alias num_experts) experts of
    moe_intermediate_size with a shared expert of shared_expert_intermediate_size (no gate) and a router
    without bias (its expert-score correction is a buffer), untied lm_head."""
    n_layers = r.get("num_hidden_layers", 50)
    h = r.get("num_attention_heads", 48)
    if "sliding_window" not in r.data:
        r.data = {**r.data, "sliding_window": 513}  # Kolibri1Config's default
    kinds, window = _windowed_nope(r, n_layers, 5)
    d_e = r.get("moe_intermediate_size", 512)
    return dict(d_model=r.get("hidden_size", 2560), n_layers=n_layers, vocab_size=r.get("vocab_size", 128000),
                attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, 4), head_dim=r.get("head_dim", 128),
                               qk_norm="head", sliding_window=window, layer_pattern=_period(kinds)),
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=d_e),  # no dense layer
                moe=dict(n_experts=expert_count(r, "num_local_experts", "num_experts", 384),
                         top_k=r.get("num_experts_per_tok", 6), d_ff_expert=d_e,
                         d_ff_shared=r.get("shared_expert_intermediate_size", 512)),
                norm="rmsnorm", block="sandwich", positions="rope", tie_embeddings=r.get("tie_word_embeddings", False))


@family("afmoe")
def afmoe(r: Reader, mt: str) -> dict:
    """AFMoE (Arcee Trinity; transformers AfmoeConfig/AfmoeForCausalLM): per-head RMSNorm on q and k, an output
    gate (gate_proj [d, h*d_h], sigmoid, times the attention output: lmcost's output_gate), sliding layers with
    RoPE and every global_attn_every_n_layers-th (layer_types) global without, sandwich norms, the first
    num_dense_layers dense and the rest num_experts experts with num_shared_experts shared ones of
    moe_intermediate_size and a learned expert bias [E] (an nn.Parameter: counted as the router's bias).
    mup_enabled scales the embeddings by sqrt(d), route_scale the routing weights: scalars, not counted.
    Raises: LmcostError for attention_bias (q, k, v and o would carry one, the gate none: not modelled)."""
    n_layers = r.get("num_hidden_layers", 32)
    h = r.get("num_attention_heads", 16)
    every = r.count("global_attn_every_n_layers", 4)
    masks = _layer_types(r, n_layers, ("sliding_attention", "full_attention"),
                         ["local" if (i + 1) % every else "global" for i in range(n_layers)])
    window = r.get("sliding_window", 1024, kind=int)
    # AfmoeAttention rotates only on sliding layers; one without a window attends to every key
    kinds = [("local" if window else "global") if m == "local" else "global_nope" for m in masks]
    r.must_not("attention_bias", "a bias on q, k, v and o beside the unbiased output gate")
    r.get("mup_enabled", False)
    r.get("route_scale", 1.0, kind=float)
    moe = dict(n_experts=r.get("num_experts", 64), top_k=r.get("num_experts_per_tok", 6),
               d_ff_expert=r.get("moe_intermediate_size", 1408), n_shared_experts=r.get("num_shared_experts", 2),
               first_dense_layers=r.get("num_dense_layers", 1), router_bias=True)
    out = dict(d_model=r.get("hidden_size", 2048), n_layers=n_layers, vocab_size=r.get("vocab_size", 200192),
               attention=dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=r.get("head_dim", 128),
                              qk_norm="head", output_gate=True, sliding_window=window if "local" in kinds else None,
                              layer_pattern=_period(kinds)),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 6144)),
               norm="rmsnorm", block="sandwich", positions="rope", tie_embeddings=r.get("tie_word_embeddings", False))
    if moe["first_dense_layers"] < n_layers:
        out["moe"] = moe
    return out


def _aliased(r: Reader, canon: str, alias: str, default):
    """A key under its name or its attribute_map alias (the name wins where both are given)."""
    value = r.get(alias, None, kind=type(default))
    return r.get(canon, default if value is None else value)


@family("longcat_flash")
def longcat_flash(r: Reader, mt: str) -> dict:
    """LongCat-Flash (Meituan, arXiv 2509.01322; transformers LongcatFlashConfig/LongcatFlashForCausalLM): each of
    num_layers layers is two pre-norm blocks (MLA with a q LoRA, then a dense SwiGLU MLP of ffn_hidden_size), and
    the first block's normed MLP input also feeds a shortcut MoE (moe.shortcut) whose output joins after the
    second block: mapped as 2 * num_layers blocks, the even ones with the MoE. The MoE routes each token to its
    top moe_topk of n_routed_experts FFN experts of expert_ffn_hidden_size and zero_expert_num identity experts
    (moe.zero_experts), with a router bias when router_bias. The MLA's query and latent are scaled by
    sqrt(d / rank) (scalars, not counted); head_dim is not used.

    transformers 5.24's LongcatFlashExperts sizes gate_up_proj for all n_routed_experts + zero_expert_num experts
    though the identity experts never read it: 2 * Z * expert_ffn_hidden_size * d parameters per layer that the
    checkpoint does not hold (560B published; 741B built). lmcost counts the checkpoint's."""
    layers = r.get("num_layers", 28)
    h = r.get("num_attention_heads", 64)
    attention = dict(n_heads=h, n_kv_heads=_kv_heads(r, h, h), head_dim=r.get("head_dim", 64, kind=int),
                     qkv_bias=r.get("attention_bias", False), out_bias=r.get("attention_bias", False))
    r.data = {**dict(_mla_defaults(1536, 512, 128, 64, 128)), **r.data}
    _mla(r, attention)
    _q_lora_required(r, mt, dict(attention=attention))  # LongcatFlashMLA always projects q through its LoRA
    d_e = _aliased(r, "expert_ffn_hidden_size", "moe_intermediate_size", 2048)
    moe = dict(n_experts=expert_count(r, "n_routed_experts", "num_local_experts", 512),
               top_k=_aliased(r, "moe_topk", "num_experts_per_tok", 12), d_ff_expert=d_e,
               zero_experts=r.get("zero_expert_num", 256, kind=int), router_bias=r.get("router_bias", False),
               shortcut=True, layer_freq=2)
    if moe["top_k"] > moe["n_experts"] + moe["zero_experts"]:
        raise LmcostError(f"{r.source}: moe_topk", f"{moe['top_k']} picks of {moe['n_experts']} FFN and "
                          f"{moe['zero_experts']} identity experts", "set moe_topk to at most their sum")
    return dict(d_model=r.get("hidden_size", 6144), n_layers=2 * layers, vocab_size=r.get("vocab_size", 131072),
                attention=attention, moe=moe,
                ffn=dict(activation=activation(r, "hidden_act", "silu", True),
                         d_ff=_aliased(r, "ffn_hidden_size", "intermediate_size", 12288)),
                norm="rmsnorm", block="pre_norm", positions="rope", tie_embeddings=r.get("tie_word_embeddings", False))
