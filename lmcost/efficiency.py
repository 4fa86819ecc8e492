"""The calibrated efficiency model: how far below the roofline real kernels run, and why.

A roofline is a lower bound. Real kernels reach only a fraction of peak FLOP/s and of memory
bandwidth, GEMMs lose throughput to tile and wave quantization, and every kernel costs a fixed time
however little it does. The expected time of one execution of an operator is

    t = kernels * overhead[class] + max(FLOPs / (peak * eff_compute), bytes / (bandwidth * eff_bw[class]))

- GEMMs (ops with ``mnk``): eff_compute = gemm.peak_fraction * tile(M, N) * wave(M, N) * K / (K + gemm.k_half).
  Tile quantization: the kernel computes whole tile_m x tile_n output tiles, so M and N round up to
  multiples of the tile; wave quantization: the tiles run in waves of sm_count, the last one partly
  empty (NVIDIA, "Matrix Multiplication Background User's Guide", sections "Tile Quantization" and
  "Wave Quantization"). With fewer tiles than SMs, libraries split K to fill the machine (cuBLAS,
  CUTLASS split-K), so no wave loss is charged there.
- Attention matmuls (flash kernels): eff_compute = attention_peak_fraction (Dao 2023, FlashAttention-2,
  and Shah et al. 2024, FlashAttention-3, report the fraction of peak their kernels reach).
- Everything else runs at the vector rate times ``vector_fraction``.
- ``overhead`` and ``eff_bw`` are per kernel kind: an op with a GEMM shape (the lm_head, a router)
  takes the gemm figures, every other op those of its class.
- ``overhead`` is a per-class fixed time per kernel (launch, ramp-up, tail; on a CPU the dispatch of
  an eager op), added, not maxed: a latency-plus-bandwidth (Hockney) model of one kernel.
- The result is never below the op's roofline time (a fraction of a roof cannot beat it). Work done
  inside another op's kernel (``kernels == 0``: a flash kernel's softmax) costs its roofline time.

An absent ``efficiency`` block in a hardware YAML means the pure roofline: the calibrated time is then
the roofline time. ``lmcost calibrate`` fits the fields on the local device (:mod:`lmcost.profiling.fit`).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from .ops import KINDS, OpClass

#: Keys of the per-kind figures: a kernel kind (finest), an operator class, or default.
CLASS_KEYS = KINDS + tuple(c.value for c in OpClass if c.value not in KINDS) + ("default",)

#: Fractions below this are typos (a kernel at a thousandth of its roof is not a model of anything).
MIN_FRACTION = 1e-3
Fraction = Field(ge=MIN_FRACTION, le=1)
#: Largest per-kernel overhead accepted (us): a second per kernel is a typo, not a device.
MAX_OVERHEAD_US = 1e6
#: Attention kernel families and runtimes of memory-bound kernels that measured tables name
#: (:mod:`lmcost.measurements` maps implementations onto them); ``--kernel`` and ``--runtime`` accept these.
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
    Empty: the one tile tile_m x tile_n, split-K whenever there are fewer tiles than SMs (model v1).
    ``reuse_full``: operand reuse tile_m*tile_n/(tile_m+tile_n) (MACs per element loaded) at which a
    tile feeds the tensor cores at full rate; a smaller tile runs at reuse/reuse_full of it. 0: no penalty.
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


class PrefillFigures(BaseModel):
    """One attention kernel family's prefill on one device: e = peak_fraction * L / (L + l_half) of the
    tensor peak at L mean keys per query, plus ``overhead_us`` per call, for the kernel's matmuls; its
    in-kernel softmax adds its vector-rate roofline (a fixed cost per query-key pair, relatively larger
    at small head dims), and the fit predicted the measured kernel as both together.
    ``rows``: the table rows it was fitted on."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    peak_fraction: float = Fraction
    l_half: float = Field(ge=0, le=1e7)
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""


class DecodeFigures(BaseModel):
    """One attention kernel family's decode on one device: the KV cache streams at
    bandwidth_fraction * bandwidth * min(1, streams * splits / SMs), streams = b * h_kv and splits =
    ceil(L / split_tokens) (0: the kernel does not split the keys), plus ``overhead_us`` per call."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    bandwidth_fraction: float = Fraction
    split_tokens: int = Field(ge=0, le=1 << 24)
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""


class KindFigures(BaseModel):
    """A memory-bound kernel kind under one runtime: bandwidth fraction and microseconds per call."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    bandwidth_fraction: float = Fraction
    overhead_us: float = Field(ge=0, le=MAX_OVERHEAD_US)
    rows: str = ""


