"""DeepSeek Sparse Attention (DSA): the lightning indexer and MLA over each query's top-k keys, per layer, for a
pass of s new tokens per sequence at context t (n = b*s tokens).

Sources: DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse Attention",
section 2.1 (eq. 1, the index score I[t,s] = sum_j w[t,j] * ReLU(q[t,j] . k[s]); eq. 2, attention over the top-k
of I); transformers' DeepseekV32Indexer and DeepseekV32Attention (models/deepseek_v32/modeling_deepseek_v32.py),
GlmMoeDsaIndexer (models/glm_moe_dsa), and DynamicIndexedLayer (cache_utils.py) for the index key cache.

The indexer, with H = index_heads, D = index_head_dim, r = qk_rope_head_dim, d_q = q_lora_rank:
- ``attn.indexer.q_proj`` (wq_b): c_q [b,s,d_q] @ [d_q, H*D] -> q_I [b,s,H,D] (c_q: MLA's normed query latent);
- ``attn.indexer.k_proj`` (wk): x [b,s,d] @ [d, D] -> k_I [b,s,D]; ``attn.indexer.k_norm``: a LayerNorm with bias
  over D, whose output goes into the index key cache (:func:`lmcost.model.sparse.index_key_bytes` per token);
- ``attn.indexer.rope``: RoPE on the first r of each query head and of the key (3 FLOPs per element);
- ``attn.indexer.weights_proj``: x [b,s,d] @ [d, H] -> w [b,s,H];
- ``attn.indexer.score``, ``attn.indexer.relu``, ``attn.indexer.weight_sum``: scores q_I . k_I over the keys
  (2*D FLOPs per query, head and key), scaled by 1/sqrt(D) and ReLU'd (2 FLOPs), then summed over heads
  weighted by w (2 FLOPs) -> I [b,s,t] (float32, as transformers computes it);
- ``attn.indexer.topk``: the top_k keys of each query's scores -> indices [b,s,k] (int32).

What is counted, by kernel (as :mod:`lmcost.operators.attention`'s ``naive`` and ``flash``):
- ``naive`` is transformers' eager/SDPA path, the oracle FlopCounterMode counts: the indexer scores every query
  against all t cached keys (s*t pairs: the causal mask is added after) in two matmuls (q.k, then the head-weighted
  sum, 2*b*s*H*t*(D + 1) FLOPs), writing float32 scores; the top-k indices are scattered into a [b,s,t] mask
  (``attn.index_mask``) and MLA then runs *dense* over all t keys (:func:`lmcost.operators.attention._mla_ops`,
  its naive kernel): the sparse attention costs what dense attention does.
- ``flash`` is what sparse kernels move (DeepGEMM's fp8 MQA-logits kernel for the indexer, FlashMLA's sparse
  kernel for the attention): the indexer scores only the causal pairs (s*t - s(s-1)/2 per head), its ReLU and
  weighting inside the kernel, reading each cached index key once; the attention computes only the selected
  pairs, sum over the s queries of min(j, top_k) (the query at position j has j keys until j > top_k), and reads
  the distinct selected keys, at most min(t, s*top_k) of the cache (mask kind ``topk``, with w = top_k, in
  :mod:`lmcost.operators.attention`). A decode step: top_k pairs and top_k keys of the latent once t > top_k.
Both write the float32 scores and the int32 indices to memory (the top-k is its own kernel in both).
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.model.sparse import index_key_bytes
from lmcost.basics.notation import minimum
from lmcost.operators.attention import _causal_pairs, _mla_ops, attention_ops, rope
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, linear, norm

#: Bytes per element of the index scores (transformers upcasts q and k to float32; DeepGEMM writes float32
#: logits) and of the top-k indices (int32).
SCORE_BYTES = 4
INDEX_BYTES = 4
#: Roles of MLA's attention core, before which the indexer's ops are listed (it reads the query latent).
_CORE = ("attn.q_absorb", "attn.kv_b_proj", "attn.sdpa", "attn.score")


def index_cache_bytes(cfg, x) -> object:
    """Bytes of index key one token keeps per attention layer (0 without ``attention.sparse``)."""
    sp = cfg.attention.sparse
    return 0 if sp is None else index_key_bytes(sp, x.B_kv)


def indexer_ops(cfg, x, kernel: str) -> list[OpCost]:
    """The lightning indexer of one layer (see the module docstring for shapes and what each kernel counts).

    Args: cfg an ArchConfig with ``attention.sparse``; x the dims (:class:`lmcost.operators.forward.Dims`);
    kernel ``naive`` (transformers: all s*t scores) or ``flash`` (a fused indexer: the causal pairs).
    Returns: the OpCost records, FLOPs in FLOPs (2 per MAC), bytes in bytes.
    """
    sp = cfg.attention.sparse
    H, D, n, b = sp.index_heads, sp.index_head_dim, x.b * x.s, x.b
    key = index_key_bytes(sp, x.B_kv)  # per token
    k = linear("attn.indexer.k_proj", n, x.d, D, x.B_w, x.B_a, shapes="x [b,s,d] @ W_k [d,D_I] -> k_I [b,s,D_I]")
    kn = norm("attn.indexer.k_norm", "layernorm", True, n, D, x.B_w, x.B_a, shapes="LayerNorm k_I [b,s,D_I] -> index cache")
    ops = [linear("attn.indexer.q_proj", n, x.d_q, H * D, x.B_w, x.B_a,
                  shapes="c_q [b,s,d_q] @ W_qI [d_q,H_I*D_I] -> q_I [b,s,H_I,D_I]"),
           k, replace(kn, act_write_bytes=0, kv_write_bytes=n * key)]
    if cfg.positions == "rope":
        elem = key / D if sp.index_cache == "fp8" else 2 if sp.index_cache == "bf16" else x.B_kv  # bytes per element
        r_op = rope(x, n, H * x.d_r, x.d_r, elem)
        ops.append(replace(r_op, name="attn.indexer.rope", role="attn.indexer.rope",
                           shapes="q_I [b,s,H_I,r], k_I [b,s,r] rotated by cos/sin [s,r]"))
    ops.append(linear("attn.indexer.weights_proj", n, x.d, H, x.B_w, x.B_a, shapes="x [b,s,d] @ W_w [d,H_I] -> w [b,s,H_I]"))
    q_bytes, w_bytes = n * H * D * x.B_a, n * H * x.B_a
    keys_read = b * x.t * key
    selected = min_pairs(x, sp.top_k) if kernel == "flash" else n * _top(x, sp.top_k)
    if kernel == "flash":
        P = b * _causal_pairs(x, "global")  # (query, key) pairs per head over the batch
        ops += [
            OpCost("attn.indexer.score", OpClass.ATTENTION, flops=2 * P * H * (D + 1), matmul=True,
                   act_read_bytes=q_bytes + w_bytes, kv_read_bytes=keys_read, act_write_bytes=P * SCORE_BYTES,
                   shapes="sum_h w [b,s,H_I] * relu(q_I [b,s,H_I,D_I] @ k_Iᵀ [b,D_I,t]) -> I [b,s,t] (causal pairs)",
                   kind="sdpa", mnk=(b, x.s, P), q_per_stream=H),
            OpCost("attn.indexer.relu", OpClass.ELEMENTWISE, flops=2 * P * H, kernels=0,
                   shapes="scale and ReLU inside attn.indexer.score: no memory traffic of its own", kind="relu"),
            OpCost("attn.indexer.topk", OpClass.MOE_ROUTING, flops=P, act_read_bytes=P * SCORE_BYTES,
                   act_write_bytes=selected * INDEX_BYTES, shapes="top-k of I [b,s,t] -> indices [b,s,k]", kind="topk"),
        ]
        return ops
    scores = n * H * x.t  # transformers scores every cached key, the causal mask added afterwards
    return ops + [
        OpCost("attn.indexer.score", OpClass.ATTENTION, flops=2 * scores * D, matmul=True,
               act_read_bytes=q_bytes, kv_read_bytes=keys_read, act_write_bytes=scores * SCORE_BYTES,
               shapes="q_I [b,s,H_I,D_I] @ k_Iᵀ [b,1,D_I,t] -> [b,s,H_I,t] (float32)"),
        OpCost("attn.indexer.relu", OpClass.ELEMENTWISE, flops=2 * scores, act_read_bytes=scores * SCORE_BYTES,
               act_write_bytes=scores * SCORE_BYTES, shapes="relu(scores * D_I^-0.5) [b,s,H_I,t]", kind="relu"),
        OpCost("attn.indexer.weight_sum", OpClass.ATTENTION, flops=2 * scores, matmul=True,
               act_read_bytes=scores * SCORE_BYTES + w_bytes, act_write_bytes=n * x.t * SCORE_BYTES,
               shapes="w [b,s,1,H_I] @ scores [b,s,H_I,t] -> I [b,s,t]"),
        # + the causal mask [b,1,s,t] (1 FLOP per score), then the top-k
        OpCost("attn.indexer.topk", OpClass.MOE_ROUTING, flops=2 * n * x.t,
               act_read_bytes=n * x.t * (SCORE_BYTES + x.B_a), act_write_bytes=selected * INDEX_BYTES,
               shapes="I [b,s,t] + mask, top-k -> indices [b,s,min(k,t)]", kind="topk"),
    ]


def _top(x, top_k):
    """Indices per query transformers' top-k returns: min(top_k, t) (DeepseekV32Indexer: topk = min(index_topk, T))."""
    return minimum(x.t, top_k)


