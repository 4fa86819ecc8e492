"""The estimate: parameters, KV cache, memory, and prefill/decode times for one workload.

This is the Python API the CLI renders::

    from lmcost import load_config, load_gpu, estimate, Workload
    est = estimate(load_config("llama-3-8b"), load_gpu("h100"), Workload(batch=8, prompt=2048, gen=256))
    est.prefill["flops"]    # exact int
    est.op_classes          # pandas DataFrame (built when asked): phase, op_class, flops, bytes, time_s, shares
    est.to_dict()           # the JSON of `lmcost estimate --json`

and, for sweeps, :func:`lmcost.cost.phases.grid` evaluates one phase over arrays of batch sizes and contexts at once.

Phases: prefill runs b sequences of s = prompt tokens (t = s). A decode step runs b sequences of one
token at context t. The first generated token comes out of prefill (TTFT = prefill time); each of
the remaining gen - 1 tokens costs one decode step at t = prompt + 1, ..., prompt + gen - 1, and
TPOT is their mean. ``decode`` reports one step at the final context t = prompt + gen.

Modules: the inputs and their checks are :mod:`lmcost.operators.workload`; phases, records and totals are
:mod:`lmcost.cost.phases`; TTFT, TPOT, throughput and memory are the serving point
(:mod:`lmcost.cost.serving`); this module only assembles the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lmcost.apps.engine_choice import engine_record
from lmcost.apps.setup import (Say, check_fusion, check_quant, check_vision, checked_layout, quiet, resolve_precision,
                               resolve_quant, say_gemm_compute, say_uncalibrated)
from lmcost.model.config import ArchConfig
from lmcost.model.quant import recipe
from lmcost.basics.dtypes import Precision
from lmcost.hardware.gpu import GPU
from lmcost.cost.kvcache import kv_bytes_per_token, state_bytes_per_sequence
from lmcost.cost.params import param_counts
from lmcost.cost.serving import pipeline_fill, serving_point
from lmcost.operators.parallel import cluster_for
# Re-exported for callers of the API before the split into workload / phases / estimate (issue 10).
from lmcost.cost.compile import phase_ops, phase_records  # noqa: F401
from lmcost.cost.phases import PhaseCost, grid, op_table, op_totals, phase_totals  # noqa: F401
from lmcost.cost.steps import time_over_steps
from lmcost.operators.assembly import ALL_PHASES, PHASES, phase_dims  # noqa: F401
from lmcost.operators.workload import (MAX_COUNT, MAX_GEN, Settings, Workload, check_api_types, check_count,  # noqa: F401
                       check_mla, check_positions, require_decoder)


@dataclass
class Estimate:
    """Everything ``lmcost estimate`` reports, in base units (FLOPs, bytes, seconds)."""

    model: str
    gpu: str
    precision: Precision
    workload: Workload
    settings: Settings
    params: dict
    kv_cache: dict
    memory: dict
    ttft_s: float
    tpot_s: float
    throughput_tokens_per_s: float
    phases: tuple = field(repr=False)
    #: Under the calibrated model, the expected error band of TTFT and TPOT (s): (low, high); else None.
    ttft_band_s: tuple | None = None
    tpot_band_s: tuple | None = None
    #: The efficiency block's attention kernel family and runtime (None: the GPU has no block).
    selection: tuple | None = None
    #: The cluster a parallel layout's collectives run on (None on one GPU).
    cluster: str | None = None
    #: The recipe the weights are stored in: the settings', else the config's (:func:`lmcost.model.quant.effective`).
    quant: str | None = None
    #: The engine and where the kernel figures came from (:func:`lmcost.apps.engine_choice.engine_record`: auto's
    #: where no engine was given, as :func:`estimate` sets it), added to the JSON's settings; None: nothing added.
    engine: dict | None = None
    #: The dtype whose peak the recipe's quantized GEMMs run at on this GPU (:meth:`lmcost.model.quant.Recipe.gemm_dtype`;
    #: None without a recipe): in the JSON's settings as ``gemm_compute`` where a recipe applies.
    gemm_compute: str | None = None

    @cached_property
    def prefill(self) -> dict:
        """The prefill's totals (:meth:`lmcost.cost.phases.PhaseCost.summary`): FLOPs, bytes, intensity, both
        models' times, bound. Computed when first read, with the other time model's per-op times."""
        return self.phases[0].summary()

    @cached_property
    def decode(self) -> dict:
        """One decode step's totals at the final context, as :attr:`prefill`."""
        return self.phases[1].summary()

    @cached_property
    def rows(self) -> list[dict]:
        """One row per operator of both phases (:meth:`lmcost.cost.phases.PhaseCost.rows`)."""
        return [r for p in self.phases for r in p.rows()]

    @cached_property
    def ops(self):
        """:attr:`rows` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    @cached_property
    def class_rows(self) -> list[dict]:
        """Per phase and operator class: FLOPs, bytes, time and shares (:meth:`lmcost.cost.phases.PhaseCost.classes`)."""
        return [c for p in self.phases for c in p.classes()]

    @cached_property
    def op_classes(self):
        """:attr:`class_rows` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.class_rows)

    def to_dict(self) -> dict:
        """The JSON contract of ``estimate --json`` (plain Python types, base units)."""
        plain = (int, str, bool, type(None))

        def clean(v):
            t = type(v)
            if t in plain:
                return v
            if t is dict:
                return {k: clean(x) for k, x in v.items()}
            if t is list:
                return [clean(x) for x in v]
            if isinstance(v, (np.floating, np.integer)):
                v = v.item()
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return v

        out = clean(dict(
            model=self.model, gpu=self.gpu,
            precision=dict(weights=self.precision.weights, activations=self.precision.activations,
                           kv_cache=self.precision.kv_cache),
            workload=dict(batch=self.workload.batch, prompt=self.workload.prompt, gen=self.workload.gen,
                          context=self.workload.context),
            settings=dict(attention=self.settings.kernel, mla=self.settings.mla, logits=self.settings.logits,
                          model=self.settings.model, fusion=list(self.settings.fusion),
                          quant=self.quant, **({"gemm_compute": self.gemm_compute} if self.quant else {}),
                          layout=dict(tp=self.settings.layout.tp, pp=self.settings.layout.pp,
                                      ep=self.settings.layout.ep, dp=self.settings.layout.dp,
                                      cp=self.settings.layout.cp, sp=self.settings.layout.sp,
                                      gpus=self.settings.layout.gpus, ep_imbalance=self.settings.layout.imbalance,
                                      cluster=self.cluster,
                                      batch_per_gpu=self.settings.layout.microbatch(self.workload.batch)),
                          attention_kernel=self.selection[0] if self.selection else None,
                          runtime=self.selection[1] if self.selection else None, **(self.engine or {})),
            params=self.params, kv_cache=self.kv_cache, memory=self.memory,
            prefill=self.prefill, decode=self.decode, ttft_s=self.ttft_s, tpot_s=self.tpot_s,
            ttft_low_s=self.ttft_band_s[0] if self.ttft_band_s else None,
            ttft_high_s=self.ttft_band_s[1] if self.ttft_band_s else None,
            tpot_low_s=self.tpot_band_s[0] if self.tpot_band_s else None,
            tpot_high_s=self.tpot_band_s[1] if self.tpot_band_s else None,
            throughput_tokens_per_s=self.throughput_tokens_per_s))
        # Class rows are built of Python numbers already (exact sums, fsum'd times, float shares).
        out["op_classes"] = [dict(r) for r in self.class_rows]
        return out


