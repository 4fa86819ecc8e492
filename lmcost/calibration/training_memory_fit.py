"""The memory half of ``lmcost fit --training``: the allocator and device figures of
:class:`lmcost.cost.train_memory.MemoryFigures` fitted on the published runs' memory rows, leave-one-source-out.

What is fitted, and which rows inform it (every other memory figure stays the cited prior of MemoryFigures):

- ``fragmentation`` (one figure: torch's caching allocator is the same under every framework): reserved =
  allocated rounded to 2 MiB segments + fragmentation x (allocated - model states). Only rows whose published
  figure holds the allocator's cache inform it: ``unstated`` (scored as reserved) and ``nvidia-smi`` rows;
  ``allocated``/``active`` rows do not move it. Bounds 0-1 (the cache cannot hold more than the transient
  bytes again: GMLake, Guo et al. 2024, measure up to ~30% of reserved, i.e. ~40% of the rest).
- ``context_bytes`` per GPU generation (``context_<generation>``): only ``nvidia-smi`` rows see the CUDA
  context, so a generation is fitted only where the set has nvidia-smi rows on it (ampere: BigScience's BLOOM
  search; hopper: PEFT's Llama 2 70B); the others keep the prior. Bounds 256 MiB-2 GiB (the fitting set's
  notes: 0.5-1.5 GB).

Separable: none of these figures changes what a step allocates, so each row's step is costed once (the
caller's ``measure``: allocated, model states, NCCL buffers, usable bytes) and every trial recombines them
(:func:`lmcost.cost.train_memory.reserved_bytes`), vectorised over a grid.

Objective: mean |ln(predicted/published)| per source (:func:`group`: a publisher), the sources weighted equally; the out-of-memory rows
and their neighbours (same source, model and GPU, a smaller micro-batch or more sharding, that ran) as one
more group, a hinge on the wrong side of the device's capacity (ln of how far); a weak pull to the priors
(``PULL`` x ((x - prior)/scale)^2). Coordinate descent over grids, as :mod:`lmcost.calibration.collective_fit`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.cost.train_memory import MemoryFigures, MiB, generation, reserved_bytes

#: Prior of each fitted figure (MemoryFigures' cited defaults) and the scale of its pull.
PRIORS = {"fragmentation": MemoryFigures().fragmentation,
          **{f"context_{g}": v for g, v in MemoryFigures().context_bytes.items() if g != "default"}}
SCALES = {"fragmentation": 0.30, "context": 512 * MiB}
PULL = 0.01
GRIDS = {"fragmentation": np.round(np.linspace(0.0, 1.0, 201), 3),
         "context": np.arange(256, 2048 + 1, 16, dtype=float) * MiB}
#: Published kinds each figure is seen in.
SEES_CACHE = ("unstated", "nvidia-smi")

Measure = Callable[[object], dict]


@dataclass(frozen=True)
class Part:
    """One row's step costed once: what the recombination needs (bytes)."""

    row: object  # RunRow
    allocated: float
    states: float
    nccl: float
    usable: float
    gen: str
    segment: float
    oom: bool
    neighbour_of: tuple = ()


def group(source: str) -> str:
    """The publisher a source belongs to (its first word: the repository), the unit each weighs as and each
    leave-one-out leaves: BigScience's chronicle sections are one source, so are torchtune's two tables."""
    return source.split()[0]


def neighbours(rows) -> dict[int, tuple[int, ...]]:
    """Row number -> the OOM rows it stands beside: resolvable rows that ran (not OOM) with the same source,
    model, GPU, recompute and adapters, a micro-batch no larger and no less sharding (GPUs, TP, PP, ZeRO stage),
    differing in at least one."""
    ooms = [r for r in rows if r.metric_class == "oom" and r.skip is None]
    out: dict = defaultdict(tuple)
    same = ("source", "arch", "gpu", "recompute", "lora_rank", "qlora", "cp", "ep")
    size = ("gpus", "tp", "pp", "zero")
    for r in rows:
        if r.skip is not None or r.metric_class == "oom":
            continue
        for o in ooms:
            if any(getattr(r, k) != getattr(o, k) for k in same):
                continue
            if r.micro_batch <= o.micro_batch and all(getattr(r, k) >= getattr(o, k) for k in size) and \
                    (r.micro_batch, *[getattr(r, k) for k in size]) != (o.micro_batch, *[getattr(o, k) for k in size]):
                out[r.row] += (o.row,)
    return dict(out)


