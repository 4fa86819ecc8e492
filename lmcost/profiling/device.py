"""The device a measured run uses: its checks and its name."""

from __future__ import annotations

import platform

import torch

from lmcost.basics.errors import LmcostError


def check_device(device: str) -> None:
    """Raises: LmcostError if ``device`` is not cpu/cuda, or CUDA is asked for and missing."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LmcostError("device", "CUDA is not available here", "use `device` cpu, or run on a machine with a GPU")
    if device != "cpu" and not device.startswith("cuda"):
        raise LmcostError("device", f"unknown device {device!r}", "use cpu or cuda")


def device_name(device: str) -> str:
    """The device's name as the driver reports it (GPU) or the processor's (CPU)."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()
