"""Data behind the roofline figures: operator-class points, the critical batch, and sweeps.

A point is one operator class of one phase on one GPU at one batch size: x = FLOPs / bytes
(arithmetic intensity), y = FLOPs / roofline time (the FLOP/s it would achieve running at its
roofline time), sized by its share of the phase's time. Every number is a per-class total of
:meth:`lmcost.cost.phases.PhaseCost.classes`, the rows ``estimate`` reports: the figure only draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lmcost.apps.setup import Say, quiet, resolve_precision
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.compile import phase_records
from lmcost.cost.phases import PhaseCost, grid
from lmcost.operators.workload import Settings, check_count, check_positions, require_decoder
from lmcost.hardware.gpu import GPU
from lmcost.cost.memory import largest
from lmcost.operators.ops import IVANOV_CLASSES, RECURRENT_CONTRACTIONS, OpClass
from lmcost.cost.roofline import bound


def single_context(contexts: list[int]) -> int:
    """The one context of a roofline figure (its prefill prompt and its decode step's context).

    Raises: LmcostError (roofline.context) unless exactly one is given."""
    if len(contexts) != 1:
        raise LmcostError("roofline.context", f"one context per figure, got {len(contexts)}",
                          "give one, e.g. `context` 4k")
    return contexts[0]


def roofline_points(cfg: ArchConfig, gpus: list[GPU], batches: list[int], context: int,
                    precision: Precision = Precision(), settings: Settings = Settings(),
                    phases=("prefill", "decode"), progress=None) -> pd.DataFrame:
    """One row per (gpu, batch, phase, op_class): flops, bytes, time_s, flops_share, time_share,
    arithmetic_intensity (FLOPs/byte), achieved_flops_per_s (FLOPs / time_s).

    Prefill runs ``context`` prompt tokens; decode is one step at context ``context``
    (an estimate with prompt = context - 1 and gen = 1 puts its decode step there).
    ``progress``: optional callable wrapping the iterable of (gpu, batch) pairs (a progress bar).
    """
    check_count("context", context)
    for b in batches:
        check_count("batch", b)
    if "decode" in phases:
        require_decoder(cfg)
    check_positions(cfg, context, "roofline_points.context")
    pairs = [(g, b) for g in gpus for b in batches]
    rows = []
    for gpu, b in (progress(pairs) if progress else pairs):
        recs = [phase_records(cfg, precision, phase, b, context, settings) for phase in phases]
        for cost in PhaseCost.of_phases(recs, gpu, precision, list(phases), settings.model):
            rows += [dict(gpu=gpu.name, batch=b, context=context, **r) for r in cost.classes()]
    out = pd.DataFrame(rows)
    # Exact Python ints past int64 (very long contexts) would make object columns: divide as floats.
    flops, bytes_, time_s = (out[c].astype(float).to_numpy() for c in ("flops", "bytes", "time_s"))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["arithmetic_intensity"] = np.where(bytes_ > 0, flops / bytes_, np.inf)
        out["achieved_flops_per_s"] = np.where(time_s > 0, flops / time_s, 0.0)
    return out


def gemm_bound(cfg, gpu: GPU, precision: Precision, b: int, context: int, settings: Settings = Settings()) -> str:
    """Whether the decode GEMMs at batch b and context t are compute- or memory-bound in total:
    compute when their summed FLOPs/peak exceeds their summed bytes/bandwidth."""
    cost = PhaseCost(phase_records(cfg, precision, "decode", b, context, settings), gpu, precision, "decode")
    t, gemm = cost.times, [c == OpClass.GEMM.value for c in cost.rec.graph.classes]
    return bound(float(np.sum(t["compute_s"][gemm])), float(np.sum(t["memory_s"][gemm])))


def critical_batch(cfg, gpu: GPU, precision: Precision, context: int, settings: Settings = Settings(),
                   limit: int = 1 << 20) -> int | None:
    """The smallest batch at which the decode GEMMs turn compute-bound (their FLOPs grow with b, their
    weight reads do not), or None if they stay memory-bound up to ``limit``.

    Weight reads make the GEMMs memory-bound at small b: with bf16 weights a GEMM does 2·b FLOPs per
    2-byte weight, an intensity of about b, so the switch comes a little above b = ridge point
    (activation traffic adds bytes). MoE GEMMs switch later: more experts are read as b grows.
    """
    last_memory = largest(lambda b: gemm_bound(cfg, gpu, precision, b, context, settings) == "memory", limit)
    return None if last_memory >= limit else last_memory + 1


def batch_sweep(cfg, gpu: GPU, precision: Precision, context: int, batches, settings: Settings = Settings()) -> pd.DataFrame:
    """Decode step at context t over batch sizes: time_s (per step = per token of each sequence),
    tokens_per_s (b / step time), bound. One vectorised evaluation."""
    for b in batches:
        check_count("batch", int(b))
    df = grid(cfg, gpu, precision, "decode", batches, [context], settings)
    df["tokens_per_s"] = df.batch / df.time_s
    return df


def prompt_sweep(cfg, gpu: GPU, precision: Precision, batch: int, prompts, settings: Settings = Settings()) -> pd.DataFrame:
    """Prefill over prompt lengths at batch b: time_s, bound. One vectorised evaluation."""
    return grid(cfg, gpu, precision, "prefill", [batch], prompts, settings)




def breakdown(cfg, gpu: GPU, precision: Precision, phase: str, batch: int, tokens: int,
              settings: Settings = Settings()) -> pd.DataFrame:
    """Share of FLOPs against share of roofline time by operator class (Ivanov et al. 2021, Table 1):
    tensor contraction, normalization (norms and softmax), element-wise.
    Columns: op_class, flops, time_s, flops_share, time_share (fractions)."""
    check_count("batch", batch)
    check_count("tokens", tokens)
    if phase == "decode":
        require_decoder(cfg)
    ops = pd.DataFrame(PhaseCost(phase_records(cfg, precision, phase, batch, tokens, settings), gpu, precision,
                                 phase, "roofline").rows())
    contraction = ops["role"].isin(RECURRENT_CONTRACTIONS)
    ops["op_class"] = ops["op_class"].map(IVANOV_CLASSES)
    ops.loc[contraction, "op_class"] = "tensor contraction"
    g = ops.groupby("op_class", sort=False, as_index=False)[["flops", "time_s"]].sum()
    g["flops_share"] = g.flops / g.flops.sum()
    g["time_share"] = g.time_s / g.time_s.sum()
    order = {"tensor contraction": 0, "normalization": 1, "element-wise": 2}
    return g.sort_values("op_class", key=lambda c: c.map(order)).reset_index(drop=True)


def class_formulas(cfg: ArchConfig, precision: Precision, settings: Settings) -> dict:
    """{(phase, op_class): FLOPs formula of the whole class}, for hover text."""
    from lmcost.cost.formulas import show, symbolic_ops

    out = {}
    for phase in ("prefill", "decode"):
        sums = {}
        for op in symbolic_ops(cfg, phase, precision, settings.kernel, settings.mla_for(phase), settings.logits):
            sums[op.op_class.value] = sums.get(op.op_class.value, 0) + op.flops * op.count
        out.update({(phase, k): show(v) for k, v in sums.items()})
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class RooflineRequest:
    """One ``lmcost roofline`` figure: ``model`` (a shipped name, a path or a loaded ArchConfig) on each GPU
    of ``gpu`` (names, paths or GPUs: one roof each), its operator classes at each of ``batches`` and the
    one context of ``contexts`` (tokens: the prefill's prompt and the decode step's context); ``phases``:
    prefill and/or decode; ``dtype`` ... ``kv_dtype``: as :func:`lmcost.apps.setup.resolve_precision`;
    ``attention``: flash or naive; ``output``: an HTML file to write the figure to."""

    model: str | ArchConfig
    gpu: tuple[str | GPU, ...] = ("h100",)
    batches: tuple[int, ...] = (1, 8, 64)
    contexts: tuple[int, ...] = (2048,)
    phases: tuple[str, ...] = ("prefill", "decode")
    dtype: str = "auto"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    attention: str = "flash"
    output: Path | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Roofline:
    """What :func:`run_roofline` found: the model, the GPUs, the precision, the context, the points
    (:func:`roofline_points`), each GPU's critical batch by name (:func:`critical_batch`; None: never up
    to 2^20) and the figure's path if one was written."""

    cfg: ArchConfig
    gpus: list[GPU]
    precision: Precision
    context: int
    points: pd.DataFrame
    critical: dict[str, int | None]
    figure: Path | None


