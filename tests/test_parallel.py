"""Parallel layouts (lmcost.operators.parallel): one GPU's sharded work, its communication operators and its memory,
against figures worked by hand from the Megatron-LM scheme (Shoeybi et al. 2019, section 3) and the
published Llama-3.1-70B and DeepSeek-V3 configs. The collectives are checked against a real gloo run
in tests/test_distributed.py."""

from __future__ import annotations

import math

import pytest

from lmcost import load_config
from lmcost.cost.collectives import collective
from lmcost.hardware.cluster import load_cluster
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.apps.estimate import estimate
from lmcost.hardware.gpu import load_gpu
from lmcost.cost.params import param_counts
from lmcost.operators.parallel import Layout, expected_collectives, stage_layers
from lmcost.cost.compile import phase_ops
from lmcost.operators.workload import Settings, Workload

BF16 = Precision()


@pytest.fixture(scope="module")
def llama70():
    return load_config("llama-3.1-70b")


def _ops(cfg, layout, phase, b, tokens, logits="all"):
    return phase_ops(cfg, BF16, phase, b, tokens, Settings(logits=logits, layout=layout))


def test_tp8_llama70b_decode_communication(llama70):
    # d = 8192, L = 80, V = 128256, bf16. A decode step of b = 8 moves n = 8 tokens:
    # each layer all-reduces the attention and the FFN output, [8, 8192] x 2 B = 131,072 B each;
    # the vocab-parallel embedding one more: 2 * 80 + 1 = 161 all-reduces;
    # the logits [8, 128256] x 2 B = 2,052,096 B are all-gathered once.
    ops = _ops(llama70, Layout(tp=8), "decode", 8, 2304)
    comm = [op for op in ops if op.op_class.value == "communication"]
    reduces = [op for op in comm if op.collective == "all_reduce"]
    assert sum(op.count for op in reduces) == 161
    assert {op.comm_bytes for op in reduces} == {131_072}
    gathers = [op for op in comm if op.collective == "all_gather"]
    assert [(op.count, op.comm_bytes) for op in gathers] == [(1, 2_052_096)]
    assert all(op.ranks == 8 and op.comm_group == "tp" for op in comm)


def test_tp8_llama70b_memory_per_gpu(llama70):
    # Per layer on one of 8 ranks: W_q 8192 x 1024, W_k and W_v 8192 x 128 (8 KV heads: one per rank),
    # W_o 1024 x 8192, gate/up/down 3 x 8192 x 3584, two norms of 8192 (replicated):
    # 8,388,608 + 2 x 1,048,576 + 8,388,608 + 88,080,384 + 16,384 = 106,971,136; x 80 = 8,557,690,880.
    # Embedding and lm_head 16,032 x 8192 = 131,334,144 each (vocab-parallel), final norm 8192:
    # 8,820,367,360 parameters = 17,640,734,720 bytes in bf16.
    # KV: one KV head of 128 per rank: 2 x 128 x 2 B x 80 layers = 40,960 B per token;
    # 8 sequences at 2304 tokens: 754,974,720 B.
    est = estimate(llama70, load_gpu("h100"), Workload(8, 2048, 256), BF16, Settings(layout=Layout(tp=8)))
    assert est.memory["weights_bytes"] == 17_640_734_720
    assert est.memory["kv_cache_bytes"] == 754_974_720
    assert est.memory["fits"] and est.memory["total_bytes"] < est.memory["capacity_bytes"]
    # The ranks together hold the model once, plus 7 extra copies of what TP replicates (norms: 80 x 16,384 + 8192).
    total = param_counts(llama70)["total"]
    assert 8 * 8_820_367_360 - 7 * (80 * 16_384 + 8192) == total


def test_tp_splits_gemm_flops_exactly(llama70):
    # Column- and row-parallel GEMMs split their FLOPs evenly: tp ranks' GEMM FLOPs sum to one GPU's.
    one = sum(op.flops * op.count for op in _ops(llama70, Layout(), "prefill", 2, 512) if op.op_class.value == "gemm")
    four = sum(op.flops * op.count for op in _ops(llama70, Layout(tp=4), "prefill", 2, 512)
               if op.op_class.value == "gemm")
    assert 4 * four == one


def test_kv_heads_replicated_past_tp():
    # tiny-gqa: 8 query heads, 2 KV heads. tp = 4 > h_kv: each rank holds one KV head (2 copies of each),
    # so the KV cache per GPU is half of one GPU's, not a quarter.
    cfg = load_config("tiny-gqa")
    wl = Workload(4, 64, 8)
    one = estimate(cfg, load_gpu("h100"), wl, BF16).memory["kv_cache_bytes"]
    tp4 = estimate(cfg, load_gpu("h100"), wl, BF16, Settings(layout=Layout(tp=4))).memory["kv_cache_bytes"]
    assert cfg.attention.n_heads == 8 and cfg.h_kv == 2
    assert tp4 * 2 == one


