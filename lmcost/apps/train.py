"""A training step at scale: will it fit, and how fast is it.

One step of ``global_batch`` sequences of ``seq`` tokens on ``gpus`` GPUs in a layout (tp x cp x pp x dp,
ep inside TP or over DP; :mod:`lmcost.operators.parallel`), each DP replica running m = global_batch / (dp x
micro_batch) microbatches:

- **compute and model-parallel communication**: the training graph of one microbatch
  (:func:`lmcost.operators.training.train_ops`: forward with dropout and loss, backward of every operator, and
  the collectives of TP/SP/CP/EP/PP with their backward conjugates) along the path through all stages;
  cut into stages of their layers (even, or ``layout.stage_split``: :mod:`lmcost.operators.pipeline_split`),
  the embedding on the first, the final norm, lm_head and loss on the last (:mod:`lmcost.cost.pipeline`);
- **pipeline**: m x the slowest stage's microbatch time + the other stages' / v (fill and drain); with
  equal stages (m + (pp - 1)/v) stage times for GPipe and 1F1B (Narayanan et al. 2021, section 2.2), v
  virtual stages per GPU for the interleaved schedule;
- **recompute**: ``full`` re-runs every layer's forward (its collectives too) before its backward;
  ``recompute_layers`` N: only the first N layers of each model chunk (Megatron-LM's block method);
  ``selective`` re-runs the attention core only where it saved score-sized tensors (a naive kernel:
  QK^T, softmax, dropout, PV; Korthikanti et al. 2022, section 5): a flash kernel saves none and its
  backward already recomputes the scores, so selective costs nothing more there;
- **data parallelism** (:mod:`lmcost.cost.train_overlap`, a schedule): gradients all-reduced (DDP, ZeRO-1)
  or reduce-scattered (ZeRO-2) over the dp ranks once per step in the framework's buckets, each issued as
  the last microbatch's backward makes it (the last bucket exposed); ZeRO-1/2 all-gather the updated
  parameters in buckets under the next step's first forward, or after the step; ZeRO-3 gathers each block's
  parameters in every microbatch's forward and again in its backward, prefetched a unit ahead, and
  reduce-scatters each block's gradients after its backward; under PP, ZeRO-3 gathers the stage once per
  step, kept unsharded with the gradients until the last microbatch (torchtitan's FSDP2 x PP;
  :mod:`lmcost.cost.pipeline`);
- **system terms** (:mod:`lmcost.cost.train_system`, figures from the GPU and framework YAMLs): the clock
  (sustained fraction, power cap), the framework's kernel launches, step efficiency and per-step cost,
  the overlap schemes named (``overlap``) and compute slowed while overlapped collectives hold SMs;
- **optimizer step**: memory-bound over this GPU's (sharded) states: each read and written once, with
  the gradients read and the working weights written (:mod:`lmcost.cost.optimizers`).

FLOPs conventions, both reported (``flops_convention`` picks the headline MFU, ``causal`` by default):
- ``causal`` (the default): model FLOPs = 6 N T + 6 L H (d_qk + d_v) K T per step, N the parameters a
  token multiplies (all matmul weights it uses, lm_head included, the embedding table not), T tokens, K
  the mean keys a query attends under the model's mask: (s + 1)/2 for causal attention, windows and
  chunks applied, s for a bidirectional model. It counts the FLOPs a causal (flash) kernel must run, so
  model FLOPs <= hardware FLOPs and, under a bf16 recipe (HFU prices fp8 GEMMs at the fp8 peak), MFU <= HFU
  and MFU <= 100% whenever the step time is at or above the roofline;
- ``palm``: attention over all s keys whatever the mask (Chowdhery et al. 2022, appendix B: 6 N T + 12 L H
  Q T, as torchtitan and Megatron-LM's formula count; windowed layers see min(s, w) keys). A causal
  kernel computes about half of those pairs, so where attention dominates (long sequences) this count
  exceeds the FLOPs that run and its "MFU" can pass 100%: a figure to compare with published ones, not a
  utilisation;
- hardware FLOPs (HFU): every operator that runs, flash's backward recomputation and activation
  recomputation included.
MFU = model FLOPs / (step time x GPUs x dense peak of the compute dtype, bf16 under fp8: NeMo's); HFU: hardware FLOPs,
each at its dtype's peak (:mod:`lmcost.cost.step_parts`). The step is the sum of ``step_parts_s`` (the same module).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lmcost.apps.setup import select_efficiency
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.feature_figures import FEATURE_FIGURES, FeatureFigures
from lmcost.cost.fp8_training import check_fp8, fp8_gemm_mask, fp8_recipe, states_precision
from lmcost.cost.redundant_experts import check_redundant
from lmcost.cost.step_parts import hardware_flops, hfu, optimizer_op, overlap_hidden_s, step_parts
from lmcost.cost.train_features import class_rows, feature_memory, kernel_features
from lmcost.hardware.gpu import GPU
from lmcost.operators.ops import OpClass
from lmcost.operators.parallel import Layout
from lmcost.operators.workload import Settings, check_count, check_positions

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
CONVENTIONS = ("causal", "palm")
#: Roles of a naive attention core: what selective recompute re-runs (Korthikanti et al. 2022, section 5).
ATTENTION_CORE = ("attn.score", "attn.softmax", "attn.dropout", "attn.value")
#: What each utilisation counts (the JSON's ``conventions``; the train table's footer), so that an MFU
#: above HFU (palm at long sequences) does not read as a contradiction.
CONVENTION_NOTES = dict(
    mfu_causal="model FLOPs: 6 x the matmul parameters a token uses (lm_head in, tied or not; the embedding "
               "lookup out) + the attention pairs the mask keeps (causal: (s+1)/2 keys per query), no recompute",
    mfu_palm="model FLOPs: the same 6N + 12 L H Q s per token, every query-key pair whatever the mask (PaLM appendix "
             "B, Megatron-LM, torchtitan); above HFU at long sequences: a figure to compare, not a utilisation",
    hfu="hardware FLOPs: every operator that runs, flash attention's backward recomputation and activation "
        "recomputation included, causal pairs only, the mean rank's under EP imbalance; each FLOP at its own dtype's "
        "peak (an fp8 recipe's GEMMs at the fp8 peak, the rest at the compute dtype's): at most 100% at the roofline",
    mfu="the headline: mfu_causal or mfu_palm as flops_convention says")


@dataclass(frozen=True)
class TrainSetup:
    """What one training step runs. ``layout`` carries tp, pp, cp, ep, sp and the cluster; its dp is
    derived: gpus / (tp x cp x pp). Raises: LmcostError for counts out of range or a split that does not divide."""

    gpus: int
    seq: int
    global_batch: int
    micro_batch: int = 1
    layout: Layout = Layout()
    zero: int = 1  # Megatron-LM's distributed optimizer, as lmcost train defaults to
    recompute: str = "none"
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"
    schedule: str = "1f1b"
    virtual_stages: int = 1
    flops_convention: str = "causal"
    lora: object = None
    #: flash or naive attention (a naive kernel saves its scores: what selective recompute is for).
    attention: str = "flash"
    #: With recompute full: recompute the first N layers of each model chunk only (None: all;
    #: :mod:`lmcost.cost.pipeline`).
    recompute_layers: int | None = None
    #: The software that runs the step (:mod:`lmcost.hardware.frameworks`; auto: megatron, fsdp under ZeRO-3),
    #: the GPUs' power cap (W; None: the default limit) and the overlap schemes run, comma-separated
    #: (:mod:`lmcost.cost.train_system`).
    framework: str = "auto"
    power_limit: float | None = None
    overlap: str = "none"
    #: HSDP: ZeRO-3 shards over groups of this many of the dp x cp ranks and replicates across them (None: all).
    shard_group: int | None = None
    #: The attention kernel family whose fitted figures time attention (efficiency.attention_prefill: auto,
    #: fa2, fa3, cudnn, sdpa, flex...), forward and backward (lmcost.cost.attention_training).
    attention_kernel: str = "auto"
    #: The runtime whose fitted figures time the memory-bound kernels (efficiency.kinds: auto, triton,
    #: torch-eager...; lmcost.apps.setup.select_efficiency), as ``estimate --runtime``.
    runtime: str = "auto"
    #: Redundant expert replicas per EP group (EPLB; lmcost.cost.redundant_experts): memory only.
    redundant_experts: int = 0

    def __post_init__(self):
        check_count("gpus", self.gpus, 65536)
        check_count("seq", self.seq)
        check_count("global_batch", self.global_batch)
        check_count("micro_batch", self.micro_batch)
        check_count("virtual_stages", self.virtual_stages, 1024)
        for name, allowed in (("recompute", RECOMPUTE), ("schedule", SCHEDULES), ("flops_convention", CONVENTIONS),
                              ("attention", ("flash", "naive"))):
            if getattr(self, name) not in allowed:
                raise LmcostError(name, f"unknown value {getattr(self, name)!r}", f"use one of {', '.join(allowed)}")
        if self.zero not in (0, 1, 2, 3):
            raise LmcostError("zero", f"must be 0, 1, 2 or 3, got {self.zero!r}", "0: DDP; 1-3: ZeRO stages (3 = FSDP)")
        lay = self.layout
        per = lay.tp * lay.cp * lay.pp
        if self.gpus % per:
            raise LmcostError("gpus", f"{self.gpus} GPUs do not split into tp x cp x pp = {per}",
                              f"use a multiple of {per}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise LmcostError("virtual_stages", "only the interleaved schedule runs several stages per GPU",
                              "add `schedule` interleaved, or drop `virtual_stages`")
        if self.schedule == "interleaved" and (self.virtual_stages < 2 or lay.pp < 2):
            raise LmcostError("schedule", "interleaved runs 2 or more model chunks per GPU over 2 or more stages",
                              "add `virtual_stages` 2 (or more) and `pp` 2 (or more), or use 1f1b")
        if self.recompute_layers is not None:
            n = self.recompute_layers
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:  # the bound, a stage's layers: train_checks
                raise LmcostError("recompute_layers", f"must be a whole number of layers from 0 to those of a "
                                  f"stage (model chunk), got {n!r}", "give the layers of each stage to recompute")
            if self.recompute != "full":
                raise LmcostError("recompute_layers", f"selects the layers full recomputation re-runs, and recompute "
                                  f"is {self.recompute}", "add `recompute` full, or drop `recompute_layers`")
        from lmcost.cost.train_system import check_overlap, parse_overlap
        from lmcost.hardware.frameworks import resolve_framework
        from lmcost.hardware.power import power_clock
        from lmcost.apps.train_checks import check_setup

        resolve_framework(self.framework, self.zero)
        power_clock(self.power_limit, 1.0, 3.0)  # the range only: the GPU's TDP is train_step's
        check_overlap(parse_overlap(self.overlap), lay)
        check_setup(self)
        if self.shard_group is not None:
            check_count("shard_group", self.shard_group, 65536)
            group = self.gpus // per * lay.cp if self.gpus % per == 0 else 0
            if self.zero != 3:
                raise LmcostError("shard_group", f"HSDP shards ZeRO-3, and `zero` is {self.zero}",
                                  "add `zero` 3, or drop `shard_group`")
            if group % self.shard_group:
                raise LmcostError("shard_group", f"{self.shard_group} does not divide the dp x cp = {group} ranks "
                                  "that hold the weights", f"use a divisor of {group}")

    @property
    def framework_name(self) -> str:
        """The framework :attr:`framework` means for this step (``auto`` resolved)."""
        from lmcost.hardware.frameworks import resolve_framework

        return resolve_framework(self.framework, self.zero)

    @property
    def dp(self) -> int:
        """Data-parallel replicas: gpus / (tp x cp x pp)."""
        lay = self.layout
        return self.gpus // (lay.tp * lay.cp * lay.pp)

    @property
    def full_layout(self) -> Layout:
        """The layout with its dp filled in."""
        return replace(self.layout, dp=self.dp)

    @property
    def microbatches(self) -> int:
        """Microbatches per replica and step: global_batch / (dp x micro_batch)."""
        return self.global_batch // (self.dp * self.micro_batch)


def _compute_precision(recipe: str) -> Precision:
    """The dtypes the step computes in: fp32, fp16 for fp16-mixed, else bf16."""
    dtype = "fp32" if recipe == "fp32" else "fp16" if recipe == "fp16-mixed" else "bf16"
    return Precision(dtype, dtype, dtype)


def model_flops_per_token(cfg: ArchConfig, seq: int, convention: str, lora: bool = False) -> float:
    """Model FLOPs per trained token (forward + backward = 3 x forward): 6 x the matmul parameters a token
    uses (lm_head included, the embedding table not) + attention: 6 x h x (d_qk + d_v) x keys per layer
    (QK^T and PV, 2 FLOPs per MAC, x 3 for forward and backward).

    keys, by ``convention``:
    - "causal": the mean keys a query attends under the model's mask: the causal pairs per query
      (:func:`lmcost.operators.attention._causal_pairs` / s: (s + 1)/2, windowed: the mean of min(j, w),
      chunked: of ((j - 1) mod C) + 1), or s (min(s, w) windowed) for a bidirectional model
      (``causal: false``): the FLOPs a kernel that skips masked blocks must run;
    - "palm": s (min(s, w) windowed, min(s, C) chunked) whatever the mask (Chowdhery et al. 2022 appendix
      B: 12 L H Q T for d_qk = d_v = Q), about twice the causal count at long s.
    ``lora``: the base is frozen, so its weights take no gradient: 4N instead of 6N (forward and the input
    gradients); attention still runs forward and backward.
    Returns: FLOPs per token. Raises: nothing (``convention`` is checked by :class:`TrainSetup`)."""
    from lmcost.operators.attention import _causal_pairs
    from lmcost.operators.forward import Dims
    from lmcost.cost.params import param_counts

    p = param_counts(cfg)
    dense = p["active_per_token"] - p["embedding"] + _tied_lm_head(cfg)
    x = Dims.of(cfg, Precision(), 1, seq, seq)
    m = cfg.attention.mla
    d_qk, d_v = ((m.qk_nope_head_dim + m.qk_rope_head_dim), m.v_head_dim) if m else (cfg.d_h, cfg.d_h)
    attn = 0.0
    for kind, _, n in cfg.layer_groups():
        mask = kind.removesuffix("_nope")  # ATTENTION_KINDS: global/local/chunked, with or without RoPE
        local = mask == "local"
        if convention == "palm" or not cfg.causal:
            keys = min(seq, x.w) if local else min(seq, x.C) if mask == "chunked" else seq
        else:
            keys = _causal_pairs(x, "chunked" if mask == "chunked" else local) / seq
        attn += n * 6 * cfg.attention.n_heads * (d_qk + d_v) * keys
    return (4.0 if lora else 6.0) * dense + attn


def _tied_lm_head(cfg: ArchConfig) -> float:
    """Multiply-accumulates per token of a tied lm_head (d x V): param_counts gives a tied lm_head 0
    parameters, and subtracting the embedding table would drop its matmul (Megatron-LM's and PaLM's
    6N count it, tied or not); 0 when untied (its parameters are already in ``active_per_token``)."""
    if not cfg.tie_embeddings:
        return 0.0
    from lmcost.operators.forward import Dims, forward_ops

    return sum(op.flops for op in forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1)) if op.role == "lm_head") / 2


@dataclass
class TrainStep:
    """Everything ``lmcost train`` reports (seconds, bytes, FLOPs; per GPU unless said)."""

    setup: TrainSetup
    gpu: str
    step_s: float
    #: The step's additive parts, summing to step_s (:func:`lmcost.cost.step_parts.step_parts`); parts_s: details.
    step_parts_s: dict
    parts_s: dict
    memory: dict
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    model_flops: float
    hardware_flops_per_gpu: float
    mfu: float
    hfu: float
    mfu_palm: float
    mfu_causal: float
    fits: bool
    class_rows: list
    #: The dtype the step computes in (its dense peak is MFU's denominator).
    compute_dtype: str = "bf16"
    #: Layers per stage, each stage's seconds per microbatch and the slowest stage (:mod:`lmcost.cost.pipeline`).
    pipeline: dict | None = None

    def to_dict(self) -> dict:
        """The JSON of ``lmcost train --json``."""
        s = self.setup
        lay = s.full_layout
        return dict(gpu=self.gpu, gpus=s.gpus, seq=s.seq, global_batch=s.global_batch, micro_batch=s.micro_batch,
                    microbatches=s.microbatches,
                    layout=dict(tp=lay.tp, cp=lay.cp, pp=lay.pp, dp=lay.dp, ep=lay.ep, sp=lay.sp),
                    zero=s.zero, recompute=s.recompute, optimizer=s.optimizer, precision=s.precision,
                    schedule=s.schedule, virtual_stages=s.virtual_stages, flops_convention=s.flops_convention,
                    framework=s.framework_name, power_limit_w=s.power_limit, overlap=s.overlap, shard_group=s.shard_group,
                    step_s=self.step_s, step_parts_s=self.step_parts_s, parts_s=self.parts_s, memory=self.memory, fits=self.fits,
                    tokens_per_s=self.tokens_per_s, tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
                    model_flops_per_step=self.model_flops, hardware_flops_per_gpu=self.hardware_flops_per_gpu,
                    mfu=self.mfu, hfu=self.hfu, mfu_palm=self.mfu_palm, mfu_causal=self.mfu_causal,
                    conventions=CONVENTION_NOTES, recompute_layers=s.recompute_layers, pipeline=self.pipeline,
                    mfu_peak_dtype=self.compute_dtype, attention_kernel=s.attention_kernel, runtime=s.runtime,
                    redundant_experts=s.redundant_experts, op_classes=self.class_rows)


def check_trainable(cfg: ArchConfig) -> None:
    """Raises: LmcostError (model) if ``cfg`` has constant-state layers (lmcost.operators.recurrent) or a MoE variant
    (zero-computation experts, shortcut MoE, post-MoE norm: lmcost.operators.moe_variants), DeepSeek sparse
    attention (lmcost.operators.sparse_attention), per-layer inputs (lmcost.operators.per_layer) or differential
    attention (lmcost.operators.differential): what their backward keeps is not modelled."""
    from lmcost.operators.recurrent import RECURRENT_KINDS

    if any(k in RECURRENT_KINDS for k, _ in cfg.layer_kinds()):
        raise LmcostError("model", f"{cfg.name} has constant-state layers (Mamba-2, gated DeltaNet, short conv), "
                          "whose training step (saved tensors, backward) is not modelled",
                          "use estimate, kv, plan or report for inference")
    m = cfg.moe
    if m is not None and (m.zero_experts or m.shortcut or m.post_norm):
        raise LmcostError("model", f"{cfg.name} has zero-computation experts, a shortcut MoE or a post-MoE norm, "
                          "whose training step (saved tensors, backward) is not modelled",
                          "use estimate, kv, plan or report for inference")
    if cfg.attention.sparse is not None:
        raise LmcostError("model", f"{cfg.name} has DeepSeek sparse attention, whose lightning indexer trains on its "
                          "own KL loss through a non-differentiable top-k: its training step is not modelled",
                          "use estimate, kv, plan or report for inference")
    if cfg.per_layer_input is not None:
        raise LmcostError("model", f"{cfg.name} has per-layer input embeddings (PLE), whose training step (the PLE "
                          "table's gradient, saved tensors) is not modelled",
                          "use estimate, kv, plan or report for inference")
    if cfg.attention.differential:
        raise LmcostError("model", f"{cfg.name} has differential attention (two attention calls per layer), whose "
                          "training step is not modelled", "use estimate, kv, plan or report for inference")


def train_step(cfg: ArchConfig, gpu: GPU, setup: TrainSetup, model: str = "calibrated", figures=None,
               memory_figures=None, feature_figures: FeatureFigures = FEATURE_FIGURES) -> TrainStep:
    """One training step of ``setup`` on ``gpu``: time (by part), memory per GPU, throughput, MFU and HFU.

    ``model``: roofline (a lower bound) or calibrated (the GPU's efficiency model) for every operator.
    ``figures``: the system terms' figures (:class:`lmcost.cost.train_system.SystemFigures`; None: from the
    GPU's and the framework's YAML), the clock, launches, overlap and exposed DP communication they set.
    ``memory_figures``: :class:`lmcost.cost.train_memory.MemoryFigures` (None: as shipped, the fitted figures
    of the framework and GPU YAMLs: :func:`lmcost.cost.train_memory.shipped_memory_figures`). Memory:
    ``total_bytes`` is model states + activations, as before; ``allocated_bytes``, ``reserved_bytes`` and
    ``nvidia_smi_bytes`` add what the framework and the allocator hold (:mod:`lmcost.cost.train_memory`),
    and ``fits`` is decided on ``nvidia_smi_bytes`` against capacity (``margin_bytes``).
    ``feature_figures``: the kernel features' priors (fp8 GEMM scale, attention backward rates, ring overlap:
    :class:`lmcost.cost.feature_figures.FeatureFigures`). An fp8 ``precision`` (lmcost.cost.fp8_training)
    runs the layers' GEMMs at the fp8 peak, states as bf16-mixed; MFU stays against the bf16 peak.
    Raises: LmcostError if the layout cannot split the model, ``seq`` exceeds a learned position table,
    the batch does not split into microbatches, or the GPU has no peak for the compute dtype, or ``cfg`` has constant-state layers (lmcost.operators.recurrent:
    what their backward keeps is not modelled). Sources: the module docstring.
    """
    from lmcost.cost.activations import peak_activation_bytes
    from lmcost.apps.train_checks import check_peak, check_step

    check_trainable(cfg)
    asked, setup = setup, replace(setup, recompute="none", recompute_layers=None) if setup.recompute_layers == 0 else setup
    check_positions(cfg, setup.seq, "seq")  # as estimate and plan: a learned table has no row past its end
    from lmcost.cost.optimizers import model_states
    from lmcost.cost.compile import phase_records
    from lmcost.cost.phases import PhaseCost, op_totals
    from lmcost.cost.pipeline import fsdp_pp_unsharded_bytes, pipeline_time, stage_times
    from lmcost.operators.pipeline_split import chunk_layers

    lay = setup.full_layout
    lay.check(cfg)
    if setup.global_batch % (setup.dp * setup.micro_batch):
        raise LmcostError("global_batch", f"{setup.global_batch} sequences do not split into dp={setup.dp} x "
                          f"micro-batch {setup.micro_batch}", f"use a multiple of {setup.dp * setup.micro_batch}")
    if setup.seq % lay.cp or (lay.sp and (setup.micro_batch * setup.seq) % lay.tp):
        raise LmcostError("seq", f"{setup.seq} tokens do not split over cp={lay.cp} (or tp={lay.tp} under `sp`)",
                          "use a sequence length they divide")
    m, pp, v = setup.microbatches, lay.pp, setup.virtual_stages
    if v > 1 and lay.stage_split is None and cfg.n_layers % (pp * v):
        raise LmcostError("virtual_stages", f"{cfg.n_layers} layers do not split into {pp} stages x {v} chunks",
                          f"use a `virtual_stages` that divides {cfg.n_layers // pp if cfg.n_layers % pp == 0 else 'the layers per stage'}")
    prec = _compute_precision(setup.precision)
    check_fp8(setup.precision, gpu)
    check_redundant(cfg, lay, setup.redundant_experts)
    check_step(cfg, gpu, setup, chunk_layers(cfg, lay.pp, v, lay.stage_split))
    if setup.attention_kernel != "auto" or setup.runtime != "auto":  # a copy of the GPU only when one is named
        gpu = select_efficiency(gpu, setup.attention_kernel, setup.runtime, designs=False)  # (statics are cached per GPU)
    check_peak(gpu, setup.precision, lambda p: _compute_precision(p).activations)
    settings = Settings(kernel=setup.attention, model=model, layout=lay)
    rec = phase_records(cfg, prec, "train", setup.micro_batch, setup.seq, settings)
    cost = PhaseCost(rec, gpu, prec, "train", model)
    feat = kernel_features(rec, cost.times["time_s"], gpu, model, setup.precision, feature_figures)
    per_op = feat.per_op
    ops = rec.graph.templates
    from lmcost.cost.moe_training import permute_seconds

    permute = permute_seconds(rec, gpu, prec, model)  # MoE token permutations, beside each combine (fwd, bwd)
    for i, t in permute.items():
        per_op[i] += t
    flops = [f * c for f, c in zip(rec.cols.flops, rec.cols.count)]
    if setup.lora is not None:
        # A frozen weight needs no gradient: its backward computes dX only, one matmul of the forward's two
        # (Hu et al. 2021); the adapters' own matmuls, 2 n r (d_in + d_out) per projection, are under 1% of
        # the base's at the ranks used (r/d) and are not added.
        for i, op in enumerate(ops):
            if op.role.startswith("bwd.") and op.op_class in (OpClass.GEMM, OpClass.LM_HEAD, OpClass.MOE_ROUTING):
                per_op[i] /= 2
                flops[i] /= 2
    from lmcost.cost import train_system as system

    figures = figures or system.system_figures(gpu, setup.framework_name)
    if model == "roofline":  # a lower bound at the datasheet clock: the fitted losses are the calibrated model's
        figures = replace(figures, sustained_clock=1.0, step_efficiency=1.0, kernel_launch_us=0.0,
                          step_overhead_s=0.0, sm_contention=0.0)
    clock = system.clock_of(gpu, figures, setup.power_limit)
    per_op, added = system.rated(per_op, cost.times, ops, cost.counts, figures, clock)
    hidden = system.hidden_by(system.parse_overlap(setup.overlap), ops, per_op)  # one path (microbatch), capped
    hidden_step = overlap_hidden_s(hidden, m, pp)
    path_s = float(per_op.sum()) - hidden * (1 - figures.sm_contention)
    fwd_idx = [i for i, op in enumerate(ops) if not op.role.startswith("bwd.")]
    bwd_idx = [i for i, op in enumerate(ops) if op.role.startswith("bwd.")]
    fwd_s, bwd_s = float(sum(per_op[i] for i in fwd_idx)), float(sum(per_op[i] for i in bwd_idx))
    # Recompute: the forward ops re-run before each layer's backward.
    if setup.recompute == "full":
        again = [i for i in fwd_idx if ops[i].group]
    elif setup.recompute == "selective" and setup.attention == "naive":  # flash saves no scores to drop
        again = [i for i in fwd_idx if ops[i].role in ATTENTION_CORE]
    else:
        again = []
    if v > 1:  # the interleaved schedule's microbatch crosses pp*v - 1 stage boundaries, not pp - 1
        sends = [i for i, op in enumerate(ops) if op.role in ("pp.send", "bwd.pp.send")]
        extra = sum(per_op[i] / ops[i].count for i in sends) * pp * (v - 1)
        path_s += extra
    path_s += feat.quantize_s
    recompute_s = float(sum(per_op[i] for i in again))
    passes = (m + (pp - 1) / v) / pp  # stage-microbatch times of the pipeline, per path second
    added = {k: float(a.sum() + sum(a[i] for i in again)) * passes for k, a in added.items()}
    recompute_flops = float(sum(flops[i] for i in again))
    if pp == 1 and setup.recompute_layers is None:  # one stage: the whole path
        pipeline_s, bubble_s, stage_fbr, pipe = m * (path_s + recompute_s), 0.0, (fwd_s, bwd_s, recompute_s), None
    else:  # each stage its layers, the first the embedding, the last the head (lmcost.cost.pipeline)
        chunks = chunk_layers(cfg, pp, v, lay.stage_split)
        st = stage_times(cfg, ops, per_op, flops, again, chunks, pp, v, setup.recompute_layers)
        pipeline_s, bubble_s, k = pipeline_time(st.totals, m, v)
        pipeline_s -= hidden_step * (1 - figures.sm_contention)  # the overlap schemes' hidden part (not in the bubble)
        pipeline_s += feat.quantize_s * passes  # fp8 casts, spread over the stages as the path's ops are
        stage_fbr = (st.forward[k], st.backward[k], st.recompute[k])
        recompute_flops = float(sum(st.recompute_flops))
        pipe = dict(stage_layers=[sum(len(chunks[c]) for c in range(i, pp * v, pp)) for i in range(pp)],
                    stage_s=st.totals, slowest_stage=k)

    # Context-parallel ranks hold the same weights: gradients are reduced, and ZeRO shards, over dp x cp
    # (Megatron-LM's data-parallel group with context parallelism).
    grad_group = setup.dp * lay.cp
    states = model_states(cfg, replace(lay, dp=setup.shard_group or grad_group, cp=1), optimizer=setup.optimizer,
                          precision=states_precision(setup.precision), zero=setup.zero, lora=setup.lora)
    extra_mem = feature_memory(cfg, replace(lay, dp=setup.shard_group or grad_group, cp=1), precision=setup.precision,
                               optimizer=setup.optimizer, zero=setup.zero, redundant=setup.redundant_experts,
                               frozen=setup.lora is not None)
    dp = system.data_parallel(cfg, gpu, setup, lay, states, system.units_of(ops, per_op, again, cfg.n_layers),
                              figures, model)
    dp_s, dp_exposed, gather_exposed = dp["dp_comm_s"], dp["dp_comm_exposed_s"], dp["param_gather_exposed_s"]
    contention = figures.sm_contention * (dp["hidden_s"] + hidden_step)
    opt = optimizer_op(states)
    opt_t = op_totals([opt], gpu, prec, model)
    weight_cast_s = feat.weight_cast_s / pp * (1 if feature_figures.fp8_weight_cache else m)
    step_parts_s, step_s = step_parts(pipeline_s=pipeline_s, dp_comm_exposed_s=dp_exposed, param_gather_exposed_s=gather_exposed,
                                      optimizer_s=opt_t.time_s, dp_hidden_s=dp["hidden_s"], sm_contention=figures.sm_contention,
                                      framework_step_s=figures.step_overhead_s, fp8_weight_cast_s=weight_cast_s)

    from lmcost.cost.train_memory import resolve_framework, shipped_memory_figures, train_memory

    held_figures, framework = memory_figures or shipped_memory_figures(gpu), getattr(setup, "framework", "auto")
    # Megatron-LM / Transformer Engine (and torch.compile) run fused norm and gated-activation kernels,
    # which keep less than eager torch's composites (lmcost.cost.activations, fused=True): MemoryFigures.fused_kernels.
    acts = peak_activation_bytes(cfg, prec, lay, setup.micro_batch, setup.seq, m, setup.recompute, setup.schedule, v,
                                 kernel=setup.attention, fused=held_figures.fused_kernels[resolve_framework(framework, setup.zero)],
                                 recompute_layers=setup.recompute_layers)
    fsdp_pp = fsdp_pp_unsharded_bytes(states) if setup.zero == 3 and pp > 1 else 0
    total_mem = states.total_bytes + acts.bytes + fsdp_pp + sum(extra_mem.values())
    held = train_memory(cfg, gpu, lay, prec, setup.micro_batch, setup.seq, setup.zero, states, acts,
                        train_precision=states_precision(setup.precision), framework=framework, figures=held_figures,
                        unsharded_bytes=fsdp_pp, extra_bytes=sum(extra_mem.values())).to_dict()
    tokens = setup.global_batch * setup.seq
    peak = gpu.peak_flops(prec.activations)
    model_flops = {c: model_flops_per_token(cfg, setup.seq, c, lora=setup.lora is not None) * tokens
                   for c in CONVENTIONS}
    hw, hw8 = hardware_flops(ops, flops, again, recompute_flops, lay.imbalance, fp8_gemm_mask(ops) if fp8_recipe(setup.precision) else None)
    hw, hw8 = hw / pp * m + opt.flops, hw8 / pp * m  # the mean rank's, fp8 GEMMs' apart (HFU at their own peak)
    mfu = {c: f / (step_s * setup.gpus * peak) for c, f in model_flops.items()}
    classes = class_rows(rec, gpu, prec, model, feat.kernel_s)
    return TrainStep(
        setup=asked, gpu=gpu.name, step_s=step_s, step_parts_s=step_parts_s,
        parts_s=dict(pipeline_s=pipeline_s, bubble_s=bubble_s, forward_s=stage_fbr[0] * m,
                     backward_s=stage_fbr[1] * m, recompute_s=stage_fbr[2] * m, dp_comm_s=dp_s,
                     dp_comm_exposed_s=dp_exposed,
                     param_gather_exposed_s=gather_exposed, optimizer_s=opt_t.time_s, **added,
                     overlap_hidden_s=hidden_step, sm_contention_s=contention, framework_step_s=figures.step_overhead_s,
                     communication_s=sum(r["time_s"] for r in classes if r["op_class"] == "communication") / pp * m,
                     fp8_quantize_s=feat.quantize_s / pp * m + weight_cast_s,
                     cp_ring_exposed_s=feat.ring_exposed_s / pp * m, cp_ring_hidden_s=feat.ring_hidden_s / pp * m,
                     moe_permute_s=sum(permute.values()) / pp * m),
        memory=dict(**{k: v for k, v in states.to_dict().items() if k.endswith("_bytes") and k != "total_bytes"},
                    model_states_bytes=states.total_bytes, activations_bytes=acts.bytes, **extra_mem,
                    **(dict(fsdp_pp_unsharded_bytes=fsdp_pp) if fsdp_pp else {}),
                    activation_stage=acts.stage, microbatches_in_flight=acts.in_flight,
                    total_bytes=total_mem, **{k: v for k, v in held.items() if k != "fits"}),
        tokens_per_s=tokens / step_s, tokens_per_s_per_gpu=tokens / step_s / setup.gpus,
        model_flops=model_flops[setup.flops_convention], hardware_flops_per_gpu=hw,
        mfu=mfu[setup.flops_convention], hfu=hfu(hw, hw8, step_s, peak, gpu.peak_tflops.get("fp8", 0) * 1e12), mfu_palm=mfu["palm"], mfu_causal=mfu["causal"],
        fits=held["fits"], class_rows=classes, compute_dtype=prec.activations, pipeline=pipe)
