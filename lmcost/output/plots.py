"""Plotly figures, written as self-contained HTML (plotly.js inlined: opens offline).

plotly is imported here only; a missing install is a one-line error naming the extra to install.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from lmcost.basics.errors import LmcostError
from lmcost.basics.files import check_name, shown, write_file


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise LmcostError("plot", "plotly is not installed", "pip install 'lmcost[plot]'") from None
    return go, make_subplots


def kv_figure(curves: pd.DataFrame, free_bytes: float, title: str):
    """Two panels over context length (log x): KV-cache GB per variant with the memory left for the
    cache drawn as a horizontal line; and one decode step's time per variant.

    ``curves``: rows of variant, context, kv_bytes, decode_time_s (:func:`lmcost.apps.kv.curves`).
    """
    go, make_subplots = _plotly()
    from plotly.colors import qualitative

    fig = make_subplots(rows=1, cols=2, subplot_titles=("KV cache (GB, 10^9 bytes)", "decode step time (ms)"))
    palette = qualitative.Plotly
    for i, (name, df) in enumerate(curves.groupby("variant", sort=False)):
        line = dict(color=palette[i % len(palette)], dash="solid" if i < len(palette) else "dot")
        fig.add_trace(go.Scatter(x=df.context, y=df.kv_bytes / 1e9, mode="lines", name=str(name), line=line,
                                 legendgroup=str(name)), row=1, col=1)
        fig.add_trace(go.Scatter(x=df.context, y=df.decode_time_s * 1e3, mode="lines", name=str(name), line=line,
                                 legendgroup=str(name), showlegend=False), row=1, col=2)
    fig.add_hline(y=free_bytes / 1e9, line_dash="dash", row=1, col=1,
                  annotation_text=f"free for KV: {free_bytes / 1e9:.1f} GB", annotation_position="top left")
    fig.update_xaxes(type="log", title_text="context (tokens)")
    fig.update_layout(title=title, template="plotly_white")
    return fig


def plan_figure(points: pd.DataFrame, front: pd.DataFrame, title: str, ttft_s=None, tpot_s=None):
    """The planner's points: tokens/s per user (x, log) against tokens/s per GPU (y, log), one colour per
    GPU and layout, the Pareto front as a line, the TPOT SLO as a vertical line (1/TPOT tokens/s per user).

    ``points``/``front``: :class:`lmcost.apps.plan.Plan`'s DataFrames.
    """
    go, _ = _plotly()
    fig = go.Figure()
    for (gpu, layout), df in points.groupby(["gpu", "layout"], sort=False):
        fig.add_trace(go.Scatter(
            x=df.tokens_per_s_per_user, y=df.tokens_per_s_per_gpu, mode="markers", name=f"{gpu} {layout}",
            marker=dict(size=6, symbol=["circle" if m else "circle-open" for m in df.meets_slo]),
            text=[f"batch {b}, TTFT {t * 1e3:.0f} ms, TPOT {p * 1e3:.1f} ms, {m / 1e9:.1f} GB/GPU"
                  for b, t, p, m in zip(df.batch, df.ttft_s, df.tpot_s, df.memory_per_gpu_bytes)],
            hovertemplate="%{text}<extra>%{fullData.name}</extra>"))
    fig.add_trace(go.Scatter(x=front.tokens_per_s_per_user, y=front.tokens_per_s_per_gpu, mode="lines",
                             name="Pareto front", line=dict(color="black", dash="dot")))
    x_axis = log_axis([*points.tokens_per_s_per_user, *([1.0 / tpot_s] if tpot_s else [])])
    if tpot_s:
        log_vline(fig, 1.0 / tpot_s, f"TPOT SLO {tpot_s * 1e3:g} ms", span=x_axis.get("range"))
    fig.update_xaxes(x_axis, title_text="tokens/s per user (1 / TPOT)")
    fig.update_yaxes(log_axis(points.tokens_per_s_per_gpu), title_text="tokens/s per GPU")
    fig.update_layout(title=title + (f"; TTFT SLO {ttft_s * 1e3:g} ms (open markers miss an SLO)" if ttft_s else ""),
                      template="plotly_white")
    return fig


def log_vline(fig, x: float, text: str | None = None, row: int | None = None, col: int | None = None,
              span: list[float] | None = None):
    """A dashed vertical line at ``x`` (> 0, data units) on a log x axis, labelled ``text`` at its top left.

    plotly.js places an annotation on a log axis at log10 of its ``x`` but a shape at ``x`` itself
    (plotly's reference for layout.annotations.x and layout.shapes.x0), and add_vline's annotation_text
    passes ``x`` to both: a line at b = 224 put its label at 10^224, stretching the axis there with
    hundreds of tick labels, and a line without text drew plotly's placeholder "new text". So the label
    is its own annotation at log10(x), and a line without text has none. ``span``: the axis' range (log10
    units, :func:`log_axis`): the label goes on the side of the line with more room (default: left).
    """
    fig.add_vline(x=x, line_dash="dash", row=row, col=col)
    if text:
        right = span is not None and math.log10(x) < sum(span) / 2
        fig.add_annotation(x=math.log10(x), xref="x", y=1, yref="y domain", text=text, showarrow=False,
                           xanchor="left" if right else "right", yanchor="top", font=dict(size=10), row=row, col=col)


def log_axis(values, pad: float = 0.08) -> dict:
    """A log axis over the positive finite ``values``: its range (log10 units, as plotly takes a log
    axis's range) padded by ``pad`` of its span each side (at least 0.05 decades), and its ticks: powers
    of ten where three or more lie within the values (every k-th one past 8, so labels never crowd),
    else 1, 2 and 5 times them (plotly's "D2": two powers of ten alone label too little). Fixed ranges keep a label (an annotation, a line's
    text) from stretching the axis past the data, as autorange does to make room for it.

    Returns: dict(type, range, dtick) for ``fig.update_xaxes``/``update_yaxes``; {"type": "log"}
    alone when no value is positive and finite.
    """
    import numpy as np

    v = np.asarray(values, dtype=float)
    v = np.log10(v[np.isfinite(v) & (v > 0)])
    if not len(v):
        return dict(type="log")
    lo, hi = float(v.min()), float(v.max())
    margin = max(pad * (hi - lo), 0.05)
    powers = math.floor(hi) - math.ceil(lo) + 1
    return dict(type="log", range=[lo - margin, hi + margin], dtick=math.ceil(powers / 8) if powers >= 3 else "D2")


def write_html(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as one offline HTML file: to a temporary file first, then moved into
    place, so a failure never leaves a half-written file. Raises: LmcostError if the folder is missing or
    refuses writes (permissions, a read-only or virtual file system)."""
    path = Path(path)
    check_name(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise LmcostError(shown(path), "the figure is written as HTML", "give a path ending in .html")
    if path.is_dir():
        raise LmcostError(shown(path), "is a folder", "give a file path ending in .html")
    return write_file(path, lambda tmp: fig.write_html(tmp, include_plotlyjs=True, full_html=True), suffix=".html")


def _roofs(fig, go, gpus: list, dtype: str, x_range: tuple[float, float]):
    """Per GPU: the roof min(bandwidth * x, peak[dtype]), a dashed ceiling for every other dtype, and
    the ridge point peak/bandwidth marked."""
    import numpy as np

    xs = np.geomspace(*x_range, 200)
    for i, g in enumerate(gpus):
        peak, colour = g.peak_flops(dtype), GPU_COLOURS[i % len(GPU_COLOURS)]
        fig.add_trace(go.Scatter(x=xs, y=np.minimum(g.bandwidth * xs, peak), mode="lines", name=f"{g.name} roof ({dtype})",
                                 line=dict(width=2, color=colour), hoverinfo="skip", legendgroup=g.name))
        ceilings: dict[float, list[str]] = {}  # dtypes of one peak share a line and a label (fp8, int8)
        for other, tflops in g.peak_tflops.items():
            if other != dtype:
                ceilings.setdefault(tflops, []).append(other)
        for tflops, names in ceilings.items():
            # Each ceiling is labelled at its right end instead of taking a legend entry (a dozen
            # of them overflowed the legend).
            label = ", ".join(names)
            fig.add_trace(go.Scatter(x=[g.ridge_point(dtype), x_range[1]], y=[tflops * 1e12] * 2, mode="lines+text",
                                     name=f"{g.name} {label} ceiling", line=dict(dash="dot", width=1, color=colour),
                                     text=["", label], textposition="top left", textfont=dict(size=9, color=colour),
                                     hoverinfo="name", showlegend=False, legendgroup=g.name))
        ridge = g.ridge_point(dtype)
        fig.add_trace(go.Scatter(x=[ridge], y=[peak], mode="markers+text", name=f"{g.name} ridge",
                                 marker=dict(symbol="diamond-open", size=12, color="black"),
                                 text=[f"ridge {ridge:.0f} FLOPs/B"], textposition="top left",
                                 hovertemplate=f"{g.name} ridge point: %{{x:.1f}} FLOPs/byte<extra></extra>",
                                 meta="ridge"))


#: One colour per operator class, the same in every figure (plotly's D3 palette).
CLASS_COLOURS = {"gemm": "#1f77b4", "attention": "#ff7f0e", "softmax": "#2ca02c", "norm": "#d62728",
                 "elementwise": "#9467bd", "embedding": "#8c564b", "lm_head": "#e377c2", "moe_routing": "#7f7f7f"}
#: Roof colours and point symbols per GPU, in the order the GPUs are given.
GPU_COLOURS = ["#000000", "#17becf", "#bcbd22", "#7f7f7f", "#8c564b"]
GPU_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "star"]


def class_colour(op_class: str) -> str:
    """The colour of an operator class in every figure."""
    return CLASS_COLOURS.get(op_class, "#333333")


def roofline_figure(points: pd.DataFrame, gpus: list, dtype: str, title: str, formulas: dict | None = None):
    """Log-log roofline: attainable FLOP/s against arithmetic intensity, one roof per GPU, and every
    operator class of each phase as a point at (FLOPs/bytes, FLOPs/time), sized by its share of the
    phase's time. Classes that move no bytes of their own (softmax fused into flash attention) have no
    finite intensity and are not drawn. Decode points of one class are joined across batch sizes.

    ``formulas``: optional {(phase, op_class): FLOPs formula} shown on hover.
    """
    import numpy as np

    go, _ = _plotly()
    pts = points[np.isfinite(points.arithmetic_intensity) & (points.bytes > 0) & (points.flops > 0)]
    lo = max(min(pts.arithmetic_intensity.min(), min(g.ridge_point(dtype) for g in gpus)) / 4, 1e-2)
    hi = max(pts.arithmetic_intensity.max(), max(g.ridge_point(dtype) for g in gpus)) * 4
    fig = go.Figure()
    _roofs(fig, go, gpus, dtype, (lo, hi))
    gpu_symbols = {g.name: GPU_SYMBOLS[i % len(GPU_SYMBOLS)] for i, g in enumerate(gpus)}
    for (gpu, phase, batch), df in pts.groupby(["gpu", "phase", "batch"], sort=False):
        hover = [f"<b>{r.op_class}</b> ({phase}, b={batch}, {gpu})<br>FLOPs {r.flops:.4g}<br>bytes {r.bytes:.4g}"
                 f"<br>time {r.time_s:.4g} s ({100 * r.time_share:.1f}% of {phase})"
                 f"<br>{r.arithmetic_intensity:.3g} FLOPs/byte, {r.achieved_flops_per_s:.4g} FLOP/s"
                 + (f"<br>FLOPs = {formulas[(phase, r.op_class)]}" if formulas and (phase, r.op_class) in formulas else "")
                 for r in df.itertuples()]
        # Colour: the operator class (the same in every trace); symbol: the GPU, filled for prefill and
        # open for decode; each point labelled with its class.
        symbol = gpu_symbols.get(gpu, "circle") + ("" if phase == "prefill" else "-open")
        colours = [class_colour(c) for c in df.op_class]
        fig.add_trace(go.Scatter(
            x=df.arithmetic_intensity, y=df.achieved_flops_per_s, mode="markers+text", name=f"{phase} b={batch} ({gpu})",
            marker=dict(symbol=symbol, size=6 + 40 * np.sqrt(df.time_share), color=colours,
                        line=dict(width=1 if phase == "prefill" else 2, color="black" if phase == "prefill" else colours)),
            text=list(df.op_class), textposition="top center", textfont=dict(size=9),
            hovertext=hover, hovertemplate="%{hovertext}<extra></extra>", customdata=df.op_class, meta="points"))
    for cls in dict.fromkeys(pts.op_class):  # a legend entry per class, in its colour
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=cls, legendgroup="classes",
                                 marker=dict(color=class_colour(cls), size=10), meta="class-legend"))
    dec = pts[pts.phase == "decode"]
    if dec.batch.nunique() > 1:
        for (gpu, cls), df in dec.groupby(["gpu", "op_class"], sort=False):
            df = df.sort_values("batch")
            fig.add_trace(go.Scatter(x=df.arithmetic_intensity, y=df.achieved_flops_per_s, mode="lines",
                                     line=dict(dash="dot", width=1, color="gray"), showlegend=False,
                                     hoverinfo="skip", meta="path"))
    comm = points[points.op_class == "communication"]
    if len(comm):  # collectives do no FLOPs: they have no place on a FLOPs roofline, so their share is said
        said = ", ".join(f"{100 * r.time_share:.1f}% of {r.phase} (b={r.batch}, {r.gpu})" for r in comm.itertuples())
        fig.add_annotation(text=f"communication, not drawn (no FLOPs): {said}", xref="paper", yref="paper",
                           x=0, y=1.02, showarrow=False, font=dict(size=10), xanchor="left")
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOPs/byte)")
    fig.update_yaxes(type="log", title_text="attainable FLOP/s")
    fig.update_layout(title=title, template="plotly_white", height=700,
                      legend=dict(orientation="h", yanchor="top", y=-0.15, xanchor="left", x=0, font=dict(size=10)))
    return fig


