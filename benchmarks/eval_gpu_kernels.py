"""`lmcost op` against kernels timed on a GPU by benchmarks/gpu_kernels.py: errors per class and setting.

    python benchmarks/eval_gpu_kernels.py tests/data/gpu-kernels-h200.csv --gpu h200 [--out table.md] [--rows rows.csv]

tests/data/gpu-kernels-h200.csv is reports/h200-kernels/kernels-run1.csv with run 2's time beside each row
(`time_us_repeat`, from kernels-run2.csv) and a `source` column.

For every measured row it builds the operator as `lmcost op` does (lmcost.cost.kernels) and costs it under each
setting that applies: `auto` (no flag), `--engine torch|vllm|sglang|trtllm`, and for norms and pointwise kernels
`--runtime triton|torch-eager`. It prints, per class and setting, the median of |predicted / measured - 1| of the
calibrated time, the median ratio measured / predicted (bias), the share of rows inside [calibrated_low,
calibrated_high] (band coverage) and the roofline's median error. No figure of lmcost was fitted on these rows
(held out), unless the report says otherwise for a setting.

What each implementation is costed as (the kernels it ran are in the CSV's `kernels` column):
- rmsnorm torch-fused, triton: the plain RMSNorm (x read, out written, weight read);
  triton-fused-add: the fused residual add + RMSNorm (`--residual`: x, residual, weight read; out, residual written);
  hf-eager: several kernels (fp32 upcast), costed as the plain norm under `--runtime torch-eager`, the runtime whose
  figures describe eager PyTorch.
- silu_mul triton: one fused kernel; eager: SiLU then the product (two kernels, the intermediate written and read:
  lmcost.operators.fusion.unfused_gated). add: one kernel. rope triton: one fused kernel over q and k.
- rope hf-eager (about ten kernels) has no lmcost counterpart: listed, not scored.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict

from lmcost.apps.engine_choice import choose_engine
from lmcost.basics.errors import LmcostError
from lmcost.cost import kernels as K
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.fusion import unfused_gated


def _i(row, key):
    return int(row[key]) if row.get(key) not in (None, "") else None


def klass(row) -> str | None:
    """The row's class in the report, or None when lmcost has no counterpart."""
    op, impl = row["op"], row["implementation"]
    if op == "gemm":
        return "GEMM bf16"
    if op == "gemm_fp8":
        return f"GEMM fp8 ({impl.split('-')[-1]})"
    if op == "attention_prefill":
        return "prefill attention" if row["seq_q"] == row["seq_kv"] else "prefill over a KV cache"
    if op == "attention_decode":
        return "decode attention"
    if op in ("rmsnorm", "layernorm"):
        return "norm (eager, several kernels)" if impl == "hf-eager" else "norm (one kernel)"
    if op == "rope" and impl == "hf-eager":
        return None
    if op == "silu_mul" and impl == "eager":
        return "elementwise (eager SiLU, mul)"
    return "elementwise (one kernel)"


def ops_of(row):
    """The cost records `lmcost op` builds for the row (and whether the norm carries the residual)."""
    op, impl = row["op"], row["implementation"]
    if op == "gemm":
        return K.gemm(_i(row, "M"), _i(row, "N"), _i(row, "K"), "bf16")
    if op == "gemm_fp8":
        return K.gemm(_i(row, "M"), _i(row, "N"), _i(row, "K"), "fp8")
    if op.startswith("attention"):
        phase = "decode" if op == "attention_decode" else "prefill"
        return K.attention(phase, _i(row, "batch"), _i(row, "heads_q"), _i(row, "heads_kv"), _i(row, "head_dim"),
                           None if phase == "decode" else _i(row, "seq_q"), _i(row, "seq_kv"),
                           phase == "decode" or row["causal"] == "True", "bf16")
    if op in ("rmsnorm", "layernorm"):
        return K.norm(op, _i(row, "tokens"), _i(row, "hidden"), "bf16", bias=op == "layernorm",
                      residual=impl == "triton-fused-add")
    if op == "silu_mul":
        ops = K.elementwise("silu_mul", _i(row, "tokens"), _i(row, "width"), dtype="bf16")
        return [unfused_gated(ops[0])] if impl == "eager" else ops
    if op == "add":
        return K.elementwise("add", _i(row, "tokens"), _i(row, "width"), dtype="bf16")
    if op == "rope":
        return K.elementwise("rope", _i(row, "tokens"), None, _i(row, "heads_q"), _i(row, "heads_kv"),
                             _i(row, "head_dim"), dtype="bf16")
    raise ValueError(op)


def settings_of(row) -> list[tuple[str, dict]]:
    """(setting label, choose_engine keywords) that apply to the row."""
    out = [("auto", {})]
    out += [(f"--engine {e}", dict(engine=e)) for e in ("torch", "vllm", "sglang", "trtllm")]
    if row["op"].startswith("attention"):
        kernel = {"fa2": "fa2", "sdpa-default": "cudnn"}[row["implementation"]]
        out += [(f"--kernel {kernel}", dict(kernel=kernel))]
    if row["op"] in ("rmsnorm", "layernorm", "silu_mul", "add", "rope"):
        out += [(f"--runtime {r}", dict(runtime=r)) for r in ("triton", "torch-eager")]
    return out


def _num(text) -> bool:
    """Whether ``text`` is a positive number (a time the run measured)."""
    try:
        return float(text) > 0
    except (TypeError, ValueError):
        return False


