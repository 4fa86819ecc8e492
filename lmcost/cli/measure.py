"""``lmcost breakdown``, ``calibrate``, ``profile`` and ``validate``: what a local device measures, against the model."""

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli.app import emit, err, machine_output, out, require_extra, say, status_line, user_errors
from lmcost.cli.options import BatchOpt, BreakdownPhase, Count, Device, DpOpt, DtypeOpt, EpOpt, GpuOpt, Kernel, KernelOpt, LayersOpt, MLAMode, MLAOpt, ModelArg, PpOpt, PromptOpt, RepeatsOpt, RunDtype, StepsOpt, ThreadsOpt, TpOpt, parse_ints
from lmcost.cli.notes import note_layers
from lmcost.apps.setup import resolve_precision


@user_errors
@machine_output
def breakdown(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    phase: Annotated[BreakdownPhase, typer.Option(help="train (forward + backward), prefill, or one decode step.")] = BreakdownPhase.train,
    batch: BatchOpt = 8,
    seq: Annotated[int, Count(help="Tokens per sequence (train, prefill) or context (decode); 4k = 4096.")] = 512,
    dtype: DtypeOpt = "auto",
    attention: KernelOpt = Kernel.naive,
    device: Annotated[Optional[Device], typer.Option(help="Also measure the shares on this device (reference decoder).")] = None,
    run_dtype: Annotated[RunDtype, typer.Option("--run-dtype", help="dtype of the measured run (CPUs lack fast fp16).")] = RunDtype.fp32,
    repeats: Annotated[int, typer.Option(help="Measured repeats.")] = 3,
    layers: Annotated[int, typer.Option(help="Keep this many blocks of the model (0: all), predicted and measured.")] = 0,
):
    """Share of FLOPs against share of time by operator class: tensor contraction, normalization, element-wise."""
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings, check_count, check_positions
    from lmcost.hardware.gpu import load_gpu

    from lmcost.apps.roofline import breakdown as shares

    from lmcost.model.config import truncate

    cfg, hw = load_config(model), load_gpu(gpu)
    precision = resolve_precision(dtype, None, None, [hw], say)
    check_count("--repeats", repeats)
    note_layers(cfg, layers)
    cfg = truncate(cfg, layers) if layers else cfg

    check_positions(cfg, seq, "--seq")
    check_count("--seq", seq)
    df = shares(cfg, hw, precision, phase.value, batch, seq, Settings(kernel=attention.value))
    if device is not None:
        require_extra("torch", "profile", "breakdown --device")
        from lmcost.profiling.breakdown import measured_shares

        with status_line(f"measuring {cfg.name} on {device.value}"):
            measured = measured_shares(cfg, phase.value, batch, seq, device.value, run_dtype.value, attention.value, repeats)
        order = {"tensor contraction": 0, "normalization": 1, "element-wise": 2, "other": 3}
        df = df.merge(measured, on="op_class", how="outer").sort_values("op_class", key=lambda c: c.map(order))
    if emit(df.to_dict("records")):
        return
    out.print(tables.breakdown_table(f"{escape(cfg.name)}: {phase.value}, b={batch}, s={seq}, {precision.activations} on "
                                     f"{escape(hw.name)} ({attention.value} attention)", df,
                                     None if device is None else f"measured ({device.value}, {run_dtype.value})"))


def _calibrated(device: str, refresh: bool = False, threads: int | None = None):
    """The cached calibration of this machine's ``device`` at ``threads`` (:func:`lmcost.profiling.cache.cached_calibration`)."""
    from lmcost.profiling.cache import cached_calibration

    return cached_calibration(device, refresh, say=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True),
                              threads=threads)