def sweep_figure(batch_df: pd.DataFrame, prompt_df: pd.DataFrame, title: str, critical: int | None = None):
    """Three panels: decode step time and tokens/s against batch size, prefill time against prompt
    length; one line per panel, each point coloured by what bounds its whole phase (memory or compute),
    the critical batch (where the decode GEMMs alone turn compute-bound) drawn and labelled as such:
    the whole step can stay memory-bound past it, its attention still streaming the KV cache (a critical
    batch outside the swept batches is said in the title only). Log axes are labelled at powers of ten
    only where their data spans three or more (:func:`log_axis`)."""
    go, make_subplots = _plotly()
    fig = make_subplots(rows=1, cols=3, subplot_titles=("decode step time (ms) vs batch", "decode tokens/s vs batch",
                                                        "prefill time (ms) vs prompt length"))
    colors = {"memory": "#1f77b4", "compute": "#d62728"}
    b = batch_df.sort_values("batch")
    p = prompt_df.sort_values("tokens")
    for col, x, y, df, name, symbol in ((1, b.batch, b.time_s * 1e3, b, "decode step", "circle"),
                                        (2, b.batch, b.tokens_per_s, b, "decode tokens/s", "circle"),
                                        (3, p.tokens, p.time_s * 1e3, p, "prefill", "square")):
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers+lines", name=name, showlegend=False,
                                 line=dict(color="#999999", width=1),
                                 marker=dict(color=[colors[str(v)] for v in df.bound], symbol=symbol, size=8)),
                      row=1, col=col)
    for bound, colour in colors.items():  # the legend: what the colours mean
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"whole phase {bound}-bound",
                                 marker=dict(color=colour, size=9)), row=1, col=1)
    for col, x, y in ((1, b.batch, b.time_s * 1e3), (2, b.batch, b.tokens_per_s), (3, p.tokens, p.time_s * 1e3)):
        fig.update_xaxes(log_axis(x), row=1, col=col)
        fig.update_yaxes(log_axis(y), row=1, col=col)
    if critical is not None and b.batch.min() <= critical <= b.batch.max():  # past the sweep: the title says it
        log_vline(fig, critical, f"decode GEMMs<br>compute-bound<br>from b = {critical}", row=1, col=1,
                  span=log_axis(b.batch).get("range"))
        log_vline(fig, critical, row=1, col=2)
    fig.update_xaxes(title_text="batch", row=1, col=1)
    fig.update_xaxes(title_text="batch", row=1, col=2)
    fig.update_xaxes(title_text="prompt tokens", row=1, col=3)
    fig.update_layout(title=title + (f"; decode GEMMs turn compute-bound at b = {critical}" if critical else ""),
                      template="plotly_white", height=450)
    return fig


