"""The rich tables of ``lmcost fit --training`` (:func:`lmcost.apps.train_fit.evaluate_training`'s summaries)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

COLUMNS = ("rows", "median pred/pub", "median |ln ratio|", "within 10%", "within 25%", "q1-q3", "min-max")


def _cells(s: dict) -> list[str]:
    if not s.get("rows"):
        return ["0"] + ["-"] * (len(COLUMNS) - 1)
    return [str(s["rows"]), f"{s['median_ratio']:.2f}", f"{s['median_abs_log']:.2f}", f"{s['within_10']:.0%}",
            f"{s['within_25']:.0%}", f"{s['q1']:.2f}-{s['q3']:.2f}", f"{s['min']:.2f}-{s['max']:.2f}"]


def training_fit_tables(res: dict, how: str = "") -> list[Table]:
    """Per metric class (throughput: one figure per run, memory), per metric, and per source within each class:
    predicted/published ratios; then the OOM outcomes. ``how``: the figures' name in the title (e.g.
    leave-one-source-out)."""
    summary = res["summary"]
    t = Table(title=f"lmcost train against {res['table']}{f' ({how})' if how else ''}: {res['rows_used']} of "
              f"{res['rows_read']} rows costed", title_justify="left")
    for c in ("what",) + COLUMNS:
        t.add_column(c, justify="left" if c == "what" else "right")
    for cls in ("throughput", "memory"):
        t.add_row(f"[bold]{cls}[/bold]", *_cells(summary[cls]))
        for source, s in summary[cls]["by_source"].items():
            t.add_row(f"  {escape(source)}", *_cells(s))
    for metric, s in summary["by_metric"].items():
        t.add_row(f"metric {metric}", *_cells(s))
    oom = summary["oom"]
    o = Table(title="out-of-memory outcomes", title_justify="left")
    o.add_column("OOM rows costed", justify="right")
    o.add_column("predicted not to fit", justify="right")
    near = "neighbours" in oom  # the memory fit's outcomes: the runs beside each OOM row (same source and model)
    if near:
        o.add_column("runs beside them", justify="right")
        o.add_column("predicted to fit", justify="right")
    o.add_row(str(oom["rows"]), str(oom["predicted_not_to_fit"]),
              *((str(oom["neighbours"]), str(oom["neighbours_predicted_to_fit"])) if near else ()))
    return [t, o]


def figures_table(fit: dict) -> Table:
    """The fitted system figures, each with the rows it was fitted on, and its range over the
    leave-one-source-out fits."""
    t = Table(title=f"fitted system figures (clocks of {', '.join(fit['fitted_clocks'])}; {fit['gauge']}'s step "
              "efficiency held at 1)", title_justify="left")
    for c in ("figure", "value", "LOSO range", "rows"):
        t.add_column(c, justify="left" if c in ("figure", "rows") else "right")
    for k, v in fit["figures"].items():
        vals = [f.get(k, v) for f in fit["loso_figures"].values()] or [v]
        t.add_row(k, f"{v:.2f}", f"{min(vals):.2f}-{max(vals):.2f}", fit["rows"][k])
    return t


def left_out_lines(res: dict) -> list[str]:
    """One line per reason a row was left out (skipped as published, or refused by lmcost train), with counts."""
    counts: dict[str, int] = {}
    for r in res["skipped"]:
        why = "model not buildable" if r["why"].startswith("model ") else r["why"]
        counts[why] = counts.get(why, 0) + 1
    for r in res["refused"]:
        counts[f"refused by train: {r['why']}"] = counts.get(f"refused by train: {r['why']}", 0) + 1
    return [f"{n:4d}  {why}" for why, n in sorted(counts.items(), key=lambda kv: -kv[1])]
