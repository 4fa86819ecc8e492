"""A GPU's efficiency block as data: the fitted fractions of peak and bandwidth, GEMM tile and wave
figures, per-kernel overheads and error bands that the calibrated time model (:mod:`lmcost.cost.efficiency`,
whose docstring gives the formula) evaluates. Validated once, from the ``efficiency:`` section of a
hardware YAML; ``lmcost fit`` and ``lmcost calibrate`` write it.
"""


from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_serializer, model_validator

from lmcost.basics.errors import LmcostError
from lmcost.basics.opclasses import KINDS, OpClass

#: Keys of the per-kind figures: a kernel kind (finest), an operator class, or default.
CLASS_KEYS = KINDS + tuple(c.value for c in OpClass if c.value not in KINDS) + ("default",)

#: Fractions below this are typos (a kernel at a thousandth of its roof is not a model of anything).
MIN_FRACTION = 1e-3
Fraction = Field(ge=MIN_FRACTION, le=1)
#: Largest per-kernel overhead accepted (us): a second per kernel is a typo, not a device.
MAX_OVERHEAD_US = 1e6
#: Attention kernel families and runtimes of memory-bound kernels that measured tables name
#: (:mod:`lmcost.calibration.measurements` maps implementations onto them); ``--kernel`` and ``--runtime`` accept these.
KNOWN_FAMILIES = ("fa2", "fa3", "cudnn", "flex", "tlx", "triton", "sdpa", "paged-v1", "paged-v2")
KNOWN_RUNTIMES = ("triton", "torch-eager", "cuda")

#: Runtime names that run the kernels of a runtime lmcost has figures for: torch.compile emits Triton
#: kernels (Inductor), Liger's kernels are Triton.
RUNTIME_ALIASES = {"torch-compile": "triton", "liger": "triton"}

#: Shortest K slice a split-K kernel is given (elements): a slice must fill the main loop's pipeline
#: (CUTLASS's multistage mainloops run 3-5 stages of 32-64 K each).
MIN_SPLIT_K = 128

#: Classes an error band is given for (:attr:`Efficiency.bands`).
BAND_CLASSES = ("gemm", "attention_prefill", "attention_decode", "norm", "elementwise", "softmax")


def _check_class_keys(v: dict) -> dict:
    for k in v:
        if k not in CLASS_KEYS:
            raise ValueError(f"unknown operator class {k!r}; use one of {', '.join(CLASS_KEYS)}")
    return v


