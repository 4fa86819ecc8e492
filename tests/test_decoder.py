"""The reference decoder (lmcost.profiling.decoder) against the analytic model it is built from.

For small configs covering the architecture space: parameters equal param_counts exactly; the
preallocated KV cache equals kv_bytes exactly; FlopCounterMode counts exactly the analytic matmul
FLOPs of one prefill and one decode step; the profiler scopes are exactly the analytic operator names;
prefill + decode give the logits of one long prefill (the cache is right), and so do chunked prefill
and decode steps that wrap the rolling buffer of a sliding window.

FLOPs: FlopCounterMode counts every attention matmul in full, s x t_k with no causal discount, so the
oracle is the analytic ``naive`` kernel in both decoder paths. kernel="naive": the decoder's own bmm
(score and value). kernel="flash": SDPA pinned to its MATH backend (``sdpa_backend="math"``), whose bmm
FlopCounterMode sees (on CPU the flash backend, _scaled_dot_product_flash_attention_for_cpu, is not
counted at all; on CUDA the flash/efficient kernels are counted by sdpa_flop_count, also in full);
absorbed MLA's latent kernel, its own bmm in tiles of 32 queries, one tile of all keys read at S = 8
(tests/test_attention_pairs.py checks its tiles against the causal pairs). Keys per query block
on a local layer: prefill s = 8 reads min(t, s + w - 1) = 8 keys; the decode step at t = 9 reads the
min(t, w) = 4 keys of the rolling buffer (w = 4), as the analytic min(t, s + w - 1).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import in_pieces
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.apps.estimate import Settings, phase_ops
from lmcost.operators.forward import Dims, forward_ops
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcost.profiling.decoder import analytic_names, build_decoder, scope_names  # noqa: E402

B, S, MAX_B, MAX_T = 2, 8, 3, 16   # batch 2 of the 3 cache rows; prompt 8; decode at t = 9
W = 4                               # sliding window: smaller than the prompt, so it bites

ATTN = dict(n_heads=4, n_kv_heads=2)
SWIGLU = dict(activation="swiglu", d_ff=96)
MLA_Q = dict(q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)
MLA_NOQ = dict(kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)

CONFIGS = {
    "gqa": dict(attention=ATTN, ffn=SWIGLU),
    "mqa_biases_layernorm_gelu": dict(
        attention=dict(n_heads=4, n_kv_heads=1, qkv_bias=True, out_bias=True),
        ffn=dict(activation="gelu", d_ff=96, bias=True), norm="layernorm", norm_bias=True),
    "mha_post_norm_learned_tied": dict(
        attention=dict(n_heads=4), ffn=dict(activation="relu", d_ff=96), block="post_norm",
        positions="learned", max_positions=32, tie_embeddings=True),
    "parallel_shared_partial_rotary": dict(
        attention=dict(n_heads=4), ffn=dict(activation="gelu", d_ff=96, bias=True), block="parallel",
        norm="layernorm", norm_bias=True, rotary_fraction=0.25),
    "parallel_separate_no_positions": dict(
        attention=ATTN, ffn=dict(activation="reglu", d_ff=96), block="parallel", parallel_shared_norm=False,
        positions="none", final_norm=False),
    "sandwich_local_global_qk_head": dict(
        attention=dict(**ATTN, head_dim=24, qk_norm="head", sliding_window=W, layer_pattern=["local", "global"]),
        ffn=dict(activation="geglu", d_ff=96), block="sandwich", tie_embeddings=True, n_layers=3),
    "sliding_window_all_local": dict(attention=dict(**ATTN, sliding_window=W), ffn=dict(activation="glu", d_ff=96)),
    "window_wider_than_cache": dict(attention=dict(**ATTN, sliding_window=64), ffn=SWIGLU),
    "qk_norm_full_post_norm": dict(attention=dict(**ATTN, qk_norm="full"), ffn=dict(activation="silu", d_ff=96),
                                   block="post_norm"),
    "mla_q_lora": dict(attention=dict(n_heads=4, qkv_bias=True, out_bias=True, mla=MLA_Q), ffn=SWIGLU),
    "mla_moe_shared_dense_first": dict(
        attention=dict(n_heads=4, mla=MLA_NOQ), ffn=SWIGLU, n_layers=3,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, n_shared_experts=1, first_dense_layers=1)),
    # DSA (lmcost.operators.sparse_attention): MLA with a lightning indexer; a top-k of 16 selects every key here,
    # so both kernels cost the analytic naive count (test_sparse_attention.py has one that bites)
    "mla_dsa": dict(attention=dict(n_heads=4, mla=MLA_Q, sparse=dict(index_heads=2, index_head_dim=16, top_k=16)),
                    ffn=SWIGLU),
    "mla_local_global": dict(attention=dict(n_heads=4, mla=MLA_Q, sliding_window=W, layer_pattern=["global", "local"]),
                             ffn=SWIGLU),
    "moe_shared_gate_dense_layer": dict(
        attention=dict(**ATTN, qkv_bias=True), ffn=SWIGLU, n_layers=3,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, d_ff_shared=48, shared_expert_gate=True, dense_layers=[0])),
    "moe_plain_gelu_layer_freq": dict(
        attention=ATTN, ffn=dict(activation="gelu", d_ff=96), n_layers=2,
        moe=dict(n_experts=4, top_k=1, d_ff_expert=32, layer_freq=2)),
    # A bare bidirectional layer stack (BERT-like: no embeddings, final norm or lm_head; dropout is
    # training-only) and bidirectional local/global attention with learned positions.
    "bare_bidirectional_stack": dict(
        attention=dict(n_heads=4, qkv_bias=True, out_bias=True), ffn=dict(activation="gelu", d_ff=96, bias=True),
        norm="layernorm", norm_bias=True, block="post_norm", positions="none", embeddings=False, causal=False,
        dropout=True),
    "bidirectional_local_global": dict(
        attention=dict(**ATTN, sliding_window=W, layer_pattern=["local", "global"]), ffn=SWIGLU, causal=False,
        positions="learned", max_positions=32),
    # OLMo-1's LayerNorms without weight or bias; a biased lm_head (GPT-J, Phi-2), here tied; squared ReLU.
    "weightless_norms_biased_tied_head": dict(
        attention=ATTN, ffn=dict(activation="relu2", d_ff=96), norm="layernorm", norm_weight=False,
        lm_head_bias=True, tie_embeddings=True),
    # BLOOM-like: ALiBi biases on the scores (6 heads: 4 slopes of the power-of-2 sequence and 2 of the next),
    # a LayerNorm of the embeddings, biases everywhere, tied lm_head.
    "alibi_embedding_norm_tied": dict(
        d_model=48, attention=dict(n_heads=6, qkv_bias=True, out_bias=True),
        ffn=dict(activation="gelu", d_ff=96, bias=True), norm="layernorm", norm_bias=True, positions="alibi",
        embedding_norm=True, tie_embeddings=True),
    # Laguna's softplus output gate: one gate per head (with local/global layers and a MoE with a router bias
    # and a shared MLP), or one per element.
    "softplus_gate_head": dict(
        attention=dict(**ATTN, head_dim=16, qk_norm="head", sliding_window=W, layer_pattern=["local", "global"],
                       softplus_gate="head"), ffn=SWIGLU, n_layers=2,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, d_ff_shared=48, router_bias=True, dense_layers=[0])),
    "softplus_gate_element": dict(attention=dict(**ATTN, qkv_bias=True, out_bias=True, softplus_gate="element"),
                                  ffn=SWIGLU),
    # MiMo-V2-Flash-like (lmcost.operators.layer_heads): value heads of 8 beside q/k heads of 16, MQA on the global
    # layer and 2 KV heads with sinks on the sliding one, partial RoPE, a dense then a MoE layer.
    "narrow_values_local_heads_sinks": dict(
        attention=dict(n_heads=4, n_kv_heads=1, head_dim=16, v_head_dim=8, local_kv_heads=2, sinks="local",
                       qkv_bias=True, sliding_window=W, layer_pattern=["global", "local"]),
        ffn=SWIGLU, rotary_fraction=0.5, moe=dict(n_experts=4, top_k=2, d_ff_expert=32, dense_layers=[0])),
    # JetMoE-like (lmcost.operators.mixture_of_attention): 4 query/output experts of 2 heads, top 2 (4 query
    # heads), biases on the attention's and the MoE's outputs.
    "mixture_of_attention_heads": dict(
        attention=dict(n_heads=4, n_kv_heads=2, head_dim=16, out_bias=True, moa_experts=4), ffn=SWIGLU,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, output_bias=True), tie_embeddings=True),
    # Doge-like (lmcost.operators.dynamic_mask, residual_scale): dynamic mask attention (GQA, biases, per-head q/k
    # norms) over a sliding window and a global layer, learned scales on the residual skips.
    "dynamic_mask_residual_scale": dict(
        attention=dict(**ATTN, qkv_bias=True, out_bias=True, qk_norm="head", dynamic_mask=True, sliding_window=W,
                       layer_pattern=["local", "global"]), ffn=SWIGLU, residual_scale=True),
    # lmcost.model.hf.classic: Apertus's xIELU (two learned scalars per layer) with per-head q/k RMSNorm; XGLM/CTRL's
    # sinusoidal table (no parameters) with Persimmon's per-head q/k LayerNorm; nanochat's weightless norms (one
    # on the embeddings too) with its weightless q/k norm.
    "xielu_qk_head": dict(attention=dict(ATTN, qk_norm="head"), ffn=dict(activation="xielu", d_ff=96)),
    "sinusoidal_qk_head_layernorm": dict(
        attention=dict(n_heads=4, qkv_bias=True, out_bias=True, qk_norm="head_layernorm"),
        ffn=dict(activation="relu2", d_ff=96, bias=True), norm="layernorm", norm_bias=True, positions="sinusoidal"),
    "sub_norms_relu2_glu": dict(attention=ATTN, ffn=dict(activation="relu2_glu", d_ff=96), sub_norms=True),
    "differential_gqa": dict(attention=dict(n_heads=4, n_kv_heads=2, differential=True), ffn=SWIGLU),
    "weightless_embedding_norm": dict(attention=dict(ATTN, qk_norm="l2"), ffn=dict(activation="relu2", d_ff=96),
                                      norm_weight=False, embedding_norm=True, final_logit_softcap=15.0),
    # Hybrid stacks (lmcost.operators.recurrent): Nemotron-H-like blocks of one kind each (Mamba-2 in chunks of 4, so a
    # prefill of 8 is 2 chunks; attention without RoPE; squared-ReLU MLP; a MoE block with a shared expert),
    # and LFM2-like short-conv and attention layers (biased conv, per-head qk-norm), each with an FFN.
    "hybrid_mamba2_blocks": dict(
        attention=ATTN, ffn=dict(activation="relu2", d_ff=96), n_layers=5, positions="none",
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, d_ff_shared=48),
        recurrent=dict(layer_pattern=["mamba2", "none", "global", "none", "none"],
                       ffn_pattern=["none", "dense", "none", "dense", "moe"],
                       mamba2=dict(n_heads=8, head_dim=8, d_state=16, n_groups=2, d_conv=4, chunk_size=4))),
    # Qwen3-Next-like: gated DeltaNet layers (chunks of 4: a prefill of 8 is 2 chunks) and gated attention
    # with partial RoPE, with a MoE (sigmoid-gated shared expert) and a dense layer.
    "hybrid_gated_deltanet": dict(
        attention=dict(**ATTN, head_dim=16, qk_norm="head", output_gate=True), ffn=SWIGLU, n_layers=3,
        rotary_fraction=0.25,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, d_ff_shared=48, shared_expert_gate=True, dense_layers=[1]),
        recurrent=dict(layer_pattern=["gated_deltanet", "global", "gated_deltanet"],
                       gated_deltanet=dict(n_k_heads=2, n_v_heads=4, d_k=16, d_v=8, d_conv=4, chunk_size=4))),
    # Beam-like (lmcost.model.hf.layouts_a): a gated attention output with a bias per head on the gate, sliding
    # layers with RoPE and a global NoPE layer with its query scale, sandwich norms, a dense then a MoE layer.
    "gate_bias_sandwich_nope_moe": dict(
        attention=dict(**ATTN, head_dim=16, qk_norm="head", output_gate=True, output_gate_bias=True,
                       temperature_tuning=True, sliding_window=W, layer_pattern=["local", "global_nope"]),
        ffn=SWIGLU, block="sandwich", final_logit_softcap=30.0,
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, dense_layers=[0])),
    # MiniMax-like: lightning attention (blocks of 4: a prefill of 8 is 2 blocks, 3 + 4 a continued pass)
    # beside softmax attention, with MoE layers.
    "hybrid_lightning": dict(
        attention=dict(**ATTN), ffn=SWIGLU, n_layers=3, moe=dict(n_experts=4, top_k=2, d_ff_expert=32),
        recurrent=dict(layer_pattern=["lightning", "global", "lightning"],
                       lightning=dict(n_heads=4, head_dim=16, block_size=4))),
    # DBRX-like: q, k, v clamped to a bound small enough to bite, LayerNorms without bias, experts in every layer.
    "clip_qkv_layernorm_moe": dict(attention=dict(**ATTN, clip_qkv=0.05), ffn=SWIGLU, norm="layernorm",
                                   moe=dict(n_experts=4, top_k=2, d_ff_expert=32)),
    "hybrid_short_conv": dict(
        attention=dict(**ATTN, qk_norm="head"), ffn=SWIGLU, n_layers=3,
        recurrent=dict(layer_pattern=["short_conv", "global", "short_conv"], short_conv=dict(d_conv=3, bias=True))),
    # State-space stacks (lmcost.operators.ssm): Jamba-like Mamba-1 layers (weighted dt/B/C norms, biased in/out
    # projections) beside attention without positions, with MoE; Falcon-Mamba-like Mamba-1 blocks alone (no
    # attention or ffn section) and Mamba-2 blocks alone.
    "ssm_mamba1_jamba": dict(
        attention=ATTN, ffn=SWIGLU, n_layers=3, positions="none",
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, dense_layers=[0, 2]),
        recurrent=dict(layer_pattern=["mamba", "global", "mamba"],
                       mamba=dict(d_inner=128, dt_rank=8, d_state=16, d_conv=4, proj_bias=True, bc_dt_norm="weighted"))),
    "ssm_mamba1_alone": dict(
        positions="none", recurrent=dict(layer_pattern=["mamba"], ffn_pattern=["none"],
                                         mamba=dict(d_inner=128, dt_rank=4, d_state=8, bc_dt_norm="weightless"))),
    "ssm_mamba2_alone": dict(
        positions="none", recurrent=dict(layer_pattern=["mamba2"], ffn_pattern=["none"],
                                         mamba2=dict(n_heads=8, head_dim=16, d_state=16, n_groups=2, chunk_size=4))),
    # RecurrentGemma-like (lmcost.operators.rnn): RG-LRU blocks (width 48 in 4 gate blocks, conv of 4 taps) and a
    # local MQA layer (window W, biased output, partial RoPE), biased GeGLU MLPs, tied and soft-capped logits.
    "hybrid_rg_lru": dict(
        attention=dict(n_heads=4, n_kv_heads=1, out_bias=True, sliding_window=W), n_layers=3, rotary_fraction=0.5,
        ffn=dict(activation="geglu", d_ff=96, bias=True), tie_embeddings=True, final_logit_softcap=30.0,
        recurrent=dict(layer_pattern=["rg_lru", "local", "rg_lru"], rg_lru=dict(width=48, n_blocks=4, d_conv=4))),
    # RWKV-4-like (lmcost.operators.rnn): time mixing and channel mixing blocks alone (no attention section),
    # LayerNorms with biases, the first block's pre_ln as embedding_norm.
    "rwkv4_alone": dict(
        ffn=dict(activation="relu2", d_ff=96), norm="layernorm", norm_bias=True, embedding_norm=True, positions="none",
        recurrent=dict(layer_pattern=["rwkv4"], ffn_pattern=["rwkv4_channel"], rwkv4={})),
    # xLSTM-7B-like (lmcost.operators.rnn): mLSTM blocks alone (no attention section) with SwiGLU FFNs; chunks of
    # 4, so a prefill of 8 is two chunks and one of 3 (or a chunk at 3 of 4) runs step by step.
    "mlstm_alone": dict(
        ffn=SWIGLU, positions="none", final_logit_softcap=30.0,
        recurrent=dict(layer_pattern=["mlstm"], mlstm=dict(n_heads=4, qk_dim=32, v_dim=64, chunk_size=4))),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is fastest, and immune to a busy machine's oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(name: str) -> ArchConfig:
    data = dict(name=name, d_model=64, n_layers=2, vocab_size=128)
    data.update(CONFIGS[name])
    return ArchConfig.model_validate(data)


def is_mla(name: str) -> bool:
    return name.startswith("mla")


# (config, kernel, mla mode): both kernels everywhere, both MLA modes for MLA configs.
CASES = [(c, k, m) for c in CONFIGS for k in ("flash", "naive")
         for m in (("absorbed", "naive") if is_mla(c) else ("absorbed",))]
CASE_IDS = [f"{c}-{k}" + (f"-{m}" if is_mla(c) else "") for c, k, m in CASES]


def model_of(name, kernel="flash", mla_mode="absorbed", dtype=torch.float32, seed=0, **kw):
    return build_decoder(config(name), max_batch=MAX_B, max_context=MAX_T, dtype=dtype, kernel=kernel,
                         mla_mode=mla_mode, seed=seed, **kw)


def token_ids(n=S + 1, seed=1):
    return torch.randint(0, 128, (B, n), generator=torch.Generator().manual_seed(seed))


def inputs(name, n=S + 1, seed=1):
    """Token ids, or hidden states [B, n, d] for a bare layer stack (embeddings: false)."""
    if config(name).embeddings:
        return token_ids(n, seed)
    return torch.randn(B, n, 64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", CONFIGS)
def test_parameters_equal_param_counts(name):
    cfg = config(name)
    model = model_of(name)
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg)["total"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", CONFIGS)
def test_kv_cache_bytes_equal_kv_bytes(name, dtype):
    cfg = config(name)
    model = model_of(name, dtype=dtype)
    p = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    tensors = model.kv_cache_tensors()
    fp32 = {id(t) for layer in model.layers for t in getattr(layer.attn, "state_tensors", list)()}  # SSM states
    assert all(t.dtype == (torch.float32 if id(t) in fp32 else dtype) for t in tensors)
    assert sum(t.nbytes for t in tensors) == kv_bytes(cfg, Precision(p, p, p), MAX_B, MAX_T)


def analytic_matmul_flops(cfg, phase, tokens, mla_mode):
    ops = phase_ops(cfg, Precision(), phase, B, tokens, Settings(kernel="naive", mla=mla_mode))
    return sum(op.flops * op.count for op in ops if op.matmul)


@pytest.mark.parametrize("name,kernel,mla_mode", CASES, ids=CASE_IDS)
def test_matmul_flops_equal_flop_counter(name, kernel, mla_mode):
    model = model_of(name, kernel, mla_mode, sdpa_backend="math")  # whose bmm FlopCounterMode counts
    flops_equal_analytic(config(name), model, inputs(name), mla_mode)


def flops_equal_analytic(cfg, model, ids, mla_mode):
    """FlopCounterMode's FLOPs of a prefill of S tokens of ``ids`` and one decode step are the analytic ones."""
    with FlopCounterMode(display=False) as prefill:
        model(ids[:, :S], 0)
    with FlopCounterMode(display=False) as decode:
        model(ids[:, S:], S)
    assert prefill.get_total_flops() == analytic_matmul_flops(cfg, "prefill", S, mla_mode)
    # The decode step attends to the S cached tokens and itself: context t = S + 1.
    assert decode.get_total_flops() == analytic_matmul_flops(cfg, "decode", S + 1, mla_mode)