def estimate(cfg: ArchConfig, gpu: GPU, workload: Workload = Workload(), precision: Precision = Precision(),
             settings: Settings = Settings()) -> Estimate:
    """Parameters, KV cache, memory, prefill and decode costs and times of ``workload`` on ``gpu``, with its
    efficiency figures as given (a loaded GPU's block as shipped: ``--engine torch``; the CLI's default, auto, is
    :func:`lmcost.apps.engine_choice.choose_engine` (gpu, None), which times norms and activations as vLLM's designs).

    TTFT, TPOT, throughput and memory are the serving point of the workload
    (:func:`lmcost.cost.serving.serving_point`, which ``plan`` asks too): memory is weights + KV cache at
    the final context + the activation peak of prefill (:mod:`lmcost.cost.memory`). FLOPs and bytes are
    exact ints. Under a quantization recipe (``settings.quant``, else ``cfg.quant``:
    :func:`lmcost.model.quant.effective`) weight bytes read and held follow it.
    Raises: LmcostError if the GPU has no peak for the activation dtype, or the context exceeds a
    learned position table, or the layout does not split the model or the batch; TypeError if an
    argument is not the kind of object named.
    """
    check_api_types(cfg, gpu, precision, settings, workload)
    wl, layout = workload, settings.layout
    point = serving_point(cfg, gpu, precision, settings, batch=wl.batch, isl=wl.prompt, osl=wl.gen)
    pre_cost, dec_cost = point.phases
    ttft_band = tpot_band = None
    if settings.model == "calibrated" and gpu.efficiency is not None and gpu.efficiency.bands:
        # each op's band summed over ops (errors within a class move together)
        fill, every = pipeline_fill(layout), range(pre_cost.rec.n_ops)
        lo, hi = (pre_cost.total_of(every, k) for k in ("calibrated_low_s", "calibrated_high_s"))
        ttft_band = (min(point.ttft_s, fill * max(lo, pre_cost.total_of(every, "roofline_s"))), fill * hi)
        if wl.gen > 1:
            b = layout.microbatch(wl.batch)
            tpot_band = tuple(time_over_steps(cfg, gpu, precision, "decode", b, wl.prompt + 1,
                                              wl.prompt + wl.gen - 1, settings, dec_cost, key=k) / (wl.gen - 1)
                              for k in ("calibrated_low_s", "calibrated_high_s"))
    mem = point.memory
    return Estimate(
        model=cfg.name, gpu=gpu.name, precision=precision, workload=wl, settings=settings,
        params=param_counts(cfg, precision),
        kv_cache=dict(bytes_per_token=kv_bytes_per_token(cfg, precision), bytes_total=mem.kv_cache_bytes,
                      state_bytes_per_sequence=state_bytes_per_sequence(cfg, precision),
                      context=wl.context, batch=wl.batch),
        memory=dict(**mem.to_dict(), capacity_bytes=gpu.memory_bytes, fits=point.fits),
        ttft_s=point.ttft_s, tpot_s=point.tpot_s, throughput_tokens_per_s=point.tokens_per_s,
        phases=point.phases, ttft_band_s=ttft_band, tpot_band_s=tpot_band,
        selection=(gpu.efficiency.kernel, gpu.efficiency.runtime) if gpu.efficiency is not None else None,
        cluster=None if layout.single else cluster_for(layout, gpu).name, quant=point.quant,
        gemm_compute=recipe(point.quant).gemm_dtype(gpu.peak_tflops, precision.activations) if point.quant else None,
        engine=engine_record(gpu, None))  # auto's: gpu's own figures (run_estimate records an engine given)


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimateRequest:
    """One ``lmcost estimate`` run, from names and options.

    ``model``/``gpu``: a shipped name or a path (or a loaded ArchConfig/GPU); ``batch``, ``prompt``,
    ``gen``: the :class:`Workload` (sequences, tokens); ``dtype`` ... ``quant``: as
    :func:`lmcost.apps.setup.resolve_precision` and :func:`~lmcost.apps.setup.resolve_quant`;
    ``attention``: flash or naive; ``mla``: auto, absorbed or naive; ``logits``: all or last;
    ``time_model``: roofline or calibrated; ``fusion``: a fusion spec (:func:`lmcost.operators.fusion.parse_fusion`;
    None: the engine's fusions, else ``default``); ``attention_kernel``/``runtime``: the efficiency figures chosen
    (:func:`lmcost.apps.setup.select_efficiency`); ``engine``: auto, torch, vllm, sglang or trtllm (``@version``
    optional): the engine's kernel figures and fusions (:func:`lmcost.apps.engine_choice.choose_engine`; None: not
    given, as auto, and not recorded);
    ``tp`` ... ``nodes``: the parallel layout (:func:`lmcost.apps.setup.checked_layout`); ``vision``: a
    multimodal model's tower in memory too; ``detail``: also the FLOPs formula of every operator of one layer.
    """

    model: str | ArchConfig
    gpu: str | GPU = "h100"
    batch: int = 1
    prompt: int = 512
    gen: int = 256
    dtype: str = "auto"
    weight_dtype: str | None = None
    quant: str | None = None
    kv_dtype: str | None = None
    attention: str = "flash"
    mla: str = "auto"
    logits: str = "all"
    time_model: str = "roofline"
    fusion: str | None = None
    attention_kernel: str = "auto"
    runtime: str = "auto"
    engine: str | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    imbalance: float = 1.0
    cluster: str | None = None
    nodes: int | None = None
    sp: bool = False
    cp: int = 1
    vision: bool = False
    detail: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimateResult:
    """What :func:`run_estimate` found: the model as costed (recipe resolved), the GPU (efficiency figures
    chosen), the precision, the recipe asked for, the settings, the :class:`Estimate`, and with
    ``detail`` the FLOPs formula of each operator row of each phase (``{phase: [formula, ...]}``, in the
    order of :attr:`Estimate.rows`; else None). ``fused``: the fusions of the settings that change some
    operator of the model (:func:`lmcost.apps.setup.fusions_in_effect`; a preset's others change nothing).
    ``engine``: the engine chosen (:class:`lmcost.apps.engine_choice.EngineChoice`; None: ``engine`` not given)."""

    cfg: ArchConfig
    gpu: GPU
    precision: Precision
    quant: str | None
    settings: Settings
    estimate: Estimate
    formulas: dict[str, list[str]] | None
    fused: tuple[str, ...] = ()
    engine: object = None