def test_pipeline_stages_and_sends(llama70):
    # numpy.array_split of 80 layers into 3 stages: 27, 27, 26; the path of one microbatch crosses 2 boundaries,
    # each sending [b*s, d] = 4 x 8192 x 2 B = 65,536 B in decode at b = 4.
    assert [len(s) for s in stage_layers(llama70, 3)] == [27, 27, 26]
    ops = _ops(llama70, Layout(pp=3), "decode", 4, 1000)
    sends = [op for op in ops if op.collective == "send_recv"]
    assert [(op.count, op.comm_bytes) for op in sends] == [(2, 65_536)]
    recs = expected_collectives(llama70, Layout(pp=3), phase="decode", batch=4, tokens=1000, precision=BF16)
    assert [r["rank"] for r in recs] == [0, 1]  # the last stage sends nothing


def test_pipeline_memory_busiest_stage(llama70):
    # PP 2, TP 4: stage 0 holds 40 layers + the embedding, stage 1 40 layers + final norm + lm_head.
    # Per layer on 4 ranks: W_q 8192 x 2048, W_k/W_v 8192 x 256, W_o 2048 x 8192, FFN 3 x 8192 x 7168, norms 16,384:
    # 16,777,216 + 4,194,304 + 16,777,216 + 176,160,768 + 16,384 = 213,925,888. Stage 1: 40 x that
    # + 32,064 x 8192 (lm_head) + 8192 = 8,557,035,520 + 262,668,288 + 8192 = 8,819,712,000 params, the busier one.
    est = estimate(llama70, load_gpu("h100"), Workload(8, 1024, 64), BF16, Settings(layout=Layout(tp=4, pp=2)))
    assert est.memory["stage"] == 1
    assert est.memory["weights_bytes"] == 2 * 8_819_712_000


def test_ep_over_attention_dp_collectives():
    # DeepSeek-V3 DP8 x EP8, decode, 64 sequences: 8 per rank, k = 8, d = 7168, bf16. Each of the 58 MoE
    # layers: an all-to-all of the pair counts per destination rank and local expert, 256 int64 (2048 B),
    # a dispatch and a combine of 8 x 8 x 7168 x 2 = 917,504 B.
    cfg = load_config("deepseek-v3")
    recs = expected_collectives(cfg, Layout(dp=8, ep=8), phase="decode", batch=64, tokens=4096, precision=BF16)
    mine = [r for r in recs if r["rank"] == 0]
    assert sorted({(r["kind"], r["payload_bytes"]) for r in mine}) == [("all_to_all", 2048), ("all_to_all", 917_504)]
    assert len(mine) == 58 * 3
    assert {r["group_size"] for r in mine} == {8}


def test_ep_inside_tp_is_one_all_reduce_per_layer():
    cfg = load_config("deepseek-v3")
    ops = _ops(cfg, Layout(tp=8, ep=8), "decode", 8, 4096, logits="last")
    kinds = {(op.name, op.collective, op.count) for op in ops if op.collective}
    # 61 attention all-reduces, 3 dense-FFN and 58 MoE all-reduces, the embedding's, the logits' gather.
    assert ("layers.moe.tp.moe_all_reduce", "all_reduce", 58) in kinds
    assert ("layers.dense.tp.ffn_all_reduce", "all_reduce", 3) in kinds
    assert sum(op.count for op in ops if op.collective == "all_reduce") == 61 + 3 + 58 + 1


def test_ep_splits_expert_flops_and_weights():
    # 256 experts over 8 ranks: a rank owns 32 experts' parameters and runs k*n/8 of the pairs.
    cfg = load_config("deepseek-v3")
    full = _ops(cfg, Layout(), "prefill", 1, 1024)
    ep = _ops(cfg, Layout(tp=8, ep=8), "prefill", 1, 1024)

    def experts(ops, field):
        return sum(getattr(op, field) * op.count for op in ops if op.role.startswith("moe.expert.") and op.op_class.value == "gemm")

    assert experts(ep, "params") * 8 == experts(full, "params")
    assert math.isclose(experts(ep, "flops") * 8, experts(full, "flops"), rel_tol=1e-12)


