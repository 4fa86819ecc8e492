"""The families with DeepSeek Sparse Attention (DSA): DeepSeek-V3's MLA and experts, with a lightning indexer on
every layer that picks each query's top-k keys (the schema's ``attention.sparse``, :mod:`lmcost.model.sparse`;
operators in :mod:`lmcost.operators.sparse_attention`).

- ``deepseek_v32`` (DeepSeek-V3.2, DeepseekV32Config/DeepseekV32ForCausalLM);
- ``glm_moe_dsa`` (GLM-5, GlmMoeDsaConfig): the same layer, with interleaved RoPE in its indexer (no cost of its
  own), and per-layer ``indexer_types`` where a ``shared`` layer reuses the previous layer's top-k (not modelled:
  refused; every default and published layer is ``full``).

Keys read beyond DeepSeek-V3's: index_n_heads, index_head_dim, index_topk (the indexer), mlp_layer_types (which
layers are dense; transformers derives it from first_k_dense_replace and ignores moe_layer_freq), layer_types (all
``indexed_attention``). The defaults are each config class's (transformers 5.24).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.llama_like import FamilySpec
from lmcost.model.hf.reader import Reader, expert_count, mapped_layer_types
from lmcost.model.hf.registry import family

#: Per family: (index_n_heads default, the MoE defaults (n_routed_experts, num_experts_per_tok,
#: moe_intermediate_size, n_shared_experts, first_k_dense_replace)).
_DEFAULTS = {"deepseek_v32": (64, (256, 8, 2048, 1, 3)), "glm_moe_dsa": (32, (256, 8, 2048, 1, 3))}


def mlp_layer_types(experts: int, top_k: int, d_e: int, shared: int, first_dense: int):
    """The MoE layout of DeepseekV32Config/GlmMoeDsaConfig: ``mlp_layer_types`` ("dense"/"sparse" per layer;
    absent, the first first_k_dense_replace layers dense), n_routed_experts (alias num_local_experts) of
    moe_intermediate_size, num_experts_per_tok, n_shared_experts. moe_layer_freq is not a field of these classes
    (their models never read it). Returns None when every layer is dense.
    Raises: LmcostError naming mlp_layer_types for an entry other than dense/sparse or a count other than the layers."""

    def layout(r: Reader, n_layers: int, d_ff: int) -> dict | None:
        first = r.get("first_k_dense_replace", first_dense)
        r.get("moe_layer_freq", None, kind=int)  # not read by these models
        types = r.get("mlp_layer_types", None, kind=list)
        if types is None:
            types = ["dense"] * min(first, n_layers) + ["sparse"] * max(n_layers - first, 0)
        if len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise LmcostError(f"{r.source}: mlp_layer_types", f"must be one of dense/sparse per layer ({n_layers}), "
                              f"got {types!r:.60}", "give one entry per layer, or remove mlp_layer_types")
        dense = [i for i, t in enumerate(types) if t == "dense"]
        if len(dense) == n_layers:
            return None
        return dict(n_experts=expert_count(r, "n_routed_experts", "num_local_experts", experts),
                    top_k=r.get("num_experts_per_tok", top_k), d_ff_expert=r.get("moe_intermediate_size", d_e),
                    n_shared_experts=r.get("n_shared_experts", shared), dense_layers=dense)

    return layout


def _indexer_types(r: Reader, n_layers: int) -> list:
    """GlmMoeDsaConfig's indexer_types: given, else from index_topk_pattern ("F"/"S" per layer), else from
    index_topk_freq and index_skip_topk_offset (layer i is full when max(i - offset + 1, 0) % freq == 0).
    Raises: LmcostError naming the key given for an entry other than full/shared, or (GlmMoeDsaAttention
    indexes it per layer) a count other than the layers."""
    types = r.get("indexer_types", None, kind=list)
    pattern = r.get("index_topk_pattern", None)
    freq, offset = max(r.get("index_topk_freq", 1, kind=int), 1), r.get("index_skip_topk_offset", 2, kind=int)
    key = "indexer_types"
    if types is None and pattern is not None:
        key = "index_topk_pattern"
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else list(pattern)
    if types is None:
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n_layers)]
    for t in types:
        if t not in ("full", "shared"):
            raise LmcostError(f"{r.source}: {key}", f"indexer type {t!r:.40} is not full or shared",
                              f"give full (or shared) for each layer, or remove {key}")
    if len(types) != n_layers:
        raise LmcostError(f"{r.source}: {key}", f"{len(types)} entries for {n_layers} layers",
                          f"give one entry per layer (num_hidden_layers), or remove {key}")
    return types


@family("deepseek_v32", "glm_moe_dsa")
def dsa(r: Reader, mt: str) -> dict:
    """DeepSeek-V3's MLA (a query latent is required: the indexer reads it) and experts, mlp_layer_types for the
    dense layers, and the DSA indexer on every layer: ``attention.sparse`` from index_n_heads, index_head_dim,
    index_topk. mlp_bias is a field the models never read (their MLPs take no bias).
    Raises: LmcostError for a layer type other than indexed_attention, or (glm_moe_dsa) a ``shared`` indexer layer."""
    heads, moe = _DEFAULTS[mt]
    spec = FamilySpec(model_type=mt, mla=True, mlp_bias=None, ignores=("mlp_bias",), moe=mlp_layer_types(*moe))
    out = spec(r, mt)
    n_layers = out["n_layers"]
    mapped_layer_types(r, r.get("layer_types", None, kind=list) or ["indexed_attention"] * n_layers, n_layers,
                       {"indexed_attention": "global"})
    if mt == "glm_moe_dsa":
        types = _indexer_types(r, n_layers)
        if any(t != "full" for t in types):
            raise LmcostError(f"{r.source}: indexer_types", "layers that reuse the previous layer's top-k "
                              "(shared) are not modelled", "give full for every layer, or write an lmcost YAML")
    out["attention"]["sparse"] = dict(index_heads=r.get("index_n_heads", heads), index_head_dim=r.get("index_head_dim", 128),
                                      top_k=r.get("index_topk", 2048))
    return out
