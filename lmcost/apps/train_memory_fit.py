"""The memory half of ``lmcost fit --training`` (:mod:`lmcost.calibration.training_memory_fit`) run on
lmcost train: each row's step costed once as :func:`lmcost.apps.train_fit.request_for` builds it, then the
allocator and context figures fitted in-sample and leave-one-source-out, summarised as
:func:`lmcost.apps.train_fit.summarise` does (per metric, per source) with the OOM outcomes."""

from __future__ import annotations

from lmcost.apps.train_run import run_train
from lmcost.apps.train_fit import request_for, summarise
from lmcost.calibration.training_memory_fit import PRIORS, fit_memory, loso_memory, oom_summary, prepare, score


def measure(row) -> dict:
    """A row's step ``memory`` dict (bytes), lmcost train as a user would run the row."""
    return run_train(request_for(row)).step.memory


def memory_fit(rows, progress=None) -> dict:
    """The memory fit on ``rows`` (RunRows): dict(fit (figures, rows informing each, memory_figures),
    prior (the cited priors, before the fit), in_sample and loso (each: summary per metric and source as summarise gives, oom (rows predicted right and
    missed), results per row)). Raises: nothing beyond lmcost train's refusals, which leave a row out."""
    parts = prepare(rows, measure, progress)
    by_row = {r.row: r for r in rows}
    fit = fit_memory(rows, measure, parts=parts)
    loso = loso_memory(rows, measure, parts=parts)

    def block(results):
        s = summarise([r for r in results if r["metric_class"] in ("memory", "oom")], by_row)
        return dict(summary=dict(memory=s["memory"], by_metric=s["by_metric"]), oom=oom_summary(results),
                    results=results)
    prior = {k: float(v) for k, v in PRIORS.items()}
    return dict(fit={k: fit[k] for k in ("figures", "rows", "loss", "memory_figures")},
                prior=block([score(p, prior) for p in parts]), in_sample=block(fit["results"]),
                loso=block(loso["results"]), loso_figures=loso["figures"])


#: GPU files that take a fitted context: those the memory rows ran on, and the shipped files of the same
#: generation that carry a training block.
CONTEXT_GPUS = ("a100-40gb", "a100-80gb", "h100-sxm", "h200")


def write_memory_figures(out_dir, fit: dict, table_path) -> list[str]:
    """Write the fitted memory figures (``fit``: :func:`memory_fit`'s ``fit``) into the framework YAMLs
    (``memory`` block) and the GPU YAMLs of :data:`CONTEXT_GPUS` (``training.context_bytes``): as
    ``out_dir``/<name>.yaml (the folder ``lmcost fit --training --out`` writes; a file already there is edited,
    so the system fit's blocks stay), or in place in the shipped lmcost/data/{frameworks,gpus} when ``out_dir``
    is None. Returns the paths written. Raises: LmcostError (table) for a table that cannot be read."""
    from pathlib import Path

    from lmcost.basics import shipped
    from lmcost.calibration.training_runs import TRAINING_TABLE
    from lmcost.calibration import efficiency_fit
    from lmcost.calibration.training_memory_fit import memory_block, replace_context, replace_memory_block, rows_text
    from lmcost.cost.train_memory import generation
    from lmcost.hardware.frameworks import FRAMEWORKS

    table = Path(table_path) if table_path else shipped.folder("measurements") / TRAINING_TABLE  # None: the shipped table
    digest = efficiency_fit.table_digest(table)
    written = []

    def edit(kind, name, change):
        src = shipped.folder(kind) / f"{name}.yaml"
        target = src if out_dir is None else Path(out_dir) / f"{name}.yaml"
        text = change((target if target.exists() else src).read_text())
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        written.append(str(target))

    block = memory_block(fit, table.name, digest)
    for fw in FRAMEWORKS[1:]:
        edit("frameworks", fw, lambda t: replace_memory_block(t, block))
    for gpu in CONTEXT_GPUS:
        key = f"context_{generation(gpu)}"
        if key not in fit["figures"]:
            continue
        src = (f"context_bytes: lmcost fit --training on {table.name} (sha256 {digest}), the {generation(gpu)} rows "
               f"{rows_text(fit['rows'][key])} (nvidia-smi rows and the OOM rows with their neighbours)")
        edit("gpus", gpu, lambda t, v=fit["figures"][key], s=src: replace_context(t, v, s))
    return written


def ship_memory_figures() -> list[str]:
    """Fit on the shipped table and write the figures in place (lmcost/data): what the shipped YAMLs hold,
    rerun after the table or the allocated figure changes. Returns the paths written."""
    from lmcost.basics import shipped
    from lmcost.calibration.training_runs import TRAINING_TABLE, load_runs

    return write_memory_figures(None, memory_fit(load_runs(None))["fit"], shipped.folder("measurements") / TRAINING_TABLE)
