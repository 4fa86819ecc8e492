"""Errors that name what the user typed, alone on stderr, and runs that say what they are doing: issue 24's
second pass (a fresh user's findings 3, 7-12, 14 and 26). Each command runs in-process (CliRunner), where a
usage error renders as click's box and a library error as its one line ``error: <field>: <what>; <fix>``."""

from __future__ import annotations

import importlib
import json
import os

import pytest
from typer.testing import CliRunner

from lmcost.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_roofline_draws_a_repeated_gpu_or_batch_once():
    # h100 and h100-sxm are one GPU (an alias): given both, and batch 1 three times, the figure is the
    # one of --gpu h100 --batch 1, whose every row was printed twice (and three times) before.
    once = run("roofline", "llama-3-8b", "--gpu", "h100", "--batch", 1, "--json")
    twice = run("roofline", "llama-3-8b", "--gpu", "h100", "--gpu", "h100-sxm", "--batch", "1,1,1", "--json")
    assert once.exit_code == twice.exit_code == 0, twice.output
    assert json.loads(twice.stdout) == json.loads(once.stdout)
    # Kept in the order first given, as kv keeps its variants.
    d = json.loads(run("roofline", "tiny-gqa", "--gpu", "a100", "--gpu", "h100", "--gpu", "a100",
                       "--batch", "8,1,8", "--json").stdout)
    assert list(d["ridge_flops_per_byte"]) == ["a100-80gb", "h100-sxm"]
    assert list(dict.fromkeys((p["gpu"], p["batch"]) for p in d["points"])) == [
        ("a100-80gb", 8), ("a100-80gb", 1), ("h100-sxm", 8), ("h100-sxm", 1)]


def test_kv_compares_a_repeated_context_once():
    once = run("kv", "llama-3-8b", "--variants", "base", "--context", "4k,8k", "--json")
    twice = run("kv", "llama-3-8b", "--variants", "base", "--context", "4k,4k,8k", "--json")
    assert json.loads(twice.stdout) == json.loads(once.stdout) and len(json.loads(once.stdout)) == 2


def test_roofline_of_several_gpus_keeps_stderr_empty_or_one_line():
    # Six (gpu, batch) pairs draw progress; rich's track, off a terminal, left a blank line on stderr:
    # after a good run, and before the error of a dtype one GPU lacks (the A100 has no fp8 peak).
    ok = run("roofline", "tiny-gqa", "--gpu", "a100", "--gpu", "h100", "--batch", "1,8,64")
    assert ok.exit_code == 0 and ok.stderr == "", repr(ok.stderr)
    bad = run("roofline", "tiny-gqa", "--dtype", "fp8", "--gpu", "h100", "--gpu", "a100")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --dtype: a100-80gb has no fp8 peak; ")
    assert bad.stderr.count("\n") == 1, repr(bad.stderr)


@pytest.mark.parametrize("option, value, line", [
    ("--seq", "0", "error: --seq: must be a whole number from 1 to 2,147,483,648, got 0;"),
    ("--global-batch", "0", "error: --global-batch: must be a whole number from 1 to 2,147,483,648, got 0;"),
    ("--optimizer", "bogus", "error: --optimizer: unknown optimizer 'bogus';"),
    ("--precision", "bogus", "error: --precision: unknown recipe 'bogus';"),
    ("--gpus", "0", "error: --gpus: must be a whole number from 1 to 65,536, got 0;"),
])
def test_plan_train_names_the_bad_option_not_gpus(option, value, line):
    # Each skipped every layout, and the plan said "--gpus: no training layout of 8 GPUs runs ...".
    r = run("plan", "llama-3-8b", "--train", option, value)
    assert r.exit_code == 2 and r.stderr.startswith(line) and r.stderr.count("\n") == 1, r.stderr


def test_plan_train_refuses_a_model_with_constant_state_layers_by_name():
    r = run("plan", "nemotron-h-56b", "--train")
    assert r.exit_code == 2 and r.stderr.startswith("error: model: nemotron-h-56b has constant-state layers"), r.stderr


def test_clusters_show_names_its_argument():
    r = run("clusters", "show", "bogus")
    assert r.exit_code == 2 and r.stderr.startswith("error: cluster: unknown cluster 'bogus'; "), r.stderr