def evaluate(rows, gpu_name: str) -> list[dict]:
    """One record per (row, setting): measured, roofline, calibrated, band."""
    gpus = {}
    res = []
    for row in rows:
        if row["status"] != "ok":
            continue
        cls = klass(row)
        ops = ops_of(row)
        dtype = "fp8" if row["op"] == "gemm_fp8" else "bf16"
        for label, kw in settings_of(row):
            key = tuple(sorted(kw.items()))
            if key not in gpus:
                try:
                    gpus[key] = choose_engine(load_gpu(gpu_name), kw.get("engine"), kw.get("kernel"), kw.get("runtime"))[0]
                except Exception as e:  # noqa: BLE001 - a setting this GPU lacks is skipped, said once
                    print(f"{label}: skipped ({e})", file=sys.stderr)
                    gpus[key] = None
            hw = gpus[key]
            if hw is None:
                continue
            c = K.cost(ops, hw, dtype)["time_s"]
            meas = float(row["time_us"]) * 1e-6
            res.append(dict(cls=cls, setting=label, row=row, measured=meas, repeat=row.get("repeat_us"),
                            roofline=c["roofline"], calibrated=c.get("calibrated", c["roofline"]),
                            low=c.get("calibrated_low"), high=c.get("calibrated_high")))
    return res


def summary(res) -> list[dict]:
    """Per (class, setting): rows, median |pred/meas - 1|, median meas/pred, band coverage, roofline error."""
    by = defaultdict(list)
    for r in res:
        if r["cls"] is not None:
            by[(r["cls"], r["setting"])].append(r)
    out = []
    for (cls, setting), rs in by.items():
        err = statistics.median(abs(r["calibrated"] / r["measured"] - 1) for r in rs)
        bias = statistics.median(r["measured"] / r["calibrated"] for r in rs)
        inside = [r["low"] <= r["measured"] <= r["high"] for r in rs if r["low"] is not None]
        roof = statistics.median(abs(r["roofline"] / r["measured"] - 1) for r in rs)
        out.append(dict(cls=cls, setting=setting, n=len(rs), err=err, bias=bias,
                        coverage=sum(inside) / len(inside) if inside else None, roofline=roof))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--repeat", help="a second run of the same cases (default: the table's time_us_repeat column)")
    ap.add_argument("--out", help="markdown report")
    ap.add_argument("--rows", help="per-row CSV (auto and every setting)")
    a = ap.parse_args(argv)
    try:
        load_gpu(a.gpu)
        with open(a.csv, newline="") as fh:
            rows = list(csv.DictReader(fh))
        if not rows or "time_us" not in rows[0]:
            raise LmcostError("csv", f"{a.csv} has no rows of benchmarks/gpu_kernels.py", "give its kernels.csv")
        for i, r in enumerate(rows, start=2):
            for col in ("time_us", "time_us_repeat"):
                v = r.get(col)
                if r.get("status", "ok") != "ok" or v in (None, "") and col == "time_us_repeat":
                    continue
                try:
                    ok = float(v) > 0
                except (TypeError, ValueError):
                    ok = False
                if not ok:
                    raise LmcostError("csv", f"{a.csv} line {i}: {col} is {v!r}, not a time in microseconds > 0",
                                      "fix that row, or give benchmarks/gpu_kernels.py's kernels.csv as written")
    except OSError as e:
        print(f"error: csv: cannot read {a.csv} ({e.strerror}); give benchmarks/gpu_kernels.py's kernels.csv", file=sys.stderr)
        return 2
    except LmcostError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lines = []
    rep = list(csv.DictReader(open(a.repeat))) if a.repeat else (
        [dict(r, time_us=r["time_us_repeat"]) for r in rows] if rows and rows[0].get("time_us_repeat") else None)
    if rep:
        spread = sorted(abs(float(x["time_us"]) / float(y["time_us"]) - 1) for x, y in zip(rows, rep)
                        if x["status"] == y["status"] == "ok" and x["case"] == y["case"] and _num(x["time_us"])
                        and _num(y["time_us"]))  # a case not timed twice has no repeat
        lines.append(f"Run to run ({len(spread)} cases timed twice): median |run1/run2 - 1| {100 * statistics.median(spread):.1f}%, "
                     f"90th percentile {100 * spread[int(0.9 * len(spread))]:.1f}%, largest {100 * spread[-1]:.1f}%.")
        lines.append("")
    res = evaluate(rows, a.gpu)
    summ = summary(res)
    lines += ["| class | setting | rows | calibrated median error | measured / calibrated (median) | band coverage | roofline median error |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for s in sorted(summ, key=lambda s: (s["cls"], s["setting"] != "auto", s["setting"])):
        cov = f"{100 * s['coverage']:.0f}%" if s["coverage"] is not None else "-"
        lines.append(f"| {s['cls']} | {s['setting']} | {s['n']} | {100 * s['err']:.1f}% | {s['bias']:.2f} | {cov} | "
                     f"{100 * s['roofline']:.1f}% |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        open(a.out, "w").write(text)
    if a.rows:
        with open(a.rows, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["case", "class", "setting", "op", "implementation", "measured_us", "roofline_us", "calibrated_us",
                        "low_us", "high_us"])
            for r in res:
                w.writerow([r["row"]["case"], r["cls"], r["setting"], r["row"]["op"], r["row"]["implementation"],
                            f"{r['measured'] * 1e6:.3f}", f"{r['roofline'] * 1e6:.3f}", f"{r['calibrated'] * 1e6:.3f}",
                            "" if r["low"] is None else f"{r['low'] * 1e6:.3f}",
                            "" if r["high"] is None else f"{r['high'] * 1e6:.3f}"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
