"""Fit the collective time model (:mod:`lmcost.cost.collectives`) on published nccl-tests figures, and say what
error it leaves on sources it was not fitted on.

Fitting set: ``lmcost/data/measurements/collective-measurements.csv`` and the NCCL rows of
``engine-collectives.csv`` at or above :data:`SMALL_BYTES` (:func:`shipped_rows`; or ``--table`` alone), one
row per (collective, ranks, nodes, device, payload) with its source. Each row is matched to a shipped cluster
(:data:`CLUSTER_OF`, by the device and interconnect it names) and its time taken from ``time_us``, else
from ``algbw`` or ``busbw`` (nccl-tests' definitions). Where a row's notes say which algorithm NCCL ran
(``NCCL_NVLS_ENABLE=0``, ``NCCL_ALGO=NVLS``, "picked Ring", ``nvlstree``) only that algorithm's
protocols are candidates for it.

Figures, fitted by coordinate descent over grids minimising the mean |log(predicted / measured)|, each
source weighted equally:
- per node-fabric generation (nvlink3, nvlink4, ...), on single-node rows: ring and NVLS bandwidth
  efficiency, LL's fraction of Simple's bandwidth, and a scale on NCCL's ring and NVLS latencies;
  point-to-point efficiency on send/recv rows (a generation without them takes its ring efficiency x
  the p2p/ring ratio fitted where both are measured; :data:`P2P_RATIO_PRIOR` where none is);
  all-to-all rows are evaluated, not fitted on;
  NCCL's latency scales are fitted on a generation's published rows where it has any (aiconfigurator's
  harness times NCCL's latency lower than nccl-tests), its bandwidth figures on all its rows;
- per network kind (gpudirect-tcpxo, efa, ...), on multi-node rows: efficiency, latency scale and the network
  pipeline fill; a kind without rows takes those fitted on every multi-node row together (:data:`POOLED`).
Figures no row constrains keep their priors (:data:`PRIORS`); a generation without rows takes the
nearest measured generation's (:data:`FALLBACK`).

Error: leave-one-source-out. Each source's rows are predicted by the model fitted on all other sources;
the median |error| is reported per device and regime (latency: the latency term of the predicted time
is the larger; bandwidth otherwise); the bands are the 5th and 95th percentiles of held-out
measured / predicted, per regime.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmcost.basics import shipped as resources
from lmcost.basics.files import read_text
from lmcost.calibration.measurements import MAX_TABLE_BYTES
from lmcost.hardware.cluster import Cluster, list_clusters
from lmcost.cost.collectives import bus_factor, candidates, evaluate
from lmcost.basics.errors import LmcostError

TABLE = "collective-measurements.csv"
#: aiconfigurator's nccl-tests and engine all-reduce tables, converted (engine-collectives.md); its NCCL rows
#: are fitted on with the published ones, its engine rows by lmcost.calibration.engine_allreduce_fit.
ENGINE_TABLE = "engine-collectives.csv"
SMALL_BYTES = 2**20
#: Priors, cited: efficiencies of NVLink rings (~0.78 of 300 GB/s reached by A100 nccl-tests all_reduce,
#: NVIDIA DGX A100 user guide's expected busbw ~230 GB/s), NVLS 0.6, LL 1/4 of Simple's bandwidth and
#: LL128 120/128 (NCCL src/graph/tuning.cc), latency scale 1 (NCCL's own latency table), networks at
#: 0.92 of line rate (the share of an NDR/HDR link that nccl-tests busbw reaches on DGX SuperPODs).
PRIORS = dict(ring=0.78, nvls=0.6, p2p=0.66, ll=0.25, fill_mb=4.0, ring_latency_scale=1.0, nvls_latency_scale=1.0,
              p2p_latency_scale=1.0, p2p_fill_mb=0.5, net_latency_scale=1.0, net_efficiency=0.92, net_fill_mb=0.0)
P2P_RATIO_PRIOR = 0.85
#: Loss (mean |log ratio| summed over sources) a figure must gain to leave its prior or current value.
MIN_GAIN = 1e-3
INTRA_KEYS = ("ring", "nvls", "fill_mb", ("ll", "ring_latency_scale"), "nvls_latency_scale", "p2p")
BW_KEYS = ("ring", "nvls", "fill_mb")
LAT_KEYS = (("ll", "ring_latency_scale"), "nvls_latency_scale")
#: The source prefix of the rows converted from aiconfigurator (engine-collectives.csv).
AIC = "aiconfigurator-core"
NET_KEYS = ("net_efficiency", "net_latency_scale", "net_fill_mb")
#: The network figures a kind without rows of its own takes: those fitted on every multi-node row together.
POOLED = "*"
#: A generation without rows of its own takes these (the next-older NVLink with the same algorithms).
FALLBACK = {"nvlink5": "nvlink4", "nvlink4-bridge": "nvlink4"}
GRIDS = {k: np.round(np.arange(0.05, 1.0001, 0.01), 2) for k in ("ring", "nvls", "p2p", "ll", "net_efficiency")}
#: LL carries 4 data bytes in each 8-byte line (a flag in the other 4): at most half of Simple's bandwidth.
GRIDS["ll"] = np.round(np.arange(0.05, 0.5001, 0.01), 2)
GRIDS["fill_mb"] = np.round(np.concatenate([[0.0], np.geomspace(0.25, 64, 41)]), 3)
GRIDS["net_fill_mb"] = np.round(np.concatenate([[0.0], np.geomspace(0.25, 1024, 49)]), 3)
GRIDS.update({k: np.round(np.geomspace(0.2, 30, 61), 3) for k in ("ring_latency_scale", "nvls_latency_scale", "net_latency_scale")})

#: The shipped cluster a row was measured on, by the first pattern (lower case) in its device +
#: interconnect text.
CLUSTER_OF = [("gb200", "gb200-nvl72"), ("b200", "dgx-b200"), ("h100 pcie", "h100-pcie-pair"), ("azure nd a100 v4", "azure-nd-a100-v4"),
              ("azure nd h100 v5", "azure-nd-h100-v5"), ("azure nd h200 v5", "azure-nd-h200-v5"),
              ("p5en", "aws-p5en"), ("a3 mega", "gcp-a3-mega"), ("a100", "dgx-a100"), ("h200", "hgx-h200"),
              ("h100", "dgx-h100")]
KIND_OF = {"all_reduce": "all_reduce", "allreduce": "all_reduce", "all_gather": "all_gather", "allgather": "all_gather",
           "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter", "alltoall": "all_to_all",
           "all_to_all": "all_to_all", "sendrecv": "send_recv", "send_recv": "send_recv", "broadcast": "broadcast"}


@dataclass(frozen=True)
class Row:
    """One measured collective: ``row`` is its 1-based data row in the table."""

    row: int
    kind: str
    n: int
    nodes: int
    size: float
    time_s: float
    source: str
    cluster: str
    forced: tuple[str, ...] | None
    device: str


def public_table() -> Path:
    """The shipped table of published collective timings."""
    return resources.folder("measurements") / TABLE


def engine_table() -> Path:
    """The shipped table of aiconfigurator's NCCL and engine all-reduce timings (engine-collectives.md)."""
    return resources.folder("measurements") / ENGINE_TABLE


