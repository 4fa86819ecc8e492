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


def test_train_plan_passes_every_layout_s_options_to_the_step_train_runs():
    # plan --train gives each setup train's framework, power cap, kernel family, runtime and fp8 recipe:
    # its fastest row's step is what `lmcost train` (the oracle: the check command, run in-process) costs
    # for that layout with those options, and the options move it (the plan without them is another step).
    opts = ["--framework", "deepspeed", "--power-limit", "400", "--precision", "fp8-delayed", "--kernel", "fa3",
            "--runtime", "torch-eager"]
    base = ["plan", "llama-3-8b", "--train", "--gpus", "8", "--global-batch", "16", "--seq", "2k"]
    plan = _json([*base, *opts])
    best = plan["fits"][0]
    argv = _check_argv(plan)
    for flag, value in zip(opts[::2], opts[1::2]):
        assert argv[argv.index(flag) + 1] == value
    step = _json(argv)
    assert step["step_s"] == best["step_s"] and step["mfu"] == best["mfu"]
    assert step["memory"]["total_bytes"] == best["memory_per_gpu_bytes"]
    plain = _json(base)["fits"]
    same = [r for r in plain if (r["layout"], r["micro_batch"], r["zero"], r["recompute"])
            == (best["layout"], best["micro_batch"], best["zero"], best["recompute"])]
    assert len(same) == 1 and same[0]["step_s"] != best["step_s"]


def test_train_plan_lists_one_zero_stage_where_one_rank_holds_the_states():
    # --global-batch 7 on 8 GPUs: only dp = 1 divides it with micro-batch 1 (7 % (dp x mb) = 0 for dp, mb
    # in 1, 2, 4, 8), so the layouts are tp x pp = 8: TP1xPP8, TP2xPP4, TP4xPP2, TP8xPP1, each with recompute
    # none and full: 4 x 2 = 8 setups. ZeRO-3 over one rank shards nothing (it was listed beside ZeRO-1 as
    # 8 more setups, using more memory); only ZeRO-1, the lowest searched, is costed.
    plan = _json(["plan", "tiny-gqa", "--train", "--global-batch", "7"])
    assert len(plan["fits"]) + len(plan["skipped"]) == 8
    assert {r["zero"] for r in plan["fits"]} == {1} and all(r["dp"] == 1 for r in plan["fits"])
    assert all(" ZeRO-1 " in s["setup"] for s in plan["skipped"])


@pytest.mark.parametrize("argv, line", [
    (["--framework", "nope"], "error: --framework: unknown framework 'nope'; use one of auto, megatron, deepspeed, "
                              "fsdp, fsdp-compile, eager"),
    (["--precision", "fp8-delayed", "--gpu", "a100"], "error: --precision: a100-80gb has no fp8 tensor-core rate for "
     "fp8-delayed; use --precision bf16-mixed, or a GPU with fp8 (Hopper, Ada, Blackwell)"),
    (["--power-limit", "0"], "error: --power-limit: must be a positive number of watts (each GPU takes caps from a "
                             "quarter of its TDP up), got 0.0; give the cap in watts, e.g. 500, or leave it out"),
    (["--runtime", "nope"], "error: --runtime: unknown runtime 'nope'; use auto or one of triton, torch-eager, cuda"),
])
def test_train_plan_refuses_a_bad_training_option_as_train_does(argv, line):
    # Each is refused once, before the search (it would skip every setup and be blamed on --gpus), in
    # train's own words: `lmcost train` with the same option says the same line.
    for cmd in (["plan", "tiny-gqa", "--train", "--global-batch", "8"], ["train", "tiny-gqa", "--global-batch", "8"]):
        res = CliRunner().invoke(app, [*cmd, *argv])
        assert res.exit_code == 2 and (res.stderr or res.stdout).strip() == line, res.output


def test_train_plan_says_what_it_plans_on_a_pipe(monkeypatch):
    # PROGRESS_AFTER_S 0: the status line comes at once, as it does 2 s into a run; stdout stays one JSON document.
    import importlib

    monkeypatch.setattr(importlib.import_module("lmcost.cli.app"), "PROGRESS_AFTER_S", 0.0)
    res = CliRunner().invoke(app, ["plan", "tiny-gqa", "--train", "--global-batch", "8", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["model"] == "tiny-gqa"
    assert res.stderr.startswith("lmcost: planning the training of tiny-gqa on 8 GPUs (0 s)\n")
