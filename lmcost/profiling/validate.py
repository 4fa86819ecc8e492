"""Predicted against measured time, per operator, per operator class and per phase.

The prediction is the analytic roofline of the same (truncated) config and workload on the GPU YAML
given (or on the calibrated local device). Operators line up by name: the reference decoder runs
each analytic operator in a profiler scope of the same name. In a flash kernel the softmax runs
inside ``attn.sdpa``, so its predicted time is credited to that operator (its class: attention).
"""

from __future__ import annotations

import platform
import time

import numpy as np
import pandas as pd
import torch

from ..hardware import GPU
from ..ops import OpClass
from ..roofline import op_time
from ..errors import LmcostError
from . import trace as traces
from .profile import Run, run_from_metadata


def predicted(run: Run, gpu: GPU) -> pd.DataFrame:
    """One row per (phase, operator): predicted_time_s (seconds per step, all layers)."""
    rows = []
    for phase in ("prefill", "decode"):
        for op in run.ops(phase):
            name, cls = op.name, op.op_class.value
            if run.settings.kernel == "flash" and op.op_class is OpClass.SOFTMAX:
                name, cls = name.replace("attn.softmax", "attn.sdpa"), OpClass.ATTENTION.value
            rows.append(dict(phase=phase, name=name, op_class=cls,
                             predicted_time_s=float(op_time(op, gpu, run.precision).time_s) * op.count))
    df = pd.DataFrame(rows)
    return df.groupby(["phase", "name", "op_class"], sort=False, as_index=False)["predicted_time_s"].sum()


def run_of_trace(trace: dict, given: Run) -> Run:
    """The run a trace was taken of: the one an lmcost trace records (the options are then ignored), or
    ``given`` for any other trace. Raises: LmcostError if the recorded model is not ``given``'s."""
    if trace["lmcost"] is None:
        return given
    run = run_from_metadata(trace["lmcost"])
    skip = {"name", "source", "aliases"}
    if run.cfg.model_dump(exclude=skip) != given.cfg.model_dump(exclude=skip):
        raise LmcostError("--trace", f"it was taken on {run.cfg.name}, not {given.cfg.name}",
                          "give the model and --layers of the profiled run")
    return run


def foreign_trace(run: Run, gpu: GPU, trace: dict) -> pd.DataFrame:
    """Kernel classes of someone else's trace against the predicted classes, summed over phases.

    Kernel names cannot tell the lm_head or a router from any other GEMM, so those predictions count
    as gemm. Columns: op_class, predicted_time_s, measured_time_s (0 where a side has none).
    """
    pred = predicted(run, gpu)
    pred["op_class"] = pred["op_class"].replace({"embedding": "gemm", "moe_routing": "gemm"})
    pred = pred.groupby("op_class")["predicted_time_s"].sum()
    meas = traces.kernel_class_times(trace).set_index("op_class")["measured_time_s"]
    classes = list(dict.fromkeys([*pred.index, *meas.index]))
    return pd.DataFrame([dict(op_class=c, predicted_time_s=float(pred.get(c, 0.0)),
                              measured_time_s=float(meas.get(c, 0.0))) for c in classes])


def compare(run: Run, gpu: GPU, measured: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-operator table, per-class table with a 'total' row per phase).

    Columns: phase, [name], op_class, predicted_time_s, measured_time_s, ratio (predicted/measured),
    error_pct (100 * (predicted - measured) / measured).
    """
    pred = predicted(run, gpu)
    ops = pred.merge(measured[["phase", "name", "measured_time_s"]], on=["phase", "name"], how="outer")
    ops["op_class"] = ops["op_class"].fillna("unmatched")
    cls = ops.groupby(["phase", "op_class"], sort=False, as_index=False)[["predicted_time_s", "measured_time_s"]].sum(min_count=1)
    totals = ops.groupby("phase", sort=False, as_index=False)[["predicted_time_s", "measured_time_s"]].sum(min_count=1)
    totals["op_class"] = "total"
    cls = pd.concat([cls, totals[cls.columns]], ignore_index=True)
    for df in (ops, cls):
        df["ratio"] = df.predicted_time_s / df.measured_time_s
        df["error_pct"] = 100 * (df.predicted_time_s - df.measured_time_s) / df.measured_time_s
    return ops, cls


def markdown(run: Run, gpu: GPU, tables: list[tuple[int, pd.DataFrame]], device_name: str) -> str:
    """A markdown report: device, dtype, torch version, workload, and the per-class tables by batch."""
    lines = [f"# lmcost validate: {run.cfg.name}", "",
             f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
             f"- device: {run.device} ({device_name}); host {platform.node()}",
             f"- torch {torch.__version__}; dtype {run.dtype}; attention kernel {run.settings.kernel}; MLA {run.settings.mla}",
             f"- prediction: roofline on `{gpu.name}` ({gpu.description})"
             + (f"; {gpu.sources[0]}" if gpu.sources else ""),
             f"- workload: {run.cfg.n_layers} layers, prompt {run.prompt} (prefill), decode step at context "
             f"{run.prompt + 1} ({run.steps} step{'s' if run.steps > 1 else ''} per repeat), {run.repeats} repeats (median)", ""]
    for b, cls in tables:
        lines += [f"## batch {b}", "", "| phase | class | predicted (ms) | measured (ms) | predicted/measured | error % |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in cls.itertuples():
            f = lambda v: "-" if pd.isna(v) else f"{v * 1e3:.4g}"
            g = lambda v, fmt: "-" if pd.isna(v) or not np.isfinite(v) else format(v, fmt)
            lines.append(f"| {r.phase} | {r.op_class} | {f(r.predicted_time_s)} | {f(r.measured_time_s)} | "
                         f"{g(r.ratio, '.3f')} | {g(r.error_pct, '+.1f')} |")
        lines.append("")
        errs = cls[(cls.op_class != "total")].error_pct.abs().dropna()
        tot = cls[cls.op_class == "total"].set_index("phase").error_pct
        lines.append(f"Median absolute error per class: {errs.median():.1f}%; whole prefill "
                     f"{tot.get('prefill', float('nan')):+.1f}%, decode step {tot.get('decode', float('nan')):+.1f}%.")
        lines.append("")
    return "\n".join(lines)
