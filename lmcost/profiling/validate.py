"""Predicted against measured time, per operator, per operator class and per phase.

Two predictions of the same (truncated) config and workload on the GPU YAML given (or on the
calibrated local device), side by side: the roofline (a lower bound) and the calibrated efficiency
model (the expected time, :mod:`lmcost.cost.efficiency`). Operators line up by name: the reference
decoder runs each analytic operator in a profiler scope of the same name. In a flash kernel the
softmax runs inside ``attn.sdpa``, so its predicted time is credited to that operator (class attention).

The calibrated figures are fitted on ``lmcost calibrate``'s microbenchmarks and calibration models
(the fitting set, named in the YAML's ``efficiency.conditions``); the decoders validated here are the
evaluation set.
"""

from __future__ import annotations

import platform
import statistics
import time

import numpy as np
import pandas as pd
import torch

from lmcost.hardware.gpu import GPU
from lmcost.operators.ops import OpClass
from lmcost.cost.phases import op_table
from lmcost.basics.errors import LmcostError
from lmcost.profiling import trace as traces
from lmcost.profiling.control import spread
from lmcost.profiling.profile import Measured, Run, run_from_metadata


MODELS = ("roofline", "calibrated")
PRED = [f"{m}_time_s" for m in MODELS]


def predicted(run: Run, gpu: GPU) -> pd.DataFrame:
    """One row per (phase, operator): roofline_time_s and calibrated_time_s (seconds per step, all
    layers), from :func:`lmcost.cost.phases.op_table`."""
    frames = []
    for phase in ("prefill", "decode"):
        df = op_table(run.ops(phase), gpu, run.precision, phase)
        # Work with no scope of its own runs inside another op's: a flash kernel's softmax, soft-capping and
        # sinks inside attn.sdpa, the naive kernel's sinks inside attn.softmax (of the same layer group).
        inside = ({"attn.softmax": "attn.sdpa", "attn.softcap": "attn.sdpa", "attn.sinks": "attn.sdpa"}
                  if run.settings.kernel == "flash" else {"attn.sinks": "attn.softmax"})
        for role, into in inside.items():
            sel = df.role == role
            df.loc[sel, "name"] = [n[: -len(role)] + into for n in df.loc[sel, "name"]]
            df.loc[sel, "op_class"] = (OpClass.ATTENTION if into == "attn.sdpa" else OpClass.SOFTMAX).value
        frames.append(df.rename(columns={f"{m}_s": f"{m}_time_s" for m in MODELS}))
    df = pd.concat(frames, ignore_index=True)
    return df.groupby(["phase", "name", "op_class"], sort=False, as_index=False)[PRED].sum()


def run_of_trace(trace: dict, given: Run) -> Run:
    """The run a trace was taken of: the one an lmcost trace records (the options are then ignored), or
    ``given`` for any other trace. Raises: LmcostError if the recorded model is not ``given``'s."""
    if trace["lmcost"] is None:
        return given
    run = run_from_metadata(trace["lmcost"])
    skip = {"name", "source", "aliases"}
    if run.cfg.model_dump(exclude=skip) != given.cfg.model_dump(exclude=skip):
        raise LmcostError("trace", f"it was taken on {run.cfg.name}, not {given.cfg.name}",
                          "give the model and `layers` of the profiled run")
    return run


def foreign_trace(run: Run, gpu: GPU, trace: dict):
    """Someone else's trace against the predicted classes: :func:`lmcost.profiling.foreign.compare`
    (ops credited by the module that issued them, the trace's batch, prompt and layers checked).

    Returns: a :class:`lmcost.profiling.foreign.Comparison`.
    Raises: LmcostError for a trace of other work than ``run`` or with nothing that matches.
    """
    from lmcost.profiling.foreign import compare as compare_foreign

    return compare_foreign(run, predicted(run, gpu), trace)


#: The per-class rows that are not operator classes: the sum of the operator scopes of a step, and the
#: step's end-to-end wall time.
TOTAL, END_TO_END = "total", "end to end"