def shipped_name() -> str:
    """The name the fitted blocks give the two shipped tables together."""
    return f"{TABLE} + {ENGINE_TABLE}"


def shipped_digest() -> str:
    """sha256 (first 12 hex digits) of the two shipped tables' bytes, one after the other."""
    import hashlib

    from lmcost.basics.files import MAX_TRACE_BYTES, read_bytes

    h = hashlib.sha256()
    for p in (public_table(), engine_table()):
        h.update(read_bytes(p, MAX_TRACE_BYTES, "table"))
    return h.hexdigest()[:12]


def shipped_rows() -> tuple[list[Row], list[tuple[int, str]]]:
    """The NCCL rows of both shipped tables (published, then aiconfigurator's), and those skipped."""
    a, sa = load_rows(public_table())
    b, sb = load_rows(engine_table())
    # aiconfigurator's harness times a small all-reduce at about half what nccl-tests prints on the same GPU
    # (A100 SXM, 8 GPUs, 1 KiB: 21.8 us against 44.8 us in Azure's nccl-tests run): its rows below
    # SMALL_BYTES would pull NCCL's latency below what nccl-tests measures, so only the rest are fitted on.
    small = [(r.row, f"aiconfigurator row below {SMALL_BYTES} B: its harness times NCCL's latency below nccl-tests'")
             for r in b if r.size < SMALL_BYTES]
    return a + [r for r in b if r.size >= SMALL_BYTES], sa + sb + small


