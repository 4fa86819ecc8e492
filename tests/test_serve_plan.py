"""``lmcost serve-plan`` (:mod:`lmcost.apps.serve_plan`): the best candidate's rate meets the SLOs when
``lmcost serve`` reruns it and a rate 25% higher does not; the static bound is never met (so it brackets
the bisection soundly) and pruning by it keeps the best; the process pool and a Ray instance give the rows
the search gives in process; bad inputs are one line naming the flag (exit 2)."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.apps.serve_plan import ServePlanRequest, check_command, plan_serving
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
    return [(r["layout"], r["max_num_seqs"], r["max_num_batched_tokens"], r["status"], r["rate"]) for r in rows]


def test_best_meets_the_slos_when_rerun_and_25_percent_more_does_not(in_process):
    best = in_process.best
    assert best is not None and in_process.candidates == 4
    ok = [r["goodput_tokens_per_s_per_gpu"] for r in in_process.rows if r["status"] == "ok"]
    assert ok == sorted(ok, reverse=True) and best["goodput_tokens_per_s_per_gpu"] == ok[0]
    # goodput per GPU: rate x the mean output (256, fixed) / 2 GPUs
    assert best["goodput_tokens_per_s_per_gpu"] == pytest.approx(best["rate"] * 256 / 2)

    def rerun(rate):
        req = ServeRequest(model="llama-3-8b", gpu="h100", tp=best["tp"], ep=best["ep"], dp=best["dp"], requests=100,
                           prompt="1024", output="256", rate=rate, max_num_seqs=best["max_num_seqs"],
                           max_num_batched_tokens=best["max_num_batched_tokens"], slo_ttft_s=0.06, slo_tpot_s=0.03)
        return run_serve(req).summary

    at = rerun(best["rate"])
    assert at["ttft_s"]["p99"] <= 0.06 and at["tpot_s"]["p99"] <= 0.03 and at["saturated"] is None
    assert at["ttft_s"]["p99"] == best["ttft_p99_s"]  # the row's figures are that run's
    above = rerun(best["rate"] * 1.25)
    assert above["ttft_s"]["p99"] > 0.06 or above["tpot_s"]["p99"] > 0.03 or above["saturated"] is not None


def test_the_check_command_reruns_the_best(in_process):
    best = in_process.best
    r = runner.invoke(app, [*check_command(in_process.request, best), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["ttft_s"]["p99"] == best["ttft_p99_s"]


def test_the_static_bound_is_never_met_and_pruning_keeps_the_best():
    # Without SLOs a run at the bound must saturate: were the bound below what a layout serves, the
    # bisection would return the bound itself (reason "meets the SLOs at its static bound").
    space = dict(BASE, slo_ttft_s=None, slo_tpot_s=None, max_num_seqs=(16, 64, 256), max_num_batched_tokens=(2048, 8192))
    full = plan_serving(ServePlanRequest(**space, prune=False))
    assert full.pruned == 0 and all(r["status"] == "ok" for r in full.rows)
    assert all(r["rate"] < r["bound_rate"] for r in full.rows)
    pruned = plan_serving(ServePlanRequest(**space, prune=True, wave=2))
    assert pruned.pruned > 0  # a wave of 2 leaves later candidates below the best found
    assert key([pruned.best]) == key([full.best])
    kept = [r for r in pruned.rows if r["status"] == "ok"]
    assert key(kept) == key(full.rows[:len(kept)])


def test_process_pool_gives_the_rows_in_process(in_process):
    pooled = plan_serving(ServePlanRequest(**{**BASE, "jobs": 2}))
    assert pooled.workers == "2 processes"
    assert pooled.rows == in_process.rows


@pytest.mark.parametrize("args, field", [(("--gpus", "0"), "--gpus"), (("--percentile", "42"), "--percentile"),
                                         (("--slo-ttft", "0s"), "--slo-ttft"), (("--max-num-seqs", "64,64"),
                                                                                 "--max-num-seqs")])
def test_bad_inputs_are_one_line_naming_the_flag(args, field):
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--requests", "20", "--jobs", "1", *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}: "), r.stderr
    assert r.stdout == ""


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
    assert key(data["rows"]) == key(lib.rows) and data["best"]["rate"] == lib.best["rate"]


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
