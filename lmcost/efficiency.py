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

from typing import Any

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
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    peak_fraction: float = Fraction
    tile_m: PositiveInt = Field(default=1, le=1024)
    tile_n: PositiveInt = Field(default=1, le=1024)
    sm_count: PositiveInt = Field(default=1, le=100_000)
    k_half: float = Field(default=0.0, ge=0, le=1e6)


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
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    gemm: GemmEfficiency
    attention_peak_fraction: float = Field(default=1.0, ge=MIN_FRACTION, le=1)
    vector_fraction: float = Field(default=1.0, ge=MIN_FRACTION, le=1)
    bandwidth_fraction: dict[str, float] = {}
    kernel_overhead_us: dict[str, float] = {}
    conditions: dict[str, Any] = {}
    sources: dict[str, str] = {}

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
        out = [f"gemm.{k}" for k in GemmEfficiency.model_fields]
        out += [k for k in ("attention_peak_fraction", "vector_fraction") if k in self.model_fields_set]
        out += [f"bandwidth_fraction.{k}" for k in self.bandwidth_fraction]
        out += [f"kernel_overhead_us.{k}" for k in self.kernel_overhead_us]
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
    """Fraction of ``peak_fraction`` a GEMM of M x N x K keeps: tile * wave * small-K (scalars or arrays).

    A skinny GEMM gets a shorter tile: t_m = min(tile_m, the power of two >= M, at least 16, the M of
    a tensor-core MMA), as libraries pick smaller tiles for small M.
    tile = M*N / (ceil(M/t_m)*t_m * ceil(N/tile_n)*tile_n); tiles = ceil(M/t_m)*ceil(N/tile_n);
    wave = tiles / (ceil(tiles/sm_count)*sm_count) when tiles >= sm_count, else 1 (split-K);
    small-K = K / (K + k_half). Source: NVIDIA, "Matrix Multiplication Background User's Guide".
    """
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    t_m = np.minimum(g.tile_m, np.maximum(16.0, 2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))))) if g.tile_m > 1 else 1.0
    tiles_m, tiles_n = np.ceil(m / t_m), np.ceil(n / g.tile_n)
    tile = (m * n) / (tiles_m * t_m * tiles_n * g.tile_n)
    tiles = tiles_m * tiles_n
    wave = np.where(tiles >= g.sm_count, tiles / (np.ceil(tiles / g.sm_count) * g.sm_count), 1.0)
    small_k = k / (k + g.k_half)
    out = tile * wave * small_k
    return out if out.ndim else float(out)


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


def expected_times(flops, bytes_, kernels, m, n, k, statics: dict, roofline_s):
    """Expected seconds of one execution of each op under the efficiency model, never less than its
    roofline time ``roofline_s``; ops inside another op's kernel (a flash kernel's softmax) cost their
    roofline time, the compute they really do.

    Arguments broadcast together: arrays over ops (``statics`` from :func:`op_statics` of the same ops),
    or one op's values over a grid with that op's statics. ``m, n, k``: the GEMM shape (any value where
    the op is not a GEMM). With no efficiency block the roofline time is returned.
    """
    eff = statics["eff"]
    if eff is None:
        return roofline_s
    gemm = statics["gemm"]
    one = np.ones_like(gemm, dtype=float)
    shape = gemm_shape_efficiency(eff.gemm, np.where(gemm, m, one), np.where(gemm, n, one), np.where(gemm, k, one))
    rate = statics["peak"] * statics["frac"] * np.where(gemm, shape, 1.0)
    out = kernel_time(flops, bytes_, kernels, rate, statics["bandwidth"], statics["overhead_s"])
    # Never below the roofline: a fraction of a roof cannot beat the roof (the roofline's floor included).
    out = np.where(statics["inside"], roofline_s, np.maximum(out, roofline_s))
    return out if np.ndim(out) else float(out)