def _forced(notes: str, nvls: bool, size: float) -> tuple[str, ...] | None:
    t = notes.lower()
    if "ring/ll <=1mib" in t and "nvls/simple from 2mib" in t:  # what the run printed NCCL picked, by size
        return ("ring",) if size <= 2**20 else ("nvls",)
    if "nvlstree" in t:
        return ("nvls_tree",)
    if "nvls_enable=0" in t or "picked ring" in t or "algo ring" in t or "nccl_algo=ring" in t:
        return ("ring",)
    if nvls and ("picked nvls" in t or "algo nvls" in t or "nvls_enable=1" in t or "nccl_algo=nvls" in t):
        return ("nvls",)
    return None


def _num(v: str):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def load_rows(path: Path) -> tuple[list[Row], list[tuple[int, str]]]:
    """The rows of a collective table lmcost can fit, and (row, why) for those it cannot.

    Raises: LmcostError if the file cannot be read or lacks a column.
    """
    text = read_text(path, MAX_TABLE_BYTES, "CSV of collective timings")  # a spreadsheet's byte-order mark dropped
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        need = {"collective", "n_gpus", "n_nodes", "device", "interconnect", "message_bytes", "time_us",
                "algbw_gb_s", "busbw_gb_s", "source"}
        missing = need - set(reader.fieldnames or [])
        if missing:
            raise LmcostError("table", f"{Path(path).name} lacks the column(s) {', '.join(sorted(missing))}",
                              "give the columns of lmcost/data/measurements/collective-measurements.csv")
        raw = list(reader)
    except csv.Error as e:
        raise LmcostError(str(path), f"not a readable CSV ({e})", "give a UTF-8 CSV with a header row") from None
    clusters = {c.name: c for c in list_clusters()}
    rows, skipped = [], []
    for i, r in enumerate(raw, 1):
        if (r.get("engine") or "nccl").strip().lower() != "nccl":
            skipped.append((i, "an engine's own all-reduce, not NCCL (lmcost.calibration.engine_allreduce_fit)"))
            continue
        kind = KIND_OF.get((r.get("collective") or "").strip().lower())
        text = f"{r.get('device', '')} {r.get('interconnect', '')}".lower()
        name = next((c for pat, c in CLUSTER_OF if pat in text), None)
        n, nodes, size = _num(r.get("n_gpus")), _num(r.get("n_nodes")), _num(r.get("message_bytes"))
        if kind is None or name is None or not n or not nodes or not size:
            skipped.append((i, "collective, device, ranks, nodes or bytes not understood"))
            continue
        n, nodes = int(n), int(nodes)
        t = _num(r.get("time_us"))
        alg, bus = _num(r.get("algbw_gb_s")), _num(r.get("busbw_gb_s"))
        time_s = t * 1e-6 if t else size / (alg * 1e9) if alg else size * bus_factor(kind, n) / (bus * 1e9) if bus else None
        if time_s is None:
            skipped.append((i, "no time, algbw or busbw"))
            continue
        c = clusters[name]
        rows.append(Row(i, kind, n, nodes, size, time_s, (r.get("source") or "").strip(), name,
                        _forced(r.get("notes") or "", c.intra.nvls, size), c.gpu))
    return rows, skipped


@dataclass
class _Prepared:
    """A row's candidates (restricted to the algorithm its notes name), ready to evaluate on a grid."""

    row: Row
    cands: list
    weight: float


def _prepare(rows: list[Row], clusters: dict) -> list[_Prepared]:
    per_source = defaultdict(int)
    for r in rows:
        per_source[r.source] += 1
    out = []
    for r in rows:
        cs = candidates(r.kind, r.n, r.nodes, clusters[r.cluster])
        if r.forced:
            cs = [c for c in cs if c.algorithm in r.forced] or cs
        out.append(_Prepared(r, cs, 1.0 / per_source[r.source]))
    return out


def _predict(p: _Prepared, f: dict):
    """Predicted time (s) and whether the latency term is the larger; arrays if a figure is an array."""
    best, lat_best, bw_best = None, None, None
    for c in p.cands:
        lat, bw = evaluate(c, f, p.row.size)
        t = lat + bw
        if best is None:
            best, lat_best, bw_best = t, lat + np.zeros_like(t), bw + np.zeros_like(t)
        else:
            take = t < best
            best = np.where(take, t, best)
            lat_best, bw_best = np.where(take, lat, lat_best), np.where(take, bw, bw_best)
    return best, lat_best >= bw_best


