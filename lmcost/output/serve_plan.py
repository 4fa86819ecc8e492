"""``lmcost serve-plan``'s human output: the candidates' table, best first (rows of
:class:`lmcost.apps.serve_plan.ServePlan`), and the line that says the best and what was pruned."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from lmcost.output.render import rate, si


def plan_table(title: str, rows: list[dict], percentile: int, top: int) -> Table:
    """The first ``top`` rows: layout, knobs, the highest offered rate meeting the SLOs (requests/s), and the
    run at it as ``lmcost serve`` reports it: served requests/s, output tokens/s per GPU, goodput (requests/s:
    the rank, every row having the same GPUs), TTFT and TPOT at p50 and the SLOs' percentile; the static
    bound, and why a candidate has no rate (pruned, no rate meets the SLOs, cannot run)."""
    k = f"p{percentile}"
    t = Table(title=title, title_justify="left")
    heads = ("#", "layout", "max seqs", "token budget", "offered (req/s)", "served (req/s)", "out tok/s/GPU",
             "goodput (req/s)", "TTFT p50", f"TTFT {k}", "TPOT p50", f"TPOT {k}", "bound (req/s)", "runs",
             "note")
    for h in heads:
        t.add_column(h, justify="left" if h in ("layout", "note") else "right")
    for i, r in enumerate(rows[:top]):
        ok = r["status"] == "ok"
        cell = (lambda key: si(r[key], "s") if ok and r[key] is not None else "-")
        per = (lambda key: rate(r[key]) if ok else "-")
        t.add_row(str(i + 1), r["layout"], str(r["max_num_seqs"]), f"{r['max_num_batched_tokens']:,}",
                  per("offered_rate"), per("requests_per_s"), per("output_tokens_per_s_per_gpu"),
                  per("goodput_requests_per_s"), cell("ttft_p50_s"), cell(f"ttft_{k}_s"),
                  cell("tpot_p50_s"), cell(f"tpot_{k}_s"),
                  rate(r["bound_rate"]) if r["bound_rate"] is not None else "-", str(r["runs"]),
                  escape(r["reason"]) if not ok else (escape(r["reason"]) or ""))
    if len(rows) > top:
        t.caption = f"{top} of {len(rows)} candidates (--top; --json has all)"
    return t
