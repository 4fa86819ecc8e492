"""Figures of the serving engines' memory-bound kernel designs, fitted on this project's H200 sweep.

The rows (``lmcost/data/measurements/gpu-kernels-h200.csv``: ``benchmarks/gpu_kernels.py --set v2`` on the lent
H200, profiler kernel durations, the engine designs timed twice) time each design over 9-10 row widths and 10
token counts (1 to 32,768). A one-block-per-row kernel takes longer for a few wide rows than the
per-call floor plus bytes at bandwidth predict: a block walks its row in ``width / blockDim`` dependent steps.
The sweep shows it (vLLM's scalar ``rms_norm`` design at one token: 1.6 us at width 1024, 2.9 at 4096, 4.5 at 8192,
7.8 at 16,384), so each design is fitted as

    t = overhead + row_ns * width + bytes / (f * BW),   never below the roofline,

(:class:`lmcost.hardware.engine_memory.RowKindFigures`; bytes as ``lmcost op`` counts them, BW the H200's datasheet
4.8 TB/s) by grid search on the mean |log(pred / meas)| (the public fit's loss,
:mod:`lmcost.calibration.efficiency_fit`). Held out: leave one width out (every width's rows predicted by the
fit on the other widths); a design's band is the 5th-95th percentile of those held-out ratios
(:data:`lmcost.calibration.efficiency_fit.BAND_PCT`).
"""

from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.calibration.efficiency_fit import BAND_PCT, BW_GRID
from lmcost.cost import kernels as K
from lmcost.hardware.engine_memory import RowKindFigures
from lmcost.hardware.gpu import load_gpu

#: Each design and the sweep rows that time it: (op, implementation, residual: the fused add + norm's bytes).
DESIGN_ROWS = {
    "rows-scalar-norm": ("rmsnorm", "engine-cuda", False),
    "rows-vec8-norm": ("rmsnorm", "engine-cuda-fused-add", True),
    "rows-scalar-act": ("silu_mul", "engine-cuda", False),
    "rows-scalar-rope": ("rope", "engine-cuda", False),
    "vector-act": ("silu_mul", "triton", False),
    "vector-rope": ("rope", "triton", False),
}
#: Below this fraction of bandwidth a design counts as latency-bound (:class:`RowKindFigures`): the vectorized
#: designs move the same bytes on the same GPU at 0.80-0.86 of it, so a design far under that is held back by
#: the bytes its blocks keep in flight, not by the DRAM.
LATENCY_BOUND_BELOW = 0.6
#: The vectorized design doing the same work as each scalar one: a latency-bound design's rate on another GPU
#: is capped at its counterpart's fraction of bandwidth (:attr:`RowKindFigures.bandwidth_cap`): where the DRAM,
#: not the bytes in flight, is the limit (a GPU of little bandwidth per SM), the scalar kernel streams no faster
#: than the vectorized one does.
COUNTERPART = {"rows-scalar-norm": "rows-vec8-norm", "rows-scalar-act": "vector-act", "rows-scalar-rope": "vector-rope"}
#: Columns the fit reads (benchmarks/gpu_kernels.py's CSV).
NEEDED_COLUMNS = ("op", "implementation", "status", "tokens", "hidden", "width", "heads_q", "heads_kv", "head_dim", "time_us")
#: Grids searched: per-call overhead (us) and per-row-element latency (ns); fractions as the public fit's.
OVERHEAD_GRID_US = np.round(np.arange(0.0, 8.0001, 0.25), 2)
ROW_GRID_NS = np.round(np.arange(0.0, 2.0001, 0.02), 2)


def sweep_table() -> Path:
    """The shipped sweep (``lmcost/data/measurements/gpu-kernels-h200.csv``)."""
    return Path(__file__).resolve().parent.parent / "data" / "measurements" / "gpu-kernels-h200.csv"


@dataclass
class DesignRows:
    """One design's rows as arrays: bytes, row width (elements), roofline (s), measured (s)."""

    design: str
    bytes_: np.ndarray
    width: np.ndarray
    roof: np.ndarray
    meas: np.ndarray


def _ops(op: str, row: dict, residual: bool, where: str):
    g = lambda k: int(row[k])  # noqa: E731
    try:
        if op in ("rmsnorm", "layernorm"):
            return K.norm(op, g("tokens"), g("hidden"), "bf16", bias=op == "layernorm", residual=residual)
        if op == "silu_mul":
            return K.elementwise("silu_mul", g("tokens"), g("width"), dtype="bf16")
        return K.elementwise("rope", g("tokens"), None, g("heads_q"), g("heads_kv"), g("head_dim"), dtype="bf16")
    except (KeyError, ValueError, TypeError) as e:
        raise LmcostError(f"{where}", f"malformed row ({type(e).__name__}: {e})", "regenerate the sweep table") from None
    except LmcostError as e:  # a size out of range: name the row, not a flag of another command
        raise LmcostError(f"{where}: {e.field.lstrip('-')}", e.what, "regenerate the sweep table") from None


