"""The command line: the JSON contract, CSV, help on every command, and one-line errors (exit 2)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
import re
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from conftest import HF_DIR, ROOT
from lmcost import LmcostError, Precision, Workload, estimate, load_config, load_gpu
from lmcost.cli import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_estimate_json_contract():
    r = run("estimate", ROOT / "lmcost" / "data" / "models" / "llama-3-8b.yaml", "--gpu", "h100", "--batch", 8, "--prompt", 2048,
            "--gen", 256, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["params"]["total"] == 8_030_261_248 == d["params"]["active_per_token"]
    assert d["kv_cache"]["bytes_per_token"] == 131_072
    # KV at the final context: 8 sequences x (2048 + 256) tokens x 131,072 B.
    assert d["kv_cache"]["bytes_total"] == 8 * 2304 * 131_072
    assert d["memory"]["capacity_bytes"] == 80e9 and d["memory"]["fits"] is True
    for phase in ("prefill", "decode"):
        for key in ("flops", "bytes", "arithmetic_intensity", "time_s", "bound"):
            assert key in d[phase]
    assert d["decode"]["bound"] == "memory" and d["prefill"]["bound"] == "compute"
    assert d["ttft_s"] == d["prefill"]["time_s"]
    for key in ("tpot_s", "throughput_tokens_per_s"):
        assert d[key] > 0
    rows = d["op_classes"]
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    for phase in ("prefill", "decode"):
        shares = [r for r in rows if r["phase"] == phase]
        assert sum(r["flops_share"] for r in shares) == pytest.approx(1)
        assert sum(r["time_share"] for r in shares) == pytest.approx(1)
        assert all(0 <= r["flops_share"] <= 1 and 0 <= r["time_share"] <= 1 for r in shares)
        assert sum(r["flops"] for r in shares) == pytest.approx(d[phase]["flops"])


@pytest.mark.parametrize("model", ["roofline", "calibrated"])
def test_time_upper_s_is_the_roofline_with_no_overlap(model):
    # estimate --json's time_upper_s (a name kept for JSON consumers) is each op's compute + memory summed, the
    # roofline with no overlap: with no kernel floor binding it is compute_s + memory_s exactly (the sum of
    # per-op sums is the sum of the two summed terms), at least the roofline, and not an upper bound on the
    # calibrated time (decode of Llama-3-8B at b=1 is latency-bound kernels: calibrated above it). The text
    # table labels its column "roofline, no overlap" under either model, and shows that value.
    from lmcost.output.render import si

    args = ["estimate", "llama-3-8b", "--gpu", "h100", "--model", model]
    d, text = json.loads(run(*args, "--json").stdout), run(*args).stdout
    for phase in ("prefill", "decode"):
        p = d[phase]
        assert p["time_upper_s"] == pytest.approx(p["compute_s"] + p["memory_s"], rel=1e-9)
        assert p["time_roofline_s"] <= p["time_upper_s"]
        assert si(p["time_upper_s"], "s") in next(line for line in text.splitlines() if line.startswith(f"│ {phase}"))
    assert d["decode"]["time_calibrated_s"] > d["decode"]["time_upper_s"]
    assert "roofline, no overlap" in text and "no-overlap bound" not in text


def test_json_is_the_python_api():
    # the CLI's default engine is auto: the GPU as choose_engine(gpu, None) selects it (vLLM's norm and activation
    # designs); the API costs the GPU it is given
    from lmcost.apps.engine_choice import choose_engine

    r = run("estimate", "llama-3-8b", "--gpu", "h100", "--json")
    api = estimate(load_config("llama-3-8b"), choose_engine(load_gpu("h100"), None)[0], Workload(), Precision()).to_dict()
    assert json.loads(r.stdout) == json.loads(json.dumps(api))


def test_hf_config_json_and_a100():
    r = run("estimate", HF_DIR / "llama-3-8b.json", "--gpu", "a100-80gb", "--dtype", "bf16", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["gpu"] == "a100-80gb"


def test_csv_has_the_json_values():
    j = json.loads(run("estimate", "mixtral-8x7b", "--json").stdout)
    rows = dict(csv.reader(io.StringIO(run("estimate", "mixtral-8x7b", "--csv").stdout)))
    assert int(rows["params.active_per_token"]) == j["params"]["active_per_token"]
    assert float(rows["decode.time_s"]) == pytest.approx(j["decode"]["time_s"])
    assert float(rows["op_classes.decode.gemm.flops"]) == pytest.approx(
        next(r["flops"] for r in j["op_classes"] if r["phase"] == "decode" and r["op_class"] == "gemm"))


def test_table_output_and_detail():
    r = run("estimate", "deepseek-v3", "--gpu", "h200", "--detail")
    assert r.exit_code == 0, r.output
    assert "TTFT" in r.stdout and "moe.expert.gate" in r.stdout


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_explain_prints_formulas(phase):
    r = run("explain", "llama-3-8b", "--phase", phase, "--json")
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    # Decode (s = 1) q_proj: 2·b·d·h·d_h; prefill adds s.
    expected = "2*b*d*d_h*h" if phase == "decode" else "2*b*d*d_h*h*s"
    assert rows["layers.attn.q_proj"]["flops"] == expected
    assert run("explain", "mistral-7b", "--phase", phase).exit_code == 0


def test_inventories():
    gpus = json.loads(run("gpus", "list", "--json").stdout)
    h100 = next(g for g in gpus if g["name"] == "h100-sxm")
    assert h100["ridge_flops_per_byte"] == pytest.approx(989.4e12 / 3.35e12)
    models = json.loads(run("models", "list", "--json").stdout)
    assert {m["name"] for m in models} >= {"llama-3-8b", "deepseek-v3", "mistral-7b", "llama"}
    assert run("gpus", "show", "a100").exit_code == 0
    assert run("models", "show", "deepseek-v3").exit_code == 0


def _command_paths() -> list[list[str]]:
    """Every command and group of the app, walked from the click group typer builds (not a hand-kept list)."""
    import typer.main

    out = []

    def walk(cmd, path):
        out.append(path)
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, path + [name])

    walk(typer.main.get_command(app), [])
    return out


def test_the_command_walk_finds_every_command():
    # The commands the README's table lists, and the groups: a walk that found nothing would test nothing.
    paths = {" ".join(p) for p in _command_paths()}
    assert {"estimate", "explain", "kv", "roofline", "report", "breakdown", "calibrate", "profile", "validate",
            "op gemm", "op attention", "op rmsnorm", "op layernorm", "op elementwise", "gpus list", "gpus show",
            "models list", "models show"} <= paths


@pytest.mark.parametrize("args", _command_paths(), ids=lambda p: " ".join(p) or "lmcost")
def test_every_command_has_help(args):
    r = run(*args, "--help")
    lines = [line.strip() for line in r.stdout.splitlines() if line.strip()]
    assert r.exit_code == 0 and lines[0].startswith("Usage")
    assert lines[1][0].isalpha() and len(lines[1]) > 10, lines[:3]  # a description, not only the options box


def _bad(tmp_path, name, **over):
    base = dict(name="bad", d_model=512, n_layers=2, vocab_size=1000,
                attention=dict(n_heads=32, n_kv_heads=8), ffn=dict(activation="swiglu", d_ff=1024))
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(base))
    return p


@pytest.mark.parametrize("case, field", [
    (dict(attention=dict(n_kv_heads=5)), "attention.n_kv_heads"),
    (dict(ffn=dict(d_ff=-5)), "ffn.d_ff"),
    (dict(colour="blue"), "colour"),
    (dict(moe=dict(n_experts=4, top_k=8, d_ff_expert=64)), "moe.top_k"),
])
def test_bad_yaml_is_one_line_exit_2(tmp_path, case, field):
    p = _bad(tmp_path, "bad", **case)
    r = run("estimate", p)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {p}: {field}: "), r.stderr
    assert "; " in lines[0] and "Traceback" not in r.output


@pytest.mark.parametrize("args, prefix", [
    (["estimate", "/nonexistent/model.yaml"], "error: /nonexistent/model.yaml: no such file"),
    (["estimate", "llama-3-8b", "--gpu", "h900"], "error: --gpu: unknown GPU 'h900'"),
    (["estimate", "llama3"], "error: model: unknown model 'llama3'"),
    (["estimate", "llama-3-8b", "--batch", "0"], "error: --batch: "),
    (["estimate", "llama-3-8b", "--dtype", "fp7"], "error: --dtype: unknown dtype 'fp7'"),
    (["estimate", "llama-3-8b", "--gpu", "v100", "--dtype", "bf16"], "error: --dtype: v100 has no bf16 peak"),
    (["estimate", "gpt2", "--prompt", "1000"], "error: --prompt + --gen: context 1256 exceeds"),
    (["gpus", "show", "h900"], "error: gpu: unknown GPU"),
])
def test_bad_arguments_are_one_line_exit_2(args, prefix):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(prefix) and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_malformed_yaml(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("name: x\nd_model: [1,\n")
    r = run("estimate", p)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {p}: not valid YAML")


def test_unknown_hf_model_type_and_field(tmp_path):
    data = json.loads((HF_DIR / "llama-3-8b.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**data, "model_type": "llama9", "architectures": ["Llama9ForCausalLM"]}))  # no modelled class
    r = run("estimate", p)
    assert r.exit_code == 2 and "model_type: unknown model_type 'llama9'" in r.stderr
    p.write_text(json.dumps({**data, "num_cross_layers": 4}))
    r = run("estimate", p)
    assert r.exit_code == 2 and "num_cross_layers: field not understood by the llama mapping" in r.stderr
    p.write_text(json.dumps({k: v for k, v in data.items() if k != "hidden_size"}))
    r = run("estimate", p)
    assert r.exit_code == 2 and "hidden_size: missing" in r.stderr


@pytest.mark.parametrize("args, prefix", [
    (["estimate", "llama-3-8b", "--batch", "1e9"], "error: --batch: "),
    (["estimate"], "error: MODEL: Missing argument"),
    (["estimate", "llama-3-8b", "--attention", "fast"], "error: --attention: 'fast' is not one of"),
    (["estimate", "llama-3-8b", "--bogus"], "error: --bogus: No such option"),
])
def test_usage_errors_are_one_line_exit_2(args, prefix):
    # The console script (not CliRunner): click's usage errors go through the same one-line format.
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "lmcost.cli", *args], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith(prefix) and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stdout == ""


def test_a_config_read_through_its_architectures_says_so_on_stderr():
    # Kimi-K2's config.json (model_type kimi_k2, architectures [DeepseekV3ForCausalLM]): one note line on
    # stderr, the JSON on stdout untouched.
    import subprocess
    import sys

    path = Path(__file__).parent / "data" / "hf-configs" / "kimi-k2.json"
    r = subprocess.run([sys.executable, "-m", "lmcost.cli", "kv", str(path), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    notes = [line for line in r.stderr.splitlines() if line.startswith("note:")]  # (a busy machine adds progress)
    assert notes == [f"note: {path}: model_type 'kimi_k2' is not one lmcost knows; read as "
                     "deepseek_v3 because architectures names DeepseekV3ForCausalLM"]
    json.loads(r.stdout)


def test_detail_json_has_every_operator():
    d = json.loads(run("estimate", "llama-3-8b", "--detail", "--json").stdout)
    names = {r["name"] for r in d["ops"] if r["phase"] == "decode"}
    assert {"layers.attn.q_proj", "layers.ffn.down", "lm_head"} <= names
    assert sum(r["flops"] for r in d["ops"] if r["phase"] == "decode") == pytest.approx(d["decode"]["flops"])
    rows = list(csv.DictReader(io.StringIO(run("estimate", "llama-3-8b", "--detail", "--csv").stdout)))
    assert len(rows) == len(d["ops"])


def test_gen_1_has_no_tpot():
    d = json.loads(run("estimate", "llama-3-8b", "--gen", "1", "--json").stdout)
    assert d["tpot_s"] is None
    # One token, made by prefill: throughput = b * 1 / TTFT.
    assert d["throughput_tokens_per_s"] == pytest.approx(1 / d["ttft_s"])


def test_logits_last_runs_lm_head_on_b_tokens():
    # lm_head on the last token only: 2·b·d·V = 2·2·4096·128256 FLOPs in prefill.
    d = json.loads(run("estimate", "llama-3-8b", "--batch", "2", "--prompt", "1024", "--logits", "last",
                       "--detail", "--json").stdout)
    head = next(r for r in d["ops"] if r["phase"] == "prefill" and r["name"] == "lm_head")
    assert head["flops"] == 2 * 2 * 4096 * 128256


def test_mla_auto_is_naive_in_prefill_absorbed_in_decode():
    d = json.loads(run("estimate", "deepseek-v2-lite", "--detail", "--json").stdout)
    names = {(r["phase"], r["name"].rsplit(".", 1)[-1]) for r in d["ops"]}
    assert ("prefill", "kv_b_proj") in names and ("prefill", "q_absorb") not in names
    assert ("decode", "q_absorb") in names and ("decode", "kv_b_proj") not in names


@pytest.mark.parametrize("text, field", [
    ("name: x\nd_model: 4096\nd_model: 8192\n", "d_model: given twice (line 3)"),
    ("name: x\nd_model: true\nn_layers: 2\nvocab_size: 10\nattention: {n_heads: 4}\nffn: {activation: relu, d_ff: 8}\n",
     "d_model: input should be a valid integer"),
    ("name: x\nd_model: 64\nn_layers: 100000000000000000000\nvocab_size: 10\nattention: {n_heads: 4}\n"
     "ffn: {activation: relu, d_ff: 8}\n", "n_layers: input should be less than or equal to 100000"),
    ("name: x\nd_model: 64\nn_layers: 2\nvocab_size: 10\nattention: {n_heads: \"4\"}\nffn: {activation: relu, d_ff: 8}\n",
     "attention.n_heads: input should be a valid integer"),
])
def test_yaml_strictness(tmp_path, text, field):
    p = tmp_path / "m.yaml"
    p.write_text(text)
    r = run("estimate", p)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {p}: {field}"), r.stderr


def test_non_utf8_and_json_without_model_type(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_bytes(b"\xff\xfe\x00garbage\x80")
    assert run("estimate", p).stderr.startswith(f"error: {p}: not a UTF-8 text file")
    j = tmp_path / "config.json"
    j.write_text(json.dumps({"hidden_size": 64}))
    assert run("estimate", j).stderr.startswith(f"error: {j}: model_type: missing")


def test_gpu_yaml_rejects_infinite_bandwidth(tmp_path):
    data = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())
    p = tmp_path / "gpu.yaml"
    p.write_text(yaml.safe_dump({**data, "bandwidth_tb_s": float("inf")}))
    r = run("estimate", "llama-3-8b", "--gpu", p)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {p}: bandwidth_tb_s: "), r.stderr


def test_huge_generation_is_refused():
    r = run("estimate", "llama-3-8b", "--gen", str(10**9))
    assert r.exit_code == 2 and r.stderr.startswith("error: --gen: must be a whole number from 1 to 16,777,216")


@pytest.mark.parametrize("args, module", [(["profile", "gpt2"], "torch"), (["calibrate"], "torch"),
                                          (["validate", "gpt2"], "torch"), (["report", "gpt2"], "plotly")])
def test_missing_optional_dependency_says_what_to_install(monkeypatch, args, module):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    r = run(*args)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {module}: not installed;") and "pip install 'lmcost[" in r.stderr


def test_version_is_the_package_version():
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    r = run("--version")
    assert r.exit_code == 0 and r.stdout.strip() == f"lmcost {version}"


@pytest.mark.parametrize("args", _command_paths(), ids=lambda p: " ".join(p) or "lmcost")
def test_short_help_is_help(args):
    assert run(*args, "-h").stdout == run(*args, "--help").stdout


@pytest.mark.parametrize("args", [["kv", "llama-3-8b", "--plot", "/proc/x.html"], ["roofline", "llama-3-8b", "-o", "/proc/x.html"],
                                  ["report", "llama-3-8b", "-o", "/proc/x"]])
def test_a_filesystem_that_refuses_writes_is_one_line(args):
    # /proc refuses new files: the temporary file of an atomic write cannot be made there.
    r = run(*args)
    assert r.exit_code == 2 and r.stderr.startswith(("error: /proc/x", "error: -o: cannot write in /proc ")), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_json_is_standard_json():
    # A flash kernel's softmax moves no bytes: its intensity is infinite, which JSON cannot say (null).
    def refuse(constant):
        raise ValueError(constant)

    for args in (["estimate", "llama-3-8b", "--detail", "--json"], ["roofline", "llama-3-8b", "--json"]):
        data = json.loads(run(*args).stdout, parse_constant=refuse)
        assert data


def test_roofline_takes_one_context():
    r = run("roofline", "llama-3-8b", "--context", "4k,8k")
    assert r.exit_code == 2 and "--context" in r.stderr


def test_api_misuse_is_named():
    from lmcost import grid
    with pytest.raises(TypeError, match="cfg must be of type ArchConfig"):
        estimate("llama-3-8b", load_gpu("h100"), Workload())
    with pytest.raises(TypeError, match="precision"):
        grid(load_config("gpt2"), load_gpu("h100"), None, "decode", [1], [2])
    with pytest.raises(LmcostError, match="bidirectional"):
        grid(load_config("bert-large-layer"), load_gpu("h100"), Precision(), "decode", [1], [16])


def test_units_engineers_use():
    from lmcost.output import render
    # KV per token of Llama-3-8B: 2 (K, V) x 8 heads x 128 x 2 bytes x 32 layers = 131,072 B = 128 KiB.
    assert render.binary(131_072, 4) == "128 KiB"
    assert render.binary(2.25 * 2**30) == "2.25 GiB"
    # Times stop at nanoseconds; throughput never rounds to 0.
    assert render.si(6.11e-10, "s") == "0.611 ns" and render.si(5.19e-3, "s") == "5.19 ms"
    assert render.rate(0.0123) == "0.0123" and render.rate(1270.4) == "1,270"
    r = run("estimate", "llama-3-8b", "--gpu", "h100")
    assert "128 KiB" in r.stdout


def test_token_counts_take_k_and_m_suffixes():
    # 128k = 128 * 1024 = 131,072 tokens, as context lengths are quoted (the same rule as --context).
    d = json.loads(run("estimate", "llama-3-8b", "--gpu", "h200", "--prompt", "128k", "--gen", "1k", "--json").stdout)
    assert d["workload"]["prompt"] == 131_072 and d["workload"]["gen"] == 1024
    op = json.loads(run("op", "gemm", "--m", "8k", "--n", "4096", "--k", "4096", "--json").stdout)
    assert op["flops"] == 2 * 8192 * 4096 * 4096
    r = run("estimate", "llama-3-8b", "--prompt", "1M", "--gen", "1", "--gpu", "h200", "--json")
    assert json.loads(r.stdout)["workload"]["prompt"] == 2**20


@pytest.mark.parametrize("args, made", [(["roofline", "llama-3-8b", "-o", "{d}/a/b/r.html"], "a/b/r.html"),
                                        (["kv", "llama-3-8b", "--plot", "{d}/a/b/kv.html"], "a/b/kv.html"),
                                        (["report", "gpt2", "-o", "{d}/a/b/rep"], "a/b/rep/index.html")])
def test_missing_output_folders_are_made_by_every_command(args, made, tmp_path):
    r = run(*[a.format(d=tmp_path) for a in args])
    assert r.exit_code == 0 and (tmp_path / made).is_file(), r.output[-300:]


@pytest.mark.parametrize("args", [["estimate", "llama-3-8b", "--json"], ["breakdown", "llama-3-8b", "--json"],
                                  ["kv", "llama-3-8b", "--json"], ["roofline", "llama-3-8b", "--json"]])
def test_one_default_dtype_rule(args):
    # --dtype auto everywhere: bf16 where the GPU has it (H100), fp16 on a V100 (no bf16), said on stderr.
    h100 = run(*args, "--gpu", "h100")
    v100 = run(*args, "--gpu", "v100")
    assert h100.exit_code == v100.exit_code == 0
    assert "note:" not in h100.stderr and "v100 has no bf16 peak: using fp16" in v100.stderr
    if args[0] == "estimate":
        assert json.loads(h100.stdout)["precision"]["activations"] == "bf16"
        assert json.loads(v100.stdout)["precision"]["activations"] == "fp16"


def test_layers_past_the_model_are_said():
    r = run("breakdown", "llama-3-8b", "--layers", "999", "--json")
    assert r.exit_code == 0 and "--layers 999 exceeds llama-3-8b's 32 layers" in r.stderr


def test_detail_rows_say_per_layer_and_total():
    # Llama-3-8B prefill q_proj at b=1, s=512: 2 * 512 * 4096 * 4096 = 17,179,869,184 FLOPs per layer,
    # x 32 layers = 549,755,813,888 in `flops` (the total), as the table's "FLOPs per layer" column says.
    ops = json.loads(run("estimate", "llama-3-8b", "--detail", "--json").stdout)["ops"]
    q = next(r for r in ops if r["phase"] == "prefill" and r["name"] == "layers.attn.q_proj")
    assert q["flops_per_layer"] == 17_179_869_184 and q["count"] == 32 and q["flops"] == 32 * 17_179_869_184
    assert "FLOPs per layer" in run("estimate", "llama-3-8b", "--detail").stdout


def test_progress_on_a_pipe_once_a_run_takes_its_time(tmp_path, monkeypatch):
    # Off a terminal (CliRunner's stderr), a run says what it is doing as plain lines once it has taken
    # PROGRESS_AFTER_S (2 s; 0 here, so this quick run counts as slow), on stderr only: --json's stdout
    # stays one JSON document. Under the threshold, piped stderr holds just the result line.
    import importlib

    cli_app = importlib.import_module("lmcost.cli.app")
    monkeypatch.setattr(cli_app, "PROGRESS_AFTER_S", 3600.0)
    r = run("report", "gpt2", "-o", tmp_path / "rep")
    assert r.exit_code == 0 and r.stderr.startswith("wrote ") and "writing the report" not in r.stderr
    monkeypatch.setattr(cli_app, "PROGRESS_AFTER_S", 0.0)
    r = run("report", "gpt2", "-o", tmp_path / "rep2")
    assert r.exit_code == 0 and r.stderr.startswith("lmcost: writing the report of gpt2 on h100 (0 s)\n")
    r = run("estimate", "llama-3-8b", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["model"] == "llama-3-8b"
    assert r.stderr == "lmcost: estimating llama-3-8b on h100 (0 s)\n"


def test_progress_over_steps_updates_the_run_s_line(monkeypatch, capsys):
    # validate's repeats update the ticker of the run they are part of: each line names the repeat.
    import importlib

    cli_app = importlib.import_module("lmcost.cli.app")
    monkeypatch.setattr(cli_app, "PROGRESS_AFTER_S", 0.0)
    monkeypatch.setattr(cli_app, "PROGRESS_EVERY_S", 0.01)
    with cli_app.status_line("validating"):
        for _ in cli_app.progress_over(range(3), "profiling b=1"):
            time.sleep(0.05)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "lmcost: validating (0 s)" and "lmcost: profiling b=1 3/3 (0 s)" in lines
    assert all(line.startswith("lmcost: ") and line.endswith(" s)") for line in lines)


def test_binary_sizes_never_print_an_exponent():
    # %.3g writes 1010 MiB as 1.01e+03 MiB (seen on Llama-3-8B's KV at batch 1, context 8100)
    from lmcost.output.render import binary

    assert binary(1010 * 2**20) == "1010 MiB" and binary(2.25 * 2**30) == "2.25 GiB" and binary(131072, 4) == "128 KiB"


def test_malformed_json_is_named_as_such(tmp_path, capsys, monkeypatch):
    # json's JSONDecodeError is a ValueError: a truncated file was reported as a number lmcost cannot read
    import sys

    from lmcost.cli import main

    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096')
    monkeypatch.setattr(sys, "argv", ["lmcost", "estimate", str(path)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and capsys.readouterr().err == f"error: {path}: not valid JSON at line 1; fix the syntax\n"


@pytest.mark.parametrize("args, line", [
    # options that meant nothing (issue 24), each refused in one line
    (["estimate", "llama-3-8b", "--mla", "absorbed"], "error: --mla: llama-3-8b has GQA attention, not MLA"),
    (["explain", "llama-3-8b", "--mla", "naive"], "error: --mla: llama-3-8b has GQA attention, not MLA"),
    (["estimate", "llama-3-8b", "--cluster", "dgx-h100"], "error: --cluster: one GPU runs no collectives"),
    (["estimate", "llama-3-8b", "--nodes", "2"], "error: --nodes: one GPU runs no collectives"),
    (["estimate", "llama-3-8b", "--fuse", "moe_grouped"], "error: --fuse: moe_grouped changes no operator of llama-3-8b"),
    (["estimate", "gpt2", "--fuse", "silu_mul,qkv", "--prompt", "8", "--gen", "2"], "error: --fuse: silu_mul changes no"),
    (["estimate", "llama-3-8b", "--gpu", "h100", "--gpu", "a100"], "error: --gpu: given 2 times"),
    (["op", "attention", "--phase", "decode", "--heads", "8", "--kv-heads", "8", "--head-dim", "64", "--kv-len", "8",
      "--causal", "--no-causal"], "error: --causal/--no-causal: given 2 times"),
    # a field is a flag only on a command that has it: gpus show takes the GPU as its argument
    (["gpus", "show", "h900"], "error: gpu: unknown GPU 'h900'"),
    (["estimate", "llama-3-8b", "--gpu", "v100", "--batch", "0"], "error: --batch: must be a whole number"),
])
def test_meaningless_options_are_one_line(args, line, monkeypatch, capsys):
    # through the console script, as a user runs it; the V100's fp16 note is dropped with the error
    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and err.startswith(line) and len(err.strip().splitlines()) == 1, err


def test_a_preset_lists_only_the_fusions_in_effect():
    # gpt2 has a plain GELU FFN (no gate), learned positions (no RoPE) and no experts: of vllm's six fusions
    # only add_norm and qkv change one of its operators; the default (silu_mul) changes none.
    from lmcost.apps.setup import fusions_in_effect
    from lmcost.model.loading import load_config
    from lmcost.operators.fusion import FUSIONS

    assert fusions_in_effect(load_config("gpt2"), FUSIONS) == ("add_norm", "qkv")
    assert fusions_in_effect(load_config("gpt2"), ("silu_mul",)) == ()
    assert fusions_in_effect(load_config("mixtral-8x7b"), FUSIONS) == FUSIONS
    assert "rope_attention" not in fusions_in_effect(load_config("llama-3-8b"), FUSIONS, "naive")


@pytest.mark.parametrize("text, seconds", [("50us", 50e-6), ("50\u00b5s", 50e-6), ("50\u03bcs", 50e-6), ("2ms", 2e-3)])
def test_durations_take_the_micro_sign(text, seconds):
    from lmcost.cli.options import parse_duration

    assert parse_duration(text, "--tpot") == pytest.approx(seconds)


def test_a_bare_lmcost_prints_its_help_on_stderr_exit_2(monkeypatch, capsys):
    # click (>= 8.2): a group run without a command is a usage error; stdout stays data
    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost"])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and "Usage" in err and "estimate" in err


def test_every_flag_the_package_names_is_an_option():
    # A message or fix naming --tokens where no command has it: every `--flag` in a string of lmcost/ (and
    # every flag of the field map) is an option of some command.
    import ast

    import typer.main

    from lmcost.cli import app
    from lmcost.cli.flags import FLAG_NAMES

    options = {"--help"}

    def walk(cmd):
        options.update(o for p in cmd.params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts))
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    named = set(FLAG_NAMES)
    for path in (ROOT / "lmcost").rglob("*.py"):
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        named |= {f for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                  and id(n) not in docs for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", n.value)}
    assert "--gpu" in named and "--tpot" in named  # the scan sees them
    assert sorted(named - options) == []


def test_parameter_table_names_blocks_as_a_user_would():
    # Nemotron-H-56B: 54 Mamba-2 blocks, 54 MLP blocks, 10 attention blocks (tests/test_hybrid.py's counts);
    # the table names them, not the internal group names (layers.mamba2.none).
    out = run("estimate", "nemotron-h-56b").stdout
    for label in ("per block (Mamba-2 mixer)", "per block (MLP)", "per block (attention)"):
        assert label in out
    assert "layers." not in out
    from lmcost.model.config import ArchConfig
    from lmcost.operators.forward import group_label

    cfg = ArchConfig.model_validate(dict(name="t", d_model=64, n_layers=4, vocab_size=100, ffn=dict(d_ff=128, activation="swiglu"),
                                         attention=dict(n_heads=4, sliding_window=8, layer_pattern=["local", "global"])))
    assert [group_label(cfg, g) for g in ("layers.local", "layers.global")] == \
        ["attention (sliding window) + MLP", "attention (global) + MLP"]
