"""``lmcost fit --training``: lmcost train evaluated on published training runs (:mod:`lmcost.apps.train_fit`)."""

from lmcost.cli.app import emit, err, out, status_line


def fit_training(table: str | None, sources: tuple[str, ...], rows: str | tuple) -> None:
    """Evaluate, then print (``--json``: the whole result) the summaries and the rows left out with why."""
    from lmcost.apps.train_fit import TrainingFitRequest, evaluate_training
    from lmcost.output.train_fit_tables import left_out_lines, training_fit_tables

    request = TrainingFitRequest(table=table, sources=sources, rows=rows)
    with status_line("costing published training runs") as status:
        def progress(done, total):
            if status:
                status.update(f"costing published training runs: {done}/{total}")
        res = evaluate_training(request, progress=progress)
    if emit(res):
        return
    for t in training_fit_tables(res):
        out.print(t)
    lines = left_out_lines(res)
    if lines:
        err.print(f"left out {len(res['skipped']) + len(res['refused'])} row(s):\n" + "\n".join(lines), markup=False,
                  highlight=False, soft_wrap=True)