@pytest.mark.parametrize("command", ["estimate", "explain", "roofline"])
def test_int4_activations_name_dtype(command):
    r = run(command, "llama-3-8b", "--dtype", "int4")
    assert r.exit_code == 2
    assert r.stderr == ("error: --dtype: int4 activations are not modelled; use int4 for --weight-dtype or "
                        "--kv-dtype, and bf16/fp16/fp8 for --dtype\n")


def test_a_folder_or_a_link_loop_is_named_as_such(tmp_path, monkeypatch):
    folder, loop = tmp_path / "adir", tmp_path / "loop"
    folder.mkdir()
    os.symlink(loop, loop)
    for args, path, noun in [(["estimate", "llama-3-8b", "--gpu", folder], folder, "GPU"),
                             (["estimate", "llama-3-8b", "--gpu", loop], loop, "GPU"),
                             (["estimate", "llama-3-8b", "--tp", 2, "--cluster", folder], folder, "cluster"),
                             (["estimate", loop], loop, "model")]:
        r = run(*args)
        what = "is a folder, not a file" if path == folder else "is a loop of symbolic links (ELOOP)"
        assert r.exit_code == 2 and r.stderr == f"error: {path}: {what}; check the path, or give a shipped {noun} name\n"
    # A bare name is a path when something is there (the folder in the working directory), and unknown
    # when nothing is; a shipped name wins over a folder of that name.
    monkeypatch.chdir(tmp_path)
    assert run("estimate", "llama-3-8b", "--gpu", "adir").stderr.startswith("error: adir: is a folder, not a file;")
    assert run("estimate", "llama-3-8b", "--gpu", "h900").stderr.startswith("error: --gpu: unknown GPU 'h900';")
    (tmp_path / "h100").mkdir()
    assert run("estimate", "llama-3-8b", "--gpu", "h100", "--json").exit_code == 0


@pytest.mark.torch
def test_breakdown_too_big_names_seq():
    # breakdown has --seq, not --prompt: 405B's training step needs terabytes on any machine's CPU.
    r = run("breakdown", "llama-3.1-405b", "--device", "cpu")
    assert r.exit_code == 2 and r.stderr.startswith("error: --layers/--batch/--seq: the run needs about "), r.stderr
    assert r.stderr.rstrip().endswith("; use fewer --layers, a smaller --batch or --seq")


@pytest.mark.torch
@pytest.mark.parametrize("trace, args, line", [
    (None, ["--batch", "0"], "error: --batch: must be a whole number from 1 to 2,147,483,648, got 0; pass --batch in that range\n"),
    (None, ["--batch", "1,1"], "error: --batch: a batch size is repeated; give each once\n"),
    ('{"traceEvents": 3}', ["--gpu", "h100"], "no traceEvents list; give a Chrome trace (torch.profiler export_chrome_trace)\n"),
])
def test_validate_refuses_before_its_status_line(tmp_path, monkeypatch, trace, args, line):
    # With every status line said at once (PROGRESS_AFTER_S 0), the error still comes alone: the request's
    # own values and its trace are checked before the status line starts (they came after it, 4.6 s in).
    monkeypatch.setattr(importlib.import_module("lmcost.cli.app"), "PROGRESS_AFTER_S", 0.0)
    extra = []
    if trace is not None:
        (tmp_path / "t.json").write_text(trace)
        extra = ["--trace", tmp_path / "t.json"]
        line = f"error: {tmp_path / 't.json'}: {line}"
    r = run("validate", "gpt2", *args, *extra, "--report-dir", tmp_path / "rep")
    assert r.exit_code == 2 and r.stderr == line, r.stderr


def test_kv_says_what_it_is_doing_on_a_pipe(monkeypatch):
    # PROGRESS_AFTER_S 0: the line comes at once, as it would after 2 s (q4_k_m took 2.9 s with nothing said).
    monkeypatch.setattr(importlib.import_module("lmcost.cli.app"), "PROGRESS_AFTER_S", 0.0)
    r = run("kv", "llama-3-8b", "--variants", "base", "--context", "4k", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["context"] == 4096
    assert r.stderr == "lmcost: comparing the attention variants of llama-3-8b on h100 (0 s)\n"
