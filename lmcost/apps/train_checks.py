"""Checks of a training step's inputs against each other, the model and the GPU (``lmcost train``,
``plan --train``): each refuses in one line (:class:`lmcost.basics.errors.LmcostError`) what the step
would otherwise cost as if it ran.

Sources, per check:
- framework x ZeRO: PyTorch FSDP's ``ShardingStrategy`` has FULL_SHARD (ZeRO-3), SHARD_GRAD_OP (ZeRO-2)
  and NO_SHARD (DDP), no ZeRO-1; Megatron-LM's distributed optimizer (``--use-distributed-optimizer``)
  shards optimizer states only (ZeRO-1); DeepSpeed's pipeline engine refuses ZeRO stage 2 and 3
  (``PipelineEngine``: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"), so ZeRO-3 with
  pp > 1 is FSDP's (torchtitan's FSDP x PP, :mod:`lmcost.cost.pipeline`). ZeRO-2 with pp > 1 under
  DeepSpeed is not refused yet (n/v against a run).
- ``--ep-imbalance``: the busiest rank's tokens over the mean of ep ranks is at most ep (all tokens on one).
- ``--redundant-experts``: EPLB (DeepSeek-V3 technical report 3.4) adds replicas of hot experts on other
  ranks of the EP group; once every rank holds every expert (E x (ep - 1) replicas), another replica lands
  on a rank that already has its expert and balances nothing.
- ``--power-limit``: the lowest cap a GPU takes is :data:`MIN_POWER_FRACTION` of its TDP (nvidia-smi -q -d
  POWER prints Min Power Limit 200 W of 700 W on H100 SXM and 100 W of 400 W on A100 SXM4: n/v, the
  smaller fraction is kept, so no cap a driver takes is refused); above :data:`MAX_POWER_FRACTION` x TDP
  no GPU's cap is set (the default limit is the TDP; above it the clock is the sustained one anyway).
- mxfp8: MX block scaling (OCP Microscaling formats v1.0) runs on tensor cores with block-scaled MMA
  (Blackwell's 5th generation, AMD CDNA 4); the marker is an fp4 peak in the GPU YAML, which only those
  GPUs list (Hopper and Ada have fp8 without block scaling or fp4).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError

#: The lowest power cap as a fraction of TDP (module docstring: A100 SXM4's 100 of 400 W).
MIN_POWER_FRACTION = 0.25
#: The highest power cap as a multiple of TDP (module docstring).
MAX_POWER_FRACTION = 2.0


def known_recipes() -> tuple[str, ...]:
    """Every training precision recipe: the states recipes (lmcost.cost.optimizers.PRECISIONS) then the fp8
    ones (lmcost.cost.fp8_training.FP8_RECIPES)."""
    from lmcost.cost.fp8_training import FP8_RECIPES
    from lmcost.cost.optimizers import PRECISIONS

    return tuple(PRECISIONS) + tuple(FP8_RECIPES)


def check_recipe(precision: str) -> None:
    """Raises: LmcostError (precision) for a recipe that is neither a states nor an fp8 recipe, listing all."""
    if precision not in known_recipes():
        raise LmcostError("precision", f"unknown recipe {precision!r}", f"use one of {', '.join(known_recipes())}")


def check_setup(setup) -> None:
    """The checks of a :class:`lmcost.apps.train.TrainSetup` that need no model or GPU (module docstring).

    Raises: LmcostError (precision, zero, imbalance) for an unknown recipe, a ZeRO stage the
    framework does not run (FSDP's ZeRO-1, Megatron-LM's ZeRO-2, DeepSpeed's ZeRO-3 under pp > 1), or an
    imbalance above ep."""
    check_recipe(setup.precision)
    lay, fw = setup.layout, setup.framework_name
    if "dualpipe" in setup.overlap.split(",") and setup.schedule != "1f1b":
        raise LmcostError("overlap", f"dualpipe is a pipeline schedule of its own (DeepSeek-V3 report, 3.2.1), and "
                          f"`schedule` is {setup.schedule}", "drop `schedule` (1f1b), or drop dualpipe from `overlap`")
    if fw in ("fsdp", "fsdp-compile") and setup.zero == 1:
        raise LmcostError("zero", "PyTorch FSDP shards as ZeRO-3 (FULL_SHARD), ZeRO-2 (SHARD_GRAD_OP) or not at all "
                          "(NO_SHARD, DDP): it has no ZeRO-1 (`zero` 1 is the default)", "give `zero` 0, 2 or 3 with fsdp, or `framework` megatron")
    if setup.framework == "megatron" and setup.zero == 2:  # auto under ZeRO-2 stays the generic DP model
        raise LmcostError("zero", "Megatron-LM's distributed optimizer shards optimizer states only (ZeRO-1); it does "
                          "not shard gradients", "use `zero` 1 with megatron, or `framework` deepspeed or fsdp")
    if fw == "deepspeed" and setup.zero == 3 and lay.pp > 1:
        raise LmcostError("zero", "DeepSpeed's pipeline engine refuses ZeRO-3 with pp > 1",
                          "use `framework` fsdp, which runs ZeRO-3 with pipeline stages, or `zero` 1, or `pp` 1")
    if lay.imbalance > lay.ep:
        raise LmcostError("imbalance", f"{lay.imbalance:g} is the busiest rank's tokens over the mean of {lay.ep} "
                          f"expert-parallel ranks, which cannot pass {lay.ep} (every token on one rank)",
                          f"give 1 to {lay.ep}")


def check_step(cfg, gpu, setup, chunks: list) -> None:
    """The checks of a step against its model and GPU (module docstring): ``chunks`` are the layer
    indices of each model chunk (:func:`lmcost.operators.pipeline_split.chunk_layers`).

    Raises: LmcostError (recompute_layers, redundant_experts, power_limit, precision) for more layers to
    recompute than the largest stage (model chunk) has, more redundant experts than E x (ep - 1), a power
    cap outside MIN/MAX_POWER_FRACTION x TDP, or mxfp8 on a GPU without block-scaled tensor cores."""
    lay = setup.layout
    n = setup.recompute_layers
    if n is not None:
        most = max(len(c) for c in chunks)
        unit = "model chunk" if setup.virtual_stages > 1 else "stage"
        if n > most:
            raise LmcostError("recompute_layers", f"{n} layers to recompute, and the largest {unit} has {most}",
                              f"give 0 to {most} (layers of each {unit})")
    r = setup.redundant_experts
    if r and cfg.moe is not None and lay.ep > 1:
        most = cfg.moe.n_experts * (lay.ep - 1)
        if r > most:
            raise LmcostError("redundant_experts", f"{r} replicas, and with {cfg.moe.n_experts} experts over ep="
                              f"{lay.ep} every rank holds every expert after {most} (EPLB replicates hot experts on "
                              "other ranks)", f"give 0 to {most}")
    cap, tdp = setup.power_limit, gpu.tdp_w
    if cap is not None and tdp:
        lo, hi = MIN_POWER_FRACTION * tdp, MAX_POWER_FRACTION * tdp
        if not lo <= cap <= hi:
            raise LmcostError("power_limit", f"{cap:g} W is outside the caps {gpu.name} takes: {lo:g} W "
                              f"({MIN_POWER_FRACTION:.0%} of its {tdp:g} W TDP, as nvidia-smi's minimum) to {hi:g} W",
                              f"give {lo:g} to {hi:g} W, or leave the cap out")
    if setup.precision == "mxfp8" and "fp8" in gpu.peak_tflops and "fp4" not in gpu.peak_tflops:
        raise LmcostError("precision", f"mxfp8 needs block-scaled (MX) tensor cores, and {gpu.name} has none "
                          "(the marker: an fp4 peak, listed by Blackwell and CDNA 4 GPUs only)",
                          "use `precision` fp8-delayed, fp8-current or fp8-block, or a Blackwell GPU")


def check_peak(gpu, precision: str, dtype_of) -> None:
    """Raises: LmcostError (precision) if ``gpu`` has no peak for ``dtype_of(precision)`` (the dtype a recipe
    computes in outside its fp8 GEMMs: lmcost.apps.train's), naming the recipes it has peaks for, or that
    it has none."""
    dtype = dtype_of(precision)
    if dtype in gpu.peak_tflops:
        return
    from lmcost.cost.fp8_training import FP8_RECIPES

    ok = [p for p in known_recipes() if dtype_of(p) in gpu.peak_tflops
          and (p not in FP8_RECIPES or "fp8" in gpu.peak_tflops) and (p != "mxfp8" or "fp4" in gpu.peak_tflops)]
    what = f"{gpu.name} has no {dtype} peak, which {precision} computes in"
    if precision in FP8_RECIPES:
        what += " outside its fp8 GEMMs (the lm_head, attention, and MFU's denominator)"
    fix = (f"use `precision` {', '.join(ok)}" if ok else
           f"{gpu.name}'s YAML lists no peak any recipe computes in: add its peak_tflops, or use another GPU")
    raise LmcostError("precision", what, fix)


def say_unused_kernel(request, say) -> None:
    """Say, as ``lmcost estimate`` does, when ``attention_kernel``/``runtime`` change nothing: roofline times
    take no efficiency figure, and naive attention runs no flash kernel."""
    if request.time_model == "roofline" and (request.attention_kernel != "auto" or request.runtime != "auto"):
        say("note: `attention_kernel` and `runtime` choose efficiency figures: they change calibrated times only "
            "(add `time_model` calibrated)")
    if request.attention == "naive" and request.attention_kernel != "auto":
        say("note: `attention_kernel` names a flash kernel family; `attention` naive runs no flash kernel, so it is unused")
