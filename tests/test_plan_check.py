"""``lmcost plan``'s "check it" command reproduces the plan's point: run the printed command in-process and
its memory, TTFT and TPOT (or step time and MFU) are the plan's row's; the SLOs are judged on the
calibrated model by default, the roofline beside it as a bound; options of the other kind of plan are
refused, not ignored."""

from __future__ import annotations

import json
import math
import shlex

import pytest
from typer.testing import CliRunner

from lmcost.cli import app


def _json(argv: list[str]) -> dict:
    res = CliRunner().invoke(app, [*argv, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _check_argv(plan: dict) -> list[str]:
    cmd = shlex.split(plan["check_command"])
    assert cmd[0] == "lmcost"
    return cmd[1:]


@pytest.mark.parametrize("argv", [
    # The case: int4 weights and an fp8 cache (the command dropped both: 140 GB became 239 GB).
    ["llama-3.1-70b", "--gpu", "h100", "--gpus", "2", "--weight-dtype", "int4", "--kv-dtype", "fp8", "--tpot", "20ms",
     "--max-batch", "64"],
    # fp8 everywhere, the roofline, a fusion, MoE layouts, a model with its own recipe dropped for a dtype.
    ["mixtral-8x7b", "--gpu", "h200", "--gpus", "4", "--dtype", "fp8", "--model", "roofline", "--fuse", "vllm",
     "--max-batch", "32", "--isl", "1k", "--osl", "64"],
    ["gpt-oss-20b", "--gpu", "h100", "--gpus", "2", "--weight-dtype", "fp8", "--max-batch", "16", "--osl", "32"],
    # Two GPU types: auto resolves to fp16 over the V100 (one GPU: no node needed), and the command names
    # it for the A100 it picks.
    ["llama-3-8b", "--gpu", "v100", "--gpu", "a100", "--gpus", "1", "--max-batch", "16", "--osl", "16"],
    # Two nodes of a cluster.
    ["llama-3-8b", "--gpu", "a100-80gb", "--cluster", "dgx-a100", "--gpus", "16", "--max-batch", "16", "--osl", "16"],
])
def test_serving_check_command_reproduces_the_best_point(argv):
    plan = _json(["plan", *argv])
    best = plan["best"]
    est = _json(_check_argv(plan))
    # The same library path (lmcost.cost.serving.serving_point, vectorised in the plan, one batch in
    # estimate) is bit for bit equal (tests/test_serving.py); allow float summation order only.
    assert est["memory"]["total_bytes"] == best["memory_per_gpu_bytes"]
    assert math.isclose(est["ttft_s"], best["ttft_s"], rel_tol=1e-12)
    assert math.isclose(est["tpot_s"], best["tpot_s"], rel_tol=1e-12)
    assert est["memory"]["fits"]


def test_train_check_command_reproduces_the_fastest_setup():
    plan = _json(["plan", "llama-3-8b", "--train", "--gpus", "8", "--global-batch", "16", "--seq", "2k",
                  "--optimizer", "sgd", "--precision", "bf16-mixed-fp32-grads", "--model", "roofline"])
    best = plan["fits"][0]
    step = _json(_check_argv(plan))
    assert step["step_s"] == best["step_s"] and step["mfu"] == best["mfu"]
    assert step["memory"]["total_bytes"] == best["memory_per_gpu_bytes"]
    assert (step["optimizer"], step["precision"]) == ("sgd", "bf16-mixed-fp32-grads")


def test_slos_are_judged_on_the_calibrated_model_with_the_roofline_as_a_bound():
    # The case: judged on the roofline, the best point's TPOT meets 20 ms while the calibrated
    # model (the expected time) of that very point misses it by far. By default every point is judged on
    # its calibrated TPOT; the roofline bound is reported beside it and never above it.
    args = ["plan", "llama-3.1-70b", "--gpu", "h100", "--gpus", "2", "--weight-dtype", "int4", "--kv-dtype", "fp8",
            "--tpot", "20ms", "--max-batch", "256"]
    roof = _json([*args, "--model", "roofline"])
    assert all(r["tpot_roofline_s"] == r["tpot_s"] for r in roof["front"])
    claimed = _json([a if a != "roofline" else "calibrated" for a in _check_argv(roof)])
    assert roof["best"]["tpot_s"] <= 0.020 < claimed["tpot_s"]
    plan = _json(args)
    assert plan["time_model"] == "calibrated"
    best = plan["best"]
    assert best["tpot_s"] <= 0.020 and best["tpot_roofline_s"] < best["tpot_s"]
    for row in plan["front"]:
        assert row["meets_slo"] == (row["tpot_s"] <= 0.020)
        assert row["tpot_roofline_s"] <= row["tpot_s"] and row["ttft_roofline_s"] <= row["ttft_s"]


@pytest.mark.parametrize("argv, flag", [
    (["--train", "--isl", "4k"], "--isl"),
    (["--train", "-o", "x.html"], "--output"),
    (["--train", "--dtype", "fp8"], "--dtype"),
    (["--train", "--max-batch", "8"], "--max-batch"),
    (["--seq", "8k"], "--seq"),
    (["--optimizer", "sgd"], "--optimizer"),
])
def test_an_option_of_the_other_plan_is_refused_in_one_line(argv, flag, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["plan", "llama-3-8b", *argv])
    assert res.exit_code == 2
    line = (res.stderr or res.stdout).strip()
    assert line.startswith(f"error: {flag}:") and "\n" not in line, line
    assert not (tmp_path / "x.html").exists()