def run_estimate(request: EstimateRequest, say: Say = quiet) -> EstimateResult:
    """Load, resolve and check what ``request`` names, say what the numbers cover, and :func:`estimate`.

    Notes (to ``say``): a dtype or recipe resolved (:mod:`lmcost.apps.setup`), a multimodal model costed
    as its decoder, efficiency choices that change nothing under the roofline or with naive attention,
    phases the chosen kernel family has no figures for, a GPU without figures under the calibrated
    model, and a context past the trained one.
    Raises: LmcostError for an unknown model, GPU, cluster, dtype, recipe, fusion, kernel family,
    runtime or engine, an engine the GPU has no profile of (:func:`lmcost.apps.engine_choice.choose_engine`), a layout that does not fit ``nodes``, ``cluster`` or ``nodes`` on one GPU, ``vision`` on a
    model without a tower, ``mla`` other than auto on a model without MLA, a fusion named that changes
    nothing in the model, and the errors of :func:`estimate`.
    """
    from lmcost.apps.engine_choice import choose_engine, engine_fusion, say_figures
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.fusion import parse_fusion
    from lmcost.operators.workload import past_trained_context

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    hw, engine = choose_engine(r.gpu if isinstance(r.gpu, GPU) else load_gpu(r.gpu), r.engine, r.attention_kernel,
                               r.runtime)
    fusion = engine_fusion(engine, r.fusion, cfg.norm)
    layout = checked_layout(hw, tp=r.tp, pp=r.pp, ep=r.ep, dp=r.dp, cp=r.cp, sp=r.sp, imbalance=r.imbalance,
                            cluster=r.cluster, nodes=r.nodes)  # refused before any note
    check_quant(cfg, r.quant, r.weight_dtype, [hw])  # before the dtype: a recipe given is blamed for its own fault
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, [hw], say)
    cfg, quant = resolve_quant(cfg, r.quant, r.weight_dtype, say)
    say_gemm_compute(cfg, quant, hw, precision, say)
    settings = Settings(kernel=r.attention, mla=r.mla, logits=r.logits, model=r.time_model,
                        fusion=parse_fusion(fusion), layout=layout, quant=quant, vision=r.vision)
    check_mla(cfg, r.mla)
    # an engine's fusions are a preset: one that changes nothing in this model (moe_grouped, dense) is left out
    fused = check_fusion(cfg, r.fusion or "default", settings.fusion, r.attention)
    check_vision(cfg, r.vision)
    if "tower" in cfg.source and not r.vision:  # a multimodal wrapper: say what the numbers cover
        say(f"note: {cfg.name} is costed as its decoder ({cfg.source.split('(', 1)[-1].rstrip(')')})"
            + ("; `vision` adds the tower's weights to memory" if cfg.vision_params else ""))
    if r.time_model == "roofline" and (r.attention_kernel != "auto" or r.runtime != "auto"):
        say("note: `attention_kernel` and `runtime` choose efficiency figures: they change calibrated times only "
            "(add `time_model` calibrated)")
    for p in (hw.efficiency.phases_without() if hw.efficiency is not None else []):
        say(f"note: {hw.name} has no {p} figures for {r.attention_kernel}: {p} attention takes auto's")
    if r.attention == "naive" and hw.efficiency is not None and hw.efficiency.kernel != "auto":
        say("note: `attention_kernel` names a flash kernel family; `attention` naive runs no flash kernel, so it is unused")
    est = estimate(cfg, hw, Workload(r.batch, r.prompt, r.gen), precision, settings)
    est.engine = engine_record(hw, engine)
    say_uncalibrated(hw, r.time_model, say)
    say_figures(hw, engine, say, r.time_model == "calibrated")
    note = past_trained_context(cfg, r.prompt + r.gen)
    if note:
        say(note)
    formulas = None
    if r.detail:
        from lmcost.cost.formulas import show, symbolic_ops

        formulas = {}
        for phase in ("prefill", "decode"):
            sym = {op.name: op for op in symbolic_ops(cfg, phase, precision, r.attention, settings.mla_for(phase),
                                                      r.logits, settings.fusion)}
            formulas[phase] = [show(sym[row["name"]].flops) for row in est.rows if row["phase"] == phase]
    return EstimateResult(cfg=cfg, gpu=hw, precision=precision, quant=quant, settings=settings, estimate=est,
                          formulas=formulas, fused=fused, engine=engine)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExplainRequest:
    """One ``lmcost explain`` run: the formulas of every operator of one layer of ``model`` (a shipped name,
    a path or a loaded ArchConfig) in ``phase`` (prefill: t = s; decode: s = 1); ``dtype`` ...
    ``kv_dtype``: as :func:`lmcost.apps.setup.resolve_precision` (auto: bf16); ``attention``: flash or
    naive; ``mla``: auto, absorbed or naive; ``logits``: all or last."""

    model: str | ArchConfig
    phase: str = "decode"
    dtype: str = "auto"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    attention: str = "flash"
    mla: str = "auto"
    logits: str = "all"


