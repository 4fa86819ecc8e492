"""``--engine`` on estimate, op, plan, report and train (issue 25): which kernels and kernel figures a serving
engine runs.

The engine profiles are those of tests/data/h100-engines.yaml (the shipped H100 SXM with a hand-written
``engines:`` block: vllm 0.11.0, sglang 0.5.0; invented round figures, the same file tests/test_engine_profiles.py
checks the overlay's arithmetic on). Byte and operator counts are worked by hand in the comments from the
shapes of Llama 3 8B (d = 4096, h = 32, h_kv = 8, d_h = 128, d_ff = 14336, 32 layers; Meta's config.json) in
bf16 (2 bytes per element).
"""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from lmcost.cli import app, main
from lmcost.hardware.engine_kernels import ENGINE_KERNELS
from lmcost.operators.fusion import FUSIONS

YAML = "tests/data/h100-engines.yaml"
runner = CliRunner()


def run_json(args: list[str]) -> dict:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _without_engine(d: dict) -> dict:
    """``d`` less what records the engine: settings.engine and kernel_figures (op's settings.kernel, a plan's
    settings), and a plan's check command's ``--engine NAME``."""
    d = dict(d)
    if d.get("check_command") and "--engine" in d["check_command"].split(" "):
        words = d["check_command"].split(" ")
        i = words.index("--engine")
        d["check_command"] = " ".join(words[:i] + words[i + 2:])
    s = {k: v for k, v in d.pop("settings", {}).items() if k not in ("engine", "kernel_figures", "kernel")}
    if list(s) == ["fusion"]:  # a plan's settings are the engine, its figures and the fusion
        s = {}
    return {**d, **({"settings": s} if s else {})}


COMMANDS = {
    "estimate": ["estimate", "llama-3-8b", "--model", "calibrated", "--batch", "4", "--prompt", "1k", "--gen", "64"],
    "op gemm": ["op", "gemm", "--m", "4096", "--n", "4096", "--k", "4096"],
    "op attention": ["op", "attention", "--phase", "prefill", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                     "--seq", "2048"],
    "op rmsnorm": ["op", "rmsnorm", "--tokens", "4096", "--hidden", "4096"],
    "op layernorm": ["op", "layernorm", "--tokens", "4096", "--hidden", "4096"],
    "op elementwise": ["op", "elementwise", "--kind", "silu_mul", "--tokens", "4096", "--width", "14336"],
    "plan": ["plan", "tiny-gqa", "--gpus", "1", "--max-batch", "4"],
    "plan --train": ["plan", "tiny-gqa", "--gpus", "1", "--train", "--global-batch", "4", "--seq", "128"],
    "train": ["train", "tiny-gqa", "--gpus", "1", "--global-batch", "2", "--seq", "128"],
}


#: Commands in which auto's vLLM designs time nothing (GEMM, attention, LayerNorm) or do not apply (training).
NO_DESIGNS = ("op gemm", "op attention", "op layernorm", "plan --train", "train")
AUTO_FIGURES = "public-kernels.csv fit; norms, activations, RoPE: vllm's kernel designs (engine-memory-kernels.yaml)"


@pytest.mark.parametrize("name", COMMANDS)
def test_no_flag_is_auto_and_torch_is_the_block(name):
    # No --engine is auto, and every command's JSON records it as auto's (a fresh-user finding left from issue 25:
    # estimate recorded no settings.engine; op, plan and train no settings): the same numbers, engine and figures,
    # only a plan's check command not naming an engine that was not given.
    base = run_json(COMMANDS[name])
    auto = run_json([*COMMANDS[name], "--engine", "auto"])
    assert base["settings"]["engine"] == auto["settings"]["engine"] == {"name": "auto", "version": None}
    assert {**auto, "check_command": None} == {**base, "check_command": None}
    # torch is the base figures with no overlay and lmcost's default fusion (on the shipped H100 SXM). auto is the
    # same number for number where vLLM's norm/activation/RoPE designs time nothing or do not apply (training).
    torch = run_json([*COMMANDS[name], "--engine", "torch"])
    assert torch["settings"]["engine"] == {"name": "torch", "version": None}
    assert torch["settings"]["kernel_figures"] == "public-kernels.csv fit"
    training = name in ("plan --train", "train")
    assert auto["settings"]["kernel_figures"] == ("public-kernels.csv fit" if training else AUTO_FIGURES)
    if name in NO_DESIGNS:
        assert _without_engine(torch) == _without_engine(auto)
    else:
        assert _without_engine(torch) != _without_engine(auto)


