"""Serving engines as data: the scheduler and memory defaults of vLLM, SGLang and TensorRT-LLM, read from YAML.

One file per engine and version in ``lmcost/data/engines/`` (``vllm-0.11.yaml``); each default cites the file
or page it was read from (``sources``), and a default that no source gave is stated as an assumption in
``notes``. Found by file name (``vllm-0.11``), alias, path, or a bare engine name (``vllm``: the newest
shipped version). The serving simulator reads these fields; it does not change any other command's numbers.

Defaults that depend on the GPU (vLLM's ``max_num_seqs`` is 1024 on a GPU of at least 70 GiB that is not an
A100, else 256) are the values for the largest GPUs at the top level, with ``smaller_gpus`` tiers that
override them below a memory size or for a GPU name: :meth:`EngineProfile.seqs_for`,
:meth:`EngineProfile.tokens_for` and :meth:`EngineProfile.graphs_for` pick the value for one GPU.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from lmcost.basics import shipped as resources
from lmcost.basics.errors import from_validation_error
from lmcost.basics.files import present, read_mapping

#: Where shipped engine files live (``lmcost/data/engines``).
KIND = "engines"

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
#: A count of sequences, tokens or blocks: 1 to 2^31 (a typo guard; no engine takes more).
Count = Annotated[int, Field(ge=1, le=2**31)]
#: CUDA-graph batch bound: 0 (no graphs, eager mode) to 2^31.
GraphCount = Annotated[int, Field(ge=0, le=2**31)]
#: A fraction of GPU memory, in (0, 1].
Fraction = Annotated[float, Field(gt=0, le=1)]
#: CPU time per step or per sequence, 0 to 1e6 us (1 s: far beyond any scheduler).
Overhead = Annotated[float, Field(ge=0, le=1e6)]
_GIB = 2**30


#: The groups of operator classes ``time_scales`` may scale (:data:`lmcost.cost.engine_step.GROUPS` keys).
TIME_GROUPS = ("gemm.compute", "gemm.memory", "experts.compute", "experts.memory", "attention.compute",
               "attention.memory", "other.compute", "other.memory", "comm", "floor")


class SmallerGpu(BaseModel):
    """Defaults an engine takes on a smaller GPU: below ``below_gib`` GiB (2^30 bytes) of memory, or whose
    name contains one of ``name_contains`` (case-insensitive) whatever its memory. A field left out keeps
    the profile's top-level value."""

    model_config = _STRICT
    below_gib: float = Field(gt=0, le=1e6)
    name_contains: list[str] = []
    max_num_seqs: Optional[Count] = None
    max_num_batched_tokens: Optional[Count] = None
    cuda_graph_max_batch: Optional[GraphCount] = None

    @model_validator(mode="after")
    def _overrides_something(self):
        if self.max_num_seqs is None and self.max_num_batched_tokens is None and self.cuda_graph_max_batch is None:
            raise ValueError("max_num_seqs: a tier sets none of max_num_seqs, max_num_batched_tokens, "
                             "cuda_graph_max_batch; set one or remove the tier")
        return self

    def applies(self, gpu_memory_bytes: float, gpu_name: str) -> bool:
        """Whether a GPU of ``gpu_memory_bytes`` (bytes) named ``gpu_name`` falls in this tier."""
        name = gpu_name.lower()
        return gpu_memory_bytes < self.below_gib * _GIB or any(s.lower() in name for s in self.name_contains)


