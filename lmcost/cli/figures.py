"""``lmcost roofline`` and ``lmcost report``: the roofline figure and the report folder."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import tables
from lmcost.cli.app import emit, err, machine_output, out, output_mode, progress_over, require_extra, say, status_line, user_errors
from lmcost.cli.options import AttnKernelOpt, BatchOpt, ClusterOpt, DpOpt, DtypeOpt, EngineOpt, EpOpt, GenOpt, GpuOpt, Kernel, KernelOpt, KvDtypeOpt, ModelArg, PhaseSel, PpOpt, PromptOpt, RuntimeOpt, TpOpt, WDtypeOpt, parse_ints, parse_tokens


@user_errors
@machine_output
def roofline(
    model: ModelArg,
    gpu: Annotated[list[str], typer.Option("--gpu", help="GPU name, alias or YAML; repeat for several roofs.")] = ["h100"],
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated (decode points move right as b grows).")] = "1,8,64",
    context: Annotated[str, typer.Option(help="Prompt length of prefill and context of the decode step.")] = "2048",
    phase: Annotated[PhaseSel, typer.Option(help="Which phases to draw.")] = PhaseSel.both,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the figure as offline HTML here.")] = None,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
):
    """Roofline of every operator class: intensity against attainable FLOP/s, and the critical batch."""
    from lmcost.apps.roofline import RooflineRequest, run_roofline

    request = RooflineRequest(model=model, gpu=tuple(gpu), batches=tuple(parse_ints(batch, "--batch")),
                              contexts=tuple(parse_tokens(context, "--context")),
                              phases=("prefill", "decode") if phase is PhaseSel.both else (phase.value,),
                              dtype=dtype, weight_dtype=weight_dtype, kv_dtype=kv_dtype, attention=attention.value,
                              output=output)
    pairs = len(set(request.gpu)) * len(set(request.batches))
    # progress_over, not rich's track: off a terminal track leaves a blank line on stderr (before an error too)
    progress = (lambda it: progress_over(it, "estimating")) if pairs > 4 else None
    res = run_roofline(request, say, progress)
    gpus, precision, points, crit, t = res.gpus, res.precision, res.points, res.critical, res.context
    if res.figure is not None:
        err.print(f"wrote {res.figure}", markup=False, highlight=False)
    data = dict(critical_batch=crit, ridge_flops_per_byte={g.name: g.ridge_point(precision.activations) for g in gpus},
                points=points.to_dict("records"))
    if emit(data["points"] if output_mode() == "csv" else data):
        return
    for g in gpus:
        c = crit[g.name]
        out.print(f"{escape(g.name)}: ridge point {g.ridge_point(precision.activations):.1f} FLOPs/byte; decode GEMMs at "
                  f"context {t} turn compute-bound at batch {c if c else 'never (up to 2^20)'}")
    out.print(tables.roofline_table(points))


@user_errors
def report(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    batch: BatchOpt = 1,
    prompt: PromptOpt = 512,
    gen: GenOpt = 256,
    output: Annotated[Path, typer.Option("-o", "--output", help="Report folder (replaced as a whole).")] = Path("report"),
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    engine: EngineOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    cluster: ClusterOpt = None,
):
    """Write a report folder: index.html (figures and tables, opens offline), summary.json, ops.csv.
    With --tp/--pp/--ep/--dp: one GPU's share of the layout, its communication in every table and figure."""
    require_extra("plotly", "plot", "report")
    with status_line(f"writing the report of {model} on {gpu}"):  # plotly's import counts too (about 1 s)
        from lmcost.apps.report import ReportRequest, run_report

        request = ReportRequest(model=model, gpu=gpu, batch=batch, prompt=prompt, gen=gen, out_dir=output,
                                dtype=dtype, weight_dtype=weight_dtype, kv_dtype=kv_dtype, attention=attention.value,
                                attention_kernel=kernel, runtime=runtime, engine=engine, tp=tp, pp=pp, ep=ep, dp=dp,
                                cluster=cluster)
        path = run_report(request, say)
    err.print(f"wrote {path}/: index.html, summary.json, ops.csv, roofline_points.csv", markup=False, highlight=False)
