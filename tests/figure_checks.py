"""What a plotly figure draws, read from its JSON (no browser), and the checks every figure must pass.

:func:`drawn` gives the same shape that tests/test_roofline_report.py's browser probe reads back from a
rendered page (plotly.js's ``_fullLayout`` and the tick labels in the SVG): per axis its type, its range
(log10 units on a log axis, as plotly keeps it), the extent of its data and its tick labels; and the
annotations. :func:`problems` judges either one. The checks came from issue 24: on an H200 the report's
batch sweeps ran their x axis to 1e224 (a line's label at log10 units' x on a log axis), with 241 tick
labels overlapping 3,594 times and plotly's placeholder "new text" (an annotation without text).
"""

from __future__ import annotations

import math

#: The most tick labels one axis may carry (a 350-pixel panel holds about a dozen short ones).
MAX_TICKS = 12
#: How far past its data an axis may run, as a share of the data's span (plotly pads markers and text
#: by a few pixels: 8% of the span at most in the shipped figures).
MARGIN = 0.25
#: ... and at least this much, in axis units (decades on a log axis).
MIN_MARGIN = 0.5


def _axis_ids(layout: dict) -> dict[str, str]:
    """{layout key ('xaxis2'): axis id ('x2')} of every axis in a figure's layout."""
    return {k: k[0] + k[5:] for k in layout if k[:5] in ("xaxis", "yaxis")}


def _finite(values, log: bool) -> list[float]:
    out = []
    for v in values if values is not None else []:
        if v is None or isinstance(v, str):
            continue
        v = float(v)
        if math.isfinite(v) and (v > 0 or not log):
            out.append(math.log10(v) if log else v)
    return out


def _ticks(axis: dict, lo: float, hi: float) -> int | None:
    """The tick labels plotly draws on [lo, hi] for a set ``dtick`` (None: plotly's own choice)."""
    d = axis.get("dtick")
    if axis.get("type") == "log" and d in ("D1", "D2"):
        per = 9 if d == "D1" else 3  # D1: every digit; D2: 1, 2 and 5 times each power of ten
        return sum(1 for k in range(math.floor(lo), math.ceil(hi) + 1)
                   for m in ((1, 2, 3, 4, 5, 6, 7, 8, 9) if per == 9 else (1, 2, 5)) if lo <= k + math.log10(m) <= hi)
    if isinstance(d, (int, float)) and d > 0:
        return math.floor(hi / d) - math.ceil(lo / d) + 1
    return None


def drawn(fig) -> dict:
    """What ``fig`` draws, from its JSON: {"axes": {id: {type, range, data, ticks}}, "annotations": [...]}.

    ``data``: [min, max] of the traces and shapes on the axis (log10 on a log axis; shapes are placed in
    data units there, annotations in log10 units: plotly's reference for layout.shapes and
    layout.annotations); ``range``: the layout's, else the one autorange takes (data and annotations);
    ``ticks``: the labels a set dtick gives (None: plotly's own choice, about 6-10 per axis).
    """
    layout = fig.layout.to_plotly_json()  # the traces stay objects: their JSON packs arrays as base64
    out = {}
    for key, aid in _axis_ids(layout).items():
        axis, letter = layout[key], aid[0]
        log = axis.get("type") == "log"
        data = []
        for tr in fig.data:
            if (tr[letter + "axis"] or letter) == aid:
                data += _finite(tr[letter], log)
        for sh in layout.get("shapes", []):
            if sh.get(letter + "ref", letter) == aid:
                data += _finite([sh.get(letter + "0"), sh.get(letter + "1")], log)
        placed = [float(a[letter]) for a in layout.get("annotations", [])
                  if a.get(letter + "ref") == aid and a.get(letter) is not None]
        extent = [min(data), max(data)] if data else None
        rng = axis.get("range")
        if rng is None and (data or placed):
            rng = [min(data + placed), max(data + placed)]
        out[aid] = dict(type=axis.get("type", "linear"), range=rng, data=extent,
                        ticks=_ticks(axis, *rng) if rng else None)
    anns = [dict(text=a.get("text"), x=a.get("x"), y=a.get("y"), xref=a.get("xref", "x"), yref=a.get("yref", "y"))
            for a in layout.get("annotations", [])]
    return dict(axes=out, annotations=anns)


def problems(seen: dict, max_ticks: int = MAX_TICKS) -> list[str]:
    """What is wrong in ``seen`` (:func:`drawn`, or the browser probe's read-back): an annotation without
    text or with plotly's placeholder; an annotation on an axis outside its range; an axis running past
    its data by more than MARGIN of the data's span (MIN_MARGIN at least); more than ``max_ticks`` tick
    labels on an axis, fewer than two where the ticks are counted, or overlapping ones (browser only).
    """
    out = []
    axes = seen["axes"]
    for a in seen["annotations"]:
        text = (a.get("text") or "").strip()
        if not text or text.lower() == "new text":
            out.append(f"annotation without text at {a}")
        for letter in "xy":
            ref, v = (a.get(letter + "ref") or ""), a.get(letter)
            aid = ref.split(" ")[0]
            if ref.endswith(" domain") and v is not None and not -0.01 <= v <= 1.01:
                out.append(f"annotation {text!r} at {letter} = {v}, outside its axis' domain")
            elif ref in axes and axes[ref]["range"] is not None and v is not None:
                lo, hi = sorted(axes[ref]["range"])
                if not lo - 1e-9 <= v <= hi + 1e-9:
                    out.append(f"annotation {text!r} at {letter} = {v} on {aid}, outside its range [{lo:.3g}, {hi:.3g}]")
    for aid, ax in axes.items():
        if ax["range"] is None or ax["data"] is None:
            continue
        lo, hi = sorted(ax["range"])
        dlo, dhi = ax["data"]
        margin = max(MARGIN * (dhi - dlo), MIN_MARGIN)
        if lo < dlo - margin or hi > dhi + margin:
            out.append(f"axis {aid} runs over [{lo:.3g}, {hi:.3g}], its data over [{dlo:.3g}, {dhi:.3g}]"
                       + (" (log10)" if ax["type"] == "log" else ""))
        if ax["type"] == "log" and ax["ticks"] is None and hi - lo > max_ticks:
            out.append(f"axis {aid} spans {hi - lo:.0f} decades with plotly's own ticks")
        if ax["ticks"] is not None and not 2 <= ax["ticks"] <= max_ticks:
            out.append(f"axis {aid} has {ax['ticks']} tick labels (2 to {max_ticks} read)")
        if ax.get("overlaps"):
            out.append(f"axis {aid}: {ax['overlaps']} pairs of tick labels overlap")
    return out