def serve_sweep_figure(runs: list[dict], title: str, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None):
    """``lmcost serve --rates``: TTFT and TPOT (p50 and p99, ms; log y where they span a decade or more: past
    the knee they grow without bound) against the offered rate (requests/s; log x where the rates span more
    than a decade: ``1e-9,1,1e30`` on a linear axis puts every point but the last at 0), side by side, each SLO
    given as a dashed line across the rates. ``runs``: :func:`lmcost.apps.serve.summarize`'s dicts, one per
    rate, drawn by ascending rate (:func:`lmcost.output.serving.ascending`, as the table lists them)."""
    from lmcost.output.serving import ascending

    go, make_subplots = _plotly()
    runs = ascending(runs)
    x = [r["rate"] for r in runs]
    x_axis = log_axis(x) if x[-1] > 10 * x[0] else dict(type="linear")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT (ms) vs rate", "TPOT (ms) vs rate"))
    for col, key, slo in ((1, "ttft_s", slo_ttft_s), (2, "tpot_s", slo_tpot_s)):
        ys = []
        for q, dash in (("p50", "solid"), ("p99", "dash")):
            y = [None if r[key][q] is None else r[key][q] * 1e3 for r in runs]
            ys += y
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=f"{key[:4].upper()} {q}",
                                     line=dict(dash=dash), legendgroup=key), row=1, col=col)
        if slo is not None:
            ys.append(slo * 1e3)
            fig.add_trace(go.Scatter(x=[x[0], x[-1]], y=[slo * 1e3] * 2, mode="lines", line=dict(color="red", dash="dot"),
                                     name=f"{key[:4].upper()} SLO {slo * 1e3:g} ms", legendgroup=key), row=1, col=col)
        finite = [v for v in ys if v is not None and v > 0]
        wide = bool(finite) and max(finite) >= 10 * min(finite)  # log where a decade or more apart (the knee)
        fig.update_yaxes(log_axis(finite) if wide else dict(type="linear", rangemode="tozero"), title_text="ms",
                         row=1, col=col)
        fig.update_xaxes(x_axis, title_text="offered rate (requests/s)", row=1, col=col)
    saturated = [r["rate"] for r in runs if r["saturated"]]
    fig.update_layout(title=title + (f"; the queue grows from {saturated[0]:g} requests/s" if saturated else ""),
                      template="plotly_white", height=450)
    return fig


def serve_timeline_figure(timeline, title: str):
    """One ``lmcost serve`` run over time: the KV cache in use (% of capacity) above, the requests running
    and waiting below. ``timeline``: :class:`lmcost.apps.serve_sim.Trace`'s ``kv_timeline`` [samples, 4]
    (time s, KV fraction, waiting, running)."""
    go, make_subplots = _plotly()
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("KV cache in use (% of capacity)", "requests"))
    t = timeline[:, 0]
    fig.add_trace(go.Scatter(x=t, y=100 * timeline[:, 1], mode="lines", name="KV cache %"), row=1, col=1)
    fig.add_trace(go.Scatter(x=t, y=timeline[:, 3], mode="lines", name="running"), row=2, col=1)
    fig.add_trace(go.Scatter(x=t, y=timeline[:, 2], mode="lines", name="waiting"), row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_layout(title=title, template="plotly_white", height=550)
    return fig
