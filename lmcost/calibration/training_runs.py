"""Published training runs as lmcost training cases: ``lmcost/data/measurements/training-runs.csv`` (the fitting
set of issue 26; its columns, sources, FLOP conventions and caveats are in training-runs.md beside it), each row
read into a :class:`RunRow` that either resolves (a model lmcost builds, a GPU it has, a layout the source gives,
and the published figure as tokens/s per GPU, bytes or an out-of-memory outcome) or carries a one-line ``skip``
reason.

Rules (the .md's words are the authority):
- a layout field the source leaves empty is not guessed, except where the .md says the layout comes from the
  same repository's config (``notes`` then give it: NeMo-Megatron-Launcher's ``TP1 PP1 MBS2 GBS2048``), or it
  follows from the others (cp = n / (tp pp dp); tp = pp = cp = 1 where dp = n);
- what a row leaves unstated and lmcost needs (recompute "per recipe", the ZeRO stage of a Megatron table) takes
  lmcost train's default, as a user would, and the row's ``assumptions`` say so;
- throughput metrics become published tokens/s per GPU in the source's own convention
  (:mod:`lmcost.calibration.training_flops`): step_time_s: global_batch x seq / step / n_gpus; iter_time_s
  (LitGPT, one micro-batch per GPU per iteration): micro_batch x seq / iteration; TFLOP/s: value / the
  source's FLOPs per token; MFU/HFU: value x the source's peak / its FLOPs per token;
- memory metrics stay bytes with their kind: allocated (``max_memory_allocated``), active (torch's
  ``active_bytes.all.peak``), unstated, nvidia-smi (whole process: context and allocator cache included);
  GB as published is read as 1e9 bytes, GiB as 2^30; ``oom`` rows are outcomes.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from lmcost.basics import shipped
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import read_text
from lmcost.calibration.measurements import MAX_TABLE_BYTES
from lmcost.calibration.training_flops import MFU_PEAK, convention_for, flops_per_token
from lmcost.model.config import ArchConfig

#: The shipped fitting set.
TRAINING_TABLE = "training-runs.csv"
THROUGHPUT = ("tokens_per_s_per_gpu", "step_time_s", "iter_time_s", "model_tflops_per_gpu", "mfu",
              "hardware_tflops_per_gpu", "hfu")
MEMORY = {"peak_memory_allocated": "allocated", "peak_memory_active": "active", "peak_memory": "unstated",
          "device_memory_used": "nvidia-smi"}
FRAMEWORKS = ("auto", "megatron", "deepspeed", "fsdp", "fsdp-compile", "eager")

#: Model names of the table -> shipped lmcost models, until lmcost.calibration.training_models (which builds
#: every model of the table) is in: the same shapes; Llama 3 70B is Llama 3.1 70B's (RoPE scaling and
#: the longer position table change no count at these lengths).
LOCAL_MODELS = {
    "Llama 3 8B": "llama-3-8b", "Llama 3 8B (OLMo-core impl.)": "llama-3-8b", "Llama 3.1 8B": "llama-3.1-8b",
    "Llama 3 70B": "llama-3.1-70b", "Llama 3.1 70B": "llama-3.1-70b", "Llama 3.1 405B": "llama-3.1-405b",
    "Llama 2 7B": "llama-2-7b", "Llama 2 7B (FMS)": "llama-2-7b", "Llama 2 7B (FMS, LlamaT)": "llama-2-7b",
    "DeepSeek-V3": "deepseek-v3", "Qwen3-235B-A22B": "qwen3-235b-a22b", "Mixtral 8x7B": "mixtral-8x7b",
    "gpt-oss-120b": "gpt-oss-120b", "gpt-oss-20b": "gpt-oss-20b", "Kimi K2": "kimi-k2", "Qwen2.5-7B": "qwen2.5-7b",
}


class Skip(Exception):
    """A row lmcost cannot cost as published: the one-line reason."""


@dataclass(frozen=True)
class RunRow:
    """One published figure and the training case it measured (units: seconds, bytes, tokens/s per GPU).

    ``row``: the data row's number (1 = the line after the header); ``model``/``gpu_text``: as published;
    ``arch``/``gpu``: lmcost's model and GPU names; ``zero``: 0-3 (3 = FSDP); ``shard_group``: GPUs that shard
    the states when fewer than the data-parallel ranks (HSDP, ZeRO-1 within a node), else None;
    ``framework``: one of :data:`FRAMEWORKS`; ``metric_class``: throughput, memory or oom;
    ``published``: tokens/s per GPU (throughput), bytes (memory) or 1 (oom); ``memory_kind``: allocated,
    active, unstated or nvidia-smi; ``convention``: the FLOP convention read back; ``skip``: why the row
    cannot be costed (None: it resolves); ``assumptions``: what was taken where the row is silent."""

    row: int
    source: str
    kind: str
    model: str
    gpu_text: str
    metric: str
    value: float
    unit: str
    metric_class: str
    arch: str | None = None
    gpu: str | None = None
    gpus: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int | None = None
    vp: int = 1
    zero: int | None = None
    shard_group: int | None = None
    recompute: str | None = None
    precision: str | None = None
    fp8: bool = False
    seq: int | None = None
    global_batch: int | None = None
    micro_batch: int | None = None
    framework: str = "auto"
    lora_rank: int | None = None
    lora_targets: str | None = None
    qlora: bool = False
    sp: bool = False
    published: float | None = None
    memory_kind: str | None = None
    convention: str | None = None
    assumptions: tuple[str, ...] = ()
    skip: str | None = None
    cfg: ArchConfig | None = field(default=None, repr=False, compare=False)

    @property
    def schedule(self) -> str:
        """The pipeline schedule: interleaved where the row runs several model chunks per GPU."""
        return "interleaved" if self.vp > 1 else "1f1b"


def _int(text: str) -> int | None:
    """A whole number cell, or None for an empty or worded one ("not stated", "variable (...)")."""
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


@functools.lru_cache(maxsize=None)
def _model(name: str) -> ArchConfig:
    """The lmcost config of a model as the table names it: lmcost.calibration.training_models when it is
    there, else the shipped model of :data:`LOCAL_MODELS`. Raises: Skip for a model neither builds."""
    try:
        from lmcost.calibration.training_models import training_model
    except ImportError:
        training_model = None
    try:
        if training_model is not None:
            return training_model(name)
        if name in LOCAL_MODELS:
            from lmcost.model.loading import load_config

            return load_config(LOCAL_MODELS[name])
    except LmcostError as e:
        raise Skip(f"model {name!r} not buildable: {e.what}") from None
    raise Skip(f"model {name!r} not buildable (no shipped lmcost model of that shape)")


def _gpu(text: str) -> tuple[str, str | None]:
    """(lmcost GPU name, assumption or None) for the table's ``gpu`` text. Raises: Skip for a GPU lmcost has
    no file for, or one the source does not name."""
    t = text.lower()
    if "gb200" in t:
        return "gb200", None
    if "b200" in t:
        return "b200", None
    if "h100" in t:
        if "pcie" in t:
            return "h100-pcie", None
        return "h100-sxm", ("H100 variant not stated: SXM taken (the .md: its MFUs imply the 989 TFLOP/s SXM peak)"
                            if "sxm" not in t and "dgx" not in t else None)
    if "a800" in t:
        return "a100-80gb", "A800 taken as A100 80GB (same SMs, clocks and HBM; NVLink cut to 400 GB/s)"
    if "a100" in t:
        if "40g" in t:
            return "a100-40gb", None
        return "a100-80gb", None if "80gb" in t.replace(" ", "").replace("-", "") else "A100 variant not stated: 80GB taken"
    if "rtx 4090" in t:
        return "rtx-4090", None
    if "a6000" in t:
        raise Skip("GPU RTX A6000 has no lmcost GPU file")
    raise Skip(f"GPU not named ({text})")


def _framework(r: dict) -> str:
    """The framework class of a row (:data:`FRAMEWORKS`), from its framework and source text."""
    t = f"{r['framework']} {r['source']}".lower()
    if "automodel" in t:
        return "fsdp"
    if "deepspeed" in t or "internevo" in t:  # InternEvo's hybrid ZeRO overlap is DeepSpeed's scheme
        return "deepspeed"
    if "megatron" in t or "nemo" in t:
        return "megatron"
    if "compile on" in t or "olmo-core" in t or "torchtitan" in t:
        return "fsdp-compile"
    if "fsdp" in t or "torchtune" in t:
        return "fsdp"
    return "eager"


def _sharding(text: str, framework: str, dp: int, notes: list) -> tuple[int, int | None]:
    """(ZeRO stage, shard group or None) from the ``zero_or_fsdp`` text. Raises: Skip for CPU offload or a
    stage the source does not give (outside Megatron, whose distributed optimizer lmcost defaults to)."""
    t = text.lower()
    if "offload" in t:
        raise Skip("CPU offload is not modelled")
    group = None
    if m := re.search(r"fsdp=(\d+)", t):
        group = int(m.group(1))
    elif m := re.search(r"zero1=(\d+)", t):
        group = int(m.group(1))
    elif "hsdp" in t:
        group = 8
        notes.append("HSDP: shard group taken as the 8 GPUs of a node")
    group = group if group is not None and group < dp else None
    if "stage 0" in t or "single device" in t or t in ("none", "none (full finetuning)", "ddp"):
        return 0, None
    if "fsdp=0" in t or ("not stated" in t and "distributed optimizer" in t):
        notes.append("optimizer sharding not in the table: Megatron's distributed optimizer (ZeRO-1) taken")
        return 1, None
    if "zero-3" in t or "zero stage 3" in t or "fsdp" in t:
        return 3, group
    if "zero-1" in t or "zero stage 1" in t or "zero1" in t or "zeroredundancy" in t:
        if group is not None:
            notes.append(f"ZeRO-1 within groups of {group}: sharded over all dp ranks (lmcost's ZeRO-1 has no group)")
        return 1, None
    if framework == "megatron" and ("not stated" in t or "not in table" in t):
        notes.append("optimizer sharding not stated: Megatron's distributed optimizer (ZeRO-1) taken")
        return 1, None
    raise Skip("ZeRO/FSDP stage not stated")


def _recompute(text: str, framework: str, notes: list) -> str:
    """none, selective or full from the ``recompute`` text. Raises: Skip for FMS's checkpointing of a
    fraction of blocks (not expressible yet)."""
    t = text.lower()
    if "fraction of blocks" in t or ("selective" in t and "fsdp" in framework):
        raise Skip("activation checkpointing of a fraction of blocks is not modelled yet")
    if t.startswith("none"):
        return "none"
    if t.startswith("selective"):
        return "selective"
    if "full" in t or "checkpointing" in t:
        return "full"
    notes.append(f"recompute {text!r}: none (lmcost's default) taken")
    return "none"


def _precision(text: str, source: str, notes: list) -> tuple[str, bool, bool]:
    """(lmcost precision recipe, fp8, NF4 base) from the ``precision`` text (and, for torchtune, whose recipes
    train in pure bf16 (``dtype: bf16``, no fp32 master), the source)."""
    t = text.lower()
    if "torchtune" in source and t.startswith("bf16"):
        return "bf16", False, "nf4" in t
    fp8 = "fp8" in t or "float8" in t
    nf4 = "nf4" in t
    if "fp16" in t and "bf16" not in t:
        return "fp16-mixed", fp8, nf4
    if "bf16-true" in t:
        return "bf16", fp8, nf4
    if "fp32 grad" in t:
        return "bf16-mixed-fp32-grads", fp8, nf4
    if "not stated" in t and "bf16" not in t:
        notes.append("precision not stated: bf16-mixed taken")
    return "bf16-mixed", fp8, nf4


def _fp8_recipe(text: str, notes: list) -> str:
    """lmcost's fp8 recipe (:mod:`lmcost.cost.fp8_training`) for an fp8 ``precision`` text: MXFP8 -> mxfp8,
    blockwise -> fp8-block, per-tensor current scaling and torchao's float8 (its default tensorwise dynamic
    scaling) -> fp8-current; plain FP8 under Transformer Engine (NeMo, Megatron) -> fp8-delayed, TE's default
    recipe (DelayedScaling), said in the row's notes."""
    t = text.lower()
    if "mxfp8" in t:
        return "mxfp8"
    if "blockwise" in t or "block scaling" in t:
        return "fp8-block"
    if "current" in t or "torchao" in t:
        return "fp8-current"
    notes.append("fp8 scaling not stated: Transformer Engine's default delayed scaling taken")
    return "fp8-delayed"