def min_pairs(x, top_k):
    """(query, key) pairs over the batch that the sparse attention computes per head: b * sum over the s queries
    of min(j, top_k), j the query's position (:func:`lmcost.operators.attention._causal_pairs`, mask ``topk``)."""
    return x.b * _causal_pairs(replace(x, w=top_k), "topk")


def sparse_attention_ops(cfg, x, local, kernel: str = "flash", mla_mode: str = "absorbed",
                         train: bool = False) -> list[OpCost]:
    """All attention operators of one DSA layer, from its input x [b,s,d] to its output [b,s,d]: MLA's projections,
    the indexer (:func:`indexer_ops`, listed before the attention core), then MLA's attention core.

    ``naive``: transformers' path: the top-k scattered into the mask (``attn.index_mask``: the [b,s,t] index mask
    built from the indices and applied to the [b,1,s,t] attention mask, 1 FLOP per element) and MLA dense over all t
    keys (its naive kernel). ``flash``: MLA's fused kernel over the top-k keys only (mask kind ``topk``, w = top_k:
    sum of min(j, top_k) pairs, min(t, s*top_k) keys read). ``mla_mode`` as for MLA (absorbed: attention over the
    latent, as FlashMLA's sparse kernel runs; naive: the selected latents up-projected per head).
    ``local``: the layer's attention kind (``global``: DSA layers are not windowed).
    Returns: a list of OpCost for one layer.
    """
    sp = cfg.attention.sparse
    if kernel == "naive":
        n_mask = x.b * x.s * x.t
        mla = _mla_ops(cfg, x, local, "naive", mla_mode, train)
        extra = [OpCost("attn.index_mask", OpClass.ELEMENTWISE, flops=n_mask,
                        act_read_bytes=x.b * x.s * _top(x, sp.top_k) * INDEX_BYTES + n_mask * x.B_a,
                        act_write_bytes=n_mask * x.B_a, shapes="mask [b,1,s,t] where not in indices [b,s,k]")]
    else:
        mla = [replace(op, shapes=op.shapes + " (the top-k keys)") if op.role == "attn.sdpa" else op
               for op in _mla_ops(cfg, replace(x, w=sp.top_k), "topk", kernel, mla_mode, train)]
        extra = []
    at = next(i for i, op in enumerate(mla) if op.role in _CORE)
    return mla[:at] + indexer_ops(cfg, x, kernel) + extra + mla[at:]


def layer_attention_ops(cfg, x, local, kernel: str = "flash", mla_mode: str = "absorbed",
                        train: bool = False) -> list[OpCost]:
    """A layer's attention operators: :func:`sparse_attention_ops` under ``attention.sparse``, else
    :func:`lmcost.operators.attention.attention_ops` (same arguments); what :mod:`lmcost.operators.forward` calls."""
    if cfg.attention.sparse is not None:
        return sparse_attention_ops(cfg, x, local, kernel, mla_mode, train)
    return attention_ops(cfg, x, local, kernel, mla_mode, train)
