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
from lmcost.basics.errors import LmcostError  # noqa: E402

SETTINGS = {"torch": [("auto", []), ("auto --kernel fa2", ["--kernel", "fa2"]),
                      ("--engine torch --kernel fa2", ["--engine", "torch", "--kernel", "fa2"]),
                      ("--engine torch", ["--engine", "torch"])],
            "vllm": [("--engine vllm --kernel fa2", ["--engine", "vllm", "--kernel", "fa2"])]}
CLASSES = {"gemm": ("gemm", "lm_head"), "attention": ("attention", "softmax"), "norm": ("norm",),
           "elementwise": ("elementwise",)}
#: The columns this script reads from each file gpu_graph_decode.py writes: int (whole, >= 1), float (>= 0) or str.
#: steps.csv's numbers are read on its ok rows alone (a failed case has none).
COLUMNS = {"steps.csv": dict(variant=str, batch=int, context=int, graph_us=float, kernel_us=float, status=str),
           "kernels.csv": dict(variant=str, batch=int, context=int, kernel=str, total_us=float)}
FIX = "give a folder benchmarks/gpu_graph_decode.py wrote (its steps.csv and kernels.csv)"


def read_table(run: Path, name: str) -> pd.DataFrame:
    """``name`` (steps.csv or kernels.csv) of the run folder ``run``, its :data:`COLUMNS` checked and typed;
    steps.csv keeps only its ok rows.

    Raises: LmcostError (run) for a missing or unreadable file, an empty one or one that is no CSV, a missing
    column, a value of the wrong kind (line numbers as an editor shows them), steps.csv without an ok row or with
    a variant this script has no settings for (:data:`SETTINGS`)."""
    path = Path(run) / name
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise LmcostError("run", f"{path} is empty", FIX) from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise LmcostError("run", f"{path} is not a CSV ({str(e).splitlines()[0][:80]})", FIX) from None
    except OSError as e:
        raise LmcostError("run", f"cannot read {path} ({e.strerror or type(e).__name__})", FIX) from None
    lacks = [c for c in COLUMNS[name] if c not in df.columns]
    if lacks:
        raise LmcostError("run", f"{path} lacks the column{'s' * (len(lacks) > 1)} {', '.join(lacks)}", FIX)
    if name == "steps.csv":
        df = df[df.status.astype(str) == "ok"]
        if df.empty:
            raise LmcostError("run", f"{path} has no step with status ok", "give a run with at least one step that ran")
        bad = df[~df.variant.isin(list(SETTINGS))]
        if len(bad):
            raise LmcostError("run", f"{path} line {bad.index[0] + 2}: variant {bad.variant.iloc[0]!r} has no settings "
                              "here", f"give steps of {' or '.join(SETTINGS)}")
    for col, kind in COLUMNS[name].items():
        if kind is str:
            continue
        v = pd.to_numeric(df[col], errors="coerce")
        wrong = v.isna() | ~v.abs().lt(float("inf")) | (v < (1 if kind is int else 0))
        if kind is int:
            wrong |= v.mod(1).ne(0) & ~v.isna()
        if wrong.any():
            i = wrong.to_numpy().nonzero()[0][0]
            raise LmcostError("run", f"{path} line {df.index[i] + 2}: {col} {str(df[col].iloc[i])!r} is not "
                              f"{'a whole number >= 1' if kind is int else 'a number >= 0'}", FIX)
        df = df.assign(**{col: v.astype(kind)})
    return df


def predict(gpu: str, b: int, t: int, args: list[str]) -> tuple[float, float, dict]:
    """(decode step calibrated seconds, its roofline seconds, per lmcost class calibrated seconds) of one
    estimate run.

    Raises: LmcostError (run) as estimate refuses the case (its error line, with the case); RuntimeError if it fails
    otherwise (a bug)."""
    from typer.testing import CliRunner

    from lmcost.cli import app

    cmd = ["estimate", "llama-3-8b", "--gpu", gpu, "--batch", str(b), "--prompt", str(t - 1), "--gen", "2",
           "--model", "calibrated", "--detail", "--json", *args]
    r = CliRunner().invoke(app, cmd)
    if r.exit_code == 2:  # estimate's one error line: the case is one it refuses
        field, _, rest = r.output.strip().splitlines()[-1].removeprefix("error: ").partition(": ")
        what, _, fix = rest.partition("; ")
        raise LmcostError("run", f"estimate refuses the step of batch {b}, context {t} ({field}: {what})",
                          f"give steps estimate takes ({fix})")
    if r.exit_code != 0:
        raise RuntimeError(f"lmcost {' '.join(cmd)}: exit {r.exit_code}: {r.output[-400:]}")
    d = json.loads(r.stdout)
    per = defaultdict(float)
    for o in d["ops"]:
        if o["phase"] == "decode":
            per[o["op_class"]] += o["calibrated_s"]
    return d["decode"]["time_calibrated_s"], d["decode"]["time_roofline_s"], per


def evaluate(run: Path, gpu: str) -> pd.DataFrame:
    """One row per (case, setting): measured and predicted step and per-class times, and their ratios.

    Raises: LmcostError (gpu) for a GPU lmcost does not know, before any case is costed; as :func:`read_table`
    and :func:`predict`."""
    from lmcost.hardware.gpu import load_gpu

    load_gpu(gpu)
    steps, kern = read_table(run, "steps.csv"), read_table(run, "kernels.csv")
    kern["cls"] = kern.kernel.map(measured_class)
    rows = []
    for _, s in steps.iterrows():
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
    except LmcostError as e:
        field = "--gpu" if e.field == "gpu" else e.field
        print(f"error: {field}: {e.what}; {e.fix}", file=sys.stderr)
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
        try:
            Path(a.md).write_text(df.to_csv(index=False) + "\n" + summary.round(3).to_csv() + "\n")
        except OSError as e:
            print(f"error: --csv: cannot write {a.md} ({e.strerror or type(e).__name__}); give a path in a folder "
                  "you can write", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
