#!/usr/bin/env python3
"""Compare `lmcost estimate`'s decode step with the CUDA-graph decode steps benchmarks/gpu_graph_decode.py timed.

    .venv/bin/python benchmarks/eval_graph_decode.py RUN_DIR [--gpu h200] [--csv OUT.csv]

RUN_DIR holds steps.csv and kernels.csv of one run. For each variant, batch and context, runs
`lmcost estimate llama-3-8b --gpu GPU --batch b --prompt (t - 1) --gen 2 --model calibrated --detail --json` under
the settings that describe the variant's kernels:
- torch: auto (the default: the GPU's figures, whose decode attention is fitted on FA3 and ONNX Runtime rows, with
  norms, activations and RoPE as vLLM's kernel designs), `--kernel fa2` (FA2's figures; estimate's default fusion,
  silu_mul, in both), `--engine torch --kernel fa2` (the GPU's figures throughout) and `--engine torch`;
- vllm: `--engine vllm --kernel fa2` (vLLM's fusion and memory-bound kernel designs, FA2's attention figures),
and prints measured / predicted per step (`graph_us` against the decode step's calibrated time) and per operator
class (measured kernel durations in one replay, against the class's calibrated time; GEMM includes lm_head,
attention includes softmax; the KV-cache writes and the embedding gather are listed apart, lmcost has no op for
the first). Nothing in lmcost was fitted on these runs: held out.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from gpu_graph_decode import kernel_class as measured_class  # noqa: E402
SETTINGS = {"torch": [("auto", []), ("auto --kernel fa2", ["--kernel", "fa2"]),
                      ("--engine torch --kernel fa2", ["--engine", "torch", "--kernel", "fa2"]),
                      ("--engine torch", ["--engine", "torch"])],
            "vllm": [("--engine vllm --kernel fa2", ["--engine", "vllm", "--kernel", "fa2"])]}
CLASSES = {"gemm": ("gemm", "lm_head"), "attention": ("attention", "softmax"), "norm": ("norm",),
           "elementwise": ("elementwise",)}


def predict(gpu: str, b: int, t: int, args: list[str]) -> tuple[float, float, dict]:
    """(decode step calibrated seconds, its roofline seconds, per lmcost class calibrated seconds) of one
    estimate run."""
    from typer.testing import CliRunner

    from lmcost.cli import app

    cmd = ["estimate", "llama-3-8b", "--gpu", gpu, "--batch", str(b), "--prompt", str(t - 1), "--gen", "2",
           "--model", "calibrated", "--detail", "--json", *args]
    r = CliRunner().invoke(app, cmd)
    if r.exit_code != 0:
        raise RuntimeError(f"lmcost {' '.join(cmd)}: exit {r.exit_code}: {r.output[-400:]}")
    d = json.loads(r.stdout)
    per = defaultdict(float)
    for o in d["ops"]:
        if o["phase"] == "decode":
            per[o["op_class"]] += o["calibrated_s"]
    return d["decode"]["time_calibrated_s"], d["decode"]["time_roofline_s"], per


def evaluate(run: Path, gpu: str) -> pd.DataFrame:
    """One row per (case, setting): measured and predicted step and per-class times, and their ratios."""
    steps = pd.read_csv(Path(run) / "steps.csv")
    kern = pd.read_csv(Path(run) / "kernels.csv")
    kern["cls"] = kern.kernel.map(measured_class)
    rows = []
    for _, s in steps[steps.status == "ok"].iterrows():
        b, t = int(s.batch), int(s.context)
        k = kern[(kern.variant == s.variant) & (kern.batch == b) & (kern.context == t)]
        meas = k.groupby("cls").total_us.sum().to_dict()
        for label, args in SETTINGS[s.variant]:
            step_s, roof_s, per = predict(gpu, b, t, args)
            r = dict(variant=s.variant, setting=label, batch=b, context=t, graph_us=s.graph_us,
                     kernel_us=s.kernel_us, predicted_us=round(step_s * 1e6, 1), roofline_us=round(roof_s * 1e6, 1),
                     step_ratio=s.graph_us / (step_s * 1e6),
                     cache_write_us=round(meas.get("cache_write", 0.0), 1))
            for c, members in CLASSES.items():
                p = sum(per.get(m, 0.0) for m in members) * 1e6
                r[f"{c}_meas_us"] = round(meas.get(c, 0.0), 1)
                r[f"{c}_pred_us"] = round(p, 1)
                r[f"{c}_ratio"] = meas.get(c, 0.0) / p if p else float("nan")
            rows.append(r)
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run")
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--csv", dest="md")
    a = ap.parse_args(argv)
    try:
        df = evaluate(Path(a.run), a.gpu)
    except (OSError, KeyError, ValueError) as e:
        what = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
        print(f"error: run: cannot read {a.run}'s steps.csv and kernels.csv ({what}); give a folder "
              "benchmarks/gpu_graph_decode.py wrote", file=sys.stderr)
        return 2
    for _, r in df.iterrows():
        print(f"{r.variant:5} {r.setting:28} b={r.batch:<4} t={r.context:<5} measured {r.graph_us:8.0f} us  predicted "
              f"{r.predicted_us:8.0f} us  ratio {r.step_ratio:.2f}  | " +
              "  ".join(f"{c} {r[f'{c}_ratio']:.2f}" for c in CLASSES))
    summary = df.groupby("setting").agg(
        cases=("step_ratio", "size"),
        step_median_abs_err_pct=("step_ratio", lambda x: 100 * (x - 1).abs().median()),
        step_median_ratio=("step_ratio", "median"),
        **{f"{c}_median_ratio": (f"{c}_ratio", "median") for c in CLASSES})
    print(summary.round(3).to_string())
    if a.md:
        Path(a.md).write_text(df.to_csv(index=False) + "\n" + summary.round(3).to_csv() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
