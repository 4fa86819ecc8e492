"""``lmcost fit``: the efficiency model (or, with ``--collectives``, the collective model) fitted on measured times."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from lmcost.output import render
from lmcost.basics.errors import LmcostError
from lmcost.cli.app import emit, err, machine_output, out, require_extra, status_line, user_errors


@user_errors
@machine_output
def fit(
    table: Annotated[Optional[str], typer.Option("--table", help="CSV of measured kernel times (default: the shipped public table, lmcost/data/measurements/public-kernels.csv).")] = None,
    gpus: Annotated[Optional[list[str]], typer.Option("--gpu", help="GPU whose efficiency block to fit (repeatable; default: every A100, H100 and H200 file whose family has rows in the table).")] = None,
    trace_paths: Annotated[Optional[list[str]], typer.Option("--trace", help="An lmcost profile trace to fit on (repeatable; each trace is one source; needs torch and --gpu, the YAML of the device it ran on). Without --table, the traces alone are the fitting set.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Write <gpu>.yaml (the shipped file with the fitted block), fit-report.json and, for a --table of your own, a copy of it (fitting-set.csv) here.")] = None,
    collectives: Annotated[bool, typer.Option("--collectives", help="Fit the collective-communication model instead, on lmcost/data/measurements/collective-measurements.csv (or --table); --out writes every cluster YAML with its fitted block.")] = False,
):
    """Fit the efficiency model on measured kernel times; report its leave-one-source-out error and bands."""
    if collectives:
        return _fit_collectives(table, out_dir)

    from lmcost.basics.files import check_folder, write_texts
    from lmcost.calibration.efficiency_fit import block_dict, block_for, edge_figures, fit as run_fit, replace_block, report_rows, source_rows, table_digest
    from lmcost.hardware.gpu import gpu_from_text, load_gpu
    from lmcost.calibration.measurements import FAMILIES, FITTED, load_table, public_table

    if table is not None and not table.strip():
        raise LmcostError("--table", "empty", "give a CSV of kernel timings, or drop --table for the shipped one")
    if out_dir is not None and not out_dir.strip():
        raise LmcostError("--out", "empty", "give a folder, e.g. --out fitted/")
    path = Path(table) if table is not None else public_table()
    out_dir = Path(out_dir) if out_dir is not None else None
    ms, skipped = load_table(path) if table is not None or not trace_paths else ([], [])
    if trace_paths:
        require_extra("torch", "profile", "fit --trace")
        if not gpus or len(gpus) != 1:
            raise LmcostError("--gpu", "a trace needs the one GPU it ran on",
                              "give --gpu once: the shipped name or the YAML (lmcost calibrate writes one for a local device)")
        from lmcost.profiling.measured import trace_measurements

        ran_on, other = load_gpu(gpus[0]), 0
        for t in trace_paths:
            rows_, n = trace_measurements(t, ran_on)
            ms += rows_
            other += n
        if other:
            skipped.append((0, f"{other} trace operator row(s) of kinds the model does not fit (lookups, routers)"))
        path = Path(trace_paths[0]) if table is None else path
    if not ms:
        raise LmcostError(str(path), "no row can be fitted on", "give rows of the ops lmcost models (see lmcost/data/measurements/)")
    families = {m.family for m in ms}
    fittable = [n for n in FITTED if FAMILIES[n] in families]
    if gpus:
        hws = list({hw.name: hw for hw in (load_gpu(g) for g in gpus)}.values())  # aliases of one GPU once
        sources_of = {load_gpu(g).name: _gpu_file(g) for g in gpus}
    elif fittable:
        hws = [load_gpu(n) for n in fittable]
        sources_of = {n: _gpu_file(n) for n in fittable}
    else:
        raise LmcostError("--table", f"no row is of a GPU family lmcost fits blocks for ({', '.join(sorted(set(FAMILIES[n] for n in FITTED)))})",
                          "add rows measured on an A100, H100 or H200, or give --gpu a GPU whose rows the table has")
    for hw in hws:
        if hw.efficiency is None:
            raise LmcostError("--gpu", f"{hw.name} has no efficiency block to take its SM count from",
                              "add efficiency.gemm.sm_count (with its source) to its YAML, then fit")
        if FAMILIES.get(hw.name, hw.name) not in families:
            have = ", ".join(fittable) or "none (its rows are of no fitted family)"
            raise LmcostError("--gpu", f"the table has no rows of {hw.name}'s family", f"use one of: {have}")
    outputs = []
    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            raise LmcostError("--out", f"{out_dir} is a file", "give a folder")
        check_folder(out_dir.parent if not out_dir.exists() else out_dir, "--out", "give a folder inside a writable one")
        outputs = [f"{hw.name}.yaml" for hw in hws] + ["fit-report.json"]
        if table is not None and out_dir.resolve() != path.parent.resolve():
            outputs.append("fitting-set.csv")
        for name in outputs:  # nothing is half-written: every target checked before the first write
            if (out_dir / name).is_dir():
                raise LmcostError("--out", f"{out_dir / name} is a folder", "remove it or give another --out")
    with status_line("fitting") as status:
        def progress(done, total):
            if status:
                status.update(f"fitting: leave-one-source-out {done}/{total}")
        report = run_fit(ms, skipped, progress)
        blocks = {hw.name: block_for(report, hw) for hw in hws}
    rows = report_rows(report)
    digest = table_digest(path)
    if out_dir is not None:
        texts = {}
        for hw in hws:
            src = sources_of[hw.name]
            texts[f"{hw.name}.yaml"] = replace_block(src.read_text(), block_dict(blocks[hw.name], hw, path.name, digest, report))
            gpu_from_text(texts[f"{hw.name}.yaml"], src.name)
        texts["fit-report.json"] = render.to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(ms), rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            classes=rows, by_source=source_rows(report))) + "\n"
        if len(outputs) > len(texts):
            texts[outputs[-1]] = path.read_text(encoding="utf-8-sig")
        write_texts(out_dir, {name: texts[name] for name in outputs}, "--out")
    if emit(rows):
        return
    t = Table(title=f"efficiency fit on {path.name}: {len(ms)} rows, leave-one-source-out")
    for c in ("class", "rows", "sources", "median |error|", "named kernel", "band (5-95%)", "held-out in band"):
        t.add_column(c, justify="left" if c == "class" else "right")
    for r in rows:
        if not r["rows"]:
            t.add_row(r["op_class"], "0", "0", "unconstrained", "", "", "")
            continue
        cov = "" if r["band_coverage"] is None else f"{r['band_coverage']:.0%}"
        t.add_row(r["op_class"], str(r["rows"]), str(r["sources"]), f"{r['median_abs_error']:.0%}",
                  f"{r['median_abs_error_named']:.0%}", f"{r['band_low']:.2f}-{r['band_high']:.2f}", cov)
    out.print(t)
    if skipped:
        err.print(f"left out {len(skipped)} row{'s' if len(skipped) != 1 else ''}: " + "; ".join(sorted({w for _, w in skipped})), markup=False,
                  highlight=False, soft_wrap=True)
    edges = sorted({f for b in blocks.values() if b is not None for f in edge_figures(b)})
    if edges:
        err.print(f"note: {len(edges)} fitted figure(s) sit on an edge of the searched range ({', '.join(edges[:6])}"
                  f"{', ...' if len(edges) > 6 else ''}): check that the rows' device, shapes and times are right",
                  markup=False, highlight=False, soft_wrap=True)
    if len({m.source for m in ms}) == 1:
        err.print("note: the table has one source: leaving it out leaves nothing to fit on, so its error above is "
                  "that of the roofline; add rows of other sources to measure the fit's", markup=False, highlight=False,
                  soft_wrap=True)
    if out_dir is not None:
        err.print(f"wrote {', '.join(outputs)} to {out_dir}", markup=False, highlight=False, soft_wrap=True)


def _gpu_file(name: str) -> Path:
    """The YAML of a GPU, shipped or a path (its text is kept when a fitted block replaces its efficiency)."""
    from lmcost.basics import shipped as resources
    if Path(name).suffix in (".yaml", ".yml") and Path(name).is_file():
        return Path(name)
    found = resources.find("gpus", name)
    if found is None:
        raise LmcostError("--gpu", f"{name} is not a shipped GPU", "fit a shipped GPU (lmcost gpus) or a GPU YAML")
    return found


def _fit_collectives(table: Optional[str], out_dir: Optional[str]) -> None:
    """``lmcost fit --collectives``: fit the collective model, print its leave-one-source-out error, and
    with --out write every shipped cluster's YAML with its fitted block and collective-fit-report.json."""
    from lmcost.hardware.cluster import cluster_from_text, list_clusters
    from lmcost.calibration.collective_fit import block_for, cluster_file, load_rows, public_table, replace_block, run
    from lmcost.basics.files import check_folder, write_texts
    from lmcost.calibration.efficiency_fit import table_digest

    if table is not None and not table.strip():
        raise LmcostError("--table", "empty", "give a CSV of collective timings, or drop --table for the shipped one")
    path = Path(table) if table is not None else public_table()
    if not path.is_file():
        raise LmcostError("--table", f"{path} is not a file", "give a CSV of collective timings")
    rows, skipped = load_rows(path)
    if not rows:
        raise LmcostError(str(path), "no row can be fitted on", "give rows in the columns of lmcost/data/measurements/collective-measurements.csv")
    with status_line("fitting collectives"):
        report = run(rows, skipped)
    digest = table_digest(path)
    errs = report.errors()
    if out_dir is not None:
        if not out_dir.strip():
            raise LmcostError("--out", "empty", "give a folder, e.g. --out fitted/")
        folder = Path(out_dir)
        if folder.exists() and not folder.is_dir():
            raise LmcostError("--out", f"{folder} is a file", "give a folder")
        check_folder(folder.parent if not folder.exists() else folder, "--out", "give a folder inside a writable one")
        texts = {}
        for c in list_clusters():
            text = replace_block(cluster_file(c.name).read_text(), block_for(c, report, path.name, digest), path.name, digest)
            cluster_from_text(text, f"{c.name}.yaml")
            texts[f"{c.name}.yaml"] = text
        texts["collective-fit-report.json"] = render.to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(rows), rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            errors=errs, by_source=report.by_source(),
            bands=dict(latency=report.band("latency"), bandwidth=report.band("bandwidth")))) + "\n"
        write_texts(folder, texts, "--out")
    if emit(errs):
        return
    t = Table(title=f"collective fit on {path.name}: {len(rows)} rows, leave-one-source-out")
    for col in ("device", "regime", "rows", "sources", "median |error|", "worst |error| (row)"):
        t.add_column(col, justify="left" if col in ("device", "regime") else "right")
    for e in errs:
        t.add_row(e["device"], e["regime"], str(e["rows"]), str(e["sources"]), f"{e['median_abs_error']:.0%}",
                  f"{e['worst_abs_error']:.0%} ({e['worst_row']})")
    out.print(t)
    if skipped:
        err.print(f"left out {len(skipped)} row(s): " + "; ".join(sorted({w for _, w in skipped})), markup=False,
                  highlight=False, soft_wrap=True)
    if out_dir is not None:
        err.print(f"wrote the cluster YAMLs and collective-fit-report.json to {out_dir}", markup=False, highlight=False, soft_wrap=True)
