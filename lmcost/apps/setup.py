"""What a run is set up from, before any costing: its precision, its quantization recipe, its parallel
layout checked against the nodes available, and the GPU's efficiency figures chosen.

Every command of the CLI and every Python caller that starts from names and options (``dtype="auto"``,
``quant="awq-g128"``, ``nodes=2``) resolves them here, once, by one rule each. Errors name the API
fields (``dtype``, ``quant``, ``nodes``); notes a caller may want to show go to ``say`` (one line each,
fields in backticks as errors write them).
"""

from __future__ import annotations

from typing import Callable

from lmcost.basics.dtypes import Precision, canonical
from lmcost.basics.errors import LmcostError
from lmcost.cost.optimizers import LoRA
from lmcost.operators.parallel import Layout, cluster_for
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.model.quant import effective, recipe

Say = Callable[[str], None]


def quiet(line: str) -> None:
    """The default ``say``: notes are dropped."""


def resolve_precision(dtype: str, weight_dtype: str | None = None, kv_dtype: str | None = None,
                      gpus: tuple[GPU, ...] | list[GPU] = (), say: Say = quiet) -> Precision:
    """The run's precision from a dtype and optional overrides of the weights' and the KV cache's.

    The one default rule: ``dtype="auto"`` is bf16, or fp16 where a GPU of ``gpus`` has no bf16 peak (a
    V100), or fp32 where one has neither; the choice is said when it is not bf16. An override given empty
    is a mistake, not "the default": only an absent one (None) falls back to ``dtype``.

    Returns: Precision(weights, activations, kv_cache), dtype names.
    Raises: LmcostError (dtype, weight_dtype, kv_dtype) for an unknown dtype name; (dtype) for ``auto``
    where the GPUs share none of bf16, fp16 and fp32 (an MI355X, whose sources give fp8 and fp4 only).
    """
    if dtype == "auto":
        dtype = next((d for d in ("bf16", "fp16", "fp32") if all(d in g.peak_tflops for g in gpus)), None)
        if dtype is None:  # a datasheet giving no 16-bit or fp32 peak (MI355X: fp8 and fp4 only)
            bare = next((g for g in gpus if not {"bf16", "fp16", "fp32"} & set(g.peak_tflops)), None)
            if bare is None:
                raise LmcostError("dtype", f"{', '.join(g.name for g in gpus)} share no bf16, fp16 or fp32 peak",
                                  "give `dtype`, one that each GPU has")
            raise LmcostError("dtype", f"{bare.name} has no bf16, fp16 or fp32 peak in its sources", bare.dtype_fix())
        if dtype != "bf16":
            lacking = ", ".join(g.name for g in gpus if "bf16" not in g.peak_tflops)
            say(f"note: {lacking} has no bf16 peak: using {dtype} (`dtype` to choose)")
    canonical(dtype, "dtype")
    for value, field in ((weight_dtype, "weight_dtype"), (kv_dtype, "kv_dtype")):
        if value is not None:
            canonical(value, field)
    return Precision(weights=dtype if weight_dtype is None else weight_dtype, activations=dtype,
                     kv_cache=dtype if kv_dtype is None else kv_dtype)


