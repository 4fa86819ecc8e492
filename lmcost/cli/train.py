"""``lmcost train``: one training step's memory, time, throughput and MFU."""

from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import tables
from lmcost.cli.app import emit, machine_output, out, status_line, user_errors
from lmcost.cli.options import ClusterOpt, Count, EpOpt, GpuOpt, Kernel, KernelOpt, ModelArg, OptimizerOpt, PpOpt, RecomputeOpt, TimeModel, TpOpt, TrainPrecisionOpt
from lmcost.cli.notes import warn_uncalibrated


def _train_setup(gpus, seq, global_batch, micro_batch, tp, pp, cp, ep, sp, zero, recompute, optimizer, precision,
                 schedule, virtual_stages, flops_convention, lora_rank, lora_targets, qlora, cluster):
    """The TrainSetup of the flags (LoRA when --lora-rank is given)."""
    from lmcost.apps.setup import lora_adapters
    from lmcost.operators.parallel import Layout
    from lmcost.apps.train import TrainSetup

    lora = lora_adapters(lora_rank, lora_targets, qlora)
    layout = Layout(tp=tp, pp=pp, cp=cp, ep=ep, sp=sp, cluster=cluster)  # dp: the GPUs left (TrainSetup)
    return TrainSetup(gpus=gpus, seq=seq, global_batch=global_batch, micro_batch=micro_batch, layout=layout, zero=zero,
                      recompute=recompute, optimizer=optimizer, precision=precision, schedule=schedule,
                      virtual_stages=virtual_stages, flops_convention=flops_convention, lora=lora)


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
    pp: PpOpt = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel GPUs per sequence.")] = 1,
    ep: EpOpt = 1,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism with TP.")] = False,
    zero: Annotated[int, typer.Option("--zero", help="0 (DDP), 1, 2 or 3 (ZeRO stage; 3 = FSDP).")] = 1,
    recompute: RecomputeOpt = "none",
    optimizer: OptimizerOpt = "adamw",
    precision: TrainPrecisionOpt = "bf16-mixed",
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b, gpipe, interleaved.")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="Model chunks per GPU (interleaved schedule).")] = 1,
    flops_convention: Annotated[str, typer.Option("--flops-convention", help="Headline MFU: palm (6N + 12LHQT, causal not halved) or causal (attention pairs halved).")] = "palm",
    lora_rank: Annotated[Optional[int], typer.Option("--lora-rank", help="Train LoRA adapters of this rank on a frozen base.")] = None,
    lora_targets: Annotated[Optional[str], typer.Option("--lora-targets", help="Projections that get adapters, comma-separated (default q,k,v,o).")] = None,
    qlora: Annotated[bool, typer.Option("--qlora", help="Keep the frozen base in 4-bit NF4 (QLoRA).")] = False,
    cluster: ClusterOpt = None,
    model_: Annotated[TimeModel, typer.Option("--model", help="calibrated (expected time, the default) or roofline (lower bound).")] = TimeModel.calibrated,
    attention: KernelOpt = Kernel.flash,
):
    """One training step: memory per GPU (weights, gradients, master copy, optimizer states, activations),
    step time by part (pipeline with its bubble, recompute, exposed data-parallel communication, optimizer),
    tokens/s, MFU (both FLOPs conventions) and HFU."""
    from dataclasses import replace

    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.apps.train import train_step

    cfg, hw = load_config(model), load_gpu(gpu)
    setup = replace(_train_setup(gpus, seq, global_batch, micro_batch, tp, pp, cp, ep, sp, zero, recompute, optimizer,
                                 precision, schedule, virtual_stages, flops_convention, lora_rank, lora_targets, qlora,
                                 cluster), attention=attention.value)
    with status_line(f"costing a training step of {cfg.name} on {gpus} x {hw.name}"):
        res = train_step(cfg, hw, setup, model_.value)
    warn_uncalibrated(hw, model_.value)
    if emit(res.to_dict()):
        return
    lay = setup.full_layout
    out.print(f"[bold]{escape(cfg.name)}[/bold] training on [bold]{gpus} x {escape(hw.name)}[/bold] "
              f"({lay.describe()}): {setup.global_batch} x {setup.seq} tokens per step, micro-batch "
              f"{setup.micro_batch}, {setup.microbatches} microbatches per replica; {setup.precision}, "
              f"{setup.optimizer}, ZeRO-{setup.zero}, recompute {setup.recompute}, {setup.schedule}; "
              f"{model_.value} times", soft_wrap=True)
    for table in tables.train_tables(res, setup, hw.peak_flops(res.compute_dtype)):
        out.print(table)
