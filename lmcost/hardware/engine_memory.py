"""The memory-bound kernels serving engines run (norms, fused add + norm, gated activations, RoPE), as kernel
designs with figures fitted on measured kernel durations.

An engine's norm, activation and RoPE kernels are not the best published fused kernels the public table holds
(Liger's Triton, timed with their harness's launch overhead): vLLM's run one thread block per token row with
a loop of strided loads, scalar in ``rms_norm_kernel``, ``act_and_mul_kernel`` and ``rotary_embedding_kernel``
and 8-wide in ``fused_add_rms_norm_kernel``'s vector path (``csrc/layernorm_kernels.cu``,
``csrc/activation_kernels.cu``, ``csrc/pos_encoding_kernels.cu``); SGLang's and TensorRT-LLM's norms are
FlashInfer's vectorized row kernels (``include/flashinfer/norm.cuh``), their activations and RoPE vectorized
kernels (``include/flashinfer/activation.cuh``, sgl-kernel ``apply_rope_with_cos_sin_cache_inplace``). All
recalled, not re-read. Under CUDA graphs a kernel's time is its duration on the GPU.

:data:`ENGINE_DESIGNS` says which design each engine runs per kind; ``lmcost/data/engine-memory-kernels.yaml``
holds each design's figures (:class:`lmcost.hardware.efficiency.RowKindFigures`: bandwidth fraction, per-call
overhead, per-row-element latency) and band, fitted by ``lmcost fit --memory-kernels``
(:mod:`lmcost.calibration.memory_kernel_fit`) on this project's H200 sweep of those designs
(``benchmarks/gpu_kernels.py --set v2``). The fractions apply to each GPU's datasheet bandwidth and the
latencies as measured: a stated transfer, since no engine kernel on another GPU was timed.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field

from lmcost.hardware.efficiency import KindFigures

class RowKindFigures(KindFigures):
    """A memory-bound kernel that runs one thread block per token row (a serving engine's norm, activation or
    RoPE kernel): besides the bandwidth fraction and the per-call overhead, ``row_ns`` nanoseconds per element
    of one row (:attr:`lmcost.operators.ops.OpCost.row_width`), the time a block takes to walk its row, paid
    once per call: t = overhead + row_ns * width + bytes / (f * BW). Fitted on kernel durations
    (:mod:`lmcost.calibration.memory_kernel_fit`) on one GPU (``fit_bandwidth_tb_s``, ``fit_sm_count``); a GPU's
    own ``kinds`` never carry it.

    ``latency_bound``: the design's rate is set by the bytes its resident blocks keep in flight (Little's law),
    not by the DRAM: on another GPU it moves the same bytes per second per SM, so its fraction there is
    f * fit_bandwidth * (SMs / fit_sm_count) / bandwidth, at most ``bandwidth_cap`` (the fraction the vectorized
    kernel doing the same work reaches, where the DRAM is the limit; :data:`MAX_LATENCY_BOUND_FRACTION` if none)
    (:meth:`fraction_on`); otherwise the fraction itself transfers."""

    row_ns: float = Field(ge=0, le=1000.0)
    latency_bound: bool = False
    bandwidth_cap: float = Field(default=0.95, gt=0, le=1.0)
    fit_bandwidth_tb_s: float = Field(default=4.8, gt=0, le=1000.0)
    fit_sm_count: int = Field(default=132, gt=0, le=10_000)

    def fraction_on(self, bandwidth: float, sm_count: int) -> float:
        """The achieved fraction of ``bandwidth`` (B/s) on a GPU of ``sm_count`` SMs (class doc)."""
        if not self.latency_bound:
            return self.bandwidth_fraction
        rate = self.bandwidth_fraction * self.fit_bandwidth_tb_s * 1e12 * sm_count / self.fit_sm_count
        return min(self.bandwidth_cap, MAX_LATENCY_BOUND_FRACTION, rate / bandwidth)


#: The highest fraction a latency-bound design's rate may reach on another GPU: the public fit's grid top,
#: below which every streaming kernel measured stays (:data:`lmcost.calibration.efficiency_fit.BW_GRID`).
MAX_LATENCY_BOUND_FRACTION = 0.95


#: Per serving engine, per memory-bound kind, the kernel design it runs and where that was read (recalled).
#: Kinds absent keep the GPU's figures, as under ``--engine torch``: LayerNorm (no engine has a LayerNorm kernel
#: of its own: they run PyTorch's, recalled). A residual add an engine does not fuse into its norm runs in PyTorch,
#: whose vectorized elementwise kernel (8-wide loads, one thread per 8 elements) is costed as the vectorized
#: activation design (:data:`TORCH_ADD`).
#: The residual add under every engine: PyTorch's ``vectorized_elementwise_kernel<8, CUDAFunctor_add<BFloat16>>``
#: (the kernel the H200 profile of ``x + y`` names, tests/data/gpu-kernels-h200.csv), a grid-stride vectorized
#: kernel as the vectorized SiLU-and-mul is; held out on those 12 add rows the design's figures err 12.5% (median).
TORCH_ADD = ("vector-act", "PyTorch at::native::vectorized_elementwise_kernel<8, CUDAFunctor_add> (an add the engine "
                           "does not fuse into its norm), costed as the vectorized activation design; kernel name "
                           "from the H200 profile (tests/data/gpu-kernels-h200.csv)")

ENGINE_DESIGNS: dict[str, dict[str, tuple[str, str]]] = {
    "vllm": {
        "rmsnorm": ("rows-scalar-norm", "vllm csrc/layernorm_kernels.cu rms_norm_kernel: grid = tokens, "
                                        "block = min(hidden, 1024), two passes of scalar loads; recalled"),
        "fused_add_rmsnorm": ("rows-vec8-norm", "vllm csrc/layernorm_kernels.cu fused_add_rms_norm_kernel, 8-wide "
                                                "vector path (hidden % 8 == 0), block = min(hidden, 1024 below 256 "
                                                "tokens else 256); recalled"),
        "silu_mul": ("rows-scalar-act", "vllm csrc/activation_kernels.cu act_and_mul_kernel: grid = tokens, "
                                        "block = min(d, 1024), scalar loads; recalled"),
        "rope": ("rows-scalar-rope", "vllm csrc/pos_encoding_kernels.cu rotary_embedding_kernel: grid = tokens, "
                                     "block = min(heads * rot_dim / 2, 512), scalar loads; recalled"),
        "add": TORCH_ADD,
    },
    "sglang": {
        "rmsnorm": ("rows-vec8-norm", "sgl-kernel rmsnorm = FlashInfer norm.cuh RMSNorm, vectorized, one block per "
                                      "row; recalled"),
        "fused_add_rmsnorm": ("rows-vec8-norm", "sgl-kernel fused_add_rmsnorm = FlashInfer norm.cuh FusedAddRMSNorm; "
                                                "recalled"),
        "silu_mul": ("vector-act", "sgl-kernel silu_and_mul = FlashInfer activation.cuh act_and_mul, vectorized; "
                                   "recalled"),
        "rope": ("vector-rope", "sgl-kernel apply_rope_with_cos_sin_cache_inplace (FlashInfer pos_enc.cuh), "
                                "vectorized; recalled"),
        "add": TORCH_ADD,
    },
    "trtllm": {
        "rmsnorm": ("rows-vec8-norm", "tensorrt_llm/_torch/modules/rms_norm.py: flashinfer rmsnorm; recalled"),
        "fused_add_rmsnorm": ("rows-vec8-norm", "tensorrt_llm/_torch/modules/rms_norm.py: flashinfer "
                                                "fused_add_rmsnorm; recalled"),
        "silu_mul": ("vector-act", "tensorrt_llm/_torch/modules/gated_mlp.py swiglu (flashinfer silu_and_mul); "
                                   "recalled"),
        "rope": ("vector-rope", "RoPE runs inside the TRTLLM attention op (rope_attention); a standalone RoPE is "
                                "costed as a vectorized kernel; recalled"),
        "add": TORCH_ADD,
    },
}

#: The serving engine whose norm, activation and RoPE designs time those kinds under ``--engine auto`` (the default)
#: for the serving commands (``op``, ``estimate``, ``plan``, ``report``, ``serve``), on a GPU whose efficiency block
#: is a shipped fit. Why vLLM's: a serving stack does not run the public table's kernels (Liger's, a training
#: library's Triton); of the three engines profiled, vLLM is the one most deployments run (its designs are also
#: what a serving stack measured on A100/H100 showed, as issue 25 reports it: a large RMSNorm about 2x the public
#: table's fit, RoPE and SiLU-and-mul 1.5-1.8x, small kernels 1.3-1.7x over the public fit's launch-inclusive
#: floors; on the H200, vLLM's designs measured 2.4x, 1.5-1.7x and 0.66x of the public fit's prediction, Triton's
#: kernels 0.7-0.85x and 0.2-0.35x: ``lmcost/data/measurements/gpu-kernels-h200.csv``). ``--engine torch`` keeps the public fit (PyTorch's and Triton's fused kernels), and
#: ``train`` always does (training runs PyTorch's, not a serving engine's).
AUTO_STACK = "vllm"

#: Gated activations other than SiLU-and-mul run the same kernel template (act_and_mul_kernel<act>).
GATED_LIKE = ("gelu_mul", "relu_mul", "sigmoid_mul")


def figures_file() -> Path:
    """The shipped figures of each design (``lmcost/data/engine-memory-kernels.yaml``)."""
    return Path(__file__).resolve().parent.parent / "data" / "engine-memory-kernels.yaml"


@lru_cache(maxsize=1)
def design_figures() -> tuple[dict, dict]:
    """({design: RowKindFigures}, {design: (band low, band high)}) from :func:`figures_file`.

    Raises: LmcostError (engine-memory-kernels.yaml) if the shipped file is unreadable or malformed."""
    import yaml

    from lmcost.basics.errors import LmcostError

    path = figures_file()
    try:
        return parse_designs(yaml.safe_load(path.read_text()))
    except Exception as e:  # noqa: BLE001 - a broken shipped file is one line, not a traceback
        raise LmcostError("engine-memory-kernels.yaml", f"unreadable ({type(e).__name__}: {e})",
                          "reinstall lmcost, or rewrite it with the memory-kernel fit (lmcost fit)") from None


def parse_designs(data: dict) -> tuple[dict, dict]:
    """({design: RowKindFigures}, {design: (low, high)}) of a loaded ``engine-memory-kernels.yaml`` (its ``designs``
    and ``bands``). Raises: KeyError, TypeError, ValueError, pydantic's ValidationError for a malformed one."""
    figs = {k: RowKindFigures(**v) for k, v in data["designs"].items()}
    bands = {k: (float(lo), float(hi)) for k, (lo, hi) in data["bands"].items()}
    return figs, bands


