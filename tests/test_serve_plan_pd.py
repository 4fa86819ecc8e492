"""``lmcost serve-plan --pd`` (issue 28: "the planner searches pool sizes and layouts (xPyD)";
:mod:`lmcost.apps.serve_plan_pd`). Metamorphic: the best row's command rerun as ``lmcost serve --pd`` gives its
goodput per GPU and every figure, number for number. The candidates are the splits worked by hand; a
hand-picked 1P1D is among them, ranked where its own ``serve --pd`` run puts it. The static bound is the
formula of the module docstring, worked here, is never served past, and pruning by it keeps the best.
Refusals are one line naming the flag. Every run is 60 requests of llama-3.1-8b."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest
from lmcost.apps.serve_pd import pools, run_pd
from lmcost.apps.serve_plan import ServePlanRequest, plan_serving
from lmcost.apps.serve_plan_pd import pd_bound, plan_pd
from lmcost.basics.errors import LmcostError
from lmcost.cli import app

runner = CliRunner()
#: 3 H100s split into a prefill and a decode pool; SLOs that bind below saturation (TTFT p99 200 ms at
#: about 50 requests/s on these pools, TPOT p99 20 ms).
BASE = dict(model="llama-3.1-8b", gpu="h100", gpus=3, requests=60, prompt="1024", output="128", slo_ttft_s=0.2,
            slo_tpot_s=0.02, max_num_seqs=(64,), max_num_batched_tokens=(4096,), jobs=1, pd=True)
WORK = dict(model="llama-3.1-8b", gpu="h100", requests=60, prompt="1024", output="128", slo_ttft_s=0.2,
            slo_tpot_s=0.02, max_num_seqs=64, max_num_batched_tokens=4096, pd=True)


@pytest.fixture(scope="module")
def plan():
    return plan_pd(ServePlanRequest(**BASE))


def shape(row):
    pd = row["pd"]
    return pd["ratio"], pd["prefill"]["tp"], pd["decode"]["tp"]


def test_the_candidates_are_every_split_of_the_gpus(plan):
    # 3 GPUs: prefill 1 + decode 2 (decode 2 x TP1 or 1 x TP2), prefill 2 + decode 1 (prefill 2 x TP1 or
    # 1 x TP2); TP3 does not split 8 KV heads. Every one uses the 3 GPUs, its goodput per GPU over them.
    assert plan.candidates == 4
    assert sorted(shape(r) for r in plan.rows) == [("1P1D", 1, 2), ("1P1D", 2, 1), ("1P2D", 1, 1), ("2P1D", 1, 1)]
    assert all(r["pd"]["prefill"]["gpus"] + r["pd"]["decode"]["gpus"] == 3 for r in plan.rows)
    ok = [r for r in plan.rows if r["status"] == "ok"]
    assert [r["goodput_requests_per_s_per_gpu"] for r in ok] == sorted((r["goodput_requests_per_s_per_gpu"]
                                                                        for r in ok), reverse=True)
    assert all(r["goodput_requests_per_s_per_gpu"] == r["goodput_requests_per_s"] / 3 for r in ok)


def test_the_best_rows_command_reruns_it_number_for_number(plan):
    # metamorphic: the plan's best, rerun alone by `lmcost serve --pd` (its check command), is the same run
    best = plan.best
    assert best is not None and best["check_command"].startswith("lmcost serve llama-3.1-8b ")
    assert " --pd --prefill-workers " in best["check_command"]
    r = runner.invoke(app, [*best["check_command"].split()[1:], "--json"])
    assert r.exit_code == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["pd"]["goodput_requests_per_s_per_gpu"] == best["goodput_requests_per_s_per_gpu"]
    assert run["pd"]["ratio"] == best["pd"]["ratio"] and run["pd"]["gpus"] == 3
    th, g = run["throughput"], run["goodput"]
    assert (th["requests_per_s"], th["output_tokens_per_s_per_gpu"], g["requests_per_s"], g["fraction"]) == (
        best["requests_per_s"], best["output_tokens_per_s_per_gpu"], best["goodput_requests_per_s"],
        best["goodput_fraction"])
    assert [run[m][p] for m in ("ttft_s", "tpot_s") for p in ("p50", "p90", "p99")] == \
        [best[f"{m}_{p}_s"] for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")]
    assert plan.to_dict()["check_command"] == best["check_command"]


def test_a_hand_picked_1p1d_is_ranked_as_its_own_serve_run_says(plan):
    # 1 prefill worker of TP1 and 1 decode worker of TP2, asked of run_pd directly at the row's offered rate
    row = next(r for r in plan.rows if shape(r) == ("1P1D", 1, 2))
    assert row["status"] == "ok"
    own = run_pd(ServeRequest(**WORK, tp=2, prefill_tp=1, prefill_workers=1, decode_workers=1,
                              rate=row["offered_rate"])).summary
    per_gpu = own["goodput"]["requests_per_s"] / 3
    assert own["pd"]["goodput_requests_per_s_per_gpu"] == per_gpu == row["goodput_requests_per_s_per_gpu"]
    assert own["ttft_s"]["p99"] <= 0.2 and own["tpot_s"]["p99"] <= 0.02 and own["saturated"] is None
    # its place: after every row of more goodput per GPU, before every row of less
    rank = plan.rows.index(row)
    assert rank == sum(r["status"] == "ok" and r["goodput_requests_per_s_per_gpu"] > per_gpu for r in plan.rows)


def test_the_static_bound_by_hand_under_the_roofline():
    # Under the roofline (no overheads) a step's context-free time tokens(n) is affine in n with the weights'
    # read as intercept, so tokens(n) / n falls with n: its least is at the budget T = 4096. 1P1D of TP1:
    # the prefill pool serves at most 1 x 4096 / (tokens(4096) x 1024) requests/s; the decode pool at most
    # B / (step_s(B, 1024) x 127) with B = 64 (max_num_seqs, well under what the KV cache holds).
    p = pools(ServeRequest(**{**WORK, "time_model": "roofline"}, rate=1.0), max_context=1152)
    pre, dec = p.prefill, p.decode
    prompt, output = np.full(60, 1024), np.full(60, 128)
    by_hand = min(4096 / (pre.step.tokens(4096) * 1024), 64 / (dec.step.step_s(64, 1024) * 127))
    assert pd_bound(p, prompt, output) == pytest.approx(by_hand, rel=1e-12)
    # two decode workers double the decode pool's bound; the prefill pool's is the same
    two = pools(ServeRequest(**{**WORK, "time_model": "roofline"}, rate=1.0, decode_workers=2), max_context=1152)
    assert pd_bound(two, prompt, output) == pytest.approx(min(4096 / (pre.step.tokens(4096) * 1024),
                                                              2 * 64 / (dec.step.step_s(64, 1024) * 127)), rel=1e-12)


def test_the_bound_is_never_served_past_and_pruning_keeps_the_best():
    # without SLOs every candidate's highest unsaturated rate is searched: no run serves past its bound;
    # 4 sequences per decode worker bound those candidates far below the others: pruned by a wave of 1
    space = dict(BASE, slo_ttft_s=None, slo_tpot_s=None, max_num_seqs=(4, 64), iterations=4)
    full = plan_pd(ServePlanRequest(**space, prune=False))
    assert full.pruned == 0 and all(r["status"] == "ok" for r in full.rows)
    assert all(r["requests_per_s"] <= r["bound_rate"] for r in full.rows)
    pruned = plan_pd(ServePlanRequest(**space, wave=1))
    assert pruned.pruned > 0 and pruned.best == full.best


def test_the_process_pool_gives_the_rows_in_process(plan):
    assert plan_pd(ServePlanRequest(**{**BASE, "jobs": 2})).rows == plan.rows


def test_pd_ratios_keep_the_named_splits():
    only = plan_pd(ServePlanRequest(**{**BASE, "pd_ratios": ("2p1d",), "iterations": 1}))
    assert [shape(r) for r in only.rows] == [("2P1D", 1, 1)]


def test_the_aggregated_planner_refuses_pd():
    with pytest.raises(LmcostError, match="^pd: plan_serving searches one pool"):
        plan_serving(ServePlanRequest(**BASE))


@pytest.mark.parametrize("args, line", [
    (("--pd-ratios", "1P1D"), "error: --pd-ratios: has no effect without --pd (prefill/decode pools); add --pd, "
                              "or drop it"),
    (("--kv-link", "none"), "error: --kv-link: has no effect without --pd (prefill/decode pools); add --pd, or drop it"),
    (("--pd", "--gpus", "1"), "error: --gpus: 1 GPUs cannot hold a prefill pool and a decode pool; give 2 or more "
                              "(each pool has a GPU at least)"),
    (("--pd", "--pd-ratios", "1X1D"), "error: --pd-ratios: '1X1D' is not xPyD; write x prefill and y decode "
                                      "workers, e.g. 1P2D"),
    (("--pd", "--pd-ratios", "1P1D,1p1d"), "error: --pd-ratios: 1P1D given twice; give each ratio once"),
    (("--pd", "--gpus", "2", "--pd-ratios", "2P1D"), "error: --pd-ratios: no layout of llama-3.1-8b fills 2 GPUs as "
                                                     "2P1D; name other ratios, or another --gpus"),
    (("--pd", "--kv-link", "pigeon"), "error: --kv-link: unknown link 'pigeon'; use one of auto, nvlink, rdma, none"),
    (("--pd", "--ep-imbalance", "2"), "error: --ep-imbalance: applies to expert parallelism, and no pool of "
                                      "llama-3.1-8b on 8 GPUs has it; drop it"),
])
def test_refusals_are_one_line(args, line):
    r = runner.invoke(app, ["serve-plan", "llama-3.1-8b", "--requests", "20", "--jobs", "1", *args])
    assert r.exit_code == 2 and r.stderr.strip() == line, r.stderr
    assert r.stdout == ""


def test_cli_prints_each_candidates_command():
    r = runner.invoke(app, ["serve-plan", "llama-3.1-8b", "--gpus", "2", "--requests", "60", "--prompt", "1024",
                            "--output", "128", "--slo-ttft", "200ms", "--slo-tpot", "20ms", "--max-num-seqs", "64",
                            "--max-num-batched-tokens", "4096", "--iterations", "2", "--jobs", "1", "--pd"],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.stderr
    assert "│ 1 │ 1P1D │ 1 x TP1 (1    │ 1 x TP1 (1    │       64 │" in r.stdout
    assert "#1: lmcost serve llama-3.1-8b --gpu h100 --engine vllm --model engine --tp 1 --ep 1 --dp 1 " in r.stdout
    csv = runner.invoke(app, ["serve-plan", "llama-3.1-8b", "--gpus", "2", "--requests", "60", "--max-num-seqs", "64",
                              "--max-num-batched-tokens", "4096", "--iterations", "1", "--jobs", "1", "--pd", "--csv"])
    assert csv.exit_code == 0 and "pd.prefill.workers" in csv.stdout.splitlines()[0]
