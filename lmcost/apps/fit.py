"""``lmcost fit`` as one call: the efficiency model (:func:`fit`) or the collective model
(:func:`fit_collectives`) fitted on a table of measured times, its leave-one-source-out error, and, with
an output folder, the files it writes: each GPU's (or cluster's) YAML with the fitted block in place of
its own, and a JSON report of the fit.

Nothing is half-written: the files are written as one set into a folder staged beside the output folder,
which then replaces it whole (:func:`lmcost.basics.files.write_texts`). The fitting engines are in
:mod:`lmcost.calibration` (``efficiency_fit``, ``collective_fit``); this module plans files around them.
Errors name the request's fields (``table``, ``targets``, ``traces``, ``fit.out_dir``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmcost.basics import shipped
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import MAX_MAPPING_BYTES, check_component, check_folder, check_name, present, read_text, write_texts
from lmcost.calibration import collective_fit, efficiency_fit, engine_allreduce_fit
from lmcost.calibration.measurements import FAMILIES, FITTED, MAX_TABLE_BYTES, load_table, public_table
from lmcost.hardware.cluster import cluster_from_text, list_clusters
from lmcost.hardware.gpu import GPU, gpu_from_text, load_gpu
from lmcost.output.render import to_json

#: Reads one profile trace taken on a GPU: (measurement rows, operator rows of kinds not fitted). The
#: reader needs torch, so the caller passes it (:func:`lmcost.profiling.measured.trace_measurements`).
TraceReader = Callable[[str, GPU], tuple[list, int]]
Progress = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class FitRequest:
    """A fit of the efficiency model. ``table``: a CSV of kernel times (None: the shipped public table,
    or the traces alone when ``traces`` are given); ``targets``: GPU names or YAML paths whose blocks to fit
    (empty: every fitted GPU whose family has rows); ``traces``: lmcost profile traces, each one source,
    taken on the one ``targets``; ``out_dir``: a folder for the YAMLs and fit-report.json (None: write nothing)."""

    table: str | None = None
    targets: tuple[str, ...] = ()
    traces: tuple[str, ...] = ()
    out_dir: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class FitResult:
    """What :func:`fit` found. ``rows``: one per operator class (``report_rows``: rows, sources, median
    errors, band); ``table``: the fitting set's file name; ``n_rows``: rows fitted; ``skipped``: (row, why)
    of rows left out; ``edges``: fitted figures on an edge of the searched range; ``one_source``: the set
    has one source (its held-out error is the roofline's); ``written``: files written to ``out_dir``."""

    rows: list[dict]
    table: str
    n_rows: int
    skipped: list[tuple[int, str]]
    edges: list[str]
    one_source: bool
    written: list[str]
    out_dir: Path | None


def gpu_file(name: str) -> Path:
    """The YAML of a GPU, shipped or a path (its text is kept when a fitted block replaces its efficiency).

    Raises: LmcostError (targets) if it is neither a YAML file nor a shipped GPU."""
    if Path(name).suffix in (".yaml", ".yml") and present(name):
        return Path(name)
    found = shipped.find("gpus", name)
    if found is None:
        raise LmcostError("targets", f"{name} is not a shipped GPU", "fit a shipped GPU (lmcost gpus) or a GPU YAML")
    return found


#: What a fit writes besides the GPUs' or clusters' YAMLs; a folder holding one of the reports (and
#: nothing but what fits write) is a fit's output, which the next fit into it replaces whole.
FIT_REPORTS = ("fit-report.json", "collective-fit-report.json", "engine-fit-report.json")


def _out_folder(out_dir: str | None) -> Path | None:
    """``out_dir`` as a folder that can be written, or None: missing, empty, or the output of an earlier
    fit (which is replaced whole, so no file of another GPU's fit stays beside the new report).
    Raises: LmcostError (fit.out_dir)."""
    if out_dir is None:
        return None
    if not out_dir.strip():
        raise LmcostError("fit.out_dir", "empty", "give a folder, e.g. `fit.out_dir` fitted/")
    folder = Path(out_dir)
    check_name(folder, "fit.out_dir")
    if folder.exists() and not folder.is_dir():
        raise LmcostError("fit.out_dir", f"{folder} is a file", "give a folder")
    if Path.cwd().resolve().is_relative_to(folder.resolve()):
        raise LmcostError("fit.out_dir", f"{folder} holds the current folder (it would be replaced whole)",
                          "give a new folder, e.g. `fit.out_dir` fitted/")
    if folder.is_dir():
        entries = list(folder.iterdir())
        ours = all(p.is_file() and not p.is_symlink() and (p.suffix == ".yaml" or p.name in (*FIT_REPORTS, "fitting-set.csv"))
                   for p in entries)
        if entries and not (ours and any(p.name in FIT_REPORTS for p in entries)):
            raise LmcostError("fit.out_dir", f"{folder} holds other files than an earlier fit's output (it would be "
                              "replaced whole)", "give a new or empty folder")
    check_folder(folder.parent, "fit.out_dir", "give a folder inside a writable one")
    return folder


def fit(request: FitRequest, read_trace: TraceReader | None = None, progress: Progress | None = None) -> FitResult:
    """Fit the efficiency model on ``request``'s measured kernel times (leave-one-source-out), and write
    each GPU's YAML with its fitted block and fit-report.json (plus fitting-set.csv, a copy of a table of
    the caller's own) to ``request.out_dir``. ``progress(done, total)`` follows the held-out fits.

    Raises: LmcostError (table, out_dir, targets, traces) for an empty or unfittable table, a folder that
    cannot be written, traces without their one GPU (or without a ``read_trace``), a GPU without an
    efficiency block (its SM count) or whose family has no rows.
    """
    table, gpus = request.table, list(request.targets)
    if table is not None and not table.strip():
        raise LmcostError("table", "empty", "give a CSV of kernel timings, or drop `table` for the shipped one")
    if request.out_dir is not None and not request.out_dir.strip():
        raise LmcostError("fit.out_dir", "empty", "give a folder, e.g. `fit.out_dir` fitted/")
    if request.out_dir is not None:
        check_name(request.out_dir, "fit.out_dir")
    path = Path(table) if table is not None else public_table()
    ms, skipped = load_table(path) if table is not None or not request.traces else ([], [])
    if request.traces:
        if len(gpus) != 1:
            raise LmcostError("targets", "a trace needs the one GPU it ran on",
                              "give `targets` once: the shipped name or the YAML (lmcost calibrate writes one for a local device)")
        if read_trace is None:
            raise LmcostError("traces", "reading a profile trace needs torch",
                              "pass read_trace=lmcost.profiling.measured.trace_measurements")
        ran_on, other = load_gpu(gpus[0]), 0
        for t in request.traces:
            rows_, n = read_trace(t, ran_on)
            ms += rows_
            other += n
        if other:
            skipped.append((0, f"{other} trace operator row(s) of kinds the model does not fit (lookups, routers)"))
        path = Path(request.traces[0]) if table is None else path
    if not ms:
        raise LmcostError(str(path), "no row can be fitted on", "give rows of the ops lmcost models (see lmcost/data/measurements/)")
    families = {m.family for m in ms}
    fittable = [n for n in FITTED if FAMILIES[n] in families]
    if gpus:
        hws = list({hw.name: hw for hw in (load_gpu(g) for g in gpus)}.values())  # aliases of one GPU once
        sources_of = {load_gpu(g).name: gpu_file(g) for g in gpus}
    elif fittable:
        hws = [load_gpu(n) for n in fittable]
        sources_of = {n: gpu_file(n) for n in fittable}
    else:
        raise LmcostError("table", f"no row is of a GPU family lmcost fits blocks for ({', '.join(sorted(set(FAMILIES[n] for n in FITTED)))})",
                          "add rows measured on an A100, H100 or H200, or give `targets` a GPU whose rows the table has")
    for hw in hws:
        if request.out_dir is not None:  # its name becomes a file name in the output folder: never a path
            check_component(hw.name, "targets", "GPU's name")
        if hw.efficiency is None:
            raise LmcostError("targets", f"{hw.name} has no efficiency block to take its SM count from",
                              "add efficiency.gemm.sm_count (with its source) to its YAML, then fit")
        if FAMILIES.get(hw.name, hw.name) not in families:
            have = ", ".join(fittable) or "none (its rows are of no fitted family)"
            raise LmcostError("targets", f"the table has no rows of {hw.name}'s family", f"use one of: {have}")
    out_dir = _out_folder(request.out_dir)
    outputs = []
    if out_dir is not None:
        outputs = [f"{hw.name}.yaml" for hw in hws] + ["fit-report.json"] + (["fitting-set.csv"] if table is not None else [])
    report = efficiency_fit.fit(ms, skipped, progress)
    blocks = {hw.name: efficiency_fit.block_for(report, hw) for hw in hws}
    rows = efficiency_fit.report_rows(report)
    digest = efficiency_fit.table_digest(path)
    if out_dir is not None:
        texts = {}
        for hw in hws:
            src = sources_of[hw.name]
            block = efficiency_fit.block_dict(blocks[hw.name], hw, path.name, digest, report)
            texts[f"{hw.name}.yaml"] = efficiency_fit.replace_block(read_text(src, MAX_MAPPING_BYTES, "GPU YAML"), block)
            gpu_from_text(texts[f"{hw.name}.yaml"], src.name)
        texts["fit-report.json"] = to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(ms), rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            classes=rows, by_source=efficiency_fit.source_rows(report))) + "\n"
        if len(outputs) > len(texts):
            texts[outputs[-1]] = read_text(path, MAX_TABLE_BYTES, "CSV of kernel timings")
        write_texts(out_dir, {name: texts[name] for name in outputs}, "fit.out_dir")
    edges = sorted({f for b in blocks.values() if b is not None for f in efficiency_fit.edge_figures(b)})
    return FitResult(rows=rows, table=path.name, n_rows=len(ms), skipped=skipped, edges=edges,
                     one_source=len({m.source for m in ms}) == 1, written=outputs, out_dir=out_dir)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFitRequest:
    """A fit of the collective model. ``table``: a CSV of collective times (None: the shipped
    collective-measurements.csv); ``out_dir``: a folder for every shipped cluster's YAML with its fitted
    block and collective-fit-report.json (None: write nothing)."""

    table: str | None = None
    out_dir: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveFitResult:
    """What :func:`fit_collectives` found: ``errors``, one row per device and regime (rows, sources,
    median and worst held-out error); the table's name, rows fitted, rows left out (row, why), and the
    folder written to (None if none)."""

    errors: list[dict]
    table: str
    n_rows: int
    skipped: list[tuple[int, str]]
    out_dir: Path | None