def test_communication_time_is_the_collective_model(llama70):
    # A communication op's time is lmcost.cost.collectives' for its kind, group and payload, nothing added.
    est = estimate(llama70, load_gpu("h100"), Workload(8, 2048, 16), BF16,
                   Settings(model="calibrated", layout=Layout(tp=8)))
    row = next(r for r in est.rows if r["phase"] == "decode" and r["name"] == "layers.tp.attn_all_reduce")
    c = collective("all_reduce", 8, load_cluster("dgx-h100"))
    assert math.isclose(row["calibrated_s"], 80 * c.times(131_072.0)["calibrated_s"], rel_tol=1e-12)
    assert math.isclose(row["roofline_s"], 80 * c.times(131_072.0)["roofline_s"], rel_tol=1e-12)
    assert est.settings.layout.gpus == 8 and est.cluster == "dgx-h100"


@pytest.mark.parametrize("layout, field", [
    (dict(tp=3), "tp"),                 # 64 heads are not a multiple of 3
    (dict(ep=2), "ep"),                 # Llama has no experts
    (dict(pp=81), "pp"),                # 80 layers
    (dict(tp=0), "tp"),
    (dict(tp=2, imbalance=0.5), "imbalance"),
])
def test_layouts_refused_in_one_line(llama70, layout, field):
    with pytest.raises(LmcostError) as e:
        Layout(**layout).check(llama70)
    assert e.value.field == field


def test_batch_must_split_over_replicas_and_microbatches(llama70):
    with pytest.raises(LmcostError) as e:
        Layout(tp=2, pp=2, dp=2).check(llama70, batch=6)
    assert e.value.field == "workload.batch"


def test_plan_front_and_best(llama70):
    # The front is not dominated; the best point meets the SLOs and fits; its TTFT, TPOT and memory are
    # estimate's at that layout and batch, exactly (both are lmcost.cost.serving.serving_point; tests/test_serving.py).
    from lmcost.apps.plan import search

    s = Settings(logits="last")
    p = search(llama70, [load_gpu("h100")], 8, 2048, 256, BF16, s, ttft_s=0.5, tpot_s=0.05, max_batch=256, density=8)
    f = p.front
    for _, r in f.iterrows():
        better = p.points[(p.points.tokens_per_s_per_gpu > r.tokens_per_s_per_gpu)
                          & (p.points.tokens_per_s_per_user > r.tokens_per_s_per_user)]
        assert better.empty
    b = p.best
    assert b["ttft_s"] <= 0.5 and b["tpot_s"] <= 0.05 and b["fits"]
    lay = Layout(tp=b["tp"], pp=b["pp"], dp=b["dp"], ep=b["ep"])
    est = estimate(llama70, load_gpu("h100"), Workload(int(b["batch"]), 2048, 256), BF16,
                   Settings(logits="last", layout=lay))
    assert (b["ttft_s"], b["tpot_s"]) == (est.ttft_s, est.tpot_s)
    assert b["memory_per_gpu_bytes"] == est.memory["total_bytes"]


def test_plan_deepseek_v3_fits_on_8_h200():
    from lmcost.apps.plan import search

    cfg = load_config("deepseek-v3")
    p = search(cfg, [load_gpu("h200")], 8, 2048, 256, Precision(weights="fp8"), Settings(logits="last"),
               max_batch=512, density=8)
    assert p.best is not None and p.best["fits"]
    assert p.best["memory_per_gpu_bytes"] <= load_gpu("h200").memory_bytes


def test_sequence_parallel_swaps_all_reduce_and_shards_norms(llama70):
    # SP: each of the 160 layer all-reduces becomes a reduce-scatter and an all-gather of the same payload
    # [n, d]; the embedding's a reduce-scatter; one all-gather before the lm_head. The block's norms run on
    # n/tp tokens: their FLOPs are 1/tp of TP's (4 FLOPs per element x n x d: 4 x 4 x 512 x 8192 / 8).
    tp = _ops(llama70, Layout(tp=8), "prefill", 4, 512)
    sp = _ops(llama70, Layout(tp=8, sp=True), "prefill", 4, 512)
    count = lambda ops, kind: sum(op.count for op in ops if op.collective == kind)
    assert count(sp, "all_reduce") == 0
    assert count(sp, "reduce_scatter") == 161 and count(sp, "all_gather") == 160 + 1 + 1
    assert {op.comm_bytes for op in sp if op.collective == "reduce_scatter"} == {4 * 512 * 8192 * 2}
    norm = next(op for op in sp if op.name == "layers.attn_norm")
    assert norm.flops == 4 * 4 * 512 * 8192 / 8
    assert next(op for op in tp if op.name == "layers.attn_norm").flops == 8 * norm.flops


