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
    heads = ("#", "layout", "max seqs", "token budget", "offered (req/s)", "served (req/s)", "out tok/s/GPU",
             "goodput (req/s)", "TTFT p50", f"TTFT {k}", "TPOT p50", f"TPOT {k}", "bound (req/s)", "runs",
             "note")
    return _table(title, heads, rows, top, lambda r, per: (r["layout"], str(r["max_num_seqs"]),
                  f"{r['max_num_batched_tokens']:,}", per("offered_rate"), per("requests_per_s"),
                  per("output_tokens_per_s_per_gpu"), per("goodput_requests_per_s")), k)


def pd_plan_table(title: str, rows: list[dict], percentile: int, top: int) -> Table:
    """As :func:`plan_table` for ``serve-plan --pd``'s rows (:mod:`lmcost.apps.serve_plan_pd`): the xPyD, each
    pool's workers x layout, the knobs, the offered rate, goodput per GPU over both pools (the rank), output
    tokens/s per GPU, TTFT (prefill + KV transfer + decode admission) and TPOT (the decode pool's)."""
    k = f"p{percentile}"
    heads = ("#", "xPyD", "prefill", "decode", "max seqs", "token budget", "offered (req/s)", "goodput/GPU (req/s)",
             "out tok/s/GPU", "TTFT p50", f"TTFT {k}", "TPOT p50", f"TPOT {k}", "bound (req/s)", "runs", "note")

    def pool(p: dict) -> str:
        return f"{pool_label(p)} ({p['gpus']} GPU{'s' * (p['gpus'] > 1)})"

    def lead(r, per):
        return (r["pd"]["ratio"], pool(r["pd"]["prefill"]), pool(r["pd"]["decode"]), str(r["max_num_seqs"]),
                f"{r['max_num_batched_tokens']:,}", per("offered_rate"), per("goodput_requests_per_s_per_gpu"),
                per("output_tokens_per_s_per_gpu"))
    return _table(title, heads, rows, top, lead, k)


def pool_label(p: dict) -> str:
    """A P/D pool (``workers``, one worker's ``tp``, ``ep``, ``dp``) as ``2 x TP2 EP2``: workers x a layout."""
    lay = " ".join(f"{n}{p[n.lower()]}" for n in ("TP", "EP", "DP") if p[n.lower()] > 1 or n == "TP")
    return f"{p['workers']} x {lay}"


def _table(title: str, heads: tuple, rows: list[dict], top: int, lead, k: str) -> Table:
    """A table of ``heads``: each row's ``lead(row, per)`` cells, then TTFT/TPOT at p50 and ``k``, the bound,
    the runs and the note (why a candidate has no rate)."""
    t = Table(title=title, title_justify="left")
    for h in heads:
        t.add_column(h, justify="left" if h in ("layout", "note", "xPyD", "prefill", "decode") else "right")
    for i, r in enumerate(rows[:top]):
        ok = r["status"] == "ok"
        cell = (lambda key: si(r[key], "s") if ok and r[key] is not None else "-")
        per = (lambda key: rate(r[key]) if ok else "-")
        t.add_row(str(i + 1), *lead(r, per), cell("ttft_p50_s"), cell(f"ttft_{k}_s"),
                  cell("tpot_p50_s"), cell(f"tpot_{k}_s"),
                  rate(r["bound_rate"]) if r["bound_rate"] is not None else "-", str(r["runs"]),
                  escape(r["reason"]) if not ok else (escape(r["reason"]) or ""))
    if len(rows) > top:
        t.caption = f"{top} of {len(rows)} candidates (--top; --json has all)"
    return t