def _loss(prepared, f):
    total = 0.0
    for p in prepared:
        t, _ = _predict(p, f)
        total = total + p.weight * np.abs(np.log(t / p.row.time_s))
    return total


def _descend(prepared, f: dict, keys, rounds: int = 3) -> dict:
    """Coordinate descent over ``keys``; a figure no row moves keeps its value."""
    f = dict(f)
    if not prepared:
        return f
    for _ in range(rounds):
        for k in keys:
            if isinstance(k, tuple):  # two figures that trade against each other, searched jointly
                a, b = np.meshgrid(GRIDS[k[0]], GRIDS[k[1]], indexing="ij")
                loss = np.broadcast_to(_loss(prepared, {**f, k[0]: a, k[1]: b}), a.shape)
                if float(_loss(prepared, f)) - float(loss.min()) > MIN_GAIN:
                    i = np.unravel_index(int(np.argmin(loss)), a.shape)
                    f[k[0]], f[k[1]] = float(a[i]), float(b[i])
                continue
            grid = GRIDS[k]
            loss = np.broadcast_to(_loss(prepared, {**f, k: grid}), grid.shape)
            now = float(_loss(prepared, f))
            if now - float(loss.min()) > MIN_GAIN:  # a figure the rows hardly move keeps its prior
                f[k] = float(grid[int(np.argmin(loss))])
    return f


@dataclass
class Fit:
    """Fitted figures per generation and per network kind, and which rows gave them."""

    intra: dict  # generation -> figures dict
    net: dict  # network kind -> figures dict
    rows_of: dict  # generation or kind -> rows (list of Row)
    p2p_ratio: float


def fit_rows(rows: list[Row], clusters: dict) -> Fit:
    """Fit every generation and network kind on ``rows`` (see the module docstring)."""
    gen_of = {n: c.intra.generation for n, c in clusters.items()}
    net_of = {n: c.inter.kind for n, c in clusters.items() if c.inter is not None}
    intra, rows_of = {}, {}
    by_gen = defaultdict(list)
    for r in rows:
        if r.nodes == 1 and r.kind != "all_to_all":
            by_gen[gen_of[r.cluster]].append(r)
    ratios = []
    for gen, rs in by_gen.items():
        # NCCL's latency is fitted on nccl-tests (published) rows where a generation has them: aiconfigurator's
        # harness times it lower (shipped_rows); its rows set the bandwidth figures with the published ones.
        pub = [r for r in rs if not r.source.startswith(AIC)] or rs
        f = _descend(_prepare(rs, clusters), PRIORS, BW_KEYS)
        f = _descend(_prepare(pub, clusters), f, LAT_KEYS)
        f = _descend(_prepare(rs, clusters), f, BW_KEYS, rounds=1)
        sr = [r for r in rs if r.kind == "send_recv"]
        if sr:
            f = _descend(_prepare(sr, clusters), f, ["p2p"], rounds=1)
            ratios.append(f["p2p"] / f["ring"])
        intra[gen], rows_of[gen] = f, rs
    ratio = float(np.median(ratios)) if ratios else P2P_RATIO_PRIOR
    for gen, f in intra.items():
        if not any(r.kind == "send_recv" for r in rows_of[gen]):
            f["p2p"] = round(min(1.0, f["ring"] * ratio), 2)
    net = {}
    by_net = defaultdict(list)
    for r in rows:
        if r.nodes > 1 and r.kind != "all_to_all":
            by_net[net_of[r.cluster]].append(r)
            by_net[POOLED].append(r)
    for kind, rs in by_net.items():
        net[kind], rows_of[kind] = _fit_net(rs, intra, clusters, gen_of), rs
    return Fit(intra, net, rows_of, ratio)


def _fit_net(rs: list[Row], intra: dict, clusters: dict, gen_of: dict) -> dict:
    """The network's figures fitted on ``rs``, each row under its own generation's fitted figures."""
    per_gen = defaultdict(list)
    for r in rs:
        per_gen[gen_of[r.cluster]].append(r)
    prepared = {gen: _prepare(g_rows, clusters) for gen, g_rows in per_gen.items()}
    f = dict(PRIORS)
    for _ in range(3):
        for k in NET_KEYS:
            grid = GRIDS[k]
            loss = sum(_loss(p, {**figures_for(gen, intra), **{kk: f[kk] for kk in NET_KEYS}, k: grid})
                       for gen, p in prepared.items())
            loss = np.broadcast_to(loss, grid.shape)
            now = float(loss[int(np.argmin(np.abs(grid - f[k])))])
            if now - float(loss.min()) > MIN_GAIN:
                f[k] = float(grid[int(np.argmin(loss))])
    return {k: f[k] for k in NET_KEYS}
    return Fit(intra, net, rows_of, ratio)