def _time_s(row: dict, where: str) -> float:
    """The row's measured time (s), finite and positive. Raises: LmcostError naming the row."""
    try:
        t = float(row["time_us"]) * 1e-6
    except (KeyError, ValueError, TypeError):
        raise LmcostError(f"{where}: time_us", f"missing or not a number ({str(row.get('time_us'))[:20]!r})",
                          "regenerate the sweep table") from None
    if not (t > 0 and np.isfinite(t)):
        raise LmcostError(f"{where}: time_us", f"must be a positive time, got {row['time_us']}", "regenerate the sweep table")
    return t


def load_designs(path: str | Path | None = None) -> dict[str, DesignRows]:
    """Every design's rows of the sweep table (default :func:`sweep_table`), on the shipped H200.

    Raises: LmcostError for an unreadable table, a malformed row or a design without rows."""
    if path is not None and not str(path).strip():
        raise LmcostError("table", "empty", "give a CSV path, or leave it out for the shipped sweep")
    path = Path(path or sweep_table())
    gpu = load_gpu("h200")
    acc = {d: ([], [], [], []) for d in DESIGN_ROWS}
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as e:
        raise LmcostError("table", f"cannot read {path} ({e.strerror})", "give a readable CSV") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise LmcostError("table", f"{path.name} is not a CSV ({type(e).__name__})", "give the sweep CSV") from None
    missing = [c for c in NEEDED_COLUMNS if rows and c not in rows[0]]
    if not rows or missing:
        raise LmcostError("table", f"{path.name} has no rows" if not rows else f"{path.name} lacks columns {', '.join(missing)}",
                          "give the H200 sweep of the engines' kernel designs (benchmarks/gpu_kernels.py, its second set)")
    for i, row in enumerate(rows, start=2):
        if None in row or None in row.values():  # csv.DictReader: more fields than the header, or fewer
            raise LmcostError(f"{path.name} line {i}", "its fields do not match the header (a row cut off or run on)",
                              "regenerate the sweep table")
        if row.get("status") != "ok":
            continue
        for d, (op, impl, residual) in DESIGN_ROWS.items():
            if row.get("op") == op and row.get("implementation") == impl:
                (o,) = _ops(op, row, residual, f"{path.name} line {i}")
                t = _time_s(row, f"{path.name} line {i}")
                b, w, r, m = acc[d]
                b.append(float(o.bytes))
                w.append(float(o.row_width))
                r.append(float(o.bytes) / gpu.bandwidth)
                m.append(t)
    out = {}
    for d, (b, w, r, m) in acc.items():
        if not b:
            raise LmcostError("table", f"no rows of design {d} ({DESIGN_ROWS[d][0]} {DESIGN_ROWS[d][1]})",
                              "give the H200 sweep of the engines' kernel designs (benchmarks/gpu_kernels.py, its second set)")
        out[d] = DesignRows(d, np.array(b), np.array(w), np.array(r), np.array(m))
    return out


def predict(fig: RowKindFigures, bandwidth: float, bytes_, width, roof):
    """Seconds of each row under ``fig``: overhead + row_ns * width + bytes / (f * BW), never below the roofline
    (:func:`lmcost.cost.timing.op_statics` and :func:`lmcost.cost.efficiency.expected_times` for one kernel)."""
    t = fig.overhead_us * 1e-6 + fig.row_ns * 1e-9 * width + bytes_ / (fig.fraction_on(bandwidth, fig.fit_sm_count) * bandwidth)
    return np.maximum(t, roof)


def fit_design(rows: DesignRows, bandwidth: float, note: str = "", sm_count: int = 132) -> RowKindFigures:
    """The (f, overhead, row_ns) of the grids with the least mean |log(pred / meas)| on ``rows``, measured on a GPU
    of ``bandwidth`` (B/s) and ``sm_count`` SMs (the H200's: 4.8 TB/s, 132)."""
    best = (np.inf, None)
    mem = rows.bytes_[None, :] / (BW_GRID[:, None] * bandwidth)           # [f, rows]
    for c in ROW_GRID_NS:
        base = c * 1e-9 * rows.width[None, None, :] + mem[:, None, :]      # [f, 1, rows]
        pred = np.maximum(OVERHEAD_GRID_US[None, :, None] * 1e-6 + base, rows.roof)
        loss = np.mean(np.abs(np.log(pred / rows.meas)), axis=-1)          # [f, ov]
        i = np.unravel_index(int(np.argmin(loss)), loss.shape)
        if loss[i] < best[0]:
            best = (loss[i], (float(BW_GRID[i[0]]), float(OVERHEAD_GRID_US[i[1]]), float(c)))
    f, ov, c = best[1]
    return RowKindFigures(bandwidth_fraction=f, overhead_us=ov, row_ns=c, rows=note,
                          latency_bound=f < LATENCY_BOUND_BELOW, fit_bandwidth_tb_s=bandwidth / 1e12,
                          fit_sm_count=sm_count)