class Efficiency(BaseModel):
    """The ``efficiency`` block of a hardware YAML (all optional but ``gemm``).

    ``attention_peak_fraction``: fraction of the tensor peak a fused attention kernel's matmuls reach.
    ``vector_fraction``: fraction of the vector (fp32) rate non-matmul kernels reach.
    ``bandwidth_fraction``: fraction of memory bandwidth reached, keyed by kernel kind (rmsnorm,
    silu_mul, rope, add, ...: :data:`lmcost.ops.KINDS`), by operator class (gemm, attention,
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

    @field_validator("bands")
    @classmethod
    def _bands(cls, v: dict) -> dict:
        for k, (lo, hi) in v.items():
            if k not in BAND_CLASSES:
                raise ValueError(f"bands: unknown class {k!r}; use one of {', '.join(BAND_CLASSES)}")
            if not 0 < lo <= 1 <= hi < 100:
                raise ValueError(f"bands.{k} must be [low <= 1, high >= 1] ratios of measured to predicted time, "
                                 f"got [{lo}, {hi}]")
        return v

    @model_validator(mode="after")
    def _selection_exists(self) -> "Efficiency":
        for table, what in ((self.attention_prefill, "attention_prefill"), (self.attention_decode, "attention_decode"),
                            (self.kinds, "kinds")):
            if table and "auto" not in table:
                raise ValueError(f"{what} has no 'auto' entry; add the figures fitted on every family (lmcost fit)")
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
        from .errors import LmcostError

        for opt, v, known in (("--kernel", kernel, KNOWN_FAMILIES), ("--runtime", runtime, KNOWN_RUNTIMES)):
            if v is not None and not v.strip():
                raise LmcostError(opt, "empty", "give a name, or auto")
            if v is not None and v.strip().lower() not in ("auto", *known, *RUNTIME_ALIASES):
                raise LmcostError(opt, f"unknown {'kernel family' if opt == '--kernel' else 'runtime'} {v!r}",
                                  f"use auto or one of {', '.join(known)}")
        kernel = kernel.strip().lower() if kernel is not None else None
        runtime = runtime.strip().lower() if runtime is not None else None
        upd = {}
        if kernel is not None and kernel != self.kernel:
            if kernel != "auto" and kernel not in self.families():
                have = ", ".join(["auto", *[f for f in self.families() if f != "auto"]]) if self.families() else "none"
                raise LmcostError("--kernel", f"no figures for {kernel!r} on this GPU",
                                  f"use one of: {have} (families with published timings on the device)")
            upd["kernel"] = kernel
        runtime = RUNTIME_ALIASES.get(runtime, runtime)
        if runtime is not None and runtime != self.runtime:
            if runtime != "auto" and runtime not in self.kinds:
                have = ", ".join(["auto", *[r for r in self.runtimes() if r != "auto"]]) if self.kinds else "none"
                raise LmcostError("--runtime", f"no figures for {runtime!r} on this GPU", f"use one of: {have}")
            upd["runtime"] = runtime
        return self.model_copy(update=upd) if upd else self

    def phases_without(self, phase: str | None = None) -> list[str]:
        """Phases (prefill, decode) the selected kernel family has no figures of: they take ``auto``'s.

        ``phase``: the one phase an operator runs (``op attention``), which must have them.
        Raises: LmcostError if ``phase`` is given and the family has no figures of it, naming those that do.
        """
        from .errors import LmcostError

        if self.kernel == "auto":
            return []
        tables = {"prefill": self.attention_prefill, "decode": self.attention_decode}
        if phase is not None:
            if self.kernel not in tables[phase]:
                raise LmcostError("--kernel", f"no {phase} figures for {self.kernel!r} on this GPU",
                                  f"use one of: {', '.join(['auto', *[k for k in tables[phase] if k != 'auto']])}")
            return []
        return [p for p, t in tables.items() if self.kernel not in t]

    def runtime_lacks(self, kind: str, op_class: str) -> bool:
        """Whether the selected runtime has no figures of a memory-bound kind or its class (``auto``'s are used)."""
        own = self.kinds.get(self.runtime, {})
        return self.runtime != "auto" and kind not in own and op_class not in own

    def prefill_figures(self) -> PrefillFigures | None:
        """The selected family's prefill figures (``auto``'s if the family has none), or None."""
        return self.attention_prefill.get(self.kernel) or self.attention_prefill.get("auto")

    def decode_figures(self) -> DecodeFigures | None:
        """The selected family's decode figures (``auto``'s if the family has none), or None."""
        return self.attention_decode.get(self.kernel) or self.attention_decode.get("auto")

    def kind_figures(self, kind: str, op_class: str = "") -> KindFigures | None:
        """Figures of a memory-bound kind: the selected runtime's for the kind, then for its class
        (norm, elementwise, softmax), then ``auto``'s for the kind, then for the class; else None."""
        for rt in dict.fromkeys((self.runtime, "auto")):
            for key in (kind, op_class):
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
        out += [f"bandwidth_fraction.{k}" for k in self.bandwidth_fraction]
        out += [f"kernel_overhead_us.{k}" for k in self.kernel_overhead_us]
        out += [f"attention_prefill.{k}" for k in self.attention_prefill]
        out += [f"attention_decode.{k}" for k in self.attention_decode]
        out += [f"kinds.{k}" for k in self.kinds]
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


def gemm_shape_efficiency(g: GemmEfficiency, m, n, k):
    """Fraction of ``peak_fraction`` a GEMM of M x N x K keeps (scalars or arrays).

    A skinny GEMM gets a shorter tile: t_m = min(tile_m, the power of two >= M, at least 16, the M of
    a tensor-core MMA), as libraries pick smaller tiles for small M.
    Model v2 (``tiles`` given): the best, over the menu's tiles and split-K factors s, of
        M*N*K / (waves * sm_count * t_m*t_n * ceil(K/s)) * reuse * K_s / (K_s + k_half),
    tiles = ceil(M/t_m)*ceil(N/t_n), waves = ceil(tiles*s / sm_count), K_s = ceil(K/s), reuse =
    min(1, t_m*t_n/(t_m+t_n) / reuse_full): tile and wave quantization (NVIDIA, "Matrix Multiplication
    Background User's Guide"), split-K (s > 1 only where tiles < sm_count and every
    slice keeps K/s >= MIN_SPLIT_K) filling idle SMs at the cost of a shorter K per tile (CUTLASS
    split-K and stream-K; cuBLAS's heuristics choose among such configurations), and the operand reuse of
    a tile (MACs per element loaded) bounding what a small tile feeds the tensor cores.
    Model v1 (no menu): tile = M*N / (ceil(M/t_m)*t_m * ceil(N/tile_n)*tile_n);
    wave = tiles / (ceil(tiles/sm_count)*sm_count) when tiles >= sm_count, else 1 (split-K);
    small-K = K / (K + k_half).
    """
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    pow2 = np.maximum(16.0, 2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))))
    if not g.tiles:
        t_m = np.minimum(g.tile_m, pow2) if g.tile_m > 1 else 1.0
        tiles_m, tiles_n = np.ceil(m / t_m), np.ceil(n / g.tile_n)
        tile = (m * n) / (tiles_m * t_m * tiles_n * g.tile_n)
        tiles = tiles_m * tiles_n
        wave = np.where(tiles >= g.sm_count, tiles / (np.ceil(tiles / g.sm_count) * g.sm_count), 1.0)
        out = tile * wave * (k / (k + g.k_half))
        return out if out.ndim else float(out)
    best = np.zeros(np.broadcast_shapes(m.shape, n.shape, k.shape))
    sm = float(g.sm_count)
    for tile_m, tile_n in g.tiles:
        t_m = np.minimum(float(tile_m), pow2)
        reuse = 1.0 if not g.reuse_full else np.minimum(1.0, t_m * tile_n / (t_m + tile_n) / g.reuse_full)
        tiles = np.ceil(m / t_m) * np.ceil(n / tile_n)
        for s in g.split_k:
            k_s = np.ceil(k / s)
            waves = np.ceil(tiles * s / sm)
            eff = (m * n * k) / (waves * sm * t_m * tile_n * k_s) * reuse * k_s / (k_s + g.k_half)
            # Libraries split K to fill SMs a short grid leaves idle, not to even out many waves.
            best = np.maximum(best, eff if s == 1 else np.where((tiles < sm) & (k_s >= MIN_SPLIT_K), eff, 0.0))
    return best if best.ndim else float(best)