def _lora(r: dict) -> tuple[int | None, str | None]:
    """(rank, targets) of a LoRA row from ``arch_notes``/``notes``. Raises: Skip where the rank is not given."""
    t = f"{r['arch_notes']} {r['notes']}"
    m = re.search(r"\br\s*=\s*(\d+)", t)
    if not m:
        raise Skip("LoRA rank and targets not stated")
    targets = "q,v" if "query+value" in t else "q,k,v,o,gate,up,down" if "all-linear" in t else None
    if targets is None:
        raise Skip("LoRA targets not stated")
    return int(m.group(1)), targets


def _seq(r: dict, metric_class: str, notes: list) -> int:
    """Tokens per sequence. For LitGPT's variable-length Alpaca rows, the longest example the notes give for
    the model (memory peaks there); throughput needs the mean, which is not published. Raises: Skip."""
    s = _int(r["seq_len"])
    if s is not None:
        return s
    text = r["seq_len"]
    if text.startswith("variable"):
        if metric_class == "throughput":
            raise Skip("variable sequence length: the mean length is not published")
        for n, family in re.findall(r"(\d{3,6})(?: tokens for)? (Llama 2|phi-1.5|StableLM|Falcon)", text):
            if r["model"].lower().startswith(family.lower()[:5]):
                notes.append(f"variable sequence length: the longest example ({n} tokens) taken")
                return int(n)
    raise Skip("sequence length not stated")


