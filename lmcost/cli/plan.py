"""``lmcost plan``: the serving Pareto front over layouts and batches, or (``--train``) the fastest training setup."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli import flags
from lmcost.cli.app import emit, err, machine_output, out, output_mode, say, status_line, user_errors
from lmcost.cli.options import ClusterOpt, DtypeOpt, FuseOpt, KvDtypeOpt, ModelArg, OptimizerOpt, TimeModel, TrainPrecisionOpt, WDtypeOpt, parse_count_of, parse_duration


def _show_train(res, gpus, seq, global_batch, top) -> None:
    """plan --train's output: the fastest training steps that fit (:class:`lmcost.apps.plan.TrainPlan`)."""
    cfg, rows, skipped, model = res.cfg, res.fits, res.skipped, res.time_model
    if emit(dict(model=cfg.name, gpus=gpus, seq=seq, global_batch=global_batch, time_model=model, fits=rows,
                  skipped=[dict(setup=a, reason=flags.said(b)) for a, b in skipped])):
        return
    out.print(tables.train_plan_table(cfg.name, gpus, global_batch, seq, model, rows, len(rows) + len(skipped), top))
    if not rows:
        out.print(f"Nothing fits in memory on {gpus} GPUs at this batch and sequence", markup=False)
    else:
        b = rows[0]
        out.print(f"fastest that fits: {b['gpu']} {b['layout']}, micro-batch {b['micro_batch']}, ZeRO-{b['zero']}, "
                  f"recompute {b['recompute']}: step {render.si(b['step_s'], 's')}, MFU {render.pct(b['mfu'])} (check it: "
                  f"lmcost train {cfg.name} --gpu {b['gpu']} --gpus {gpus} --seq {seq} --global-batch {global_batch} "
                  f"--tp {b['tp']} --pp {b['pp']} --ep {b['ep']}{' --sp' if b['sp'] else ''} --micro-batch {b['micro_batch']} "
                  f"--zero {b['zero']} --recompute {b['recompute']})", markup=False, soft_wrap=True)


@user_errors
@machine_output
def plan(
    model: ModelArg,
    gpu: Annotated[list[str], typer.Option("--gpu", help="GPU type(s) to search (repeat for several).")] = ["h100"],  # noqa: B006
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of each type to spread the model over.")] = 8,
    isl: Annotated[str, typer.Option("--isl", help="Input (prompt) tokens per request; suffixes k, M.")] = "2048",
    osl: Annotated[str, typer.Option("--osl", help="Output (generated) tokens per request; suffixes k, M.")] = "256",
    ttft: Annotated[Optional[str], typer.Option("--ttft", help="TTFT SLO, e.g. 500ms.")] = None,
    tpot: Annotated[Optional[str], typer.Option("--tpot", help="TPOT SLO, e.g. 50ms.")] = None,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest global batch searched.")] = 4096,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: Annotated[Optional[TimeModel], typer.Option("--model", help="roofline (lower bound; the serving default) or calibrated (expected time; the --train default).")] = None,
    fuse: FuseOpt = "default",
    cluster: ClusterOpt = None,
    top: Annotated[int, typer.Option("--top", help="Rows of the Pareto front printed.")] = 15,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the plotly figure as offline HTML here.")] = None,
    train_: Annotated[bool, typer.Option("--train", help="Search training layouts instead: the fastest step that fits.")] = False,
    seq: Annotated[str, typer.Option("--seq", help="With --train: tokens per sequence; suffixes k, M.")] = "4096",
    global_batch: Annotated[int, typer.Option("--global-batch", help="With --train: sequences per step.")] = 64,
    optimizer: OptimizerOpt = "adamw",
    precision_: TrainPrecisionOpt = "bf16-mixed",
):
    """Search parallel layouts x batch sizes on --gpus GPUs: the Pareto front of tokens/s per GPU against
    tokens/s per user, each point's layout, memory per GPU and bound, and the best layout under the SLOs."""
    from lmcost.apps.plan import PlanRequest, run_plan

    slo_ttft = parse_duration(ttft, "--ttft") if ttft else None
    slo_tpot = parse_duration(tpot, "--tpot") if tpot else None
    counts = (dict(seq=parse_count_of(seq, "--seq")) if train_ else
              dict(isl=parse_count_of(isl, "--isl"), osl=parse_count_of(osl, "--osl")))
    request = PlanRequest(model=model, gpu=tuple(gpu), n_gpus=gpus, ttft=slo_ttft, tpot=slo_tpot, max_batch=max_batch,
                          dtype=dtype, weight_dtype=weight_dtype, kv_dtype=kv_dtype, time_model=model_ and model_.value,
                          fusion=fuse, cluster=cluster, top=top, output=output, train=train_, global_batch=global_batch,
                          optimizer=optimizer, precision=precision_, **counts)
    what = f"the training of {model}" if train_ else model
    with status_line(f"planning {what} on {gpus} GPUs") as status:
        res = run_plan(request, say, progress=getattr(status, "update", None) if train_ else None)
    if train_:
        _show_train(res, gpus, request.seq, global_batch, top)
        return
    cfg, result, front, best = res.cfg, res.plan, res.front, res.best
    if res.figure is not None:
        err.print(f"wrote {res.figure}", markup=False, highlight=False)
    if output_mode() == "csv":
        emit(front)
        return
    if emit(dict(model=cfg.name, gpus=gpus, isl=request.isl, osl=request.osl, ttft_slo_s=slo_ttft, tpot_slo_s=slo_tpot,
                  time_model=res.time_model, layouts=result.layouts, points=result.searched,
                  fitting_points=len(result.points), front=front, best=best,
                  skipped=[dict(layout=a, reason=flags.said(b)) for a, b in result.skipped])):
        return
    out.print(tables.pareto_table(f"{escape(cfg.name)} on {gpus} GPUs: Pareto front ({result.searched:,} points, "
                                  f"{result.layouts} layouts, {len(result.points):,} fit; {res.time_model} times; "
                                  f"ISL {request.isl}, OSL {request.osl})", front, top))
    if best is None:
        out.print("No point meets the SLOs and fits in memory" if (slo_ttft or slo_tpot) and len(result.points)
                  else f"No layout of {gpus} GPUs fits {cfg.name} in memory at any batch searched", markup=False)
    else:
        label = "best under the SLOs" if (slo_ttft or slo_tpot) else "most tokens/s per GPU that fits (no SLO given)"
        out.print(f"{label}: {best['gpu']} {best['layout']}, batch {best['batch']}: "
                  f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s per GPU, {best['tokens_per_s_per_user']:,.1f} per user, "
                  f"TTFT {render.si(best['ttft_s'], 's')}, TPOT {render.si(best['tpot_s'], 's')}, "
                  f"{render.si(best['memory_per_gpu_bytes'], 'B')} per GPU (the same point: lmcost estimate {cfg.name} "
                  f"--gpu {best['gpu']} --tp {best['tp']} --pp {best['pp']} --dp {best['dp']} --ep {best['ep']} "
                  f"--batch {best['batch']} --prompt {request.isl} --gen {request.osl} --logits last)", markup=False, soft_wrap=True)
