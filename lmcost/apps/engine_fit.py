"""``lmcost fit --engines`` as one call: per GPU and serving engine, the engine profile fitted on the engine
kernel table (:mod:`lmcost.calibration.engine_fit`), its leave-one-GPU-out and leave-one-engine-out errors and
bands, and, with an output folder, every GPU's YAML with its ``efficiency.engines`` block (and, for a GPU the
public table's fit writes no block for, a base block fitted on the engines pooled) plus engine-fit-report.json.

Errors name the request's fields (``table``, ``fit.out_dir``). Files are written as one set
(:func:`lmcost.basics.files.write_texts`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from lmcost.apps.fit import _out_folder, gpu_file
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import MAX_MAPPING_BYTES, read_text, write_texts
from lmcost.calibration import efficiency_fit, engine_fit
from lmcost.calibration.measurements import ENGINE_TABLE, FITTED, engine_table, load_table, public_table
from lmcost.hardware.gpu import gpu_from_text, load_gpu
from lmcost.output.render import to_json

Progress = Callable[[int, int], None]
#: Classes whose bands a base block takes from a public-table block (no engine rows of them).
MEMORY_BAND_CLASSES = ("norm", "elementwise", "softmax")
#: The public-table block whose memory-bound bands a base block takes (the GPU with the most public rows).
BAND_DONOR = "h100-sxm"


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineFitRequest:
    """``table``: a CSV in the engine table's columns (None: the shipped engine-kernels.csv); ``out_dir``: a
    folder for the GPU YAMLs and engine-fit-report.json (None: write nothing)."""

    table: str | None = None
    out_dir: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineFitResult:
    """``rows``: per engine (and ``all``) and class, the LOGO and LOEO median |error|, band and coverage
    (:func:`lmcost.calibration.engine_fit.summary_rows`); ``by_gpu``: the same per GPU, engine and class;
    ``table``; ``n_rows`` fitted; ``left_out``: reason -> rows; ``written``; ``out_dir``."""

    rows: list[dict]
    by_gpu: list[dict]
    table: str
    n_rows: int
    left_out: dict
    written: list[str]
    out_dir: Path | None


def check_engine_mode(others: tuple[str, ...]) -> None:
    """``engines`` fits every GPU of the engine table: ``others`` (the fields given of the other fits: targets,
    traces, collectives, training) cannot go with it. Raises: LmcostError (engines) naming them."""
    if others:
        raise LmcostError("engines", "fits the engine profiles of every GPU in the engine table",
                          f"drop {', '.join(f'`{o}`' for o in others)}")


def fit_engines(request: EngineFitRequest, progress: Progress | None = None) -> EngineFitResult:
    """Fit every (GPU, engine) profile of the table and evaluate it (module doc); write the YAMLs with ``out_dir``.

    Raises: LmcostError (table) for an empty table or one with no default-kernel row of an engine; (fit.out_dir)
    for a folder that cannot be written; the table errors of :func:`load_table`.
    """
    if request.table is not None and not request.table.strip():
        raise LmcostError("table", "empty", "give a CSV of engine kernel timings, or drop `table` for the shipped one")
    path = Path(request.table) if request.table is not None else engine_table()
    out_dir = _out_folder(request.out_dir)
    ms, _ = load_table(path, ENGINE_TABLE)
    why = engine_fit.fitting_rows(path)
    fitted = [m for m in ms if not why.get(m.index) and m.engine and m.cls in engine_fit.ENGINE_CLASSES]
    if not fitted:
        raise LmcostError("table", f"{path.name} has no default-kernel GEMM or attention row of an engine",
                          "give rows with the engine, engine_version and default_kernel columns (engine-kernels.csv's)")
    left_out: dict = {}
    for w in why.values():
        if w:
            left_out[w] = left_out.get(w, 0) + 1
    f = engine_fit.fit_engines(fitted, progress)
    digest = efficiency_fit.table_digest(path)
    rows, by_gpu = engine_fit.summary_rows(f), engine_fit.gpu_rows(f)
    written: list[str] = []
    if out_dir is not None:
        texts = _texts(f, fitted, path.name, digest)
        texts["engine-fit-report.json"] = to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(fitted), rows_left_out=left_out, classes=rows,
            by_gpu=by_gpu)) + "\n"
        write_texts(out_dir, texts, "fit.out_dir")
        written = sorted(texts)
    return EngineFitResult(rows=rows, by_gpu=by_gpu, table=path.name, n_rows=len(fitted), left_out=left_out,
                           written=written, out_dir=out_dir)


def _texts(f, fitted: list, table: str, digest: str) -> dict[str, str]:
    """Each GPU's YAML text with its engines block (and a base block where the public fit writes none)."""
    import numpy as np

    prior = efficiency_fit.fit_pooled(load_table(public_table())[0])
    donor = load_gpu(BAND_DONOR).efficiency
    pooled = {c: [r for (g, e, c2), rr in f.logo.items() if c2 == c for r in rr] for c in engine_fit.ENGINE_CLASSES}
    pooled_bands = {c: efficiency_fit._band(rr) for c, rr in pooled.items() if len(rr) >= 2}
    texts = {}
    for name in sorted({g for g, _ in f.profiles}):
        gpu = load_gpu(name)
        src = gpu_file(name)
        text = read_text(src, MAX_MAPPING_BYTES, "GPU YAML")
        engines = {}
        for (g, e), prof in sorted(f.profiles.items()):
            if g != name:
                continue
            fit = dict(table=table, sha256=digest, rows={c: f.rows[(g, e, c)] for c in engine_fit.ENGINE_CLASSES},
                       fitted_on=f"{name}'s {e} default-kernel rows",
                       logo_median_abs_error_pct={c: round(engine_fit.median_error(f.logo[(g, e, c)]) * 100, 1)
                                                  for c in engine_fit.ENGINE_CLASSES if f.logo.get((g, e, c))},
                       loeo_median_abs_error_pct={c: round(engine_fit.median_error(f.loeo[(g, e, c)]) * 100, 1)
                                                  for c in engine_fit.ENGINE_CLASSES if f.loeo.get((g, e, c))},
                       band_coverage_held_out={c: round(f.coverage[(e, c)], 2) for c in engine_fit.ENGINE_CLASSES
                                               if (e, c) in f.coverage and f.coverage[(e, c)] == f.coverage[(e, c)]})
            engines[e] = engine_fit.profile_dict(prof, fit)
        if name in FITTED:
            block = yaml.safe_load(text)["efficiency"]
        else:
            bands = {**{c: list(donor.bands[c]) for c in MEMORY_BAND_CLASSES if c in donor.bands}, **pooled_bands}
            eff = engine_fit.base_block(fitted, gpu, prior, bands)
            block = engine_fit.base_block_dict(eff, gpu, table, digest, int(np.sum([1 for m in fitted if m.gpu.name == name])),
                                               BAND_DONOR)
        block["engines"] = engines
        text = efficiency_fit.replace_block(text, block)
        gpu_from_text(text, src.name)
        texts[f"{name}.yaml"] = text
    return texts