def _layout(r: dict, notes: list) -> dict:
    """gpus, tp, pp, cp, ep, dp, vp, micro and global batch from the row (and, where the .md says the layout
    comes from the same repo's config, its notes). Raises: Skip for a layout the source does not give."""
    n = _int(r["n_gpus"])
    if n is None:
        raise Skip("GPU count not published")
    tp, pp, cp, ep, dp, vp = (_int(r[k]) for k in ("tp", "pp", "cp", "ep", "dp", "vp"))
    mb, gb = _int(r["micro_batch"]), _int(r["global_batch"])
    if tp is None and pp is None and (m := re.search(r"\bTP(\d+) PP(\d+)(?: MBS(\d+))?(?: GBS(\d+))?", r["notes"])):
        tp, pp = int(m.group(1)), int(m.group(2))
        mb = mb or (m.group(3) and int(m.group(3)))
        gb = gb or (m.group(4) and int(m.group(4)))
        notes.append("layout from the repo's config at that commit (notes), not confirmed as the benchmarked one")
    if n == 1 or (dp == n and tp is None and pp is None):
        tp, pp, cp, dp = tp or 1, pp or 1, cp or 1, n
    if tp is None or pp is None:
        raise Skip("layout not published (tp/pp)")
    if cp is None:
        cp = n // (tp * pp * dp) if dp and n % (tp * pp * dp) == 0 else 1
    derived = n // (tp * pp * cp) if n % (tp * pp * cp) == 0 else None
    if dp is not None and dp != derived:
        raise Skip(f"published dp {dp} is not n_gpus/(tp x pp x cp) = {n}/{tp * pp * cp}")
    dp = derived
    if dp is None:
        raise Skip(f"{n} GPUs do not split into tp x pp x cp = {tp * pp * cp}")
    if mb is None:
        raise Skip("micro-batch not published")
    if gb is None:
        m = re.search(r"micro_num=(\d+)", r["notes"])
        gb = mb * dp * (int(m.group(1)) if m else 1)
        notes.append(f"global batch not in the row: micro-batch x dp{' x micro_num' if m else ''} = {gb} taken")
    return dict(gpus=n, tp=tp, pp=pp, cp=cp, ep=ep or 1, dp=dp, vp=vp or 1, micro_batch=mb, global_batch=gb)


