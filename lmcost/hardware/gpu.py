"""Accelerators as data: peak FLOP/s per dtype, memory bandwidth and capacity, read from YAML.

A file keeps the datasheet's units in its key names (``peak_tflops``, ``bandwidth_tb_s``,
``memory_gb``, decimal prefixes); the :class:`GPU` model exposes base units (FLOP/s, B/s, bytes).
Shipped files live in ``lmcost/data/gpus/`` and are found by exact name or alias (``--gpu h100``).
"""

from __future__ import annotations

import math
import unicodedata
from pathlib import Path
from typing import Annotated, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmcost.basics import shipped as resources
from lmcost.basics.files import read_mapping
from lmcost.basics.dtypes import BYTES_PER_ELEMENT
from lmcost.hardware.efficiency import Efficiency
from lmcost.hardware.power import GpuServingPower, GpuTraining
from lmcost.basics.errors import LmcostError, from_validation_error


#: Peak keys that are rates, not storage dtypes (no :data:`BYTES_PER_ELEMENT` entry): tf32 (an fp32 matmul
#: mode) and fp4 (the FP4 tensor rate: NVFP4 on NVIDIA Blackwell, MXFP4 on AMD CDNA 4; see :class:`GPU`).
PEAK_ONLY = ("tf32", "fp4")


class GPU(BaseModel):
    """One accelerator. Peaks are dense (no structured sparsity).

    ``peak_tflops['fp32']`` is the CUDA-core (vector) rate, used for norms, softmax and elementwise
    kernels; the other dtypes are tensor-core rates, used for GEMMs and attention matmuls. Every key is
    optional: a figure no source gives is left out, never guessed, and a dtype without a peak is refused
    for that dtype in one line (:meth:`peak_flops`). Without ``fp32`` the vector kernels are bounded by
    their bytes alone (:attr:`vector_flops` is infinite): still a lower bound, which the run says.

    Two keys are rates, not storage dtypes (:data:`PEAK_ONLY`): ``tf32`` (an fp32 matmul mode) and
    ``fp4``, the dense 4-bit tensor rate. ``fp4`` is one key, not ``nvfp4``/``mxfp4``, because every
    source read gives one FP4 figure per GPU: NVIDIA quotes it for NVFP4 (E2M1 values in 16-element
    blocks with E4M3 scales) on Blackwell, AMD for MXFP4 (32-element blocks, E8M0 scales) on CDNA 4
    (MI355X); each YAML's comment names the format its figure is quoted for. The FP4 sparse figure is
    not twice the dense one on Blackwell Ultra (18 vs 14-15 PFLOPS): only a source's dense figure is used.
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
    #: Board power by what it runs while serving (:mod:`lmcost.hardware.power`; None: the priors).
    power: Optional[GpuServingPower] = None
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
            if k not in BYTES_PER_ELEMENT and k not in PEAK_ONLY:
                raise ValueError(f"unknown dtype {k!r}; use one of {', '.join(PEAK_ONLY)}, {', '.join(BYTES_PER_ELEMENT)}")
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
        """FLOP/s of non-matrix kernels (norms, softmax, elementwise): the fp32 CUDA-core rate, or
        ``inf`` where no source gives one (those kernels are then bounded by their bytes alone: the
        roofline stays a lower bound; :func:`lmcost.apps.setup.say_uncalibrated` says so)."""
        return self.peak_tflops["fp32"] * 1e12 if "fp32" in self.peak_tflops else math.inf

    @property
    def compute_dtypes(self) -> list[str]:
        """The storage dtypes this GPU has a peak for, in its file's order (not the rate-only
        :data:`PEAK_ONLY` keys: no run names tf32 or fp4 as its ``dtype``)."""
        return [k for k in self.peak_tflops if k not in PEAK_ONLY]

    @property
    def fp4_format(self) -> str:
        """The block format the ``fp4`` peak is quoted for and the FP4 tensor cores multiply: ``MXFP4``
        (OCP MX v1.0: 32 E2M1 values per E8M0 scale) on an AMD GPU (CDNA 4: MI355X, whose datasheet
        figure is MXFP4's), else ``NVFP4`` (16 E2M1 values per E4M3 scale: NVIDIA Blackwell's, and the
        format assumed for a GPU file naming no vendor). Read off ``vendor``: no shipped GPU of either
        vendor quotes its FP4 rate for the other's format (see the class and each YAML's ``fp4`` comment).
        Meaningful only where ``peak_tflops`` has ``fp4``."""
        return "MXFP4" if self.vendor.strip().lower() == "amd" else "NVFP4"

    def dtype_fix(self) -> str:
        """The fix of a refused dtype: the dtypes this GPU has, or, where it has none (a datasheet
        without compute figures), what to do instead."""
        if self.compute_dtypes:
            return f"use `dtype` {' or '.join(self.compute_dtypes)}"
        return "its sources give no compute peak: add peak_tflops to its YAML from a datasheet, or use another GPU"

    def peak_flops(self, dtype: str) -> float:
        """Dense matrix FLOP/s for ``dtype`` (tensor cores; ``fp4``: the FP4 tensor rate).

        Raises: LmcostError if the GPU has no rate for that dtype.
        """
        if dtype not in self.peak_tflops:
            raise LmcostError("dtype", f"{self.name} has no {dtype} peak", self.dtype_fix())
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