class GemmEfficiency(BaseModel):
    """Achieved GEMM throughput as a function of shape.

    ``peak_fraction``: fraction of the dense tensor peak a large, well-shaped GEMM reaches.
    ``tile_m``, ``tile_n``: output tile of the kernel (elements); 1 means no tile quantization.
    ``sm_count``: tiles that run at once (streaming multiprocessors; CPU: 1): the wave size.
    ``k_half``: K (elements) at which the small-K penalty K / (K + k_half) halves the rate; 0: none.
    ``tiles``: a menu of output tiles [tile_m, tile_n] the library picks from, each with the split-K
    factors of ``split_k``; the best (tile, split) for the shape is taken (:func:`gemm_shape_efficiency`).
    Omitted: the one tile tile_m x tile_n, split-K whenever there are fewer tiles than SMs (model v1).
    ``reuse_full``: operand reuse tile_m*tile_n/(tile_m+tile_n) (MACs per element loaded) at which a
    tile feeds the tensor cores at full rate; a smaller tile runs at reuse/reuse_full of it. 0: no penalty.
    Each figure belongs to one model: tile_m, tile_n (other than 1) beside a menu, split_k and reuse_full
    without one, and an empty menu without tile_m, tile_n are refused, as is a split_k without 1.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    peak_fraction: float = Fraction
    tile_m: PositiveInt = Field(default=1, le=1024)
    tile_n: PositiveInt = Field(default=1, le=1024)
    sm_count: PositiveInt = Field(default=1, le=100_000)
    k_half: float = Field(default=0.0, ge=0, le=1e6)
    tiles: list[Annotated[list[PositiveInt], Field(min_length=2, max_length=2)]] = Field(default=[], max_length=16)
    split_k: list[PositiveInt] = Field(default=[1], min_length=1, max_length=16)
    reuse_full: float = Field(default=0.0, ge=0, le=1024)

    @field_validator("split_k")
    @classmethod
    def _split_k_has_one(cls, v: list) -> list:
        # Without 1, a GEMM whose tiles fill the SMs has no candidate (split-K is only taken on a short grid).
        if 1 not in v:
            raise ValueError(f"{v} lacks 1 (no split), which every GEMM that fills the SMs runs; add 1")
        return v

    @model_validator(mode="after")
    def _no_figure_of_the_other_model(self) -> "GemmEfficiency":
        # An empty menu with no tile of its own picks no tile: reading it as the one-tile model at 1 x 1 (no
        # tile or wave quantization) is a guess. A dumped one-tile block writes tile_m and tile_n beside it.
        if "tiles" in self.model_fields_set and not self.tiles and not {"tile_m", "tile_n"} & self.model_fields_set:
            raise ValueError("tiles: an empty menu names no tile; list [tile_m, tile_n] pairs, or omit tiles and "
                             "give tile_m, tile_n for the one-tile model")
        # The rest by value, not by presence, so a dumped block (every field written) reads back.
        if self.tiles:
            for k in ("tile_m", "tile_n"):
                if getattr(self, k) != 1:
                    raise ValueError(f"{k}: not read where tiles gives the menu; put the tile in tiles as a "
                                     "[tile_m, tile_n] pair, or drop it")
        else:
            if self.split_k != [1]:
                raise ValueError("split_k: read only with a tiles menu (the one-tile model splits K whenever the "
                                 "tiles leave SMs idle); add tiles, or drop split_k")
            if self.reuse_full:
                raise ValueError("reuse_full: read only with a tiles menu; add tiles, or drop reuse_full")
        return self


class PrefillFigures(BaseModel):
    """One attention kernel family's prefill on one device: e = peak_fraction * L / (L + l_half) of the
    tensor peak at L mean keys per query, plus ``overhead_us`` per call, for the kernel's matmuls; its
    in-kernel softmax adds its vector-rate roofline (a fixed cost per query-key pair, relatively larger
    at small head dims), and the fit predicted the measured kernel as both together.
    ``cta_us``: microseconds each thread block (query tile of 128 rows x head) adds, spread over the SMs:
    + cta_us * CTAs / SMs (:func:`lmcost.cost.efficiency.attention_cta_time`); 0: none (the public fit's).
    ``rows``: the table rows it was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    peak_fraction: float = Fraction
    l_half: float = Field(ge=0, le=1e7)
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    cta_us: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""

    @model_serializer(mode="wrap")
    def _no_zero_cta(self, handler):
        return _drop_zero_cta(handler(self))


class DecodeFigures(BaseModel):
    """One attention kernel family's decode on one device: the KV cache streams at
    bandwidth_fraction * bandwidth * min(1, streams * splits / SMs), streams = b * h_kv and splits =
    ceil(L / split_tokens) (0: the kernel does not split the keys, as vLLM's PagedAttention V1), plus
    ``overhead_us`` per call, plus ``cta_us`` per KV stream spread over the SMs: + cta_us * streams / SMs
    (:func:`lmcost.cost.efficiency.attention_cta_time`; 0: none, the public fit's)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    bandwidth_fraction: float = Fraction
    split_tokens: int = Field(ge=0, le=1 << 24)
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    cta_us: float = Field(default=0.0, ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""

    @model_serializer(mode="wrap")
    def _no_zero_cta(self, handler):
        return _drop_zero_cta(handler(self))


def _drop_zero_cta(d: dict) -> dict:
    """A dumped attention figure without ``cta_us`` when it is 0 (the default): blocks fitted without the
    term (the public table's) dump as before it existed."""
    if isinstance(d, dict) and not d.get("cta_us"):
        d.pop("cta_us", None)
    return d


class KindFigures(BaseModel):
    """A memory-bound kernel kind under one runtime: bandwidth fraction and microseconds per call."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    bandwidth_fraction: float = Fraction
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""


#: Engines a profile may be fitted for (the serving stacks of aiconfigurator-core's tables).
KNOWN_ENGINES = ("vllm", "sglang", "trtllm")
#: Operand dtypes a GEMM may have its own fraction of that dtype's peak for.
GEMM_DTYPES = ("bf16", "fp16", "fp8", "fp4")
#: Operand dtypes an engine may quantize a GEMM's activations to in a pass of its own.
QUANTIZED_GEMM_DTYPES = ("fp8", "fp4")


class EngineProfile(BaseModel):
    """The kernels one serving engine runs on one device, fitted on that engine's measured rows.

    ``version``: the engine version the rows were measured under (vLLM 0.x.y, SGLang, TensorRT-LLM).
    ``gemm``: the GEMM tile/split-K model's figures of the engine's default GEMM (bf16).
    ``gemm_dtype_fraction``: per operand dtype (fp8, fp4) the fraction of THAT dtype's dense peak a large
    GEMM reaches (the tile model's shape factor applied as for bf16); a dtype absent takes ``gemm.peak_fraction``.
    ``gemm_dtype_overhead_us``: per operand dtype, its GEMMs' per-call floor (an fp8 GEMM under an engine
    quantizes its activations in a kernel of its own); a dtype absent takes ``overhead_us``.
    ``gemm_quantize_dtypes``: operand dtypes (fp8, fp4) whose GEMMs under the engine quantize their bf16
    activations in a pass of their own, timed as its bytes at the GEMM bandwidth
    (:func:`lmcost.cost.efficiency.activation_quant_time`); empty: none.
    ``gemm_bandwidth_fraction``: fraction of bandwidth a memory-bound (small-M) GEMM streams its weights at;
    None: the base block's.
    ``attention_prefill`` / ``attention_decode``: the engine's default attention kernel's figures.
    ``overhead_us``: per-call floor of a GEMM under the engine (CUDA graphs: no launch gap, the kernel's own
    ramp and tail), fitted on its smallest GEMM rows.
    ``bands``: per class (gemm, attention_prefill, attention_decode) [low, high] ratios of measured to predicted
    time (5th-95th percentiles of held-out rows). ``fit``: table, sha256, rows, errors, coverage.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    version: str = Field(min_length=1, max_length=64)
    gemm: GemmEfficiency
    gemm_dtype_fraction: dict[str, float] = {}
    gemm_dtype_overhead_us: dict[str, float] = {}
    gemm_quantize_dtypes: list[str] = []
    gemm_bandwidth_fraction: float | None = Field(default=None, ge=MIN_FRACTION, le=1)
    attention_prefill: PrefillFigures
    attention_decode: DecodeFigures
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    bands: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]] = {}
    fit: dict[str, Any] = {}

    @field_validator("gemm_dtype_fraction")
    @classmethod
    def _dtype_fractions(cls, v: dict) -> dict:
        for k, f in v.items():
            if k not in GEMM_DTYPES:
                raise ValueError(f"unknown GEMM dtype {k!r}; use one of {', '.join(GEMM_DTYPES)}")
            if not MIN_FRACTION <= f <= 1:
                raise ValueError(f"gemm_dtype_fraction.{k} must be from {MIN_FRACTION} to 1, got {f}")
        return v

    @field_validator("gemm_dtype_overhead_us")
    @classmethod
    def _dtype_overheads(cls, v: dict) -> dict:
        for k, f in v.items():
            if k not in GEMM_DTYPES:
                raise ValueError(f"unknown GEMM dtype {k!r}; use one of {', '.join(GEMM_DTYPES)}")
            if not 0 <= f <= MAX_OVERHEAD_US:
                raise ValueError(f"gemm_dtype_overhead_us.{k} must be from 0 to {MAX_OVERHEAD_US:g} us, got {f}")
        return v

    @field_validator("gemm_quantize_dtypes")
    @classmethod
    def _quantize_dtypes(cls, v: list) -> list:
        return _check_names(v, QUANTIZED_GEMM_DTYPES, "quantized GEMM dtype")

    @field_validator("bands")
    @classmethod
    def _bands(cls, v: dict) -> dict:
        return _check_bands(v)