def figures_for(gen: str, intra: dict) -> dict:
    """The fitted figures of a generation, its fallback's, or the priors."""
    while gen not in intra and gen in FALLBACK:
        gen = FALLBACK[gen]
    return dict(intra.get(gen, PRIORS))


def cluster_figures(c: Cluster, fit: Fit) -> dict:
    """Flat figures (:func:`lmcost.cost.collectives.figures` keys) for cluster ``c`` under ``fit``."""
    f = figures_for(c.intra.generation, fit.intra)
    net = fit.net.get(c.inter.kind, fit.net.get(POOLED)) if c.inter is not None else None
    f.update(net or {k: PRIORS[k] for k in NET_KEYS})
    return f


def predict(rows: list[Row], fit: Fit, clusters: dict):
    """(predicted s, latency-bound) per row under ``fit``."""
    out = []
    for p in _prepare(rows, clusters):
        t, lat = _predict(p, cluster_figures(clusters[p.row.cluster], fit))
        out.append((float(t), bool(lat)))
    return out


def family(device_gpu: str) -> str:
    """The device family a row's errors are reported under (the GPU of its cluster)."""
    return {"a100-80gb": "A100", "a100-40gb": "A100", "h100-sxm": "H100", "h200": "H200", "h100-pcie": "H100 PCIe",
            "b200": "B200"}.get(device_gpu, device_gpu)


@dataclass
class Report:
    """Fitted on every row; held-out predictions (one per row, each from the fit without its source)."""

    fit: Fit
    rows: list[Row]
    skipped: list
    held_out: list  # (row, predicted_s, latency_bound)

    def errors(self) -> list[dict]:
        """Per (device family, regime): rows, sources, median and worst |error| held out."""
        groups = defaultdict(list)
        for r, t, lat in self.held_out:
            groups[(family(r.device), "latency" if lat else "bandwidth")].append((r, t / r.time_s - 1))
        out = []
        for (fam, regime), es in sorted(groups.items()):
            a = np.abs([e for _, e in es])
            worst = max(es, key=lambda x: abs(x[1]))
            out.append(dict(device=fam, regime=regime, rows=len(es), sources=len({r.source for r, _ in es}),
                            median_abs_error=float(np.median(a)), worst_abs_error=float(a.max()), worst_row=worst[0].row))
        return out

    def by_source(self) -> list[dict]:
        """Per source: rows and median |error| held out."""
        groups = defaultdict(list)
        for r, t, _ in self.held_out:
            groups[r.source].append(t / r.time_s - 1)
        return [dict(source=s, rows=len(e), median_abs_error=float(np.median(np.abs(e))), median_error=float(np.median(e)))
                for s, e in sorted(groups.items())]

    def band(self, regime: str) -> tuple[float, float]:
        """5th and 95th percentiles of held-out measured / predicted in ``regime`` (clipped to contain 1)."""
        q = [r.time_s / t for r, t, lat in self.held_out if lat == (regime == "latency")]
        if not q:
            return (1.0, 1.0)
        lo, hi = np.percentile(q, [5, 95])
        return (round(min(1.0, float(lo)), 3), round(max(1.0, float(hi)), 3))


def run(rows: list[Row], skipped=()) -> Report:
    """Fit on every row, and each source's rows held out (fitted without that source)."""
    clusters = {c.name: c for c in list_clusters()}
    full = fit_rows(rows, clusters)
    held = []
    for s in sorted({r.source for r in rows}):
        mine = [r for r in rows if r.source == s]
        f = fit_rows([r for r in rows if r.source != s], clusters)
        held += [(r, t, lat) for r, (t, lat) in zip(mine, predict(mine, f, clusters))]
    held.sort(key=lambda x: x[0].row)
    return Report(full, rows, list(skipped), held)


def _rows_text(rows: list[Row]) -> str:
    by = defaultdict(list)
    for r in rows:
        by[r.source.split(" (")[0]].append(r.row)
    parts = []
    for s, ids in sorted(by.items()):
        ids = sorted(ids)
        spans, start = [], ids[0]
        for a, b in zip(ids, ids[1:] + [None]):
            if b != a + 1:
                spans.append(f"{start}-{a}" if a != start else f"{a}")
                start = b
        parts.append(f"{s} (rows {','.join(spans)})")
    return "; ".join(parts)


