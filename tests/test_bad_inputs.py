"""Bad input, generated across every command (issue 11): one line `error: <field>: <what>; <fix>` on
stderr, exit code 2, no traceback, and no file written.

Each case is a valid invocation with one option (or the positional argument) replaced by a value that
must be refused: counts that are zero, negative, not numbers, empty or absurd; unknown names; empty
strings; paths that are missing or that the system refuses to write. The cases are the product of
the commands' options and the bad values of each option's kind, not a hand-written list.
"""

from __future__ import annotations

import os
import sys

import pytest

from lmcost.cli import main

#: Bad values by kind of option. Sizes: not counts, or past any machine (2^31 tokens is the limit).
BAD = {
    "count": ["0", "-1", "x", "", "1.5", "99999999999999999999", "1e99", "nan"],
    "counts": ["", ",", "0", "-4", "x", "1,,x", "8,0", "99999999999999999999"],
    "dtype": ["", "fp7", "int3", "bogus"],
    "gpu": ["", "h999", "/nonexistent/gpu.yaml"],
    "model": ["", "no-such-model", "/nonexistent/model.yaml", "/etc/hostname"],
    "choice": ["", "maybe"],
    "fuse": ["", "bogus", "silu_mul,bogus"],
    "variants": ["", "gqa:0", "gqa:x", "mla:-1", "bogus"],
    "local_global": ["", "3", "x:1", "0:0", "-1:1"],
    "out_file": ["/proc/x.html", "/etc/hostname/x.html"],
    "out_dir": ["/proc/x", "/etc/hostname/x"],
    "kind": ["", "bogus"],
    "negative": ["-1", "x", ""],
    "dtypes": ["", ",", "fp7", "int8"],
}

#: command -> (valid base invocation, {option: kind}); "ARG" is the positional argument.
COMMANDS = {
    "estimate": (["estimate", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "count", "--prompt": "count", "--gen": "count",
        "--dtype": "dtype", "--weight-dtype": "dtype", "--kv-dtype": "dtype", "--attention": "choice",
        "--mla": "choice", "--logits": "choice", "--model": "choice", "--fuse": "fuse"}),
    "explain": (["explain", "llama-3-8b"], {
        "ARG": "model", "--phase": "choice", "--dtype": "dtype", "--weight-dtype": "dtype", "--kv-dtype": "dtype",
        "--attention": "choice", "--mla": "choice", "--logits": "choice"}),
    "kv": (["kv", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--variants": "variants", "--context": "counts", "--batch": "count",
        "--window": "count", "--local-global": "local_global", "--block-size": "count", "--dtype": "dtype",
        "--kv-dtype": "dtype", "--plot": "out_file"}),
    "roofline": (["roofline", "llama-3-8b", "-o", "OUT/r.html"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "counts", "--context": "counts", "--phase": "choice",
        "--dtype": "dtype", "-o": "out_file"}),
    "report": (["report", "llama-3-8b", "-o", "OUT/rep"], {
        "ARG": "model", "--gpu": "gpu", "--batch": "count", "--prompt": "count", "--gen": "count",
        "--dtype": "dtype", "-o": "out_dir"}),
    "breakdown": (["breakdown", "llama-3-8b"], {
        "ARG": "model", "--gpu": "gpu", "--phase": "choice", "--batch": "count", "--seq": "count",
        "--dtype": "dtype"}),
    "op gemm": (["op", "gemm", "--m", "64", "--n", "64", "--k", "64"], {
        "--m": "count", "--n": "count", "--k": "count", "--dtype": "dtype", "--gpu": "gpu"}),
    "op attention": (["op", "attention", "--phase", "decode", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                      "--kv-len", "1024"], {
        "--phase": "choice", "--heads": "count", "--kv-heads": "count", "--head-dim": "count", "--batch": "count",
        "--kv-len": "count", "--dtype": "dtype", "--gpu": "gpu"}),
    "op rmsnorm": (["op", "rmsnorm", "--tokens", "64", "--hidden", "64"], {
        "--tokens": "count", "--hidden": "count", "--dtype": "dtype", "--gpu": "gpu"}),
    "op layernorm": (["op", "layernorm", "--tokens", "64", "--hidden", "64"], {
        "--tokens": "count", "--hidden": "count", "--dtype": "dtype", "--gpu": "gpu"}),
    "op elementwise": (["op", "elementwise", "--kind", "silu_mul", "--tokens", "64", "--width", "64"], {
        "--kind": "kind", "--tokens": "count", "--width": "count", "--dtype": "dtype", "--gpu": "gpu"}),
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
                yield pytest.param(args, id=f"{name} {option}={value!r}")


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