def test_context_parallel_prefill_and_decode(llama70):
    # CP 4 x TP 8 (32 GPUs, 4 nodes), Llama-3.1-70B, prefill of one 32k-token sequence:
    # each rank runs s/cp = 8192 tokens: GEMM FLOPs 1/32 of one GPU's (1/8 TP x 1/4 CP), and 1/4 of
    # the TP rank's causal pairs; per layer 3 sends of its K/V chunk [1, 8192, 2 x 1 x 128] bf16 = 4,194,304 B.
    S = 32768
    one = _ops(llama70, Layout(), "prefill", 1, S)
    cp = _ops(llama70, Layout(tp=8, cp=4), "prefill", 1, S)
    gemm = lambda ops: sum(op.flops * op.count for op in ops if op.op_class.value == "gemm")
    assert math.isclose(32 * gemm(cp), gemm(one), rel_tol=1e-12)
    sdpa = lambda ops: next(op.flops for op in ops if op.role == "attn.sdpa")
    assert math.isclose(32 * sdpa(cp), sdpa(one), rel_tol=1e-12)
    ring = [op for op in cp if op.comm_group == "cp"]
    assert [(op.collective, op.count, op.comm_bytes) for op in ring] == [("send_recv", 80 * 3, 4_194_304)]
    # Decode at context 32768, batch 2: each rank attends over 8192 cached tokens, and all-gathers the partial
    # outputs of its 8 heads: 4 ranks x 2 x 8 x (128 + 1) x 4 B = 33,024 B per layer.
    dec = _ops(llama70, Layout(tp=8, cp=4), "decode", 2, S)
    gathers = [op for op in dec if op.comm_group == "cp"]
    assert [(op.collective, op.count, op.comm_bytes) for op in gathers] == [("all_gather", 80, 33_024)]
    est = estimate(llama70, load_gpu("h100"), Workload(2, S, 8), BF16, Settings(layout=Layout(tp=8, cp=4)))
    # The cache per GPU: 2 sequences x (32768 + 8) / 4 tokens x 40,960 B (one KV head of 128 per TP rank, 80 layers).
    assert math.isclose(est.memory["kv_cache_bytes"], 2 * (S + 8) / 4 * 40_960, rel_tol=1e-12)


def test_report_with_a_layout_carries_communication(tmp_path, llama70):
    # lmcost report --tp 8: summary.json is estimate --json's (its communication class included), and the
    # roofline figure says what share of time communication takes (it has no FLOPs to be drawn).
    import json

    from typer.testing import CliRunner

    from lmcost.cli import app

    out = tmp_path / "rep"
    r = CliRunner().invoke(app, ["report", "llama-3.1-70b", "--gpu", "h100", "--tp", "8", "--batch", "8", "-o", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["layout"]["tp"] == 8
    assert any(c["op_class"] == "communication" and c["time_s"] > 0 for c in summary["op_classes"])
    assert "communication, not drawn (no FLOPs)" in (out / "index.html").read_text()


@pytest.mark.parametrize("layout, field", [
    (dict(sp=True), "sp"),                          # SP splits TP's all-reduces: needs tp > 1
    (dict(tp=2, imbalance=1.5), "imbalance"),       # no expert parallelism to be imbalanced
])
def test_settings_that_cannot_apply_are_refused(layout, field):
    with pytest.raises(LmcostError) as e:
        Layout(**layout)
    assert e.value.field == field


def test_sp_moves_the_same_bus_bytes_as_tp(llama70):
    # An all-reduce's bus bytes are 2(n-1)/n x its size; a reduce-scatter's and an all-gather's (n-1)/n each:
    # SP's pair moves what TP's all-reduce moves (nccl-tests doc/PERFORMANCE.md).
    wl = Workload(8, 2048, 4)

    def bus(layout):
        est = estimate(llama70, load_gpu("h100"), wl, BF16, Settings(layout=layout))
        return next(r["wire_bytes"] for r in est.class_rows if r["phase"] == "prefill" and r["op_class"] == "communication")

    assert math.isclose(bus(Layout(tp=8)), bus(Layout(tp=8, sp=True)), rel_tol=1e-12)


def test_plan_keeps_to_max_batch_and_json_names_the_whole_layout(llama70):
    from lmcost.apps.plan import search

    p = search(llama70, [load_gpu("h100")], 64, 1024, 64, BF16, Settings(logits="last"), max_batch=8, density=8)
    assert p.points["batch"].max() <= 8
    assert any("above --max-batch" in why for _, why in p.skipped)  # DP64 needs 64 sequences
    d = estimate(llama70, load_gpu("h100"), Workload(4, 1024, 4), BF16,
                 Settings(layout=Layout(tp=4, cp=2, sp=True))).to_dict()
    assert {k: d["settings"]["layout"][k] for k in ("tp", "cp", "sp", "gpus", "batch_per_gpu")} == \
        dict(tp=4, cp=2, sp=True, gpus=8, batch_per_gpu=4)
