"""Training frameworks as data: the figures of a training step that depend on the software that runs it,
read from ``lmcost/data/frameworks/<name>.yaml``.

Names (``lmcost train --framework``): ``megatron`` (Megatron-LM/Core, NeMo, Megatron-Bridge, Transformer
Engine), ``deepspeed`` (DeepSpeed ZeRO, Megatron-DeepSpeed), ``fsdp`` (PyTorch FSDP/FSDP2 eager: fms-fsdp eager,
NeMo AutoModel, torchtune), ``fsdp-compile`` (FSDP under torch.compile: OLMo-core, torchtitan, fms-fsdp
compiled), ``eager`` (plain PyTorch loops: LitGPT, PEFT, HF Trainer); ``auto`` picks megatron, or fsdp under
ZeRO-3 (:func:`resolve_framework`).

Each figure is a prior with its source in the file's ``sources``, and a ``fit`` slot for the fitted figure and
the rows of the published runs it came from. :mod:`lmcost.cost.train_system` reads them into its
``SystemFigures``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmcost.basics import shipped as resources
from lmcost.basics.errors import LmcostError, from_validation_error
from lmcost.basics.files import read_mapping

#: Where shipped framework files live (``lmcost/data/frameworks``).
KIND = "frameworks"
#: ``--framework`` values: ``auto`` and the shipped files.
FRAMEWORKS = ("auto", "megatron", "deepspeed", "fsdp", "fsdp-compile", "eager")


class FrameworkMemory(BaseModel):
    """A framework's fitted memory figures (``memory:`` block; lmcost.calibration.training_memory_fit):
    ``fragmentation``: the caching allocator's cache beyond allocated, as a fraction of the transient bytes
    (lmcost.cost.train_memory), 0-1; ``sources``/``fit``: the rows it was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    fragmentation: float = Field(ge=0, le=1)
    sources: list[str] = []
    fit: dict[str, str | float | int] | None = None


class Framework(BaseModel):
    """One training framework's figures (every one a prior until the fit writes ``fit``).

    - ``kernel_launch_us``: CPU time to issue one kernel (us); a kernel shorter than it leaves the GPU idle
      for the difference (the CPU cannot run ahead of a GPU that is faster than it);
    - ``step_overhead_ms``: per optimizer step, outside the kernels modelled (data loading, logging, the
      loss's host sync, gradient clipping's launch) (ms);
    - ``step_efficiency``: whole-step fraction of the single-kernel rates the step's compute reaches
      (1: the kernels run as fast in a step as alone), (0, 1];
    - ``comm_sms``: SMs an overlapped collective's kernels hold (NCCL runs one CUDA block per channel), from
      which compute's slowdown while it runs is comm_sms / the GPU's SM count;
    - ``forward_prefetch``/``backward_prefetch``: ZeRO-3/FSDP units whose parameters are gathered ahead of
      the unit computing (0: just in time);
    - ``bucket_mb`` + ``bucket_mb_per_dp`` x dp: the gradient bucket reduced as one collective (MB = 1e6 B);
    - ``recompute_regather``: the recompute forward of a ZeRO-3 unit gathers its parameters again;
    - ``overlap_param_gather``: ZeRO-1/2's updated parameters are all-gathered under the next forward
      (False: after the optimizer step, exposed).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    name: str
    aliases: list[str] = []
    description: str = ""
    kernel_launch_us: float = Field(ge=0, le=1e4)
    step_overhead_ms: float = Field(ge=0, le=1e6)
    step_efficiency: float = Field(gt=0, le=1)
    comm_sms: float = Field(ge=0, le=1024)
    forward_prefetch: int = Field(ge=0, le=64)
    backward_prefetch: int = Field(ge=0, le=64)
    bucket_mb: float = Field(gt=0, le=1e6)
    bucket_mb_per_dp: float = Field(default=0.0, ge=0, le=1e4)
    recompute_regather: bool = False
    overlap_param_gather: bool = True
    sources: list[str] = []
    notes: str = ""
    fit: dict[str, str | float | int] | None = None
    #: Fitted memory figures (None: MemoryFigures' priors).
    memory: FrameworkMemory | None = None


def resolve_framework(name: str, zero: int) -> str:
    """The framework ``name`` means for a step under ZeRO stage ``zero``: ``auto`` is fsdp under ZeRO-3 (the
    sharding Megatron-LM does not run with its own optimizer) and megatron otherwise; any other name is itself.

    Raises: LmcostError (framework) for a name not in :data:`FRAMEWORKS`."""
    if name not in FRAMEWORKS:
        raise LmcostError("framework", f"unknown framework {name!r}", f"use one of {', '.join(FRAMEWORKS)}")
    if name == "auto":
        return "fsdp" if zero == 3 else "megatron"
    return name


def load_framework(name: str) -> Framework:
    """A shipped framework's figures by name (not ``auto``: :func:`resolve_framework` first), or a YAML path.

    Raises: LmcostError for an unknown name or an invalid file."""
    path = resources.locate(KIND, name, "framework", "framework", resources.names(KIND))
    try:
        return Framework.model_validate(read_mapping(path))
    except ValidationError as e:
        raise from_validation_error(e, str(path)) from None
