"""Bad input, generated across every command (issue 11): one line `error: <field>: <what>; <fix>` on
stderr, exit code 2, no traceback, and no file written.

Each case is a valid invocation with one option (or the positional argument) replaced by a value that
must be refused: counts that are zero, negative, not numbers, empty or absurd; unknown names; empty
strings; paths that are missing or that the system refuses to write. The cases are the product of
the commands' options and the bad values of each option's kind, not a hand-written list.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from conftest import DATA, ROOT
from lmcost.cli import main

#: Bad values by kind of option. Sizes: not counts, or past any machine (2^31 tokens is the limit).
BAD = {
    "count": ["0", "-1", "x", "", "1.5", "99999999999999999999", "1e99", "nan"],
    "counts": ["", ",", "0", "-4", "x", "1,,x", "8,0", "99999999999999999999"],
    "dtype": ["", "fp7", "int3", "bogus"],
    "gpu": ["", "h999", "/nonexistent/gpu.yaml"],
    "model": ["", "no-such-model", "/nonexistent/model.yaml", "/etc/hostname", "/tmp/no\nsuch.yaml"],
    "choice": ["", "maybe"],
    "fuse": ["", "bogus", "silu_mul,bogus", "silu_mul,,add_norm"],
    "variants": ["", "gqa:0", "gqa:x", "mla:-1", "bogus", "base,,mha"],
    "local_global": ["", "3", "x:1", "0:0", "-1:1"],
    "out_file": ["/proc/x.html", "/etc/hostname/x.html"],
    "out_dir": ["/proc/x", "/etc/hostname/x"],
    "report_dir": ["/proc/x", "/etc/hostname/x", ".", ""],  # the folder a report replaces whole: never the cwd
    "kind": ["", "bogus"],
    "negative": ["-1", "x", ""],
    "dtypes": ["", ",", "fp7", "int8", "fp32,,bf16"],
    # --engine (issue 25): unknown, a version after torch, an empty version, a version no GPU profile has
    "engine": ["", "bogus", "torch@2.9", "vllm@", "vllm@0.0.1", "@0.24.0"],
}

#: command -> (valid base invocation, {option: kind}); "ARG" is the positional argument.
COMMANDS = {
    "estimate": (["estimate", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "count", "--prompt": "count", "--gen": "count",
        "--dtype": "dtype", "--weight-dtype": "dtype", "--kv-dtype": "dtype", "--attention": "choice",
        "--mla": "choice", "--logits": "choice", "--model": "choice", "--fuse": "fuse", "--quant": "dtype",
        "--engine": "engine"}),
    "explain": (["explain", "llama-3-8b"], {
        "ARG": "model", "--phase": "choice", "--dtype": "dtype", "--weight-dtype": "dtype", "--kv-dtype": "dtype",
        "--attention": "choice", "--mla": "choice", "--logits": "choice"}),
    "kv": (["kv", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--variants": "variants", "--context": "counts", "--batch": "count",
        "--window": "count", "--local-global": "local_global", "--block-size": "count", "--dtype": "dtype",
        "--kv-dtype": "dtype", "--quant": "dtype", "--plot": "out_file"}),
    "serve": (["serve", "tiny-gqa", "--requests", "20", "--rate", "5"], {
        "ARG": "model", "--gpu": "gpu", "--requests": "count", "--concurrency": "count", "--max-num-seqs": "count",
        "--max-num-batched-tokens": "count", "--block-size": "count", "--dtype": "dtype", "--kv-dtype": "dtype",
        "--quant": "dtype", "--model": "choice", "--plot": "out_file"}),
    "roofline": (["roofline", "llama-3-8b", "-o", "OUT/r.html"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "counts", "--context": "counts", "--phase": "choice",
        "--dtype": "dtype", "-o": "out_file"}),
    "report": (["report", "llama-3-8b", "-o", "OUT/rep"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "count", "--prompt": "count", "--gen": "count",
        "--dtype": "dtype", "-o": "report_dir", "--engine": "engine"}),
    "breakdown": (["breakdown", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--phase": "choice", "--batch": "count", "--seq": "count",
        "--dtype": "dtype", "--repeats": "count", "--layers": "negative"}),
    "op gemm": (["op", "gemm", "--m", "64", "--n", "64", "--k", "64"], {
        "--m": "count", "--n": "count", "--k": "count", "--dtype": "dtype", "--gpu": "gpu", "--engine": "engine"}),
    "op attention": (["op", "attention", "--phase", "decode", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                      "--kv-len", "1024"], {
        "--phase": "choice", "--heads": "count", "--kv-heads": "count", "--head-dim": "count", "--batch": "count",
        "--kv-len": "count", "--dtype": "dtype", "--gpu": "gpu", "--engine": "engine"}),
    "op rmsnorm": (["op", "rmsnorm", "--tokens", "64", "--hidden", "64"], {
        "--tokens": "count", "--hidden": "count", "--dtype": "dtype", "--gpu": "gpu", "--engine": "engine"}),
    "op layernorm": (["op", "layernorm", "--tokens", "64", "--hidden", "64"], {
        "--tokens": "count", "--hidden": "count", "--dtype": "dtype", "--gpu": "gpu", "--engine": "engine"}),
    "op elementwise": (["op", "elementwise", "--kind", "silu_mul", "--tokens", "64", "--width", "64"], {
        "--kind": "kind", "--tokens": "count", "--width": "count", "--dtype": "dtype", "--gpu": "gpu",
        "--engine": "engine"}),
    "profile": (["profile", "tiny-gqa", "--trace", "OUT/t.json", "--csv-out", "OUT/o.csv", "--prompt", "16", "--gen", "2"], {
        "ARG": "model", "--device": "choice", "--dtype": "choice", "--layers": "negative", "--batch": "count",
        "--prompt": "count", "--gen": "count", "--repeats": "count", "--attention": "choice", "--trace": "out_file",
        "--csv-out": "out_file"}),
    "validate": (["validate", "tiny-gqa", "--gpu", "h100", "--report-dir", "OUT/rep", "--prompt", "16", "--gen", "2"], {
        "ARG": "model", "--device": "choice", "--dtype": "choice", "--batch": "counts", "--prompt": "count",
        "--gen": "count", "--repeats": "count", "--gpu": "gpu", "--fuse": "fuse", "--report-dir": "out_dir"}),
    "calibrate": (["calibrate", "-o", "OUT/cal.yaml"], {
        "--device": "choice", "--dtypes": "dtypes", "-o": "out_file"}),
    "gpus show": (["gpus", "show", "h100"], {"ARG": "gpu"}),
    "models show": (["models", "show", "llama-3-8b"], {"ARG": "model"}),
}

#: Positional arguments sit right after the command words.
WORDS = {name: len(name.split()) for name in COMMANDS}
#: The commands that run the reference decoder: they import torch once their input parses (tests/conftest.py).
TORCH = {"profile", "validate", "calibrate"}


def cases():
    for name, (base, options) in COMMANDS.items():
        for option, kind in options.items():
            for value in BAD[kind]:
                args = list(base)
                if option == "ARG":
                    args[WORDS[name]] = value
                elif option in args:
                    args[args.index(option) + 1] = value
                else:
                    args += [option, value]
                yield pytest.param(args, id=f"{name} {option}={value!r}", marks=[pytest.mark.torch] * (name in TORCH))


CASES = list(cases())


def test_the_sweep_is_big_enough():
    assert len(CASES) >= 150


@pytest.mark.parametrize("args", CASES)
def test_bad_input_is_one_line_and_exit_2(args, tmp_path, monkeypatch, capsys):
    # Through the console script's entry point, as a user runs it (usage errors are rendered there).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "OUT").mkdir()
    monkeypatch.setattr(sys, "argv", ["lmcost", *[a.replace("OUT/", str(tmp_path / "OUT") + "/") for a in args]])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2, (e.value.code, out[-300:], err[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert "; " in lines[0], lines[0]  # <field>: <what>; <fix>
    written = [p for p in tmp_path.rglob("*") if p.name != "OUT"]
    assert written == [], written
    assert not any(n.startswith(".") for n in os.listdir(tmp_path))


# Bad files: a real config or GPU YAML with one field given the wrong type or an absurd value, and
# files built to exhaust a reader (deep nesting, aliases of aliases, an alias containing itself).
HF_KEYS = {  # llama-3-8b's config.json keys the mapping reads, each given values of the wrong kind
    key: [["x"], "x", True, {"a": 1}, 1.5, -1] for key in
    ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
     "vocab_size", "head_dim")}
HF_KEYS["hidden_act"] = [["silu"], 1, {"a": "silu"}, "bogus"]
HF_KEYS["tie_word_embeddings"] = ["yes", 1, [True]]
QWEN2_KEYS = {"sliding_window": ["x", [1], -5], "max_window_layers": ["x", [1], 2.5],
              "use_sliding_window": ["yes", 2]}
GEMMA3_KEYS = {"sliding_window_pattern": ["6", 0, [6]], "layer_types": ["sliding_attention", [1], ["bogus"]]}
GPU_KEYS = {"bandwidth_tb_s": [1e-320, 0, -1, "fast", 1e9], "memory_gb": [0, -80, 1e12, [80]],
            # (A peak table without fp32 is a GPU whose sources give none, B300's: accepted, its vector
            # kernels bounded by bytes (test_new_gpus); a negative fp4 peak is still a typo.)
            "peak_tflops": [{"fp32": 67, "fp4": -1}, {"fp32": -1}, {"fp32": 1e-300}, {"fp32": 67, "fp7": 1}, "many"]}


def _file_cases():
    import json

    hf = json.loads((DATA / "hf-configs" / "llama-3-8b.json").read_text())
    for family, keys, extra in (("llama", HF_KEYS, {}),
                                ("qwen2", QWEN2_KEYS, {"use_sliding_window": True, "sliding_window": 4096}),
                                ("gemma3_text", GEMMA3_KEYS, {"sliding_window": 512})):
        for key, values in keys.items():
            for v in values:
                yield pytest.param("model", {**hf, **extra, "model_type": family, key: v}, id=f"{family}.{key}={v!r}")
    gpu = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())
    for key, values in GPU_KEYS.items():
        for v in values:
            yield pytest.param("gpu", {**gpu, key: v}, id=f"gpu.{key}={v!r}")


DEEP = "a: " + "[" * 5000 + "]" * 5000 + "\n"
LAUGHS = "\n".join([f"l0: &l0 [{', '.join(['x'] * 10)}]"] +
                   [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 9)]) + "\n"
LOOP = "name: loop\nx: &a [1, *a]\n"


@pytest.mark.parametrize("kind, data", list(_file_cases()))
def test_bad_file_is_one_line_and_exit_2(kind, data, tmp_path, monkeypatch, capsys):
    path = tmp_path / ("bad.json" if kind == "model" else "bad.yaml")
    path.write_text(json.dumps(data) if kind == "model" else yaml.safe_dump(data))
    args = ["estimate", str(path)] if kind == "model" else ["estimate", "gpt2", "--gpu", str(path)]
    _one_line_exit_2(args, monkeypatch, capsys)


@pytest.mark.parametrize("text", [DEEP, LAUGHS, LOOP], ids=["deep", "billion-laughs", "alias-loop"])
@pytest.mark.parametrize("command", ["estimate", "models show", "gpus show"])
def test_files_built_to_exhaust_a_reader_are_refused(text, command, tmp_path, monkeypatch, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    _one_line_exit_2([*command.split(), str(path)], monkeypatch, capsys)


def _one_line_exit_2(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lmcost", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "; " in lines[0], (e.value.code, err[-400:])


def test_the_file_sweep_is_big_enough():
    # 77 generated file cases (7 numeric HF keys x 6 values, 8 other HF keys, 14 GPU figures), and the 9
    # reader-exhausting ones: a guard against a generator that silently yields nothing.
    assert len(list(_file_cases())) >= 77


TRACE_EVENT = {"name": "aten::mm", "ph": "X", "ts": 0, "dur": 5, "tid": 1, "pid": 1}
BAD_TRACES = {
    "not-json": "{",
    "a-number": "5",
    "events-not-a-list": '{"traceEvents": 5}',
    "no-timed-events": json.dumps({"traceEvents": [{"name": "x", "ph": "B"}]}),
    "nan-duration": json.dumps({"traceEvents": [{**TRACE_EVENT, "dur": float("nan")}]}),
    "infinite-duration": json.dumps({"traceEvents": [{**TRACE_EVENT, "dur": float("inf")}]}),
    "negative-duration": json.dumps({"traceEvents": [{**TRACE_EVENT, "dur": -1}]}),
    "string-duration": json.dumps({"traceEvents": [{**TRACE_EVENT, "dur": "5"}]}),
    "metadata-empty": json.dumps({"traceEvents": [TRACE_EVENT], "lmcost": {}}),
    "metadata-a-string": json.dumps({"traceEvents": [TRACE_EVENT], "lmcost": "bogus"}),
    "metadata-steps-0": json.dumps({"traceEvents": [TRACE_EVENT], "lmcost": {"steps": 0}}),
    "deeply-nested": '{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}",
    "a-5000-digit-duration": '{"traceEvents": [{"name": "x", "ph": "X", "ts": 0, "dur": ' + "9" * 5000 + "}]}",
    "metadata-batch-a-string": json.dumps({"traceEvents": [TRACE_EVENT], "lmcost": {"batch": "1"}}),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(BAD_TRACES))
def test_malformed_traces_are_one_line(name, tmp_path, monkeypatch, capsys):
    path = tmp_path / "trace.json"
    path.write_text(BAD_TRACES[name])
    _one_line_exit_2(["validate", "gpt2", "--gpu", "h100", "--trace", str(path), "--report-dir", str(tmp_path / "r")],
                     monkeypatch, capsys)
    assert not (tmp_path / "r").exists()  # the report folder is made only when there is a report


# The generated sweep over every option of every command (issue 24): the options are read from the click
# commands typer builds of lmcost.cli.app, so a new option is swept the day it lands; only each command's
# valid base invocation is kept by hand (and a command without one fails test_every_command_has_a_base).
# Each option gets a sample of the values below (rotating, so that across a command's options every kind is
# tried) and is given twice. The outcome must be exit 0 (accepted) or exit 2 with exactly one stderr line
# `error: <field>: <what>; <fix>` -- never a traceback -- and a repeated single-valued option is refused.
WEIRD = ["", "-1", "0", "nan", "inf", "1e30", "x" * 300, "\u00fc\u00f1\u00ee\u00a9\u00f8d\u00e9 \u03bcs", "3 parsecs"]

#: command -> its cheapest valid invocation (OUT/ is a scratch folder; TINY a 12-row kernel table).
BASES = {
    "estimate": ["estimate", "tiny-gqa", "--prompt", "16", "--gen", "2"],
    "explain": ["explain", "tiny-gqa"],
    "kv": ["kv", "tiny-gqa", "--context", "1k"],
    "plan": ["plan", "tiny-gqa", "--gpus", "2", "--max-batch", "4"],
    "serve": ["serve", "tiny-gqa", "--requests", "20", "--prompt", "64", "--output", "8"],
    "serve-plan": ["serve-plan", "tiny-gqa", "--gpus", "1", "--requests", "20", "--prompt", "64", "--output", "8",
                   "--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--iterations", "2", "--jobs", "1"],
    "roofline": ["roofline", "tiny-gqa", "--batch", "1"],
    "report": ["report", "tiny-gqa", "-o", "OUT/rep"],
    "train": ["train", "tiny-gqa", "--gpus", "1", "--global-batch", "2", "--seq", "128"],
    "breakdown": ["breakdown", "tiny-gqa", "--seq", "64"],
    "fit": ["fit", "--table", "TINY", "--gpu", "h100"],
    "calibrate": ["calibrate", "--quick", "-o", "OUT/cal.yaml"],
    "profile": ["profile", "tiny-gqa", "--trace", "OUT/t.json", "--csv-out", "OUT/o.csv", "--prompt", "8", "--gen", "1",
                "--repeats", "1", "--layers", "1"],
    "validate": ["validate", "tiny-gqa", "--gpu", "h100", "--report-dir", "OUT/rep", "--prompt", "8", "--gen", "1",
                 "--repeats", "1", "--layers", "1"],
    "op gemm": ["op", "gemm", "--m", "64", "--n", "64", "--k", "64"],
    "op attention": ["op", "attention", "--phase", "decode", "--heads", "8", "--kv-heads", "8", "--head-dim", "64",
                     "--kv-len", "64"],
    "op rmsnorm": ["op", "rmsnorm", "--tokens", "64", "--hidden", "64"],
    "op layernorm": ["op", "layernorm", "--tokens", "64", "--hidden", "64"],
    "op elementwise": ["op", "elementwise", "--kind", "silu_mul", "--tokens", "64", "--width", "64"],
    "op collective": ["op", "collective", "--kind", "all_reduce", "--bytes", "1M", "--gpus", "8"],
    "gpus list": ["gpus", "list"], "gpus show": ["gpus", "show", "h100"],
    "models list": ["models", "list"], "models show": ["models", "show", "tiny-gqa"],
    "clusters list": ["clusters", "list"], "clusters show": ["clusters", "show", "dgx-h100"],
}
#: Commands that import torch once their input parses, and those whose every accepted run takes seconds
#: (a fit, a report, sympy's formulas, kv's figure-free sweep): one sample value per option for the latter.
SWEEP_TORCH = {"calibrate", "profile", "validate", "fit --trace", "breakdown --device"}
SWEEP_SLOW = {"fit", "report", "explain", "kv"}
#: Options naming a file or folder: an accepted odd name writes a whole report, so one value (the name over
#: the filesystem's limit) is tried.
PATHS = {"-o", "--output", "--plot", "--out", "--report-dir", "--trace", "--csv-out", "--table"}
def _leaf_commands() -> dict:
    import typer.main

    from lmcost.cli import app

    out = {}

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
        elif path:
            out[" ".join(path)] = cmd

    walk(typer.main.get_command(app), [])
    return out


LEAVES = _leaf_commands()
OPTIONS = {o for cmd in LEAVES.values() for p in cmd.params if p.param_type_name == "option"
           for o in (*p.opts, *p.secondary_opts)}


def _sweep():
    k = 0
    for name, cmd in sorted(LEAVES.items()):
        base = BASES.get(name)
        if base is None:
            continue
        words = len(name.split())
        n = 1 if name in SWEEP_SLOW | SWEEP_TORCH else 2
        for p in cmd.params:
            opt = p.opts[0] if p.param_type_name == "option" else "ARG"
            marks = [pytest.mark.torch] * (name in SWEEP_TORCH or f"{name} {opt}" in SWEEP_TORCH)
            if p.param_type_name == "argument":
                for v in WEIRD[k % len(WEIRD)::4][:n]:
                    args = list(base)
                    args[words] = v
                    yield pytest.param(name, args, False, id=f"{name} ARG={v[:12]!r}",
                                       marks=marks)
                k += 1
                continue
            if p.hidden or p.is_eager:
                continue
            if p.is_flag:
                twice = [*base, opt] if opt in base else [*base, opt, opt]
                yield pytest.param(name, twice, True, id=f"{name} {opt} twice", marks=marks)
                continue
            for v in (["x" * 300] if opt in PATHS else [WEIRD[(k + 4 * j) % len(WEIRD)] for j in range(n)]):
                args = list(base)
                if opt in args:
                    args[args.index(opt) + 1] = v
                else:
                    args += [opt, v]
                yield pytest.param(name, args, False, id=f"{name} {opt}={v[:12]!r}",
                                   marks=marks)
            k += 1
            if not p.multiple:
                twice = [*base, opt, "1"] if opt in base else [*base, opt, "1", opt, "1"]
                yield pytest.param(name, twice, True, id=f"{name} {opt} twice", marks=marks)


SWEEP = list(_sweep())


def test_every_command_has_a_base():
    # A command the walk finds and the sweep has no invocation of would go unswept.
    assert sorted(set(LEAVES) - set(BASES)) == [] and len(LEAVES) >= 24
    assert len(SWEEP) >= 250


@pytest.mark.parametrize("name, args, repeated", SWEEP)
def test_every_option_with_weird_values(name, args, repeated, tmp_path, monkeypatch, capsys):
    import csv
    import re

    monkeypatch.chdir(tmp_path)
    (tmp_path / "OUT").mkdir()
    if "TINY" in args:  # a dozen H100 GEMM rows of the shipped table: a fit of seconds
        rows = list(csv.DictReader((ROOT / "lmcost/data/measurements/public-kernels.csv").open()))
        with open(tmp_path / "tiny.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows([r for r in rows if "H100" in r["device"] and r["op"] == "gemm"][:12])
    argv = [str(tmp_path / "tiny.csv") if a == "TINY" else a.replace("OUT/", str(tmp_path / "OUT") + "/") for a in args]
    monkeypatch.setattr(sys, "argv", ["lmcost", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err[-800:]
    if repeated:  # a single-valued option twice: click would keep the last, silently
        assert e.value.code == 2 and "given 2 times" in err and len(err.strip().splitlines()) == 1, err[-400:]
    if e.value.code in (0, None):
        return
    lines = err.strip().splitlines()
    assert e.value.code == 2, (e.value.code, err[-400:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and "; " in lines[0], err[-400:]
    # the field it names, if a flag, is one of this command's; every flag its text names is a real option
    field = lines[0][len("error: "):].split(": ", 1)[0]
    mine = {o for p in LEAVES[name].params if p.param_type_name == "option" for o in (*p.opts, *p.secondary_opts)}
    assert [f for f in re.findall(r"(?<![\w-])--?[a-z][\w-]*", field) if f not in mine] == [], lines[0]
    assert [f for f in re.findall(r"(?<![\w-])--[a-z][\w-]*", lines[0]) if f not in OPTIONS | {"--help"}] == [], lines[0]


@pytest.mark.parametrize("flag, said", [
    ("--engines", "nocols.csv lacks the column(s) device, dtype, op, implementation, time_us, source; give the columns "
                  "of engine-kernels.csv (device, dtype, op, implementation, time_us, source and the shape columns)"),
    (None, "nocols.csv lacks the column(s) device, dtype, op, implementation, time_us, source; give the columns "
           "of public-kernels.csv (device, dtype, op, implementation, time_us, source and the shape columns)"),
    ("--collectives", "nocols.csv lacks the column(s) algbw_gb_s, busbw_gb_s, collective, device, interconnect, "
                      "message_bytes, n_gpus, n_nodes, source, time_us; give the columns of "
                      "lmcost/data/measurements/collective-measurements.csv"),
    ("--training", "nocols.csv lacks the column(s) arch_notes, cp, dp, ep, framework, global_batch, kind, metric, "
                   "micro_batch, model, n_gpus, notes, pp, precision, recompute, seq_len, source, tp, unit, value, vp, "
                   "zero_or_fsdp; give a table in the format of lmcost/data/measurements/training-runs.csv")])
def test_a_table_missing_columns_names_the_field_and_its_own_shipped_table(flag, said, tmp_path, monkeypatch, capsys):
    # issue 25: fit --engines --table named the file path as the field and asked for public-kernels.csv's columns.
    # Each table names the field `table` (--table on the command line), the columns it lacks (the header below has
    # gpu and foo only) and the shipped table whose columns to give.
    path = tmp_path / "nocols.csv"
    path.write_text("gpu,foo\nh200,1\n")
    monkeypatch.setattr(sys, "argv", ["lmcost", "fit", *([flag] if flag else []), "--table", str(path)])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and capsys.readouterr().err.strip() == f"error: --table: {said}"
