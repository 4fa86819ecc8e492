"""``lmcost fit``: the efficiency model (or, with ``--collectives``, the collective model) fitted on measured times."""

from typing import Annotated, Optional

import typer

from lmcost.output import tables
from lmcost.cli.app import emit, err, machine_output, out, require_extra, status_line, user_errors


@user_errors
@machine_output
def fit(
    table: Annotated[Optional[str], typer.Option("--table", help="CSV of measured kernel times (default: the shipped public table, lmcost/data/measurements/public-kernels.csv).")] = None,
    gpus: Annotated[Optional[list[str]], typer.Option("--gpu", help="GPU whose efficiency block to fit (repeatable; default: every A100, H100 and H200 file whose family has rows in the table).")] = None,
    trace_paths: Annotated[Optional[list[str]], typer.Option("--trace", help="An lmcost profile trace to fit on (repeatable; each trace is one source; needs torch and --gpu, the YAML of the device it ran on). Without --table, the traces alone are the fitting set.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Write <gpu>.yaml (the shipped file with the fitted block), fit-report.json and, for a --table of your own, a copy of it (fitting-set.csv) here.")] = None,
    collectives: Annotated[bool, typer.Option("--collectives", help="Fit the collective-communication model instead, on lmcost/data/measurements/collective-measurements.csv and the NCCL rows of engine-collectives.csv, with each engine's custom all-reduce on its rows (or on --table alone); --out writes every cluster YAML with its fitted block.")] = False,
    training: Annotated[bool, typer.Option("--training", help="Fit lmcost train's system figures (sustained clock per GPU generation, step efficiency per framework) on published training runs (lmcost/data/measurements/training-runs.csv, or --table): leave-one-source-out, in-sample and prior predicted/published per metric and per source, and the rows left out with why; --out writes the GPU and framework YAMLs with the fitted figures.")] = False,
    sources: Annotated[Optional[list[str]], typer.Option("--source", help="With --training: only rows whose source contains this text (repeatable).")] = None,
    rows: Annotated[Optional[str], typer.Option("--rows", help="With --training: only these data rows (1 = the line after the header), e.g. 1-20,35.")] = None,
    engines: Annotated[bool, typer.Option("--engines", help="Fit the serving engines' kernel profiles (vllm, sglang, trtllm) per GPU on lmcost/data/measurements/engine-kernels.csv (or --table): leave-one-GPU-out and leave-one-engine-out errors and bands per engine and class; --out writes each GPU's YAML with its engines block (and a base block, engines pooled, where the public fit writes none) and engine-fit-report.json.")] = False,
    memory_kernels: Annotated[bool, typer.Option("--memory-kernels", help="Fit the serving engines' norm, SiLU-and-mul and RoPE kernel designs (one thread block per token row; vectorized) on lmcost/data/measurements/gpu-kernels-h200.csv (or --table): overhead, per-row latency and bandwidth fraction per design, leave-one-width-out errors and bands; and the spread of the single fused norm and pointwise kernels around auto's prediction, which widens auto's and torch's bands (held out: leave one implementation out); --out writes engine-memory-kernels.yaml.")] = False,
):
    """Fit the efficiency model on measured kernel times; report its leave-one-source-out error and bands."""
    from lmcost.apps.fit import CollectiveFitRequest, FitRequest, fit as run_fit, fit_collectives

    from lmcost.apps.train_fit import check_fit_modes

    given = dict(targets=gpus, traces=trace_paths, **{"fit.out_dir": out_dir}, collectives=collectives)
    check_fit_modes(training, tuple(k for k, v in dict(sources=sources, rows=rows).items() if v is not None),
                    tuple(k for k, v in given.items() if v))
    if memory_kernels:
        from lmcost.apps.memory_fit import check_memory_mode, fit_memory

        check_memory_mode(tuple(k for k, v in dict(targets=gpus, traces=trace_paths, collectives=collectives,
                                                   training=training, engines=engines).items() if v))
        with status_line("fitting the engines' memory-bound kernel designs"):
            res = fit_memory(table, out_dir)
        if emit(dict(designs=res.rows, stack_spread=res.stack_spread, table=res.table)):
            return
        out.print(tables.memory_fit_table(res.rows, res.table))
        out.print(tables.stack_spread_table(res.stack_spread, res.table))
        if res.out_dir is not None:
            err.print(f"wrote {', '.join(res.written)} to {res.out_dir}", markup=False, highlight=False, soft_wrap=True)
        return
    if engines:
        from lmcost.apps.engine_fit import EngineFitRequest, check_engine_mode, fit_engines

        check_engine_mode(tuple(k for k, v in dict(targets=gpus, traces=trace_paths, collectives=collectives,
                                                   training=training).items() if v))
        with status_line("fitting engine profiles") as status:
            def progress_e(done, total):
                if status:
                    status.update(f"fitting engine profiles: {done}/{total} fits (each profile, then held out by GPU and by engine)")
            res = fit_engines(EngineFitRequest(table=table, out_dir=out_dir), progress_e)
        if emit(dict(classes=res.rows, by_gpu=res.by_gpu, rows_fitted=res.n_rows, rows_left_out=res.left_out)):
            return
        out.print(tables.engine_fit_table(res.rows, res.table, res.n_rows))
        if res.left_out:
            err.print("left out: " + "; ".join(f"{n} row(s): {w}" for w, n in sorted(res.left_out.items())),
                      markup=False, highlight=False, soft_wrap=True)
        if res.out_dir is not None:
            err.print(f"wrote {', '.join(res.written)} to {res.out_dir}", markup=False, highlight=False, soft_wrap=True)
        return
    if training:
        from lmcost.cli.fit_training import fit_training

        fit_training(table, tuple(sources or ()), () if rows is None else rows, out_dir)
        return
    if collectives:
        with status_line("fitting collectives"):
            res = fit_collectives(CollectiveFitRequest(table=table, out_dir=out_dir))
        if emit(res.errors):
            return
        out.print(tables.collective_fit_table(res.errors, res.table, res.n_rows))
        if res.skipped:
            err.print(f"left out {len(res.skipped)} row(s): " + "; ".join(sorted({w for _, w in res.skipped})),
                      markup=False, highlight=False, soft_wrap=True)
        if res.out_dir is not None:
            err.print(f"wrote the cluster YAMLs and collective-fit-report.json to {out_dir}", markup=False,
                      highlight=False, soft_wrap=True)
        return
    read_trace = None
    if trace_paths:
        require_extra("torch", "profile", "fit --trace")
        from lmcost.profiling.measured import trace_measurements as read_trace
    request = FitRequest(table=table, targets=tuple(gpus or ()), traces=tuple(trace_paths or ()), out_dir=out_dir)
    with status_line("fitting") as status:
        def progress(done, total):
            if status:
                status.update(f"fitting: leave-one-source-out {done}/{total}")
        res = run_fit(request, read_trace, progress)
    if emit(res.rows):
        return
    out.print(tables.efficiency_fit_table(res.rows, res.table, res.n_rows))
    skipped, edges = res.skipped, res.edges
    if skipped:
        err.print(f"left out {len(skipped)} row{'s' if len(skipped) != 1 else ''}: " + "; ".join(sorted({w for _, w in skipped})), markup=False,
                  highlight=False, soft_wrap=True)
    if edges:
        err.print(f"note: {len(edges)} fitted figure(s) sit on an edge of the searched range ({', '.join(edges[:6])}"
                  f"{', ...' if len(edges) > 6 else ''}): check that the rows' device, shapes and times are right",
                  markup=False, highlight=False, soft_wrap=True)
    if res.one_source:
        err.print("note: the table has one source: leaving it out leaves nothing to fit on, so its error above is "
                  "that of the roofline; add rows of other sources to measure the fit's", markup=False, highlight=False,
                  soft_wrap=True)
    if res.out_dir is not None:
        err.print(f"wrote {', '.join(res.written)} to {res.out_dir}", markup=False, highlight=False, soft_wrap=True)
