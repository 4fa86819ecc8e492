"""``lmcost breakdown``, ``calibrate``, ``profile`` and ``validate``: what a local device measures, against the model."""

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli.app import emit, err, machine_output, out, progress_over, require_extra, say, status_line, user_errors
from lmcost.cli.options import BatchOpt, BreakdownPhase, Count, Device, DpOpt, DtypeOpt, EpOpt, GpuOpt, Kernel, KernelOpt, LayersOpt, MLAMode, ModelArg, PpOpt, PromptOpt, RepeatsOpt, RunDtype, StepsOpt, ThreadsOpt, TpOpt, parse_ints


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
    import contextlib

    from lmcost.apps.roofline import BreakdownRequest, run_breakdown

    request = BreakdownRequest(model=model, gpu=gpu, phase=phase.value, batch=batch, seq=seq, dtype=dtype,
                               attention=attention.value, layers=layers, device=device and device.value,
                               run_dtype=run_dtype.value, repeats=repeats)
    measure = None
    if device is not None:
        require_extra("torch", "profile", "breakdown --device")
        from lmcost.profiling.breakdown import measured_for as measure
    with status_line(f"measuring {model} on {device.value}") if device is not None else contextlib.nullcontext():
        res = run_breakdown(request, say, measure)
    cfg, hw, precision, df = res.cfg, res.gpu, res.precision, res.table
    if emit(df.to_dict("records")):
        return
    out.print(tables.breakdown_table(f"{escape(cfg.name)}: {phase.value}, b={batch}, s={seq}, {precision.activations} on "
                                     f"{escape(hw.name)} ({attention.value} attention)", df,
                                     None if device is None else f"measured ({device.value}, {run_dtype.value})"))


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


#: The reference decoder's MLA execution: absorbed unless given (and then only on an MLA model).
RunMLAOpt = Annotated[Optional[MLAMode], typer.Option("--mla", help="MLA attention of the run: absorbed (over the latent; the default), naive (up-project K, V), or auto (naive in prefill, absorbed in decode). MLA models only.", show_default=False)]


def _progress(it, batch):
    """Progress on stderr over one run's repeats (:func:`lmcost.cli.app.progress_over`)."""
    return progress_over(it, f"profiling b={batch}")


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
    mla: RunMLAOpt = None,
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
    from lmcost.profiling import evaluate

    if (tp, pp, ep, dp) != (1, 1, 1, 1):
        _sharded(evaluate.ValidateRequest(models=(model,), device=device.value, dtype=dtype.value, layers=layers,
                                          batches=(batch,), prompt=prompt, steps=gen, mla=mla and mla.value,
                                          tp=tp, pp=pp, ep=ep, dp=dp))
        return
    done = evaluate.profile(evaluate.ProfileRequest(
        model=model, device=device.value, dtype=dtype.value, layers=layers, batch=batch, prompt=prompt, steps=gen,
        repeats=repeats, kernel=attention.value, mla=mla and mla.value, trace=trace, csv_out=csv_out, threads=threads),
        say=say, progress=_progress)
    from lmcost.profiling.control import spread
    from lmcost.profiling.validate import gap_line, stability_line

    run, measured = done.run, done.measured
    err.print(f"wrote {done.trace} and {done.csv_out}", markup=False, highlight=False)
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
    mla: RunMLAOpt = None,
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
    from lmcost.profiling import evaluate

    request = evaluate.ValidateRequest(
        models=tuple(models), gpu=gpu, device=device.value, dtype=dtype.value, layers=layers,
        batches=tuple(parse_ints(batch, "--batch")), prompt=prompt, steps=gen, repeats=repeats, kernel=attention.value,
        mla=mla and mla.value, trace=trace, fusion=fuse, report_dir=report_dir, recalibrate=recalibrate, threads=threads,
        retries=retries, tp=tp, pp=pp, ep=ep, dp=dp)
    if request.sharded:
        _sharded(request)
        return
    # The status line starts once the request, its models and its trace are read (an error comes alone);
    # on a terminal its progress bars are the live display.
    found = evaluate.validate(request, say=say, progress=_progress, stage=lambda text: status_line(text, live=False))
    if found.trace_note:
        err.print(found.trace_note, markup=False, highlight=False)
    if found.foreign is not None:
        res = found.foreign
        for line in res.notes:
            err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
        rows = res.table.to_dict("records")
        if emit(rows):
            return
        out.print(tables.foreign_trace_table(f"{escape(str(trace))}: op time by predicted class", rows))
        out.print(f"{res.share:.1%} of the trace's op time ({render.si(res.total_s, 's')}) attributed to predicted "
                  f"operator classes, by {res.method}")
        return
    from lmcost.profiling.validate import END_TO_END, MODELS, median_class_error, stability_line

    err.print(f"wrote {found.report}", markup=False, highlight=False)
    if emit(found.results):
        return
    first = found.per_run[0][0]
    out.print(tables.validation_table(f"predicted ({escape(found.gpu.name)}) vs measured ({first.device}, {first.dtype})",
                                      found.results, MODELS))
    for run, cls, measured in found.per_run:
        e2e = cls[cls.op_class == END_TO_END].set_index("phase")
        line = (f"{escape(run.cfg.name)} b={run.batch}: median |error| over classes: "
                + ", ".join(f"{m} {median_class_error(cls, m):.1f}%" for m in MODELS))
        if not e2e.empty:
            line += "; end to end (calibrated): " + ", ".join(
                f"{label} {e2e.calibrated_error_pct.get(ph, float('nan')):+.1f}%" for ph, label in (("prefill", "TTFT"), ("decode", "TPOT")))
        out.print(line)
        out.print(f"  {escape(stability_line(measured))}")


def _sharded(request) -> None:
    """validate's (and profile's) distributed check, rendered: one table per model and batch; exit 1 on a mismatch."""
    from lmcost.profiling.evaluate import validate_sharded

    found = validate_sharded(request, stage=status_line)
    if not emit(found.results):
        for r in found.results:
            out.print(tables.sharded_table(r, request.prompt, request.steps))
    if not found.ok:
        raise typer.Exit(1)
