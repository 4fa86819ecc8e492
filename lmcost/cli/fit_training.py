"""``lmcost fit --training``: the system figures fitted on published training runs, their leave-one-source-out
error (:mod:`lmcost.apps.train_system_fit`)."""

from lmcost.cli.app import emit, err, out, status_line


def fit_training(table: str | None, sources: tuple[str, ...], rows: str | tuple, out_dir: str | None = None) -> None:
    """Fit, then print (``--json``: the whole result) the fitted figures, the leave-one-source-out, in-sample
    and prior summaries, and the rows left out with why."""
    from lmcost.apps.train_fit import TrainingFitRequest
    from lmcost.apps.train_system_fit import fit_training as run
    from lmcost.output.train_fit_tables import figures_table, left_out_lines, training_fit_tables

    request = TrainingFitRequest(table=table, sources=sources, rows=rows)
    with status_line("fitting on published training runs") as status:
        def progress(done, total):
            if status:
                status.update(f"fitting on published training runs: lmcost train on run {done}/{total} (9 figure trials)")
        res = run(request, progress=progress, out_dir=out_dir)
    if emit(res):
        return
    out.print(figures_table(res["fit"]))
    for t in training_fit_tables(res, "leave-one-source-out"):
        out.print(t)
    for name in ("in_sample", "prior"):
        out.print(training_fit_tables(dict(res, summary=res[name]), name.replace("_", "-"))[0])
    lines = left_out_lines(res)
    if lines:
        err.print(f"left out {len(res['skipped']) + len(res['refused'])} row(s):\n" + "\n".join(lines), markup=False,
                  highlight=False, soft_wrap=True)
    if res["written"]:
        err.print(f"wrote {', '.join(res['written'])} to {out_dir}", markup=False, highlight=False, soft_wrap=True)
