"""Measure the local device's roof: GEMM FLOP/s per dtype, memory bandwidth, and the per-kernel floor.

The result is a hardware YAML in the schema of ``lmcost/data/gpus/*.yaml`` (``--gpu PATH`` accepts it), so a
prediction for this machine uses measured roofs instead of a datasheet's. Method (gpt-fast style):
warm up, synchronise, time with ``perf_counter``, take the median of repeats.
- GEMM: square ``torch.mm`` of n x n in each dtype: 2*n^3 FLOPs; the best rate over sizes and repeats
  (a roof is what the device can reach: noise only slows it).
- bandwidth: the best of ``dst.copy_(src)`` of a large buffer (2 * nbytes, read + write, per copy)
  and GEMVs streaming a weight matrix of that size and of an eighth of it (bytes read per call), each
  its best repeat: a roof is the best rate any kernel reaches. A decode GEMM only reads its weights,
  and a read stream beats a copy (which also allocates its writes): on this project's VM, one thread,
  a 256 MiB GEMV read 20.8 GB/s and a 32 MiB one 27 GB/s (its 300 MiB shared L3 holds it) against the
  copy's 15.2 GB/s, so a copy alone put the roofline of a decode lm_head above its measured time.
- kernel floor: the time of ``x.add_(1)`` on a one-element tensor, what any kernel costs: on CUDA the
  GPU time per kernel of launches queued back to back (CUDA events), on a CPU the median single call.
"""

from __future__ import annotations

import statistics
import time

import torch

from lmcost.basics.errors import LmcostError
from lmcost.profiling.control import call_times
from lmcost.profiling.device import device_name
from lmcost.profiling.torch_dtypes import TORCH_DTYPES



def _median_time(fn, device: str, repeats: int, warmup: int = 2) -> float:
    return statistics.median(call_times(fn, device, repeats, warmup))


def _best_time(fn, device: str, repeats: int, warmup: int = 2) -> float:
    """The fastest repeat: a roof is what the device can do, and noise (other processes, clocks) only slows."""
    return min(call_times(fn, device, repeats, warmup))


def gemm_flops(device: str, dtype: torch.dtype, sizes=(512, 1024, 2048), repeats: int = 5) -> float:
    """Best FLOP/s of square matmuls over ``sizes`` and repeats (2*n^3 FLOPs each)."""
    best = 0.0
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        t = _best_time(lambda: torch.mm(a, b), device, repeats)
        best = max(best, 2 * n**3 / t)
    return best


