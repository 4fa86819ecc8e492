"""``lmcost fit --training``'s fit: the system figures (:mod:`lmcost.calibration.training_fit`) fitted on the
throughput rows of a training-runs table, their leave-one-source-out error, and the YAML blocks they go in.

:func:`sample` runs lmcost train on each throughput run at the sample grid; :func:`fit_system` fits on all
runs and on all but each source, then scores every row (:func:`lmcost.apps.train_fit.evaluate`) three ways:
``prior`` (the figures before the fit: every clock and efficiency 1), ``in_sample`` (the figures fitted on
all runs) and ``loso`` (each source under the figures fitted without it). Memory and OOM rows are scored too;
the clock and efficiency do not move them (their figures are MemoryFigures').
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import numpy as np

from lmcost.apps.train_run import run_train
from lmcost.apps.train_fit import Progress, _key, evaluate, request_for, summarise
from lmcost.basics import shipped
from lmcost.basics.errors import LmcostError
from lmcost.calibration import training_fit as tf
from lmcost.calibration.training_runs import THROUGHPUT, RunRow
from lmcost.hardware.frameworks import resolve_framework


def throughput_runs(rows: list[RunRow]) -> list[list[RunRow]]:
    """The resolvable throughput rows grouped by run (a run published as tokens/s, TFLOP/s and MFU is one
    run), each group in :data:`THROUGHPUT`'s order (its first row is the one fitted)."""
    order = {m: i for i, m in enumerate(THROUGHPUT)}
    runs: dict = {}
    for r in sorted((r for r in rows if r.skip is None and r.metric_class == "throughput"), key=lambda r: order[r.metric]):
        runs.setdefault(_key(r), []).append(r)
    return list(runs.values())


def _framework(row: RunRow) -> str:
    return resolve_framework(row.framework, row.zero)


def sample(rows: list[RunRow], progress: Progress | None = None) -> tuple[tf.Samples, list[dict]]:
    """lmcost train on each throughput run (its first row) at every (clock, efficiency) of the sample grid.
    Returns (Samples, refused: the runs train refused, with the error's line)."""
    runs = throughput_runs(rows)
    grid = [(c, e) for c in tf.CLOCK_SAMPLES for e in tf.EFFICIENCY_SAMPLES]
    times, pub, src, gpu, fw, ids, dense, refused = [], [], [], [], [], [], [], []
    for i, run in enumerate(runs):
        row = run[0]
        try:
            req = request_for(row)
            t = [1 / run_train(req, figures=dict(sustained_clock=c, step_efficiency=e)).step.tokens_per_s_per_gpu
                 for c, e in grid]
        except LmcostError as e:
            refused.append(dict(row=row.row, source=row.source, metric=row.metric, why=str(e)))
            if progress:
                progress(i + 1, len(runs))
            continue
        times.append(np.reshape(t, (len(tf.CLOCK_SAMPLES), len(tf.EFFICIENCY_SAMPLES))))
        pub.append(1 / row.published)
        src.append(row.source), gpu.append(tf.family(row.gpu)), fw.append(_framework(row))
        ids.append(tuple(r.row for r in run))
        dense.append(row.cfg.moe is None)
        if progress:
            progress(i + 1, len(runs))
    s = tf.Samples(np.array(times).reshape(-1, len(tf.CLOCK_SAMPLES), len(tf.EFFICIENCY_SAMPLES)), np.array(pub),
                   src, gpu, fw, ids, dense)
    return s, refused


def predictor(figures: dict):
    """A predict callable for :func:`evaluate`: run_train with the clock of the request's GPU generation and
    the efficiency of its framework from ``figures`` (training_fit's keys; missing: 1, the prior)."""
    def predict(request):
        fw = resolve_framework(request.framework, request.zero)
        return run_train(request, figures=dict(sustained_clock=figures.get(f"clock:{tf.family(request.gpu.name)}", 1.0),
                                               step_efficiency=figures.get(f"eff:{fw}", 1.0))).step
    return predict


