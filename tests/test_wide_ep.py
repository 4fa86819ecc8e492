"""Wide EP in ``lmcost serve`` (issue 28): DeepEP's dispatch/combine bytes exact by hand and its times against
the README's published points, the expert-load imbalance against a Monte Carlo of random placements, EPLB's
placement worked by hand, and the metamorphic relations (uniform load and no replicas = today's run; zipf:0 =
uniform; TBO with no communication = the step at two half batches; 0 redundant experts = none).
Serve runs use tiny-moe (8 experts, top-2) and tens of requests; DeepSeek-V3 runs one short workload."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.cli import app
from lmcost.cost import deepep
from lmcost.cost.expert_load import (eplb_imbalance, expected_max_normal, expert_shares, imbalance_for,
                                     rank_imbalance)
from lmcost.hardware.cluster import Cluster, IntraFabric, Network

#: DeepEP's test node: H800s (NVLink 400 GB/s bidirectional: 200 a direction), one CX7 400 Gb/s NIC per GPU.
H800 = Cluster(name="h800-test", gpu="h100-sxm", gpus_per_node=8,
               intra=IntraFabric(name="nvlink", generation="nvlink4", bandwidth_gb_s=200.0, latency_us=0.6),
               inter=Network(name="cx7", kind="infiniband-ndr", nics_per_node=8, nic_gbit_s=400.0, latency_us=2.7))
V3 = dict(d=7168, k=8, n_experts=256)
TINY = dict(model="tiny-moe", ep=8, dp=8, requests=48, prompt="256", output="32", engine="sglang")


def test_dispatch_and_combine_bytes_of_deepseek_v3_by_hand():
    # 128 tokens top-8: 1024 rows. FP8 row: 7168 bytes + ceil(7168/128) = 56 fp32 scales = 224 bytes -> 7392.
    # dispatch 1024 x 7392 = 7,569,408; BF16 combine 1024 x 7168 x 2 = 14,680,064.
    b = deepep.step_bytes(128, ep=8, gpus_per_node=8, **V3)
    assert b["dispatch"] == 7_569_408 and b["combine"] == 14_680_064
    # the busiest rank at imbalance 1.5 moves 1.5x both
    b = deepep.step_bytes(128, ep=8, gpus_per_node=8, imbalance=1.5, **V3)
    assert b["dispatch"] == 1.5 * 7_569_408 and b["combine"] == 1.5 * 14_680_064


def test_rdma_bytes_count_each_node_once():
    # EP16 over 2 nodes of 128 experts each: a token misses a node when all 8 experts are on the other,
    # C(128, 8) / C(256, 8) = prod_{i<8} (128 - i) / (256 - i); distinct nodes 2 (1 - that).
    miss = math.prod((128 - i) / (256 - i) for i in range(8))
    b = deepep.step_bytes(4096, ep=16, gpus_per_node=8, kernel="deepep-ht", **V3)
    assert b["dispatch_rdma"] == pytest.approx(4096 * 2 * (1 - miss) * 7392, rel=1e-12)
    # Monte Carlo oracle of the distinct nodes (seed 0): 20,000 tokens' top-8 of 256 experts, 32 per node (EP64)
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((20000, 256)), axis=1)[:, :8] // 32
    mc = np.mean([len(set(row)) for row in picks])
    assert deepep.distinct_nodes(256, 8, 8) == pytest.approx(mc, rel=0.01)


def test_low_latency_table_is_its_own_bytes_over_time():
    # DeepEP README, low-latency kernels (128 tokens, d 7168, top-8, FP8 dispatch, BF16 combine): the published
    # RDMA bandwidth is the bytes above over the published latency, to the table's rounding (within 3%).
    for ep, (lat_d, bw_d, lat_c, bw_c) in deepep.LL.items():
        assert lat_d * bw_d == pytest.approx(7_569_408, rel=0.03), ep
        assert lat_c * bw_c == pytest.approx(14_680_064, rel=0.03), ep


def test_deepep_times_reproduce_the_published_points_on_their_hardware():
    for ep, (lat_d, _, lat_c, _) in deepep.LL.items():
        d, c = deepep.layer_seconds(128, ep=ep, cluster=H800, kernel="deepep-ll", **V3)
        assert float(d) == pytest.approx(lat_d, rel=1e-9) and float(c) == pytest.approx(lat_c, rel=1e-9)
    # normal kernels in a node (EP8): 4096 tokens x 8 rows x 7392 B at 153 GB/s, + one network hop (2.7 us prior)
    d, c = deepep.layer_seconds(4096, ep=8, cluster=H800, kernel="deepep-ht", **V3)
    assert float(d) == pytest.approx(2.7e-6 + 4096 * 8 * 7392 / 153e9, rel=1e-9)
    assert float(c) == pytest.approx(2.7e-6 + 4096 * 8 * 14336 / 158e9, rel=1e-9)
    # across nodes (EP32, 4 nodes): the RDMA bytes at 58 GB/s bound the dispatch (NVLink's 242 MB take 1.6 ms)
    d, _ = deepep.layer_seconds(4096, ep=32, cluster=H800, kernel="deepep-ht", **V3)
    rdma = 4096 * deepep.distinct_nodes(256, 8, 4) * 7392
    assert float(d) == pytest.approx(2.7e-6 + rdma / 58e9, rel=1e-9)
    assert float(deepep.layer_seconds(0, ep=32, cluster=H800, kernel="deepep-ll", **V3)[0]) == 0.0


def test_expert_shares():
    assert np.array_equal(expert_shares("zipf:0", 256, 8), expert_shares("uniform", 256, 8))
    p = expert_shares("hot:4", 64, 8)  # hottest 4/64, the other 63 share 60/64 alike
    assert p[0] == pytest.approx(4 / 64) and p[1] == pytest.approx((60 / 64) / 63) and p.sum() == pytest.approx(1)
    p = expert_shares("zipf:1.2", 256, 8)  # capped at 1/k: one row per token and expert
    assert p.max() <= 1 / 8 + 1e-12 and p.sum() == pytest.approx(1) and p[0] == pytest.approx(1 / 8)
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-9)  # E max of 2 = 1/sqrt(pi)


@pytest.mark.parametrize("spec,E,k,ep", [("zipf:0.5", 256, 8, 32), ("zipf:1", 256, 8, 8), ("zipf:1", 128, 8, 16),
                                         ("hot:8", 256, 8, 64), ("zipf:0.2", 64, 6, 8)])
def test_imbalance_against_a_monte_carlo_of_random_placements(spec, E, k, ep):
    # oracle: 2,000 random placements (seed 0) of the shares, E/ep experts a rank, the mean of max rank load x ep
    p = expert_shares(spec, E, k)
    rng = np.random.default_rng(0)
    mc = np.mean([rng.permutation(p).reshape(ep, -1).sum(1).max() * ep for _ in range(2000)])
    assert rank_imbalance(p, ep) == pytest.approx(mc, rel=0.05)
    assert imbalance_for("uniform", E, k, ep) == (1.0, imbalance_for("uniform", E, k, ep)[1])


def test_eplb_placement_by_hand():
    p = np.array([0.5, 0.2, 0.2, 0.1])
    # no replicas, 2 slots a rank: .5 -> r0, .2 -> r1, .2 -> r1 (lighter), .1 -> r0 (r1 full): max .6, x 2 = 1.2
    assert eplb_imbalance(p, 2, 0) == pytest.approx(1.2)
    # 2 replicas, both to expert 0 (.5/1 then .25 the largest per replica): three copies of 1/6; 3 slots a rank:
    # .2 r0, .2 r1, 1/6 r0 (.3667), 1/6 r1, 1/6 r0 (.5333, tie to the first), .1 r1: max .5333 x 2 = 1.0667
    assert eplb_imbalance(p, 2, 2) == pytest.approx(2 * (0.2 + 2 / 6))
    assert eplb_imbalance(expert_shares("uniform", 256, 8), 32, 32) == pytest.approx(1.0)
    # DeepSeek's EPLB figure is a balance, not a number: a skewed load comes back near 1 with 32 replicas at EP32
    assert imbalance_for("zipf:1", 256, 8, 32, 32)[0] < 1.05 < imbalance_for("zipf:1", 256, 8, 32)[0]


def _run(**kw) -> dict:
    return run_serve(ServeRequest(**{**TINY, **kw})).to_dict()


def _same(a: dict, b: dict) -> None:
    a, b = dict(a), dict(b)
    a.pop("wide_ep", None), b.pop("wide_ep", None)
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def test_uniform_load_and_no_replicas_are_todays_run_and_zipf_0_is_uniform():
    base = _run()
    assert "wide_ep" not in base
    uni = _run(expert_load="uniform")
    _same(base, uni)
    assert uni["wide_ep"]["imbalance"] == 1.0
    _same(uni, _run(expert_load="zipf:0"))
    _same(base, _run(redundant_experts=0, a2a="nccl", tbo=False))
    # the nccl path's bytes: BF16 rows both ways (tokens x k x d x 2 per layer, 4 layers)
    st = uni["wide_ep"]["step"]
    assert st["dispatch_bytes"] == pytest.approx(st["tokens_per_step"] * 2 * 384 * 2 * 4)
    # a skew slows the run (the busiest rank's experts and combine)
    assert _run(expert_load="zipf:1")["e2e_s"]["mean"] > base["e2e_s"]["mean"]


def test_tbo_without_communication_is_two_half_batches():
    from lmcost.apps.serve import prepare
    from lmcost.cost.wide_ep import WideEP, _parts

    s = prepare(ServeRequest(**TINY, tbo=True), max_context=512)
    wide = s.wide_ep["model"]
    step = s.wide_ep["step"]
    tab = step.tokens
    quiet_step = object.__new__(type(step))
    quiet_step.__dict__.update(step.__dict__)
    quiet_step.scales = {**step.scales, "comm": 0.0}  # no communication at all
    xs = np.array([1, 2, 64, 65, 1000])
    plain, run = wide.step_s(quiet_step, xs)
    comp = lambda t: _parts(quiet_step, np.asarray(t, dtype=float))[0]  # noqa: E731
    assert np.allclose(plain, comp(xs), rtol=1e-12)
    assert np.allclose(run, comp(xs // 2) + comp(xs - xs // 2), rtol=1e-12)
    # even T: twice the step model's own context-free time at T/2 (its table, collectives scaled to 0)
    assert float(run[2]) == pytest.approx(2 * sum(step.scales[g] * v[32] for g, v in tab.parts.items() if g != "comm"))
    assert run[2] >= plain[2]  # two half batches never beat one: TBO pays only where it hides communication
    assert isinstance(wide, WideEP)


def test_redundant_experts_cost_kv_memory_deepseek_v3():
    from lmcost.apps.serve import prepare

    r = ServeRequest(model="deepseek-v3", gpu="h100", ep=32, dp=32, dtype="fp8", requests=32, prompt="64", output="8")
    base, rep = prepare(r, max_context=128), prepare(replace(r, redundant_experts=32), max_context=128)
    # one replica a rank (ceil(32/32)): gate, up, down of 2048 x 7168 in 58 MoE layers, fp8: 3 x 2048 x 7168 x 58
    assert rep.wide_ep["redundant_bytes"] == 3 * 2048 * 7168 * 58 == 2_554_331_136
    assert base.kv_capacity_bytes - rep.kv_capacity_bytes == pytest.approx(2_554_331_136)


def test_deepep_run_json_bytes_deepseek_v3():
    res = run_serve(ServeRequest(model="deepseek-v3", gpu="h100", ep=32, dp=32, dtype="fp8", requests=32,
                                 prompt="64", output="8", a2a="deepep-ll")).summary
    st = res["wide_ep"]["step"]
    assert st["moe_layers"] == 58 and res["wide_ep"]["a2a"] == "deepep-ll"
    assert st["dispatch_bytes"] == pytest.approx(st["tokens_per_step"] * 8 * 7392 * 58, rel=1e-12)
    assert st["combine_bytes"] == pytest.approx(st["tokens_per_step"] * 8 * 7168 * 2 * 58, rel=1e-12)


@pytest.mark.parametrize("args,flag", [(["--a2a", "foo"], "--a2a"), (["--expert-load", "zipf:x"], "--expert-load"),
                                       (["--expert-load", "hot:9"], "--expert-load"),
                                       (["--expert-load", "zipf:1", "--ep-imbalance", "1.2"], "--expert-load"),
                                       (["--redundant-experts", "3"], "--redundant-experts"),
                                       (["--expert-load", "1.3", "--redundant-experts", "8"], "--redundant-experts")])
def test_bad_wide_ep_flags_are_one_line(args, flag):
    r = CliRunner().invoke(app, ["serve", "tiny-moe", "--ep", "8", "--dp", "8", "--requests", "16", *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag}: "), r.stderr


def test_wide_ep_options_need_ep_over_attention_dp():
    r = CliRunner().invoke(app, ["serve", "tiny-moe", "--tp", "2", "--tbo", "--requests", "16"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --tbo: applies to EP over attention-DP"), r.stderr
    r = CliRunner().invoke(app, ["serve", "tiny-gqa", "--dp", "2", "--a2a", "deepep-ll", "--requests", "16"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --a2a: tiny-gqa has no routed experts"), r.stderr


def test_wide_ep_beside_speculative_decoding():
    """Wide EP re-times the target's step and the MTP head is built beside it (the two once crashed together).
    One user at a time: a step verifying k + 1 = 2 tokens of 1.85 accepted costs well under 1.85 plain steps at
    batch 1 (the weights are read once either way), so TPOT must fall against the same run without MTP."""
    from lmcost.apps.serve import ServeRequest, run_serve

    base = dict(model="tiny-moe", gpu="h100", dp=2, ep=2, a2a="deepep-ll", concurrency=2, requests=8,
                prompt="256", output="64")
    plain = run_serve(ServeRequest(**base)).summary
    spec = run_serve(ServeRequest(**base, spec="eagle", spec_tokens=1, acceptance=1.85)).summary
    assert spec["spec"]["accepted_per_step"] == 1.85 and spec["wide_ep"]["a2a"] == "deepep-ll"
    assert spec["tpot_s"]["p50"] < plain["tpot_s"]["p50"]