@user_errors
def calibrate(
    device: Annotated[Device, typer.Option(help="Device to measure.")] = Device.cpu,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the hardware YAML here (else print it).")] = None,
    dtypes: Annotated[str, typer.Option(help="GEMM dtypes to measure, comma-separated (fp32 always: it is also the vector rate).")] = "fp32,bf16",
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: seconds, rougher figures.")] = False,
    threads: ThreadsOpt = None,
):
    """Measure GEMM FLOP/s per dtype, memory bandwidth and the kernel floor; write a hardware YAML."""
    require_extra("torch", "profile", "calibrate")
    import yaml

    from lmcost.basics.files import write_text
    from lmcost.profiling.calibrate import calibrate as measure, check_output, measured_dtypes
    from lmcost.profiling.device import check_device

    check_device(device.value)
    names = measured_dtypes(dtypes)
    check_output(output)
    with status_line(f"calibrating {device.value}") as status:
        measured = measure(device.value, names, quick, threads=threads,
                           stage=lambda what: status.update(f"calibrating {device.value}: {what}") if status else None)
    text = yaml.safe_dump(measured, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        write_text(output, text)
        err.print(f"wrote {output} (use it as --gpu {output})", markup=False, highlight=False)
    _calibration_summary(measured)


def _calibration_summary(measured: dict) -> None:
    """What calibrate measured, on stderr: peaks, bandwidth, kernel floor, and the fit's error per kind."""
    eff = measured.get("efficiency") or {}
    errors = (eff.get("conditions") or {}).get("fit_median_abs_error_pct") or {}
    lines = ["measured: " + ", ".join(f"{k} {v:.4g} TFLOP/s" for k, v in measured["peak_tflops"].items())
             + f"; bandwidth {measured['bandwidth_tb_s'] * 1e3:.4g} GB/s; smallest kernel "
             f"{measured.get('kernel_floor_us') or 0:.3g} us"]
    if errors:
        lines.append("fit, median |error| per kind: " + ", ".join(f"{k} {v:.1f}%" for k, v in errors.items()))
    cond = eff.get("conditions") or {}
    if "reference_drift_pct" in cond:
        lines.append(f"{cond.get('threads')} thread(s); reference kernel drift {cond['reference_drift_pct']:.1f}%")
        from lmcost.hardware.gpu import GPU
        from lmcost.profiling.cache import quality_problems

        problems = quality_problems(GPU.model_validate(measured))
        if problems:
            lines.append("warning: this calibration fails the quality gate validate applies to a cached one: "
                         + "; ".join(problems) + " (the machine was busy?)")
    for line in lines:
        err.print(line, markup=False, highlight=False, soft_wrap=True)


def _note_threads(threads: int | None) -> None:
    """Say so when --threads asks for more intra-op threads than this process has physical cores."""
    from lmcost.profiling.control import physical_cores

    cores = physical_cores()
    if threads is not None and threads > cores:
        err.print(f"note: --threads {threads} is more than the {cores} physical core(s) here: threads will share cores "
                  "and times will vary", markup=False, highlight=False, soft_wrap=True)


def _profile_run(model, device, dtype, layers, batch, prompt, gen, repeats, attention, mla, trace, threads=None, retries=0,
                 gpu=None):
    """Profile one batch size with a progress bar (:func:`lmcost.profiling.validate.profile_model`)."""
    from rich.progress import track

    from lmcost.model.loading import load_config
    from lmcost.profiling.validate import profile_model
    from lmcost.operators.workload import Settings

    cfg = load_config(model) if isinstance(model, str) else model
    note_layers(cfg, layers)
    progress = lambda it: track(it, description=f"profiling b={batch}", console=err, transient=True)
    return profile_model(cfg, device=device.value,
                         dtype=dtype.value, layers=layers, batch=batch, prompt=prompt, steps=gen, repeats=repeats,
                         settings=Settings(kernel=attention.value, mla=mla.value), trace_path=trace, progress=progress,
                         threads=threads, retries=retries, gpu=gpu,
                         say=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True))