def check_quant(cfg: ArchConfig, quant: str | None, weight_dtype: str | None = None,
                gpus: tuple[GPU, ...] | list[GPU] = ()) -> None:
    """Refuse a quantization recipe that cannot run as asked, naming ``quant``; run before the precision is
    resolved (:func:`resolve_precision`), so a recipe the user gave is blamed for its own fault, not ``dtype``'s
    default (an MI355X, whose sources give no 16-bit peak, refuses the default dtype too).

    Refused: an unknown recipe; ``quant`` with ``weight_dtype``; mxfp4 on a model without routed experts
    (mxfp4 stores experts only, as gpt-oss); and a recipe in NVFP4 (nvfp4, given or the model's own) on a GPU of
    ``gpus`` whose FP4 tensor cores run another block format (:attr:`lmcost.hardware.gpu.GPU.fp4_format`: MXFP4
    on AMD CDNA 4, the MI355X): NVFP4's 16-value blocks with E4M3 scales are not MXFP4's 32-value blocks with
    E8M0 scales (OCP MX v1.0; /work/shared/quant-formats.md), so that GPU's fp4 peak is not NVFP4's. A GPU with
    no fp4 peak is not refused: the recipe is costed weight-only there (:func:`say_gemm_compute` says so).
    Raises: LmcostError (quant) for each of these."""
    if quant is not None:
        if weight_dtype is not None:
            raise LmcostError("quant", "cannot be given with `weight_dtype`",
                              "give one: a recipe per tensor (`quant`) or one dtype for every weight (`weight_dtype`)")
        name = recipe(quant).name
        if name == "mxfp4" and cfg.moe is None:
            mx = next((g for g in gpus if "fp4" in g.peak_tflops and g.fp4_format != "NVFP4"), None)
            raise LmcostError("quant", f"mxfp4 stores routed experts only (as gpt-oss), and {cfg.name} has none",
                              "use nvfp4 for 4-bit weights everywhere" if mx is None else
                              f"use awq-g128 or gptq-g128 for 4-bit weights everywhere ({mx.name} runs no nvfp4)")
    else:
        name = cfg.quant if weight_dtype is None else None
    rec = recipe(name) if name else None
    fp4 = {rec.rules.get(k) for k in rec.kinds} & {"NVFP4"} if rec is not None and rec.rules else set()
    for gpu in gpus if fp4 else ():
        if "fp4" in gpu.peak_tflops and gpu.fp4_format != "NVFP4":
            whose = "" if quant is not None else f" ({cfg.name}'s own recipe)"
            raise LmcostError("quant", f"{name}{whose} stores NVFP4 (16 e2m1 per e4m3 scale), and {gpu.name}'s FP4 "
                              f"tensor cores run {gpu.fp4_format} (32 e2m1 per e8m0 scale), so no kernel runs it at "
                              "its fp4 peak", "use an fp8 recipe (fp8-tensor, fp8-channel, fp8-block128), mxfp4 for "
                              "a model with routed experts, or a GPU with NVFP4 (B200, B300, GB200, GB300, RTX PRO 6000)")


def resolve_quant(cfg: ArchConfig, quant: str | None, weight_dtype: str | None = None,
                  say: Say = quiet, gpus: tuple[GPU, ...] | list[GPU] = ()) -> tuple[ArchConfig, str | None]:
    """(config, recipe name) of a run: ``quant`` is checked (:func:`check_quant`, on ``gpus``) and refused with
    ``weight_dtype``; an explicit ``weight_dtype`` replaces the config's own recipe (the run asks for one dtype
    for every weight).

    Raises: LmcostError (quant): see :func:`check_quant`.
    """
    check_quant(cfg, quant, weight_dtype, gpus)
    if quant is not None:
        return cfg, recipe(quant).name
    if weight_dtype is not None and cfg.quant:
        say(f"note: `weight_dtype` {weight_dtype} replaces {cfg.name}'s own recipe {cfg.quant}")
        return cfg.model_copy(update={"quant": None}), None
    return cfg, None


def say_gemm_compute(cfg: ArchConfig, quant: str | None, gpu: GPU, precision: Precision, say: Say = quiet) -> None:
    """Say so, in one line, when the recipe that applies (``quant``, else the config's own) has a compute
    dtype of its own (fp8 W8A8, NVFP4 W4A4, MXFP4 W4A8) that ``gpu`` lacks the tensor peak for: its GEMMs
    are then costed weight-only at the activation dtype's peak (:meth:`lmcost.model.quant.Recipe.gemm_dtype`,
    as vLLM runs such weights through its Marlin kernels), not refused."""
    q = effective(cfg, quant)
    if not q:
        return
    rec = recipe(q)
    got = rec.gemm_dtype(gpu.peak_tflops, precision.activations)
    if rec.compute and got != rec.compute:  # Marlin is CUDA-only: on an AMD GPU say what is costed, not whose kernel
        how = "the weights dequantized in the kernel" if gpu.vendor.strip().lower() == "amd" else "as vLLM's Marlin kernels run them"
        say(f"note: {gpu.name} has no {rec.native} peak: {q} GEMMs are costed weight-only at the {got} peak "
            f"(W{'8' if rec.native == 'fp8' else '4'}A16, {how}), not at {rec.compute}")


