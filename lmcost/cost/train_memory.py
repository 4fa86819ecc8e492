"""Memory of a training step as a framework reserves it: what the tensors need at the peak (allocated),
what the caching allocator holds for them (reserved) and what the device shows (nvidia-smi), per GPU.

Model states (:mod:`lmcost.cost.optimizers`) and saved activations (:mod:`lmcost.cost.activations`) are
what a step *must* keep; a real run also holds, at its peak (bytes, per GPU; n = b*s/cp tokens of one
microbatch, V/tp the vocabulary shard, B_a the activation dtype's bytes):

- **the loss in fp32** (last pipeline stage): every framework upcasts the logits [n, V/tp] to fp32 for the
  cross-entropy. Megatron-Core's ``vocab_parallel_cross_entropy`` (megatron/core/tensor_parallel/
  cross_entropy.py: ``calculate_logits_max`` calls ``.float()``, the forward exponentiates and normalises
  that copy in place and saves it, the backward writes the gradient into the same buffer) keeps one fp32
  [n, V/tp] tensor, then casts the gradient back to B_a for lm_head's backward: 4 + B_a bytes an element.
  Eager torch (transformers' ``ForCausalLMLoss``: ``logits = logits.float()`` then ``F.cross_entropy``)
  saves log_softmax's fp32 output; its backward holds that output, nll_loss's fp32 gradient and
  log_softmax's fp32 gradient at once: 3 x 4 = 12 bytes an element. ``loss_fp32_tensors`` (figures) is
  that count k; the working set is max(4k, 4 + B_a) bytes an element (B_a = 4: the casts are no-ops, 4k),
  less the B_a log-probs :mod:`lmcost.cost.activations` already counts;
- **ZeRO-3 / FSDP's unsharded buffers**: a layer's parameters gathered (B_w) and its gradients unsharded
  (B_g) before their reduce-scatter, for the unit in use plus ``prefetch_layers`` more (FSDP2's
  ``fully_shard`` prefetches the next unit's all-gather in forward and backward, and the previous unit's
  reduce-scatter is in flight while the next backward runs: torch/distributed/fsdp/_fully_shard docs;
  FSDP1's ``BackwardPrefetch.BACKWARD_PRE`` and ``forward_prefetch``: one unit). The unit is the largest of a
  layer, the embedding table and lm_head (each its own unit: torchtitan's wrapping; the root unit is not
  resharded after forward). DeepSpeed's stage 3 prefetches by elements instead,
  ``stage3_prefetch_bucket_size`` = 5e7 (deepspeed/runtime/zero/config.py), and reduces gradients through
  an IPG bucket of ``reduce_bucket_size`` = 5e8 elements;
- **gradient buckets** of DDP and ZeRO-1/2: torch DDP copies every gradient into its bucket buffers
  (``bucket_cap_mb`` = 25 sizes each bucket; all are allocated) unless ``gradient_as_bucket_view=True``
  ("the saved memory size will be equal to the total gradients size": torch.nn.parallel.
  DistributedDataParallel docs): a second copy of the gradients (``ddp_grad_copies``); DeepSpeed ZeRO-0/1/2
  flattens each bucket of ``reduce_bucket_size`` (5e8) elements into a contiguous IPG buffer
  (deepspeed/runtime/zero/stage_1_and_2.py, ``contiguous_gradients``); Megatron-Core reduces in place in
  its contiguous grad buffer (megatron/core/distributed/param_and_grad_buffer.py; the buckets are views
  into the main grads :mod:`lmcost.cost.optimizers` already counts): nothing more;
- **workspaces**: cuBLAS's (torch's CublasHandlePool.cpp: 4096 KiB x 8 = 32 MiB on sm90, 4096 KiB x 2 +
  16 KiB x 8 before) and Transformer Engine's (``get_cublas_workspace_size_bytes``: 32 MiB on Hopper),
  taken through the caching allocator: ``workspace_bytes``;
- **NCCL buffers**, allocated by NCCL outside torch's allocator (nvidia-smi sees them, ``reserved`` does
  not): NCCL_BUFFSIZE (default 4 MiB, NCCL docs, "Environment Variables") per channel and per ring peer
  (the previous and the next: 2), ``nccl_channels`` channels, for each communicator of more than one rank
  (TP, CP, the DP gradient group, EP, PP's p2p);
- PP's in-flight microbatches and the uneven first stage: already in :func:`lmcost.cost.activations.
  peak_activation_bytes` (1F1B's p - i microbatches on stage i, the embedding's on stage 0, the first
  L mod pp stages one layer more); the loss is added to the last stage before the busiest stage is taken.

Then, as torch's caching allocator holds it (torch docs, "CUDA semantics: memory management"; c10/cuda/
CUDACachingAllocator.cpp): blocks rounded to 512 B, segments of 2 MiB (small) or 20 MiB and more (large),
freed blocks kept for reuse: reserved = allocated rounded up to 2 MiB, plus ``fragmentation`` x the
transient bytes, allocated less the model states (the states are allocated once, at start, in blocks
that are never freed; activations, the loss and the gathered buffers are freed and re-requested every
microbatch, and the blocks they leave split and cached are what the next request may not fit: GMLake,
Guo et al. 2024, measure up to about 30% of reserved memory on LLM fine-tuning under DeepSpeed, FSDP and
Colossal-AI). nvidia-smi adds
the CUDA context (driver state and loaded kernel modules, ``context_bytes`` per GPU generation) and NCCL's
buffers. ``fits`` is decided on that whole device figure against the GPU's capacity as a process sees it
(``usable_bytes``: the datasheet's GB are GiB, :class:`MemoryFigures`), the margin stated.

Every figure a fit may move is a field of :class:`MemoryFigures`, with the prior and its source.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from lmcost.basics.errors import LmcostError
from lmcost.basics.results import Result

from lmcost.hardware.frameworks import FRAMEWORKS, resolve_framework  # noqa: F401 (train_step imports it from here)
MiB = 1 << 20
#: GPU generation by the shipped GPU file's name (a YAML of another name: ``default``).
GENERATIONS = {"v100": "volta", "a10": "ampere", "a100": "ampere", "l4": "ada", "l40s": "ada", "rtx-4090": "ada",
               "h100": "hopper", "h200": "hopper", "b200": "blackwell", "mi300x": "cdna3"}


def generation(gpu_name: str) -> str:
    """The GPU generation of a GPU name (``h100-sxm`` -> ``hopper``): the longest :data:`GENERATIONS` key
    the name starts with, else ``default``."""
    keys = [k for k in GENERATIONS if gpu_name.startswith(k)]
    return GENERATIONS[max(keys, key=len)] if keys else "default"


@dataclass(frozen=True)
class MemoryFigures:
    """The figures of :func:`train_memory` that a fit on published runs may set (priors cited; module
    docstring for each term). Per-framework dicts are keyed by :data:`FRAMEWORKS` less ``auto``."""

    #: Fraction of the transient bytes (allocated less model states) the caching allocator holds beyond
    #: them (prior 0.10: GMLake, Guo et al. 2024, measure 5-30% on LLM fine-tuning); a float, or a dict by
    #: framework (:func:`shipped_memory_figures`: the framework YAMLs' fitted ``memory`` blocks).
    fragmentation: float | dict = 0.10
    #: CUDA context per GPU generation, bytes (prior 512 MiB: CUDA >= 11.7 loads kernel modules lazily,
    #: torch's default; the fitting set's notes give 0.5-1.5 GB with the allocator's cache; to be fitted).
    context_bytes: dict = field(default_factory=lambda: dict.fromkeys(
        ("volta", "ampere", "ada", "hopper", "blackwell", "cdna3", "default"), 512 * MiB))
    #: cuBLAS + Transformer Engine workspaces, bytes (32 MiB each on Hopper: module docstring).
    workspace_bytes: int = 64 * MiB
    #: fp32 [n, V/tp] tensors alive at once in the loss's backward (module docstring): Megatron's fused
    #: vocab-parallel cross-entropy 1, eager torch 3; torch.compile fuses log_softmax and nll_loss (prior 1).
    loss_fp32_tensors: dict = field(default_factory=lambda: {
        "megatron": 1, "deepspeed": 1, "fsdp": 3, "fsdp-compile": 1, "eager": 3})
    #: ZeRO-3/FSDP units gathered ahead of the one in use (FSDP1/FSDP2, Megatron-FSDP: 1; DeepSpeed by
    #: elements instead: ``prefetch_elements``).
    prefetch_layers: dict = field(default_factory=lambda: {
        "megatron": 1, "deepspeed": 0, "fsdp": 1, "fsdp-compile": 1, "eager": 1})
    #: Parameters prefetched by element count (DeepSpeed ``stage3_prefetch_bucket_size`` 5e7).
    prefetch_elements: dict = field(default_factory=lambda: {"deepspeed": 50_000_000})
    #: Gradient elements a reduce bucket holds (DeepSpeed ``reduce_bucket_size`` 5e8; the others none).
    reduce_bucket_elements: dict = field(default_factory=lambda: {"deepspeed": 500_000_000})
    #: Copies of the gradients DDP's buckets hold under ZeRO-0/1 (torch DDP, gradient_as_bucket_view=False: 1).
    ddp_grad_copies: dict = field(default_factory=lambda: {
        "megatron": 0, "deepspeed": 0, "fsdp": 1, "fsdp-compile": 1, "eager": 1})
    #: Whether the framework's norms and gated activations are fused kernels (Megatron-LM/Transformer Engine,
    #: DeepSpeed's Megatron models, torch.compile) or eager torch composites, which keep more
    #: (:mod:`lmcost.cost.activations`, ``fused``).
    fused_kernels: dict = field(default_factory=lambda: {
        "megatron": True, "deepspeed": True, "fsdp": False, "fsdp-compile": True, "eager": False})
    #: NCCL_BUFFSIZE (bytes) and the channels a communicator opens (prior 16: NCCL opens 2-32 by topology).
    nccl_buffsize: int = 4 * MiB
    nccl_channels: int = 16
    #: The allocator's segment granularity (bytes): small blocks come from 2 MiB segments.
    segment_bytes: int = 2 * MiB
    #: Bytes per datasheet "GB" of device memory: GPU memory comes in binary sizes (HBM stacks of 16 or 24
    #: GiB; nvidia-smi's total: 81920 MiB on an A100 80GB, 40960 MiB on an A100 40GB, 81559 MiB on an H100
    #: SXM 80GB), where the GPU files keep the datasheet's figure as 10^9 bytes.
    capacity_per_gb: float = float(1 << 30)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainMemory(Result):
    """Memory per GPU at a training step's peak beyond model states and activations (bytes), and the totals
    (:func:`train_memory`)."""

    framework: str
    #: The fp32 loss's working set beyond the activation-dtype log-probs, one microbatch, last stage.
    loss_fp32_bytes: float
    #: ZeRO-3/FSDP: gathered parameters and unsharded gradients of the units in use and prefetched.
    gathered_params_bytes: float
    gathered_grads_bytes: float
    #: DDP / DeepSpeed gradient reduce buckets.
    grad_buckets_bytes: float
    workspace_bytes: float
    #: model states + the busiest stage's activations with the loss + the buffers above.
    allocated_bytes: float
    #: reserved = allocated rounded to segments + fragmentation (of the transient bytes).
    fragmentation_bytes: float
    reserved_bytes: float
    #: Outside torch's allocator: the CUDA context and NCCL's buffers; nvidia_smi = reserved + both.
    cuda_context_bytes: float
    nccl_bytes: float
    nvidia_smi_bytes: float
    capacity_bytes: float
    #: What a process can hold: the datasheet's GB x ``capacity_per_gb``.
    usable_bytes: float
    #: usable - nvidia_smi (negative when over).
    margin_bytes: float
    fits: bool


def reserved_bytes(allocated, states, fragmentation, segment):
    """What the caching allocator reserves (bytes): ``allocated`` rounded up to ``segment`` bytes, plus
    ``fragmentation`` x the transient bytes (allocated less the model states ``states``). Module docstring;
    any argument may be a numpy array (a fit's grid)."""
    return -(-allocated // segment) * segment + fragmentation * (allocated - states)


def loss_fp32_bytes(tokens: float, vocab_shard: int, B_a: int, fp32_tensors: int) -> float:
    """Bytes the fp32 cross-entropy holds beyond the B_a log-probs already counted as activations:
    tokens x V/tp x (max(4k, 4 + B_a) - B_a), k = ``fp32_tensors`` (B_a = 4: 4k - 4). Module docstring."""
    per = 4 * fp32_tensors if B_a == 4 else max(4 * fp32_tensors, 4 + B_a)
    return tokens * vocab_shard * (per - B_a)


def _units(cfg, x) -> int:
    """Parameters (elements) of the largest ZeRO-3/FSDP unit on one GPU: one layer (of the largest layer
    group), the embedding table or lm_head, at the TP-sharded dims ``x``."""
    from lmcost.operators.forward import forward_ops

    groups: dict = {}
    outer = 0
    for op in forward_ops(cfg, x, mla_mode="naive"):
        if not op.params:
            continue
        if op.group:
            groups[op.group] = groups.get(op.group, 0) + op.params
        elif op.role in ("embed", "lm_head"):
            outer = max(outer, op.params)
    return max([outer, *groups.values()])


def _communicators(layout) -> int:
    """Communicators of more than one rank a GPU of ``layout`` (dp filled in) belongs to."""
    return sum(n > 1 for n in (layout.tp, layout.cp, layout.dp * layout.cp, layout.ep, layout.pp))


def train_memory(cfg, gpu, layout, precision, micro_batch: int, seq: int, zero: int, states, acts, *,
                 train_precision: str = "bf16-mixed", framework: str = "auto",
                 figures: MemoryFigures = MemoryFigures(), unsharded_bytes: float = 0.0,
                 extra_bytes: float = 0.0) -> TrainMemory:
    """Memory per GPU of a training step as the framework holds it (module docstring for each term).

    ``layout``: :class:`lmcost.operators.parallel.Layout` with dp filled in; ``precision``: the compute
    :class:`lmcost.basics.dtypes.Precision`; ``states``: :class:`lmcost.cost.optimizers.ModelStates` of the
    busiest stage; ``acts``: :class:`lmcost.cost.activations.PeakActivations`; ``train_precision``: the
    recipe (its B_w and B_g size the gathered buffers); ``figures``: :class:`MemoryFigures`;
    ``unsharded_bytes``: a stage's parameters and gradients kept unsharded through the step (FSDP under PP,
    :func:`lmcost.cost.pipeline.fsdp_pp_unsharded_bytes`): they replace the per-unit gathered buffers;
    ``extra_bytes``: other held bytes (fp8 weight copies, redundant experts: lmcost.cost.train_features).
    Returns: :class:`TrainMemory` (bytes; ``fits`` on nvidia_smi_bytes <= usable_bytes, the GPU's capacity).
    Raises: LmcostError (framework) for an unknown framework.
    """
    from lmcost.cost.optimizers import train_precision as recipe
    from lmcost.operators.forward import Dims
    from lmcost.operators.parallel import shard

    fw = resolve_framework(framework, zero)
    prec = recipe(train_precision)
    x = shard(cfg, Dims.of(cfg, precision, micro_batch, seq, seq), layout, "prefill")
    loss = loss_fp32_bytes(x.b * x.s, x.V, x.B_a, figures.loss_fp32_tensors[fw])
    stages = list(acts.per_stage)
    stages[-1] += loss
    act_peak = max(stages)
    grad_group = layout.dp * layout.cp
    trainable = states.trainable_params / max(1, states.trainable_params + states.frozen_params)
    params = grads = buckets = 0.0
    if grad_group > 1:
        unit = _units(cfg, x)
        reduce_bucket = figures.reduce_bucket_elements.get(fw, 0)
        if zero == 3 or (zero == 2 and fw != "deepspeed" and fw != "megatron"):  # FSDP SHARD_GRAD_OP: ZeRO-2
            live = 1 + figures.prefetch_layers[fw]
            if zero == 3 and not unsharded_bytes:
                params = (live * unit + figures.prefetch_elements.get(fw, 0)) * prec.B_w
            grads = (min(reduce_bucket, states.trainable_params) if reduce_bucket else live * unit * trainable) * prec.B_g
        elif reduce_bucket:
            buckets = min(reduce_bucket, states.trainable_params) * prec.B_g
        elif zero <= 1:
            buckets = figures.ddp_grad_copies[fw] * states.grads_unsharded_bytes
    allocated = states.total_bytes + unsharded_bytes + extra_bytes + act_peak + params + grads + buckets + figures.workspace_bytes
    fragmentation = figures.fragmentation[fw] if isinstance(figures.fragmentation, dict) else figures.fragmentation
    reserved = reserved_bytes(allocated, states.total_bytes, fragmentation, figures.segment_bytes)
    frag = reserved - allocated
    context = figures.context_bytes.get(generation(gpu.name), figures.context_bytes["default"])
    nccl = _communicators(layout) * figures.nccl_channels * 2 * figures.nccl_buffsize
    smi = reserved + context + nccl
    usable = gpu.memory_bytes / 1e9 * figures.capacity_per_gb
    return TrainMemory(framework=fw, loss_fp32_bytes=loss, gathered_params_bytes=params, gathered_grads_bytes=grads,
                       grad_buckets_bytes=buckets, workspace_bytes=figures.workspace_bytes, allocated_bytes=allocated,
                       fragmentation_bytes=frag, reserved_bytes=reserved, cuda_context_bytes=context, nccl_bytes=nccl,
                       nvidia_smi_bytes=smi, capacity_bytes=gpu.memory_bytes, usable_bytes=usable,
                       margin_bytes=usable - smi, fits=bool(smi <= usable))


def shipped_memory_figures(gpu) -> MemoryFigures:
    """:class:`MemoryFigures` as shipped for ``gpu`` (:class:`lmcost.hardware.gpu.GPU`): the fragmentation of
    each framework's YAML ``memory`` block and the CUDA context of the GPU YAML's ``training`` block, where
    ``lmcost fit --training`` wrote them (lmcost.calibration.training_memory_fit); the priors elsewhere.
    Raises: LmcostError for a framework file that does not validate."""
    prior = MemoryFigures()
    frag = {fw: (m.fragmentation if (m := _framework_memory(fw)) is not None else prior.fragmentation)
            for fw in FRAMEWORKS if fw != "auto"}
    context = dict(prior.context_bytes)
    training = getattr(gpu, "training", None)
    if training is not None and training.context_bytes is not None:
        context[generation(gpu.name)] = training.context_bytes
    return replace(prior, fragmentation=frag, context_bytes=context)


@functools.lru_cache(maxsize=None)
def _framework_memory(name: str):
    from lmcost.hardware.frameworks import load_framework

    return load_framework(name).memory
