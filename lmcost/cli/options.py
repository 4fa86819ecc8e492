"""Option types, choices and the parsers of typed values (counts with k/M, durations, byte sizes, lists) every command shares."""

from enum import Enum
from typing import Annotated, Optional

import typer

from lmcost.basics.counts import parse_count
from lmcost.basics.errors import LmcostError
from lmcost.cost.timing import TIME_MODELS
from lmcost.operators.forward import KERNELS, LOGITS, MLA_MODES


class Phase(str, Enum):
    """Phase of `explain`."""

    prefill = "prefill"
    decode = "decode"


def _choices(name: str, values, doc: str) -> type[Enum]:
    """A str Enum of ``values`` for typer, built from the core's own tuple (one list of allowed values)."""
    enum = Enum(name, {v: v for v in values}, type=str)
    enum.__doc__ = doc
    return enum


Kernel = _choices("Kernel", KERNELS, "Attention kernel: flash (causal pairs only) or naive.")
MLAMode = _choices("MLAMode", ("auto",) + MLA_MODES, "MLA execution: auto, absorbed or naive.")


class Device(str, Enum):
    """Where the reference decoder runs."""

    cpu = "cpu"
    cuda = "cuda"


class RunDtype(str, Enum):
    """dtype of a measured run."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


Logits = _choices("Logits", LOGITS, "Tokens the lm_head runs on.")
TimeModel = _choices("TimeModel", TIME_MODELS, "How an operator's time is predicted.")


class PhaseSel(str, Enum):
    """Phases drawn by `roofline`."""

    both = "both"
    prefill = "prefill"
    decode = "decode"


class BreakdownPhase(str, Enum):
    """Phase of `breakdown`."""

    train = "train"
    prefill = "prefill"
    decode = "decode"


ModelArg = Annotated[str, typer.Argument(help="A model YAML or HF config.json path, or a shipped name (lmcost models list).")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="A shipped GPU name or alias (lmcost gpus list), or a YAML path.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="dtype of weights, activations and KV cache: fp32, bf16, fp16, fp8, int8; auto: bf16, or fp16 on a GPU without bf16 (said on stderr).")]
WDtypeOpt = Annotated[Optional[str], typer.Option("--weight-dtype", help="Weights dtype (overrides --dtype), e.g. int4, int8, fp8.")]
QuantOpt = Annotated[Optional[str], typer.Option("--quant", help="Quantization recipe, a format per tensor: bf16, fp16, fp32, int8, awq-g128, gptq-g128, q4_0, q8_0, q4_k_m, q5_k_m, q6_k, fp8-tensor, fp8-channel, fp8-block128, nvfp4, mxfp4 (overrides the model's quantization_config; not with --weight-dtype).")]
KvDtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="KV-cache dtype (overrides --dtype), e.g. fp8, int8, int4.")]
KernelOpt = Annotated[Kernel, typer.Option("--attention", help="Attention kernel: flash (causal pairs only) or naive (full score matrix).")]
MLAOpt = Annotated[MLAMode, typer.Option("--mla", help="MLA attention: absorbed (over the latent), naive (up-project K, V), or auto (naive in prefill, absorbed in decode).")]
LogitsOpt = Annotated[Logits, typer.Option("--logits", help="Tokens the lm_head runs on: all (every prompt token, as transformers) or last (as serving engines).")]
AttnKernelOpt = Annotated[str, typer.Option("--kernel", help="Attention kernel family whose fitted figures the calibrated time uses: auto (fitted on every family measured on the GPU), fa2, fa3, cudnn, flex, triton, tlx, sdpa, paged-v1, paged-v2; the GPU's YAML lists those it has.")]
RuntimeOpt = Annotated[str, typer.Option("--runtime", help="Runtime of memory-bound kernels (norms, activations, RoPE, adds) for the calibrated time: auto (fitted on every runtime measured), triton (Liger; torch-compile and liger are its aliases), torch-eager; a GPU's YAML lists those it has figures for.")]
#: ``--engine`` of estimate, op, plan, report and train: whose kernels and kernel figures (lmcost.apps.engine_choice).
#: Not serve's and serve-plan's ``--engine``, which names a scheduler profile (lmcost/data/engines) and keeps its own option.
EngineOpt = Annotated[Optional[str], typer.Option(
    "--engine", metavar="ENGINE[@VERSION]", show_default=False,
    help="Serving engine whose kernels are costed: auto (the default: the GPU's figures, lmcost's default fusion; "
         "norms, activations, RoPE and adds as vLLM's kernels, except under train), "
         "vllm, sglang, trtllm (the engine's kernel figures fitted on its measured rows, its fusions: fused add + "
         "RMSNorm, SiLU-and-mul, fused QKV and gate_up, and its norm kernel) or torch (the base figures throughout, "
         "no fusion beyond SiLU-and-mul); a version after @ must be the GPU's profile's (vllm@0.24.0); lmcost gpus "
         "list shows which a GPU has.")]
ModelOpt = Annotated[TimeModel, typer.Option("--model", help="roofline (lower bound) or calibrated (expected time under the GPU's efficiency model).")]


def parse_count_of(text: str, field: str) -> int:
    """:func:`parse_count` of the option ``field`` (a flag). Raises: LmcostError naming it if ``text`` is not
    a whole number."""
    try:
        return parse_count(text)
    except ValueError as e:
        raise LmcostError(field, str(e), "write e.g. 2048, 8k or 1M (binary: 1M = 1,048,576)") from None


def _count(text: str) -> int:
    """:func:`parse_count` as a typer parser (its error is a usage error)."""
    try:
        return parse_count(text)
    except ValueError as e:
        raise typer.BadParameter(str(e) if "lowercase" in str(e) else f"{e} (suffixes: 128k = 131072, 1M = 1048576)") from None


def Count(*names: str, help: str):  # noqa: N802 (an option factory, named like typer.Option)
    """A count option that takes k and M suffixes (:func:`_count`)."""
    return typer.Option(*names, help=help, parser=_count, metavar="INT")


BatchOpt = Annotated[int, typer.Option(help="Concurrent sequences (b).")]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recompute: none, selective (the attention core), full (every layer).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw, adam8bit, sgd (momentum), adafactor, muon.")]
TrainPrecisionOpt = Annotated[str, typer.Option("--precision", help="bf16-mixed (16 B/param with AdamW), bf16-mixed-fp32-grads (18), fp32, bf16; fp8 GEMMs (Transformer Engine) over bf16-mixed: fp8-delayed, fp8-current (per-tensor scaling), fp8-block (1x128/128x128, DeepSeek-V3), mxfp8 (Blackwell).")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs (Megatron sharding, all-reduce per layer).")]
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline stages (layers split evenly; activations sent between stages).")]
TrainPpOpt = Annotated[int, typer.Option("--pp", help="Pipeline stages (layers split evenly unless --first-stage-layers, --last-stage-layers or --stage-layers say otherwise; activations sent between stages).")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel GPUs: dividing --tp (experts inside the TP group) or dividing --dp with --tp 1 (all-to-all).")]
DpOpt = Annotated[int, typer.Option("--dp", help="Data-parallel replicas (each serves batch/dp sequences).")]
ImbalanceOpt = Annotated[float, typer.Option("--ep-imbalance", help="Tokens of the busiest expert rank over the mean (1 = balanced).")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", help="A shipped node or cluster (lmcost clusters list), or a YAML path; default: the GPU's usual node.")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", help="Nodes available; the layout must fit in them.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="torch intra-op threads (default: one per physical core available).", show_default=False)]
PromptOpt = Annotated[int, Count(help="Prompt tokens per sequence (prefill s); 128k = 131072.")]
GenOpt = Annotated[int, Count(help="Generated tokens per sequence; decode runs up to context prompt + gen; 1k = 1024.")]
StepsOpt = Annotated[int, Count("--gen", help="Decode steps per repeat (each at context prompt + 1).")]
FuseOpt = Annotated[str, typer.Option("--fuse", help="Fused operators: none, default (silu_mul), vllm/all, or a list of silu_mul,add_norm,rope_attention,qkv,gate_up,moe_grouped.")]
#: ``--fuse`` where ``--engine`` may choose the fusions: None (not given) is the engine's, else default.
EngineFuseOpt = Annotated[Optional[str], typer.Option("--fuse", show_default=False, help="Fused operators: none, default (silu_mul; the default without --engine), vllm/all (every fusion), or a list of silu_mul,add_norm,rope_attention,qkv,gate_up,moe_grouped; with --engine, default: the engine's fusions.")]
LayersOpt = Annotated[int, typer.Option(help="Keep this many blocks of the model (0: all).")]
RepeatsOpt = Annotated[int, typer.Option(help="Repeats (unprofiled for wall times, then profiled); the faster half of the steps is reported, with the spread.")]
GpuOpOpt = Annotated[str, typer.Option("--gpu", help="A shipped GPU name or alias, or a YAML path.")]
OpDtype = Annotated[str, typer.Option("--dtype", help="Element dtype of inputs and outputs; auto: bf16, or fp16 on a GPU without bf16 (as estimate). op gemm also takes fp4: A and B in the GPU's FP4 format (NVFP4 on NVIDIA Blackwell, MXFP4 on AMD CDNA 4), bf16 C, at the fp4 peak.")]


def parse_tokens(text: str, field: str) -> list[int]:
    """``4k,32k,128k`` -> [4096, 32768, 131072]: k, M and G are 1024, 1024² and 1024³, as context lengths
    are quoted (:func:`parse_count`). Raises: LmcostError naming ``field`` for an item that is not a count."""
    out = []
    for part in text.split(","):
        try:
            out.append(parse_count(part))
        except ValueError as e:
            what = str(e) if "lowercase" in str(e) else f"{part.strip()!r} is not a token count"
            raise LmcostError(field, what, "write e.g. 4k,32k,128k or 4096") from None
    return out


def parse_ints(text: str, field: str) -> list[int]:
    """``1,8,64`` -> [1, 8, 64] (k = 1024 allowed, as for contexts)."""
    try:
        return parse_tokens(text, field)
    except LmcostError:
        raise LmcostError(field, f"{text!r} is not a list of whole numbers", "write e.g. 1,8,64") from None


#: A number as typed: ASCII digits, a decimal point, an exponent, a sign. Not ``5_0`` (Python's float takes
#: it, as it takes full-width digits), ``nan`` or ``inf``.
_REAL = r"\s*[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*"


def parse_real(text: str, field: str, fix: str) -> float:
    """``2.5``, ``1e-3`` -> a float (:data:`_REAL`); its range is the library's to judge.
    Raises: LmcostError naming ``field`` (with ``fix``) for an empty text or one that is not such a number."""
    import re

    if not re.fullmatch(_REAL, text, flags=re.ASCII):
        raise LmcostError(field, "empty" if not text.strip() else f"{text!r:.60} is not a number", fix)
    return float(text)


def parse_reals(text: str, field: str, fix: str) -> list[float]:
    """``1,2,4.5`` -> [1.0, 2.0, 4.5], each part as :func:`parse_real` takes it. Raises: LmcostError naming
    ``field`` (with ``fix``) if a part is not a number, quoting the whole list."""
    try:
        return [parse_real(part, field, fix) for part in text.split(",")]
    except LmcostError:
        raise LmcostError(field, f"{text!r:.60} is not a list of numbers", fix) from None


#: Seconds per duration unit. Case-sensitive, as SI is: ``ms`` is milli, ``Ms`` would be mega, and
#: ``MS`` nothing. Micro is ``us``, or ``µs`` with the micro sign (U+00B5) or the Greek mu (U+03BC).
DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_duration(text: str, field: str) -> float:
    """'500ms', '0.5s', '250us' (or '250µs'), '800ns' -> seconds: a number (ASCII digits, a decimal point,
    an exponent) and one of the units of DURATION_UNITS, case as SI writes them.

    Raises: LmcostError naming ``field`` if empty, without one of those units (the message lists them), or
    for a value <= 0 or over an hour."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(\S*)\s*", text, flags=re.ASCII)
    units = "ns, us or µs, ms, s"
    if not text.strip():
        raise LmcostError(field, "empty", f"give a number with a unit ({units}), e.g. 500ms, or leave the option out")
    if not m:
        raise LmcostError(field, f"{text!r} is not a duration", f"give a number with a unit ({units}): 500ms, 0.2s, 800us")
    if m.group(2) not in DURATION_UNITS:
        said = "has no unit" if not m.group(2) else f"has the unit {m.group(2)!r}"
        raise LmcostError(field, f"{text!r} {said}; the units are {units}, case-sensitive (m is milli, M mega)",
                          "write e.g. 500ms, 0.2s, 800us")
    value = float(m.group(1)) * DURATION_UNITS[m.group(2)]
    # 1 ns to an hour: below a nanosecond no GPU event is timed (a kernel launch alone is microseconds)
    if not 1e-9 <= value <= 3600:
        raise LmcostError(field, f"{text!r} is out of range", "give a duration of at least 1ns and at most an hour")
    return value


