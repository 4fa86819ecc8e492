"""The features of ``lmcost serve`` together (issue 28): P/D with prefix caching (the prefill pool's cache), with
speculative decoding (both pools), with wide EP (the decode pool's), with KV offload, energy, cost, sweeps and
CSV; speculative decoding with prefix caching under KV pressure; wide EP under a speculative step; and every
option given without its feature refused in one line. Oracles: the runs without the second feature (the
metamorphic relations), the arithmetic in the comments, and the cache's capacity. Tens of requests each, on
tiny-gqa / tiny-moe (CPU-sized, shipped) or Llama-3.1-8B where the KV cache must be under pressure."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, prepare, run_serve
from lmcost.apps.serve_pd import run_pd
from lmcost.cli import app

#: tiny-gqa's KV per token in bf16: 2 (K, V) x 4 layers x 2 KV heads x 64 (512 / 8 heads) x 2 bytes = 2,048 B
TINY_KV = 2 * 4 * 2 * 64 * 2
TINY = dict(model="tiny-gqa", gpu="h100", requests=20, prompt="1024", output="32", rate=5.0)


def _pd(**kw) -> dict:
    return run_pd(ServeRequest(**{**TINY, "pd": True, **kw})).to_dict()


def _without(d: dict, *keys) -> str:
    d = {k: v for k, v in d.items() if k not in keys}
    d["workload"] = {k: v for k, v in d.get("workload", {}).items() if k != "prefix"}
    return json.dumps(d, sort_keys=True, default=str)


def _jsonl(tmp_path, prefix: bool) -> str:
    """Twelve requests 50 ms apart, prompts 600 + 50 j tokens; with ``prefix`` each its own id over its whole prompt."""
    f = tmp_path / ("ids.jsonl" if prefix else "plain.jsonl")
    lines = []
    for j in range(12):
        line = dict(arrival_s=0.05 * j, prompt_tokens=600 + 50 * j, output_tokens=16)
        if prefix:
            line.update(prefix_id=f"u{j}", prefix_tokens=600 + 50 * j)
        lines.append(json.dumps(line))
    f.write_text("\n".join(lines) + "\n")
    return str(f)


# --- P/D with prefix caching ---------------------------------------------------------------------------

def test_pd_with_distinct_prefix_ids_is_pd_without_prefixes(tmp_path):
    """Metamorphic: a prefix nobody shares never hits, so P/D with every request its own id is P/D without
    prefixes, number for number (the prefill pool's cache reports no hit)."""
    kw = dict(TINY, requests=None, prompt=None, output=None, rate=None, pd=True, prefill_workers=2)
    plain = run_pd(ServeRequest(**kw, workload_file=_jsonl(tmp_path, False))).to_dict()
    ids = run_pd(ServeRequest(**kw, workload_file=_jsonl(tmp_path, True))).to_dict()
    pc = ids["prefix_cache"]
    assert pc["enabled"] and pc["hit_tokens"] == 0 and pc["pool"] == "prefill"
    assert _without(ids, "prefix_cache", "workload") == _without(plain, "workload")


def test_pd_shared_prefix_hits_on_each_prefill_replica_and_moves_the_whole_prompt():
    """shared:1024 before 1024-token prompts, 2 prefill workers (round robin): each replica's first request misses
    and every later one hits the 1024-token prefix whole (64 blocks of 16; the hit is capped at prompt - 1 = 2047
    tokens): (20 - 2) x 1024 = 18,432 tokens, hit rate 18,432 / (20 x 2048) = 0.45. One prefill worker: 19 hits,
    as aggregated serving's one cache. The KV moved is still the whole prompt's: 2048 x 2,048 B = 4,194,304 B."""
    on = _pd(prefix="shared:1024", prefill_workers=2)
    off = _pd(prefix="shared:1024", prefill_workers=2, prefix_caching=False)
    assert on["prefix_cache"]["hit_tokens"] == 18 * 1024
    assert on["prefix_cache"]["hit_rate"] == pytest.approx(18 * 1024 / (20 * 2048))
    assert off["prefix_cache"]["enabled"] is False and off["prefix_cache"]["hit_tokens"] == 0
    for d in (on, off):
        assert d["pd"]["kv_transfer"]["bytes_per_request"] == 2048 * TINY_KV
    assert on["pd"]["prefill"]["busy_fraction"] < off["pd"]["prefill"]["busy_fraction"]  # hits skip prefill
    one = _pd(prefix="shared:1024")
    agg = run_serve(ServeRequest(**TINY, prefix="shared:1024")).summary
    assert one["prefix_cache"]["hit_tokens"] == agg["prefix_cache"]["hit_tokens"] == 19 * 1024


def test_pd_kv_offload_energy_cost_sweep_and_csv_together():
    """P/D, a prefix workload with a host tier, a power cap, a price and a sweep, as CSV: one row per rate, each
    with the prefill pool's cache, the ratio, J/token and $/Mtok; the price doubled doubles the cost."""
    args = ["serve", "tiny-gqa", "--requests", "16", "--prompt", "256", "--output", "16", "--pd", "--prefix",
            "groups:2:512", "--kv-offload", "cpu:1G", "--power-limit", "500", "--rates", "2,4", "--csv"]
    runner = CliRunner()
    rows = [runner.invoke(app, args + ["--usd-per-gpu-hour", p]) for p in ("2", "4")]
    assert all(r.exit_code == 0 for r in rows), rows[0].stderr
    head, *lines = rows[0].stdout.strip().splitlines()
    cols = head.split(",")
    for key in ("prefix_cache.hit_rate", "prefix_cache.offload.capacity_bytes", "pd.ratio", "energy.j_per_token",
                "cost.usd_per_mtok_output"):
        assert key in cols, key
    assert len(lines) == 2
    cost = [float(r.stdout.strip().splitlines()[1].split(",")[cols.index("cost.usd_per_mtok_output")]) for r in rows]
    assert cost[1] == pytest.approx(2 * cost[0])


# --- P/D with speculative decoding and wide EP --------------------------------------------------------

def test_pd_with_spec_decodes_faster_with_more_acceptance_and_k0_is_plain_pd(monkeypatch):
    """The decode pool speculates: TPOT falls as the accepted length rises (one user at a time: a step costs the
    same at any acceptance and emits more, 3 tokens against 1.5); k = 0 (acceptance 1) is plain P/D, number for number; the prefill pool
    prefills the EAGLE head too (its busy time grows)."""
    kw = dict(requests=8, concurrency=1, rate=None, output="64")
    plain = _pd(**kw)
    monkeypatch.setattr("lmcost.apps.serve_spec.MIN_TOKENS", 0)  # k = 0 is refused to users: it drafts nothing
    k0 = _pd(**kw, spec="eagle", spec_tokens=0, acceptance=1.0)
    monkeypatch.undo()
    assert k0.pop("spec")["pool"] == "decode"
    assert _without(k0) == _without(plain)
    lo, hi = (_pd(**kw, spec="eagle", spec_tokens=3, acceptance=a) for a in (1.5, 3.0))
    assert hi["spec"]["accepted_per_step"] == 3.0 and hi["spec"]["pool"] == "decode"
    # (at 1.5 tokens a step tiny-gqa's three draft steps' kernel launches cost more than they save: no order there)
    assert hi["tpot_s"]["mean"] < min(lo["tpot_s"]["mean"], plain["tpot_s"]["mean"])
    assert hi["pd"]["prefill"]["busy_fraction"] * hi["span_s"] > plain["pd"]["prefill"]["busy_fraction"] * plain["span_s"]


def test_pd_kv_transfer_counts_the_drafters_kv():
    """An EAGLE head is one layer of tiny-gqa's shape: 2,048 / 4 layers = 512 B per token more. 1,024-token
    prompts move 1,024 x (2,048 + 512) = 2,621,440 B each, the per-GPU piece (one GPU per pool) the same."""
    kv = _pd(requests=4, rate=None, concurrency=1, output="8", spec="eagle", spec_tokens=2,
             acceptance=1.5)["pd"]["kv_transfer"]
    assert kv["bytes_per_request"] == 1024 * (TINY_KV + TINY_KV // 4) == 2_621_440
    assert kv["piece_bytes_per_gpu"] == kv["bytes_per_request"]


def test_pd_wide_ep_is_the_decode_pools():
    """Wide EP under P/D re-times the decode pool alone: the prefill pool's steps and busy seconds are those of
    the same P/D run without it; the JSON names the pool."""
    kw = dict(model="tiny-moe", ep=2, dp=2, kv_link="none", requests=16, prompt="256", output="16", concurrency=4,
              rate=None)
    plain = _pd(**kw)
    wide = _pd(**kw, a2a="deepep-ll", tbo=True)
    assert wide["wide_ep"]["pool"] == "decode" and wide["wide_ep"]["a2a"] == "deepep-ll" and "wide_ep" not in plain
    assert wide["pd"]["prefill"]["steps"] == plain["pd"]["prefill"]["steps"]
    busy = [d["pd"]["prefill"]["busy_fraction"] * d["span_s"] for d in (plain, wide)]
    assert busy[1] == pytest.approx(busy[0], rel=1e-9)
    assert wide["tpot_s"]["mean"] != plain["tpot_s"]["mean"]


def test_wide_ep_charges_the_verify_steps_k_plus_1_rows():
    """A speculative decode of n sequences verifies n (k + 1) rows: they go through dispatch/combine as a step of
    n (k + 1) tokens does (the target's re-timed table), not n."""
    r = ServeRequest(model="tiny-moe", gpu="h100", ep=2, dp=2, a2a="deepep-ll", spec="eagle", spec_tokens=2,
                     acceptance=2.0, requests=8)
    s = prepare(r, max_context=1024)
    wide, base = s.wide_ep["model"], s.wide_ep["step"]
    for n in (1, 4, 16):
        want = float(wide.step_s(base, np.array([3.0 * n]))[1][0])
        assert s.step.target.tokens(3 * n) == pytest.approx(want, rel=1e-6)
        assert sum(float(v[0]) for v in wide.comm_s(base, np.array([3.0 * n]))) > \
            sum(float(v[0]) for v in wide.comm_s(base, np.array([float(n)])))


# --- the KV cache under pressure ------------------------------------------------------------------------

@pytest.mark.parametrize("pd", [False, True])
def test_spec_and_sessions_under_kv_pressure_stay_within_capacity(pd):
    """Llama-3.1-8B in 0.23 of an H100 (about 1 GB of KV cache beside the weights and an EAGLE head), 4-turn
    sessions, EAGLE k = 3: the cache's peak is at most its capacity (aggregated, and the decode pool under P/D),
    and more acceptance lowers TPOT."""
    kw = dict(model="llama-3.1-8b", gpu="h100", requests=32, prompt="512", output="64", rate=50.0,
              prefix="sessions:4", memory_fraction=0.23, time_model="roofline", pd=pd, spec="eagle", spec_tokens=3)
    go = run_pd if pd else run_serve
    lo, hi = (go(ServeRequest(**kw, acceptance=a)).summary for a in (1.5, 3.0))
    for s in (lo, hi):
        assert 0.9 < s["kv_use"]["peak_fraction"] <= 1.0
    assert hi["tpot_s"]["mean"] < lo["tpot_s"]["mean"]


def test_pd_decode_pool_admission_leaves_room_for_the_steps_tokens():
    """A prefilled request decodes in the step that admits it, as the running decodes do: admission leaves room
    for those tokens (the decode pool passed its capacity by 0.09% before), preempting as it must."""
    s = run_pd(ServeRequest(model="llama-3.1-8b", gpu="h100", requests=48, prompt="512", output="128", rate=50.0,
                            prefix="sessions:4", memory_fraction=0.215, time_model="roofline", pd=True)).summary
    assert s["preemptions"] > 0 and s["kv_use"]["peak_fraction"] <= 1.0


# --- options without their feature -----------------------------------------------------------------------

@pytest.mark.parametrize("args, line", [
    (["--acceptance", "2"], "error: --acceptance: has no effect without a speculative-decoding method"),
    (["--spec-tokens", "2"], "error: --spec-tokens: has no effect without a speculative-decoding method"),
    (["--spec", "none", "--acceptance", "2"], "error: --acceptance: has no effect without"),
    (["--pd", "--spec", "eagle", "--spec-tokens", "2"], "error: --acceptance: missing"),
    (["--kv-link", "rdma"], "error: --kv-link: has no effect without --pd"),
    (["--prefill-workers", "2"], "error: --prefill-workers: has no effect without --pd"),
    (["--decode-workers", "2"], "error: --decode-workers: has no effect without --pd"),
    (["--model", "tiny-moe", "--tbo"], "error: --tbo: applies to EP over attention-DP"),
    (["--model", "tiny-moe", "--ep", "2", "--a2a", "deepep-ll"], "error: --a2a: applies to EP over attention-DP"),
    (["--kv-offload", "cpu:1G"], "error: --kv-offload: has no effect: the workload names no prefixes"),
    (["--pd", "--kv-offload", "cpu:1G"], "error: --kv-offload: has no effect: the workload names no prefixes"),
    (["--pd", "--no-prefix-caching"], "error: --prefix-caching: has no effect: the workload names no prefixes"),
    (["--prefix", "shared:64", "--no-prefix-caching", "--kv-offload", "cpu:1G"],
     "error: --kv-offload: has no effect with prefix caching off"),
    (["--pd", "--prefix", "shared:64", "--no-prefix-caching", "--kv-offload", "cpu:1G"],
     "error: --kv-offload: has no effect with prefix caching off"),
])
def test_an_option_without_its_feature_is_one_line(args, line):
    model = "tiny-moe" if "--model" in args else "tiny-gqa"
    args = [a for a in args if a not in ("--model", "tiny-moe")]
    r = CliRunner().invoke(app, ["serve", model, "--requests", "8", *args])
    assert r.exit_code == 2, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(line), r.stderr


def test_pd_text_names_the_pool_that_caches():
    r = CliRunner().invoke(app, ["serve", "tiny-gqa", "--requests", "8", "--prompt", "256", "--output", "8", "--pd",
                                 "--prefix", "shared:128"])
    assert r.exit_code == 0, r.stderr
    assert "prefix cache (prefill pool): on, hit rate" in r.stdout


def test_wide_ep_charges_the_mtp_modules_moe_layer_on_its_kernel():
    """DeepSeek's MTP module is one MoE layer on the same EP ranks: under deepep-ll its dispatch/combine are
    DeepEP's, one layer's worth (the target's are re-timed the same way); a dense EAGLE head is left as it was."""
    from lmcost.cost.compile import phase_graph
    from lmcost.cost.wide_ep import WideEP, moe_layers
    from lmcost.operators.parallel import cluster_for

    from lmcost.model.loading import load_config

    moe = load_config("tiny-moe").model_copy(update={"mtp_modules": 1})  # tiny-moe states no MTP module
    kw = dict(model=moe, gpu="h100", ep=2, dp=2, spec="mtp", spec_tokens=2, acceptance=2.0, requests=8)
    nccl = prepare(ServeRequest(**kw), max_context=1024).step
    ll = prepare(ServeRequest(**kw, a2a="deepep-ll"), max_context=1024)
    head = nccl.draft
    graph = phase_graph(head.cfg, head.precision, "decode", head.settings)
    assert moe_layers(graph) == 1
    wide = WideEP(head.cfg, head.settings.layout, cluster_for(head.settings.layout, head.gpu), graph, kernel="deepep-ll")
    for n in (1, 8, 64):
        want = float(wide.step_s(head, np.array([float(n)]))[1][0])
        assert ll.step.draft.tokens(n) == pytest.approx(want, rel=1e-6) and want != pytest.approx(head.tokens(n))
    eagle = prepare(ServeRequest(**{**kw, "spec": "eagle"}, a2a="deepep-ll"), max_context=1024).step
    assert eagle.draft.cfg.moe is None and eagle.draft.tokens(8) == prepare(
        ServeRequest(**{**kw, "spec": "eagle"}), max_context=1024).step.draft.tokens(8)