def gemv_bandwidth(device: str, nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Best bytes/s of a GEMV (one fp32 token against a [n, 2048] weight of ``nbytes``): nbytes read per call."""
    k = 2048
    w = torch.randn(nbytes // (4 * k), k, device=device)
    x = torch.randn(1, k, device=device)
    return w.numel() * 4 / _best_time(lambda: torch.nn.functional.linear(x, w), device, repeats)


def copy_bandwidth(device: str, nbytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Best bytes/s of a device-to-device copy over repeats: (read + write) = 2 * nbytes per copy."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return 2 * nbytes / _best_time(lambda: dst.copy_(src), device, repeats)


def kernel_floor(device: str, repeats: int = 200) -> float:
    """Seconds of the smallest kernel (an in-place add on one element).

    On CUDA, the GPU time per kernel of ``repeats`` launches queued back to back between two CUDA
    events (what one kernel occupies the GPU, the floor a kernel-time model needs), not a launch plus a
    synchronize per call (which adds the host's round trip, tens of microseconds). On a CPU, where the
    op is its own dispatch, the median of single calls.
    """
    x = torch.zeros(1, device=device)
    if not device.startswith("cuda"):
        return _median_time(lambda: x.add_(1), device, repeats, warmup=20)
    for _ in range(20):
        x.add_(1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        x.add_(1)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / repeats


#: dtypes whose GEMM rate calibrate measures (those the reference decoder runs).
MEASURABLE = ("fp32", "bf16", "fp16")


def measured_dtypes(dtypes: str) -> list[str]:
    """The GEMM dtypes a calibration measures, from a comma-separated list (``"bf16"`` -> [fp32, bf16]):
    fp32 always first (it is also the vector rate), each once.

    Raises: LmcostError (dtypes) for an empty list or item, or a dtype outside :data:`MEASURABLE`."""
    parts = [d.strip() for d in dtypes.split(",")]
    if any(parts) and not all(parts):
        raise LmcostError("dtypes", f"{dtypes!r} has an empty item", "separate the dtypes with single commas")
    names = [d for d in parts if d]
    if not names:
        raise LmcostError("dtypes", "empty", "give e.g. fp32,bf16")
    for d in names:
        if d not in MEASURABLE:
            raise LmcostError("dtypes", f"{d!r} cannot be measured", "use fp32, bf16, fp16")
    return list(dict.fromkeys(["fp32", *names]))


def check_output(output) -> None:
    """Refuse, before measuring, a hardware YAML path that is too long, does not end in .yaml or .yml
    (``gpu`` and ``fit`` would not read it back as YAML), is a folder or sits in a folder that cannot be
    written (``output`` None: the YAML is printed).

    Raises: LmcostError (output)."""
    from lmcost.basics.files import check_folder, check_name

    if output is not None:
        check_name(output, "output")
        if output.suffix.lower() not in (".yaml", ".yml"):  # `gpu` reads a .json path as JSON
            raise LmcostError("output", f"the hardware file is written as YAML, not {output.suffix or 'a file without a suffix'}",
                              "give a path ending in .yaml (then use it as `gpu` PATH)")
        if output.is_dir():
            raise LmcostError("output", f"{output} is a folder", "give a file path")
        check_folder(output.parent, "output", "give a file path inside a writable folder")


def calibrate(device: str = "cpu", dtypes=("fp32", "bf16"), quick: bool = False, name: str | None = None,
              fit_dtype: str | None = None, stage=lambda what: None, threads: int | None = None) -> dict:
    """Measure ``device`` and return a hardware mapping (datasheet units, like lmcost/data/gpus/*.yaml),
    with the efficiency model fitted to microbenchmarks in ``fit_dtype`` (default: bf16 on CUDA,
    fp32 on CPU; it must be one of ``dtypes``) (:mod:`lmcost.profiling.fit`).

    ``quick`` uses small sizes (seconds on a laptop CPU): rougher numbers, for tests and CI.
    ``stage`` hears the name of each stage as it starts (a progress display). ``threads``: torch's
    intra-op threads (default one per physical core). The calibration records its own quality in
    ``efficiency.conditions``: host, threads, torch version, the reference kernels before and after
    and the machine state it measured in (:mod:`lmcost.profiling.control`: the fastest reference
    readings over a few seconds, waited for before each stage) and the fit error per kind.
    Raises: LmcostError if fit_dtype is not measured or the thread count is not one; RuntimeError from
    torch if the device is unavailable.
    """
    import platform

    from lmcost.profiling.control import fast_state, set_threads, settle

    n_threads = set_threads(threads)
    fit_dtype = fit_dtype or ("bf16" if device.startswith("cuda") and "bf16" in dtypes else dtypes[0])
    if fit_dtype not in dtypes:
        raise LmcostError("fit_dtype", f"{fit_dtype} is not among the measured dtypes {', '.join(dtypes)}",
                          "add it to `dtypes`")
    sizes = (256, 512) if quick else ((1024, 2048, 4096) if device.startswith("cuda") else (512, 1024, 2048))
    nbytes = (32 if quick else (1024 if device.startswith("cuda") else 256)) * 2**20
    stage("reference kernels")
    state = fast_state(device, 1.0 if quick else 3.0)
    wait = lambda: settle(device, state, 2.0 if quick else 10.0)  # measure each stage in that state
    before, _ = wait()
    stage("GEMM peaks (" + ", ".join(dtypes) + ")")
    peaks = {k: gemm_flops(device, TORCH_DTYPES[k], sizes, 3 if quick else 5) / 1e12 for k in dtypes}
    if device.startswith("cuda"):
        memory = torch.cuda.get_device_properties(device).total_memory
    else:
        import os

        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    stage("memory bandwidth (copy, GEMV)")
    bandwidth = max(copy_bandwidth(device, nbytes), gemv_bandwidth(device, nbytes), gemv_bandwidth(device, nbytes // 8))
    stage("microbenchmarks and the efficiency fit")
    from lmcost.profiling.fit import fit_efficiency

    efficiency = fit_efficiency(device, fit_dtype, peaks[fit_dtype] * 1e12, peaks["fp32"] * 1e12 if "fp32" in peaks
                                else peaks[fit_dtype] * 1e12, bandwidth, quick, wait=wait, state=state)
    after, _ = wait()  # a busy machine does not return to the state in 10 s
    efficiency["conditions"].update(
        host=platform.node(), threads=n_threads,
        reference_s={k: [round(before[k], 7), round(after[k], 7)] for k in before},
        reference_state_s={k: round(v, 7) for k, v in state.items()},
        reference_drift_pct=round(100 * max(abs(after[k] / before[k] - 1) for k in before), 1))
    label = name or ("local-" + ("cuda" if device.startswith("cuda") else "cpu"))
    return dict(
        name=label, aliases=[], description=f"measured: {device_name(device)} ({device}), torch {torch.__version__}",
        vendor="measured", peak_tflops={k: round(v, 6) for k, v in peaks.items()},
        memory_gb=round(memory / 1e9, 3), bandwidth_tb_s=round(bandwidth / 1e12, 6),
        l2_mb=None, interconnect=None, interconnect_gb_s=None, tdp_w=None,
        kernel_floor_us=round(kernel_floor(device) * 1e6, 3), efficiency=efficiency,
        sources=[f"lmcost calibrate on {time.strftime('%Y-%m-%d')}: best of repeats (kernel floor: median); GEMM sizes {list(sizes)}, "
                 f"bandwidth: the best of a copy and a GEMV of {nbytes // 2**20} MiB and a GEMV of {nbytes // 2**23} MiB"],
        notes="Measured, not a datasheet: achieved GEMM rates (fp32 is also the vector rate), memory bandwidth (copy or GEMV), "
              "the smallest kernel's time, and the efficiency model fitted to microbenchmarks (efficiency.conditions).")