def say_uncalibrated(gpu: GPU, time_model: str, say: Say = quiet) -> None:
    """Say so when the calibrated time model meets a GPU without an efficiency block (its times are then
    the roofline's), and under either time model when the GPU has no fp32 (vector) peak (its norms,
    softmax and elementwise kernels are then bounded by their bytes alone: :attr:`GPU.vector_flops`)."""
    if time_model == "calibrated" and gpu.efficiency is None:
        say(f"note: {gpu.name} has no efficiency block: calibrated times equal the roofline "
            "(no published kernel timings fitted for it; lmcost fit --table fits one from yours, lmcost calibrate "
            "measures one for a local device)")
    if "fp32" not in gpu.peak_tflops:
        say(f"note: {gpu.name} has no fp32 (vector) peak in its sources: norms, softmax and elementwise "
            "kernels are timed on their bytes alone")


def weights_label(precision: Precision, cfg: ArchConfig, quant: str | None) -> str:
    """What the weights are stored in, for a header line: ``awq-g128 recipe`` or a dtype name."""
    q = effective(cfg, quant)
    return f"{q} recipe" if q else precision.weights


def checked_layout(gpu: GPU, *, tp: int = 1, pp: int = 1, ep: int = 1, dp: int = 1, cp: int = 1, sp: bool = False,
                   imbalance: float = 1.0, cluster: str | None = None, nodes: int | None = None) -> Layout:
    """The parallel layout, checked against its cluster: it must fit in ``nodes`` x GPUs per node when
    ``nodes`` is given; an unknown cluster, or a GPU without a node, is refused before any costing.

    Raises: LmcostError (nodes) for nodes outside 1..65,536 or a layout needing more GPUs than the nodes
    hold; (cluster, nodes) either given for one GPU (nothing crosses a link); the errors of :class:`Layout`
    and :func:`cluster_for`.
    """
    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp, cp=cp, imbalance=imbalance, cluster=cluster, sp=sp)
    for field, value in (("cluster", cluster), ("nodes", nodes)):
        if value is not None and layout.single:
            raise LmcostError(field, "one GPU runs no collectives, so the cluster and its nodes change nothing",
                              "drop it, or spread the model with `tp`, `pp`, `ep`, `dp` or `cp`")
    if nodes is not None:
        if not 1 <= nodes <= 65536:
            raise LmcostError("nodes", f"must be from 1 to 65,536, got {nodes}", "give the nodes available")
        node = cluster_for(layout, gpu)
        if layout.gpus > nodes * node.gpus_per_node:
            raise LmcostError("nodes", f"{layout.describe()} needs {layout.gpus} GPUs, {nodes} x {node.name} has "
                              f"{nodes * node.gpus_per_node}", "raise `nodes` or shrink the layout")
    elif cluster is not None or not layout.single:
        cluster_for(layout, gpu)
    return layout


