"""The rich tables of the CLI's commands, one function each, from the API's records and DataFrames.

Units and formatting come from :mod:`lmcost.output.render` (the tables of ``estimate`` live there too);
a command builds no table of its own: it calls one of these and prints what it returns.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from lmcost.output.render import binary, count, kv_table, pct, si


def _columns(t: Table, names, left=()) -> Table:
    """``t`` with a column per name, left-justified if in ``left``, else right."""
    for c in names:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def kv_variants_table(df, batch: int) -> Table:
    """``lmcost kv``: one row per variant (and MLA mode): KV per token, state per sequence (hybrids),
    attention parameters, the longest context at ``batch``. ``df``: :func:`lmcost.apps.kv.compare`'s table."""
    first = df.drop_duplicates(["variant", "mla_mode"])
    hybrid = bool(first.state_bytes_per_seq.any())  # constant-size state layers: their state per sequence
    t = _columns(Table(title="Variants", title_justify="left"),
                 ("variant", "attention", "MLA mode", "KV per token", *(("state per sequence",) if hybrid else ()),
                  "attention params", f"longest context at b={batch}"), left=("variant", "attention", "MLA mode"))
    for r in first.itertuples():
        t.add_row(r.variant, r.attention, r.mla_mode or "-", binary(r.kv_bytes_per_token, 4),
                  *((binary(r.state_bytes_per_seq, 4),) if hybrid else ()),
                  count(r.attention_params), count(r.max_context) if r.max_context else "[red]none[/red]")
    return t


def kv_contexts_table(df) -> Table:
    """``lmcost kv``: one row per variant and context: KV cache exact and paged, fits, largest batch,
    decode step, tokens/s, attention intensity."""
    t = _columns(Table(title="Per context", title_justify="left"),
                 ("variant", "context", "KV cache", "KV paged", "fits", "largest batch", "decode step", "tokens/s",
                  "attention FLOPs/byte"), left=("variant",))
    for r in df.itertuples():
        name = f"{r.variant} ({r.mla_mode})" if r.mla_mode else r.variant
        t.add_row(name, count(r.context), binary(r.kv_bytes), binary(r.kv_bytes_paged),
                  "yes" if r.fits else "[red]no[/red]", count(r.max_batch), si(r.decode_time_s, "s"),
                  f"{r.tokens_per_s:,.0f}", f"{r.attention_intensity:.1f}")
    return t


def efficiency_fit_table(rows: list[dict], table: str, n_rows: int) -> Table:
    """``lmcost fit``: the held-out error of each operator class (:func:`lmcost.apps.fit.fit`'s rows)."""
    t = _columns(Table(title=f"efficiency fit on {table}: {n_rows} rows, leave-one-source-out"),
                 ("class", "rows", "sources", "median |error|", "named kernel", "band (5-95%)", "held-out in band"),
                 left=("class",))
    for r in rows:
        if not r["rows"]:
            t.add_row(r["op_class"], "0", "0", "unconstrained", "", "", "")
            continue
        cov = "" if r["band_coverage"] is None else f"{r['band_coverage']:.0%}"
        t.add_row(r["op_class"], str(r["rows"]), str(r["sources"]), f"{r['median_abs_error']:.0%}",
                  f"{r['median_abs_error_named']:.0%}", f"{r['band_low']:.2f}-{r['band_high']:.2f}", cov)
    return t


def collective_fit_table(errors: list[dict], table: str, n_rows: int) -> Table:
    """``lmcost fit --collectives``: the held-out error per device and regime."""
    t = _columns(Table(title=f"collective fit on {table}: {n_rows} rows, leave-one-source-out"),
                 ("device", "regime", "rows", "sources", "median |error|", "worst |error| (row)"), left=("device", "regime"))
    for e in errors:
        t.add_row(e["device"], e["regime"], str(e["rows"]), str(e["sources"]), f"{e['median_abs_error']:.0%}",
                  f"{e['worst_abs_error']:.0%} ({e['worst_row']})")
    return t
