"""Relations that must hold for every valid config (hypothesis draws the configs)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcost import Precision, Settings, Workload, estimate, grid, load_gpu
from lmcost.model.config import ArchConfig
from lmcost.apps.estimate import phase_ops, phase_totals
from lmcost.operators.forward import total
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.roofline import op_time, intensity

H100 = load_gpu("h100")
BF16 = Precision()
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def configs(draw, mla=None, moe=None, window=None):
    h_kv = draw(st.sampled_from([1, 2, 4]))
    h = h_kv * draw(st.sampled_from([1, 2, 4]))
    d_h = draw(st.sampled_from([16, 32, 64]))
    d = h * d_h * draw(st.sampled_from([1, 2]))
    attention = dict(n_heads=h, n_kv_heads=h_kv, head_dim=d_h, qkv_bias=draw(st.booleans()),
                     qk_norm=draw(st.sampled_from(["none", "head", "full"])))
    if window if window is not None else draw(st.booleans()):
        attention["sliding_window"] = draw(st.sampled_from([16, 64, 256]))
        attention["layer_pattern"] = draw(st.sampled_from([["local"], ["local", "global"], ["local"] * 3 + ["global"]]))
    if mla if mla is not None else draw(st.booleans()):
        attention["qk_norm"] = "none"  # MLA normalises its latent instead (kv_a_norm)
        attention["mla"] = dict(kv_lora_rank=draw(st.sampled_from([32, 64])), q_lora_rank=draw(st.sampled_from([None, 48])),
                                qk_nope_head_dim=d_h, qk_rope_head_dim=16, v_head_dim=d_h)
    n_layers = draw(st.integers(1, 6))
    cfg = dict(name="drawn", d_model=d, n_layers=n_layers, vocab_size=draw(st.sampled_from([1000, 32000])),
               attention=attention,
               ffn=dict(activation=draw(st.sampled_from(["relu", "gelu", "swiglu", "geglu"])), d_ff=4 * d),
               norm=draw(st.sampled_from(["rmsnorm", "layernorm"])),
               block=draw(st.sampled_from(["pre_norm", "post_norm", "sandwich", "parallel"])),
               positions=draw(st.sampled_from(["rope", "none"])), tie_embeddings=draw(st.booleans()))
    if moe if moe is not None else draw(st.booleans()):
        cfg["moe"] = dict(n_experts=8, top_k=draw(st.sampled_from([1, 2])), d_ff_expert=2 * d,
                          n_shared_experts=draw(st.sampled_from([0, 1])), first_dense_layers=draw(st.integers(0, min(1, n_layers - 1))))
    return ArchConfig.model_validate(cfg)


def with_kv_heads(cfg, h_kv):
    data = cfg.model_dump()
    data["attention"]["n_kv_heads"] = h_kv
    return ArchConfig.model_validate(data)


@FAST
@given(configs(mla=False), st.integers(1, 16), st.integers(1, 4096))
def test_gqa_with_all_heads_is_mha(cfg, b, t):
    mha = with_kv_heads(cfg, None)
    gqa = with_kv_heads(cfg, cfg.attention.n_heads)
    assert phase_ops(mha, BF16, "decode", b, t) == phase_ops(gqa, BF16, "decode", b, t)


@FAST
@given(configs(mla=False, window=False), st.integers(1, 8), st.integers(1, 2000))
def test_kv_bytes_linear_in_b_t_and_h_kv_and_free_of_h(cfg, b, t):
    one = kv_bytes(cfg, BF16, 1, 1)
    assert kv_bytes(cfg, BF16, b, t) == b * t * one
    # 2·L·h_kv·d_h·2 bytes per token: linear in h_kv and L, no h.
    assert one == 2 * cfg.n_layers * cfg.h_kv * cfg.d_h * 2
    data = cfg.model_dump()
    data["attention"]["n_heads"] *= 2
    data["attention"]["head_dim"] = cfg.d_h
    assert kv_bytes(ArchConfig.model_validate(data), BF16, b, t) == kv_bytes(cfg, BF16, b, t)


@FAST
@given(configs(window=True), st.integers(1, 4), st.integers(1, 5000))
def test_local_layers_cap_the_cache(cfg, b, t):
    w = cfg.attention.sliding_window
    assert kv_bytes(cfg, BF16, b, t) <= kv_bytes(cfg, BF16, b, t + 1)
    if "global" not in (cfg.attention.layer_pattern or ["local"]):
        assert kv_bytes(cfg, BF16, b, max(t, w)) == kv_bytes(cfg, BF16, b, w)


@FAST
@given(configs(moe=False), st.integers(1, 64), st.integers(1, 64), st.integers(1, 4096))
def test_dense_weight_reads_do_not_depend_on_batch(cfg, b1, b2, t):
    w = lambda b: total([op for op in phase_ops(cfg, BF16, "decode", b, t) if op.name != "embed"], "weight_bytes")
    assert w(b1) == w(b2)


@FAST
@given(configs(), st.integers(1, 64), st.integers(1, 4096), st.sampled_from(["prefill", "decode"]))
def test_roofline_per_op(cfg, b, t, phase):
    ridge = H100.ridge_point("bf16")
    for op in phase_ops(cfg, BF16, phase, b, t):
        tm = op_time(op, H100, BF16)
        assert tm.time_s >= tm.compute_s and tm.time_s >= tm.memory_s
        assert tm.time_s in (tm.compute_s, tm.memory_s)
        if op.matmul and op.bytes > 0:
            # memory-bound exactly when intensity is below the ridge point peak/bandwidth
            assert (tm.memory_s > tm.compute_s) == (intensity(op.flops, op.bytes) < ridge)


@FAST
@given(configs(), st.integers(1, 32), st.integers(16, 2048), st.integers(2, 64))
def test_totals_are_sums_of_parts(cfg, b, prompt, gen):
    est = estimate(cfg, H100, Workload(b, prompt, gen), BF16)
    for phase in ("prefill", "decode"):
        classes = est.op_classes[est.op_classes.phase == phase]
        ops = est.ops[est.ops.phase == phase]
        assert classes.flops.sum() == pytest.approx(getattr(est, phase)["flops"])
        assert classes.time_s.sum() == pytest.approx(getattr(est, phase)["time_s"])
        assert ops.bytes.sum() == pytest.approx(ops.weight_bytes.sum() + ops.act_bytes.sum() + ops.kv_bytes.sum())
    assert est.memory["total_bytes"] == pytest.approx(
        est.memory["weights_bytes"] + est.memory["kv_cache_bytes"] + est.memory["activations_bytes"])


@FAST
@given(configs(), st.sampled_from(["prefill", "decode"]))
def test_grid_equals_pointwise(cfg, phase):
    batch, tokens = [1, 3, 64], [1, 100, 3000]
    g = grid(cfg, H100, BF16, phase, batch, tokens)
    for row in g.itertuples():
        point = phase_totals(cfg, H100, BF16, phase, row.batch, row.tokens)
        assert row.flops == pytest.approx(point.flops) and row.time_s == pytest.approx(point.time_s)


@FAST
@given(configs(mla=False), st.integers(1, 32), st.integers(1, 8192))
def test_mqa_le_gqa_le_mha_in_cache_and_decode_time(cfg, b, t):
    h = cfg.attention.n_heads
    variants = [with_kv_heads(cfg, k) for k in (1, max(1, h // 2), h)]
    kv = [kv_bytes(c, BF16, b, t) for c in variants]
    step = [phase_totals(c, H100, BF16, "decode", b, t).time_s for c in variants]
    assert kv == sorted(kv) and step == sorted(step)


@FAST
@given(configs(), st.integers(1, 8), st.integers(2, 4096), st.sampled_from(["prefill", "decode"]))
def test_flash_does_no_more_work_than_naive(cfg, b, t, phase):
    flash = total(phase_ops(cfg, BF16, phase, b, t, Settings(kernel="flash")), "flops")
    naive = total(phase_ops(cfg, BF16, phase, b, t, Settings(kernel="naive")), "flops")
    assert flash <= naive


@FAST
@given(configs(mla=True), st.integers(1, 64), st.integers(64, 8192))
def test_mla_absorbed_reads_fewer_bytes_per_decode_step(cfg, b, t):
    # Per cached token, naive reads the latent, writes and reads back h·(d_nope + d_v) of K and V;
    # absorbed reads d_c + d_r. Its query is wider (h·(d_c + d_r)), which a tiny cache (t = 1, one
    # head: hypothesis found it) does not pay back; from 64 cached tokens on it always does.
    absorbed = total(phase_ops(cfg, BF16, "decode", b, t, Settings(mla="absorbed")), "bytes")
    naive = total(phase_ops(cfg, BF16, "decode", b, t, Settings(mla="naive")), "bytes")
    assert absorbed < naive


@pytest.mark.parametrize("batch, tokens, field", [([0], [10], "batch"), ([1.5], [10], "batch"), ([-1], [10], "batch"),
                                                  ([1], [0], "tokens")])
def test_grid_validates_its_input(batch, tokens, field):
    from lmcost import LmcostError, load_config
    with pytest.raises(LmcostError) as e:
        grid(load_config("llama-3-8b"), H100, BF16, "decode", batch, tokens)
    assert e.value.field == field