def fit_collectives(request: CollectiveFitRequest) -> CollectiveFitResult:
    """Fit the collective model (leave-one-source-out) and, with ``request.out_dir``, write every shipped
    cluster's YAML with its fitted block and collective-fit-report.json.

    Raises: LmcostError (table, out_dir) for an empty or missing table, one with no fittable row, or a
    folder that cannot be written.
    """
    table = request.table
    if table is not None and not table.strip():
        raise LmcostError("table", "empty", "give a CSV of collective timings, or drop `table` for the shipped one")
    if table is not None:
        path = Path(table)
        rows, skipped = collective_fit.load_rows(path)
        name, digest, eng = path.name, efficiency_fit.table_digest(path), None
    else:  # both shipped tables; the engines' own all-reduce fitted on the second
        path = collective_fit.public_table()
        rows, skipped = collective_fit.shipped_rows()
        name, digest = collective_fit.shipped_name(), collective_fit.shipped_digest()
        eng = engine_allreduce_fit.run_engines({c.name: c for c in list_clusters()})
    if not rows:
        raise LmcostError(str(path), "no row can be fitted on", "give rows in the columns of lmcost/data/measurements/collective-measurements.csv")
    report = collective_fit.run(rows, skipped)
    errs = report.errors()
    folder = _out_folder(request.out_dir)
    if folder is not None:
        texts = {}
        for c in list_clusters():
            engines = engine_allreduce_fit.engines_block(c.intra.generation, eng) if eng is not None else None
            text = collective_fit.replace_block(read_text(collective_fit.cluster_file(c.name), MAX_MAPPING_BYTES, "cluster YAML"),
                                                collective_fit.block_for(c, report, name, digest, engines), name, digest)
            cluster_from_text(text, f"{c.name}.yaml")
            texts[f"{c.name}.yaml"] = text
        texts["collective-fit-report.json"] = to_json(dict(
            table=name, sha256=digest, rows_fitted=len(rows),
            engine_allreduce=eng.errors() if eng is not None else [], rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            errors=errs, by_source=report.by_source(),
            bands=dict(latency=report.band("latency"), bandwidth=report.band("bandwidth")))) + "\n"
        write_texts(folder, texts, "fit.out_dir")
    return CollectiveFitResult(errors=errs, table=name, n_rows=len(rows), skipped=skipped, out_dir=folder)