def kernel_time(flops, bytes_, kernels, rate, bandwidth, overhead_s):
    """The model's time of one execution (s): kernels * overhead + max(flops / rate, bytes / bandwidth).

    ``rate`` (FLOP/s) and ``bandwidth`` (B/s) are the achieved ones (roof times fraction); every
    argument may be an array, broadcast (the fit evaluates whole grids of fractions at once).
    """
    return kernels * overhead_s + np.maximum(np.asarray(flops, dtype=float) / rate,
                                             np.asarray(bytes_, dtype=float) / bandwidth)


def kernel_class(op) -> str:
    """The class whose figures an op takes: ``gemm`` for any GEMM-shaped op (the lm_head, a router
    run GEMM kernels, whatever class they are reported under), else its own class."""
    return "gemm" if is_gemm(op) else op.op_class.value


def is_gemm(op) -> bool:
    """Whether ``op`` runs a GEMM kernel: its ``mnk`` is a GEMM shape (a flash kernel's is its attention shape)."""
    return op.mnk is not None and op.kind != "sdpa"


def attention_rate_factor(l_half, m, n, k):
    """Prefill attention's efficiency ramp L / (L + l_half) at L = k / (m*n) mean keys per query (the
    flash record's shape, :func:`lmcost.attention.attention_core`): a kernel's throughput rises with the
    keys each query block iterates over (FlashAttention-2 paper, fig. 4; FlashAttention-3, fig. 5)."""
    L = np.asarray(k, dtype=float) / np.maximum(np.asarray(m, dtype=float) * n, 1.0)
    return L / (L + l_half)


