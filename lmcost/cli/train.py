"""``lmcost train``: one training step's memory, time, throughput and MFU."""

from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import tables
from lmcost.cli.app import emit, machine_output, out, say, status_line, user_errors
from lmcost.cli.options import parse_real, AttnKernelOpt, EngineOpt, RuntimeOpt, ClusterOpt, Count, EpOpt, GpuOpt, ImbalanceOpt, Kernel, KernelOpt, ModelArg, OptimizerOpt, TrainPpOpt, RecomputeOpt, TimeModel, TpOpt, TrainPrecisionOpt


@user_errors
@machine_output
def train(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs in all.")] = 8,
    seq: Annotated[int, Count("--seq", help="Tokens per sequence; 8k = 8192.")] = 4096,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step, over all replicas.")] = 64,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per microbatch on one GPU.")] = 1,
    tp: TpOpt = 1,
    pp: TrainPpOpt = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel GPUs per sequence.")] = 1,
    ep: EpOpt = 1,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism with TP.")] = False,
    zero: Annotated[int, typer.Option("--zero", help="0 (DDP), 1, 2 or 3 (ZeRO stage; 3 = FSDP).")] = 1,
    recompute: RecomputeOpt = "none",
    optimizer: OptimizerOpt = "adamw",
    precision: TrainPrecisionOpt = "bf16-mixed",
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b, gpipe, interleaved.")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="Model chunks per GPU (interleaved schedule).")] = 1,
    flops_convention: Annotated[str, typer.Option("--flops-convention", help="Headline MFU: causal (6N + the attention pairs the mask keeps; never above HFU) or palm (6N + 12LHQT, every pair: can pass 100% at long --seq).")] = "causal",
    lora_rank: Annotated[Optional[int], typer.Option("--lora-rank", help="Train LoRA adapters of this rank on a frozen base.")] = None,
    lora_targets: Annotated[Optional[str], typer.Option("--lora-targets", help="Projections that get adapters, comma-separated (default q,k,v,o).")] = None,
    qlora: Annotated[bool, typer.Option("--qlora", help="Keep the frozen base in 4-bit NF4 (QLoRA).")] = False,
    cluster: ClusterOpt = None,
    model_: Annotated[TimeModel, typer.Option("--model", help="calibrated (expected time, the default) or roofline (lower bound).")] = TimeModel.calibrated,
    attention: KernelOpt = Kernel.flash,
    first_stage_layers: Annotated[Optional[int], typer.Option("--first-stage-layers", help="Layers on the first pipeline stage; the rest split evenly over the middle stages (Megatron-LM's decoder_first_pipeline_num_layers).")] = None,
    last_stage_layers: Annotated[Optional[int], typer.Option("--last-stage-layers", help="Layers on the last pipeline stage (Megatron-LM's decoder_last_pipeline_num_layers).")] = None,
    stage_layers: Annotated[Optional[str], typer.Option("--stage-layers", help="Layers of every pipeline stage, first to last, e.g. 7,8,8,7.")] = None,
    recompute_layers: Annotated[Optional[int], typer.Option("--recompute-layers", help="With --recompute full: recompute only the first N layers of each stage (model chunk), keep the rest (Megatron-LM's recompute_method block, recompute_num_layers N).")] = None,
    framework: Annotated[str, typer.Option("--framework", help="Software that runs the step, whose launch, bucket and prefetch figures apply: auto (megatron; fsdp under --zero 3), megatron, deepspeed, fsdp, fsdp-compile, eager.")] = "auto",
    power_limit: Annotated[Optional[str], typer.Option("--power-limit", help="GPU power cap in W (e.g. 500): compute-bound time scales with the clock it allows; default: the GPU's own limit.", show_default=False)] = None,
    shard_group: Annotated[Optional[int], typer.Option("--shard-group", help="HSDP: with --zero 3, shard over groups of this many data-parallel GPUs (e.g. 8, one node) and replicate across them; default: shard over all.", show_default=False)] = None,
    overlap: Annotated[str, typer.Option("--overlap", help="Overlap schemes run, comma-separated: none, dualpipe (EP all-to-all and PP sends), tbo (two-batch overlap of EP all-to-all), async-tp (TP collectives under GEMMs).")] = "none",
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    redundant_experts: Annotated[int, typer.Option("--redundant-experts", help="Redundant expert replicas per EP group (EPLB), spread over the --ep ranks: their memory is charged; the balance they leave is --ep-imbalance.")] = 0,
    ep_imbalance: ImbalanceOpt = 1.0,
    engine: EngineOpt = None,
):
    """One training step: memory per GPU (weights, gradients, master copy, optimizer states, activations),
    step time by part (pipeline with its bubble, recompute, exposed data-parallel communication, optimizer),
    tokens/s, MFU (both FLOPs conventions) and HFU."""
    from lmcost.apps.train_run import TrainRequest, run_train
    from lmcost.apps.train_checks import say_unused_kernel
    from lmcost.operators.pipeline_split import parse_counts

    request = TrainRequest(model=model, gpu=gpu, gpus=gpus, seq=seq, global_batch=global_batch, micro_batch=micro_batch,
                           tp=tp, pp=pp, cp=cp, ep=ep, sp=sp, zero=zero, recompute=recompute, optimizer=optimizer,
                           precision=precision, schedule=schedule, virtual_stages=virtual_stages,
                           flops_convention=flops_convention, lora_rank=lora_rank, lora_targets=lora_targets,
                           qlora=qlora, cluster=cluster, time_model=model_.value, attention=attention.value,
                           first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers,
                           stage_layers=parse_counts("stage_layers", stage_layers), recompute_layers=recompute_layers,
                           framework=framework, overlap=overlap, shard_group=shard_group,
                           power_limit=None if power_limit is None else parse_real(power_limit, "power_limit",
                                                                                    "give the cap in watts, e.g. 500"),
                           attention_kernel=kernel, runtime=runtime, redundant_experts=redundant_experts, ep_imbalance=ep_imbalance,
                           engine=engine)
    say_unused_kernel(request, say)  # as estimate says it
    with status_line(f"costing a training step of {model} on {gpus} x {gpu}"):
        run = run_train(request, say)
    cfg, hw, setup, res = run.cfg, run.gpu, run.setup, run.step
    if emit(run.to_dict()):
        return
    lay = setup.full_layout
    out.print(f"[bold]{escape(cfg.name)}[/bold] training on [bold]{gpus} x {escape(hw.name)}[/bold] "
              f"({lay.describe()}): {setup.global_batch} x {setup.seq} tokens per step, micro-batch "
              f"{setup.micro_batch}, {setup.microbatches} microbatches per replica; {setup.precision}, "
              f"{setup.optimizer}, ZeRO-{setup.zero}, recompute {setup.recompute}"
              f"{'' if setup.recompute_layers is None else f' ({setup.recompute_layers} layers per stage)'}, "
              f"{setup.schedule}{'' if lay.stage_split is None else ' over ' + '/'.join(map(str, lay.stage_split)) + ' layers'}; "
              f"{escape(setup.framework_name)}{'' if setup.power_limit is None else f' at {setup.power_limit:g} W'}"
              f"{'' if setup.overlap == 'none' else f', overlap {escape(setup.overlap)}'}; {model_.value} times", soft_wrap=True)
    for table in tables.train_tables(res, setup, hw.peak_flops(res.compute_dtype)):
        out.print(table)