def run_roofline(request: RooflineRequest, say: Say = quiet, progress=None) -> Roofline:
    """Load what ``request`` names, cost its points and critical batches, and write its figure when
    ``request.output`` is set. ``progress``: as :func:`roofline_points`.

    A GPU given twice (by name) or a batch given twice is drawn once, in the order first given.
    Raises: LmcostError for an unknown model, GPU or dtype, a dtype one of the GPUs has no peak for, more
    than one context, and the errors of :func:`roofline_points`.
    """
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    # A GPU (by its name: h100 and h100-sxm are one) or batch given twice is drawn once, in the order
    # first given, as plan searches a GPU named twice once and kv compares a variant given twice once.
    loaded = [g if isinstance(g, GPU) else load_gpu(g) for g in r.gpu]
    gpus = list({g.name: g for g in loaded}.values())
    batches = list(dict.fromkeys(r.batches))
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, gpus, say)
    for g in gpus:  # every roof has the dtype's peak, before any point is costed
        g.peak_flops(precision.activations)
    t = single_context(list(r.contexts))
    settings = Settings(kernel=r.attention)
    points = roofline_points(cfg, gpus, batches, t, precision, settings, r.phases, progress)
    crit = {g.name: critical_batch(cfg, g, precision, t, settings) for g in gpus}
    figure = None
    if r.output is not None:
        from lmcost.output.plots import roofline_figure, write_html

        fig = roofline_figure(points, gpus, precision.activations,
                              f"{cfg.name}: roofline at context {t} ({precision.activations})",
                              class_formulas(cfg, precision, settings))
        figure = write_html(fig, r.output)
    return Roofline(cfg=cfg, gpus=gpus, precision=precision, context=t, points=points, critical=crit, figure=figure)


