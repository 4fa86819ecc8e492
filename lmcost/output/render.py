"""Human output: rich tables from the API's dicts and DataFrames. The only place numbers get units.

Machine output (``--json``, ``--csv``) never passes through here: it stays in base units.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
import math

import humanize
from rich.table import Table


def si(value, unit: str, precision: int = 3) -> str:
    """``1.23 TFLOP``, ``5.20 ms``: a decimal SI prefix (counts are decimal, never 1024-based). Times
    go no finer than nanoseconds (``0.611 ns``, not ``611 ps``) and no coarser than seconds: ``Ms``
    (megaseconds) reads as milliseconds, so from 1,000 s a time is whole seconds with thousands
    separators to ``precision`` significant figures (``42,200 s``), and from 10^7 s (116 days) in
    scientific notation (``8.80e7 s``)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "inf" if value == math.inf else "-"
    if value == 0:
        return f"0 {unit}"
    if unit == "s" and abs(value) < 1e-9:
        return f"{value * 1e9:.{precision}g} ns"
    if unit == "s" and abs(value) >= 999.5:
        mantissa, exponent = f"{value:.{precision - 1}e}".split("e")
        if int(exponent) >= 7:
            return f"{mantissa}e{int(exponent)} s"
        return f"{float(f'{mantissa}e{exponent}'):,.0f} s"
    return humanize.metric(float(value), unit, precision=precision)


def binary(n_bytes, precision: int = 3) -> str:
    """``128 KiB``, ``2.25 GiB``: a binary prefix, as KV-cache and memory sizes are thought of."""
    if n_bytes is None or (isinstance(n_bytes, float) and not math.isfinite(n_bytes)):
        return "-"
    text = humanize.naturalsize(float(n_bytes), binary=True, format=f"%.{precision}g")
    if "e+" in text:  # 1000-1023 of a unit: %g would write 1.01e+03 MiB
        text = humanize.naturalsize(float(n_bytes), binary=True, format="%.0f")
    return text


def rate(value: float) -> str:
    """A throughput that never rounds to 0: ``1,270``, ``3.41``, ``0.0123``."""
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def pct(x: float) -> str:
    """A fraction as a percentage with two decimals."""
    return f"{100 * x:.2f}%"


def count(n) -> str:
    """A count with thousands separators (decimal, exact)."""
    return humanize.intcomma(int(n))


def kv_table(title: str, rows: list[tuple[str, str]], justify: str = "right") -> Table:
    """A two-column table of (label, value) rows."""
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify=justify, overflow="fold")
    for k, v in rows:
        t.add_row(k, v)
    return t


def params_table(p: dict, cfg=None) -> Table:
    """Parameter counts of an estimate; with ``cfg``, each group of layers by its human name (:func:`group_label`)."""
    from lmcost.operators.forward import group_label

    rows = [("total", count(p["total"])), ("active per token", count(p["active_per_token"])),
            ("embedding", count(p["embedding"])), ("lm_head (0 when tied)", count(p["lm_head"]))]
    rows += [(f"per block ({group_label(cfg, g) if cfg is not None else g})", count(n))
             for g, n in p["per_block"].items()]
    if p.get("vision"):
        rows.append(("vision tower + projector (not in total)", count(p["vision"])))
    return kv_table("Parameters", rows)


def memory_table(kv: dict, mem: dict) -> Table:
    """KV cache and memory footprint against capacity (per GPU under a parallel layout: its busiest stage)."""
    state = kv.get("state_bytes_per_sequence") or 0
    if "stage" not in mem:
        return kv_table("KV cache and memory", [
            ("KV cache per token (within any window)", binary(kv["bytes_per_token"], 4)),
            *([("recurrent state per sequence (whatever the context)", binary(state, 4))] if state else []),
            (f"KV cache{' + state' if state else ''}, batch {kv['batch']} at context {kv['context']}",
             binary(kv["bytes_total"])),
            ("weights", si(mem["weights_bytes"], "B")),
            ("activations (prefill peak)", si(mem["activations_bytes"], "B")),
            ("total", si(mem["total_bytes"], "B")),
            ("capacity", si(mem["capacity_bytes"], "B")),
            ("fits", "yes" if mem["fits"] else "[red]NO[/red]"),
        ])
    return kv_table(f"Memory per GPU (busiest: pipeline stage {mem['stage']})", [
        ("KV cache per token, whole model (within any window)", binary(kv["bytes_per_token"], 4)),
        *([("recurrent state per sequence, whole model", binary(state, 4))] if state else []),
        (f"KV cache on this GPU, its replica's sequences at context {kv['context']}", binary(mem["kv_cache_bytes"])),
        ("weights (sharded)", si(mem["weights_bytes"], "B")),
        ("activations (prefill peak of a microbatch)", si(mem["activations_bytes"], "B")),
        ("collective outputs (largest gather/all-to-all/send; all-reduce in place)", si(mem["comm_buffer_bytes"], "B")),
        ("total per GPU", si(mem["total_bytes"], "B")),
        ("capacity per GPU", si(mem["capacity_bytes"], "B")),
        ("fits (each GPU)", "yes" if mem["fits"] else "[red]NO[/red]"),
    ])


