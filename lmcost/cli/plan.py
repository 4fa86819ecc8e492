"""``lmcost plan``: the serving Pareto front over layouts and batches, or (``--train``) the fastest training setup."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli import flags
from lmcost.cli.app import emit, err, machine_output, out, output_mode, say, status_line, user_errors
from lmcost.cli.options import ClusterOpt, DtypeOpt, FuseOpt, KvDtypeOpt, ModelArg, OptimizerOpt, TimeModel, TrainPrecisionOpt, WDtypeOpt, parse_count, parse_duration
from lmcost.apps.setup import resolve_precision


def _plan_train(cfg, hws, gpus, seq, global_batch, optimizer, precision, model, cluster, top) -> None:
    """plan --train: the fastest training steps that fit (see lmcost.apps.plan.search_train)."""
    from lmcost.apps.plan import check_top, search_train

    check_top(top)
    with status_line(f"planning the training of {cfg.name} on {gpus} GPUs") as status:
        fits, skipped = search_train(cfg, hws, gpus, seq, global_batch, optimizer=optimizer, precision=precision,
                                     model=model, cluster=cluster, progress=getattr(status, "update", None))
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in fits.to_dict("records")]
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
    from lmcost.operators.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.apps.plan import check_top, check_train_slos, search
    from lmcost.operators.workload import Settings

    cfg = load_config(model)
    hws = list({h.name: h for h in (load_gpu(g) for g in gpu)}.values())  # a GPU named twice is searched once
    if train_:
        check_train_slos(ttft, tpot)
        _plan_train(cfg, hws, gpus, parse_count(seq), global_batch, optimizer, precision_,
                    (model_ or TimeModel.calibrated).value, cluster, top)
        return
    model_ = model_ or TimeModel.roofline
    precision = resolve_precision(dtype, weight_dtype, kv_dtype, hws, say)
    n_isl, n_osl = parse_count(isl), parse_count(osl)
    slo_ttft = parse_duration(ttft, "--ttft") if ttft else None
    slo_tpot = parse_duration(tpot, "--tpot") if tpot else None
    check_top(top)
    # Serving engines run the lm_head on each sequence's last token only (the planner's setting).
    settings = Settings(kernel="flash", mla="auto", logits="last", model=model_.value, fusion=parse_fusion(fuse))
    with status_line(f"planning {cfg.name} on {gpus} GPUs"):
        result = search(cfg, hws, gpus, n_isl, n_osl, precision, settings, slo_ttft, slo_tpot, max_batch, cluster)
    keep = ["gpu", "layout", "tp", "pp", "dp", "ep", "batch", "ttft_s", "tpot_s", "tokens_per_s_per_gpu",
            "tokens_per_s_per_user", "memory_per_gpu_bytes", "bound", "meets_slo"]
    front = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
             for r in result.front[keep].to_dict("records")]
    best = None if result.best is None else {k: (v.item() if hasattr(v, "item") else v)
                                              for k, v in result.best.items() if k in keep}
    if output is not None:
        from lmcost.output.plots import plan_figure, write_html

        fig = plan_figure(result.points, result.front, f"{cfg.name} on {gpus} GPUs, ISL {n_isl}, OSL {n_osl}",
                          slo_ttft, slo_tpot)
        err.print(f"wrote {write_html(fig, output)}", markup=False, highlight=False)
    if output_mode() == "csv":
        emit(front)
        return
    if emit(dict(model=cfg.name, gpus=gpus, isl=n_isl, osl=n_osl, ttft_slo_s=slo_ttft, tpot_slo_s=slo_tpot,
                  time_model=model_.value, layouts=result.layouts, points=result.searched,
                  fitting_points=len(result.points), front=front, best=best,
                  skipped=[dict(layout=a, reason=flags.said(b)) for a, b in result.skipped])):
        return
    out.print(tables.pareto_table(f"{escape(cfg.name)} on {gpus} GPUs: Pareto front ({result.searched:,} points, "
                                  f"{result.layouts} layouts, {len(result.points):,} fit; {model_.value} times; "
                                  f"ISL {n_isl}, OSL {n_osl})", front, top))
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
                  f"--batch {best['batch']} --prompt {n_isl} --gen {n_osl} --logits last)", markup=False, soft_wrap=True)
