"""``lmcost plan``: the serving Pareto front over layouts and batches, or (``--train``) the fastest training setup."""

import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli import flags
from lmcost.cli.app import emit, err, machine_output, out, output_mode, say, status_line, user_errors
from lmcost.cli.options import ClusterOpt, EngineOpt, KvDtypeOpt, ModelArg, TimeModel, WDtypeOpt, parse_count_of, parse_duration, parse_real


def _opt(flag: str, help: str, kind=str):
    """An option of one kind of plan, None when not given (the library fills in its default and refuses
    it under the other kind)."""
    return Annotated[Optional[kind], typer.Option(flag, help=help)]


def _show_train(res, gpus, top) -> None:
    """plan --train's output: the fastest training steps that fit (:class:`lmcost.apps.plan.TrainPlan`)."""
    cfg, rows, skipped, model, o = res.cfg, res.fits, res.skipped, res.time_model, res.options
    check = None if res.check is None else "lmcost " + shlex.join(res.check)
    if emit(dict(model=cfg.name, gpus=gpus, seq=o["seq"], global_batch=o["global_batch"], time_model=model, fits=rows,
                  skipped=[dict(setup=a, reason=flags.said(b)) for a, b in skipped], check_command=check,
                  **({} if res.settings is None else dict(settings=res.settings)))):
        return
    out.print(tables.train_plan_table(cfg.name, gpus, o["global_batch"], o["seq"], model, rows, len(rows) + len(skipped),
                                      top))
    if not rows:
        out.print(f"Nothing fits in memory on {gpus} GPUs at this batch and sequence", markup=False)
    else:
        b = rows[0]
        out.print(f"fastest that fits ({model} times): {b['gpu']} {b['layout']}, micro-batch {b['micro_batch']}, "
                  f"ZeRO-{b['zero']}, recompute {b['recompute']}: step {render.si(b['step_s'], 's')}, MFU "
                  f"{render.pct(b['mfu'])} (check it: {check})", markup=False, soft_wrap=True)


