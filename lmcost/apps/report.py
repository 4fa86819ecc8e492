"""A report folder: ``index.html`` (figures and the tables of ``estimate``), ``summary.json``, ``ops.csv``.

The page is self-contained: plotly.js is inlined once, nothing is fetched, so it opens offline.
The folder is written under a temporary name beside the target and swapped in whole at the end
(:class:`lmcost.basics.files.staged_folder`), so a failure or a kill never leaves a half-written report
or none where there was one.
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from lmcost.apps.setup import Say, checked_layout, quiet, resolve_precision
from lmcost.output import render
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import check_name, make_folder, staged_folder
from lmcost.apps.estimate import Settings, Workload, estimate
from lmcost.hardware.gpu import GPU
from lmcost.output.plots import roofline_figure, sweep_figure
from lmcost.apps.roofline import batch_sweep, class_formulas, critical_batch, prompt_sweep, roofline_points


def _tables_html(est, cfg) -> str:
    console = Console(record=True, width=140, file=open(os.devnull, "w"))
    for table in (render.params_table(est.params, cfg), render.memory_table(est.kv_cache, est.memory),
                  render.phases_table(est), *render.class_tables(est.class_rows)):
        console.print(table)
    return console.export_html(inline_styles=True, code_format="<pre style=\"font-family:monospace\">{code}</pre>")


REPORT_FILES = {"index.html", "summary.json", "ops.csv", "roofline_points.csv"}


def is_report(folder: Path) -> bool:
    """True if ``folder`` holds only what write_report writes (so replacing it loses nothing else)."""
    return {p.name for p in folder.iterdir()} <= REPORT_FILES


def _prompts(cfg: ArchConfig) -> list[int]:
    """Prompt lengths of the prefill sweep: 16 to 128k by powers of two, within a learned position table."""
    limit = cfg.max_positions if cfg.positions == "learned" else 2**17
    return [2**i for i in range(4, 18) if 2**i <= limit] or [limit]


@dataclass(frozen=True, slots=True)
class ReportFigures:
    """The figures of a report: its title, the roofline points (:func:`roofline_points`), the critical
    batch (None: none up to 2^20), and the plotly figures ``roofline`` and ``sweeps``."""

    title: str
    points: object
    critical: int | None
    roofline: object
    sweeps: object


def report_figures(cfg: ArchConfig, gpu: GPU, workload: Workload, precision: Precision = Precision(),
                   settings: Settings = Settings(), batches: list[int] | None = None) -> ReportFigures:
    """The roofline (prefill and decode points at ``batches``, default 1, 8, 64 and the workload's
    microbatch, at context = prompt) and the sweeps (decode over batches 1 to 2048 at context = prompt,
    prefill over :func:`_prompts` at the microbatch) of ``workload`` on one GPU of ``settings.layout``.

    Raises: LmcostError as :func:`roofline_points` (a bad count, a context past the positions)."""
    lay = settings.layout
    batches = sorted(set(batches or [1, 8, 64]) | {lay.microbatch(workload.batch)})
    points = roofline_points(cfg, [gpu], batches, workload.prompt, precision, settings)
    dtype = precision.activations
    crit = critical_batch(cfg, gpu, precision, workload.prompt, settings)
    title = f"{cfg.name} on {gpu.name} ({dtype})"
    roof = roofline_figure(points, [gpu], dtype, f"{title}: roofline, context {workload.prompt}",
                           class_formulas(cfg, precision, settings))
    sweep = sweep_figure(batch_sweep(cfg, gpu, precision, workload.prompt, [2**i for i in range(0, 12)], settings),
                         prompt_sweep(cfg, gpu, precision, lay.microbatch(workload.batch), _prompts(cfg), settings),
                         f"{title}: sweeps", crit)
    return ReportFigures(title, points, crit, roof, sweep)


def write_report(cfg: ArchConfig, gpu: GPU, workload: Workload, out_dir: str | Path,
                 precision: Precision = Precision(), settings: Settings = Settings(),
                 batches: list[int] | None = None, engine=None) -> Path:
    """Write the report of ``workload`` on ``gpu`` into ``out_dir`` (replacing a previous report there).

    The roofline shows prefill and decode points at ``batches`` (default 1, 8, 64 and the workload's
    batch), at context = prompt. ``engine``: the :class:`lmcost.apps.engine_choice.EngineChoice` the GPU's
    figures and the settings' fusions were chosen for (None: none given), named on the page and recorded in
    summary.json's settings. Raises: LmcostError if the parent folder is missing, or ``out_dir`` ends
    in a file's suffix (.html, .json, .csv: a report is a folder).
    """
    import plotly.offline

    if not str(out_dir).strip():
        raise LmcostError("out_dir", "empty", "give a new folder, e.g. `out_dir` reports/llama-h100")
    check_name(out_dir, "out_dir")
    if Path(out_dir).suffix.lower() in (".html", ".htm", ".json", ".csv"):
        raise LmcostError("out_dir", f"{out_dir!s} names a file; a report is a folder (index.html, summary.json and "
                          "CSVs inside)", f"give a folder name, e.g. `out_dir` {Path(out_dir).with_suffix('')}, and open its index.html")
    out = Path(out_dir).resolve()
    if out == out.parent or out == Path.home() or not out.name or Path.cwd().resolve().is_relative_to(out):
        raise LmcostError("out_dir", f"{out_dir!s} is not a report folder", "give a new folder, e.g. `out_dir` reports/llama-h100")
    make_folder(out.parent, "out_dir")
    if out.exists() and not out.is_dir():
        raise LmcostError("out_dir", f"{out} is a file", "give a folder path")
    if out.exists() and not os.access(out, os.W_OK):
        raise LmcostError("out_dir", f"{out} is read-only", "give a folder you can write, or make it writable")
    if out.exists() and any(out.iterdir()) and not is_report(out):
        raise LmcostError("out_dir", f"{out} exists and is not an lmcost report (it would be replaced)",
                          "give a new folder, or empty that one first")
    est = estimate(cfg, gpu, workload, precision, settings)
    from lmcost.apps.engine_choice import engine_record

    est.engine = engine_record(gpu, engine)
    expected, expected_json = "", None
    if gpu.efficiency is not None:  # the calibrated expectation beside the roofline, with its error band
        from dataclasses import replace

        from lmcost.output.render import band, si

        cal = estimate(cfg, gpu, workload, precision, replace(settings, model="calibrated"))
        tpot = f"{si(cal.tpot_s, 's')}{band(cal.tpot_band_s)}" if cal.tpot_s is not None else "n/a (gen = 1)"
        d = cal.to_dict()
        expected_json = dict(model="calibrated", **{k: d["settings"][k] for k in ("attention_kernel", "runtime")},
                             **{k: d[k] for k in ("ttft_s", "tpot_s", "ttft_low_s", "ttft_high_s", "tpot_low_s", "tpot_high_s")})
        expected = (f"<p>Expected (calibrated; attention kernel {html.escape(gpu.efficiency.kernel)}, runtime "
                    f"{html.escape(gpu.efficiency.runtime)}): TTFT {si(cal.ttft_s, 's')}{band(cal.ttft_band_s)}, "
                    f"TPOT {tpot}. The ranges are the efficiency fit's error bands (5th-95th percentile of "
                    "measured / predicted on published kernels it was not fitted on).</p>")
    lay = settings.layout
    layout_note = "" if lay.single else (
        f"; {html.escape(lay.describe())} on {html.escape(est.cluster or '')}: every figure is one GPU's, "
        f"at its microbatch of batch / (dp x pp) sequences (batches in the figures are per GPU), with its "
        "communication (not overlapped with compute)")
    engine_note = "" if engine is None else (f"; engine {html.escape(engine.label)} (kernel figures: "
                                             f"{html.escape(engine.kernel_figures)}; fused: "
                                             f"{html.escape(', '.join(settings.fusion) or 'nothing')})")
    figs = report_figures(cfg, gpu, workload, precision, settings, batches)
    points, crit, title, roof, sweep = figs.points, figs.critical, figs.title, figs.roofline, figs.sweeps
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>lmcost report: {html.escape(title)}</title>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>
<body style="font-family: sans-serif; margin: 2em">
<h1>lmcost report: {html.escape(title)}</h1>
<p>batch {workload.batch}, prompt {workload.prompt}, gen {workload.gen}; weights {precision.weights}, activations
{precision.activations}, KV cache {precision.kv_cache}; {settings.kernel} attention{layout_note}{engine_note}.
Critical batch (decode GEMMs turn compute-bound at context {workload.prompt}): {crit if crit else "none"}.</p>
{expected}
{roof.to_html(full_html=False, include_plotlyjs=False, div_id="roofline")}
{sweep.to_html(full_html=False, include_plotlyjs=False, div_id="sweeps")}
<h2>Estimate</h2>
{_tables_html(est, cfg)}
<p>Data: <a href="summary.json">summary.json</a> (as <code>lmcost estimate --json</code>),
<a href="ops.csv">ops.csv</a> (one row per operator and phase).</p>
</body></html>
"""
    with staged_folder(out, "out_dir") as tmp:
        (tmp / "index.html").write_text(page, encoding="utf-8")
        summary = est.to_dict()
        if expected_json is not None:  # the calibrated expectation beside the roofline estimate
            summary["expected"] = expected_json
        (tmp / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        est.ops.to_csv(tmp / "ops.csv", index=False)
        points.to_csv(tmp / "roofline_points.csv", index=False)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class ReportRequest:
    """One ``lmcost report`` folder: ``model`` (a shipped name, a path or a loaded ArchConfig) on ``gpu`` (a
    name, a path or a GPU) for the :class:`Workload` of ``batch``, ``prompt`` and ``gen``, written to
    ``out_dir`` (replaced as a whole); ``dtype`` ... ``kv_dtype``: as
    :func:`lmcost.apps.setup.resolve_precision`; ``attention``: flash or naive;
    ``attention_kernel``/``runtime``: the efficiency figures of the calibrated expectation
    (:func:`lmcost.apps.setup.select_efficiency`); ``engine``: auto, torch, vllm, sglang or trtllm (``@version``
    optional): the engine's kernel figures and fusions (:func:`lmcost.apps.engine_choice.choose_engine`; None:
    not given); ``tp`` ... ``cluster``: one GPU's share of a parallel layout."""

    model: str | ArchConfig
    gpu: str | GPU = "h100"
    batch: int = 1
    prompt: int = 512
    gen: int = 256
    out_dir: str | Path = Path("report")
    dtype: str = "auto"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    attention: str = "flash"
    attention_kernel: str = "auto"
    runtime: str = "auto"
    engine: str | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    cluster: str | None = None


def run_report(request: ReportRequest, say: Say = quiet) -> Path:
    """Load, resolve and check what ``request`` names and :func:`write_report`; returns the folder written.

    Says (``say``) where the auto figures are not the public fit (:func:`lmcost.apps.engine_choice.say_figures`).
    Raises: LmcostError for an unknown model, GPU, cluster, dtype, kernel family, runtime or engine, an engine
    the GPU has no profile of, a layout that does not split the model or the batch, and the errors of
    :func:`write_report`.
    """
    from lmcost.apps.engine_choice import choose_engine, engine_fusion, say_figures
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.fusion import parse_fusion

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    hw, engine = choose_engine(r.gpu if isinstance(r.gpu, GPU) else load_gpu(r.gpu), r.engine, r.attention_kernel,
                               r.runtime)
    layout = checked_layout(hw, tp=r.tp, pp=r.pp, ep=r.ep, dp=r.dp, cluster=r.cluster)
    layout.check(cfg, r.batch)
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, [hw], say)
    say_figures(hw, engine, say)
    settings = Settings(kernel=r.attention, layout=layout, fusion=parse_fusion(engine_fusion(engine, None, cfg.norm)))
    return write_report(cfg, hw, Workload(r.batch, r.prompt, r.gen), r.out_dir, precision, settings, engine=engine)
