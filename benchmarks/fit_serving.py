"""Fit each engine's figures (time factors and overheads, :mod:`lmcost.apps.serve_fit`) on the measured serving
points shipped in lmcost/data/measurements/serving-silicon.csv, and evaluate them on points not fitted:
leave-one-model-out, leave-one-GPU-out (each refit without the held-out points) and the points not sampled
into the fitting set (the fitted figures, unchanged).

    python benchmarks/fit_serving.py [--per-group 25] [--iterations 4] [--out reports/serve-fit.md]

Prints the fitted figures as YAML to paste into lmcost/data/engines/<engine>.yaml and writes the report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from lmcost.apps.serve_fit import figures, fit, held_out, points, read_points, simulate_points


def _dist(r: np.ndarray) -> str:
    """median, p75, p90 of |ratio - 1|, and the median ratio."""
    e = np.abs(r - 1)
    return (f"{np.median(e):.1%} | {np.percentile(e, 75):.1%} | {np.percentile(e, 90):.1%} | "
            f"{np.median(r):.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-group", type=int, default=25, help="points per (model, GPU) fitted, per engine")
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--engines", default="vllm,sglang,trtllm")
    ap.add_argument("--out", default="reports/serve-fit.md")
    ap.add_argument("--json", default="reports/serve-fit.json")
    a = ap.parse_args(argv)
    df = read_points()
    try:  # engines fitted earlier keep their sections (rerun one with --engines)
        with open(a.json) as fh:
            results = json.load(fh)
    except FileNotFoundError:
        results = {}
    head = ["# Serving engines fitted on measured TTFT/TPOT points", "",
             "Data: lmcost/data/measurements/serving-silicon.csv (aiconfigurator-core 0.12.0's silicon_sample.csv, "
             "Apache-2.0; converted by benchmarks/convert_silicon.py). Each point is a closed loop at a fixed "
             "concurrency; lmcost simulates 10 x concurrency requests (at most 4,096) from a cold start and compares "
             "their mean TTFT and TPOT with the measured means.",
             f"Fitted: at most {a.per_group} points per (model, GPU) per engine (seeded sample); evaluated: "
             "leave-one-model-out and leave-one-GPU-out (refit without the held-out points, then the held-out points "
             "simulated), and every point not sampled (the fitted figures as shipped).",
             "Time base: the roofline per operator (a lower bound), each group's time multiplied by the engine's "
             "factor (>= 1), plus its overheads. Errors are |predicted/measured - 1|: median | p75 | p90 | median "
             "ratio.", f"Command: `python benchmarks/fit_serving.py --per-group {a.per_group} --iterations "
             f"{a.iterations}` (2-core CPU machine, {time.strftime('%Y-%m-%d')}).", ""]
    for engine in a.engines.split(","):
        t0 = time.time()
        rows = df[df.engine == engine]
        sample = rows.sample(frac=1, random_state=0).groupby(["model", "gpu"]).head(a.per_group)
        rest = rows.drop(sample.index)
        skipped: list = []
        pts = points(sample, engine, time_model="roofline", say=skipped.append)
        print(f"{engine}: {len(pts)} points fitted ({len(skipped)} not costable)", file=sys.stderr, flush=True)
        f = fit(pts, iterations=a.iterations, say=lambda m: print(f"  {m}", file=sys.stderr, flush=True))
        meas = np.array([[p.row["ttft_s"], p.row["tpot_s"]] for p in pts])
        ins = f["pred"] / meas
        lines = [f"## {engine}", "", f"Fitted on {len(pts)} points ({len(skipped)} rows lmcost cannot cost were "
                  "left out: a layout that does not split the model, or weights leaving no room for a KV cache).",
                  "", "```yaml", *[f"{k}: {v}" for k, v in figures(f["theta"]).items()], "```", "",
                  "| set | points | TTFT median | p75 | p90 | median ratio | TPOT median | p75 | p90 | median ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|",
                  f"| in sample (fitted) | {len(pts)} | {_dist(ins[:, 0])} | {_dist(ins[:, 1])} |"]
        out = {"figures": figures(f["theta"]), "fitted_points": len(pts)}
        for by in ("model", "gpu"):
            h = held_out(pts, f, by)
            r = np.concatenate([pr / me for _, pr, me in h.values()])
            lines.append(f"| leave-one-{by}-out (all) | {len(r)} | {_dist(r[:, 0])} | {_dist(r[:, 1])} |")
            for v, (_, pr, me) in h.items():
                rr = pr / me
                lines.append(f"| &nbsp; held out: {v} | {len(rr)} | {_dist(rr[:, 0])} | {_dist(rr[:, 1])} |")
            out[f"leave_one_{by}_out"] = {"ttft_median_abs_error": float(np.median(np.abs(r[:, 0] - 1))),
                                          "tpot_median_abs_error": float(np.median(np.abs(r[:, 1] - 1)))}
        if len(rest):
            rp = points(rest, engine, time_model="roofline")
            pr = simulate_points(rp, f["theta"])
            me = np.array([[p.row["ttft_s"], p.row["tpot_s"]] for p in rp])
            r = pr / me
            lines.append(f"| not sampled (evaluation) | {len(rp)} | {_dist(r[:, 0])} | {_dist(r[:, 1])} |")
            out["not_sampled"] = {"points": len(rp), "ttft_median_abs_error": float(np.median(np.abs(r[:, 0] - 1))),
                                  "tpot_median_abs_error": float(np.median(np.abs(r[:, 1] - 1)))}
        lines += ["", f"({time.time() - t0:.0f} s)", ""]
        out["report"] = lines
        results[engine] = out
        print(json.dumps(out), file=sys.stderr, flush=True)
    text = "\n".join(head + [line for e in sorted(results) for line in results[e]["report"]]) + "\n"
    with open(a.out, "w") as fh:
        fh.write(text)
    with open(a.json, "w") as fh:
        json.dump(results, fh, indent=1)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
