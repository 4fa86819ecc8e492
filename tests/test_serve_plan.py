"""``lmcost serve-plan`` (:mod:`lmcost.apps.serve_plan`): the best candidate's offered rate meets the SLOs
when ``lmcost serve`` reruns it and a rate 25% higher does not, and every figure of its row is that rerun's;
the static bound is never met nor served past (so it brackets the bisection soundly) and pruning by it keeps
the best; the process pool and a Ray instance give the rows the search gives in process; bad inputs, and
names or choices every candidate shares, are one line naming the flag (exit 2)."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.apps.serve_plan import RUN_COLUMNS, ServePlanRequest, check_command, plan_serving
from lmcost.cli import app

runner = CliRunner()
#: A small space: llama-3-8b on 2 H100s (TP2 and DP2) x 2 max_num_seqs x 1 token budget, 100 requests a run;
#: SLOs that bind below saturation for some candidates (TTFT p99 60 ms; TPOT p99 30 ms).
BASE = dict(model="llama-3-8b", gpu="h100", gpus=2, requests=100, prompt="1024", output="256",
            slo_ttft_s=0.06, slo_tpot_s=0.03, max_num_seqs=(64, 256), max_num_batched_tokens=(4096,), jobs=1)


@pytest.fixture(scope="module")
def in_process():
    return plan_serving(ServePlanRequest(**BASE))


def key(rows):
    return [(r["layout"], r["max_num_seqs"], r["max_num_batched_tokens"], r["status"], r["offered_rate"]) for r in rows]


def test_best_meets_the_slos_when_rerun_and_25_percent_more_does_not(in_process):
    best = in_process.best
    assert best is not None and in_process.candidates == 4
    ok = [r["goodput_requests_per_s_per_gpu"] for r in in_process.rows if r["status"] == "ok"]
    assert ok == sorted(ok, reverse=True) and best["goodput_requests_per_s_per_gpu"] == ok[0]

    def rerun(rate):
        req = ServeRequest(model="llama-3-8b", gpu="h100", tp=best["tp"], ep=best["ep"], dp=best["dp"], requests=100,
                           prompt="1024", output="256", rate=rate, max_num_seqs=best["max_num_seqs"],
                           max_num_batched_tokens=best["max_num_batched_tokens"], slo_ttft_s=0.06, slo_tpot_s=0.03)
        return run_serve(req).summary

    at = rerun(best["offered_rate"])
    assert at["ttft_s"]["p99"] <= 0.06 and at["tpot_s"]["p99"] <= 0.03 and at["saturated"] is None
    # every figure of the row is that run's, as serve reports it (throughput over first arrival to last
    # finish, so below the offered rate; goodput per GPU: goodput over the 2 GPUs)
    th, g = at["throughput"], at["goodput"]
    assert (best["requests_per_s"], best["output_tokens_per_s"], best["output_tokens_per_s_per_gpu"],
            best["goodput_requests_per_s"], best["goodput_fraction"], best["goodput_requests_per_s_per_gpu"],
            best["ttft_p99_s"], best["tpot_p99_s"]) == (
        th["requests_per_s"], th["output_tokens_per_s"], th["output_tokens_per_s_per_gpu"], g["requests_per_s"],
        g["fraction"], g["requests_per_s"] / 2, at["ttft_s"]["p99"], at["tpot_s"]["p99"])
    assert best["requests_per_s"] < best["offered_rate"]
    above = rerun(best["offered_rate"] * 1.25)
    assert above["ttft_s"]["p99"] > 0.06 or above["tpot_s"]["p99"] > 0.03 or above["saturated"] is not None


def test_the_check_command_reproduces_every_figure_of_the_best_row(in_process):
    best = in_process.best
    r = runner.invoke(app, [*check_command(in_process.request, best), "--json"])
    assert r.exit_code == 0, r.stderr
    run = json.loads(r.stdout)
    assert run["rate"] == best["offered_rate"] and run["settings"]["gpus"] == 2
    th, g = run["throughput"], run["goodput"]
    assert (th["requests_per_s"], th["output_tokens_per_s"], th["output_tokens_per_s_per_gpu"], g["requests_per_s"],
            g["fraction"], g["requests_per_s"] / 2) == tuple(best[k] for k in RUN_COLUMNS)
    assert [run[m][p] for m in ("ttft_s", "tpot_s") for p in ("p50", "p90", "p99")] == \
        [best[f"{m}_{p}_s"] for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")]


def test_the_static_bound_is_never_met_and_pruning_keeps_the_best():
    # Without SLOs a run at the bound must saturate: were the bound below what a layout serves, the
    # bisection would return the bound itself (reason "meets the SLOs at its static bound").
    # (4 sequences bound a replica below 7 requests/s, under what 256 serve: pruned once one is searched)
    space = dict(BASE, slo_ttft_s=None, slo_tpot_s=None, max_num_seqs=(4, 64, 256), max_num_batched_tokens=(2048, 8192))
    full = plan_serving(ServePlanRequest(**space, prune=False))
    assert full.pruned == 0 and all(r["status"] == "ok" for r in full.rows)
    assert all(r["offered_rate"] < r["bound_rate"] and r["requests_per_s"] < r["bound_rate"] for r in full.rows)
    pruned = plan_serving(ServePlanRequest(**space, prune=True, wave=2))
    assert pruned.pruned > 0  # a wave of 2 leaves later candidates below the best goodput found
    assert key([pruned.best]) == key([full.best])
    kept = [r for r in pruned.rows if r["status"] == "ok"]
    assert key(kept) == key(full.rows[:len(kept)])


def test_process_pool_gives_the_rows_in_process(in_process):
    pooled = plan_serving(ServePlanRequest(**{**BASE, "jobs": 2}))
    assert pooled.workers == "2 processes"
    assert pooled.rows == in_process.rows


@pytest.fixture
def bomb(tmp_path):
    # billion laughs: 8 levels of 10 aliases each, 10^8 values once expanded (refused by the loader)
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join([*levels, "name: *a8"]) + "\n")
    return str(path)


#: What every candidate shares, refused up front as serve refuses it (not a note per candidate and exit 0).
@pytest.mark.parametrize("args, field", [
    (("--gpus", "0"), "--gpus"), (("--percentile", "42"), "--percentile"), (("--slo-ttft", "0s"), "--slo-ttft"),
    (("--max-num-seqs", "64,64"), "--max-num-seqs"), (("--max-num-seqs", ""), "--max-num-seqs"),
    (("--max-num-batched-tokens", ""), "--max-num-batched-tokens"), (("--requests", "1M"), "--requests"),
    (("--requests", "102401"), "--requests"), (("--engine", "nosuch"), "--engine"), (("--engine", "BOMB"), "BOMB"),
    (("--dtype", "fp64"), "--dtype"), (("--gpu", "a100", "--dtype", "fp8"), "--dtype"),
    (("--weight-dtype", "int4", "--quant", "awq-g128"), "--quant"), (("--ep-imbalance", "2"), "--ep-imbalance"),
    (("--cluster", "dgx-h100", "--gpus", "1"), "--cluster"), (("--kernel", "paged-v1", "--model", "calibrated"), "--kernel"),
])
def test_bad_inputs_are_one_line_naming_the_flag(args, field, bomb):
    args = [a.replace("BOMB", bomb) for a in args]
    base = ["--jobs", "1"] + ["--requests", "20"] * ("--requests" not in args)
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", *base, *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field.replace('BOMB', bomb)}: "), r.stderr
    assert r.stdout == ""


def test_the_request_cap_says_why():
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--requests", "1M", "--iterations", "8"])
    assert r.stderr.strip() == ("error: --requests: 1,048,576 per run is over the planner's 100k (102,400): each "
                                "candidate runs up to 10 times, and a run of 100k takes seconds; give at most "
                                "102,400, or check one rate of more with lmcost serve")


def test_a_candidate_that_cannot_run_is_a_note():
    # llama-3-70b's bf16 weights are 141 GB: whole on each H100 of DP2 (80 GB) they leave no room for a KV
    # cache, a failure of that layout alone: its row, not an error
    plan = plan_serving(ServePlanRequest(model="llama-3-70b", gpus=2, requests=20, prompt="64", output="8",
                                         max_num_seqs=(8,), max_num_batched_tokens=(256,), iterations=1, jobs=1))
    status = {r["layout"]: r["status"] for r in plan.rows}
    assert status["DP2 (2 GPUs)"] == "cannot run" and "no room for a KV cache" in plan.rows[-1]["reason"]


def test_progress_is_said_at_the_start_and_after_each_run():
    # in process, two candidates (TP2, DP2): (0 done, 0 runs) at once, then once per run of a bisection and
    # once per candidate done, the runs counting up to the rows' total
    said = []
    plan = plan_serving(ServePlanRequest(**{**BASE, "max_num_seqs": (64,), "iterations": 2}),
                        lambda *a: said.append(a))
    total = sum(r["runs"] for r in plan.rows)
    assert said[0] == (0, 2, 0) and said[-1] == (2, 2, total) and len(said) == 1 + total + 2
    assert [r for _, _, r in said] == sorted(r for _, _, r in said)


def test_count_suffixes_and_the_ray_extra_in_help():
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--gpus", "1", "--requests", "20", "--prompt", "64",
                            "--output", "8", "--max-num-seqs", "1k", "--max-num-batched-tokens", "2k",
                            "--iterations", "1", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["rows"][0]["max_num_seqs"] == 1024  # 1k = 1,024, as serve's counts
    text = runner.invoke(app, ["serve-plan", "--help"], env={"COLUMNS": "300"}).stdout
    assert "pip install 'lmcost[ray]'" in text  # not eaten as rich markup


def test_missing_ray_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--gpus", "1", "--requests", "20", "--ray", "auto"])
    assert r.exit_code == 2 and r.stderr.strip() == ("error: --ray: not installed; a search on a Ray cluster needs "
                                                     "it; pip install 'lmcost[ray]'"), r.stderr


def test_cli_json_is_the_librarys():
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--gpus", "2", "--requests", "100", "--slo-ttft", "60ms",
                            "--slo-tpot", "30ms", "--max-num-seqs", "64,256", "--max-num-batched-tokens", "4k",
                            "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.stderr
    lib = plan_serving(ServePlanRequest(**BASE))
    data = json.loads(r.stdout)
    assert key(data["rows"]) == key(lib.rows) and data["best"]["offered_rate"] == lib.best["offered_rate"]


@pytest.mark.slow
def test_ray_gives_the_rows_in_process(in_process):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        on_ray = plan_serving(ServePlanRequest(**{**BASE, "jobs": None, "ray": "local"}))
    finally:
        ray.shutdown()
    assert on_ray.workers == "Ray cluster local"
    assert on_ray.rows == in_process.rows


def test_a_request_past_learned_positions_is_one_error_not_a_note_per_candidate():
    # gpt2 has 1,024 learned positions whatever the layout: 2,000 + 256 is refused before any search
    r = runner.invoke(app, ["serve-plan", "gpt2", "--gpus", "1", "--prompt", "2000", "--requests", "20"])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "2,256 tokens" in lines[0] and lines[0].startswith("error: --prompt")
