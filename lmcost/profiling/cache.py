"""The cached calibration of this machine: measured once per host and device, then reused."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Callable

from ..errors import LmcostError


def cache_path(device: str) -> Path:
    """Where this host's calibration of ``device`` is cached: ~/.cache/lmcost/calibration-<host>-<device>.yaml."""
    return Path.home() / ".cache" / "lmcost" / f"calibration-{platform.node()}-{device}.yaml"


def cached_calibration(device: str, refresh: bool = False, say: Callable[[str], None] = lambda _: None):
    """The cached calibration of this machine's ``device`` as a GPU (measured once, then reused).

    A cache from before the efficiency model, or one that cannot be read, is measured again; ``say``
    hears one line before a measurement starts. Written atomically (a killed run leaves no half file).
    Raises: LmcostError if the cache folder cannot be written, or the cache is unreadable as a GPU YAML
    (the fix: ``--recalibrate``).
    """
    import yaml

    from ..files import check_folder, write_text
    from ..hardware import load_gpu
    from .calibrate import calibrate

    cache = cache_path(device)
    if not refresh and cache.is_file():
        try:
            refresh = "efficiency:" not in cache.read_text()  # from before the efficiency model: measure again
        except (OSError, UnicodeDecodeError):
            refresh = True
    if refresh or not cache.is_file():
        if cache.is_dir():
            raise LmcostError(str(cache), "is a folder, where the cached calibration goes", "remove it")
        check_folder(cache.parent, "calibration cache", "free ~/.cache/lmcost for lmcost's cache, or pass --gpu")
        say(f"calibrating {device} (cached in {cache}) ...")
        write_text(cache, yaml.safe_dump(calibrate(device), sort_keys=False))
    try:
        gpu = load_gpu(cache)
    except LmcostError as e:
        raise LmcostError(str(cache), f"the cached calibration is unreadable ({e.what})", "run again with --recalibrate") from None
    # A file cut short (by a writer older than atomic writes, or by hand) can still parse: calibrate
    # writes the efficiency block (its conditions and sources) and then the notes last, so a cache
    # without them is incomplete.
    eff = gpu.efficiency
    if eff is None or not eff.sources or "fitting_set" not in eff.conditions or not gpu.notes:
        raise LmcostError(str(cache), "the cached calibration is incomplete (cut short?)", "run again with --recalibrate")
    return gpu
