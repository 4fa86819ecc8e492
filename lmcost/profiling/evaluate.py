"""What ``profile`` and ``validate`` check before running anything, and (below) the runs they make.

Errors name the API fields (``trace``, ``csv_out``, ``batches``); the CLI shows each as its flag.
"""

from __future__ import annotations

from pathlib import Path

from lmcost.basics.errors import LmcostError


def check_profile_outputs(trace: Path, csv_out: Path) -> None:
    """Refuse, before running, a profile's two output files when they are one path, a folder, or in a
    folder that cannot be written.

    Raises: LmcostError (csv_out, trace)."""
    from lmcost.basics.files import check_folder

    if trace.resolve() == csv_out.resolve():
        raise LmcostError("csv_out", f"{csv_out} is also the `trace` path", "give the two files different names")
    for path, field in ((trace, "trace"), (csv_out, "csv_out")):
        if path.is_dir():
            raise LmcostError(field, f"{path} is a folder", "give a file path")
        check_folder(path.parent, field, "give a file path inside a folder")


def check_sharded(device: str, dtype: str, trace) -> None:
    """Refuse a sharded (gloo) check off CPU, outside fp32, or against a trace.

    Raises: LmcostError (tp/pp/ep/dp)."""
    if device != "cpu" or dtype != "fp32" or trace is not None:
        raise LmcostError("tp/pp/ep/dp", "the sharded check runs on CPU in fp32 with gloo (no NCCL run here)",
                          "use `device` cpu `dtype` fp32 and no `trace`")


def check_trace_run(n_models: int, n_batches: int) -> None:
    """Refuse several models or batch sizes against one trace (it holds one run).

    Raises: LmcostError (batches/MODELS)."""
    if n_batches != 1 or n_models != 1:
        raise LmcostError("batches/MODELS", "a trace holds one run", "give the one model and batch size it was taken at")


def check_trace_gpu(gpu) -> None:
    """Refuse a trace compared without the GPU it was taken on (nothing to calibrate: the run is not here).

    Raises: LmcostError (validate.gpu) if ``gpu`` is None."""
    if gpu is None:
        raise LmcostError("validate.gpu", "missing", "name the GPU (or calibrated YAML) the trace was taken on")