def profiled_names(model, ids, start_pos):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(ids, start_pos)
    return {e.name for e in prof.events() if "::" not in e.name}


@pytest.mark.parametrize("name,kernel,mla_mode", CASES, ids=CASE_IDS)
def test_profiler_scopes_are_the_analytic_ops(name, kernel, mla_mode):
    cfg = config(name)
    model = model_of(name, kernel, mla_mode)
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), B, S, S), kernel, mla_mode)
    expected = {op.name for op in ops} - ({op.name for op in ops if op.name.endswith(("attn.softmax", "attn.alibi"))}
                                          if kernel == "flash" else set())
    expected -= {op.name for op in ops if op.name.endswith("attn.sinks")}  # inside the softmax: no scope
    assert scope_names(model) == analytic_names(cfg, kernel, mla_mode) == expected
    ids = inputs(name)
    assert profiled_names(model, ids[:, :S], 0) == expected
    assert profiled_names(model, ids[:, S:], S) == expected  # a decode step runs every operator too


# Causal configs only: in a bidirectional pass every token sees the later ones, so the K/V a prefill
# caches in layers 2.. differ from the full pass (a KV cache presumes causality); the bidirectional
# configs are checked by test_bare_stack_and_bidirectional_masks instead.
CAUSAL = [(c, i) for c, i in zip(CASES, CASE_IDS) if config(c[0]).causal]


