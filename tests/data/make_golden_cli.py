"""Writes tests/data/golden-cli.json.gz: what ``lmcost estimate/op/kv/plan/train --json`` printed for a fixed
set of command lines, at the commit before the package was re-laid in layers (issue 23).

Run once on the commit before a refactor (``python tests/data/make_golden_cli.py``); tests/test_golden.py
then holds every later commit to it. Each case is an argument list; its record is the exit code and
either the parsed JSON (exit 0) or the error line. Calibrated times on every shipped GPU are included.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("golden-cli.json.gz")
DATA = Path(__file__).parent
WORKLOADS = [(8, 2048, 256), (1, 512, 256), (3, 100, 2)]





#: The shipped names at the commit the file was written (a later rename must not shrink the set).
_SHIPPED = {
    "models": ["bert-large-layer", "deepseek-v2-lite", "deepseek-v3", "falcon-7b", "gpt-oss-20b", "gpt2",
               "llama-2-7b", "llama-3-8b", "llama-3.1-405b", "llama-3.1-70b", "llama", "mistral-7b",
               "mixtral-8x7b", "nemotron-h-56b", "qwen2.5-7b", "tiny-gqa", "tiny-mla", "tiny-moe"],
    "gpus": ["a10", "a100-40gb", "a100-80gb", "b200", "h100-pcie", "h100-sxm", "h200", "l4", "l40s", "mi300x",
             "rtx-4090", "v100"],
}
#: Configs added to tests/data/hf-configs after the file was written (issue 27's serving models; issue 29's
#: DBRX in hf-published): not cases.
_LATER_HF = {"gpt-oss-120b", "kimi-k2", "llama-3.1-8b", "qwen3-235b-a22b", "qwen3-32b", "dbrx-instruct"}


def cases() -> list[list[str]]:
    out = []
    for model in _SHIPPED["models"]:
        for gpu in _SHIPPED["gpus"]:
            for time_model in ("roofline", "calibrated"):
                for b, p, g in WORKLOADS:
                    out.append(["estimate", model, "--gpu", gpu, "--model", time_model, "--batch", str(b),
                                "--prompt", str(p), "--gen", str(g), "--json"])
        for time_model in ("roofline", "calibrated"):
            for fuse in ("default", "vllm", "none"):
                out.append(["estimate", model, "--gpu", "h100", "--model", time_model, "--batch", "8", "--prompt",
                            "2048", "--gen", "256", "--fuse", fuse, "--detail", "--json"])
    for hf in sorted((DATA / "hf-configs").glob("*.json")) + sorted((DATA / "hf-published").glob("*.json")):
        if hf.stem in _LATER_HF:
            continue
        rel = str(hf.relative_to(DATA.parent.parent))
        out.append(["estimate", rel, "--gpu", "h100", "--model", "calibrated", "--batch", "4", "--prompt", "1024",
                    "--gen", "128", "--json"])
    cal = ["--model", "calibrated"]
    for extra in (["--tp", "8"], ["--tp", "4", "--pp", "2"], ["--tp", "8", "--sp"], ["--cp", "4"], ["--tp", "2", "--dp", "4"],
                  ["--logits", "last"], ["--attention", "naive"], ["--kv-dtype", "fp8"], ["--dtype", "fp8"],
                  ["--weight-dtype", "int4"], ["--quant", "q4_k_m"], ["--quant", "awq-g128"], ["--quant", "fp8-block"],
                  ["--kernel", "fa2"], ["--runtime", "torch"], ["--fuse", "silu_mul,add_norm"],
                  ["--tp", "8", "--pp", "2", "--nodes", "2"], ["--cluster", "aws-p5", "--tp", "8"]):
        for model in ("llama-3.1-70b", "mixtral-8x7b"):
            out.append(["estimate", model, "--gpu", "h100", "--batch", "16", "--prompt", "4096", "--gen", "512",
                        *cal, *extra, "--json"])
    for extra in (["--tp", "8", "--ep", "8"], ["--ep", "8", "--dp", "8"], ["--mla", "absorbed"], ["--mla", "naive"],
                  ["--tp", "8", "--ep", "8", "--ep-imbalance", "1.5"], ["--quant", "mxfp4"]):
        for model in ("deepseek-v3", "gpt-oss-20b"):
            out.append(["estimate", model, "--gpu", "h200", "--batch", "32", "--prompt", "2048", "--gen", "256",
                        *cal, *extra, "--json"])
    # lmcost op
    for gpu in ("h100", "a100", "h200", "b200", "mi300x", "l4"):
        for m, n, k in ((4096, 14336, 4096), (1, 4096, 4096), (128, 128256, 4096), (8192, 8192, 8192)):
            out.append(["op", "gemm", "--m", str(m), "--n", str(n), "--k", str(k), "--gpu", gpu, "--json"])
        for phase, seq, kv, causal in (("prefill", "4096", None, True), ("decode", None, "32768", True),
                                       ("prefill", "1024", "8192", True), ("prefill", "2048", None, False)):
            out.append(["op", "attention", "--phase", phase, "--batch", "8", "--heads", "32", "--kv-heads", "8", "--head-dim", "128",
                        *(["--seq", seq] if seq else []), *(["--kv-len", kv] if kv else []), "--causal" if causal else "--no-causal",
                        "--gpu", gpu, "--json"])
        out.append(["op", "rmsnorm", "--tokens", "8192", "--hidden", "8192", "--gpu", gpu, "--json"])
        out.append(["op", "layernorm", "--tokens", "16", "--hidden", "4096", "--gpu", gpu, "--json"])
        for kind, extra in (("silu_mul", ["--width", "14336"]), ("add", ["--width", "4096"]),
                            ("rope", ["--heads", "32", "--kv-heads", "8", "--head-dim", "128"])):
            out.append(["op", "elementwise", "--kind", kind, "--tokens", "4096", *extra, "--gpu", gpu, "--json"])
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"):
        for size, gpus in (("64M", "8"), ("8K", "8"), ("1G", "16"), ("256M", "2")):
            for place in (["--gpu", "h100"], ["--cluster", "dgx-a100"], ["--cluster", "aws-p5en"]):
                out.append(["op", "collective", "--kind", kind, "--bytes", size, "--gpus", gpus, *place, "--json"])
    # lmcost kv
    for model in ("llama-3-8b", "llama-3.1-70b", "deepseek-v3", "gpt-oss-20b", "mistral-7b", "nemotron-h-56b"):
        out.append(["kv", model, "--gpu", "h100", "--json"])
        out.append(["kv", model, "--gpu", "a100", "--batch", "16", "--context", "8k,64k", "--window", "4096",
                    "--kv-dtype", "fp8", "--json"])
    # lmcost plan
    for model, gpu, extra in (("llama-3.1-70b", "h100", []), ("llama-3-8b", "a100", ["--gpus", "4"]),
                              ("mixtral-8x7b", "h200", ["--model", "calibrated", "--ttft", "500ms", "--tpot", "50ms"]),
                              ("deepseek-v3", "h200", ["--gpus", "16"]),
                              ("llama-3.1-70b", "h100", ["--train", "--global-batch", "256", "--seq", "8k"])):
        out.append(["plan", model, "--gpu", gpu, *extra, "--json"])
    # lmcost train
    for model, args in (("llama-3-8b", []), ("llama-3.1-70b", ["--gpus", "64", "--tp", "8", "--pp", "4", "--zero", "1",
                                                               "--recompute", "selective", "--global-batch", "512"]),
                        ("llama-3.1-70b", ["--gpus", "64", "--tp", "8", "--pp", "4", "--schedule", "interleaved",
                                           "--virtual-stages", "2", "--global-batch", "512", "--sp"]),
                        ("llama-3-8b", ["--zero", "3", "--recompute", "full", "--optimizer", "adam8bit"]),
                        ("llama-3-8b", ["--gpus", "16", "--cp", "2", "--seq", "32k", "--model", "roofline"]),
                        ("mixtral-8x7b", ["--gpus", "64", "--ep", "8", "--tp", "1", "--zero", "1", "--global-batch", "256"]),
                        ("llama-3-8b", ["--lora-rank", "16", "--gpus", "1", "--global-batch", "8"]),
                        ("llama-3-8b", ["--lora-rank", "16", "--qlora", "--gpus", "1", "--global-batch", "8"]),
                        ("llama-3-8b", ["--precision", "fp32", "--optimizer", "sgd", "--flops-convention", "causal"]),
                        ("llama-3.1-405b", ["--gpus", "1024", "--tp", "8", "--pp", "8", "--global-batch", "1024",
                                            "--gpu", "h100"])):
        out.append(["train", model, *args, "--json"])
    return out


def run(argv: list[str]) -> dict:
    """The exit code and the JSON printed (or the error line) of ``lmcost *argv`` run in this process."""
    from typer.testing import CliRunner

    from lmcost.cli import app

    res = CliRunner().invoke(app, argv)
    if res.exit_code == 0:
        return {"code": 0, "json": json.loads(res.stdout)}
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return {"code": res.exit_code, "error": (res.stderr or res.stdout).strip().splitlines()[-1:]}


def _write(out: list) -> bytes:
    return gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0)


def refresh(command: str, serving_only: bool = True) -> int:
    """Re-run the cases of one command and replace their records, every other record kept as written (its
    bytes unchanged): ``plan`` (with ``serving_only``, not its ``--train`` runs) or ``train`` (``lmcost
    train`` and ``plan --train``: every run that costs a training step). Returns the count."""
    old = json.loads(gzip.decompress(OUT.read_bytes()))
    assert _write(old) == OUT.read_bytes(), "the file is not as this script writes it"
    n = 0
    for case in old:
        argv = case["argv"]
        if command == "train":
            hit = argv[0] == "train" or (argv[0] == "plan" and "--train" in argv)
        else:
            hit = argv[0] == command and not (serving_only and "--train" in argv)
        if hit:
            case["result"] = run(argv)
            n += 1
    OUT.write_bytes(_write(old))
    return n


if __name__ == "__main__":
    # python tests/data/make_golden_cli.py [--only plan|train]: every case, or only plan's serving runs, or
    # only the training runs (train and plan --train), when those numbers change on purpose and nothing
    # else may.
    if sys.argv[1:2] == ["--only"] and sys.argv[2:] in (["plan"], ["train"]):
        print(f"refreshed {refresh(sys.argv[2])} {sys.argv[2]} cases in {OUT}", file=sys.stderr)
        sys.exit()
    if sys.argv[1:]:  # --help or anything else: say what runs, and regenerate nothing
        print("usage: python tests/data/make_golden_cli.py [--only plan|train]\n"
              "  no argument: rerun every case and rewrite " + OUT.name + " (about 3 minutes)", file=sys.stderr)
        sys.exit(0 if sys.argv[1] in ("-h", "--help") else 2)
    todo = cases()
    out = []
    for i, argv in enumerate(todo):
        out.append(dict(argv=argv, result=run(argv)))
        if i % 100 == 0:
            print(f"{i}/{len(todo)}", file=sys.stderr)
    OUT.write_bytes(_write(out))
    print(f"wrote {OUT} ({len(out)} cases)", file=sys.stderr)