def block_for(c: Cluster, report: Report, table_name: str, digest: str, engines: dict | None = None) -> dict:
    """The ``collectives`` block of cluster ``c``'s YAML under the fit of ``report`` (and ``engines``, the
    ``engines`` block of :func:`lmcost.calibration.engine_allreduce_fit.engines_block`)."""
    fit = report.fit
    f = cluster_figures(c, fit)
    gen = c.intra.generation
    src_gen = gen if gen in fit.intra else FALLBACK.get(gen)
    if gen in fit.intra:
        intra_src = f"fitted on {gen} rows: {_rows_text(fit.rows_of[gen])}"
    elif src_gen in fit.intra:
        intra_src = f"prior: no {gen} rows; the {src_gen} figures (same NCCL algorithms, the previous NVLink generation)"
    else:
        intra_src = "prior: no rows of this fabric; lmcost.calibration.collective_fit.PRIORS (NCCL tuning.cc, DGX A100 nccl-tests)"
    if c.inter is None:
        net_src = "no network"
    elif c.inter.kind in fit.net:
        net_src = f"fitted on {c.inter.kind} rows: {_rows_text(fit.rows_of[c.inter.kind])}"
    elif POOLED in fit.net:
        net_src = f"no {c.inter.kind} rows: fitted on every multi-node row: {_rows_text(fit.rows_of[POOLED])}"
    else:
        net_src = (f"prior: no {c.inter.kind} rows; efficiency {PRIORS['net_efficiency']} of line rate, NCCL's network "
                   "latencies (lmcost.calibration.collective_fit.PRIORS)")
    fam = family(c.gpu)
    errs = {e["regime"]: round(100 * e["median_abs_error"], 1) for e in report.errors() if e["device"] == fam}
    rnd = lambda x: round(float(x), 3)  # noqa: E731
    return dict(
        intra=dict(ring_latency_scale=rnd(f["ring_latency_scale"]), nvls_latency_scale=rnd(f["nvls_latency_scale"]),
                   ring=rnd(f["ring"]), nvls=rnd(f["nvls"]), p2p=rnd(f["p2p"]), ll=rnd(f["ll"]), fill_mb=rnd(f["fill_mb"]),
                   p2p_latency_scale=rnd(f["p2p_latency_scale"]), p2p_fill_mb=rnd(f["p2p_fill_mb"]), rows=intra_src),
        inter=dict(latency_scale=rnd(f["net_latency_scale"]), efficiency=rnd(f["net_efficiency"]),
                   fill_mb=rnd(f["net_fill_mb"]), rows=net_src),
        **({"engines": engines} if engines else {}),
        band=dict(latency=list(report.band("latency")), bandwidth=list(report.band("bandwidth"))),
        sources={"*": f"lmcost fit --collectives on {table_name} (sha256 {digest}); p2p where no send/recv rows: "
                      f"ring x {fit.p2p_ratio:.2f} (p2p/ring fitted where both are measured)"},
        fit=dict(table=table_name, sha256=digest, rows=len(report.rows), device=fam,
                 loso_median_abs_error_pct=errs or "no rows of this device"),
    )


def replace_block(text: str, block: dict, table_name: str, digest: str) -> str:
    """A cluster YAML's text with its ``collectives`` block (and the comment above it) replaced by
    ``block``, placed before ``sources:``; every other line kept."""
    import yaml

    dumped = (f"# lmcost fit --collectives on {table_name} (sha256 {digest}): fitted figures of the collective model\n"
              + yaml.safe_dump({"collectives": block}, sort_keys=False, width=1000, allow_unicode=True, default_flow_style=None))
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("# lmcost fit --collectives") or ln.startswith("collectives:")), None)
    if start is None:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("sources:")), len(lines))
        return "".join(lines[:at]) + dumped + "".join(lines[at:])
    body = next(i for i in range(start, len(lines)) if lines[i].startswith("collectives:"))
    end = next((i for i in range(body + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    return "".join(lines[:start]) + dumped + "".join(lines[end:])


def cluster_file(name: str) -> Path:
    """The shipped YAML of a cluster."""
    found = resources.find("clusters", name)
    if found is None:
        raise LmcostError("cluster", f"{name} is not shipped", "check lmcost/data/clusters/")
    return found