def decode_occupancy(split_tokens, sm_count, m, n, k):
    """Fraction of the SMs a decode attention kernel keeps streaming: min(1, streams*splits / SMs),
    streams m = b*h_kv, splits = ceil(L / split_tokens) (1 where split_tokens is 0), L = k / (m*n)."""
    m = np.asarray(m, dtype=float)
    L = np.asarray(k, dtype=float) / np.maximum(m * n, 1.0)
    splits = np.where(split_tokens > 0, np.ceil(L / np.maximum(split_tokens, 1)), 1.0)
    return np.minimum(1.0, m * splits / sm_count)


def expected_times(flops, bytes_, kernels, m, n, k, statics: dict, roofline_s):
    """Expected seconds of one execution of each op under the efficiency model, never less than its
    roofline time ``roofline_s``; ops inside another op's kernel (a flash kernel's softmax) cost their
    roofline time, the compute they really do (a fit of the kernel's figures predicts its measured time
    as both together, so nothing is counted twice: :mod:`lmcost.fitting`).

    Arguments broadcast together: arrays over ops (``statics`` from :func:`op_statics` of the same ops),
    or one op's values over a grid with that op's statics. ``m, n, k``: the GEMM shape, or a flash
    kernel's attention shape (any value for other ops). With no efficiency block the roofline time is
    returned.
    """
    eff = statics["eff"]
    if eff is None:
        return roofline_s
    gemm, sdpa = statics["gemm"], statics["sdpa"]
    one = np.ones_like(gemm, dtype=float)
    shape = gemm_shape_efficiency(eff.gemm, np.where(gemm, m, one), np.where(gemm, n, one), np.where(gemm, k, one))
    ramp = attention_rate_factor(statics["l_half"], np.where(sdpa, m, one), np.where(sdpa, n, one), np.where(sdpa, k, one))
    rate = statics["peak"] * statics["frac"] * np.where(gemm, shape, np.where(sdpa, ramp, 1.0))
    decode = sdpa & statics["has_decode"] & (np.asarray(n) == 1)
    occ = decode_occupancy(statics["split_tokens"], statics["sm_count"], np.where(decode, m, one),
                           np.where(decode, n, one), np.where(decode, k, one))
    bandwidth = np.where(decode, statics["dec_bandwidth"] * occ, statics["bandwidth"])
    overhead = np.where(decode, statics["dec_overhead_s"], statics["overhead_s"])
    out = kernel_time(flops, bytes_, kernels, rate, bandwidth, overhead)
    # Never below the roofline: a fraction of a roof cannot beat the roof (the roofline's floor included).
    out = np.where(statics["inside"], roofline_s, np.maximum(out, roofline_s))
    return out if np.ndim(out) else float(out)


def band_factors(statics: dict, n):
    """(low, high) multipliers of each op's calibrated time: its class's band (:meth:`Efficiency.band`),
    a flash kernel's by phase (n = 1: decode). Arrays broadcast like :func:`expected_times`'s."""
    if statics["eff"] is None:
        return 1.0, 1.0
    decode = statics["sdpa"] & (np.asarray(n) == 1)
    return (np.where(decode, statics["dec_band_low"], statics["band_low"]),
            np.where(decode, statics["dec_band_high"], statics["band_high"]))
