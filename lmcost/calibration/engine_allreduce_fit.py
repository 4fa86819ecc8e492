"""Fit the engines' own all-reduce (:mod:`lmcost.cost.engine_allreduce`) on aiconfigurator's measured
custom all-reduce tables (``lmcost/data/measurements/engine-collectives.csv``, rows whose ``engine`` is vllm,
sglang or trtllm; what they are: engine-collectives.md), and say what error it leaves held out.

Per (engine, NVLink generation): the one-shot and two-shot latencies (us) and the NVLink efficiency, by a
grid search minimising the mean |log(predicted / measured)| over the rows at or below the engine's switch-over
(:data:`lmcost.cost.engine_allreduce.MAX_BYTES`; above it the engine runs NCCL), each source (one parquet
file: one engine version on one GPU) weighted equally. Rows of GPUs with no shipped NVLink cluster (L40S,
RTX PRO 6000: PCIe; B300, GB300: no cluster) are kept in the table but not fitted.

Error: leave-one-source-out inside each (engine, generation): a source's rows are predicted from the other
versions and GPUs of that engine and generation. Band: the 5th and 95th percentiles of held-out
measured / predicted per engine.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from lmcost.basics.files import read_text
from lmcost.calibration.collective_fit import CLUSTER_OF, engine_table
from lmcost.calibration.measurements import MAX_TABLE_BYTES
from lmcost.cost.engine_allreduce import ENGINES, MAX_BYTES, RANKS, custom_time, one_shot

GRID_US = np.round(np.geomspace(1.0, 60.0, 61), 3)
GRID_EFF = np.round(np.arange(0.05, 1.0001, 0.01), 2)


@dataclass(frozen=True)
class EngineRow:
    """One measured engine all-reduce: ``row`` is its 1-based data row in the table."""

    row: int
    engine: str
    n: int
    size: float
    time_s: float
    source: str
    cluster: str
    generation: str
    link_bw: float


def load_engine_rows(clusters: dict, path=None) -> list[EngineRow]:
    """The engine rows of the table at or below the switch-over, on a shipped NVLink cluster's GPU."""
    text = read_text(path or engine_table(), MAX_TABLE_BYTES, "CSV of collective timings")
    out = []
    for i, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), 1):
        eng = (r.get("engine") or "").strip().lower()
        if eng not in ENGINES:
            continue
        t = f"{r['device']} {r['interconnect']}".lower()
        name = next((c for pat, c in CLUSTER_OF if pat in t), None)
        n, size = int(r["n_gpus"]), float(r["message_bytes"])
        if name is None or n not in RANKS or size > MAX_BYTES:
            continue
        c = clusters[name]
        if not c.intra.generation.startswith("nvlink"):
            continue
        out.append(EngineRow(i, eng, n, size, float(r["time_us"]) * 1e-6, r["source"], name, c.intra.generation,
                             c.intra.bandwidth))
    return out


def _loss(rows: list[EngineRow], one_shot_us, two_shot_us, efficiency):
    w = defaultdict(int)
    for r in rows:
        w[r.source] += 1
    total = 0.0
    for r in rows:
        lat = one_shot_us if one_shot(r.n, r.size) else two_shot_us
        t = custom_time(r.n, r.size, r.link_bw, 0.0, 0.0, efficiency) + lat * 1e-6
        total = total + np.abs(np.log(t / r.time_s)) / w[r.source]
    return total


def fit_group(rows: list[EngineRow]) -> dict:
    """one_shot_us, two_shot_us, efficiency fitted on ``rows`` (coordinate descent over grids)."""
    f = dict(one_shot_us=5.0, two_shot_us=10.0, efficiency=0.5)
    for _ in range(3):
        for k, grid in (("one_shot_us", GRID_US), ("two_shot_us", GRID_US), ("efficiency", GRID_EFF)):
            loss = np.broadcast_to(_loss(rows, **{**f, k: grid}), grid.shape)
            f[k] = float(grid[int(np.argmin(loss))])
    return f


def _predict(r: EngineRow, f: dict) -> float:
    return custom_time(r.n, r.size, r.link_bw, f["one_shot_us"], f["two_shot_us"], f["efficiency"])


@dataclass
class EngineReport:
    """Fitted figures per (engine, generation), the rows, and each row's held-out prediction."""

    figures: dict  # (engine, generation) -> figures
    rows_of: dict  # (engine, generation) -> rows
    held_out: list  # (row, predicted_s)

    def errors(self) -> list[dict]:
        """Per engine and size band (< 1 MB, >= 1 MB): rows, median |error| held out, band coverage."""
        out = []
        for eng in ENGINES:
            lo, hi = self.band(eng)
            for band, keep in (("<1MB", lambda s: s < 1e6), (">=1MB", lambda s: s >= 1e6)):
                q = [r.time_s / t for r, t in self.held_out if r.engine == eng and keep(r.size)]
                if q:
                    q = np.array(q)
                    out.append(dict(engine=eng, band=band, rows=len(q), median_abs_error=float(np.median(np.abs(1 / q - 1))),
                                    coverage=float(np.mean((q >= lo) & (q <= hi)))))
        return out

    def band(self, engine: str) -> tuple[float, float]:
        """5th and 95th percentiles of held-out measured / predicted of ``engine`` (clipped to contain 1)."""
        q = [r.time_s / t for r, t in self.held_out if r.engine == engine]
        if not q:
            return (1.0, 1.0)
        lo, hi = np.percentile(q, [5, 95])
        return (round(min(1.0, float(lo)), 3), round(max(1.0, float(hi)), 3))


def run_engines(clusters: dict, path=None) -> EngineReport:
    """Fit every (engine, generation) on all its rows, and each source held out."""
    rows = load_engine_rows(clusters, path)
    groups = defaultdict(list)
    for r in rows:
        groups[(r.engine, r.generation)].append(r)
    figures, held = {}, []
    for key, rs in groups.items():
        figures[key] = fit_group(rs)
        for s in sorted({r.source for r in rs}):
            rest = [r for r in rs if r.source != s]
            if not rest:
                continue
            f = fit_group(rest)
            held += [(r, _predict(r, f)) for r in rs if r.source == s]
    return EngineReport(figures, dict(groups), held)


def engines_block(generation: str, report: EngineReport) -> dict:
    """The ``collectives.engines`` block of a cluster of NVLink ``generation`` (empty without rows)."""
    out = {}
    for eng in ENGINES:
        f = report.figures.get((eng, generation))
        if f is None:
            continue
        rows = report.rows_of[(eng, generation)]
        srcs = sorted({r.source.split(": ")[-1] for r in rows})
        out[eng] = dict(one_shot_us=round(f["one_shot_us"], 3), two_shot_us=round(f["two_shot_us"], 3),
                        efficiency=round(f["efficiency"], 2), max_mb=MAX_BYTES / 2**20, band=list(report.band(eng)),
                        rows=f"fitted on {len(rows)} {generation} rows <= 8 MiB of engine-collectives.csv: {'; '.join(srcs)}")
    return out