def test_op_auto_named_prints_as_no_flag():
    # a fresh-user finding: `op rmsnorm --engine auto` titled its table "under auto (...)", no flag did not
    args = ["op", "rmsnorm", "--tokens", "4096", "--hidden", "8192", "--gpu", "h200"]
    plain, auto = runner.invoke(app, args), runner.invoke(app, [*args, "--engine", "auto"])
    assert plain.exit_code == auto.exit_code == 0 and "rmsnorm 4096x8192 on h200" in plain.stdout
    assert plain.stdout == auto.stdout


@pytest.mark.parametrize("name", ["op rmsnorm", "op elementwise"])
def test_auto_times_a_norm_and_an_activation_as_vllm_does(name):
    # auto's RMSNorm and SiLU-and-mul are vLLM's designs: the calibrated time --engine vllm gives the plain kernel
    # (its profile's GEMM and attention figures do not touch these ops), on the shipped H100 SXM's vLLM 0.24.0 profile.
    auto = run_json(COMMANDS[name])
    vllm = run_json([*COMMANDS[name], "--engine", "vllm", *(["--no-residual"] if name == "op rmsnorm" else [])])
    assert auto["time_s"]["calibrated"] == pytest.approx(vllm["time_s"]["calibrated"], rel=1e-12)
    torch = run_json([*COMMANDS[name], "--engine", "torch"])
    # vLLM's scalar designs at 4096 rows: slower than the public fit's Liger-fitted figures (README: 2.4x on a large
    # RMSNorm, 1.5-1.7x on SiLU-and-mul, measured on the H200)
    assert auto["time_s"]["calibrated"] > 1.3 * torch["time_s"]["calibrated"]


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_records_the_engine_and_its_version(name):
    d = run_json([*COMMANDS[name], "--gpu", YAML, "--engine", "vllm"])
    assert d["settings"]["engine"] == {"name": "vllm", "version": "0.11.0"}
    # the profile's fit names its table (tests/data/h100-engines.yaml: "hand-written for tests")
    assert d["settings"]["kernel_figures"] == "vllm 0.11.0 profile (hand-written for tests)"
    at = run_json([*COMMANDS[name], "--gpu", YAML, "--engine", "vllm@0.11.0"])
    assert at == d