def phases_table(est) -> Table:
    """Prefill and one decode step: FLOPs, bytes, intensity, roofline time, bound; TTFT/TPOT caption."""
    model = est.settings.model
    t = Table(title=f"Phases ({model}" + (")" if model == "roofline" else
                                          f"; roofline lower bound prefill {si(est.prefill['time_roofline_s'], 's')}, "
                                          f"decode {si(est.decode['time_roofline_s'], 's')})"), title_justify="left")
    # time_upper_s: compute + memory summed, the roofline with no overlap; under the calibrated model it can
    # be below the time (it bounds the roofline, not the calibrated time)
    for c in ("phase", "FLOPs", "bytes", "FLOPs/byte", "time", "roofline, no overlap", "bound"):
        t.add_column(c, justify="left" if c == "phase" else "right")
    wl = est.workload
    lay = est.settings.layout
    b = f"{wl.batch}" if lay.single else f"{lay.microbatch(wl.batch)} per GPU"
    for name, p, label in (("prefill", est.prefill, f"prefill (b={b}, s={wl.prompt})"),
                           ("decode", est.decode, f"decode step (b={b}, t={wl.context})")):
        t.add_row(label, si(p["flops"], "FLOP"), si(p["bytes"], "B"), f"{p['arithmetic_intensity']:.1f}",
                  si(p["time_s"], "s"), si(p["time_upper_s"], "s"), p["bound"])
    tpot = si(est.tpot_s, "s") + band(est.tpot_band_s) if est.tpot_s is not None else "n/a (gen = 1)"
    t.caption = (f"TTFT {si(est.ttft_s, 's')}{band(est.ttft_band_s)}   TPOT {tpot}   "
                 f"{rate(est.throughput_tokens_per_s)} tokens/s (batch {wl.batch}, {wl.gen} generated each)")
    return t


def band(b) -> str:
    """ " (low-high)" of a calibrated time's error band (s), or "" without one."""
    if not b:
        return ""
    return f" ({si(b[0], 's')}-{si(b[1], 's')})"


def class_tables(op_classes: list[dict]) -> list[Table]:
    """One table per phase: operator classes by time, with their shares of FLOPs and time.

    ``op_classes``: rows of phase, op_class, flops, bytes, time_s, flops_share, time_share
    (:attr:`lmcost.apps.estimate.Estimate.class_rows`).
    """
    out = []
    for phase in dict.fromkeys(r["phase"] for r in op_classes):
        t = Table(title=f"{phase}: by operator class", title_justify="left")
        for c in ("class", "FLOPs", "bytes", "time", "FLOPs share", "time share"):
            t.add_column(c, justify="left" if c == "class" else "right")
        rows = sorted((r for r in op_classes if r["phase"] == phase), key=lambda r: -r["time_s"])
        for r in rows:
            sent = r["op_class"] == "communication"
            t.add_row(r["op_class"], si(r["flops"], "FLOP"),
                      si(r.get("wire_bytes", 0), "B") + " bus" if sent else si(r["bytes"], "B"),
                      si(r["time_s"], "s"), pct(r["flops_share"]), pct(r["time_share"]))
        if any(r["op_class"] == "communication" for r in rows):
            t.caption = ("communication: bus bytes per GPU (nccl-tests' size x bus factor: the traffic over its "
                         "links), not device-memory bytes; not overlapped with compute")
        out.append(t)
    return out