def select_efficiency(gpu: GPU, kernel: str | None = None, runtime: str | None = None,
                      engine: str | None = None, designs: bool = True) -> GPU:
    """``gpu`` with its efficiency block's serving engine, attention kernel family and runtime chosen.

    ``engine``: None or ``auto``, the block as shipped, except that with ``designs`` (``op``, ``estimate``,
    ``plan``, ``report``; not ``train``, whose steps run PyTorch's kernels, nor ``serve``, whose engine overheads
    were fitted on the block's own figures) and the runtime auto on a GPU whose block is a shipped fit
    (:func:`shipped_fit`), norms, gated activations, RoPE and adds are timed as the default serving engine runs them
    (:data:`lmcost.hardware.engine_memory.AUTO_STACK`'s kernel designs, :meth:`Efficiency.with_memory_designs`);
    ``torch``, the block's own figures with no engine overlay (the kernels PyTorch and the published tables run);
    ``vllm``, ``sglang``, ``trtllm`` (optionally ``name@version``), the block with that engine's profile
    overlaid (:meth:`Efficiency.with_engine`), its norm, activation and RoPE kernels as their designs
    (:func:`lmcost.hardware.engine_memory.engine_memory_figures`). The engine is applied first, then kernel and runtime.
    Under auto and torch with the runtime auto, the norm and elementwise bands span the spread of the kernels
    stacks run (:func:`lmcost.hardware.engine_memory.stack_spread`): the times stay the block's, only the bands widen.
    Under a serving engine, ``own_bands`` holds those auto/torch bands: an op the engine's designs do not cost
    (LayerNorm, which engines run as PyTorch's) keeps its torch time and band (:func:`lmcost.cost.timing.statics`).

    Raises: LmcostError (efficiency.kernel, runtime) for a family or runtime the GPU has no figures of (listing those
    it has), or for a choice other than auto on a GPU without an efficiency block; (engine) for an engine or
    version the GPU has no profile of (listing the profiles it has).
    """
    name, version = _engine_name(engine)
    if gpu.efficiency is None:
        if name not in (None, "auto", "torch"):
            raise LmcostError("engine", f"{gpu.name} has no efficiency block, so no {name!r} profile",
                              "use auto or torch (times are the roofline), or a GPU with engine profiles")
        for field, v in (("efficiency.kernel", kernel), ("runtime", runtime)):
            if v not in (None, "auto"):
                raise LmcostError(field, f"{gpu.name} has no efficiency block, so no figures for {v!r}",
                                  "drop it (times are the roofline), or use a GPU with one (lmcost fit)")
        return gpu
    eff = gpu.efficiency
    if name not in (None, "auto", "torch"):
        from lmcost.hardware.engine_memory import engine_memory_figures

        eff = eff.with_engine(name, version, engine_memory_figures(name))
    elif version is not None:
        raise LmcostError("engine", f"{name} takes no version", f"use {name} alone")
    eff = eff.select(kernel, runtime)
    if name not in (None, "auto", "torch"):  # ops the engine's designs do not cost keep torch's bands
        eff = eff.model_copy(update={"own_bands": select_efficiency(gpu, kernel, runtime, "torch").efficiency.bands})
    elif eff.runtime == "auto":  # which kernel a stack runs is not known
        from lmcost.hardware.engine_memory import AUTO_STACK, engine_memory_figures, stack_spread, widen_by_spread

        torch_eff = widen_by_spread(eff, stack_spread("torch"))
        if name == "torch" or not designs or not shipped_fit(eff):
            eff = torch_eff
        else:  # ops the designs do not cost (LayerNorm) keep torch's time and band
            eff = eff.with_memory_designs(*engine_memory_figures(AUTO_STACK), AUTO_STACK)
            eff = widen_by_spread(eff, stack_spread("auto")).model_copy(update={"own_bands": torch_eff.bands})
    return gpu.model_copy(update={"efficiency": eff})


#: The tables whose fits lmcost ships (``efficiency.fit.table`` of a GPU file): the public kernel table's and the
#: engines' pooled one. A block fitted on a table of one's own, or measured by ``lmcost calibrate``, is not one.
SHIPPED_FIT_TABLES = ("public-kernels.csv", "engine-kernels.csv")


def shipped_fit(eff) -> bool:
    """Whether efficiency block ``eff`` is one lmcost ships, fitted on :data:`SHIPPED_FIT_TABLES` (so ``auto``'s
    serving-engine designs apply to it), rather than a fit of one's own table or a calibrate run's."""
    table = str((eff.fit or {}).get("table", "")).split(",")[0].strip()
    return table in SHIPPED_FIT_TABLES and not eff.conditions


def _engine_name(engine: str | None) -> tuple[str | None, str | None]:
    """(name, version) of ``vllm@0.24.0`` / ``vllm`` / None. Raises: LmcostError (engine) for an empty name."""
    if engine is None:
        return None, None
    name, at, version = engine.strip().partition("@")
    name = name.strip().lower()
    if not name or (at and not version.strip()):
        raise LmcostError("engine", f"{engine!r} names no engine" if not name else f"{engine!r} gives no version after @",
                          "use auto, torch, vllm, sglang or trtllm, optionally name@version")
    return name, (version.strip() if at else None)