def compare(run: Run, gpu: GPU, measured: Measured) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-operator table, per-class table with a 'total' row and an 'end to end' row per phase).

    'total' is the sum of the operator scopes (the mean of the faster half of the steps); 'end to end' compares the whole
    predicted step (TTFT for prefill, TPOT for a decode step: the operators, plus on the calibrated
    side the efficiency block's ``dispatch_us`` per kernel) with the unprofiled wall time of the step
    of the faster half of the unprofiled steps (where the trace records it; :mod:`lmcost.profiling.control`). Columns: phase, [name], op_class, roofline_time_s,
    calibrated_time_s, measured_time_s, spread_pct (100 * (median - min) / min of the measured
    figure over steps), and per model <model>_error_pct = 100 * (predicted - measured) / measured.
    """
    pred = predicted(run, gpu)
    ops = pred.merge(measured.ops[["phase", "name", "measured_time_s", "spread_pct"]], on=["phase", "name"], how="outer")
    ops["op_class"] = ops["op_class"].fillna("unmatched")
    cols = PRED + ["measured_time_s"]
    cls = ops.groupby(["phase", "op_class"], sort=False, as_index=False)[cols].sum(min_count=1)
    totals = ops.groupby("phase", sort=False, as_index=False)[cols].sum(min_count=1)
    totals["op_class"] = TOTAL
    # Spreads of class sums and step totals over the steps measured.
    rep = measured.per_repeat.merge(ops[["phase", "name", "op_class"]], on=["phase", "name"], how="left")
    by_cls = rep.groupby(["phase", "op_class", "repeat"])["time_s"].sum().groupby(["phase", "op_class"]).agg(spread)
    by_tot = rep.groupby(["phase", "repeat"])["time_s"].sum().groupby("phase").agg(spread)
    cls["spread_pct"] = [100 * float(by_cls.get((p, c), float("nan"))) for p, c in zip(cls.phase, cls.op_class)]
    totals["spread_pct"] = [100 * float(by_tot.get(p, float("nan"))) for p in totals.phase]
    frames = [cls, totals[cls.columns]]
    if measured.steps is not None:
        wall = totals.copy()
        wall["op_class"] = END_TO_END
        # The whole step: the operators plus the dispatch between kernels the calibration measured.
        dispatch = gpu.efficiency.dispatch_us * 1e-6 if gpu.efficiency is not None else 0.0
        # A negative dispatch (the profiler's cost inside scopes outweighing the gaps between them, fitted on
        # a noisy machine) never takes the step below its roofline, as no calibrated time goes below it.
        wall["calibrated_time_s"] = [max(c + dispatch * run.kernels(p), r) for c, r, p
                                     in zip(wall.calibrated_time_s, wall.roofline_time_s, wall.phase)]
        wall["measured_time_s"] = [measured.steps.wall_s(p) if measured.steps.wall.get(p) else float("nan") for p in wall.phase]
        wall["spread_pct"] = [100 * spread(measured.steps.wall[p]) if measured.steps.wall.get(p) else float("nan")
                              for p in wall.phase]
        frames.append(wall[cls.columns])
    cls = pd.concat(frames, ignore_index=True)
    for df in (ops, cls):
        for m in MODELS:
            df[f"{m}_error_pct"] = 100 * (df[f"{m}_time_s"] - df.measured_time_s) / df.measured_time_s
    return ops, cls


def median_class_error(cls: pd.DataFrame, model: str) -> float:
    """Median over (phase, class) rows, the total and end-to-end rows excluded, of |error| of ``model`` (percent)."""
    return float(cls[~cls.op_class.isin([TOTAL, END_TO_END])][f"{model}_error_pct"].abs().dropna().median())


def stability_line(measured: Measured) -> str:
    """One line on how a run was measured: threads, the reference kernel before and after, and whether
    the machine looked quiet or busy (:meth:`lmcost.profiling.control.StepTimes.busy`)."""
    st = measured.steps
    if st is None:
        return "stability: not recorded (a trace from before controlled runs)"
    refs = ", ".join(f"{kind} {b * 1e3:.3g} -> {a * 1e3:.3g} ms" for kind, (b, a) in st.reference_s.items())
    base = (f"; calibrated at {', '.join(f'{k} {v * 1e3:.3g} ms' for k, v in st.baseline_s.items())}"
            if st.baseline_s else "")
    busy = st.busy()
    waited = f"; waited {st.waited_s:.1f} s for the calibrated state" if st.waited_s >= 0.5 else ""
    return (f"{st.threads} intra-op thread(s); reference kernels before -> after: {refs} ({100 * st.drift():.1f}% drift)"
            f"{base}{waited}; " + (("BUSY: " + "; ".join(busy)) if busy else "quiet"))


def calibration_notes(gpu: GPU, device: str, dtype: str, threads: int) -> list[str]:
    """Lines for stderr when a measured calibration (``lmcost calibrate``'s YAML given as ``--gpu``) was
    made under other conditions than the run it predicts: another host or device, thread count, dtype."""
    from lmcost.profiling.cache import differences

    if gpu.vendor != "measured":
        return []
    off = [f"{k} {got!r} (this run: {v!r})"
           for k, got, v in differences(gpu, recorded_only=True, host=None, device=device, threads=threads, dtype=dtype)]
    return [f"note: {gpu.name} was calibrated with " + ", ".join(off) + ": its figures may not hold for this run, "
            "and the machine state is not compared"] if off else []


def baseline_of(gpu: GPU, run: Run) -> dict[str, float] | None:
    """The reference kernels of ``gpu``'s calibration (the machine state it measured in; for an older
    calibration the fastest of its before and after, per kernel), where it is a calibration of this
    host's device at the run's threads; else None."""
    from lmcost.profiling.cache import differences

    cond = gpu.efficiency.conditions if gpu.efficiency is not None else {}
    ref, state = cond.get("reference_s"), cond.get("reference_state_s")
    if not isinstance(ref, dict) or differences(gpu, host=None, device=run.device, threads=run.threads):
        return None
    try:
        if isinstance(state, dict):  # the state it measured in
            return {str(k): float(v) for k, v in state.items()}
        return {str(k): float(min(v)) for k, v in ref.items()}
    except (TypeError, ValueError):
        return None


def gap_line(measured: Measured) -> str | None:
    """Per phase, the time of a profiled step outside every operator scope (dispatch, Python between
    operators, launch gaps), in ms and as a share of the step; None without end-to-end times."""
    st = measured.steps
    if st is None or not st.scoped:
        return None
    parts = []
    for phase in ("prefill", "decode"):
        if st.scoped.get(phase) and st.scope_sum.get(phase):
            gap = st.gap_s(phase)
            step = statistics.median(st.scoped[phase])
            parts.append(f"{phase} {gap * 1e3:.3g} ms ({100 * gap / step:.1f}% of the profiled step)")
    return "outside operator scopes: " + "; ".join(parts) if parts else None


def markdown(runs: list[tuple[Run, pd.DataFrame, Measured]], gpu: GPU, device_name: str) -> str:
    """A markdown report: device, dtype, torch version, threads, the fitting and evaluation sets, and per
    run its stability, the per-class table with both models' errors and the spread over steps, the
    end-to-end rows (TTFT, TPOT against wall time) and the time outside operator scopes; then a summary
    over runs."""
    first = runs[0][0]
    cond = gpu.efficiency.conditions if gpu.efficiency is not None else {}
    fitting = (f"{cond.get('fitting_set', 'not recorded')}, on {cond.get('device_name', '?')} "
               f"({cond.get('device', '?')}, {cond.get('dtype', '?')}, torch {cond.get('torch', '?')}, "
               f"{cond.get('threads', '?')} thread(s), {cond.get('date', '?')})"
               if gpu.efficiency is not None else "none: the GPU YAML has no efficiency block, so calibrated = roofline")
    if gpu.efficiency is not None and "fitting_set" not in cond:
        fitting = (f"none fitted here: {gpu.name}'s efficiency figures come from the sources its YAML names "
                   f"(lmcost gpus show {gpu.name})")
    evaluation = "; ".join(f"{r.cfg.name} b={r.batch} prompt {r.prompt}" for r, _, _ in runs)
    lines = [f"# lmcost validate on {first.device} ({first.dtype})", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
             f"- device: {first.device} ({device_name}); host {platform.node()}; {first.threads or '?'} intra-op thread(s)",
             f"- torch {torch.__version__}; dtype {first.dtype}; attention kernel {first.settings.kernel} "
             f"(SDPA backend {first.sdpa_backend or 'not recorded'}); "
             f"MLA {first.settings.mla}; fusion: {', '.join(first.settings.fusion) or 'none'}",
             f"- GPU YAML: `{gpu.name}` ({gpu.description})" + (f"; {gpu.sources[0]}" if gpu.sources else ""),
             "- models: roofline = max(FLOPs/peak, bytes/bandwidth, kernel floor), a lower bound; calibrated = "
             "the efficiency model of the YAML (expected time)",
             f"- fitting set (calibrated model): {fitting}",
             f"- evaluation set (never used in fitting): {evaluation}",
             "- workload: decode step at context prompt + 1; per class, the operator scopes averaged over the faster half "
             "of the phase's steps (whole steps, by the sum of their scopes: noise only slows), spread = how much "
             "slower the median step ran, (median - reported) / reported; "
             f"'{TOTAL}' = the sum of the operator scopes; '{END_TO_END}' = the whole predicted step (TTFT, TPOT; "
             f"calibrated: the operators plus {gpu.efficiency.dispatch_us if gpu.efficiency else 0:g} us of dispatch per kernel) "
             "against the wall time of the faster half of the unprofiled steps", ""]
    f = lambda v: "-" if pd.isna(v) else f"{v * 1e3:.4g}"
    g = lambda v: "-" if pd.isna(v) or not np.isfinite(v) else f"{v:+.1f}"
    sp = lambda v: "-" if pd.isna(v) else f"{v:.0f}"
    summary = []
    for run, cls, measured in runs:
        lines += [f"## {run.cfg.name}, batch {run.batch} ({run.cfg.n_layers} layers, prompt {run.prompt}, "
                  f"{run.steps} decode steps x {run.repeats} repeats)", "", "- " + stability_line(measured)]
        gap = gap_line(measured)
        if gap:
            lines.append("- " + gap)
        lines += ["", "| phase | class | roofline (ms) | calibrated (ms) | measured (ms) | spread % | roofline error % | calibrated error % |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in cls.itertuples():
            lines.append(f"| {r.phase} | {r.op_class} | {f(r.roofline_time_s)} | {f(r.calibrated_time_s)} | "
                         f"{f(r.measured_time_s)} | {sp(r.spread_pct)} | {g(r.roofline_error_pct)} | {g(r.calibrated_error_pct)} |")
        row = dict(run=f"{run.cfg.name} b={run.batch}", busy=bool(measured.steps and measured.steps.busy()),
                   **{m: median_class_error(cls, m) for m in MODELS})
        for key in (TOTAL, END_TO_END):
            tot = cls[cls.op_class == key].set_index("phase")
            for m in MODELS:
                for ph in ("prefill", "decode"):
                    row[f"{m}_{key}_{ph}"] = float(tot[f"{m}_error_pct"].get(ph, float("nan")))
        summary.append(row)
        e2e = lambda m: (f"end to end: TTFT {row[f'{m}_{END_TO_END}_prefill']:+.1f}%, TPOT {row[f'{m}_{END_TO_END}_decode']:+.1f}%"
                         if measured.steps is not None else f"sum of scopes: prefill {row[f'{m}_{TOTAL}_prefill']:+.1f}%, "
                         f"decode step {row[f'{m}_{TOTAL}_decode']:+.1f}%")
        lines += ["", "Median absolute error over classes: " + "; ".join(f"{m} {row[m]:.1f}% ({e2e(m)})" for m in MODELS) + ".", ""]
    lines += ["## Summary", "",
              "| run | roofline: median abs class error % | calibrated: median abs class error % | "
              "calibrated TTFT error % | calibrated TPOT error % | machine |",
              "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {r['run']} | {r['roofline']:.1f} | {r['calibrated']:.1f} | {g(r[f'calibrated_{END_TO_END}_prefill'])} | "
              f"{g(r[f'calibrated_{END_TO_END}_decode'])} | {'busy' if r['busy'] else 'quiet'} |" for r in summary]
    lines.append("")
    return "\n".join(lines)


def profile_model(cfg, *, device: str, dtype: str, layers: int | None, batch: int, prompt: int, steps: int,
                  repeats: int, settings, trace_path, progress=None, threads: int | None = None, retries: int = 0,
                  say=lambda line: None, gpu: GPU | None = None):
    """Profile one batch size of ``cfg`` on the reference decoder (:func:`lmcost.profiling.profile.profile`),
    measuring it again up to ``retries`` times while the machine looks busy
    (:meth:`lmcost.profiling.control.StepTimes.busy`), or unlike ``gpu``'s calibration of it
    (:func:`baseline_of`: each attempt first waits, up to 10 s, for the machine to be back in the
    calibrated state); ``say`` hears one line per retry.

    Returns: (run, :class:`lmcost.profiling.profile.Measured`, path of the Chrome trace written): the
    last attempt's (a busy one is reported as busy).
    """
    from lmcost.profiling.profile import profile

    from lmcost.profiling.control import set_threads

    n = set_threads(threads)
    probe = Run(cfg, device, dtype, batch, prompt, steps, repeats, settings, threads=n)
    baseline = baseline_of(gpu, probe) if gpu is not None else None
    for attempt in range(retries + 1):
        run, measured, path = profile(cfg, device=device, dtype=dtype, layers=layers, batch=batch, prompt=prompt,
                                      steps=steps, repeats=repeats, settings=settings, trace_path=trace_path,
                                      progress=progress, threads=n, baseline=baseline)
        if measured.steps is not None and gpu is not None:
            measured.steps.baseline_s = baseline_of(gpu, run)
        busy = measured.steps.busy() if measured.steps is not None else []
        if not busy or attempt == retries:
            return run, measured, path
        say(f"{run.cfg.name} b={batch}: the machine looked busy ({'; '.join(busy)}): measuring again "
            f"({attempt + 1} of {retries})")


def preflight(cfgs, batches: list[int], *, device: str, dtype: str, layers: int | None, prompt: int, steps: int,
              repeats: int, settings) -> None:
    """Refuse before running anything: the device, every model, and that each run fits (the counts are
    checked before, by :func:`lmcost.profiling.evaluate.check_request`).

    Raises: LmcostError naming the first problem (a model given twice, a prompt a model cannot run, a run
    larger than the device's memory).
    """
    from lmcost.model.config import truncate
    from lmcost.profiling.device import check_device
    from lmcost.profiling.profile import check_fit, check_runnable

    if len({c.name for c in cfgs}) != len(cfgs):
        raise LmcostError("MODELS", "a model is given twice", "give each once")
    check_device(device)
    for base in cfgs:
        check_runnable(base, prompt)
        for b in batches:
            check_fit(Run(truncate(base, layers) if layers else base, device, dtype, b, prompt, steps, repeats, settings))


def trace_path(report_dir, cfg, batch: int):
    """Where validate writes the trace of one run: <report_dir>/trace-<model>-b<batch>.json."""
    from lmcost.basics.files import file_part

    return report_dir / f"trace-{file_part(cfg.name)}-b{batch}.json"


def resolve_trace(path, cfg, *, device: str, dtype: str, layers: int | None, batch: int, prompt: int, steps: int,
                  repeats: int, settings, fusion: tuple, data: dict | None = None):
    """The run a trace file holds and the loaded trace: the run an lmcost trace records, or the one the
    options describe (with ``fusion``, what another runtime fused). ``data``: the trace of ``path`` if
    already read (:func:`lmcost.profiling.trace.load`).

    Returns: (run, trace dict, note or None: a line saying the recorded run was used).
    Raises: LmcostError for an unreadable trace, a trace of another model, or ``fusion`` on an lmcost trace.
    """
    from lmcost.model.config import truncate

    data = traces.load(path) if data is None else data
    cfg = truncate(cfg, layers) if layers else cfg
    given = Run(cfg, device, dtype, batch, prompt, steps, repeats,
                type(settings)(kernel=settings.kernel, mla="absorbed" if settings.mla == "auto" else settings.mla,
                               fusion=fusion))
    run = run_of_trace(data, given)
    if run is not given and fusion != ():
        raise LmcostError("fusion", "an lmcost trace records its own run (the reference decoder fuses nothing)",
                          "drop `fusion`, which is for traces of other runtimes")
    note = None if run is given else (f"using the run recorded in the trace: batch {run.batch}, prompt {run.prompt}, "
                                      f"{run.steps} decode steps x {run.repeats} repeats, {run.device} {run.dtype}")
    return run, data, note


def validate_runs(runs: list, gpu: GPU, report_dir, tag: str, *, write_ops: bool = True) -> tuple[list[dict], list, object]:
    """Compare each (run, measured) with both predictions and write the reports.

    Writes validate-ops-<model>-b<batch>.csv per run (with ``write_ops``) and one markdown report
    validate-<models>-<device>-<dtype>.md (:func:`markdown`) into ``report_dir``.
    Returns: (per-class rows of every run with model and batch, [(run, per-class DataFrame, measured)],
    report path).
    """
    from lmcost.basics.files import file_part, write_text
    from lmcost.profiling.device import device_name

    results, tables = [], []
    for run, measured in runs:
        if measured.steps is not None:
            measured.steps.baseline_s = baseline_of(gpu, run)
        ops, cls = compare(run, gpu, measured)
        tables.append((run, cls, measured))
        busy = bool(measured.steps and measured.steps.busy())
        results += [dict(model=run.cfg.name, batch=run.batch, busy=busy, **r) for r in cls.to_dict("records")]
        if write_ops:
            write_text(report_dir / f"validate-ops-{file_part(run.cfg.name.split(' ')[0])}-b{run.batch}.csv", ops.to_csv(index=False))
    first = runs[0][0]
    md = write_text(report_dir / f"validate-{file_part(tag)}-{first.device}-{first.dtype}.md",
                    markdown(tables, gpu, device_name(first.device)))
    return results, tables, md
