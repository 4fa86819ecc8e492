"""The ALiBi families (Press et al. 2022, "Train Short, Test Long"): BLOOM and MPT. No position table and no
RoPE: each head adds a linear bias m_h * (j - i) to its scores (``positions: alibi``).

Each function maps one family's config as transformers 5.24 builds its model (BloomForCausalLM,
MptForCausalLM), checked exactly against it: parameters on the meta device and FlopCounterMode matmul FLOPs of
a tiny instance, prefill and decode (tests/test_params.py, tests/test_flop_oracle.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import Reader
from lmcost.model.hf.registry import family

#: Keys of BigScience's published BLOOM files that tune Megatron-DeepSpeed's kernels (fusions, fp32 softmax,
#: the alibi offset of its fused mask), none of which BloomModel builds or computes.
_BLOOM_KERNEL_FLAGS = ("attention_softmax_in_fp32", "bias_dropout_fusion", "masked_softmax_fusion", "offset_alibi",
                       "skip_bias_add", "skip_bias_add_qkv", "slow_but_exact", "seq_length")


@family("bloom")
def bloom(r: Reader, mt: str) -> dict:
    """BLOOM (BigScience 2022, section 3.2; BloomConfig/BloomModel): a LayerNorm of the embeddings, pre-norm
    blocks with LayerNorms with bias, fused q/k/v with bias, dense out with bias, an MLP of 4d with GELU and
    biases, ALiBi, the lm_head tied to the embeddings (BloomForCausalLM ties it by default). ``n_embed`` is the
    legacy name BloomConfig reads for hidden_size; BloomMLP is 4d wide whatever ``n_inner`` says.
    Raises: LmcostError for an n_inner other than null or 4 * hidden_size."""
    d = r.get("hidden_size", None, kind=int) or r.get("n_embed", 64, kind=int)
    r.used.add("n_embed")
    r.used.update(_BLOOM_KERNEL_FLAGS)
    n_inner = r.get("n_inner", None, kind=int)
    if n_inner is not None and n_inner != 4 * d:
        raise LmcostError(f"{r.source}: n_inner", f"{n_inner} is not 4 * hidden_size ({4 * d}), the width BloomMLP "
                          "builds", "remove n_inner, or write an lmcost YAML of the model")
    return dict(d_model=d, n_layers=r.get("n_layer", 2), vocab_size=r.get("vocab_size", 250880),
                attention=dict(n_heads=r.get("n_head", 8), qkv_bias=True, out_bias=True),
                ffn=dict(activation="gelu", d_ff=4 * d, bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="alibi", embedding_norm=True,
                tie_embeddings=r.get("tie_word_embeddings", True))


def _mpt_attention(r: Reader) -> None:
    """Check MPT's ``attn_config`` (MptAttentionConfig) against what MptAttention builds: multi-head attention
    with ALiBi over fused q/k/v (Wqkv) without bias. Raises: LmcostError (naming ``attn_config.<key>``) for a
    setting MptAttention does not build: multi-query, QK LayerNorm, a prefix LM, no ALiBi, clipped q/k/v."""
    a = r.get("attn_config", {}, kind=dict)
    inner = Reader(a, f"{r.source}: attn_config")
    inner.used.update(("attn_impl", "softmax_scale", "alibi_bias_max", "attn_uses_sequence_id", "model_type"))
    if inner.get("attn_type", "multihead_attention", kind=str) != "multihead_attention":
        raise LmcostError(f"{r.source}: attn_config.attn_type", "only multihead_attention is built by MptAttention",
                          "write an lmcost YAML with attention.n_kv_heads for multi-query attention")
    inner.must_not("qk_ln", "a LayerNorm of queries and keys")
    inner.must_not("prefix_lm", "a prefix LM (bidirectional prefix)")
    if not inner.get("alibi", True, kind=bool):
        raise LmcostError(f"{r.source}: attn_config.alibi", "false is not modelled (MptModel always adds ALiBi)",
                          "set alibi to true, or write an lmcost YAML")
    if inner.get("clip_qkv", None, kind=float) is not None:
        raise LmcostError(f"{r.source}: attn_config.clip_qkv", "clipping q/k/v is not modelled",
                          "set clip_qkv to null, or write an lmcost YAML")
    inner.done("mpt")


@family("mpt")
def mpt(r: Reader, mt: str) -> dict:
    """MPT (MosaicML 2023, the MPT-7B model card; MptConfig/MptModel): pre-norm blocks with LayerNorms without
    bias (MptModel sets each norm's bias to None), fused q/k/v and out projections without bias, an MLP of 4d with GELU and no bias,
    ALiBi, no position table (llm-foundry turns learned_pos_emb off under ALiBi, and MptModel builds none), the
    lm_head tied by default. ``logit_scale``, ``embedding_fraction`` (a gradient scaling), ``norm_type`` and
    ``init_device`` change nothing MptForCausalLM computes.
    Raises: LmcostError for an expansion_ratio other than 4 or no_bias false (MptMLP and its linears are 4d wide
    and bias-free whatever the config says), and as :func:`_mpt_attention`."""
    d = r.get("d_model", 2048)
    r.used.update(("learned_pos_emb", "logit_scale", "embedding_fraction", "norm_type", "init_device", "max_seq_len"))
    if r.get("expansion_ratio", 4) != 4:
        raise LmcostError(f"{r.source}: expansion_ratio", "only 4 is built by transformers' MptMLP",
                          "write an lmcost YAML with ffn.d_ff = expansion_ratio * d_model")
    if not r.get("no_bias", True):
        raise LmcostError(f"{r.source}: no_bias", "false is not built by transformers' MptModel (its linears have "
                          "no bias)", "set no_bias to true, or write an lmcost YAML with the biases")
    _mpt_attention(r)
    return dict(d_model=d, n_layers=r.get("n_layers", 24), vocab_size=r.get("vocab_size", 50368),
                attention=dict(n_heads=r.get("n_heads", 16)),
                ffn=dict(activation="gelu", d_ff=4 * d),
                norm="layernorm", norm_bias=False, block="pre_norm", positions="alibi",
                max_positions=r.get("max_seq_len", 2048), tie_embeddings=r.get("tie_word_embeddings", True))