@dataclass
class SystemFit:
    """What :func:`fit_system` found: ``figures`` (fitted on every run), ``loso_figures`` ({source: figures
    without it}), ``rows_of`` ({figure: data rows that informed it}), and the three evaluations (``prior``,
    ``in_sample``, ``loso``: each :func:`evaluate`'s dict), ``refused`` (runs train refused)."""

    figures: dict
    loso_figures: dict
    rows_of: dict
    prior: dict
    in_sample: dict
    loso: dict
    refused: list


def fit_system(rows: list[RunRow], progress: Progress | None = None) -> SystemFit:
    """Sample, fit on every source, fit leaving each out, and evaluate (the module docstring)."""
    s, refused = sample(rows, progress)
    s = tf.fitted_runs(s)
    figures = tf.descend(s)
    _, loso_figs = tf.loso(s)
    rows_of = {k: sorted(r for i, rs in enumerate(s.rows) for r in rs
                         if (k == f"clock:{s.gpu[i]}" or k == f"eff:{s.framework[i]}")) for k in figures}
    prior = evaluate(rows, predictor({}))
    in_sample = evaluate(rows, predictor(figures))
    by_source: dict = {}
    for r in rows:
        by_source.setdefault(r.source, []).append(r)
    parts = [evaluate(rs, predictor(loso_figs.get(src, figures))) for src, rs in by_source.items()]
    results = [x for p in parts for x in p["results"]]
    loso = dict(rows_used=len(results), results=results, summary=summarise(results, {r.row: r for r in rows}),
                skipped=[x for p in parts for x in p["skipped"]], refused=[x for p in parts for x in p["refused"]])
    return SystemFit(figures, loso_figs, rows_of, prior, in_sample, loso, refused)


def rows_text(rows: list[int]) -> str:
    """Row numbers as ranges: [1, 2, 3, 7] -> '1-3,7'."""
    out, start = [], None
    for i, r in enumerate(rows):
        if start is None:
            start = r
        if i + 1 == len(rows) or rows[i + 1] != r + 1:
            out.append(f"{start}-{r}" if r != start else str(r))
            start = None
    return ",".join(out)


def table_digest(table: str | None) -> tuple[str, str]:
    """(table name, the first 16 hex digits of its sha256)."""
    from pathlib import Path

    from lmcost.calibration.training_runs import TRAINING_TABLE

    path = Path(table) if table else shipped.folder("measurements") / TRAINING_TABLE
    return path.name, hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _fit_line(name: str, value: float, rows: list[int], table: str, digest: str, loso: dict | None) -> str:
    """The ``fit:`` mapping written in a YAML (flow style, one line)."""
    extra = "" if loso is None else f", loso_median_abs_log: {loso.get('median_abs_log', 0):.3f}"
    return (f"{{figure: {name}, value: {value:.2f}, table: {table}, sha256: {digest}, n_rows: {len(rows)}, "
            f"rows: '{rows_text(rows)}'{extra}}}")


