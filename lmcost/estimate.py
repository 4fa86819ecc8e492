"""The estimate: parameters, KV cache, memory, and prefill/decode roofline times for one workload.

This is the Python API the CLI renders::

    from lmcost import load_config, load_gpu, estimate, Workload
    est = estimate(load_config("llama-3-8b"), load_gpu("h100"), Workload(batch=8, prompt=2048, gen=256))
    est.op_classes          # pandas DataFrame: phase, op_class, flops, bytes, time_s, shares
    est.to_dict()           # the JSON of `lmcost estimate --json`

and, for sweeps, :func:`grid` evaluates one phase over arrays of batch sizes and contexts at once.

Phases: prefill runs b sequences of s = prompt tokens (t = s). A decode step runs b sequences of one
token at context t. The first generated token comes out of prefill (TTFT = prefill time); each of
the remaining gen - 1 tokens costs one decode step at t = prompt + 1, ..., prompt + gen - 1, and
TPOT is their mean. ``decode`` reports one step at the final context t = prompt + gen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .config import ArchConfig
from .dtypes import Precision
from .errors import LmcostError
from .graph import KERNELS, LOGITS, MLA_MODES, Dims, forward_ops
from .hardware import GPU
from .kvcache import kv_bytes_per_token
from .memory import footprint
from .params import param_counts
from .ops import OpCost
from .efficiency import TIME_MODELS, predict_time
from .fusion import FUSIONS, PRESETS, apply_fusion
from .roofline import bound, intensity, op_time

PHASES = ("prefill", "decode")
#: Phases phase_ops knows: a training step is forward + backward over s = t tokens.
ALL_PHASES = PHASES + ("train",)


#: Largest batch or token count accepted: beyond it float64 sweeps lose integer exactness and the
#: per-step TPOT evaluation stops being cheap; no real workload comes near.
MAX_COUNT = 2**31
#: Generated tokens: TPOT evaluates every decode step (in chunks), so keep that to seconds.
MAX_GEN = 2**24


def check_count(name: str, v, limit: int = MAX_COUNT) -> None:
    """Raises: LmcostError unless v is a whole number in [1, limit]."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= limit:
        flag = name if name.startswith("--") else f"--{name}"
        raise LmcostError(name, f"must be a whole number from 1 to {limit:,}, got {v!r}",
                          f"pass {flag} in that range")


def check_positions(cfg: ArchConfig, tokens: int, field: str, what: str | None = None) -> None:
    """Raises: LmcostError naming ``field`` if ``tokens`` positions (``what``, default the number)
    exceed the learned position table of ``cfg``. A model with RoPE or no positions has no limit."""
    if cfg.positions == "learned" and tokens > cfg.max_positions:
        raise LmcostError(field, f"{what or tokens} exceeds the {cfg.max_positions} learned positions of {cfg.name}",
                          f"keep {field} <= {cfg.max_positions}")


@dataclass(frozen=True)
class Workload:
    """What runs: ``batch`` concurrent sequences, ``prompt`` tokens each, then ``gen`` generated tokens.

    Raises: LmcostError if a value is below 1.
    """

    batch: int = 1
    prompt: int = 512
    gen: int = 256

    def __post_init__(self):
        for name in ("batch", "prompt", "gen"):
            check_count(name, getattr(self, name), MAX_GEN if name == "gen" else MAX_COUNT)

    @property
    def context(self) -> int:
        """Final context per sequence: prompt + gen."""
        return self.prompt + self.gen