@dataclass(frozen=True, kw_only=True, slots=True)
class BreakdownRequest:
    """One ``lmcost breakdown``: the shares of FLOPs and time by operator class (:func:`breakdown`) of
    ``model`` (a shipped name, a path or a loaded ArchConfig) on ``gpu`` (a name, a path or a GPU) in
    ``phase`` (train, prefill or decode) at ``batch`` sequences of ``seq`` tokens (decode: the context);
    ``dtype``: as :func:`lmcost.apps.setup.resolve_precision`; ``attention``: flash or naive; ``layers``:
    keep this many blocks (0: all). ``device``: also measure the shares there (the reference decoder, in
    ``run_dtype``, ``repeats`` times; None: predict only)."""

    model: str | ArchConfig
    gpu: str | GPU = "h100"
    phase: str = "train"
    batch: int = 8
    seq: int = 512
    dtype: str = "auto"
    attention: str = "naive"
    layers: int = 0
    device: str | None = None
    run_dtype: str = "fp32"
    repeats: int = 3


@dataclass(frozen=True, kw_only=True, slots=True)
class Breakdown:
    """What :func:`run_breakdown` found: the model as costed (truncated to ``layers``), the GPU, the
    precision, and the table (columns of :func:`breakdown`, and the measured ones of
    :func:`lmcost.profiling.breakdown.measured_shares` when a device was measured)."""

    cfg: ArchConfig
    gpu: GPU
    precision: Precision
    table: pd.DataFrame


#: The order of a breakdown's rows, predicted and measured.
IVANOV_ORDER = {"tensor contraction": 0, "normalization": 1, "element-wise": 2, "other": 3}


def run_breakdown(request: BreakdownRequest, say: Say = quiet, measure=None) -> Breakdown:
    """Load what ``request`` names, predict its shares (:func:`breakdown`) and, with ``request.device``,
    merge in the measured ones: ``measure(cfg, request)`` returns them
    (:func:`lmcost.profiling.breakdown.measured_for`, passed in: measuring needs torch, which only
    :mod:`lmcost.profiling` imports).

    Raises: LmcostError for an unknown model, GPU or dtype, ``repeats``, ``seq`` or ``batch`` out of
    range, ``seq`` past a learned position table, a decode of a model without a decoder, a device
    without ``measure``, and the errors of ``measure``.
    """
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.config import layers_note, truncate
    from lmcost.model.loading import load_config

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    hw = r.gpu if isinstance(r.gpu, GPU) else load_gpu(r.gpu)
    precision = resolve_precision(r.dtype, None, None, [hw], say)
    check_count("breakdown.repeats", r.repeats)
    note = layers_note(cfg, r.layers)
    if note:
        say(note)
    cfg = truncate(cfg, r.layers) if r.layers else cfg
    check_positions(cfg, r.seq, "seq")
    check_count("seq", r.seq)
    df = breakdown(cfg, hw, precision, r.phase, r.batch, r.seq, Settings(kernel=r.attention))
    if r.device is not None:
        if measure is None:
            raise LmcostError("device", "measuring runs the reference decoder, and no `measure` was given",
                              "pass measure=lmcost.profiling.breakdown.measured_for")
        measured = measure(cfg, r)
        df = df.merge(measured, on="op_class", how="outer").sort_values("op_class", key=lambda c: c.map(IVANOV_ORDER))
    return Breakdown(cfg=cfg, gpu=hw, precision=precision, table=df)
