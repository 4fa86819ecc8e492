"""``lmcost estimate`` and ``lmcost explain``: one run's costs, and the formulas behind them."""

from typing import Annotated

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli.app import emit, err, machine_output, out, output_mode, say, user_errors
from lmcost.cli.options import AttnKernelOpt, BatchOpt, ClusterOpt, DpOpt, DtypeOpt, EpOpt, FuseOpt, GenOpt, GpuOpt, ImbalanceOpt, Kernel, KernelOpt, KvDtypeOpt, Logits, LogitsOpt, MLAMode, MLAOpt, ModelArg, ModelOpt, NodesOpt, Phase, PpOpt, PromptOpt, QuantOpt, RuntimeOpt, TimeModel, TpOpt, WDtypeOpt
from lmcost.cli.notes import warn_context, warn_uncalibrated
from lmcost.apps.setup import check_vision, checked_layout, resolve_precision, resolve_quant, select_efficiency, weights_label


@user_errors
@machine_output
def estimate(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    batch: BatchOpt = 1,
    prompt: PromptOpt = 512,
    gen: GenOpt = 256,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.auto,
    logits: LogitsOpt = Logits.all,
    model_: ModelOpt = TimeModel.roofline,
    fuse: FuseOpt = "default",
    detail: Annotated[bool, typer.Option("--detail", help="One row per operator of one layer, with its FLOPs formula (with --json/--csv: every operator row).")] = False,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    ep_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism with TP: reduce-scatter + all-gather, norms on s/tp tokens.")] = False,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel GPUs per sequence (ring attention in prefill, split KV cache in decode).")] = 1,
    vision: Annotated[bool, typer.Option("--vision", help="A multimodal model's vision tower and projector in memory too (their weights, in the weight dtype).")] = False,
):
    """Parameters, KV cache, memory, prefill and decode FLOPs, bytes and times (roofline or calibrated);
    with --tp/--pp/--ep/--dp, one GPU's share of a parallel layout and its communication."""
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings, Workload
    from lmcost.apps.estimate import estimate as run
    from lmcost.operators.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu

    cfg, hw = load_config(model), select_efficiency(load_gpu(gpu), kernel, runtime)
    layout = checked_layout(hw, tp=tp, pp=pp, ep=ep, dp=dp, cp=cp, sp=sp, imbalance=ep_imbalance,
                            cluster=cluster, nodes=nodes)  # refused before any note
    precision = resolve_precision(dtype, weight_dtype, kv_dtype, [hw], say)
    cfg, quant = resolve_quant(cfg, quant, weight_dtype, say)
    settings = Settings(kernel=attention.value, mla=mla.value, logits=logits.value, model=model_.value,
                        fusion=parse_fusion(fuse), layout=layout, quant=quant, vision=vision)
    check_vision(cfg, vision)
    if "tower" in cfg.source and not vision:  # a multimodal wrapper: say what the numbers cover
        err.print(f"note: {cfg.name} is costed as its decoder ({cfg.source.split('(', 1)[-1].rstrip(')')})"
                  + ("; --vision adds the tower's weights to memory" if cfg.vision_params else ""),
                  markup=False, highlight=False, soft_wrap=True)
    if model_.value == "roofline" and (kernel != "auto" or runtime != "auto"):
        err.print("note: --kernel and --runtime choose efficiency figures: they change calibrated times only "
                  "(add --model calibrated)", markup=False, highlight=False, soft_wrap=True)
    for p in (hw.efficiency.phases_without() if hw.efficiency is not None else []):
        err.print(f"note: {hw.name} has no {p} figures for {kernel}: {p} attention takes auto's", markup=False,
                  highlight=False, soft_wrap=True)
    if attention.value == "naive" and hw.efficiency is not None and hw.efficiency.kernel != "auto":
        err.print("note: --kernel names a flash kernel family; --attention naive runs no flash kernel, so it is unused",
                  markup=False, highlight=False, soft_wrap=True)
    est = run(cfg, hw, Workload(batch, prompt, gen), precision, settings)
    warn_uncalibrated(hw, model_.value)
    warn_context(cfg, prompt + gen)
    data = est.to_dict()
    if detail and output_mode():
        data["ops"] = est.rows
        if output_mode() == "csv":
            emit(data["ops"])
            return
    if output_mode() == "csv":
        data["op_classes"] = {f"{r['phase']}.{r['op_class']}": {k: v for k, v in r.items() if k not in ("phase", "op_class")}
                              for r in data["op_classes"]}
    if emit(data):
        return
    wl = est.workload
    lay = settings.layout
    where = escape(hw.name) if lay.single else f"{lay.gpus} x {escape(hw.name)}, {lay.describe()} on {escape(est.cluster)}"
    out.print(f"[bold]{escape(cfg.name)}[/bold] ({cfg.attention_kind.upper()}, {cfg.n_layers} layers) on "
              f"[bold]{where}[/bold]: batch {wl.batch}, prompt {wl.prompt}, gen {wl.gen}; weights "
              f"{weights_label(precision, cfg, quant)}, activations {precision.activations}, KV {precision.kv_cache}; "
              f"{attention.value} attention; lm_head on {logits.value} tokens; fused: "
              f"{', '.join(settings.fusion) or 'nothing'}")
    for table in (render.params_table(est.params), render.memory_table(est.kv_cache, est.memory),
                  render.phases_table(est), *render.class_tables(est.class_rows)):
        out.print(table)
    if not lay.single:
        err.print(f"note: per GPU, along one microbatch's path through {lay.pp} stage(s) of batch "
                  f"{lay.microbatch(wl.batch)}; communication is not overlapped with compute (its time adds)",
                  markup=False, highlight=False, soft_wrap=True)
    if detail:
        from lmcost.cost.formulas import show, symbolic_ops

        for phase in ("prefill", "decode"):
            rows = [r for r in est.rows if r["phase"] == phase]
            sym = {op.name: op for op in symbolic_ops(cfg, phase, precision, attention.value, settings.mla_for(phase),
                                                      logits.value, settings.fusion)}
            out.print(render.detail_table(phase, rows, [show(sym[r["name"]].flops) for r in rows]))


@user_errors
@machine_output
def explain(
    model: ModelArg,
    phase: Annotated[Phase, typer.Option(help="prefill (t = s) or decode (s = 1).")] = Phase.decode,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.auto,
    logits: LogitsOpt = Logits.all,
):
    """The FLOPs and bytes formula of every operator, in the field's notation."""
    from lmcost.model.loading import load_config
    from lmcost.cost.formulas import CONVENTIONS, show, symbolic_ops
    from lmcost.basics.notation import __doc__ as legend
    from lmcost.operators.workload import require_decoder

    from lmcost.operators.workload import Settings

    cfg = load_config(model)
    precision = resolve_precision(dtype, weight_dtype, kv_dtype)
    settings = Settings(kernel=attention.value, mla=mla.value, logits=logits.value)
    if phase is Phase.decode:
        require_decoder(cfg)
    ops = symbolic_ops(cfg, phase.value, precision, attention.value, settings.mla_for(phase.value), logits.value)
    rows = [dict(name=op.name, op_class=op.op_class.value, count=str(op.count), flops=show(op.flops),
                 bytes=show(op.bytes), shapes=op.shapes) for op in ops]
    if emit(rows):
        return
    out.print(tables.formulas_table(cfg.name, phase.value, rows))
    out.print("Notation" + legend.split("Legend", 1)[1].split(":", 1)[1].rstrip(), highlight=False, markup=False)
    out.print("Conventions\n" + CONVENTIONS, highlight=False, markup=False)
