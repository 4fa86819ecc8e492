"""``lmcost fit --training``: lmcost train evaluated on published training runs (:mod:`lmcost.apps.train_fit`)."""

from lmcost.basics.errors import LmcostError
from lmcost.cli.app import emit, err, out, status_line


def parse_rows(text: str | None) -> tuple[int, ...]:
    """Data row numbers from ``1-20,35``. Raises: LmcostError (rows) for anything else."""
    if text is None:
        return ()
    got: list[int] = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if not a.isdigit() or (b and not b.isdigit()) or int(a) < 1 or (b and int(b) < int(a)):
            raise LmcostError("rows", f"{part.strip()!r} is not a row number or a range a-b",
                              "give row numbers from 1 and ranges, comma-separated, e.g. 1-20,35")
        got += range(int(a), int(b or a) + 1)
    return tuple(got)


def fit_training(table: str | None, sources: tuple[str, ...], rows: str | None) -> None:
    """Evaluate, then print (``--json``: the whole result) the summaries and the rows left out with why."""
    from lmcost.apps.train_fit import TrainingFitRequest, evaluate_training
    from lmcost.output.train_fit_tables import left_out_lines, training_fit_tables

    request = TrainingFitRequest(table=table, sources=sources, rows=parse_rows(rows))
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