class EngineProfile(BaseModel):
    """One serving engine at one version: the scheduler and memory knobs at their documented defaults.

    Scheduling: at most ``max_num_seqs`` sequences and ``max_num_batched_tokens`` tokens (prefill chunks plus
    one per decode) per engine step; with ``chunked_prefill`` a prompt is split to fit the remaining budget,
    at most ``max_partial_prefills`` prompts partly prefilled at once; ``mixed_batches``: prefill chunks and
    decodes share a step (False: prefill steps and decode steps alternate, SGLang's default).
    Memory: ``memory_fraction`` of the GPU's ``total`` memory (weights, activations and KV cache: vLLM's
    ``gpu_memory_utilization``; SGLang's ``mem_fraction_static``, weights and KV pool) or of the memory
    ``free`` after weights (TensorRT-LLM's ``free_gpu_memory_fraction``, KV cache only); KV pages of
    ``block_size`` tokens. Admission ``on_demand`` allocates pages as tokens arrive (preempting by
    ``preemption`` when they run out); ``reserve_full`` admits a request only if its whole prompt and
    output fit (TensorRT-LLM's GUARANTEED_NO_EVICT). Decode batches up to ``cuda_graph_max_batch`` run as
    CUDA graphs, padded up to a captured size when ``cuda_graph_padding``.
    Overheads: CPU time per engine step (``step_overhead_us``) and per scheduled sequence per step
    (``seq_overhead_us``), in microseconds; 0 until fitted (``fitted`` says on what).
    """

    model_config = _STRICT

    name: str
    version: str
    aliases: list[str] = []
    description: str = ""
    sources: list[str] = []
    max_num_seqs: Count
    max_num_batched_tokens: Count
    chunked_prefill: bool
    max_partial_prefills: Count
    memory_fraction: Fraction
    memory_fraction_of: Literal["total", "free"]
    block_size: Count
    admission: Literal["on_demand", "reserve_full"]
    #: On-demand admission keeps this share of the running requests' remaining output tokens free (SGLang's
    #: new_token_ratio; 0: none, vLLM's).
    reserve_ratio: float = Field(default=0.0, ge=0, le=1)
    preemption: Literal["recompute", "swap", "none"]
    mixed_batches: bool
    cuda_graph_max_batch: GraphCount
    cuda_graph_padding: bool
    #: Tiers of smaller GPUs, by ascending ``below_gib``: the first that applies overrides the values above.
    smaller_gpus: list[SmallerGpu] = []
    step_overhead_us: Overhead = 0.0
    seq_overhead_us: Overhead = 0.0
    #: Time per kernel a step launches (the gaps between kernels even under CUDA graphs), microseconds: a step
    #: of a model of k kernels (:attr:`lmcost.cost.engine_step.StepModel.kernels`) adds k times it.
    kernel_overhead_us: Overhead = 0.0
    #: Time a request spends outside the engine's steps before its first token: per request (the API server's
    #: HTTP handling, tokenization's fixed part) and per prompt token (tokenization), microseconds.
    request_overhead_us: Overhead = 0.0
    prompt_token_overhead_us: Overhead = 0.0
    #: The engine's kernels against the cost model's, per group of operator classes (:data:`TIME_GROUPS`):
    #: a step's time in each group is multiplied by its factor (missing: 1), at least 1 (the factors scale the
    #: roofline, a lower bound no kernel beats). Fitted with the overheads.
    time_scales: dict[Literal["gemm.compute", "gemm.memory", "experts.compute", "experts.memory", "attention.compute", "attention.memory", "other.compute", "other.memory", "comm", "floor"], Annotated[float, Field(ge=1, le=100)]] = {}
    fitted: str = ""
    notes: str = ""
    # prefix caching
    #: Whether blocks of identical prompt prefixes are reused across requests by default (vLLM's
    #: ``enable_prefix_caching``, SGLang's radix cache unless ``disable_radix_cache``, TensorRT-LLM's
    #: ``enable_block_reuse``); the file's ``sources`` or ``notes`` say where the value was read.
    prefix_caching: bool = False

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9_]{0,31}", v):
            raise ValueError(f"{v!r:.40} is not an engine name; give 1 to 32 lower-case letters, digits or _, "
                             "starting with a letter (vllm, sglang, trtllm)")
        return v

    @field_validator("version")
    @classmethod
    def _dotted_version(cls, v: str) -> str:
        if not re.fullmatch(r"\d{1,6}(\.\d{1,6}){0,3}", v):
            raise ValueError(f"{v!r:.40} is not a version; give dotted numbers (0.11, 1.0)")
        return v

    @field_validator("aliases")
    @classmethod
    def _printable_aliases(cls, v: list[str]) -> list[str]:
        for a in v:
            if not a.strip() or len(a) > 100 or any(not c.isprintable() or c in "/\\" or
                                                    unicodedata.category(c) == "Cf" for c in a):
                raise ValueError(f"{a!r:.40} is not a usable alias; give 1 to 100 printable characters without / or \\")
        return v

    @field_validator("smaller_gpus")
    @classmethod
    def _ascending_tiers(cls, v: list[SmallerGpu]) -> list[SmallerGpu]:
        sizes = [t.below_gib for t in v]
        if any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"below_gib {sizes} is not strictly ascending; list the tiers from the smallest GPU up")
        return v

    @model_validator(mode="after")
    def _partial_within_seqs(self):
        if self.max_partial_prefills > self.max_num_seqs:
            raise ValueError(f"max_partial_prefills: {self.max_partial_prefills} is more than max_num_seqs "
                             f"{self.max_num_seqs}; give at most max_num_seqs")
        return self

    @model_validator(mode="after")
    def _no_preemption_needs_reservation(self):
        # without preemption an on-demand engine has nothing to do when its pages run out: the cache would
        # overflow (a run showed 148% of capacity in use); only reserve_full admission never runs out
        if self.preemption == "none" and self.admission != "reserve_full":
            raise ValueError(f"preemption: none with admission {self.admission} lets the KV cache overflow; give "
                             "admission: reserve_full (a request admitted only if all its tokens fit) or preemption: "
                             "recompute")
        return self

    def notes_for_serve(self) -> list[str]:
        """What a serve run with this profile should say on stderr (one line each): ``preemption: swap`` is
        costed as ``recompute`` (a preempted request's KV is dropped and its prefill run again; the PCIe
        transfers of a swap to host memory and back are not modelled)."""
        if self.preemption == "swap":
            return [f"note: {self.name} {self.version} preempts by swap; lmcost costs it as recompute (the prefill "
                    "run again, not the KV's copies to host memory and back)"]
        return []

    @property
    def key(self) -> str:
        """``name-version`` (``vllm-0.11``): the shipped file's name."""
        return f"{self.name}-{self.version}"

    def _tier(self, gpu_memory_bytes: float, gpu_name: str, field: str):
        for t in self.smaller_gpus:
            if t.applies(gpu_memory_bytes, gpu_name) and getattr(t, field) is not None:
                return getattr(t, field)
        return getattr(self, field)

    def seqs_for(self, gpu_memory_bytes: float, gpu_name: str = "") -> int:
        """The default ``max_num_seqs`` on a GPU of ``gpu_memory_bytes`` bytes named ``gpu_name``: the first
        ``smaller_gpus`` tier that applies and sets it, else the top-level value.

        Source: vLLM ``EngineArgs.get_batch_defaults`` (1024 at >= 70 GiB and not "a100" in the name, else
        256), as cited in the profile's ``sources``.
        """
        return self._tier(gpu_memory_bytes, gpu_name, "max_num_seqs")

    def tokens_for(self, gpu_memory_bytes: float, gpu_name: str = "") -> int:
        """The default ``max_num_batched_tokens`` (tokens per engine step) on that GPU, as :meth:`seqs_for`."""
        return self._tier(gpu_memory_bytes, gpu_name, "max_num_batched_tokens")

    def graphs_for(self, gpu_memory_bytes: float, gpu_name: str = "") -> int:
        """The default ``cuda_graph_max_batch`` on that GPU, as :meth:`seqs_for` (SGLang's ``cuda_graph_max_bs``
        grows with GPU memory)."""
        return self._tier(gpu_memory_bytes, gpu_name, "cuda_graph_max_batch")