@dataclass(frozen=True)
class Settings:
    """How kernels run.

    ``kernel``: flash|naive attention. ``mla``: absorbed|naive MLA, or auto: naive in prefill and
    absorbed in decode, as DeepSeek's and vLLM's inference do (the cheaper way for each phase).
    ``logits``: all|last, which tokens the lm_head runs on.
    ``model``: roofline|calibrated, how an op's time is predicted (:mod:`lmcost.efficiency`).
    ``fusion``: which operators run fused (:mod:`lmcost.fusion`); by default the gated activation
    and its multiply only. Fusion applies to prefill and decode (a training step runs unfused ops).
    """

    kernel: str = "flash"
    mla: str = "auto"
    logits: str = "all"
    model: str = "roofline"
    fusion: tuple = PRESETS["default"]

    def __post_init__(self):
        for name, allowed in (("kernel", KERNELS), ("mla", MLA_MODES + ("auto",)), ("logits", LOGITS),
                              ("model", TIME_MODELS)):
            if getattr(self, name) not in allowed:
                raise LmcostError(f"--{'attention' if name == 'kernel' else name}",
                                  f"unknown value {getattr(self, name)!r}", f"use one of {', '.join(allowed)}")
        for f in self.fusion:
            if f not in FUSIONS:
                raise LmcostError("--fuse", f"unknown fusion {f!r}", f"use some of {', '.join(FUSIONS)}")
        if "rope_attention" in self.fusion and self.kernel != "flash":
            raise LmcostError("--fuse", "rope_attention needs the flash kernel (RoPE inside it)",
                              "use --attention flash, or list the fusions without rope_attention")

    def mla_for(self, phase: str) -> str:
        """The MLA mode a phase runs."""
        if self.mla != "auto":
            return self.mla
        return "naive" if phase == "prefill" else "absorbed"


def require_decoder(cfg: ArchConfig) -> None:
    """Raises: LmcostError for a bidirectional model, which generates nothing (no decode step to report)."""
    if not cfg.causal:
        raise LmcostError("phase", f"{cfg.name} is bidirectional (causal: false): it has no decode step",
                          "use breakdown with --phase prefill or train")


def phase_dims(cfg: ArchConfig, precision: Precision, phase: str, b, tokens) -> Dims:
    """Dims of a phase: prefill of ``tokens`` (s = t = tokens) or a decode step at context ``tokens``."""
    if phase == "prefill":
        return Dims.of(cfg, precision, b, tokens, tokens)
    if phase == "decode":
        return Dims.of(cfg, precision, b, 1, tokens)
    if phase == "train":
        return Dims.of(cfg, precision, b, tokens, tokens)
    raise LmcostError("phase", f"unknown phase {phase!r}", f"use one of {', '.join(ALL_PHASES)}")


def phase_ops(cfg: ArchConfig, precision: Precision, phase: str, b, tokens, settings: Settings = Settings()) -> list[OpCost]:
    """The operators of one phase; ``tokens`` is the prompt (prefill), the context (decode) or the
    sequence length (train: forward and backward, :mod:`lmcost.training`)."""
    if phase == "train":
        from .training import train_ops

        return train_ops(cfg, phase_dims(cfg, precision, phase, b, tokens), settings.kernel, settings.mla_for("prefill"))
    ops = forward_ops(cfg, phase_dims(cfg, precision, phase, b, tokens), settings.kernel, settings.mla_for(phase),
                      settings.logits)
    return apply_fusion(ops, settings.fusion, settings.kernel)


def phase_totals(cfg, gpu: GPU, precision: Precision, phase: str, b, tokens, settings: Settings = Settings()) -> dict:
    """Totals of one phase over all ops, for scalar or array ``b`` and ``tokens`` (broadcast).

    Returns: :func:`op_totals` of the phase's operators under ``settings.model``.
    """
    return op_totals(phase_ops(cfg, precision, phase, b, tokens, settings), gpu, precision, settings.model)


def op_totals(ops: list[OpCost], gpu: GPU, precision: Precision, model: str = "roofline") -> dict:
    """Totals over ``ops`` (each times its count), for scalar or array dims.

    Returns: dict of flops (FLOPs), bytes (bytes), compute_s and memory_s (the two roofline terms
    summed over ops, s), time_s (sum of per-op times under ``model``, s), upper_s (no-overlap
    roofline bound, s).
    """
    out = dict(flops=0, bytes=0, compute_s=0, memory_s=0, time_s=0, upper_s=0)
    for op in ops:
        t = op_time(op, gpu, precision)
        out["flops"] = out["flops"] + op.flops * op.count
        out["bytes"] = out["bytes"] + op.bytes * op.count
        out["compute_s"] = out["compute_s"] + t.compute_s * op.count
        out["memory_s"] = out["memory_s"] + t.memory_s * op.count
        time_s = t.time_s if model == "roofline" else predict_time(op, gpu, precision, model)
        out["time_s"] = out["time_s"] + time_s * op.count
        out["upper_s"] = out["upper_s"] + t.upper_s * op.count
    return out