def prepare(rows, measure: Measure, progress=None) -> list[Part]:
    """Each memory row, OOM row and OOM neighbour costed once by ``measure(row)`` (a step's ``memory`` dict:
    allocated_bytes, model_states_bytes, nccl_bytes, usable_bytes); a row ``measure`` refuses (LmcostError)
    is left out. Returns the parts in row order."""
    near = neighbours(rows)
    todo = [r for r in rows if r.skip is None and (r.metric_class in ("memory", "oom") or r.row in near)]
    seen, parts = set(), []
    for i, r in enumerate(todo):
        try:
            m = measure(r)
        except LmcostError:
            m = None
        if m is not None and r.row not in seen:
            seen.add(r.row)
            parts.append(Part(row=r, allocated=float(m["allocated_bytes"]), states=float(m["model_states_bytes"]),
                              nccl=float(m["nccl_bytes"]), usable=float(m["usable_bytes"]), gen=generation(r.gpu),
                              segment=float(MemoryFigures().segment_bytes), oom=r.metric_class == "oom",
                              neighbour_of=near.get(r.row, ())))
        if progress:
            progress(i + 1, len(todo))
    return parts


def figures_of(f: dict) -> dict:
    """The fitted figures as MemoryFigures fields: ``fragmentation`` (its prior where no row informed it) and a
    ``context_bytes`` dict."""
    ctx = dict(MemoryFigures().context_bytes)
    ctx.update({k.removeprefix("context_"): v for k, v in f.items() if k.startswith("context_")})
    return dict(fragmentation=f.get("fragmentation", PRIORS["fragmentation"]), context_bytes=ctx)


def predict(p: Part, f: dict):
    """(predicted figure for the row's kind, device bytes) under figures ``f`` (values may be arrays)."""
    reserved = reserved_bytes(p.allocated, p.states, f.get("fragmentation", PRIORS["fragmentation"]), p.segment)
    device = reserved + f.get(f"context_{p.gen}", PRIORS.get(f"context_{p.gen}", 512 * MiB)) + p.nccl
    kind = p.row.memory_kind
    value = p.allocated if kind in ("allocated", "active") else reserved if kind == "unstated" else device
    return value, device


def _loss(parts: list[Part], f: dict):
    by_source: dict = defaultdict(list)
    oom = []
    for p in parts:
        value, device = predict(p, f)
        if p.row.metric_class == "memory":
            by_source[group(p.row.source)].append(np.abs(np.log(value / p.row.published)))
        if p.oom:
            oom.append(np.maximum(0.0, np.log(p.usable / device)))
        elif p.neighbour_of:
            oom.append(np.maximum(0.0, np.log(device / p.usable)))
    groups = [sum(v) / len(v) for v in by_source.values()] + ([sum(oom) / len(oom)] if oom else [])
    pull = sum(((f[k] - PRIORS[k]) / SCALES[k.split("_")[0]]) ** 2 for k in f)
    return sum(groups) / max(1, len(groups)) + PULL * pull


def informed(parts: list[Part]) -> dict[str, list[int]]:
    """Figure -> the rows that inform it (module docstring)."""
    out = {}
    for p in parts:
        if p.row.memory_kind in SEES_CACHE or p.oom or p.neighbour_of:
            out.setdefault("fragmentation", []).append(p.row.row)
    for p in parts:
        if p.row.memory_kind == "nvidia-smi" or p.oom or p.neighbour_of:
            out.setdefault(f"context_{p.gen}", []).append(p.row.row)
    return out


def fit_parts(parts: list[Part], rounds: int = 10) -> dict:
    """Coordinate descent over :data:`GRIDS` on the figures ``parts`` inform; the rest keep their prior.
    Returns: dict(figures (name -> value), rows (name -> rows that informed it), loss)."""
    rows_of = informed(parts)
    keys = [k for k in rows_of if k in PRIORS]
    f = {k: float(PRIORS[k]) for k in keys}
    for _ in range(rounds):
        for k in keys:
            grid = GRIDS[k.split("_")[0]]
            loss = np.broadcast_to(_loss(parts, {**f, k: grid}), grid.shape)
            if float(_loss(parts, f)) - float(loss.min()) > 1e-6:
                f[k] = float(grid[int(np.argmin(loss))])
    return dict(figures=f, rows={k: rows_of[k] for k in keys}, loss=float(_loss(parts, f)))


def score(p: Part, f: dict) -> dict:
    """A row's result under ``f``, in the shape of :func:`lmcost.apps.train_fit.score` (memory or oom), with
    ``neighbour_of`` for a row beside an OOM row and its ``fits``."""
    value, device = predict(p, f)
    r = p.row
    out = dict(row=r.row, source=r.source, model=r.model, metric=r.metric, metric_class=r.metric_class, gpu=r.gpu,
               gpus=r.gpus, published=r.published, fits=bool(device <= p.usable), neighbour_of=list(p.neighbour_of))
    if r.metric_class == "memory":
        ratio = float(value) / r.published
        return out | dict(predicted=float(value), ratio=ratio, abs_log=abs(math.log(ratio)), correct=None)
    return out | dict(predicted=None, ratio=None, abs_log=None, correct=not out["fits"] if p.oom else out["fits"])


