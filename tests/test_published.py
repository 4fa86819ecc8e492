"""Published figures, and the miscounts other tools have shipped (each one a test here)."""

from __future__ import annotations

import pytest

from lmcost import Precision, load_config
from lmcost.apps.estimate import phase_ops
from lmcost.operators.forward import total
from lmcost.cost.kvcache import kv_bytes, kv_bytes_per_token
from lmcost.operators.ops import OpClass

BF16 = Precision()


@pytest.mark.parametrize("model, expected", [
    ("llama-2-7b", 32 * 2 * 32 * 128 * 2),        # 524,288: MHA, 32 layers x K,V x 32 heads x 128 x 2 B
    ("llama-3-8b", 32 * 2 * 8 * 128 * 2),         # 131,072: GQA-8
    ("mistral-7b", 32 * 2 * 8 * 128 * 2),         # 131,072
    ("qwen2.5-7b", 28 * 2 * 4 * 128 * 2),         # 57,344: GQA-4
    ("falcon-7b", 32 * 2 * 1 * 64 * 2),           # 8,192: MQA
    ("deepseek-v3", 61 * (512 + 64) * 2),         # 70,272: MLA latent + RoPE key, not 124,928
    ("deepseek-v2-lite", 27 * (512 + 64) * 2),    # 31,104
])
def test_kv_bytes_per_token_bf16(model, expected):
    assert kv_bytes_per_token(load_config(model), BF16) == expected


def test_expected_kv_literals():
    # The literals the issue quotes, so the arithmetic above is not only ours.
    assert [524_288, 131_072, 57_344, 8_192, 70_272, 31_104] == [
        32 * 2 * 32 * 128 * 2, 32 * 2 * 8 * 128 * 2, 28 * 2 * 4 * 128 * 2, 32 * 2 * 64 * 2,
        61 * (512 + 64) * 2, 27 * (512 + 64) * 2]


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_gqa_kv_reads_sized_by_kv_heads(kernel):
    # Llama-3.1-70B decoding one sequence at context 4096 reads 80·2·4096·8·128·2 bytes of K/V per step.
    cfg = load_config("llama-3.1-70b")
    from lmcost.apps.estimate import Settings

    ops = phase_ops(cfg, BF16, "decode", 1, 4096, Settings(kernel=kernel))
    reads = sum(op.kv_read_bytes * op.count for op in ops if op.op_class is OpClass.ATTENTION)
    assert reads == 80 * 2 * 4096 * 8 * 128 * 2 == 1_342_177_280


def test_flash_prefill_writes_no_score_matrix():
    # Llama-2-7B prefill of 4096 tokens: the flash kernel reads Q, K, V and writes O,
    # 4·4096·4096·2 bytes per layer (h·d_h = 4096), not the gigabytes of a 32·4096² score matrix.
    ops = phase_ops(load_config("llama-2-7b"), BF16, "prefill", 1, 4096)
    sdpa = [op for op in ops if op.name.endswith("attn.sdpa")][0]
    assert sdpa.bytes == 4 * 4096 * 4096 * 2
    assert max(op.act_write_bytes for op in ops if op.name.startswith("layers.")) < 32 * 4096 * 4096 * 2
    from lmcost.apps.estimate import Settings

    naive = phase_ops(load_config("llama-2-7b"), BF16, "prefill", 1, 4096, Settings(kernel="naive"))
    score = [op for op in naive if op.name.endswith("attn.score")][0]
    assert score.act_write_bytes == 32 * 4096 * 4096 * 2  # b·h·s·t elements, written


def test_sliding_window_caps_the_cache():
    # Mistral-7B (window 4096) at context 32,768 holds 32·2·8·128·2·4096 bytes per sequence.
    assert kv_bytes(load_config("mistral-7b"), BF16, 1, 32_768) == 32 * 2 * 8 * 128 * 2 * 4096 == 536_870_912
    # Below the window the cache grows with t.
    assert kv_bytes(load_config("mistral-7b"), BF16, 1, 1000) == 32 * 2 * 8 * 128 * 2 * 1000