def grid(cfg, gpu: GPU, precision: Precision, phase: str, batch, tokens, settings: Settings = Settings()) -> pd.DataFrame:
    """One phase over every (batch, tokens) pair of two 1-D arrays, evaluated in one vectorised pass.

    Returns: DataFrame with columns batch, tokens, flops, bytes, arithmetic_intensity, time_s,
    compute_s, memory_s, bound; one row per pair (len(batch) * len(tokens) rows).
    """
    for name, values in (("batch", batch), ("tokens", tokens)):
        for v in np.asarray(values).ravel().tolist():
            check_count(name, v)
    check_positions(cfg, max(np.asarray(tokens).ravel().tolist()), "tokens")
    b = np.asarray(batch, dtype=float)[:, None]
    n = np.asarray(tokens, dtype=float)[None, :]
    tot = phase_totals(cfg, gpu, precision, phase, b, n, settings)
    shape = (b.shape[0], n.shape[1])
    cols = {k: np.broadcast_to(v, shape).ravel() for k, v in tot.items()}
    df = pd.DataFrame({"batch": np.broadcast_to(b, shape).ravel().astype(int),
                       "tokens": np.broadcast_to(n, shape).ravel().astype(int), **cols})
    df["arithmetic_intensity"] = intensity(df["flops"].to_numpy(), df["bytes"].to_numpy())
    df["bound"] = bound(df["compute_s"].to_numpy(), df["memory_s"].to_numpy())
    return df


def op_table(ops: list[OpCost], gpu: GPU, precision: Precision, phase: str, model: str = "roofline") -> pd.DataFrame:
    """One row per operator (scalar dims): totals over its layers, times and bound.

    ``roofline_s`` and ``calibrated_s`` are both models' times (s, all layers); ``time_s`` is ``model``'s.
    """
    rows = []
    for op in ops:
        t = op_time(op, gpu, precision)
        c = op.count
        roof, cal = float(t.time_s) * c, float(predict_time(op, gpu, precision, "calibrated")) * c
        rows.append(dict(phase=phase, name=op.name, op_class=op.op_class.value, count=c,
                         flops=op.flops * c, bytes=op.bytes * c, weight_bytes=op.weight_bytes * c,
                         act_bytes=(op.act_read_bytes + op.act_write_bytes) * c,
                         kv_bytes=(op.kv_read_bytes + op.kv_write_bytes) * c,
                         compute_s=t.compute_s * c, memory_s=t.memory_s * c,
                         time_s=roof if model == "roofline" else cal, roofline_s=roof, calibrated_s=cal,
                         upper_s=t.upper_s * c, arithmetic_intensity=intensity(op.flops, op.bytes),
                         bound=bound(t.compute_s, t.memory_s), shapes=op.shapes))
    return pd.DataFrame(rows)