def detail_table(phase: str, rows: list[dict], formulas: list[str]) -> Table:
    """One row per operator of one layer (totals divided by the layer count) with its FLOPs formula.

    ``rows``: the phase's operator rows (:attr:`lmcost.apps.estimate.Estimate.rows`).
    """
    t = Table(title=f"{phase}: per operator (per layer; x layers = the op's total, as in --json's flops)",
              title_justify="left")
    for c in ("op", "class", "layers", "FLOPs per layer", "bytes per layer", "time per layer", "bound", "FLOPs formula"):
        t.add_column(c, justify="right" if c in ("layers", "FLOPs per layer", "bytes per layer", "time per layer") else "left")
    for r, f in zip(rows, formulas):
        n = r["count"]
        t.add_row(r["name"], r["op_class"], str(n), si(r["flops"] / n, "FLOP"), si(r["bytes"] / n, "B"),
                  si(r["time_s"] / n, "s"), r["bound"], f)
    return t


def to_json(obj) -> str:
    """Indented, standard JSON: numpy scalars as Python numbers, non-finite floats (the intensity of an
    op that moves no bytes) as null, since JSON has no Infinity or NaN."""
    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item") and not isinstance(v, (list, dict)):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            return None
        return v

    return json.dumps(clean(obj), indent=2, allow_nan=False, default=str)


def flatten(obj, prefix: str = "") -> list[tuple[str, object]]:
    """Dotted key/value pairs of a nested dict/list, for ``--csv``."""
    if isinstance(obj, dict):
        return [kv for k, v in obj.items() for kv in flatten(v, f"{prefix}{k}.")]
    if isinstance(obj, list):
        return [kv for i, v in enumerate(obj) for kv in flatten(v, f"{prefix}{i}.")]
    return [(prefix[:-1], obj)]


def to_csv(obj) -> str:
    """CSV in base units: a list of rows as one table with a header; anything else as dotted key/value
    pairs (:func:`flatten`)."""
    import pandas as pd

    if isinstance(obj, list):
        return pd.DataFrame(obj).to_csv(index=False)
    return pd.DataFrame(flatten(obj), columns=["key", "value"]).to_csv(index=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class MachineFormat:
    """A machine-readable output: the CLI gives every command that prints machine output a ``--<name>``
    flag per format (``help`` is its help text), and prints ``write(data)`` when it is asked for."""

    name: str
    help: str
    write: Callable[[object], str]


#: The machine formats, by flag name. Adding a format is one entry here: a function from the command's
#: data (a dict, or a list of row dicts) to text.
MACHINE_FORMATS: dict[str, MachineFormat] = {f.name: f for f in (
    MachineFormat(name="json", help="Print JSON in base units (FLOPs, bytes, seconds).",
                  write=lambda data: to_json(data) + "\n"),
    MachineFormat(name="csv", help="Print CSV in base units.", write=to_csv),
)}


def efficiency_rows(eff) -> list[tuple[str, str]]:
    """(label, value and source) rows of a GPU's efficiency block, or one row saying there is none."""
    if eff is None:
        return [("efficiency", "none: calibrated times equal the roofline (lmcost fit --table fits one from measured kernel times, lmcost calibrate on a local device)")]
    from rich.markup import escape

    def show(v) -> str:
        if hasattr(v, "model_dump"):  # a fitted figure: its values, then the rows it came from
            d = v.model_dump()
            rows_ = d.pop("rows", "")
            return ", ".join(f"{k} {x}" for k, x in d.items()) + (f"; rows: {rows_}" if rows_ else "")
        if isinstance(v, dict):
            return "; ".join(f"{k}: {show(x)}" for k, x in v.items())
        return str(v)

    rows = []
    for f in eff.figures():
        head, _, key = f.partition(".")
        value = eff.value(f)
        if isinstance(value, dict):  # kinds.<runtime>: one row per kind
            rows += [(f"efficiency {f}.{k}", escape(show(x))) for k, x in value.items()]
            rows.append((f"efficiency {f} (source)", escape(eff.source_of(f) or "none given")))
        else:
            rows.append((f"efficiency {f}", escape(f"{show(value)}  (source: {eff.source_of(f) or 'none given'})")))
    rows += [(f"band {k} (measured / predicted)", f"{lo:.2f}-{hi:.2f}") for k, (lo, hi) in eff.bands.items()]
    rows += [(f"fit {k}", escape(show(v))) for k, v in eff.fit.items()]
    rows += [(f"measured {k}", escape(str(v))) for k, v in eff.conditions.items()]
    return rows