@user_errors
def profile(
    model: ModelArg,
    device: Annotated[Device, typer.Option(help="Where the reference decoder runs.")] = Device.cpu,
    dtype: Annotated[RunDtype, typer.Option(help="Weights, activations and KV cache dtype.")] = RunDtype.fp32,
    layers: LayersOpt = 2,
    batch: BatchOpt = 1,
    prompt: PromptOpt = 128,
    gen: StepsOpt = 8,
    repeats: RepeatsOpt = 10,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.absorbed,
    trace: Annotated[Path, typer.Option(help="Chrome trace to write (opens in Perfetto).")] = Path("trace.json"),
    csv_out: Annotated[Path, typer.Option("--csv-out", help="Per-operator measured times (CSV) to write.")] = Path("ops_measured.csv"),
    threads: ThreadsOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
):
    """Run the reference decoder under torch.profiler: a Chrome trace and per-operator measured times.
    With --tp/--pp/--ep/--dp (CPU): the sharded run over gloo processes and its collectives, as validate does."""
    require_extra("torch", "profile", "profile")
    if (tp, pp, ep, dp) != (1, 1, 1, 1):
        _validate_sharded([model], device.value, dtype.value, layers, str(batch), prompt, gen, tp, pp, ep, dp, None)
        return
    from lmcost.profiling.evaluate import check_profile_outputs

    check_profile_outputs(trace, csv_out)
    _note_threads(threads)
    run, measured, path = _profile_run(model, device, dtype, layers or None, batch, prompt, gen, repeats,
                                       attention, mla, trace, threads)
    from lmcost.basics.files import write_text
    from lmcost.profiling.control import spread
    from lmcost.profiling.validate import gap_line, stability_line

    write_text(csv_out, measured.ops.to_csv(index=False))
    err.print(f"wrote {path} and {csv_out}", markup=False, highlight=False)
    out.print(tables.measured_ops_table(f"{escape(run.cfg.name)}: measured on {device.value} ({dtype.value}, SDPA backend "
                                        f"{escape(run.sdpa_backend or '?')})", measured.ops, measured.steps, spread))
    for line in (stability_line(measured), gap_line(measured)):
        if line:
            err.print(line, markup=False, highlight=False, soft_wrap=True)