def class_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Per phase and operator class: FLOPs, bytes, time and their shares of the phase (fractions)."""
    g = ops.groupby(["phase", "op_class"], sort=False)[["flops", "bytes", "time_s"]].sum().reset_index()
    for col, share in (("flops", "flops_share"), ("time_s", "time_share")):
        phase_sum = g.groupby("phase", sort=False)[col].transform("sum")
        g[share] = np.where(phase_sum > 0, g[col] / phase_sum.where(phase_sum > 0, 1), 0.0)
    return g


def _summary(df: pd.DataFrame) -> dict:
    flops, bytes_ = float(df["flops"].sum()), float(df["bytes"].sum())
    compute_s, memory_s = float(df["compute_s"].sum()), float(df["memory_s"].sum())
    return dict(flops=flops, bytes=bytes_, arithmetic_intensity=intensity(flops, bytes_),
                time_s=float(df["time_s"].sum()), time_roofline_s=float(df["roofline_s"].sum()),
                time_calibrated_s=float(df["calibrated_s"].sum()), time_upper_s=float(df["upper_s"].sum()),
                compute_s=compute_s, memory_s=memory_s, bound=bound(compute_s, memory_s))


@dataclass
class Estimate:
    """Everything ``lmcost estimate`` reports, in base units (FLOPs, bytes, seconds)."""

    model: str
    gpu: str
    precision: Precision
    workload: Workload
    settings: Settings
    params: dict
    kv_cache: dict
    memory: dict
    prefill: dict
    decode: dict
    ttft_s: float
    tpot_s: float
    throughput_tokens_per_s: float
    ops: pd.DataFrame = field(repr=False)
    op_classes: pd.DataFrame = field(repr=False)

    def to_dict(self) -> dict:
        """The JSON contract of ``estimate --json`` (plain Python types, base units)."""
        def clean(v):
            if isinstance(v, dict):
                return {k: clean(x) for k, x in v.items()}
            if isinstance(v, (np.floating, np.integer)):
                return v.item()
            if isinstance(v, float) and not np.isfinite(v):
                return None
            return v

        return clean(dict(
            model=self.model, gpu=self.gpu,
            precision=dict(weights=self.precision.weights, activations=self.precision.activations,
                           kv_cache=self.precision.kv_cache),
            workload=dict(batch=self.workload.batch, prompt=self.workload.prompt, gen=self.workload.gen,
                          context=self.workload.context),
            settings=dict(attention=self.settings.kernel, mla=self.settings.mla, logits=self.settings.logits,
                          model=self.settings.model, fusion=list(self.settings.fusion)),
            params=self.params, kv_cache=self.kv_cache, memory=self.memory,
            prefill=self.prefill, decode=self.decode, ttft_s=self.ttft_s, tpot_s=self.tpot_s,
            throughput_tokens_per_s=self.throughput_tokens_per_s,
            op_classes=[clean(r) for r in self.op_classes.to_dict("records")]))


def _decode_steps_time(cfg, gpu, precision, wl: Workload, settings: Settings, chunk: int = 1 << 16) -> float:
    """Sum of the roofline times of the gen - 1 decode steps, at t = prompt + 1 ... prompt + gen - 1
    (seconds), evaluated exactly, in chunks of contexts so memory stays bounded for long generations."""
    total_s = 0.0
    for start in range(wl.prompt + 1, wl.prompt + wl.gen, chunk):
        steps = np.arange(start, min(start + chunk, wl.prompt + wl.gen), dtype=float)
        total_s += float(np.sum(phase_totals(cfg, gpu, precision, "decode", wl.batch, steps, settings)["time_s"]))
    return total_s


def estimate(cfg: ArchConfig, gpu: GPU, workload: Workload = Workload(), precision: Precision = Precision(),
             settings: Settings = Settings()) -> Estimate:
    """Parameters, KV cache, memory, prefill and decode costs and times of ``workload`` on ``gpu``.

    Memory is weights + KV cache at the final context + the activation peak of prefill
    (:func:`lmcost.memory.footprint`).
    Raises: LmcostError if the GPU has no peak for the activation dtype, or the context exceeds a
    learned position table.
    """
    wl = workload
    require_decoder(cfg)
    check_positions(cfg, wl.context, "--prompt + --gen", f"context {wl.context}")
    params = param_counts(cfg, precision)
    pre_ops = phase_ops(cfg, precision, "prefill", wl.batch, wl.prompt, settings)
    dec_ops = phase_ops(cfg, precision, "decode", wl.batch, wl.context, settings)
    ops = pd.concat([op_table(pre_ops, gpu, precision, "prefill", settings.model),
                     op_table(dec_ops, gpu, precision, "decode", settings.model)], ignore_index=True)
    prefill, decode = _summary(ops[ops.phase == "prefill"]), _summary(ops[ops.phase == "decode"])

    ttft = prefill["time_s"]
    steps_s = _decode_steps_time(cfg, gpu, precision, wl, settings)
    tpot = steps_s / (wl.gen - 1) if wl.gen > 1 else None
    total_s = ttft + steps_s

    mem = footprint(cfg, precision, batch=wl.batch, context=wl.context, ops=pre_ops, tokens=wl.prompt)
    return Estimate(
        model=cfg.name, gpu=gpu.name, precision=precision, workload=wl, settings=settings, params=params,
        kv_cache=dict(bytes_per_token=kv_bytes_per_token(cfg, precision), bytes_total=mem["kv_cache_bytes"],
                      context=wl.context, batch=wl.batch),
        memory=dict(**mem, capacity_bytes=gpu.memory_bytes, fits=bool(mem["total_bytes"] <= gpu.memory_bytes)),
        prefill=prefill, decode=decode, ttft_s=ttft, tpot_s=tpot,
        throughput_tokens_per_s=wl.batch * wl.gen / total_s,
        ops=ops, op_classes=class_table(ops))
