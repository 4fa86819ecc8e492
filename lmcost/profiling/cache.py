"""The cached calibration of this machine: measured once per host and device, then reused."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Callable

from lmcost.basics.errors import LmcostError


#: The most a calibration's reference kernels may move between its start and end. A calibration runs
#: for 15 s or more, long enough for a shared host to switch state on the way (a few-ms kernel then
#: moves 25-35%, :data:`lmcost.profiling.control.STATE_TOLERANCE`); a busy one moves by more.
MAX_DRIFT_PCT = 40.0
#: The largest median |error| of the fitted GEMM figures a usable calibration may have: a quiet CPU's
#: GEMM fit is within about 20%; a calibration under load measured 63-112% (issue 13).
MAX_GEMM_FIT_ERROR_PCT = 40.0


def busy(threads: int) -> str | None:
    """``"load 5.1 on 2 cores"`` when this machine's 1-minute load average leaves ``threads`` intra-op
    threads no room: load > cores - threads + 1 (more runnable work than the cores the threads do not
    take, with one to spare), else None. None for one thread (nothing fewer to fall back to) and where
    no load average is kept (``os.getloadavg``: Unix only). Cores are ``os.cpu_count()``, the CPUs the
    load average counts. On this project's 2-core VM, six workers beside it (load 5-9), a calibration at
    2 threads failed its quality gate three times over 603 s; at 1 thread it passed in 46 s (issue 24)."""
    if threads <= 1:
        return None
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    cores = os.cpu_count() or 1
    return f"load {load:.1f} on {cores} cores" if load > cores - threads + 1 else None


def _refuse_busy(device: str, threads: int, load: str):
    """The one-line refusal of a calibration at ``threads`` threads on a busy machine."""
    return LmcostError("threads", f"the machine is busy ({load}): calibrating {device} at {threads} threads would "
                                  "fail its quality gate", "pass `threads` 1 or run on an idle machine")


def cache_path(device: str, threads: int = 1) -> Path:
    """Where this host's calibration of ``device`` at ``threads`` intra-op threads is cached:
    ~/.cache/lmcost/calibration-<host>-<device>-t<threads>.yaml."""
    return Path.home() / ".cache" / "lmcost" / f"calibration-{platform.node()}-{device}-t{threads}.yaml"


def differences(gpu, *, recorded_only: bool = False, **want) -> list[tuple[str, object, object]]:
    """The conditions of ``gpu``'s calibration (``efficiency.conditions``) that differ from ``want``
    (``host=None`` means this host): (key, recorded value, wanted value) in ``want``'s order. With
    ``recorded_only``, a condition the calibration does not record is not a difference."""
    cond = gpu.efficiency.conditions if gpu.efficiency is not None else {}
    if "host" in want and want["host"] is None:
        want["host"] = platform.node()
    return [(k, cond.get(k, "unrecorded"), v) for k, v in want.items()
            if cond.get(k) != v and not (recorded_only and k not in cond)]


def mismatch(gpu, device: str, threads: int) -> str | None:
    """Why a calibration cannot stand for a run on this host's ``device`` at ``threads`` threads (another
    host, device, torch version or thread count), or None if it can."""
    import torch

    off = differences(gpu, host=None, device=device, torch=str(torch.__version__), threads=threads)
    return f"it was made with {off[0][0]} {off[0][1]!r}, this run has {off[0][2]!r}" if off else None


def quality_problems(gpu) -> list[str]:
    """What fails a calibration's quality gate: its reference kernel moved more than
    :data:`MAX_DRIFT_PCT` (or was not recorded), or its GEMM fit is worse than
    :data:`MAX_GEMM_FIT_ERROR_PCT` (the machine was busy while it measured)."""
    cond = gpu.efficiency.conditions if gpu.efficiency is not None else {}
    out = []
    drift = cond.get("reference_drift_pct")
    if not isinstance(drift, (int, float)):
        out.append("its reference-kernel stability is not recorded")
    elif drift > MAX_DRIFT_PCT:
        out.append(f"its reference kernel moved {drift:.0f}% while it measured (at most {MAX_DRIFT_PCT:.0f}%)")
    gemm = (cond.get("fit_median_abs_error_pct") or {}).get("gemm")
    if not isinstance(gemm, (int, float)):
        out.append("its GEMM fit error is not recorded")
    elif gemm > MAX_GEMM_FIT_ERROR_PCT:
        out.append(f"its GEMM fit error is {gemm}% (at most {MAX_GEMM_FIT_ERROR_PCT:.0f}%)")
    return out


def cached_calibration(device: str, refresh: bool = False, say: Callable[[str], None] = lambda _: None,
                       threads: int | None = None, attempts: int = 3):
    """The cached calibration of this machine's ``device`` at ``threads`` intra-op threads (default:
    one per physical core) as a GPU: measured once, then reused while it matches this host, device,
    torch version and thread count (:func:`mismatch`) and passes its quality gate
    (:func:`quality_problems`); otherwise measured again, up to ``attempts`` times while the fresh
    one fails the gate. ``say`` hears one line before each measurement, saying why. On a CPU, a machine
    too busy for ``threads`` threads (:func:`busy`) is refused before measuring and between attempts.
    Written atomically (a killed run leaves no half file).

    Raises: LmcostError (``threads``) on a busy machine; if the cache folder cannot be written, the cache is unreadable as a GPU YAML
    (the fix: ``refresh``), or every fresh calibration failed the quality gate (a busy machine).
    """
    import yaml

    from lmcost.basics.files import MAX_MAPPING_BYTES, check_folder, read_text, write_text
    from lmcost.hardware.gpu import gpu_from_text, load_gpu
    from lmcost.profiling.calibrate import calibrate
    from lmcost.profiling.control import set_threads

    threads = set_threads(threads)
    cache = cache_path(device, threads)
    reason = "`refresh`" if refresh else None  # said as --recalibrate on the CLI
    if reason is None and cache.is_file():
        try:
            text = read_text(cache, MAX_MAPPING_BYTES, "GPU YAML")
            if not text.strip():
                reason = "the cached calibration file is empty"
            elif "efficiency:" not in text:
                reason = "the cached calibration has no efficiency block (damaged, or from an older lmcost)"
        except LmcostError as e:
            reason = f"the cache is unreadable ({e.what})"
    elif reason is None:
        reason = "no calibration cached"
    if reason is None:
        gpu = _load(cache, load_gpu)
        why = mismatch(gpu, device, threads)
        problems = quality_problems(gpu)
        if why is None and not problems:
            return gpu
        reason = f"the cached calibration cannot be used: {why or '; '.join(problems)}"
    if cache.is_dir():
        raise LmcostError(str(cache), "is a folder, where the cached calibration goes", "remove it")
    check_folder(cache.parent, "calibration cache", "free ~/.cache/lmcost for lmcost's cache, or pass `gpu`")
    if device == "cpu" and (load := busy(threads)):  # before minutes of measuring, not after
        raise _refuse_busy(device, threads, load)
    for attempt in range(attempts):
        if attempt and device == "cpu" and (load := busy(threads)):  # it failed and the machine is still busy
            raise _refuse_busy(device, threads, load)
        say(f"{reason}: calibrating {device} at {threads} thread(s) (cached in {cache}) ...")
        fresh = yaml.safe_dump(calibrate(device, threads=threads), sort_keys=False)
        gpu = gpu_from_text(fresh, str(cache))
        problems = quality_problems(gpu)
        if not problems:
            write_text(cache, fresh)
            return _load(cache, load_gpu)
        reason = f"the calibration failed its quality gate ({'; '.join(problems)})"
    raise LmcostError("calibration", f"the machine was busy while calibrating {device}: {'; '.join(problems)}",
                      "run again on a quiet machine (or with fewer `threads`), or pass `gpu`")


def _load(cache: Path, load_gpu):
    """The cached calibration as a GPU. Raises: LmcostError for an unreadable or incomplete one."""
    try:
        gpu = load_gpu(cache)
    except LmcostError as e:
        raise LmcostError(str(cache), f"the cached calibration is unreadable ({e.what})", "run again with `refresh`") from None
    # A file cut short (by a writer older than atomic writes, or by hand) can still parse: calibrate
    # writes the efficiency block (its conditions and sources) and then the notes last, so a cache
    # without them is incomplete.
    eff = gpu.efficiency
    if eff is None or not eff.sources or "fitting_set" not in eff.conditions or not gpu.notes:
        raise LmcostError(str(cache), "the cached calibration is incomplete (cut short?)", "run again with `refresh`")
    return gpu