def _check_names(v, known: tuple, what: str):
    """``v`` (its keys, or items) if each is one of ``known``; else ValueError naming the first that is not."""
    for k in v:
        if k not in known:
            raise ValueError(f"unknown {what} {k!r}; use one of {', '.join(known)}")
    return v


def _check_bands(v: dict) -> dict:
    for k, (lo, hi) in v.items():
        if k not in BAND_CLASSES:
            raise ValueError(f"bands: unknown class {k!r}; use one of {', '.join(BAND_CLASSES)}")
        if not 0 < lo <= 1 <= hi < 100:
            raise ValueError(f"bands.{k} must be [low <= 1, high >= 1] ratios of measured to predicted time, "
                             f"got [{lo}, {hi}]")
    return v


class Efficiency(BaseModel):
    """The ``efficiency`` block of a hardware YAML (all optional but ``gemm``).

    ``attention_peak_fraction``: fraction of the tensor peak a fused attention kernel's matmuls reach.
    ``vector_fraction``: fraction of the vector (fp32) rate non-matmul kernels reach.
    ``bandwidth_fraction``: fraction of memory bandwidth reached, keyed by kernel kind (rmsnorm,
    silu_mul, rope, add, ...: :data:`lmcost.operators.ops.KINDS`), by operator class (gemm, attention,
    softmax, norm, elementwise, embedding, moe_routing), or ``default``; the finest key present wins.
    ``kernel_overhead_us``: fixed microseconds each kernel adds (same keys).
    ``conditions``: how the figures were measured (device, driver, torch, dtype, date, fitting set).
    ``sources``: where each figure comes from, by field name.

    Model v2 (written by ``lmcost fit`` from measured tables; all optional):
    ``attention_prefill`` / ``attention_decode``: figures per attention kernel family (fa2, fa3, ...,
    and ``auto``: fitted on every family measured on the device, the default).
    ``kinds``: per runtime (``auto``, ``triton``, ``torch-eager``, ``cuda``), per kernel kind
    (rmsnorm, silu_mul, ...), the memory-bound figures; a kind a runtime lacks takes ``auto``'s, then
    the v1 tables'. ``kernel``, ``runtime``: the family and runtime selected (:meth:`select`).
    ``bands``: per class (gemm, attention_prefill, attention_decode, norm, elementwise, softmax), the
    5th and 95th percentiles of measured / predicted time left by the fit's leave-one-source-out
    predictions: the expected error interval of a calibrated time.
    ``fit``: what the figures were fitted on and the error they leave.
    ``engines``: per serving engine (vllm, sglang, trtllm), its :class:`EngineProfile`; ``engine``: the one
    selected (:meth:`with_engine`; "" for none: the block's own figures). ``gemm_dtype_fraction``: per
    operand dtype, the fraction of that dtype's peak a GEMM reaches (set from a profile; absent: gemm's);
    ``gemm_quantize_dtypes``: the profile's (:class:`EngineProfile`). ``own_bands``: under an engine, the bands
    auto/torch give (:func:`lmcost.apps.setup.select_efficiency`), for ops the engine's designs do not cost (LayerNorm).
    ``memory_designs``: the serving engine whose norm, activation and RoPE kernel designs time those kinds
    (:meth:`with_memory_designs`; "" for none: the block's own figures).
    ``dispatch_us``: per kernel, a whole step's wall time less the sum of its operators' measured
    times, fitted by ``lmcost calibrate`` on its calibration models: the dispatch between operators
    (a CPU's Python and framework time, eager launch gaps on a GPU) less what the profiler adds inside
    the operator scopes the per-operator figures were fitted on, so it may be negative. Added once
    per kernel to whole-step times (``validate``'s end-to-end TTFT and TPOT), never to operator rows.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    gemm: GemmEfficiency
    attention_peak_fraction: float = Field(default=1.0, ge=MIN_FRACTION, le=1)
    vector_fraction: float = Field(default=1.0, ge=MIN_FRACTION, le=1)
    bandwidth_fraction: dict[str, float] = {}
    kernel_overhead_us: dict[str, float] = {}
    conditions: dict[str, Any] = {}
    sources: dict[str, str] = {}
    attention_prefill: dict[str, PrefillFigures] = {}
    attention_decode: dict[str, DecodeFigures] = {}
    kinds: dict[str, dict[str, KindFigures]] = {}
    kernel: str = "auto"
    runtime: str = "auto"
    bands: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]] = {}
    fit: dict[str, Any] = {}
    dispatch_us: float = Field(default=0.0, ge=-MAX_OVERHEAD_US, le=MAX_OVERHEAD_US)
    engines: dict[str, EngineProfile] = {}
    engine: str = ""
    gemm_dtype_fraction: dict[str, float] = {}
    gemm_dtype_overhead_us: dict[str, float] = {}
    gemm_quantize_dtypes: list[str] = []
    own_bands: dict[str, Annotated[list[float], Field(min_length=2, max_length=2)]] = {}
    memory_designs: str = ""

    @field_validator("bands")
    @classmethod
    def _bands(cls, v: dict) -> dict:
        return _check_bands(v)

    @field_validator("engines")
    @classmethod
    def _engines_known(cls, v: dict) -> dict:
        return _check_names(v, KNOWN_ENGINES, "engine")

    @field_validator("gemm_dtype_fraction")
    @classmethod
    def _dtype_fractions(cls, v: dict) -> dict:
        return EngineProfile._dtype_fractions(v)

    @field_validator("gemm_dtype_overhead_us")
    @classmethod
    def _dtype_overheads(cls, v: dict) -> dict:
        return EngineProfile._dtype_overheads(v)

    @field_validator("gemm_quantize_dtypes")
    @classmethod
    def _quantize_dtypes(cls, v: list) -> list:
        return EngineProfile._quantize_dtypes(v)

    def engine_names(self) -> list[str]:
        """``name@version`` of each engine profile this block has, sorted."""
        return [f"{k}@{p.version}" for k, p in sorted(self.engines.items())]

    def with_engine(self, name: str, version: str | None = None, memory: tuple[dict, dict] = ({}, {})) -> "Efficiency":
        """A copy whose GEMM figures (tile model, per-dtype fractions, memory-bound bandwidth, per-call floor),
        ``auto`` prefill and decode attention figures and bands (gemm, attention_prefill, attention_decode) are
        those of engine ``name``'s profile; the memory-bound kinds its kernels run (norms, fused add + norm,
        gated activations, RoPE) take ``memory``'s figures with its bands ({kind: RowKindFigures}, {band class:
        (low, high)}: :func:`lmcost.hardware.engine_memory.engine_memory_figures` of the engine); every other
        figure (other kinds, families) stays the block's.
        ``engine`` records ``name@version``; the attention bandwidth fraction becomes the profile's decode one. ``version`` None: the profile's own; given, it must equal it.

        Raises: LmcostError (engine) for an engine or version this block has no profile of, listing those it has.
        """
        key = (name or "").strip().lower()
        have = ", ".join(self.engine_names()) or "none (no engine profile fitted for this GPU)"
        prof = self.engines.get(key)
        if prof is None:
            raise LmcostError("engine", f"no {name!r} profile on this GPU", f"use auto, torch or one of: {have}")
        if version is not None and version.strip() != prof.version:
            raise LmcostError("engine", f"no {key} {version.strip()!r} profile on this GPU (it has {key} {prof.version})",
                              f"use {key}@{prof.version}, or {key} alone")
        bw = dict(self.bandwidth_fraction)
        ov = dict(self.kernel_overhead_us)
        if prof.gemm_bandwidth_fraction is not None:
            bw["gemm"] = prof.gemm_bandwidth_fraction
        ov["gemm"] = prof.overhead_us
        bw["attention"] = prof.attention_decode.bandwidth_fraction  # as the fit took it for prefill's bytes
        designed = self.with_memory_designs(*memory, key) if memory[0] else self
        return designed.model_copy(update=dict(  # the profile's tiles run on this block's SMs (a GPU file edited)
            gemm=prof.gemm.model_copy(update={"sm_count": self.gemm.sm_count}), gemm_dtype_fraction=dict(prof.gemm_dtype_fraction),
            gemm_dtype_overhead_us=dict(prof.gemm_dtype_overhead_us),
            gemm_quantize_dtypes=list(prof.gemm_quantize_dtypes), bandwidth_fraction=bw,
            kernel_overhead_us=ov, attention_prefill={**self.attention_prefill, "auto": prof.attention_prefill},
            attention_decode={**self.attention_decode, "auto": prof.attention_decode},
            bands={**designed.bands, **prof.bands}, engine=f"{key}@{prof.version}"))

    def with_memory_designs(self, kinds: dict, bands: dict, engine: str) -> "Efficiency":
        """A copy whose ``auto`` figures of the memory-bound kinds in ``kinds`` ({kind: RowKindFigures}: norms,
        fused add + norm, gated activations, RoPE, add) are serving engine ``engine``'s kernel designs, with their
        ``bands`` ({band class: (low, high)}) (:func:`lmcost.hardware.engine_memory.engine_memory_figures`);
        ``memory_designs`` records ``engine``. Other kinds and every other figure stay the block's."""
        return self.model_copy(update=dict(kinds={**self.kinds, "auto": {**self.kinds.get("auto", {}), **kinds}},
                                           bands={**self.bands, **bands},
                                           memory_designs=engine))

    def gemm_overhead_s(self, dtype: str) -> float:
        """Seconds per call of a GEMM of operand ``dtype``: the dtype's own floor (an engine's fp8), else gemm's."""
        if dtype in self.gemm_dtype_overhead_us:
            return self.gemm_dtype_overhead_us[dtype] * 1e-6
        return self.overhead_s("gemm", "gemm")

    def gemm_fraction(self, dtype: str) -> float:
        """Fraction of ``dtype``'s dense peak a large GEMM reaches: the dtype's own figure (an engine
        profile's fp8/fp4), else ``gemm.peak_fraction``."""
        return self.gemm_dtype_fraction.get(dtype, self.gemm.peak_fraction)

    @field_validator("attention_prefill", "attention_decode")
    @classmethod
    def _families_known(cls, v: dict) -> dict:
        # A family --kernel cannot name is figures nothing reads.
        for k in v:
            if k not in ("auto", *KNOWN_FAMILIES):
                raise ValueError(f"unknown kernel family {k!r}; use auto or one of {', '.join(KNOWN_FAMILIES)}")
        return v

    @field_validator("kinds")
    @classmethod
    def _kinds_known(cls, v: dict) -> dict:
        for runtime, table in v.items():
            if runtime not in ("auto", *KNOWN_RUNTIMES):
                raise ValueError(f"unknown runtime {runtime!r}; use auto or one of {', '.join(KNOWN_RUNTIMES)}")
            try:
                _check_class_keys(table)
            except ValueError as e:
                raise ValueError(f"under {runtime}: {e}") from None
        return v

    @model_validator(mode="after")
    def _selection_exists(self) -> "Efficiency":
        for table, what in ((self.attention_prefill, "attention_prefill"), (self.attention_decode, "attention_decode"),
                            (self.kinds, "kinds")):
            if table and "auto" not in table:
                raise ValueError(f"{what} has no 'auto' entry; add the figures fitted on every family (lmcost fit)")
        # A selection with no figures would silently take auto's: a typo (fa9) must not pass for a choice.
        if self.kernel != "auto" and self.kernel not in self.families():
            raise ValueError(f"kernel: no figures for {self.kernel!r} in this block; use auto or one of "
                             f"{', '.join(self.families()) or 'the families of attention_prefill/attention_decode'}")
        if self.runtime != "auto" and self.runtime not in self.kinds:
            raise ValueError(f"runtime: no figures for {self.runtime!r} in this block; use auto or one of "
                             f"{', '.join(self.kinds) or 'the runtimes of kinds'}")
        return self

    def families(self) -> list[str]:
        """Attention kernel families with figures (prefill or decode)."""
        return sorted(set(self.attention_prefill) | set(self.attention_decode))

    def runtimes(self) -> list[str]:
        """Runtimes with figures of memory-bound kernels."""
        return sorted(self.kinds)

    def select(self, kernel: str | None = None, runtime: str | None = None) -> "Efficiency":
        """This block with an attention kernel family and a runtime chosen (None: keep the current).

        Raises: LmcostError naming the families or runtimes this device has figures for.
        """
        for opt, v, known in (("efficiency.kernel", kernel, KNOWN_FAMILIES), ("runtime", runtime, KNOWN_RUNTIMES)):
            if v is not None and not v.strip():
                raise LmcostError(opt, "empty", "give a name, or auto")
            if v is not None and v.strip().lower() not in ("auto", *known, *RUNTIME_ALIASES):
                raise LmcostError(opt, f"unknown {'kernel family' if opt == 'efficiency.kernel' else 'runtime'} {v!r}",
                                  f"use auto or one of {', '.join(known)}")
        kernel = kernel.strip().lower() if kernel is not None else None
        runtime = runtime.strip().lower() if runtime is not None else None
        upd = {}
        if kernel is not None and kernel != self.kernel:
            if kernel != "auto" and kernel not in self.families():
                have = ", ".join(["auto", *[f for f in self.families() if f != "auto"]]) if self.families() else "none"
                raise LmcostError("efficiency.kernel", f"no figures for {kernel!r} on this GPU",
                                  f"use one of: {have} (families with published timings on the device)")
            upd["kernel"] = kernel
        runtime = RUNTIME_ALIASES.get(runtime, runtime)
        if runtime is not None and runtime != self.runtime:
            if runtime != "auto" and runtime not in self.kinds:
                have = ", ".join(["auto", *[r for r in self.runtimes() if r != "auto"]]) if self.kinds else "none"
                raise LmcostError("runtime", f"no figures for {runtime!r} on this GPU", f"use one of: {have}")
            upd["runtime"] = runtime
        return self.model_copy(update=upd) if upd else self

    def phases_without(self, phase: str | None = None) -> list[str]:
        """Phases (prefill, decode) the selected kernel family has no figures of: they take ``auto``'s.

        ``phase``: the one phase an operator runs (``op attention``), which must have them.
        Raises: LmcostError if ``phase`` is given and the family has no figures of it, naming those that do.
        """
        if self.kernel == "auto":
            return []
        tables = {"prefill": self.attention_prefill, "decode": self.attention_decode}
        if phase is not None:
            if self.kernel not in tables[phase]:
                raise LmcostError("efficiency.kernel", f"no {phase} figures for {self.kernel!r} on this GPU",
                                  f"use one of: {', '.join(['auto', *[k for k in tables[phase] if k != 'auto']])}")
            return []
        return [p for p, t in tables.items() if self.kernel not in t]

    def runtime_lacks(self, kind: str, op_class: str) -> bool:
        """Whether the selected runtime has no figures of a memory-bound kind or its class (``auto``'s are used)."""
        own = self.kinds.get(self.runtime, {})
        return self.runtime != "auto" and not any(k in own for k in (kind, kind.removeprefix("fused_add_"), op_class))

    def prefill_figures(self) -> PrefillFigures | None:
        """The selected family's prefill figures (``auto``'s if the family has none), or None."""
        return self.attention_prefill.get(self.kernel) or self.attention_prefill.get("auto")

    def decode_figures(self) -> DecodeFigures | None:
        """The selected family's decode figures (``auto``'s if the family has none), or None."""
        return self.attention_decode.get(self.kernel) or self.attention_decode.get("auto")

    def kind_figures(self, kind: str, op_class: str = "") -> KindFigures | None:
        """Figures of a memory-bound kind: the selected runtime's for the kind (a fused residual add + norm,
        ``fused_add_rmsnorm``, then the norm's), then for its class (norm, elementwise, softmax), then
        ``auto``'s likewise; else None."""
        for rt in dict.fromkeys((self.runtime, "auto")):
            for key in dict.fromkeys((kind, kind.removeprefix("fused_add_"), op_class)):
                f = self.kinds.get(rt, {}).get(key)
                if key and f is not None:
                    return f
        return None

    def band(self, cls: str) -> tuple[float, float]:
        """(low, high) ratio of measured to predicted time for a band class; a class the fit had no rows
        of takes the widest band of those it had; no bands at all: (1, 1), stated as none in outputs."""
        if cls in self.bands:
            return self.bands[cls]
        if not self.bands:
            return (1.0, 1.0)
        return (min(lo for lo, _ in self.bands.values()), max(hi for _, hi in self.bands.values()))

    @field_validator("bandwidth_fraction")
    @classmethod
    def _fractions(cls, v: dict) -> dict:
        _check_class_keys(v)
        for k, f in v.items():
            if not MIN_FRACTION <= f <= 1:
                raise ValueError(f"bandwidth_fraction.{k} must be from {MIN_FRACTION} to 1, got {f}; "
                                 "give the achieved fraction of bandwidth_tb_s")
        return v

    @field_validator("kernel_overhead_us")
    @classmethod
    def _overheads(cls, v: dict) -> dict:
        _check_class_keys(v)
        for k, f in v.items():
            if not 0 <= f <= MAX_OVERHEAD_US:
                raise ValueError(f"kernel_overhead_us.{k} must be from 0 to {MAX_OVERHEAD_US:g} us, got {f}; "
                                 "give microseconds per kernel (a few on a GPU, tens on a CPU)")
        return v

    @model_validator(mode="after")
    def _sources_name_figures(self) -> "Efficiency":
        figures = set(self.figures())
        for key in self.sources:
            if key.strip() != "*" and not any(self._names(key, f) for f in figures):
                raise ValueError(f"sources: {key!r} names no figure of this block; name figures as "
                                 "gemm.peak_fraction, bandwidth_fraction.norm, kernel_overhead_us, or *")
        return self

    @staticmethod
    def _lookup(table: dict, kind: str, op_class: str, fallback: float) -> float:
        for key in (kind, op_class, "default"):
            if key in table:
                return table[key]
        return fallback

    def figures(self) -> list[str]:
        """Every figure this block sets, dotted: gemm.peak_fraction, bandwidth_fraction.norm, ..."""
        v1 = ("peak_fraction", "sm_count", "k_half") + (() if self.gemm.tiles else ("tile_m", "tile_n"))
        out = [f"gemm.{k}" for k in GemmEfficiency.model_fields if k in v1 or k in self.gemm.model_fields_set]
        out += [k for k in ("attention_peak_fraction", "vector_fraction") if k in self.model_fields_set]
        for field in ("bandwidth_fraction", "kernel_overhead_us", "attention_prefill", "attention_decode", "kinds"):
            out += [f"{field}.{k}" for k in getattr(self, field)]
        return out

    def value(self, figure: str):
        """The value of a dotted figure name (``gemm.sm_count``, ``bandwidth_fraction.norm``)."""
        head, _, key = figure.partition(".")
        v = getattr(self, head)
        return getattr(v, key) if isinstance(v, BaseModel) else (v[key] if key else v)

    def source_of(self, figure: str) -> str | None:
        """The ``sources`` entry naming ``figure``. A key names figures by their dotted names
        (``gemm.tile_m, gemm.tile_n``), a field with its keys in brackets (``bandwidth_fraction (norm,
        softmax)``), a whole field (``kernel_overhead_us``), or everything (``*``)."""
        for key, text in self.sources.items():
            if self._names(key, figure):
                return text
        return None

    @staticmethod
    def _names(key: str, figure: str) -> bool:
        head, _, rest = key.partition("(")
        names = {t.strip() for t in head.split(",") if t.strip()}
        names |= {f"{head.strip()}.{t.strip()}" for t in rest.rstrip(")").split(",") if t.strip()}
        return "*" in names or figure in names or figure.split(".")[0] in names

    def unsourced(self) -> list[str]:
        """Figures no ``sources`` entry names (see :meth:`source_of`)."""
        return [f for f in self.figures() if self.source_of(f) is None]

    def bw_fraction(self, kind: str, op_class: str) -> float:
        """Fraction of bandwidth an op reaches: its kind's figure, else its class's, else default, else 1."""
        return self._lookup(self.bandwidth_fraction, kind, op_class, 1.0)

    def overhead_s(self, kind: str, op_class: str) -> float:
        """Seconds each kernel adds: its kind's figure, else its class's, else default, else 0."""
        return self._lookup(self.kernel_overhead_us, kind, op_class, 0.0) * 1e-6
