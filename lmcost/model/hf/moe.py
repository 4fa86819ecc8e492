"""The Llama-like mixture-of-experts families: their expert layouts (which layers route to experts, how many,
how wide, with which shared experts) and their table entries (:class:`lmcost.model.hf.llama_like.FamilySpec`).

A layout is a function (reader, n_layers, d_ff) -> the ArchConfig's ``moe`` fields, or None when every layer is
dense (the model is then mapped as dense). The defaults are each config class's (transformers 5.24); each entry
was checked against its transformers model as the dense ones were (tests/test_params.py, tests/test_flop_oracle.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf import windows
from lmcost.model.hf.llama_like import (
    GRANITE_SCALARS,
    FamilySpec,
    Flag,
    MoeLayout,
    Switch,
    width_is_heads_times_head_dim,
)
from lmcost.model.hf.reader import Reader, expert_count, required_top_k
from lmcost.model.hf.registry import register


def every_layer(experts_key: str, alias: str | None, experts: int, top_k: int, *,
                shared_key: str | None = None) -> MoeLayout:
    """Every layer a mixture of ``experts`` experts (under ``experts_key``, or its attribute_map ``alias``) of width
    intermediate_size, top ``top_k`` (num_experts_per_tok); with ``shared_key``, a shared gated MLP of that key's
    width on every token (0: none)."""

    def layout(r: Reader, n_layers: int, d_ff: int) -> dict:
        n = r.get(experts_key, experts) if alias is None else expert_count(r, experts_key, alias, experts)
        moe = dict(n_experts=n, top_k=r.get("num_experts_per_tok", top_k), d_ff_expert=d_ff)
        shared = r.get(shared_key, 0) if shared_key else 0
        if shared:
            moe["d_ff_shared"] = shared
        return moe

    return layout


def _sparse_steps(r: Reader, n_layers: int) -> tuple[int, list[int]]:
    """decoder_sparse_step (a layer is sparse when (i + 1) % step == 0) and mlp_only_layers (always dense)."""
    return r.count("decoder_sparse_step", 1), r.layers("mlp_only_layers", n_layers)


def qwen2_moe_layers(r: Reader, n_layers: int, d_ff: int) -> dict:
    """Qwen2MoeDecoderLayer: sparse unless in mlp_only_layers or off decoder_sparse_step; num_experts routed experts
    of moe_intermediate_size and a sigmoid-gated shared expert of shared_expert_intermediate_size."""
    step, only = _sparse_steps(r, n_layers)
    dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0]
    return dict(n_experts=r.get("num_experts", 60), top_k=r.get("num_experts_per_tok", 4),
                d_ff_expert=r.get("moe_intermediate_size", 1408),
                d_ff_shared=r.get("shared_expert_intermediate_size", 5632), shared_expert_gate=True, dense_layers=dense)


def qwen3_moe_layers(r: Reader, n_layers: int, d_ff: int) -> dict | None:
    """Qwen3MoeDecoderLayer: a sparse block unless listed in mlp_only_layers, off decoder_sparse_step, or without
    experts; no shared expert."""
    n_experts = expert_count(r, "num_local_experts", "num_experts", 128)
    step, only = _sparse_steps(r, n_layers)
    dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0 or n_experts == 0]
    moe = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 8),
               d_ff_expert=r.get("moe_intermediate_size", 768), dense_layers=dense)
    return moe if len(dense) < n_layers else None  # every layer dense: a dense model


def dots1_layers(r: Reader, n_layers: int, d_ff: int) -> dict:
    """DeepSeek-V3-style experts (first_k_dense_replace dense layers, n_shared_experts shared experts of
    moe_intermediate_size). Dots1Config leaves the expert counts unset and its model cannot be built without
    them: they are required here."""
    n_experts = expert_count(r, "n_routed_experts", "num_local_experts", ...)
    return dict(n_experts=n_experts, top_k=required_top_k(r, "Dots1Config"),
                d_ff_expert=r.get("moe_intermediate_size", 1408),
                n_shared_experts=r.get("n_shared_experts", kind=int),
                first_dense_layers=r.get("first_k_dense_replace", 0))


def ernie4_5_moe_layers(r: Reader, n_layers: int, d_ff: int) -> dict | None:
    """Experts in layers moe_layer_start_index..end_index (every moe_layer_interval-th), shared experts of
    moe_num_shared_experts x moe_intermediate_size, and a learned expert-score correction bias [E] in the router
    (counted as a router bias)."""
    start, end = r.get("moe_layer_start_index", 1), r.get("moe_layer_end_index", -1)
    end = n_layers - 1 if end == -1 else end  # Ernie4_5_MoeConfig: -1 is the last layer
    every = r.count("moe_layer_interval", 1)
    dense = [i for i in range(n_layers) if not ((i + 1) % every == 0 and start <= i <= end)]
    moe = None
    if len(dense) < n_layers:
        moe = dict(n_experts=r.get("moe_num_experts", 64), top_k=r.get("moe_k", 6),
                   d_ff_expert=r.get("moe_intermediate_size", 1536),
                   n_shared_experts=r.get("moe_num_shared_experts", 2), dense_layers=dense, router_bias=True)
    r.get("moe_norm_min", None, kind=float)  # an epsilon of the routing weights' normalisation
    return moe


def deepseek_v3_style(experts: int, top_k: int, shared: int, first_dense: int) -> MoeLayout:
    """DeepSeek-V3's layout under its keys, with a family's defaults: n_routed_experts (alias num_local_experts),
    num_experts_per_tok, moe_intermediate_size (required), n_shared_experts, first_k_dense_replace."""

    def layout(r: Reader, n_layers: int, d_ff: int) -> dict:
        return dict(n_experts=expert_count(r, "n_routed_experts", "num_local_experts", experts),
                    top_k=r.get("num_experts_per_tok", top_k), d_ff_expert=r.get("moe_intermediate_size", kind=int),
                    n_shared_experts=r.get("n_shared_experts", shared),
                    first_dense_layers=r.get("first_k_dense_replace", first_dense))

    return layout


def deepseek_layers(top_k_class: str | None) -> MoeLayout:
    """DeepSeek-V2/V3 (DeepseekV2Config, DeepseekV3Config): n_routed_experts of moe_intermediate_size (required),
    n_shared_experts, first_k_dense_replace dense layers, then every moe_layer_freq-th layer sparse.
    ``top_k_class``: the config class that has no num_experts_per_tok default (None: the key is required)."""

    def layout(r: Reader, n_layers: int, d_ff: int) -> dict:
        n_experts = r.get("n_routed_experts")
        top_k = required_top_k(r, top_k_class) if top_k_class else r.get("num_experts_per_tok")
        return dict(n_experts=n_experts, top_k=top_k, d_ff_expert=r.get("moe_intermediate_size"),
                    n_shared_experts=r.get("n_shared_experts", 0), first_dense_layers=r.get("first_k_dense_replace", 0),
                    layer_freq=r.get("moe_layer_freq", 1))

    return layout


def _no_clip_qkv(r: Reader, mt: str, out: dict) -> None:
    if r.get("clip_qkv", None, kind=float) is not None:
        raise LmcostError(f"{r.source}: clip_qkv", "clamping q, k and v is not modelled",
                          "set clip_qkv to null or write an lmcost YAML")


_ATTENTION_ONLY_BIAS = dict(mlp_bias=None)  # attention_bias on q, k, v and o; the experts take none

for _spec in (
    FamilySpec(model_type="mixtral", window=windows.all_slide, moe=every_layer("num_local_experts", None, 8, 2)),
    FamilySpec(model_type="qwen2_moe", qkv_bias=Flag("qkv_bias", True), out_bias=None,
               window=windows.qwen2_upper_layers, moe=qwen2_moe_layers),
    FamilySpec(model_type="qwen3_moe", **_ATTENTION_ONLY_BIAS, qk_norm="head", window=windows.every_layer_if_enabled,
               moe=qwen3_moe_layers),
    FamilySpec(model_type="olmoe", **_ATTENTION_ONLY_BIAS, qk_norm="full",
               moe=every_layer("num_experts", "num_local_experts", 64, 8),
               checks=(width_is_heads_times_head_dim, _no_clip_qkv)),
    FamilySpec(model_type="granitemoe", **_ATTENTION_ONLY_BIAS, no_cost=GRANITE_SCALARS,
               moe=every_layer("num_local_experts", "num_experts", 8, 2)),
    # GraniteMoE with an optional shared gated MLP of width shared_intermediate_size on every token.
    FamilySpec(model_type="granitemoeshared", **_ATTENTION_ONLY_BIAS, no_cost=GRANITE_SCALARS,
               moe=every_layer("num_local_experts", "num_experts", 8, 2, shared_key="shared_intermediate_size")),
    # Qwen3 attention, DeepSeek-V3-style experts.
    FamilySpec(model_type="dots1", **_ATTENTION_ONLY_BIAS, qk_norm="head", window=windows.dots1_upper_layers,
               moe=dots1_layers),
    # Mixtral's experts behind LayerNorms with bias.
    FamilySpec(model_type="phimoe", **_ATTENTION_ONLY_BIAS, norm="layernorm", norm_bias=True,
               window=windows.every_layer, no_bias_keys=("lm_head_bias",),
               moe=every_layer("num_local_experts", "num_experts", 16, 2)),
    # Qwen3-style projections with RMSNorm over all heads' q and k (full), experts in every layer.
    FamilySpec(model_type="minimax_m2", head_dim=128, qkv_bias=None, out_bias=None, mlp_bias=None, qk_norm="full",
               moe=every_layer("num_local_experts", "num_experts", 256, 8)),
    # OLMo-2's norm placement and q/k norms with OLMoE's experts.
    FamilySpec(model_type="flex_olmo", **_ATTENTION_ONLY_BIAS, qk_norm="full", block="post_norm",
               moe=every_layer("num_experts", "num_local_experts", 7, 5)),
    # GLM-4.5: DeepSeek-V3's expert layout with GLM's half-width RoPE; q/k/v bias, no o bias; a head_dim not in
    # the config is hidden_size // heads (floored: the default config's 4096 / 96 -> 42).
    FamilySpec(model_type="glm4_moe", head_dim="floor", out_bias=None, mlp_bias=None, rotary=0.5,
               qk_norm=Switch("use_qk_norm", False, "head", "none"), moe=deepseek_v3_style(128, 8, 1, 1)),
    # ERNIE-4.5 with experts; use_bias (q/k/v/o, MLPs, lm_head) is refused: Ernie4_5_MoeMLP's experts take none.
    FamilySpec(model_type="ernie4_5_moe", qkv_bias=None, out_bias=None, mlp_bias=None, tie=True,
               moe=ernie4_5_moe_layers, refuse={"use_bias": "biases on the projections, MLPs and lm_head"},
               aliases={"moe_num_experts": "num_experts", "moe_k": "num_experts_per_tok"}),
    # DeepSeek-V2/V3: multi-head latent attention and fine-grained experts with shared ones.
    FamilySpec(model_type="deepseek_v2", mla=True, moe=deepseek_layers("DeepseekV2Config")),
    FamilySpec(model_type="deepseek_v3", mla=True, moe=deepseek_layers(None)),
):
    register(_spec)
