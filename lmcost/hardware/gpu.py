"""Accelerators as data: peak FLOP/s per dtype, memory bandwidth and capacity, read from YAML.

A file keeps the datasheet's units in its key names (``peak_tflops``, ``bandwidth_tb_s``,
``memory_gb``, decimal prefixes); the :class:`GPU` model exposes base units (FLOP/s, B/s, bytes).
Shipped files live in ``lmcost/data/gpus/`` and are found by exact name or alias (``--gpu h100``).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmcost.basics import shipped as resources
from lmcost.basics.files import read_mapping
from lmcost.basics.dtypes import BYTES_PER_ELEMENT
from lmcost.hardware.efficiency import Efficiency
from lmcost.hardware.power import GpuTraining
from lmcost.basics.errors import LmcostError, from_validation_error


class GPU(BaseModel):
    """One accelerator. Peaks are dense (no structured sparsity).

    ``peak_tflops['fp32']`` is the CUDA-core (vector) rate, used for norms, softmax and elementwise
    kernels; the other dtypes are tensor-core rates, used for GEMMs and attention matmuls.
    ``efficiency`` (optional): the calibrated efficiency model (:mod:`lmcost.cost.efficiency`); without
    it the calibrated prediction is the pure roofline. ``training`` (optional): the sustained clock and
    power model of a training step (:class:`lmcost.hardware.power.GpuTraining`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    #: Shown in every table and used as a file name by ``fit --out``: a short printable name, no path
    #: separators, no control or bidirectional-override characters (U+202E reorders a terminal's line).
    name: str
    aliases: list[str] = []
    description: str = ""
    vendor: str = ""
    # Physical bounds (a typo guard, wide enough for a laptop CPU and for devices to come):
    # peaks 1e-5 to 1e5 TFLOP/s (10 MFLOP/s to 100 PFLOP/s), memory 0.01 to 1e6 GB, bandwidth 1e-4 to
    # 1e3 TB/s (100 MB/s to 1 PB/s). Outside them times and capacities stop meaning anything (1e-320
    # TB/s gives infinite times).
    peak_tflops: dict[str, Annotated[float, Field(ge=1e-5, le=1e5)]]
    memory_gb: float = Field(ge=0.01, le=1e6)
    bandwidth_tb_s: float = Field(ge=1e-4, le=1e3)
    # Descriptive figures (no formula reads them), bounded all the same: a negative cache or a zero
    # link is a typo, not a device. L2 0.01 MB to 100 GB; links 1 GB/s (PCIe Gen3 x1) to 100 TB/s;
    # power 1 W to 100 kW.
    l2_mb: Optional[float] = Field(default=None, ge=0.01, le=1e5)
    interconnect: Optional[str] = None
    interconnect_gb_s: Optional[float] = Field(default=None, ge=1, le=1e5)
    tdp_w: Optional[float] = Field(default=None, ge=1, le=1e5)
    kernel_floor_us: Optional[float] = Field(default=None, ge=0, le=1e6)
    efficiency: Optional[Efficiency] = None
    #: Clock through a long training run and its power model (:mod:`lmcost.hardware.power`; None: the priors).
    training: Optional[GpuTraining] = None
    sources: list[str] = []
    notes: str = ""

    @field_validator("name")
    @classmethod
    def _printable_name(cls, v: str) -> str:
        bad = next((c for c in v if not c.isprintable() or c in "/\\" or unicodedata.category(c) == "Cf"), None)
        if not v.strip() or len(v) > 100 or bad is not None:
            what = ("empty" if not v.strip() else f"{len(v)} characters" if len(v) > 100
                    else f"holds {ascii(bad)} (a path separator, a control or a format character)")
            raise ValueError(f"{what}, where a GPU's name is shown in every table and names fit's files; "
                             "give 1 to 100 printable characters without / or \\")
        return v

    @field_validator("peak_tflops")
    @classmethod
    def _known_dtypes(cls, v: dict) -> dict:
        for k in v:
            if k not in BYTES_PER_ELEMENT and k != "tf32":  # tf32: an fp32 matmul mode, not a storage type
                raise ValueError(f"unknown dtype {k!r}; use one of tf32, {', '.join(BYTES_PER_ELEMENT)}")
        if "fp32" not in v:
            raise ValueError("fp32 (vector) peak is missing; add peak_tflops.fp32 from the datasheet")
        return v

    @property
    def memory_bytes(self) -> float:
        """Capacity in bytes (10^9 per datasheet GB)."""
        return self.memory_gb * 1e9

    @property
    def bandwidth(self) -> float:
        """Memory bandwidth in bytes/s."""
        return self.bandwidth_tb_s * 1e12

    @property
    def vector_flops(self) -> float:
        """FLOP/s of non-matrix kernels (norms, softmax, elementwise): the fp32 CUDA-core rate."""
        return self.peak_tflops["fp32"] * 1e12

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix FLOP/s for ``dtype`` (tensor cores).

        Raises: LmcostError if the GPU has no rate for that dtype.
        """
        if dtype not in self.peak_tflops:
            raise LmcostError("dtype", f"{self.name} has no {dtype} peak",
                              f"use `dtype` {' or '.join(k for k in self.peak_tflops if k != 'tf32')}")
        return self.peak_tflops[dtype] * 1e12

    def ridge_point(self, dtype: str) -> float:
        """Arithmetic intensity (FLOPs/byte) where the roofline turns: peak / bandwidth."""
        return self.peak_flops(dtype) / self.bandwidth


def load_gpu(name_or_path: str | Path) -> GPU:
    """A GPU by shipped name or alias (``h100``), or from a YAML path.

    Raises: LmcostError for an unknown name (listing the known ones), a missing or invalid file.
    """
    path = resources.locate("gpus", name_or_path, "gpu", "GPU", gpu_names())
    data = read_mapping(path)
    try:
        return GPU.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, str(path)) from None


def gpu_from_text(text: str, where: str) -> GPU:
    """A GPU from the text of a hardware YAML not yet written (a fit, a calibration): nothing
    half-valid gets written. Raises: LmcostError naming ``where`` and the field for an invalid one."""
    import yaml

    try:
        return GPU.model_validate(yaml.safe_load(text))
    except ValidationError as e:
        raise from_validation_error(e, where) from None


def gpu_names() -> list[str]:
    """Names of the shipped GPUs."""
    return resources.names("gpus")
