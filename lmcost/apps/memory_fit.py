"""``lmcost fit --memory-kernels``: the serving engines' norm, activation and RoPE kernel designs fitted on the
H200 sweep (:mod:`lmcost.calibration.memory_kernel_fit`); ``--out`` writes ``engine-memory-kernels.yaml``, the
file :mod:`lmcost.hardware.engine_memory` ships."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from lmcost.apps.fit import _out_folder
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import write_texts
from lmcost.calibration.memory_kernel_fit import figures_yaml, fit_memory_kernels, summary_rows, sweep_table
from lmcost.calibration.stack_spread import SPREAD_CLASSES, around_gpu, load_rows, spread_yaml, summary
from lmcost.hardware.engine_memory import parse_designs
from lmcost.hardware.gpu import load_gpu

#: Header of the written file: what it is and how to rebuild it.
HEADER = ("# Serving engines' memory-bound kernel designs (lmcost.hardware.engine_memory), fitted by\n"
          "# `lmcost fit --memory-kernels --out DIR` (lmcost.calibration.memory_kernel_fit); do not edit by hand.\n")


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryFitResult:
    """``rows``: per design, the figures, held-out (leave one width out) and in-sample median |error| and band
    (:func:`summary_rows`); ``stack_spread``: per class (norm, elementwise) the spread of the single fused kernels
    around auto's prediction, the H200's band, their union and coverages (:func:`lmcost.calibration.stack_spread.summary`);
    ``table``; ``written``; ``out_dir``."""

    rows: list[dict]
    stack_spread: list[dict]
    table: str
    written: list[str]
    out_dir: Path | None


def check_memory_mode(others: tuple[str, ...]) -> None:
    """``memory_kernels`` fits the shipped sweep's designs: ``others`` (fields of the other fits given) cannot go
    with it. Raises: LmcostError (memory_kernels) naming them."""
    if others:
        raise LmcostError("memory_kernels", "fits the engine kernel designs on the H200 sweep alone",
                          f"drop {', '.join(f'`{o}`' for o in others)}")


def fit_memory(table: str | None = None, out_dir: str | None = None) -> MemoryFitResult:
    """Fit every design on ``table`` (default the shipped sweep), and the spread of its single fused norm and
    pointwise kernels around auto's prediction (:mod:`lmcost.calibration.stack_spread`); with ``out_dir``, write
    ``engine-memory-kernels.yaml`` there (the spread as its ``stack_spread`` section).

    Raises: LmcostError (table) as :func:`lmcost.calibration.memory_kernel_fit.load_designs`; (fit.out_dir) for a
    folder that cannot be written."""
    folder = _out_folder(out_dir) if out_dir is not None else None
    if table is not None and not table.strip():
        raise LmcostError("table", "empty", "give a CSV path, or leave `table` out for the shipped sweep")
    f = fit_memory_kernels(table)
    designs = figures_yaml(f)
    spread_rows = load_rows(table or sweep_table())
    auto_gpu = around_gpu("auto", parse_designs(designs))  # the designs just fitted, not the shipped ones
    auto_rows = load_rows(table or sweep_table(), auto_gpu)
    written = []
    if folder is not None:
        data = {**designs, "stack_spread": spread_yaml(spread_rows, f.table, f.digest, auto_rows)}
        text = HEADER + yaml.safe_dump(data, sort_keys=False, width=200)
        write_texts(folder, {"engine-memory-kernels.yaml": text}, "fit.out_dir")
        written.append("engine-memory-kernels.yaml")
    # each selection's band before the spread: torch's the public fit's, auto's its designs' for the classes they cost
    spreads = [dict(r, around=around) for around, rows, gpu in (("torch", spread_rows, load_gpu("h200")),
                                                                 ("auto", auto_rows, auto_gpu))
               for r in summary(rows, {c: tuple(gpu.efficiency.band(c)) for c in SPREAD_CLASSES})]
    return MemoryFitResult(rows=summary_rows(f), stack_spread=spreads, table=f.table, written=written, out_dir=folder)