#: The ``stack_spread`` key of each selection's spread: around torch's figures (the GPU's own block) and around
#: auto's (:data:`AUTO_STACK`'s designs).
SPREAD_KEYS = {"torch": "bands", "auto": "auto_bands"}


@lru_cache(maxsize=2)
def stack_spread(around: str = "torch") -> dict:
    """{class: (low, high)}: the spread of measured / predicted time over the single fused norm and pointwise
    kernels serving stacks run, timed on the H200, predicted under ``around`` (``torch``: the GPU's own figures;
    ``auto``: with :data:`AUTO_STACK`'s designs), ``stack_spread.bands`` / ``auto_bands`` of :func:`figures_file`,
    written by ``lmcost fit --memory-kernels`` (:mod:`lmcost.calibration.stack_spread`); that selection's bands
    span it (:func:`widen_by_spread`) on every GPU, ratios assumed to
    transfer. {} where the file has no such section (written before it existed).

    Raises: LmcostError (engine-memory-kernels.yaml) if the section is malformed: not [low <= 1, high >= 1] per
    class, or a class other than norm, elementwise."""
    import yaml

    from lmcost.basics.errors import LmcostError

    try:
        data = (yaml.safe_load(figures_file().read_text()) or {}).get("stack_spread") or {}
        out = {k: (float(lo), float(hi)) for k, (lo, hi) in (data.get(SPREAD_KEYS[around]) or {}).items()}
    except Exception as e:  # noqa: BLE001 - a broken shipped file is one line, not a traceback
        raise LmcostError("engine-memory-kernels.yaml", f"stack_spread unreadable ({type(e).__name__}: {e})",
                          "reinstall lmcost, or rewrite it with the memory-kernel fit (lmcost fit)") from None
    for k, (lo, hi) in out.items():
        if k not in ("norm", "elementwise") or not 0 < lo <= 1 <= hi < 100:
            raise LmcostError("engine-memory-kernels.yaml", f"stack_spread.{SPREAD_KEYS[around]}.{k} is not a norm or elementwise "
                              f"[low <= 1, high >= 1] band (got [{lo}, {hi}])",
                              "rewrite it with the memory-kernel fit (lmcost fit)")
    return out