@user_errors
@machine_output
def plan(
    model: ModelArg,
    gpu: Annotated[list[str], typer.Option("--gpu", help="GPU type(s) to search (repeat for several).")] = ["h100"],  # noqa: B006
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of each type to spread the model over.")] = 8,
    isl: _opt("--isl", "Input (prompt) tokens per request; suffixes k, M, G, binary (default 2048).") = None,
    osl: _opt("--osl", "Output (generated) tokens per request; suffixes k, M, G, binary (default 256).") = None,
    ttft: _opt("--ttft", "TTFT SLO, e.g. 500ms (units ns, us or µs, ms, s; case-sensitive).") = None,
    tpot: _opt("--tpot", "TPOT SLO, e.g. 50ms (units ns, us or µs, ms, s; case-sensitive).") = None,
    max_batch: _opt("--max-batch", "Largest global batch searched (default 4096).", int) = None,
    dtype: _opt("--dtype", "dtype of weights, activations and KV cache: fp32, bf16, fp16, fp8, int8; auto (the "
                "default): bf16, or fp16 on a GPU without bf16.") = None,
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: Annotated[Optional[TimeModel], typer.Option("--model", help="calibrated (expected time, the default: judges the SLOs, the roofline shown as a bound) or roofline (lower bound).")] = None,
    fuse: _opt("--fuse", "Fused operators: none, default (silu_mul), vllm/all, or a list of silu_mul,add_norm,"
               "rope_attention,qkv,gate_up,moe_grouped.") = None,
    cluster: ClusterOpt = None,
    top: Annotated[int, typer.Option("--top", help="Rows of the Pareto front printed.")] = 15,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the plotly figure as offline HTML here (serving).")] = None,
    train_: Annotated[bool, typer.Option("--train", help="Search training layouts instead: the fastest step that fits.")] = False,
    seq: _opt("--seq", "With --train: tokens per sequence; suffixes k, M, G, binary (default 4096).") = None,
    global_batch: _opt("--global-batch", "With --train: sequences per step (default 64).", int) = None,
    optimizer: _opt("--optimizer", "With --train: adamw (the default), adam8bit, sgd (momentum), adafactor, muon.") = None,
    precision_: _opt("--precision", "With --train: bf16-mixed (the default; 16 B/param with AdamW), "
                     "bf16-mixed-fp32-grads (18), fp32, bf16; fp8 GEMMs over bf16-mixed: fp8-delayed, fp8-current, "
                     "fp8-block, mxfp8 (Blackwell).") = None,
    framework: _opt("--framework", "With --train: software that runs every step: auto (the default: megatron; fsdp "
                    "under ZeRO-3), megatron, deepspeed, fsdp, fsdp-compile, eager.") = None,
    power_limit: _opt("--power-limit", "With --train: GPU power cap in W (e.g. 500); default: the GPU's own limit.") = None,
    kernel: _opt("--kernel", "With --train: attention kernel family whose fitted figures time attention: auto (the "
                 "default), fa2, fa3, cudnn, flex, ...; the GPU's YAML lists those it has.") = None,
    runtime: _opt("--runtime", "With --train: runtime of memory-bound kernels: auto (the default), triton, torch-eager; "
                  "the GPU's YAML lists those it has.") = None,
    engine: EngineOpt = None,
):
    """Search parallel layouts x batch sizes on --gpus GPUs: the Pareto front of tokens/s per GPU against
    tokens/s per user, each point's layout, memory per GPU and bound, and the best layout under the SLOs
    (judged on calibrated times by default, the roofline beside them as a bound)."""
    from lmcost.apps.plan import PlanRequest, run_plan

    slo_ttft = parse_duration(ttft, "--ttft") if ttft is not None else None
    slo_tpot = parse_duration(tpot, "--tpot") if tpot is not None else None
    counts = {k: parse_count_of(v, f"--{k}") for k, v in (("isl", isl), ("osl", osl), ("seq", seq)) if v is not None}
    request = PlanRequest(model=model, gpu=tuple(gpu), n_gpus=gpus, ttft=slo_ttft, tpot=slo_tpot, max_batch=max_batch,
                          dtype=dtype, weight_dtype=weight_dtype, kv_dtype=kv_dtype, time_model=model_ and model_.value,
                          fusion=fuse, cluster=cluster, top=top, output=output, train=train_, global_batch=global_batch,
                          optimizer=optimizer, precision=precision_, framework=framework, attention_kernel=kernel,
                          runtime=runtime, engine=engine, power_limit=None if power_limit is None else parse_real(
                              power_limit, "power_limit", "give the cap in watts, e.g. 500"), **counts)
    what = f"the training of {model}" if train_ else model
    with status_line(f"planning {what} on {gpus} GPUs") as status:
        res = run_plan(request, say, progress=getattr(status, "update", None) if train_ else None)
    if train_:
        _show_train(res, gpus, top)
        return
    cfg, result, front, best, o = res.cfg, res.plan, res.front, res.best, res.options
    check = None if res.check is None else "lmcost " + shlex.join(res.check)
    if res.figure is not None:
        err.print(f"wrote {res.figure}", markup=False, highlight=False)
    if output_mode() == "csv":
        emit(front)
        return
    if emit(dict(model=cfg.name, gpus=gpus, isl=o["isl"], osl=o["osl"], ttft_slo_s=slo_ttft, tpot_slo_s=slo_tpot,
                  time_model=res.time_model, layouts=result.layouts, points=result.searched,
                  fitting_points=len(result.points), front=front, best=best, check_command=check,
                  skipped=[dict(layout=a, reason=flags.said(b)) for a, b in result.skipped],
                  **({} if res.settings is None else dict(settings=res.settings)))):
        return
    out.print(tables.pareto_table(f"{escape(cfg.name)} on {gpus} GPUs: Pareto front ({result.searched:,} points, "
                                  f"{result.layouts} layouts, {len(result.points):,} fit; {res.time_model} times; "
                                  f"ISL {o['isl']}, OSL {o['osl']})", front, top))
    if best is None:
        out.print("No point meets the SLOs and fits in memory" if (slo_ttft or slo_tpot) and len(result.points)
                  else f"No layout of {gpus} GPUs fits {cfg.name} in memory at any batch searched", markup=False)
    else:
        label = (f"best under the SLOs, judged on {res.time_model} times" if (slo_ttft or slo_tpot)
                 else f"most tokens/s per GPU that fits (no SLO given; {res.time_model} times)")
        bound = ("" if res.time_model == "roofline" else f" (roofline bound: TTFT {render.si(best['ttft_roofline_s'], 's')}, "
                 f"TPOT {render.si(best['tpot_roofline_s'], 's')})")
        out.print(f"{label}: {best['gpu']} {best['layout']}, batch {best['batch']}: "
                  f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s per GPU, {best['tokens_per_s_per_user']:,.1f} per user, "
                  f"TTFT {render.si(best['ttft_s'], 's')}, TPOT {render.si(best['tpot_s'], 's')}{bound}, "
                  f"{render.si(best['memory_per_gpu_bytes'], 'B')} per GPU (the same point: {check})",
                  markup=False, soft_wrap=True)