#: Byte multipliers of ``--bytes``: bare K, M, G, T are binary, as nccl-tests reads its sizes (``-b 64M``),
#: and so are the IEC KiB..TiB; a plain B counts bytes. The SI spellings kB/KB, MB, GB, TB are refused: MB
#: is 10^6 in SI yet 2^20 in much common use, and the two differ by 5%. Lowercase m is milli: refused.
BYTE_SUFFIXES = {"": 1, "B": 1, "k": 2**10, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40,
                 "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_bytes(text: str) -> int:
    """A payload as nccl-tests reads it: ``65536``, ``64K``, ``64M``, ``1G`` (binary: K = 1024), or with an
    IEC unit, ``64MiB``; ASCII digits.

    Raises: LmcostError (--bytes) if it is not a whole size of at least one byte, or its unit is not one of
    BYTE_SUFFIXES (``64MB``: SI would make it 64,000,000, so it is refused as ambiguous; ``64m``: milli)."""
    import re

    t = str(text).strip()
    m = re.fullmatch(r"([0-9]+)\s*([A-Za-z]*)", t, flags=re.ASCII)
    fix = "give a whole number with K, M, G (binary, as nccl-tests) or KiB, MiB, GiB, e.g. 64M"
    power = " KMGT".find(m.group(2)[:1].upper()) if m and m.group(2)[1:] == "B" else -1
    if power > 0:
        raise LmcostError("--bytes", f"{text!r} is ambiguous: {m.group(2)} is 10^{3 * power} bytes in SI, "
                          f"2^{10 * power} in common use", fix)
    if m and m.group(2) == "m":
        raise LmcostError("--bytes", f"{text!r}: a lowercase m is milli", fix)
    if not m or m.group(2) not in BYTE_SUFFIXES or int(m.group(1)) == 0:
        raise LmcostError("--bytes", f"{text!r} is not a size of at least one byte", fix)
    return int(m.group(1)) * BYTE_SUFFIXES[m.group(2)]
