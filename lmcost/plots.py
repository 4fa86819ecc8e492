"""Plotly figures, written as self-contained HTML (plotly.js inlined: opens offline).

plotly is imported here only; a missing install is a one-line error naming the extra to install.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd

from .errors import LmcostError


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise LmcostError("--plot", "plotly is not installed", "pip install 'lmcost[plot]'") from None
    return go, make_subplots


def kv_figure(curves: pd.DataFrame, free_bytes: float, title: str):
    """Two panels over context length (log x): KV-cache GB per variant with the memory left for the
    cache drawn as a horizontal line; and one decode step's time per variant.

    ``curves``: rows of variant, context, kv_bytes, decode_time_s (:func:`lmcost.kvcompare.curves`).
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


def write_html(fig, path: str | Path) -> Path:
    """Write ``fig`` to ``path`` as one offline HTML file: to a temporary file first, then moved into
    place, so a failure never leaves a half-written file. Raises: LmcostError if the folder is missing."""
    path = Path(path)
    if not path.parent.is_dir():
        raise LmcostError("--plot", f"folder {path.parent} does not exist", "create it or pick another path")
    fd, tmp = tempfile.mkstemp(suffix=".html", dir=path.parent)
    os.close(fd)
    try:
        fig.write_html(tmp, include_plotlyjs=True, full_html=True)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
