"""``lmcost train`` from names and options: :class:`TrainRequest` loaded and costed by :func:`run_train`
(the step itself: :mod:`lmcost.apps.train`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmcost.apps.setup import Say, lora_adapters, quiet, say_uncalibrated
from lmcost.apps.train import TrainSetup, TrainStep, train_step
from lmcost.cost.fp8_training import fp8_recipe
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.operators.parallel import Layout


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainRequest:
    """One ``lmcost train`` run, from names and options.

    ``model``/``gpu``: a shipped name or a path (or a loaded ArchConfig/GPU); ``gpus`` ... ``flops_convention``,
    ``attention``, ``attention_kernel``, ``runtime``, ``redundant_experts``, ``framework``, ``power_limit``, ``overlap`` and
    ``shard_group``: as :class:`TrainSetup` (``tp``, ``pp``, ``cp``, ``ep``, ``sp``, ``cluster``, ``ep_imbalance``: its
    layout; dp is the GPUs left); ``first_stage_layers``/``last_stage_layers``
    or ``stage_layers``: an uneven pipeline split (:func:`lmcost.operators.pipeline_split.uneven_stages`);
    ``recompute_layers``: as :class:`TrainSetup`; ``lora_rank``/``lora_targets``/``qlora``: LoRA adapters
    (:func:`lmcost.apps.setup.lora_adapters`; no rank: full training); ``time_model``: roofline or calibrated;
    ``engine``: auto, torch, vllm, sglang or trtllm (``@version`` optional): whose kernel figures time the step
    (:func:`lmcost.apps.engine_choice.choose_engine`; a training step runs torch's kernels, so a serving
    engine's figures are a what-if: its GEMM and attention kernels); None: not given.
    """

    model: str | ArchConfig
    gpu: str | GPU = "h100"
    gpus: int = 8
    seq: int = 4096
    global_batch: int = 64
    micro_batch: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    zero: int = 1
    recompute: str = "none"
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    flops_convention: str = "causal"
    lora_rank: int | None = None
    lora_targets: str | None = None
    qlora: bool = False
    cluster: str | None = None
    time_model: str = "calibrated"
    attention: str = "flash"
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None
    stage_layers: tuple | None = None
    recompute_layers: int | None = None
    framework: str = "auto"
    power_limit: float | None = None
    overlap: str = "none"
    shard_group: int | None = None
    attention_kernel: str = "auto"
    runtime: str = "auto"
    redundant_experts: int = 0
    ep_imbalance: float = 1.0
    engine: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainRun:
    """What :func:`run_train` found: the model, the GPU, the :class:`TrainSetup` and its :class:`TrainStep`;
    ``engine``: the :class:`lmcost.apps.engine_choice.EngineChoice` (None: not given)."""

    cfg: ArchConfig
    gpu: GPU
    setup: TrainSetup
    step: TrainStep
    engine: object = None

    def to_dict(self) -> dict:
        """The JSON of ``lmcost train --json``: the step's (:meth:`TrainStep.to_dict`), with ``settings`` (the
        engine and where its kernel figures came from; auto's without one: :func:`lmcost.apps.engine_choice.engine_record`)."""
        from lmcost.apps.engine_choice import engine_record

        out = self.step.to_dict()
        out["settings"] = engine_record(self.gpu, self.engine)
        return out


def run_train(request: TrainRequest, say: Say = quiet, figures: dict | None = None) -> TrainRun:
    """Load what ``request`` names, build its :class:`TrainSetup` and cost one :func:`train_step`; say
    (``say``, one line each) when the step does not fit in the GPUs' memory (by how much: its figures are
    those it would have if it fit), when the calibrated model meets a GPU without efficiency figures, and
    when the headline MFU (palm) counts more FLOPs than run. ``figures``: SystemFigures fields to replace in
    the GPU's and framework's (a fit's trial; :mod:`lmcost.calibration.training_fit`).

    Raises: LmcostError for an unknown model, GPU, cluster or engine, an engine the GPU has no profile of, LoRA
    targets or QLoRA without a rank, the errors of :class:`TrainSetup` and of :func:`train_step`.
    """
    from lmcost.apps.engine_choice import choose_engine, say_figures
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.pipeline_split import uneven_stages

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    hw, engine = choose_engine(r.gpu if isinstance(r.gpu, GPU) else load_gpu(r.gpu), r.engine, designs=False)
    lora = lora_adapters(r.lora_rank, r.lora_targets, r.qlora)
    split = uneven_stages(cfg.n_layers, r.pp, r.first_stage_layers, r.last_stage_layers, r.stage_layers)
    layout = Layout(tp=r.tp, pp=r.pp, cp=r.cp, ep=r.ep, sp=r.sp, cluster=r.cluster, imbalance=r.ep_imbalance,
                    stage_split=split)  # dp: the GPUs left (TrainSetup)
    setup = TrainSetup(gpus=r.gpus, seq=r.seq, global_batch=r.global_batch, micro_batch=r.micro_batch, layout=layout,
                       zero=r.zero, recompute=r.recompute, optimizer=r.optimizer, precision=r.precision,
                       schedule=r.schedule, virtual_stages=r.virtual_stages, flops_convention=r.flops_convention,
                       lora=lora, attention=r.attention, recompute_layers=r.recompute_layers, framework=r.framework,
                       power_limit=r.power_limit, overlap=r.overlap, shard_group=r.shard_group,
                       attention_kernel=r.attention_kernel, runtime=r.runtime, redundant_experts=r.redundant_experts)
    from lmcost.cost.train_system import system_figures

    sys_figures = replace(system_figures(hw, setup.framework_name), **figures) if figures else None
    step = train_step(cfg, hw, setup, r.time_model, figures=sys_figures)
    say_uncalibrated(hw, r.time_model, say)
    say_figures(hw, engine, say, r.time_model == "calibrated")
    if engine is not None and engine.kernels is not None and r.time_model == "calibrated":
        say(f"note: {engine.label} is a serving engine: its kernel figures (GEMM, attention, norm and activation "
            "kernels measured for inference) time the training kernels; a training step runs PyTorch's "
            "(--engine torch or auto)")
    if not step.fits:
        from lmcost.output.render import si

        total, cap = step.memory["nvidia_smi_bytes"], step.memory["usable_bytes"]
        say(f"note: does not fit: {si(total, 'B')} per GPU as the device holds it (allocated "
            f"{si(step.memory['allocated_bytes'], 'B')}) against {si(cap, 'B')} (margin {si(step.memory['margin_bytes'], 'B')}); "
            "its time, throughput and MFU are what the step would take if it fit")
    if setup.power_limit is not None and hw.tdp_w and setup.power_limit >= hw.tdp_w:
        say(f"note: a {setup.power_limit:g} W cap is at or above {hw.name}'s {hw.tdp_w:g} W TDP (its default limit): "
            "the clock is the sustained one, as without a cap")
    if step.model_flops > step.hardware_flops_per_gpu * setup.gpus:  # (HFU prices fp8 GEMMs at the fp8 peak)
        say(f"note: `flops_convention` {setup.flops_convention} counts attention pairs the causal kernel skips: "
            f"its MFU ({step.mfu:.1%}) exceeds the FLOPs that run (HFU {step.hfu:.1%}); causal counts those that run")
    if step.mfu > 1:  # against the compute dtype's peak while fp8 GEMMs run faster, or roofline-priced
        say(f"note: MFU {step.mfu:.1%} is above 100%: it counts against the {step.compute_dtype} peak (NeMo's convention)"
            + (", and the fp8 GEMMs run at up to the fp8 peak" if fp8_recipe(setup.precision) else "")
            + (f"; {hw.name} has no efficiency figures, so its kernels are priced at the roofline" if hw.efficiency is None else ""))
    return TrainRun(cfg=cfg, gpu=hw, setup=setup, step=step, engine=engine)