def _version(stem: str) -> tuple[int, ...]:
    return tuple(int(p) for p in stem.rsplit("-", 1)[1].split(".") if p.isdigit())


def _newest(name: str) -> Path | None:
    """The shipped file of the newest version of engine ``name`` (``vllm`` -> ``vllm-0.11.yaml``), or None."""
    mine = [p for p in resources.files(KIND) if "-" in p.stem and p.stem.rsplit("-", 1)[0].lower() == name.lower()]
    return max(mine, key=lambda p: _version(p.stem)) if mine else None


def load_engine(name_or_path: str | Path) -> EngineProfile:
    """An engine profile by path, shipped name (``vllm-0.11``) or alias, or bare engine name (``vllm``: the
    newest shipped version).

    Raises: LmcostError naming ``engine`` for an unknown name (listing the known ones), or the file and the
    field (``max_num_seqs``) for a missing, unreadable or invalid file (an unknown key, a value out of bounds).
    """
    name_or_path = _at_version(name_or_path)
    path = Path(name_or_path)
    newest = None
    if not present(path) and resources.find(KIND, str(name_or_path)) is None:
        newest = _newest(str(name_or_path))
    if newest is None:
        bare = sorted({s.rsplit("-", 1)[0] for s in engine_names()})
        newest = resources.locate(KIND, name_or_path, "engine", "engine profile", bare + engine_names())
    data = read_mapping(newest)
    try:
        return EngineProfile.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, str(newest)) from None


def _at_version(name_or_path: str | Path) -> str | Path:
    """``vllm@0.11`` (the spelling estimate's and op's engine takes) -> the shipped ``vllm-0.11``; ``vllm@0.11.0``
    the same (trailing .0 parts dropped); anything else (a path, ``vllm``, ``vllm-0.11``) as given.

    Raises: LmcostError (engine) for an empty name or version, or a version with no shipped profile (listing
    those there are); for auto or torch, which are kernel choices of the other commands, not serving engines."""
    from lmcost.basics.errors import LmcostError

    text = str(name_or_path).strip()
    name = text.partition("@")[0].strip().lower()
    if name in ("auto", "torch"):
        raise LmcostError("engine", f"{name} chooses the kernel figures of estimate, op, plan, report and train, and "
                          "has no scheduler profile", f"use one of: {', '.join(engine_names())}, or a YAML path")
    if "@" not in text or present(Path(text)):
        return name_or_path
    version = text.partition("@")[2].strip()
    if not name or not version:
        raise LmcostError("engine", f"{text!r:.60} names no engine version", "give NAME@VERSION (vllm@0.11) or NAME alone")
    shipped = {n.lower(): n for n in engine_names()}
    for v in dict.fromkeys((version, re.sub(r"(\.0)+$", "", version))):
        if f"{name}-{v}".lower() in shipped:
            return shipped[f"{name}-{v}".lower()]
    raise LmcostError("engine", f"no shipped {name} {version} profile", f"use one of: {', '.join(engine_names())}, "
                      f"or {name} alone (the newest)")


def engine_names() -> list[str]:
    """Names of the shipped engine profiles (``name-version``, sorted); a bare ``name`` also loads (newest)."""
    return resources.names(KIND)