_UNIT_BYTES = {"GB (1e9 bytes)": 1e9, "GB (as published)": 1e9, "GB": 1e9, "GiB": 2.0 ** 30}


def _published(row: RunRow, cfg: ArchConfig) -> tuple[float, str | None]:
    """(published figure, FLOP convention) of a resolved row: tokens/s per GPU, bytes, or 1 for an OOM.
    Raises: Skip for a FLOP figure whose convention or peak the source does not state."""
    m, v = row.metric, row.value
    if m == "oom":
        return 1.0, None
    if m in MEMORY:
        return v * _UNIT_BYTES[row.unit], None
    if m == "tokens_per_s_per_gpu":
        return v, None
    if m == "step_time_s":
        return row.global_batch * row.seq / v / row.gpus, None
    if m == "iter_time_s":
        return row.micro_batch * row.seq / v, None
    conv = convention_for(row.source, m)
    if conv is None:
        raise Skip(f"{m}: the source's FLOP convention is not stated")
    if row.kind in ("lora", "qlora"):
        raise Skip(f"{m}: the source's LoRA FLOP accounting is not stated")
    per_token = flops_per_token(conv, cfg, row.seq, row.recompute or "none")
    if m in ("mfu", "hfu"):
        if row.gpu not in MFU_PEAK:
            raise Skip(f"{m}: no published MFU peak for {row.gpu}")
        return v * MFU_PEAK[row.gpu] / per_token, conv
    return v * 1e12 / per_token, conv