def test_moe_decode_reads_routed_experts_only():
    # Mixtral-8x7B, bf16: at batch 1 a step streams the 12.9B active parameters less the 32000x4096
    # embedding table it only gathers one row of: about 25.5 GB. At batch 64, 8·(1-(6/8)^64) ≈ 8 experts
    # per layer are touched: nearly all 46.7B parameters, about 93 GB.
    cfg = load_config("mixtral-8x7b")
    w1 = total(phase_ops(cfg, BF16, "decode", 1, 4096), "weight_bytes")
    w64 = total(phase_ops(cfg, BF16, "decode", 64, 4096), "weight_bytes")
    assert w1 == pytest.approx(25.5e9, rel=0.01)
    assert w64 == pytest.approx(93e9, rel=0.01)


def test_lm_head_flops_counted():
    # lm_head: 2·b·s·d·V = 2·2·128·4096·128256 FLOPs for Llama-3-8B, b=2, s=128.
    ops = phase_ops(load_config("llama-3-8b"), BF16, "prefill", 2, 128)
    head = [op for op in ops if op.name == "lm_head"][0]
    assert head.flops == 2 * 2 * 128 * 4096 * 128256


def test_int4_weights_count_group_scales():
    # int4 with one fp16 scale per 128 weights: 0.5 + 2/128 bytes per weight.
    p = Precision(weights="int4")
    assert p.B_w == 0.515625


def test_one_operator_roofline_by_hand():
    # Llama-3-8B q_proj in one decode step at b=1 on an H100 SXM (989.4 TFLOP/s bf16, 3.35 TB/s):
    # FLOPs 2·4096·4096 = 33,554,432; bytes: weight 4096·4096·2 + x 4096·2 + q 4096·2 = 33,570,816.
    # compute 33,554,432 / 989.4e12 = 33.9 ns; memory 33,570,816 / 3.35e12 = 10.02 us: memory-bound.
    from lmcost import load_gpu
    from lmcost.cost.roofline import op_time

    q = next(op for op in phase_ops(load_config("llama-3-8b"), BF16, "decode", 1, 2048) if op.name == "layers.attn.q_proj")
    assert (q.flops, q.bytes) == (33_554_432, 33_570_816)
    t = op_time(q, load_gpu("h100"), BF16)
    assert t.time_s == pytest.approx(33_570_816 / 3.35e12) and t.memory_s > t.compute_s


def test_prefill_activation_peak_by_hand():
    # Llama-3-8B, b=8, s=2048, bf16: the largest operator is the lm_head, reading x [8,2048,4096] and
    # writing logits [8,2048,128256]; beside it the residual stream [8,2048,4096]:
    # 8·2048·(4096 + 128256 + 4096)·2 = 4,471,128,064 bytes.
    from lmcost import Workload, estimate, load_gpu
    est = estimate(load_config("llama-3-8b"), load_gpu("h100"), Workload(8, 2048, 256))
    assert est.memory["activations_bytes"] == 8 * 2048 * (4096 + 128256 + 4096) * 2 == 4_471_128_064


def test_tpot_is_the_mean_of_the_decode_steps():
    # gen = 4: the first token comes from prefill; steps at t = 513, 514, 515 follow; TPOT is their mean.
    from lmcost import Workload, estimate, load_gpu
    from lmcost.apps.estimate import phase_totals

    cfg, g = load_config("llama-3-8b"), load_gpu("h100")
    est = estimate(cfg, g, Workload(2, 512, 4))
    steps = [phase_totals(cfg, g, BF16, "decode", 2, t).time_s for t in (513, 514, 515)]
    assert est.tpot_s == pytest.approx(sum(steps) / 3)
    assert est.throughput_tokens_per_s == pytest.approx(2 * 4 / (est.ttft_s + sum(steps)))