#: Why a fusion can change nothing in a model (:func:`fusions_in_effect`).
_FUSION_NEEDS = {"silu_mul": "it has no gated FFN", "gate_up": "it has no gated FFN (gate and up projections)",
                 "moe_grouped": "it has no routed experts", "qkv": "it has no separate Q, K, V projections",
                 "add_norm": "it has no residual add followed by a norm",
                 "rope_attention": "it has no RoPE, or attention is naive (the fused rotary runs inside the flash kernel)"}


def fusions_in_effect(cfg: ArchConfig, fusion: tuple[str, ...], kernel: str = "flash") -> tuple[str, ...]:
    """The fusions of ``fusion`` that change some operator of ``cfg``: each is applied alone (with silu_mul,
    the graph's default) to the ops of a small prefill and kept if the ops differ. ``moe_grouped`` on a
    dense model or ``silu_mul`` on GPT-2's plain GELU changes nothing, and is left out.

    Returns: the names, in ``fusion``'s order."""
    from lmcost.operators.forward import Dims, forward_ops
    from lmcost.operators.fusion import apply_fusion

    if not fusion:
        return ()
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 2, 16, 16), kernel, "naive", "all")
    unfused = apply_fusion(ops, (), kernel)
    return tuple(f for f in fusion
                 if (apply_fusion(ops, ("silu_mul", f), kernel) != ops if f != "silu_mul" else unfused != ops))


def check_fusion(cfg: ArchConfig, text: str, fusion: tuple[str, ...], kernel: str = "flash") -> tuple[str, ...]:
    """The fusions of ``fusion`` (parsed from ``text``) in effect on ``cfg`` (:func:`fusions_in_effect`);
    a fusion named in ``text`` by its own name (not through a preset such as ``all``) that changes nothing
    is refused.

    Raises: LmcostError (fusion) naming it and why it changes nothing."""
    named = [p.strip() for p in text.split(",") if p.strip() in _FUSION_NEEDS]
    applied = fusions_in_effect(cfg, fusion, kernel)
    for name in named:
        if name not in applied:
            raise LmcostError("fusion", f"{name} changes no operator of {cfg.name}: {_FUSION_NEEDS[name]}",
                              "drop it (the presets vllm and all fuse whatever applies)")
    return applied


def check_vision(cfg: ArchConfig, vision: bool) -> None:
    """Refuse a vision tower asked of a model that has none lmcost counts.

    Raises: LmcostError (vision) if ``vision`` and ``cfg`` has no vision parameters."""
    if vision and not cfg.vision_params:
        raise LmcostError("vision", f"{cfg.name} has no vision tower lmcost counts",
                          "drop `vision` (a Gemma 3 config.json with its vision_config has one)")


def lora_adapters(rank: int | None, targets: str | None = None, qlora: bool = False) -> LoRA | None:
    """The LoRA adapters of a training run, or None for full training: ``rank`` r, ``targets`` the
    projections that get adapters (comma-separated; default q,k,v,o), ``qlora`` a frozen base in 4-bit
    NF4 (else bf16).

    Raises: LmcostError (lora_targets, qlora) for targets or QLoRA without a rank, or targets given with an
    empty name (``""``, ``q,,k``: an empty list is not the default list)."""
    if targets is not None and rank is None:
        raise LmcostError("lora_targets", "names the projections of LoRA adapters, and no rank is given",
                          "add `lora_rank`, e.g. 16")
    if targets is not None and not all(t.strip() for t in targets.split(",")):
        raise LmcostError("lora_targets", "empty" if not targets.strip() else f"{targets!r} has an empty name",
                          "name the projections, comma-separated (e.g. q,k,v,o), or drop it for q,k,v,o")
    if rank is None and not qlora:
        return None
    if rank is None:
        raise LmcostError("qlora", "needs the adapters' rank", "add `lora_rank`, e.g. 16")
    targets = targets or "q,k,v,o"
    return LoRA(rank=rank, targets=tuple(t.strip() for t in targets.split(",") if t.strip()),
                base_dtype="int4" if qlora else "bf16")