def resolve(r: dict, index: int) -> RunRow:
    """The :class:`RunRow` of one CSV record (a dict of the table's columns; ``index`` its data row number):
    resolved, or with ``skip`` set to the first reason it cannot be costed (module docstring: the rules)."""
    metric = r["metric"]
    cls = "throughput" if metric in THROUGHPUT else "memory" if metric in MEMORY else "oom" if metric == "oom" else "other"
    row = RunRow(row=index, source=r["source"], kind=r["kind"], model=r["model"], gpu_text=r["gpu"], metric=metric,
                 value=float(r["value"]), unit=r["unit"], metric_class=cls)
    notes: list[str] = []
    try:
        if cls == "other":
            raise Skip(f"unknown metric {metric!r}")
        if "encoder-decoder" in r["arch_notes"]:
            raise Skip("encoder-decoder model: lmcost trains decoder-only stacks")
        precision, fp8, nf4 = _precision(r["precision"], r["source"], notes)
        row = replace(row, precision=precision, fp8=fp8, qlora=nf4 or r["kind"] == "qlora", framework=_framework(r))
        if fp8:
            row = replace(row, precision=_fp8_recipe(r["precision"], notes))
        gpu, note = _gpu(r["gpu"])
        notes += [note] if note else []
        row = replace(row, gpu=gpu)
        lay = _layout(r, notes)
        zero, group = _sharding(r["zero_or_fsdp"], row.framework, lay["dp"], notes)
        recompute = _recompute(r["recompute"], row.framework, notes)
        seq = _seq(r, cls, notes)
        rank, targets = _lora(r) if r["kind"] in ("lora", "qlora") else (None, None)
        cfg = _model(r["model"])  # last: a row skipped for its model alone resolves once the model is built
        sp = row.framework == "megatron" and lay["tp"] > 1
        if sp:
            notes.append("sequence parallelism with TP taken (Megatron-Core recipes turn it on with TP)")
        row = replace(row, arch=cfg.name, cfg=cfg, zero=zero, shard_group=group, recompute=recompute, seq=seq,
                      lora_rank=rank, lora_targets=targets, sp=sp, **lay)
        published, conv = _published(row, cfg)
        return replace(row, published=published, convention=conv, memory_kind=MEMORY.get(metric),
                       assumptions=tuple(notes))
    except Skip as e:
        return replace(row, skip=str(e), assumptions=tuple(notes))


def load_runs(table: str | None = None) -> list[RunRow]:
    """Every row of a training-runs table (None: the shipped one), resolved or with its skip reason.

    Raises: LmcostError (table) for a file that cannot be read or lacks the table's columns."""
    path = Path(table) if table else shipped.folder("measurements") / TRAINING_TABLE
    try:
        text = read_text(path, MAX_TABLE_BYTES, "table")
    except LmcostError as e:  # the field is the flag; the path goes in the message
        raise LmcostError("table", f"{e.field}: {e.what}", e.fix) from None
    reader = csv.DictReader(io.StringIO(text))
    need = {"source", "kind", "model", "arch_notes", "gpu", "n_gpus", "tp", "pp", "cp", "ep", "dp", "vp",
            "zero_or_fsdp", "recompute", "precision", "seq_len", "global_batch", "micro_batch", "framework",
            "metric", "value", "unit", "notes"}
    missing = need - set(reader.fieldnames or ())
    if missing:
        raise LmcostError("table", f"{path.name} lacks the column(s) {', '.join(sorted(missing))}",
                          "give a table in the format of lmcost/data/measurements/training-runs.csv")
    return [resolve(r, i) for i, r in enumerate(reader, start=1)]