def gpu_block_text(text: str, clock: float, rows: list[int], table: str, digest: str) -> str:
    """A GPU YAML's text with its ``training`` block's sustained_clock, its source line and ``fit`` set
    (a block added before ``efficiency:`` or ``sources:`` where the file has none); every other line kept."""
    src = f'    - "sustained_clock {clock:.2f}: lmcost fit --training on {table} (sha256 {digest}), rows {rows_text(rows)}"\n'
    fit = f"  fit: {_fit_line('sustained_clock', clock, rows, table, digest, None)}\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("training:")), None)
    if start is None:
        at = next(i for i, ln in enumerate(lines) if ln.startswith(("efficiency:", "sources:")))
        block = ["training:               # a long training run's SM clock and power model (lmcost.hardware.power)\n",
                 f"  sustained_clock: {clock:.2f}\n", "  power_exponent: 3.0\n", "  sources:\n", src,
                 '    - "power_exponent 3: CMOS dynamic power C V^2 f with V scaled in proportion to f (T. Mudge, IEEE Computer 34(4), 2001); the fit sets it"\n',
                 fit]
        return "".join(lines[:at] + block + lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    body = [ln for ln in lines[start + 1:end] if not ln.startswith("  fit:")]
    body = [re.sub(r"^(  sustained_clock: )[0-9.]+", rf"\g<1>{clock:.2f}", ln) for ln in body]
    body = [src if ln.lstrip().startswith('- "sustained_clock') else ln for ln in body]
    return "".join(lines[:start + 1] + body + [fit] + lines[end:])


def framework_block_text(text: str, efficiency: float, rows: list[int], table: str, digest: str) -> str:
    """A framework YAML's text with step_efficiency, its source line and ``fit`` set; every other line kept."""
    text = re.sub(r"(?m)^step_efficiency: .*$", f"step_efficiency: {efficiency:.2f}", text)
    src = (f'  - "step_efficiency {efficiency:.2f}: lmcost fit --training on {table} (sha256 {digest}), rows '
           f'{rows_text(rows)}; step_overhead_ms 0: a prior that assumes nothing"')
    text = re.sub(r'(?m)^  - "step_(overhead_ms 0, step_)?efficiency.*$', lambda _: src, text)
    return re.sub(r"(?m)^fit: .*$", lambda _: f"fit: {_fit_line('step_efficiency', efficiency, rows, table, digest, None)}", text)


def write_figures(res: SystemFit, out_dir: str, table: str | None) -> list[str]:
    """Write each fitted GPU's YAML (training block) and framework's YAML (step_efficiency, fit) under
    ``out_dir``, from the shipped files. Returns the file names written."""
    from pathlib import Path

    name, digest = table_digest(table)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key, value in sorted(res.figures.items()):
        kind, what = key.split(":")
        rows = res.rows_of[key]
        if kind == "clock":
            for gpu in [g for g, f in tf.FAMILY.items() if f == what] or [what]:
                src = shipped.folder("gpus") / f"{gpu}.yaml"
                if src.exists():
                    (out / src.name).write_text(gpu_block_text(src.read_text(), value, rows, name, digest))
                    written.append(src.name)
        else:
            src = shipped.folder("frameworks") / f"{what}.yaml"
            (out / src.name).write_text(framework_block_text(src.read_text(), value, rows, name, digest))
            written.append(src.name)
    return written


def fit_training(request, progress: Progress | None = None, out_dir: str | None = None) -> dict:
    """``lmcost fit --training``: :func:`fit_system` on the rows ``request`` (a
    :class:`lmcost.apps.train_fit.TrainingFitRequest`) selects. Returns the leave-one-source-out evaluation
    (:func:`lmcost.apps.train_fit.evaluate`'s keys, results in row order) with ``table``, ``rows_read``,
    ``fit`` (figures, rows of each, the figures fitted without each source, runs train refused),
    ``in_sample`` and ``prior`` (their summaries), and ``written`` (the YAMLs written under ``out_dir``).

    Raises: LmcostError (table, rows, sources) as :func:`lmcost.apps.train_fit.select` does."""
    from lmcost.apps.train_fit import select
    from lmcost.calibration.training_runs import load_runs

    from lmcost.apps.train_memory_fit import memory_fit, write_memory_figures

    rows = select(load_runs(request.table), request)
    res = fit_system(rows, progress)
    mem = memory_fit(rows)  # the memory figures' own fit: its leave-one-source-out replaces the memory rows'
    written = write_figures(res, out_dir, request.table) if out_dir else []
    if out_dir:
        written += [str(p) for p in write_memory_figures(out_dir, mem["fit"], request.table)]
    loso = dict(res.loso, results=sorted(res.loso["results"], key=lambda r: r["row"]))
    summary = dict(loso["summary"], memory=mem["loso"]["summary"]["memory"],
                   by_metric={**loso["summary"]["by_metric"], **mem["loso"]["summary"]["by_metric"]},
                   oom=dict(loso["summary"]["oom"], **mem["loso"]["oom"]))
    return dict(table=request.table or "training-runs.csv (shipped)", rows_read=len(rows)) | loso | dict(
        summary=summary,
        fit=dict(figures=res.figures, rows={k: rows_text(v) for k, v in res.rows_of.items()},
                 loso_figures=res.loso_figures, fitted_clocks=list(tf.FITTED_CLOCKS), gauge=tf.GAUGE,
                 refused=res.refused),
        memory_fit=dict(figures=mem["fit"]["figures"], rows=mem["fit"]["rows"], loso_figures=mem["loso_figures"],
                        in_sample=mem["in_sample"]["summary"], prior=mem["prior"]["summary"]),
        in_sample=res.in_sample["summary"], prior=res.prior["summary"], written=written)