@dataclass(frozen=True, kw_only=True, slots=True)
class Explanation:
    """What :func:`explain` found: the model, the phase, and one row per operator (name, op_class, count,
    flops, bytes: formulas in the notation of :mod:`lmcost.basics.notation`; shapes)."""

    cfg: ArchConfig
    phase: str
    rows: list[dict]


def explain(request: ExplainRequest, say: Say = quiet) -> Explanation:
    """The FLOPs and bytes formula of every operator of ``request`` (:func:`lmcost.cost.formulas.symbolic_ops`).

    Raises: LmcostError for an unknown model or dtype, a decode of a model without a decoder
    (:func:`lmcost.operators.workload.require_decoder`), ``mla`` other than auto on a model without MLA,
    and the errors of :class:`Settings`.
    """
    from lmcost.cost.formulas import show, symbolic_ops
    from lmcost.model.loading import load_config

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, (), say)
    settings = Settings(kernel=r.attention, mla=r.mla, logits=r.logits)
    check_mla(cfg, r.mla)
    if r.phase == "decode":
        require_decoder(cfg)
    ops = symbolic_ops(cfg, r.phase, precision, r.attention, settings.mla_for(r.phase), r.logits)
    rows = [dict(name=op.name, op_class=op.op_class.value, count=str(op.count), flops=show(op.flops),
                 bytes=show(op.bytes), shapes=op.shapes) for op in ops]
    return Explanation(cfg=cfg, phase=r.phase, rows=rows)