def engine_memory_figures(engine: str, figures: tuple[dict, dict] | None = None) -> tuple[dict, dict]:
    """({kind: RowKindFigures}, {band class: (low, high)}) of serving engine ``engine``'s memory-bound
    kernels (:data:`ENGINE_DESIGNS`), gated activations beside SiLU-and-mul included; ({}, {}) for an engine
    without designs (auto, torch). A class's band spans those of the designs the engine runs in it.
    ``figures``: the designs' (figures, bands) (:func:`parse_designs`), default the shipped ones (:func:`design_figures`)."""
    designs = ENGINE_DESIGNS.get(engine)
    if not designs:
        return {}, {}
    figs, bands = figures or design_figures()
    kinds = {kind: figs[d] for kind, (d, _) in designs.items()}
    if "silu_mul" in kinds:
        kinds.update({k: kinds["silu_mul"] for k in GATED_LIKE})
    out_bands = {}
    for cls, members in (("norm", ("rmsnorm", "fused_add_rmsnorm")), ("elementwise", ("silu_mul", "rope", "add"))):
        bs = [bands[designs[k][0]] for k in members if k in designs]
        if bs:
            out_bands[cls] = (min(lo for lo, _ in bs), max(hi for _, hi in bs))
    return kinds, out_bands


def widen_by_spread(eff, spread: dict):
    """A copy of efficiency block ``eff`` whose band of each class in ``spread`` ({class: (low, high)}) spans the
    block's (:meth:`lmcost.hardware.efficiency.Efficiency.band`) and the spread of the kernels stacks run
    (:func:`stack_spread`): auto's and torch's bands. Times do not move; a block without bands is returned as is."""
    if not eff.bands or not spread:
        return eff
    bands = {**eff.bands, **{c: [min(eff.band(c)[0], lo), max(eff.band(c)[1], hi)] for c, (lo, hi) in spread.items()}}
    return eff.model_copy(update={"bands": bands})
