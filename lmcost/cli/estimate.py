"""``lmcost estimate`` and ``lmcost explain``: one run's costs, and the formulas behind them."""

from typing import Annotated

import typer
from rich.markup import escape

from lmcost.output import render, tables
from lmcost.cli.app import emit, err, machine_output, out, output_mode, say, status_line, user_errors
from lmcost.cli.options import AttnKernelOpt, BatchOpt, ClusterOpt, DpOpt, DtypeOpt, EngineFuseOpt, EngineOpt, EpOpt, GenOpt, GpuOpt, ImbalanceOpt, Kernel, KernelOpt, KvDtypeOpt, Logits, LogitsOpt, MLAMode, MLAOpt, ModelArg, ModelOpt, NodesOpt, Phase, PpOpt, PromptOpt, QuantOpt, RuntimeOpt, TimeModel, TpOpt, WDtypeOpt
from lmcost.apps.setup import weights_label


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
    fuse: EngineFuseOpt = None,
    detail: Annotated[bool, typer.Option("--detail", help="One row per operator of one layer, with its FLOPs formula (with --json/--csv: every operator row).")] = False,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    engine: EngineOpt = None,
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
    from lmcost.apps.estimate import EstimateRequest, run_estimate

    request = EstimateRequest(model=model, gpu=gpu, batch=batch, prompt=prompt, gen=gen, dtype=dtype,
                              weight_dtype=weight_dtype, quant=quant, kv_dtype=kv_dtype, attention=attention.value,
                              mla=mla.value, logits=logits.value, time_model=model_.value, fusion=fuse,
                              attention_kernel=kernel, runtime=runtime, engine=engine, tp=tp, pp=pp, ep=ep, dp=dp,
                              imbalance=ep_imbalance, cluster=cluster, nodes=nodes, sp=sp, cp=cp, vision=vision,
                              detail=detail and not output_mode())
    with status_line(f"estimating {escape(str(model))} on {escape(str(gpu))}"):
        res = run_estimate(request, say)
    est, cfg, hw, precision, settings = res.estimate, res.cfg, res.gpu, res.precision, res.settings
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
    out.print(f"[bold]{escape(cfg.name)}[/bold] ({attention_label(cfg)}, {cfg.n_layers} layers) on "
              f"[bold]{where}[/bold]: batch {wl.batch}, prompt {wl.prompt}, gen {wl.gen}; weights "
              f"{weights_label(precision, cfg, res.quant)}, activations {precision.activations}, KV {precision.kv_cache}; "
              f"{attention.value} attention; lm_head on {logits.value} tokens; fused: "
              f"{', '.join(res.fused) or 'nothing'}"
              + ("" if res.engine is None else f"; engine {escape(res.engine.label)} ({escape(res.engine.kernel_figures)})"))
    for table in (render.params_table(est.params, cfg), render.memory_table(est.kv_cache, est.memory),
                  render.phases_table(est), *render.class_tables(est.class_rows)):
        out.print(table)
    if not lay.single:
        err.print(f"note: per GPU, along one microbatch's path through {lay.pp} stage(s) of batch "
                  f"{lay.microbatch(wl.batch)}; communication is not overlapped with compute (its time adds)",
                  markup=False, highlight=False, soft_wrap=True)
    for phase, formulas in (res.formulas or {}).items():
        out.print(render.detail_table(phase, [r for r in est.rows if r["phase"] == phase], formulas))


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
    from lmcost.apps.estimate import ExplainRequest, explain as run
    from lmcost.basics.notation import __doc__ as legend
    from lmcost.cost.formulas import CONVENTIONS

    request = ExplainRequest(model=model, phase=phase.value, dtype=dtype, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                             attention=attention.value, mla=mla.value, logits=logits.value)
    res = run(request, say)
    rows = res.rows
    if emit(rows):
        return
    out.print(tables.formulas_table(res.cfg.name, res.phase, rows))
    out.print("Notation" + legend.split("Legend", 1)[1].split(":", 1)[1].rstrip(), highlight=False, markup=False)
    out.print("Conventions\n" + CONVENTIONS, highlight=False, markup=False)


def attention_label(cfg) -> str:
    """The header's attention kind: MHA/GQA/MQA/MLA, with ``+ DSA`` under DeepSeek Sparse Attention, or ``no
    attention`` for a stack of recurrent mixers alone."""
    if cfg.attention_kind == "none":
        return "no attention"
    return cfg.attention_kind.upper() + (" + DSA" if cfg.attention.sparse is not None else "")