@pytest.mark.parametrize("name,kernel,mla_mode", [c for c, _ in CAUSAL], ids=[i for _, i in CAUSAL])
def test_prefill_then_decode_equals_one_prefill(name, kernel, mla_mode):
    model = model_of(name, kernel, mla_mode)
    ids = inputs(name)
    full = model(ids, 0)
    model.reset_cache()
    prefill = model(ids[:, :S], 0)
    step = model(ids[:, S:], S)
    torch.testing.assert_close(prefill, full[:, :S], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-4, atol=1e-4)


CHUNKED = ["gqa", "sliding_window_all_local", "sandwich_local_global_qk_head", "mla_local_global",
           "mla_moe_shared_dense_first", "window_wider_than_cache", "hybrid_mamba2_blocks", "hybrid_short_conv", "hybrid_gated_deltanet",
           "hybrid_lightning", "ssm_mamba1_jamba", "ssm_mamba1_alone", "ssm_mamba2_alone",
           "hybrid_rg_lru", "rwkv4_alone", "mlstm_alone"]


@pytest.mark.parametrize("kernel", ["flash", "naive"])
@pytest.mark.parametrize("name", CHUNKED)
def test_chunks_and_wrapping_decode_equal_one_prefill(name, kernel):
    """Prefill 3, a chunk of 4 at position 3 (past the rolling buffer of w = 4: the kernel gathers older
    keys, then writes), then 5 decode steps that wrap the buffer; all logits as one prefill of 12."""
    for mla_mode in (("absorbed", "naive") if is_mla(name) else ("absorbed",)):
        model = model_of(name, kernel, mla_mode)
        ids = token_ids(12)
        full = model(ids, 0)
        torch.testing.assert_close(in_pieces(model, ids, 3, 7), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_sliding_window_sees_the_last_w_tokens(kernel):
    """One all-local layer of window 4: the token at position 8 sees positions 5..8 and nothing older."""
    data = dict(name="w", d_model=64, n_layers=1, vocab_size=128, attention=dict(**ATTN, sliding_window=W),
                ffn=SWIGLU)
    model = build_decoder(ArchConfig.model_validate(data), max_batch=B, max_context=MAX_T, kernel=kernel)
    ids = token_ids()
    base = model(ids, 0)[:, -1]
    for pos, changes in ((4, False), (5, True)):
        other = ids.clone()
        other[:, pos] = (other[:, pos] + 1) % 128
        model.reset_cache()
        model(other[:, :S], 0)
        for out in (model(other, 0)[:, -1], model(other[:, S:], S)[:, -1]):
            assert (not torch.allclose(out, base, rtol=1e-5, atol=1e-5)) == changes, pos
            model.reset_cache()
            model(other[:, :S], 0)


@pytest.mark.parametrize("name", ["gqa", "mla_q_lora", "mla_local_global", "sandwich_local_global_qk_head",
                                  "moe_shared_gate_dense_layer"])
def test_kernels_and_mla_modes_agree(name):
    """flash and naive kernels, MLA absorbed and naive: the same weights, the same logits."""
    ids = token_ids()
    modes = ("absorbed", "naive") if is_mla(name) else ("absorbed",)
    outs = [model_of(name, k, m)(ids, 0) for k in ("flash", "naive") for m in modes]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", ["gqa", "mla_moe_shared_dense_first", "sandwich_local_global_qk_head"])
def test_low_precision_runs_close_to_fp32(name, dtype):
    ids = token_ids()
    ref = model_of(name)(ids, 0)
    model = model_of(name, dtype=dtype)
    assert all(p.dtype == dtype for p in model.parameters())
    with torch.inference_mode():  # as lmcost profile runs it
        out = model(ids[:, :S], 0)
        step = model(ids[:, S:], S)
    assert out.dtype == dtype and torch.isfinite(out).all() and torch.isfinite(step).all()
    # The weights are the fp32 model's, rounded: the logits agree to the dtype's precision.
    err = (step[:, -1].float() - ref[:, -1]).abs().max() / ref[:, -1].abs().max()
    assert err < {torch.bfloat16: 0.03, torch.float16: 0.005}[dtype]


def test_seeds_and_inputs_are_checked():
    model = model_of("gqa")
    same = model_of("gqa")
    other = model_of("gqa", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    assert not torch.equal(model.embed, other.embed)
    ids = token_ids(MAX_T + 1)
    with pytest.raises(ValueError, match="max_context"):
        model(ids, 0)
    with pytest.raises(ValueError, match="max_batch"):
        model(torch.zeros(MAX_B + 1, 1, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="kernel"):
        build_decoder(config("gqa"), max_batch=1, max_context=4, kernel="paged")


def test_analytic_core_imports_no_torch():
    code = ("import sys, lmcost, lmcost.apps.estimate, lmcost.cost.params, lmcost.cost.kvcache, lmcost.operators.forward; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.transformers
def test_matches_transformers_qwen2_moe():
    """An independent oracle for the common path (GQA with qkv bias, RoPE, RMSNorm, SwiGLU, softmax top-k
    MoE with a sigmoid-gated shared expert, a dense first layer): the decoder's weights loaded into the
    transformers Qwen2-MoE model give the same logits."""
    transformers = pytest.importorskip("transformers")

    hf_cfg = transformers.Qwen2MoeConfig(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96,
        moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
        vocab_size=128, mlp_only_layers=[0], rms_norm_eps=1e-5, tie_word_embeddings=False, pad_token_id=None)
    ours, hf, state = _llama_like_pair(hf_cfg)
    for i, layer in enumerate(ours.layers):
        f, pre = layer.ffn, f"model.layers.{i}."
        if i == 0:
            state.update({pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                          pre + "mlp.down_proj.weight": f.w_down})
            continue
        sh = f.shared
        state.update({pre + "mlp.gate.weight": f.w_router,
                      pre + "mlp.experts.gate_up_proj": torch.cat([f.w_gate, f.w_up], 1),
                      pre + "mlp.experts.down_proj": f.w_down,
                      pre + "mlp.shared_expert.gate_proj.weight": sh.w_gate,
                      pre + "mlp.shared_expert.up_proj.weight": sh.w_up,
                      pre + "mlp.shared_expert.down_proj.weight": sh.w_down,
                      pre + "mlp.shared_expert_gate.weight": f.w_shared_gate})
    _same_logits(hf, ours, state)


@pytest.mark.transformers
def test_matches_transformers_bloom():
    """ALiBi and the embeddings' LayerNorm against an independent oracle: the decoder's weights loaded into
    transformers' BloomForCausalLM (6 heads: slopes beyond the power of two) give the same logits, in one
    prefill and in prefill + one decode step."""
    transformers = pytest.importorskip("transformers")
    from lmcost.model.hf.families import from_hf_config

    hf_cfg = transformers.BloomConfig(hidden_size=48, n_layer=2, n_head=6, vocab_size=128, pad_token_id=None,
                                      tie_word_embeddings=False)
    hf_cfg._attn_implementation = "eager"
    ours = build_decoder(from_hf_config(hf_cfg.to_dict(), "bloom"), max_batch=B, max_context=MAX_T)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"transformer.word_embeddings.weight": ours.embed, "transformer.ln_f.weight": ours.final_norm.weight,
             "transformer.ln_f.bias": ours.final_norm.bias,
             "transformer.word_embeddings_layernorm.weight": ours.embed_norm.weight,
             "transformer.word_embeddings_layernorm.bias": ours.embed_norm.bias, "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"transformer.h.{i}."
        # BLOOM's fused query_key_value is [heads, (q, k, v), d_h] along its output rows
        per_head = lambda *m: torch.stack([x.reshape(6, 8, *x.shape[1:]) for x in m], 1).flatten(0, 2)  # noqa: E731
        state.update({pre + "self_attention.query_key_value.weight": per_head(a.wq, a.wk, a.wv),
                      pre + "self_attention.query_key_value.bias": per_head(a.bq, a.bk, a.bv),
                      pre + "self_attention.dense.weight": a.wo, pre + "self_attention.dense.bias": a.bo,
                      pre + "mlp.dense_h_to_4h.weight": f.w_up, pre + "mlp.dense_h_to_4h.bias": f.b_up,
                      pre + "mlp.dense_4h_to_h.weight": f.w_down, pre + "mlp.dense_4h_to_h.bias": f.b_down})
        for norm, mine in (("input_layernorm", layer.attn_norm), ("post_attention_layernorm", layer.ffn_norm)):
            state.update({pre + norm + ".weight": mine.weight, pre + norm + ".bias": mine.bias})
    _same_logits(hf, ours, state)


@pytest.mark.transformers
def test_matches_transformers_mimo_v2_flash():
    """Value heads narrower than q/k heads, twice the KV heads and sinks on the sliding layer
    (lmcost.operators.layer_heads) against an independent oracle: the decoder's weights loaded into transformers'
    MiMoV2FlashForCausalLM give the same logits (dense MLPs: its DeepSeek-V3 router is not the decoder's; one RoPE
    base and no value scale, as the decoder has)."""
    transformers = pytest.importorskip("transformers")

    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    hf_cfg = transformers.CONFIG_MAPPING["mimo_v2_flash"](
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, head_dim=16, v_head_dim=8,
        intermediate_size=96, vocab_size=128, layer_types=["sliding_attention", "full_attention"], sliding_window=W,
        mlp_layer_types=["dense", "dense"], attention_bias=True, attention_value_scale=None, pad_token_id=None,
        rope_parameters={"sliding_attention": rope, "full_attention": rope})
    ours, hf, state = _llama_like_pair(hf_cfg)
    assert (ours.cfg.attention.local_kv_heads, ours.cfg.attention.sinks, ours.cfg.d_rot) == (2, "local", 8)
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        if a.sinks is not None:
            state[pre + "self_attn.sinks"] = a.sinks
        state.update({pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                      pre + "mlp.down_proj.weight": f.w_down})
    assert [layer.attn.sinks is not None for layer in ours.layers] == [True, False]
    _same_logits(hf, ours, state)


@pytest.mark.transformers
def test_matches_transformers_jetmoe():
    """The mixture of attention heads (lmcost.operators.mixture_of_attention) against an independent oracle: the
    decoder's weights loaded into transformers' JetMoeForCausalLM give the same logits. 2 experts, top 2 (4 query
    heads over 2 KV heads): JetMoE's MoE softmaxes its top-k logits and the decoder's MoE all E logits, the same
    weights when k = E (the attention's router is JetMoE's at any E)."""
    transformers = pytest.importorskip("transformers")
    from lmcost.model.hf.families import from_hf_config

    hf_cfg = transformers.JetMoeConfig(hidden_size=64, num_hidden_layers=2, num_key_value_heads=2, kv_channels=16,
                                       intermediate_size=32, num_local_experts=2, num_experts_per_tok=2,
                                       vocab_size=128, rms_norm_eps=1e-5, tie_word_embeddings=False)
    hf_cfg._attn_implementation = "eager"
    ours = build_decoder(from_hf_config(hf_cfg.to_dict(), "jetmoe"), max_batch=B, max_context=MAX_T)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = _llama_like_state(ours)
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        m = f.moe
        state.update({pre + "self_attention.kv_proj.weight": torch.cat([a.wk, a.wv]),
                      pre + "self_attention.experts.router.layer.weight": a.moa.w_router,
                      pre + "self_attention.experts.input_linear.weight": a.moa.w_q,
                      pre + "self_attention.experts.output_linear.weight": a.moa.w_o,
                      pre + "self_attention.experts.bias": a.moa.b_o,
                      pre + "mlp.router.layer.weight": m.w_router, pre + "mlp.bias": f.output_bias,
                      pre + "mlp.input_linear.weight": torch.cat([m.w_gate, m.w_up], 1),
                      pre + "mlp.output_linear.weight": m.w_down})
    _same_logits(hf, ours, state)


@pytest.mark.transformers
def test_matches_transformers_doge():
    """Dynamic mask attention and learned residual scales (lmcost.operators.dynamic_mask, residual_scale) against an
    independent oracle: the decoder's weights loaded into transformers' DogeForCausalLM (GQA, biases, a window of
    W) give the same logits."""
    transformers = pytest.importorskip("transformers")

    hf_cfg = transformers.DogeConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=96, vocab_size=128, attention_bias=True, sliding_window=W,
                                     rms_norm_eps=1e-5)
    ours, hf, state = _llama_like_pair(hf_cfg)
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        for scale in (layer.attn_scale, layer.ffn_scale):  # ones at init: made to differ, so they are checked
            scale.data.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(i))
        state.update({pre + "self_attn.o_proj.bias": a.bo, pre + "self_attn.dt_proj.weight": a.w_dt,
                      pre + "self_attn.dt_proj.bias": a.b_dt, pre + "self_attn.A": a.A,
                      pre + "self_attn.q_norm.weight": a.q_norm.weight, pre + "self_attn.k_norm.weight": a.k_norm.weight,
                      pre + "input_residual": layer.attn_scale, pre + "post_attention_residual": layer.ffn_scale,
                      pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                      pre + "mlp.down_proj.weight": f.w_down})
    _same_logits(hf, ours, state)


def _llama_like_pair(hf_cfg):
    """The reference decoder of transformers config ``hf_cfg`` (mapped by lmcost), transformers' model of it (eager
    attention), and the decoder's weights under transformers' names: :func:`_llama_like_state` and each layer's
    q/k/v/o weights and q/k/v biases (``self_attn.*_proj``)."""
    from lmcost.model.hf.families import from_hf_config

    hf_cfg._attn_implementation = "eager"
    ours = build_decoder(from_hf_config(hf_cfg.to_dict(), hf_cfg.model_type), max_batch=B, max_context=MAX_T)
    hf = pytest.importorskip("transformers").AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = _llama_like_state(ours)
    for i, layer in enumerate(ours.layers):
        pre, a = f"model.layers.{i}.", layer.attn
        state.update({pre + f"self_attn.{n}_proj.weight": getattr(a, f"w{n}") for n in "qkvo"})
        state.update({pre + f"self_attn.{n}_proj.bias": getattr(a, f"b{n}") for n in "qkv"})
    return ours, hf, state


def _llama_like_state(ours) -> dict:
    """The decoder's embedding, final norm, lm_head and per-layer norms under transformers' Llama-style names."""
    state = {"model.embed_tokens.weight": ours.embed, "model.norm.weight": ours.final_norm.weight,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        state.update({f"model.layers.{i}.input_layernorm.weight": layer.attn_norm.weight,
                      f"model.layers.{i}.post_attention_layernorm.weight": layer.ffn_norm.weight})
    return state


def _same_logits(hf, ours, state: dict) -> None:
    """Load ``state`` (every parameter of ``hf``, by its name) into transformers' model and check that the
    decoder's logits equal its own, in one prefill and in prefill + one decode step."""
    assert set(state) == {n for n, _ in hf.named_parameters()}
    hf.load_state_dict(state, strict=True)
    ids = token_ids()
    with torch.no_grad():
        expected = hf(ids).logits
    torch.testing.assert_close(ours(ids, 0), expected, rtol=1e-4, atol=1e-4)
    ours.reset_cache()
    ours(ids[:, :S], 0)
    torch.testing.assert_close(ours(ids[:, S:], S)[:, -1], expected[:, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel,mla_mode,q_block", [("flash", "absorbed", None), ("flash", "absorbed", 3),
                                                     ("naive", "absorbed", None), ("flash", "naive", None),
                                                     ("naive", "naive", None)])
@pytest.mark.transformers
def test_matches_transformers_deepseek_v3(kernel, mla_mode, q_block):
    """An independent oracle for MLA (q LoRA, latent KV with its RMSNorm, the shared RoPE key, W_UK and
    W_UV in one kv_b_proj): the decoder's weights loaded into transformers' DeepSeek-V3 (dense layers,
    rotate-half RoPE, eager attention) give the same logits, absorbed (the latent flash kernel, in one
    tile or in tiles of 3 queries) or up-projected, in one prefill and in prefill + decode."""
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.DeepseekV3Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, intermediate_size=96,
        first_k_dense_replace=2, q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=12, vocab_size=128, rms_norm_eps=1e-5, rope_interleave=False, tie_word_embeddings=False,
        attention_bias=False, pad_token_id=None)
    hf_cfg._attn_implementation = "eager"
    cfg = ArchConfig.model_validate(dict(name="dsv3", d_model=64, n_layers=2, vocab_size=128,
                                         attention=dict(n_heads=4, mla=MLA_Q), ffn=SWIGLU))
    ours = build_decoder(cfg, max_batch=B, max_context=MAX_T, kernel=kernel, mla_mode=mla_mode, q_block=q_block)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = _llama_like_state(ours)
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        state.update({pre + "self_attn.q_a_proj.weight": a.w_q_a, pre + "self_attn.q_a_layernorm.weight": a.q_a_norm.weight,
                      pre + "self_attn.q_b_proj.weight": a.w_q_b, pre + "self_attn.kv_a_proj_with_mqa.weight": a.w_kv_a,
                      pre + "self_attn.kv_a_layernorm.weight": a.kv_a_norm.weight,
                      pre + "self_attn.kv_b_proj.weight": a.w_kv_b, pre + "self_attn.o_proj.weight": a.wo,
                      pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                      pre + "mlp.down_proj.weight": f.w_down})
        attn = hf.model.layers[i].self_attn
        attn.q_a_layernorm.variance_epsilon = attn.kv_a_layernorm.variance_epsilon = 1e-5  # HF's default is 1e-6
    _same_logits(hf, ours, state)


@pytest.mark.parametrize("q_block", [1, 3])
@pytest.mark.parametrize("name", ["mla_local_global", "mla_moe_shared_dense_first"])
def test_latent_flash_tiles_give_the_same_logits(name, q_block):
    """The absorbed MLA flash kernel in tiles of q_block queries (each reading only the keys it sees:
    causal, window, a chunk over the cache) gives the logits of the naive kernel over every key."""
    ids = token_ids(12)
    ref = model_of(name, "naive")
    model = model_of(name, "flash", q_block=q_block)
    full = ref(ids, 0)
    torch.testing.assert_close(model(ids, 0), full, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(in_pieces(model, ids, 3, 9), full, rtol=1e-4, atol=1e-4)


def test_bare_stack_and_bidirectional_masks():
    """A bare stack maps hidden states to hidden states; bidirectional attention lets the first token
    see the last (globally) or the tokens less than w away (locally); causal attention does not."""
    x = inputs("bare_bidirectional_stack")
    model = model_of("bare_bidirectional_stack")
    out = model(x, 0)
    assert out.shape == x.shape
    with pytest.raises(ValueError, match="hidden states"):
        model(token_ids(), 0)
    y = x.clone()
    y[:, -1] += 1.0
    assert not torch.allclose(model(y, 0)[:, 0], out[:, 0])
    data = dict(name="l", d_model=64, n_layers=1, vocab_size=128, attention=dict(**ATTN, sliding_window=W),
                ffn=SWIGLU)
    for causal in (True, False):
        model = build_decoder(ArchConfig.model_validate({**data, "causal": causal}), max_batch=B, max_context=MAX_T)
        ids = token_ids()
        base = model(ids, 0)[:, 2]   # position 2 sees 0..2 (causal), or 0..5 (bidirectional, w = 4)
        for pos, sees in ((5, not causal), (6, False)):
            other = ids.clone()
            other[:, pos] = (other[:, pos] + 1) % 128
            assert (not torch.allclose(model(other, 0)[:, 2], base, rtol=1e-5, atol=1e-5)) == sees, (causal, pos)
