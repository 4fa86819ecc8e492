"""``lmcost fit --training``: lmcost train against published training runs (the fitting set of issue 26,
:mod:`lmcost.calibration.training_runs`), row by row as a user would run it, and its error summarised.

:func:`evaluate` costs each resolvable row with a ``predict`` callable (default: :func:`lmcost.apps.train.run_train`
on the row's :class:`~lmcost.apps.train.TrainRequest`), so that a fit can hand it figures to try (a predict that
builds its own request, or replaces fields of the one given) and score them the same way, leaving sources out.

Scores, per row: predicted / published (tokens/s per GPU for throughput; bytes for memory, the prediction's
memory key for the row's kind: see :data:`MEMORY_KEYS`); for an out-of-memory row, whether the prediction
says it does not fit. Summaries (:func:`summarise`): per metric class, per metric and per source, the rows
used, the median ratio, the median |ln ratio|, the share within 10% and 25%, quartiles, min and max. The
throughput class counts one figure per run: a run published as tokens/s, TFLOP/s and MFU (Megatron-Bridge,
AutoModel, fms-fsdp) counts once, its first metric in :data:`~lmcost.calibration.training_runs.THROUGHPUT`'s
order (the per-metric summaries keep them all).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from dataclasses import dataclass
from typing import Callable

from lmcost.apps.train import TrainStep
from lmcost.apps.train_run import TrainRequest, run_train
from lmcost.basics.errors import LmcostError
from lmcost.calibration.training_runs import THROUGHPUT, RunRow, load_runs

Predict = Callable[[TrainRequest], TrainStep]
Progress = Callable[[int, int], None]

#: The prediction's memory keys for each published kind, first present wins: a run's allocator figures
#: (``reserved_bytes``, ``allocated_bytes``) once train reports them, else today's ``total_bytes``.
MEMORY_KEYS = {
    "allocated": ("allocated_bytes", "total_bytes"),
    "active": ("allocated_bytes", "total_bytes"),
    "unstated": ("reserved_bytes", "allocated_bytes", "total_bytes"),
    "nvidia-smi": ("nvidia_smi_bytes", "reserved_bytes", "total_bytes"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingFitRequest:
    """An evaluation: ``table`` a training-runs CSV (None: the shipped one); ``sources``: keep rows whose source
    contains one of these (case-insensitive; empty: all); ``rows``: keep these data row numbers (1 = the line
    after the header), as numbers or as text such as ``1-20,35`` (empty: all)."""

    table: str | None = None
    sources: tuple[str, ...] = ()
    rows: tuple[int, ...] | str = ()


def parse_rows(text: str) -> tuple[int, ...]:
    """Data row numbers from ``1-20,35``. Raises: LmcostError (rows) for anything else."""
    got: list[int] = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if not a.isdigit() or (b and not b.isdigit()) or int(a) < 1 or (b and int(b) < int(a)):
            raise LmcostError("rows", f"{part.strip()!r} is not a row number or a range a-b",
                              "give row numbers from 1 and ranges, comma-separated, e.g. 1-20,35")
        got += range(int(a), int(b or a) + 1)
    return tuple(got)


def check_fit_modes(training: bool, selects: tuple[str, ...], others: tuple[str, ...]) -> None:
    """``lmcost fit``'s modes: ``selects`` (the fields given of ``sources``, ``rows``) choose rows of a
    training-runs table, so need ``training``; ``training`` fits the system figures and takes none of ``others`` (the fields
    given of the efficiency and collective fits: ``targets``, ``traces``, ``collectives``; ``fit.out_dir``
    is where it writes its YAMLs).

    Raises: LmcostError (the first selecting field, or training) for a combination that does not go."""
    if selects and not training:
        raise LmcostError(selects[0], "selects rows of a training-runs table", "add `training`, or drop it")
    others = tuple(o for o in others if o != "fit.out_dir")  # --out: where the fitted YAMLs go
    if training and others:
        raise LmcostError("training", "evaluates lmcost train on training runs; it fits no GPU, trace or collective",
                          f"drop {', '.join(f'`{o}`' for o in others)}")


@functools.lru_cache(maxsize=None)
def _gpu(name: str):
    """The shipped GPU, loaded once per evaluation process."""
    from lmcost.hardware.gpu import load_gpu

    return load_gpu(name)


def request_for(row: RunRow, **extra) -> TrainRequest:
    """The :class:`TrainRequest` of a resolved row: only the fields TrainRequest has (a field another part of
    issue 26 adds, such as ``framework``, is passed when it is there), ``extra`` on top (figures to try).

    Raises: LmcostError as TrainRequest does."""
    have = {f.name for f in dataclasses.fields(TrainRequest)}
    values = dict(model=row.cfg, gpu=_gpu(row.gpu), gpus=row.gpus, seq=row.seq, global_batch=row.global_batch,
                  micro_batch=row.micro_batch, tp=row.tp, pp=row.pp, cp=row.cp, ep=row.ep, sp=row.sp, zero=row.zero,
                  recompute=row.recompute, precision=row.precision, schedule=row.schedule, virtual_stages=row.vp,
                  lora_rank=row.lora_rank, lora_targets=row.lora_targets, qlora=row.qlora,
                  framework=row.framework, shard_group=row.shard_group)
    values.update(extra)
    return TrainRequest(**{k: v for k, v in values.items() if k in have})


def _default_predict(request: TrainRequest) -> TrainStep:
    return run_train(request).step


def score(row: RunRow, step: TrainStep) -> dict:
    """One row's result: predicted and published figures, their ratio and |ln ratio| (throughput, memory), or
    for an OOM row whether the prediction says it does not fit (``correct``)."""
    out = dict(row=row.row, source=row.source, model=row.model, metric=row.metric, metric_class=row.metric_class,
               gpu=row.gpu, gpus=row.gpus, published=row.published, fits=step.fits)
    if row.metric_class == "oom":
        return out | dict(predicted=None, ratio=None, abs_log=None, correct=not step.fits)
    if row.metric_class == "throughput":
        pred = step.tokens_per_s_per_gpu
    else:
        pred = next(float(step.memory[k]) for k in MEMORY_KEYS[row.memory_kind] if k in step.memory)
    ratio = pred / row.published
    return out | dict(predicted=pred, ratio=ratio, abs_log=abs(math.log(ratio)), correct=None)


def _key(row: RunRow) -> tuple:
    """What makes two rows the same run (throughput published several ways)."""
    return (row.source, row.model, row.gpu, row.gpus, row.tp, row.pp, row.cp, row.ep, row.vp, row.zero, row.seq,
            row.global_batch, row.micro_batch, row.kind, row.precision, row.recompute)


def _stats(results: list[dict]) -> dict:
    """Rows, median ratio, median |ln ratio|, share within 10% / 25% (|ratio - 1|), quartiles, min, max."""
    ratios = sorted(r["ratio"] for r in results)
    if not ratios:
        return dict(rows=0)
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return dict(rows=len(ratios), median_ratio=statistics.median(ratios),
                median_abs_log=statistics.median(r["abs_log"] for r in results),
                within_10=sum(abs(x - 1) <= 0.10 for x in ratios) / len(ratios),
                within_25=sum(abs(x - 1) <= 0.25 for x in ratios) / len(ratios),
                q1=q[0], q3=q[2], min=ratios[0], max=ratios[-1])


def summarise(results: list[dict], rows: dict[int, RunRow]) -> dict:
    """Summaries of :func:`score` results (``rows``: the RunRow of each result's row number): per metric class
    (throughput one figure per run, memory, oom), per metric and per source within each class."""
    order = {m: i for i, m in enumerate(THROUGHPUT)}
    first: dict = {}
    for r in sorted((r for r in results if r["metric_class"] == "throughput"), key=lambda r: order[r["metric"]]):
        first.setdefault(_key(rows[r["row"]]), r)
    classes = dict(throughput=list(first.values()),
                   memory=[r for r in results if r["metric_class"] == "memory"])
    out = {}
    for cls, rs in classes.items():
        out[cls] = _stats(rs) | dict(
            by_source={s: _stats([r for r in rs if r["source"] == s]) for s in sorted({r["source"] for r in rs})})
    oom = [r for r in results if r["metric_class"] == "oom"]
    out["oom"] = dict(rows=len(oom), predicted_not_to_fit=sum(r["correct"] for r in oom))
    out["by_metric"] = {m: _stats([r for r in results if r["metric"] == m])
                        for m in sorted({r["metric"] for r in results if r["metric_class"] != "oom"})}
    return out


def evaluate(rows: list[RunRow], predict: Predict | None = None, progress: Progress | None = None) -> dict:
    """lmcost train on every resolvable row of ``rows``: per-row results (:func:`score`), summaries
    (:func:`summarise`), and the rows left out with why: ``skipped`` (the row cannot be costed as published)
    and ``refused`` (lmcost train refused its case: the LmcostError's line).

    ``predict``: a TrainRequest -> TrainStep (default: run_train's step); ``progress(done, total)`` after
    each row. Returns: dict(results, summary, skipped, refused, rows_used)."""
    predict = predict or _default_predict
    todo = [r for r in rows if r.skip is None]
    results, refused = [], []
    for i, row in enumerate(todo):
        try:
            results.append(score(row, predict(request_for(row))))
        except LmcostError as e:
            refused.append(dict(row=row.row, source=row.source, metric=row.metric, why=str(e)))
        if progress:
            progress(i + 1, len(todo))
    by_row = {r.row: r for r in rows}
    skipped = [dict(row=r.row, source=r.source, metric=r.metric, why=r.skip) for r in rows if r.skip is not None]
    return dict(rows_used=len(results), results=results, summary=summarise(results, by_row), skipped=skipped,
                refused=refused)


def select(rows: list[RunRow], request: TrainingFitRequest) -> list[RunRow]:
    """The rows ``request`` keeps (its ``sources`` and ``rows`` filters).

    Raises: LmcostError (rows, sources) for a filter that keeps no row, or an empty one (it would keep all)."""
    if isinstance(request.rows, str) and not request.rows.strip():
        raise LmcostError("rows", "is empty, which would read as every row", "give row numbers, e.g. 1-20,35, or drop it")
    if any(not s.strip() for s in request.sources):
        raise LmcostError("sources", "has an empty text, which every source contains",
                          "give part of a source's name, or drop it")
    wanted = parse_rows(request.rows) if isinstance(request.rows, str) else request.rows
    out = [r for r in rows if not wanted or r.row in wanted]
    if wanted and not out:
        raise LmcostError("rows", f"no data row numbered {', '.join(map(str, wanted))}",
                          f"use row numbers 1-{len(rows)} (1 = the line after the header)")
    if request.sources:
        out = [r for r in out if any(s.lower() in r.source.lower() for s in request.sources)]
        if not out:
            raise LmcostError("sources", f"no row's source contains {', '.join(request.sources)}",
                              "name part of a source as the table's source column writes it")
    return out


def evaluate_training(request: TrainingFitRequest, predict: Predict | None = None,
                      progress: Progress | None = None) -> dict:
    """:func:`evaluate` on the rows of ``request``'s table it selects; adds ``table`` and ``rows_read``.

    Raises: LmcostError (table, rows, sources) for a table that cannot be read or a filter that keeps nothing."""
    rows = select(load_runs(request.table), request)
    out = evaluate(rows, predict, progress)
    return dict(table=request.table or "training-runs.csv (shipped)", rows_read=len(rows)) | out