def fit_memory(rows, measure: Measure, progress=None, parts: list[Part] | None = None) -> dict:
    """Fit the memory figures on ``rows`` (RunRows of :mod:`lmcost.calibration.training_runs`); ``measure``:
    a RunRow -> its step's ``memory`` dict, costed once per row (the apps layer's train_step).

    Returns: dict(figures, rows (figure -> informing rows), loss, memory_figures (MemoryFigures fields),
    results (in-sample, :func:`score` per row)). Raises: nothing beyond ``measure``'s (refusals are skipped)."""
    parts = prepare(rows, measure, progress) if parts is None else parts
    fit = fit_parts(parts)
    return fit | dict(memory_figures=figures_of(fit["figures"]), results=[score(p, fit["figures"]) for p in parts])


def loso_memory(rows, measure: Measure, progress=None, parts: list[Part] | None = None) -> dict:
    """Leave-one-source-out: for each source with memory or OOM rows, fit on the other sources' parts and
    score its rows. Returns: dict(results (every row, scored by the fit without its source), figures
    (source -> the figures fitted without it))."""
    parts = prepare(rows, measure, progress) if parts is None else parts
    results, figures = [], {}
    for source in sorted({group(p.row.source) for p in parts}):
        fit = fit_parts([p for p in parts if group(p.row.source) != source])
        f = {**{k: float(v) for k, v in PRIORS.items()}, **fit["figures"]}
        figures[source] = fit["figures"]
        results += [score(p, f) for p in parts if group(p.row.source) == source]
    return dict(results=sorted(results, key=lambda r: r["row"]), figures=figures)


def oom_summary(results: list[dict]) -> dict:
    """OOM rows predicted not to fit and neighbours predicted to fit, of :func:`score` results."""
    oom = [r for r in results if r["metric_class"] == "oom"]
    near = [r for r in results if r["metric_class"] != "oom" and r["neighbour_of"]]
    return dict(oom_rows=len(oom), oom_predicted_not_to_fit=sum(r["correct"] for r in oom),
                oom_missed=[r["row"] for r in oom if not r["correct"]], neighbours=len(near),
                neighbours_predicted_to_fit=sum(r["fits"] for r in near),
                neighbours_missed=[r["row"] for r in near if not r["fits"]])


def rows_text(rows: list[int]) -> str:
    """Row numbers as ranges: ``1-3,7``."""
    out, run = [], []
    for r in sorted(set(rows)):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def memory_block(fit: dict, table: str, digest: str) -> dict:
    """A framework YAML's ``memory`` block for the fit ``fit`` (:func:`fit_memory`) on ``table`` (sha256
    ``digest``)."""
    rows = fit["rows"]["fragmentation"]
    return dict(fragmentation=round(fit["figures"]["fragmentation"], 3),
                sources=[f"fragmentation: lmcost fit --training on {table} (sha256 {digest}), rows {rows_text(rows)}: "
                         "the allocator's cache beyond allocated, one figure for torch's caching allocator under every "
                         "framework (lmcost.calibration.training_memory_fit)"],
                fit=dict(table=table, sha256=digest, rows=len(rows)))


def replace_memory_block(text: str, block: dict) -> str:
    """A framework YAML's text with its top-level ``memory`` block replaced by ``block`` (placed before
    ``sources:`` when there is none); every other line kept."""
    import yaml

    dumped = yaml.safe_dump({"memory": block}, sort_keys=False, width=1000, allow_unicode=True)
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("memory:")), None)
    if start is None:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("sources:")), len(lines))
        return "".join(lines[:at]) + dumped + "".join(lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    return "".join(lines[:start]) + dumped + "".join(lines[end:])


def replace_context(text: str, context: int, source: str) -> str:
    """A GPU YAML's text with ``context_bytes`` (and its source line) set in its ``training`` block (a block
    added when there is none, before ``efficiency:``); every other line kept."""
    import json

    lines = text.splitlines(keepends=True)
    value = f"  context_bytes: {int(context)}\n"
    src = f"    - {json.dumps(source)}\n"
    start = next((i for i, ln in enumerate(lines) if ln.startswith("training:")), None)
    if start is None:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("efficiency:")), len(lines))
        block = ["training:               # the CUDA context of a training process (lmcost.cost.train_memory)\n",
                 value, "  sources:\n", src]
        return "".join(lines[:at] + block + lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    body = [ln for ln in lines[start + 1:end] if not ln.startswith("  context_bytes:")
            and not ln.startswith('    - "context_bytes')]
    at = next((i for i, ln in enumerate(body) if ln.startswith("  sources:")), None)
    if at is None:
        body += [value, "  sources:\n", src]
    else:
        body = body[:at] + [value] + body[at:at + 1] + [src] + body[at + 1:]
    return "".join(lines[:start + 1] + body + lines[end:])
