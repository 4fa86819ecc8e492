"""Measurements from ``lmcost profile`` traces, as rows ``lmcost fit`` fits on beside a table's.

A trace written by ``lmcost profile`` records the run it was taken of (config, batch, prompt, dtype,
settings) and, per operator scope, its measured time per step over all layers. Each operator whose
kernel the efficiency model has figures for (GEMMs, the flash kernel, norms, RoPE, SiLU-and-mul, adds)
becomes one :class:`lmcost.calibration.measurements.Measurement`: its records at the run's workload, one
execution's time (the step's time over the operator's layer count), the trace's file name as its
source. The reference decoder runs torch eager ops and ``scaled_dot_product_attention``: runtime
``torch-eager``, kernel family ``sdpa``.
"""

from __future__ import annotations

from pathlib import Path

from lmcost.basics.errors import LmcostError
from lmcost.calibration.measurements import Measurement, FAMILIES
from lmcost.profiling import trace as traces
from lmcost.profiling.profile import measured_from_trace, run_from_metadata

#: Kernel kinds of the reference decoder a trace row is fitted as (the table's op names).
OPS_OF_KIND = {"gemm": "gemm", "rmsnorm": "rmsnorm", "layernorm": "layernorm", "rope": "rope",
               "silu_mul": "silu_mul", "add": "add"}


def trace_measurements(path: str | Path, gpu) -> tuple[list[Measurement], int]:
    """The measurements of one lmcost trace taken on ``gpu`` (the GPU YAML it ran on), and how many of
    its operator rows were not of a kind the model fits (embedding lookups, routers, ...).

    Raises: LmcostError for a file that is not an lmcost trace, or a trace with no timed operator.
    """
    path = Path(path)
    data = traces.load(path)
    meta = (data.get("lmcost") if isinstance(data, dict) else None)
    if meta is None:
        raise LmcostError("trace", f"{path.name} is not a trace lmcost profile wrote (no record of its run)",
                          "give a trace of lmcost profile or validate")
    run = run_from_metadata(meta)
    measured = measured_from_trace(run, data).ops
    out, other = [], 0
    for phase in ("prefill", "decode"):
        ops = run.ops(phase)
        rows = measured[measured.phase == phase].set_index("name")["measured_time_s"]
        for i, op in enumerate(ops):
            if op.name not in rows.index or not op.kernels:
                continue
            if op.kind == "sdpa" and op.mnk is not None:
                inner = []  # the work inside the kernel: its softmax (and soft-capping, sinks), no kernels of their own
                for o in ops[i + 1:]:
                    if o.kernels:
                        break
                    inner.append(o)
                kind, family, group = f"attention_{phase}", "sdpa", [op] + inner
            elif op.kind in OPS_OF_KIND:
                kind, family, group = OPS_OF_KIND[op.kind], "" if op.kind == "gemm" else "torch-eager", [op]
            else:
                other += 1
                continue
            t = float(rows[op.name]) / float(op.count)
            if not t > 0:
                continue
            out.append(Measurement(len(out) + 1, run.device, gpu, FAMILIES.get(gpu.name, gpu.name), run.dtype, kind,
                                   "lmcost reference decoder (torch eager)", family,
                                   tuple(group), t, path.name))
    if not out:
        raise LmcostError("trace", f"{path.name} times no operator the efficiency model fits",
                          "profile a model with GEMMs, attention and norms")
    return out, other