@user_errors
@machine_output
def validate(
    models: Annotated[list[str], typer.Argument(help="One or more models (YAML, HF config.json, or shipped names): the evaluation set.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Predict with this GPU YAML; default: calibrate the local device.")] = None,
    device: Annotated[Device, typer.Option(help="Where the reference decoder runs.")] = Device.cpu,
    dtype: Annotated[RunDtype, typer.Option(help="Weights, activations and KV cache dtype.")] = RunDtype.fp32,
    layers: LayersOpt = 2,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1",
    prompt: PromptOpt = 128,
    gen: StepsOpt = 8,
    repeats: RepeatsOpt = 10,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.absorbed,
    trace: Annotated[Optional[Path], typer.Option(help="Compare with this Chrome trace instead of running.")] = None,
    fuse: Annotated[str, typer.Option("--fuse", help="With a foreign --trace: what its runtime fuses (see estimate --fuse). lmcost traces record their own.")] = "none",
    report_dir: Annotated[Path, typer.Option("--report-dir", help="Folder for the markdown report and CSVs.")] = Path("reports"),
    recalibrate: Annotated[bool, typer.Option("--recalibrate", help="Measure the local device again instead of reusing the cached calibration.")] = False,
    threads: ThreadsOpt = None,
    retries: Annotated[int, typer.Option("--retries", min=0, max=20, help="Measure a run again, up to this many times, while the machine looks busy or unlike its calibration.")] = 2,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
):
    """Predicted (roofline and calibrated) against measured time per operator class and phase, end to end (TTFT, TPOT against wall time), with a markdown report.
    With --tp/--pp/--ep/--dp (CPU): the decoder sharded over gloo processes, its logits against one
    process's and its collectives against lmcost's communication operators (count, kind, payload)."""
    require_extra("torch", "profile", "validate")
    if (tp, pp, ep, dp) != (1, 1, 1, 1):
        _validate_sharded(models, device.value, dtype.value, layers, batch, prompt, gen, tp, pp, ep, dp, trace)
        return
    from lmcost.basics.files import check_folder
    from lmcost.operators.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.profiling import trace as traces
    from lmcost.profiling.profile import measured_from_trace
    from lmcost.profiling.evaluate import check_trace_gpu, check_trace_run
    from lmcost.profiling.validate import (MODELS, foreign_trace, median_class_error, preflight, resolve_trace,
                                     trace_path, validate_runs)
    from lmcost.operators.workload import Settings

    batches = parse_ints(batch, "--batch")
    fusion = parse_fusion(fuse)
    cfgs = [load_config(m) for m in models]
    if trace is not None:  # a profiled run says so itself
        note_layers(cfgs[0], layers)
    settings = Settings(kernel=attention.value, mla=mla.value)
    if trace is None:  # refuse before running anything: every model and batch must be valid and fit
        preflight(cfgs, batches, device=device.value, dtype=dtype.value, layers=layers or None, prompt=prompt,
                  steps=gen, repeats=repeats, settings=Settings(kernel=attention.value, mla="absorbed"))
    else:
        check_trace_run(len(cfgs), len(batches))
    if trace is None:
        from lmcost.profiling.control import set_threads

        threads = set_threads(threads)  # the calibration and every run use the same count
        _note_threads(threads)
    hw = load_gpu(gpu) if gpu is not None else (None if trace is not None else _calibrated(device.value, recalibrate, threads))
    if trace is None:
        check_folder(report_dir, "--report-dir")
    if trace is None and gpu is not None:
        from lmcost.profiling.validate import calibration_notes

        for line in calibration_notes(hw, device.value, dtype.value, threads):
            err.print(line, markup=False, highlight=False, soft_wrap=True)
    if trace is None and device.value == "cpu" and hw.vendor != "measured":
        err.print(f"note: predicting a CPU run with {hw.name}'s datasheet figures; omit --gpu to calibrate this CPU",
                  markup=False, highlight=False, soft_wrap=True)
    if trace is not None:
        check_trace_gpu(hw)
        run, data, note = resolve_trace(trace, cfgs[0], device=device.value, dtype=dtype.value, layers=layers or None,
                                        batch=batches[0], prompt=prompt, steps=gen, repeats=repeats,
                                        settings=settings, fusion=fusion)
        if note:
            err.print(note, markup=False, highlight=False)
        if not traces.has_scopes(data):
            res = foreign_trace(run, hw, data)
            for line in res.notes:
                err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
            rows = res.table.to_dict("records")
            if emit(rows):
                return
            out.print(tables.foreign_trace_table(f"{escape(str(trace))}: op time by predicted class", rows))
            out.print(f"{res.share:.1%} of the trace's op time ({render.si(res.total_s, 's')}) attributed to predicted "
                      f"operator classes, by {res.method}")
            return
        runs = [(run, measured_from_trace(run, data))]
        check_folder(report_dir, "--report-dir")
    else:
        runs = [_profile_run(cfg, device, dtype, layers or None, b, prompt, gen, repeats, attention, mla,
                             trace_path(report_dir, cfg, b), threads, retries, hw)[:2] for cfg in cfgs for b in batches]
    results, per_run, md = validate_runs(runs, hw, report_dir, "+".join(c.name for c in cfgs), write_ops=trace is None)
    err.print(f"wrote {md}", markup=False, highlight=False)
    if emit(results):
        return
    first = runs[0][0]
    out.print(tables.validation_table(f"predicted ({escape(hw.name)}) vs measured ({first.device}, {first.dtype})",
                                      results, MODELS))
    from lmcost.profiling.validate import END_TO_END, stability_line

    for run, cls, measured in per_run:
        e2e = cls[cls.op_class == END_TO_END].set_index("phase")
        line = (f"{escape(run.cfg.name)} b={run.batch}: median |error| over classes: "
                + ", ".join(f"{m} {median_class_error(cls, m):.1f}%" for m in MODELS))
        if not e2e.empty:
            line += "; end to end (calibrated): " + ", ".join(
                f"{label} {e2e.calibrated_error_pct.get(ph, float('nan')):+.1f}%" for ph, label in (("prefill", "TTFT"), ("decode", "TPOT")))
        out.print(line)
        out.print(f"  {escape(stability_line(measured))}")


def _validate_sharded(models, device, dtype, layers, batch, prompt, gen, tp, pp, ep, dp, trace) -> None:
    """validate's distributed check (see validate): one table per model and batch; exit 1 on a mismatch."""
    from lmcost.model.config import truncate
    from lmcost.model.loading import load_config
    from lmcost.operators.parallel import Layout
    from lmcost.profiling.distributed import compare
    from lmcost.profiling.evaluate import check_sharded

    check_sharded(device, dtype, trace)
    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp)
    results, ok = [], True
    for m in models:
        cfg = load_config(m)
        cfg = truncate(cfg, layers) if layers else cfg
        for b in parse_ints(batch, "--batch"):
            with status_line(f"{cfg.name}: {layout.describe()}, batch {b}, gloo"):
                res = compare(cfg, layout, batch=b, prompt=prompt, gen=gen)
            ok &= res["match"] and res["logits_ok"]
            results.append(dict(model=cfg.name, batch=b, layout=layout.describe(), **res))
    if not emit(results):
        for r in results:
            out.print(tables.sharded_table(r, prompt, gen))
    if not ok:
        raise typer.Exit(1)