def test_report_records_the_engine(tmp_path):
    r = runner.invoke(app, ["report", "tiny-gqa", "--gpu", YAML, "--engine", "sglang", "-o", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["settings"]["engine"] == {"name": "sglang", "version": "0.5.0"}
    assert summary["settings"]["kernel_figures"] == "sglang 0.5.0 profile (engine-kernels.csv)"
    assert summary["settings"]["fusion"] == list(ENGINE_KERNELS["sglang"].fusions)
    assert "engine sglang 0.5.0" in (tmp_path / "rep" / "index.html").read_text()
    # without --engine: auto's record, as estimate's (the test H100 file's base block is the public fit's)
    r = runner.invoke(app, ["report", "tiny-gqa", "--gpu", YAML, "-o", str(tmp_path / "plain")])
    assert r.exit_code == 0, r.output
    plain = json.loads((tmp_path / "plain" / "summary.json").read_text())["settings"]
    est = run_json(["estimate", "tiny-gqa", "--gpu", YAML])["settings"]
    assert plain["engine"] == est["engine"] == {"name": "auto", "version": None}
    assert plain["kernel_figures"] == est["kernel_figures"] == AUTO_FIGURES


def test_the_engine_changes_the_gemm_figures():
    # vllm's profile: peak_fraction 0.8, one 128x128 tile, 5 us per call. 4096^3: 32 x 32 = 1024 tiles, 8 waves
    # of 132 SMs, shape 1024 / 1056 = 0.969697; 2 * 4096^3 = 1.37439e11 FLOPs at 989.4e12 * 0.8 * 0.969697 =
    # 7.67535e14 FLOP/s = 179.065 us, + 5 us = 184.065 us.
    d = run_json([*COMMANDS["op gemm"], "--gpu", YAML, "--engine", "vllm"])
    assert d["time_s"]["calibrated"] == pytest.approx(184.065e-6, rel=1e-5)
    assert d["time_s"]["roofline"] == run_json([*COMMANDS["op gemm"], "--gpu", YAML])["time_s"]["roofline"]


def test_fused_add_rmsnorm_bytes_by_hand():
    # vLLM's fused_add_rms_norm(x, residual, weight): residual <- x + residual; x <- rmsnorm(residual) * weight.
    # 4096 tokens x 4096 in bf16: reads x and the residual (2 * 4096 * 4096 * 2 = 67,108,864 B) and the weight
    # (4096 * 2 = 8,192 B); writes the output and the new residual (67,108,864 B): 134,225,920 B. FLOPs: the add
    # (1 per element) + RMSNorm (4 per element) = 5 * 16,777,216 = 83,886,080.
    d = run_json([*COMMANDS["op rmsnorm"], "--gpu", YAML, "--engine", "vllm"])
    assert (d["bytes"], d["flops"], d["settings"]["kernel"]) == (134_225_920, 83_886_080, "fused_add_rmsnorm")
    # --no-residual: the plain norm the first layer's input norm runs: x read, y written, weight read:
    # 2 * 33,554,432 + 8,192 = 67,117,056 B, 4 FLOPs per element.
    plain = run_json([*COMMANDS["op rmsnorm"], "--gpu", YAML, "--engine", "vllm", "--no-residual"])
    assert (plain["bytes"], plain["flops"], plain["settings"]["kernel"]) == (67_117_056, 67_108_864, "rmsnorm")
    # the fused kernel without an engine is the same kernel, and its title says so
    assert _without_engine(run_json([*COMMANDS["op rmsnorm"], "--gpu", YAML, "--residual"]))["bytes"] == 134_225_920
    r = runner.invoke(app, [*COMMANDS["op rmsnorm"], "--gpu", YAML, "--engine", "vllm"])
    assert r.exit_code == 0 and "fused add + rmsnorm 4096x4096 (fused_add_rmsnorm)" in r.stdout


def test_estimate_under_vllm_runs_its_fusions():
    args = ["estimate", "llama-3-8b", "--gpu", YAML, "--prompt", "512", "--gen", "2", "--detail"]
    plain, vllm = run_json(args), run_json([*args, "--engine", "vllm"])
    assert vllm["settings"]["fusion"] == ["silu_mul", "add_norm", "qkv", "gate_up", "moe_grouped"]

    def layer(d):
        return {r["name"].removeprefix("layers."): r for r in d["ops"] if r["phase"] == "prefill" and r["name"].startswith("layers.")}

    a, b = layer(plain), layer(vllm)
    # Per layer 15 ops (norm, q, k, v, rope, sdpa, softmax, o, residual, norm, gate, up, act, down, residual)
    # become 10: q, k, v -> qkv_proj (-2), gate, up -> gate_up (-1), both residual adds into the next norm (-2).
    assert (len(a), len(b)) == (15, 10)
    assert {"attn.qkv_proj", "ffn.gate_up"} <= set(b) and not {"attn.q_proj", "attn_residual", "ffn_residual"} & set(b)
    # fused QKV: N = (32 + 2 * 8) * 128 = 6144; x [512, 4096] read once (4,194,304 B), W 4096 x 6144
    # (50,331,648 B), y [512, 6144] written (6,291,456 B): 60,817,408 B per layer.
    assert b["attn.qkv_proj"]["bytes"] == 60_817_408 * 32
    # each norm is now a fused add + RMSNorm: 4 * 512 * 4096 * 2 + 4096 * 2 = 16,785,408 B per layer.
    assert b["attn_norm"]["bytes"] == b["ffn_norm"]["bytes"] == 16_785_408 * 32
    # FLOPs never change with fusion; an explicit --fuse wins over the engine's.
    assert vllm["prefill"]["flops"] == plain["prefill"]["flops"]
    explicit = run_json([*args, "--engine", "vllm", "--fuse", "default"])
    assert explicit["settings"]["fusion"] == ["silu_mul"] and len(layer(explicit)) == 15
    assert explicit["settings"]["engine"]["name"] == "vllm"


def test_layernorm_models_keep_their_norm_unfused():
    # None of the three engines has a fused add + LayerNorm kernel (hardware/engine_kernels.py): GPT-2 under
    # vllm runs its fused QKV (c_attn) but each LayerNorm and residual add stays its own kernel.
    d = run_json(["estimate", "gpt2", "--gpu", YAML, "--engine", "vllm", "--prompt", "64", "--gen", "2"])
    assert "add_norm" not in d["settings"]["fusion"] and "qkv" in d["settings"]["fusion"]


def test_engine_table_names_real_fusions_and_cites_each():
    for name, k in ENGINE_KERNELS.items():
        assert set(k.fusions) <= set(FUSIONS) and "silu_mul" in k.fusions, name
        assert all(k.sources.get(f) for f in k.fusions), name  # a source line per fusion
        assert k.rmsnorm == "fused_add_rmsnorm" and "add_norm" in k.fusions


def _one_line_exit_2(args, monkeypatch, capsys) -> str:
    monkeypatch.setattr(sys, "argv", ["lmcost", *args])
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: --engine: "), lines
    return lines[0]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_gpu_without_the_profile_is_one_line(name, monkeypatch, capsys):
    # the test GPU has vllm and sglang profiles, no trtllm: the error names the engine and lists those it has
    line = _one_line_exit_2([*COMMANDS[name], "--gpu", YAML, "--engine", "trtllm"], monkeypatch, capsys)
    assert "no trtllm profile" in line and "sglang@0.5.0, vllm@0.11.0" in line


def test_a_gpu_without_an_efficiency_block_has_no_profile(monkeypatch, capsys):
    # the V100: no published kernel timings, no engine rows
    line = _one_line_exit_2([*COMMANDS["op gemm"], "--gpu", "v100", "--engine", "vllm"], monkeypatch, capsys)
    assert "v100 has no vllm profile (no efficiency block)" in line


@pytest.mark.parametrize("value, said", [("vllm@0.24.0", "use vllm@0.11.0"), ("bogus", "unknown engine 'bogus'"),
                                         ("torch@2.9", "torch has no versions"), ("vllm@", "empty version"),
                                         ("", "empty")])
def test_bad_engine_values(value, said, monkeypatch, capsys):
    line = _one_line_exit_2([*COMMANDS["estimate"], "--gpu", YAML, "--engine", value], monkeypatch, capsys)
    assert said in line


def test_auto_says_where_its_figures_are_not_the_public_fit(tmp_path):
    # The shipped H100's figures are the public table's fit: auto says nothing. A block fitted on the engines'
    # pooled rows (as the GPUs without public timings get) is said, once, on stderr.
    r = runner.invoke(app, [*COMMANDS["op gemm"]])
    assert r.exit_code == 0 and "kernel figures" not in r.stderr
    text = open(YAML).read().replace("    table: public-kernels.csv\n", "    table: engine-kernels.csv, engines pooled\n", 1)
    pooled = tmp_path / "pooled.yaml"
    pooled.write_text(text)
    r = runner.invoke(app, [*COMMANDS["op gemm"], "--gpu", str(pooled)])
    notes = [line for line in r.stderr.splitlines() if "kernel figures" in line]
    assert r.exit_code == 0 and notes == ["note: h100-engines-test's kernel figures: engines pooled (engine-kernels.csv), "
                                          "not a fit of public kernel timings (--engine to choose)"]
    d = run_json([*COMMANDS["op gemm"], "--gpu", str(pooled), "--engine", "auto"])
    assert d["settings"]["kernel_figures"].startswith("engines pooled")


def test_gpus_list_and_show_say_which_figures():
    from lmcost.apps.catalog import fitted_label
    from lmcost.hardware.gpu import load_gpu

    assert fitted_label(load_gpu(YAML)) == "public; vllm 0.11.0, sglang 0.5.0"
    assert fitted_label(load_gpu("v100")) == "-"
    r = runner.invoke(app, ["gpus", "show", YAML])
    assert r.exit_code == 0 and "public; vllm 0.11.0, sglang 0.5.0" in r.stdout


def test_serve_keeps_its_own_engine():
    # serve's --engine names a scheduler profile (lmcost/data/engines/vllm-0.11.yaml), not kernel figures
    d = run_json(["serve", "tiny-gqa", "--requests", "4", "--prompt", "32", "--output", "4", "--engine", "sglang"])
    assert "sglang" in json.dumps(d)


@pytest.mark.parametrize("engine, said", [("vllm", 1), ("sglang", 1), ("torch", 0), ("auto", 0), (None, 0)])
def test_train_under_a_serving_engine_says_so_once(engine, said):
    # A training step runs PyTorch's kernels; a serving engine's figures timing it is a what-if, said once on stderr.
    r = runner.invoke(app, [*COMMANDS["train"], "--gpu", YAML, *(["--engine", engine] if engine else [])])
    notes = [line for line in r.stderr.splitlines() if "is a serving engine" in line]
    assert r.exit_code == 0 and len(notes) == said, r.stderr
    if said:
        assert notes[0].startswith(f"note: {engine} ") and "time the training kernels" in notes[0]


RUNTIME_NOTE = ("note: --runtime triton: triton's figures replace vllm 0.24.0's kernel designs for norms, activations "
                "and RoPE (the engine's GEMM and attention figures stay)")


@pytest.mark.parametrize("args", [["op", "rmsnorm", "--tokens", "4096", "--hidden", "4096"],
                                  ["estimate", "llama-3-8b", "--model", "calibrated"]])
def test_a_runtime_under_an_engine_says_its_figures_replace_the_designs(args):
    # issue 25: op rmsnorm --engine vllm --runtime triton gave triton's 58.4 us under the label "fused add + rmsnorm
    # ... under vllm 0.24.0" with no note; Efficiency.kind_figures takes the chosen runtime's figures first, so one
    # stderr note says so, once per run; without --runtime, no such note.
    base = [*args, "--gpu", "h200", "--engine", "vllm"]
    given, plain = runner.invoke(app, [*base, "--runtime", "triton"]), runner.invoke(app, base)
    assert given.exit_code == 0 == plain.exit_code, given.output
    assert given.stderr.splitlines().count(RUNTIME_NOTE) == 1
    assert "--runtime" not in plain.stderr
