"""Evaluate ``lmcost serve --pd`` on the measured disaggregated serving points (held out: the engine figures
were fitted on the aggregated rows only) and write reports/serve-pd.md.

Data: lmcost/data/measurements/serving-silicon-disagg.csv (benchmarks/convert_silicon_disagg.py, from
aiconfigurator-core 0.12.0's silicon_sample.csv, Apache-2.0). Each point is a closed loop of ``concurrency``
users over x prefill and y decode workers; lmcost simulates 3 x concurrency requests (32 to 3,000; all of them
at once past 3,000 users) from a cold start (:func:`lmcost.apps.serve_pd.closed_loop`) and compares the mean
TTFT and TPOT, and the output tokens/s per GPU by Little's law (concurrency x osl / (TTFT + (osl - 1) TPOT) /
GPUs, on both sides, where the source gives the worker counts).

    python benchmarks/eval_serve_pd.py [--per-group 8] [--out reports/serve-pd.md]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "lmcost" / "data" / "measurements" / "serving-silicon-disagg.csv"


def layout(row, pool: str) -> dict:
    """A pool's tp/ep/dp as lmcost reads them (attention-DP: dp replicas of tp ranks, as serve_fit._request;
    expert TP (moe_tp) read as EP over the same ranks: the experts' weights split alike, the communication not)."""
    tp, ep, dp = int(row[f"{pool}_tp"]), int(row[f"{pool}_ep"]) * int(row[f"{pool}_moe_tp"]), int(row[f"{pool}_dp"])
    if dp > 1 and tp >= dp:
        tp = max(1, tp // dp)
    return dict(tp=tp, ep=ep, dp=dp)


def request(row):
    from lmcost.apps.serve import ServeRequest
    from lmcost.apps.serve_fit import precision_of

    d, p = layout(row, "decode"), layout(row, "prefill")
    workers = not pd.isna(row["prefill_workers"])
    c = int(row["concurrency"])
    n = min(max(32, 3 * c), max(c, 3000))
    batch = None if pd.isna(row["decode_batch"]) else int(row["decode_batch"])
    return ServeRequest(model=row["model"], gpu=row["gpu"], engine=row["engine"], **precision_of(row), **d, pd=True,
                        prefill_tp=p["tp"], prefill_ep=p["ep"], prefill_dp=p["dp"],
                        prefill_workers=int(row["prefill_workers"]) if workers else 1,
                        decode_workers=int(row["decode_workers"]) if workers else 1, max_num_seqs=batch,
                        # a prompt past the engine's default budget: a prefill worker deployed for it takes it whole
                        prefill_max_num_batched_tokens=int(row["isl"]) if int(row["isl"]) > 8192 else None,
                        requests=n, prompt=str(int(row["isl"])), output=str(int(row["osl"])), concurrency=c)


def little(c, osl, ttft, tpot, gpus):
    """Output tokens/s per GPU of a closed loop of c users (Little's law: c requests in flight, each taking
    TTFT + (osl - 1) TPOT)."""
    return c * osl / (ttft + (osl - 1) * tpot) / gpus


def evaluate(df) -> pd.DataFrame:
    from lmcost.apps.serve_pd import run_pd
    from lmcost.basics.errors import LmcostError

    out = []
    for _, row in df.iterrows():
        try:
            s = run_pd(request(row)).summary
        except LmcostError as e:
            out.append(dict(id=row["id"], skipped=str(e)))
            continue
        gpus = s["pd"]["gpus"]
        c, osl = int(row["concurrency"]), int(row["osl"])
        rec = dict(id=row["id"], engine=row["engine"], gpu=row["gpu"], model=row["model"], precision=row["precision"],
                   workers_given=not pd.isna(row["prefill_workers"]), ratio=s["pd"]["ratio"], gpus=gpus,
                   link=s["pd"]["kv_transfer"]["link"], c=c, isl=int(row["isl"]), osl=osl,
                   ttft=s["ttft_s"]["mean"] / row["ttft_s"], tpot=s["tpot_s"]["mean"] / row["tpot_s"],
                   pred_ttft=s["ttft_s"]["mean"], meas_ttft=row["ttft_s"], pred_tpot=s["tpot_s"]["mean"],
                   meas_tpot=row["tpot_s"], kv_s=s["pd"]["kv_transfer"]["time_s"]["mean"], skipped="")
        rec["tput"] = (little(c, osl, rec["pred_ttft"], rec["pred_tpot"], gpus)
                       / little(c, osl, row["ttft_s"], row["tpot_s"], gpus))
        out.append(rec)
    return pd.DataFrame(out)


def med(r) -> str:
    r = np.asarray(r, dtype=float)
    return f"{np.median(np.abs(r - 1)):.0%} ({np.median(r):.2f})" if r.size else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-group", type=int, default=8, help="rows per (engine, GPU, precision, workers given), seeded")
    ap.add_argument("--out", default=str(ROOT / "reports" / "serve-pd.md"))
    a = ap.parse_args(argv)
    text = CSV.read_text()
    df = pd.read_csv(io.StringIO(text), comment="#")
    df["wg"] = ~df["prefill_workers"].isna()
    sample = df.sample(frac=1, random_state=0).groupby(["engine", "gpu", "precision", "wg"]).head(a.per_group)
    t0 = time.time()
    ev = evaluate(sample)
    took = time.time() - t0
    ok = ev[ev.skipped == ""]
    lines = ["# serve --pd against measured disaggregated serving points", "",
             f"Data: lmcost/data/measurements/serving-silicon-disagg.csv ({len(df)} rows: aiconfigurator-core 0.12.0's "
             "silicon_sample.csv, Apache-2.0, converted by benchmarks/convert_silicon_disagg.py). Held out: the engine "
             "figures (lmcost/data/engines) were fitted on the aggregated rows only, none on these.",
             f"Sampled: at most {a.per_group} rows per (engine, GPU, precision, worker counts given or not), seed 0: "
             f"{len(sample)} rows, {len(ok)} simulated, {len(ev) - len(ok)} skipped; {took:.0f} s on a 2-core CPU.",
             "Each is a closed loop of the row's concurrency over x prefill and y decode workers (lmcost.apps.serve_pd: "
             "3 x concurrency requests from a cold start, the loop solved as a fixed point), KV over the link `auto` "
             "picks (8-GPU nodes: NVLink when both pools fit one node, else RDMA). Layouts: attention-DP read as dp "
             "replicas of tp / dp ranks; expert TP (moe_tp) read as EP over as many ranks (the weights split alike, the communication differs). Where the source leaves the worker counts "
             "blank (549 of the rows) 1P1D is assumed: those rows are reported apart, and their throughput per GPU "
             "is not compared (the GPUs are unknown).",
             "Errors: median |predicted / measured - 1| (median ratio). Throughput per GPU by Little's law on both "
             "sides (concurrency x osl / (TTFT + (osl - 1) TPOT) / GPUs): it follows TTFT and TPOT.",
             f"Command: `python benchmarks/eval_serve_pd.py --per-group {a.per_group}` ({time.strftime('%Y-%m-%d')}).", ""]

    def table(title, key):
        rows = ["| " + title + " | rows | TTFT | TPOT | output tok/s per GPU (workers given) |", "|---|---|---|---|---|"]
        for k, g in ok.groupby(key):
            wg = g[g.workers_given]
            rows.append(f"| {k} | {len(g)} | {med(g.ttft)} | {med(g.tpot)} | {med(wg.tput)} ({len(wg)} rows) |")
        wg = ok[ok.workers_given]
        rows.append(f"| all | {len(ok)} | {med(ok.ttft)} | {med(ok.tpot)} | {med(wg.tput)} ({len(wg)} rows) |")
        return rows + [""]

    lines += ["## Per engine", ""] + table("engine", "engine")
    lines += ["## Per GPU", ""] + table("GPU", "gpu")
    lines += ["## Worker counts given by the source, or 1P1D assumed", ""] + table("workers given", "workers_given")
    lines += ["## Per model (leave-one-model-out)", "",
              "No figure is fitted on these rows, so every model's rows are held out; the engine figures were fitted "
              "on aggregated rows that include the same models (a leave-one-model-out refit of the engine figures "
              "is not run here).", ""] + table("model", "model")
    if len(ev) > len(ok):
        lines += ["## Skipped", ""] + [f"- {r.id}: {r.skipped}" for r in ev[ev.skipped != ""].itertuples()] + [""]
    lines += ["## Rows", "", "| id | ratio | GPUs | link | c | isl/osl | TTFT pred / meas | TPOT pred / meas | KV transfer |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in ok.astype({k: int for k in ("gpus", "c", "isl", "osl")}).itertuples():
        lines.append(f"| {r.id} | {r.ratio}{'' if r.workers_given else ' (assumed)'} | {r.gpus} | {r.link} | {r.c} | "
                     f"{r.isl}/{r.osl} | {r.pred_ttft * 1e3:.0f} / {r.meas_ttft * 1e3:.0f} ms | "
                     f"{r.pred_tpot * 1e3:.1f} / {r.meas_tpot * 1e3:.1f} ms | {r.kv_s * 1e3:.2f} ms |")
    Path(a.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:60]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
