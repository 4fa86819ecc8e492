"""The schema of a learned sparse-attention indexer (DeepSeek Sparse Attention, DSA): ``attention.sparse``.

DeepSeek-V3.2 (DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse
Attention", section 2.1) puts a *lightning indexer* beside MLA: per query token t, index scores over every earlier
token s, I[t,s] = sum_j w[t,j] * ReLU(q_I[t,j] . k_I[s]), from index_heads small query heads and one shared index key
per token (which the indexer caches, beside MLA's latent); each query then attends only to its top_k highest-scoring
keys. Its operators: :mod:`lmcost.operators.sparse_attention`; transformers' modules: DeepseekV32Indexer and
DeepseekV32Attention (models/deepseek_v32), GlmMoeDsaIndexer (models/glm_moe_dsa).
"""

from __future__ import annotations

from typing import Literal

from lmcost.model.schema import PositiveInt, Positions, _Strict

#: The index key cache's element type: ``kv`` the KV cache's dtype (transformers' DynamicIndexedLayer keeps the
#: index keys as the model computes them, in the model dtype); ``bf16`` 2 bytes; ``fp8`` one byte per element and
#: one float32 scale per 128 elements (DeepSeek-V3.2's inference code, ``act_quant`` with block_size 128, as vLLM's
#: indexer cache: 128 + 4 = 132 bytes per token at index_head_dim 128).
INDEX_CACHE_DTYPES = ("kv", "bf16", "fp8")
#: Elements per float32 scale of an fp8 index cache (DeepSeek-V3.2 inference/kernel.py's block_size).
FP8_SCALE_BLOCK = 128


class SparseAttention(_Strict):
    """A DSA lightning indexer and top-k sparse attention on every attention layer (over MLA, with a query
    latent: the indexer's queries are projected from MLA's q_a latent, ``q_lora_rank``).

    ``index_heads`` (H_I, HF index_n_heads) query heads of ``index_head_dim`` (D_I, HF index_head_dim) each, one
    index key of D_I per token (cached, in ``index_cache``'s dtype), RoPE on the first qk_rope_head_dim of each;
    each query attends to its ``top_k`` (HF index_topk) best-scoring earlier keys (all of them while t <= top_k).
    """

    index_heads: PositiveInt
    index_head_dim: PositiveInt
    top_k: Positions
    index_cache: Literal[INDEX_CACHE_DTYPES] = "kv"

    @staticmethod
    def check_attention(a) -> None:
        """What ``attention.sparse`` needs of the attention section ``a`` (:class:`lmcost.model.config.Attention`):
        MLA with a query latent (the indexer's queries are projected from it, DeepseekV32Indexer.wq_b), an index
        head at least as wide as the RoPE part it rotates, and every layer global (a sliding or chunked DSA layer
        is not modelled). Raises: ValueError (pydantic's), naming the field and the fix."""
        if a.mla is None or a.mla.q_lora_rank is None:
            raise ValueError("sparse: the DSA indexer reads MLA's query latent; give attention.mla with a q_lora_rank, "
                             "or remove attention.sparse")
        if a.sparse.index_head_dim < a.mla.qk_rope_head_dim:
            raise ValueError(f"sparse: index_head_dim {a.sparse.index_head_dim} is narrower than the RoPE part it "
                             f"rotates (qk_rope_head_dim {a.mla.qk_rope_head_dim}); widen index_head_dim")
        if a.sliding_window is not None or a.chunk_size is not None or a.layer_pattern is not None:
            raise ValueError("sparse: DSA over sliding-window, chunked or patterned layers is not modelled; "
                             "remove sliding_window/chunk_size/layer_pattern or attention.sparse")


def index_key_bytes(sparse: SparseAttention, B_kv):
    """Bytes of the index key one token keeps per layer: D_I * B_kv (``kv``), D_I * 2 (``bf16``), or
    D_I + 4 * ceil(D_I / 128) (``fp8``: the fp8 key and its float32 scales)."""
    D = sparse.index_head_dim
    if sparse.index_cache == "fp8":
        return D + 4 * (-(-D // FP8_SCALE_BLOCK))
    return D * (2 if sparse.index_cache == "bf16" else B_kv)