def leave_one_width_out(rows: DesignRows, bandwidth: float) -> np.ndarray:
    """Measured / predicted of every row, each width's rows predicted by the fit on the other widths."""
    ratios = np.empty_like(rows.meas)
    for w in np.unique(rows.width):
        test = rows.width == w
        train = DesignRows(rows.design, rows.bytes_[~test], rows.width[~test], rows.roof[~test], rows.meas[~test])
        fig = fit_design(train, bandwidth)
        ratios[test] = rows.meas[test] / predict(fig, bandwidth, rows.bytes_[test], rows.width[test], rows.roof[test])
    return ratios


@dataclass
class MemoryFit:
    """Per design: figures (fitted on all its rows), held-out ratios (leave one width out), in-sample ratios."""

    figures: dict
    held_out: dict
    in_sample: dict
    table: str
    digest: str


def fit_memory_kernels(path: str | Path | None = None) -> MemoryFit:
    """Fit every design of :data:`DESIGN_ROWS` on the sweep table (default the shipped one).

    Raises: LmcostError as :func:`load_designs`."""
    path = Path(path or sweep_table())
    designs = load_designs(path)
    gpu = load_gpu("h200")
    bw, sms = gpu.bandwidth, gpu.efficiency.gemm.sm_count
    figs, held, ins = {}, {}, {}
    for d, rows in designs.items():
        op, impl, _ = DESIGN_ROWS[d]
        figs[d] = fit_design(rows, bw, f"{path.name}: {len(rows.meas)} rows of {op} {impl} (H200)", sms)
        held[d] = leave_one_width_out(rows, bw)
        ins[d] = rows.meas / predict(figs[d], bw, rows.bytes_, rows.width, rows.roof)
    for d, other in COUNTERPART.items():  # fitted on the H200, where each stays under its cap
        if figs[d].latency_bound:
            figs[d] = figs[d].model_copy(update={"bandwidth_cap": figs[other].bandwidth_fraction})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return MemoryFit(figs, held, ins, path.name, digest)


def median_error(ratios) -> float:
    """Median |predicted / measured - 1| of measured / predicted ratios."""
    return float(np.median(np.abs(1.0 / np.asarray(ratios) - 1.0)))


def summary_rows(f: MemoryFit) -> list[dict]:
    """Per design: rows, the figures, held-out and in-sample median errors, held-out band and its coverage."""
    out = []
    for d, fig in f.figures.items():
        lo, hi = np.percentile(f.held_out[d], BAND_PCT)
        out.append(dict(design=d, rows=len(f.held_out[d]), bandwidth_fraction=fig.bandwidth_fraction,
                        overhead_us=fig.overhead_us, row_ns=fig.row_ns, held_out=median_error(f.held_out[d]),
                        in_sample=median_error(f.in_sample[d]), band=(float(lo), float(hi))))
    return out


def figures_yaml(f: MemoryFit) -> dict:
    """The mapping ``lmcost/data/engine-memory-kernels.yaml`` holds (:mod:`lmcost.hardware.engine_memory`)."""
    rows = summary_rows(f)
    return dict(
        source=f"lmcost fit --memory-kernels on lmcost/data/measurements/{f.table} (sha256 {f.digest}): kernel "
               "durations on the lent H200; t = overhead + row_ns * width + bytes / (f * BW), f of a latency-bound "
               "design scaled to another GPU by SMs and bandwidth (RowKindFigures.fraction_on)",
        designs={r["design"]: dict(bandwidth_fraction=r["bandwidth_fraction"], overhead_us=r["overhead_us"],
                                   row_ns=r["row_ns"], latency_bound=f.figures[r["design"]].latency_bound,
                                   bandwidth_cap=f.figures[r["design"]].bandwidth_cap,
                                   fit_bandwidth_tb_s=f.figures[r["design"]].fit_bandwidth_tb_s,
                                   fit_sm_count=f.figures[r["design"]].fit_sm_count, rows=f.figures[r["design"]].rows)
                 for r in rows},
        bands={r["design"]: [round(r["band"][0], 3), round(r["band"][1], 3)] for r in rows},
        held_out_median_abs_error_pct={r["design"]: round(100 * r["held_out"], 1) for r in rows},
        in_sample_median_abs_error_pct={r["design"]: round(100 * r["in_sample"], 1) for r in rows},
    )
