"""The system terms of a training step: what the kernels' own times leave out, each a named part of the step.

- **clock** (``clock_s``): compute-bound time scales with 1 / the SM clock the GPU holds: its sustained
  fraction of boost (GPU YAML ``training.sustained_clock``) times what a power cap allows
  (:func:`lmcost.hardware.power.power_clock`: (P_cap / TDP)^(1/alpha)). An operator's time t becomes
  t x max(C / c, M) / max(C, M), C and M its roofline compute and memory times: a memory-bound kernel keeps
  its time (the HBM clock is not capped);
- **step efficiency** (``step_efficiency_s``): compute (not communication) divided by the framework's
  whole-step fraction of the single-kernel rates;
- **kernel launches** (``kernel_launch_s``): a kernel shorter than the framework's CPU time per launch
  leaves the GPU idle for the difference: sum over kernels of max(0, launch - t_kernel);
- **overlap schemes** (``overlap_hidden_s``, ``--overlap``): the collectives a named scheme runs under
  compute, up to that compute: ``dualpipe`` hides EP's all-to-all and PP's sends under the other direction's
  compute (DeepSeek-AI 2024, DeepSeek-V3 technical report, section 3.2.1: "both all-to-all and PP
  communication can be fully hidden"); ``tbo`` (two-batch overlap: SGLang's large-scale EP deployment,
  2025, and DeepEP's hook-based overlap) hides EP's all-to-all under the other half-batch's compute;
  ``async-tp`` hides TP/SP's collectives under the GEMMs they feed or follow, decomposed (Wang et al. 2022,
  "Overlap communication with dependent computation via decomposition", ASPLOS; torchtitan's async TP,
  Transformer Engine's --tp-comm-overlap). DualPipe's smaller bubble is not modelled;
- **data-parallel communication** from a schedule (:mod:`lmcost.cost.train_overlap`);
- **SM contention** (``sm_contention_s``): while an overlapped collective runs, compute runs at (1 - f)
  of its rate, f = the SMs NCCL's blocks hold (one per channel: NCCL documentation, NCCL_MAX_NCHANNELS) /
  the GPU's SMs; its cost is f x the communication hidden (exact while the collective fits under the
  slowed compute: max(c, W + f c) - max(c, W));
- **per step** (``framework_step_s``): the framework's fixed cost per step.

Every figure the fit on published runs sets is a field of :class:`SystemFigures`, which
:func:`lmcost.apps.train.train_step` takes (default: :func:`system_figures`, from the GPU and framework
YAMLs), so a fit tries values without editing files.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.hardware.frameworks import load_framework
from lmcost.hardware.power import GpuTraining, power_clock
from lmcost.operators.ops import OpClass

#: ``--overlap`` schemes, and the collectives (op roles, forward and backward) each hides.
OVERLAPS = ("none", "dualpipe", "tbo", "async-tp")
_EP = ("ep.dispatch", "ep.combine", "ep.counts")
_TP = ("tp.attn_all_reduce", "tp.ffn_all_reduce", "tp.moe_all_reduce")
HIDES = {"dualpipe": _EP + ("pp.send",), "tbo": _EP, "async-tp": _TP}


@dataclass(frozen=True)
class SystemFigures:
    """The figures of a training step's system terms (the module docstring), each one the fit sets.

    ``framework``: its name; ``sustained_clock`` (0.3-1) and ``power_exponent`` (alpha, 1-4): the GPU's;
    ``kernel_launch_us`` (CPU us per kernel), ``step_overhead_s`` (s per step), ``step_efficiency`` (0-1],
    ``sm_contention`` (f, 0-0.9), ``forward_prefetch``/``backward_prefetch`` (ZeRO-3 units gathered ahead),
    ``bucket_bytes`` + ``bucket_bytes_per_dp`` x dp (a gradient bucket, B), ``recompute_regather`` and
    ``overlap_param_gather``: the framework's (:class:`lmcost.hardware.frameworks.Framework`).
    Raises: LmcostError naming the field for a value out of its range."""

    framework: str = "megatron"
    sustained_clock: float = 1.0
    power_exponent: float = 3.0
    kernel_launch_us: float = 0.0
    step_overhead_s: float = 0.0
    step_efficiency: float = 1.0
    sm_contention: float = 0.0
    forward_prefetch: int = 1
    backward_prefetch: int = 1
    bucket_bytes: float = 25 * 2**20
    bucket_bytes_per_dp: float = 0.0
    recompute_regather: bool = False
    overlap_param_gather: bool = True

    def __post_init__(self):
        ranges = dict(sustained_clock=(0.3, 1.0), power_exponent=(1.0, 4.0), kernel_launch_us=(0.0, 1e4),
                      step_overhead_s=(0.0, 1e3), step_efficiency=(1e-3, 1.0), sm_contention=(0.0, 0.9),
                      forward_prefetch=(0, 64), backward_prefetch=(0, 64), bucket_bytes=(1.0, 1e12),
                      bucket_bytes_per_dp=(0.0, 1e10))
        for name, (lo, hi) in ranges.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise LmcostError(name, f"must be from {lo:g} to {hi:g}, got {v!r}", f"give `{name}` in that range")

    def names(self) -> list[str]:
        """The figure names (the dataclass's fields), as a fit lists them."""
        return [f.name for f in fields(self)]


def system_figures(gpu, framework: str) -> SystemFigures:
    """The figures of ``framework`` (a shipped name, resolved: not ``auto``) on ``gpu``, from the framework
    YAML and the GPU's ``training`` block (its priors where the GPU has none). SM contention: the
    framework's ``comm_sms`` over the GPU's SMs (``efficiency.gemm.sm_count``), 0 on a GPU without an
    efficiency block. Raises: LmcostError for an unknown framework or an invalid file."""
    fw = load_framework(framework)
    tr = gpu.training or GpuTraining()
    sms = gpu.efficiency.gemm.sm_count if gpu.efficiency is not None else None
    return SystemFigures(
        framework=fw.name, sustained_clock=tr.sustained_clock, power_exponent=tr.power_exponent,
        kernel_launch_us=fw.kernel_launch_us, step_overhead_s=fw.step_overhead_ms / 1e3,
        step_efficiency=fw.step_efficiency, sm_contention=min(0.9, fw.comm_sms / sms) if sms else 0.0,
        forward_prefetch=fw.forward_prefetch, backward_prefetch=fw.backward_prefetch,
        bucket_bytes=fw.bucket_mb * 1e6, bucket_bytes_per_dp=fw.bucket_mb_per_dp * 1e6,
        recompute_regather=fw.recompute_regather, overlap_param_gather=fw.overlap_param_gather)


def parse_overlap(text: str) -> tuple[str, ...]:
    """``dualpipe,async-tp`` -> ('dualpipe', 'async-tp'); ``none`` -> (). Raises: LmcostError (overlap)
    for an unknown scheme, an empty item, a scheme named twice, or ``none`` with another."""
    items = tuple(s.strip() for s in str(text).split(","))
    bad = next((s for s in items if s not in OVERLAPS), None)
    if bad is not None:
        raise LmcostError("overlap", f"unknown overlap scheme {bad!r}", f"use one or more of {', '.join(OVERLAPS)}, comma-separated")
    twice = next((s for i, s in enumerate(items) if s in items[:i]), None)
    if twice is not None:
        raise LmcostError("overlap", f"{twice} is named twice", "name each scheme once")
    if "none" in items and len(items) > 1:
        raise LmcostError("overlap", "none cannot be combined with a scheme", "give none, or the schemes alone")
    return tuple(s for s in items if s != "none")


def check_overlap(schemes: tuple[str, ...], layout) -> None:
    """Raises: LmcostError (overlap) for a scheme whose communication the layout does not have: dualpipe
    without pp > 1 (a bidirectional pipeline schedule), tbo without expert parallelism over DP (ep > 1,
    tp 1: its all-to-all), async-tp without tp > 1."""
    need = {"dualpipe": (layout.pp > 1, "is a pipeline schedule, and pp is 1", "add `pp` 2 or more"),
            "tbo": (layout.ep > 1 and layout.tp == 1, "hides expert-parallel all-to-all, which needs ep > 1 with tp 1",
                    "add `ep` with `tp` 1"),
            "async-tp": (layout.tp > 1, "hides tensor-parallel collectives, and tp is 1", "add `tp` 2 or more")}
    for s in schemes:
        ok, what, fix = need[s]
        if not ok:
            raise LmcostError("overlap", f"{s} {what}", f"{fix}, or drop {s}")


def clock_of(gpu, figures: SystemFigures, power_limit_w: float | None) -> float:
    """The SM clock through the step, as a fraction of boost: sustained_clock x the power cap's
    (:func:`lmcost.hardware.power.power_clock`). Raises: its errors (field ``power_limit``)."""
    return figures.sustained_clock * power_clock(power_limit_w, gpu.tdp_w, figures.power_exponent)


def rated(per_op, times: dict, ops, counts, figures: SystemFigures, clock: float):
    """Per-op times (s, over all layers, arrays over ops) under the clock, the step efficiency and the
    kernel launches (the module docstring), and the added seconds of each: (new per-op times, dict
    clock_s, step_efficiency_s, kernel_launch_s of arrays over ops). ``times``: the phase's roofline
    ``compute_s`` and ``memory_s`` arrays; ``counts``: kernels per op (its layers)."""
    per_op = np.asarray(per_op, dtype=float)
    comm = np.array([op.op_class is OpClass.COMMUNICATION for op in ops])
    c, m = np.asarray(times["compute_s"], float), np.asarray(times["memory_s"], float)
    hi = np.maximum(c, m)
    scale = np.where(hi > 0, np.maximum(c / clock, m) / np.where(hi > 0, hi, 1.0), 1.0)
    clocked = np.where(comm, per_op, per_op * scale)
    eff = np.where(comm, clocked, clocked / figures.step_efficiency)
    n = np.maximum(np.asarray(counts, float), 1.0)
    launch = n * np.maximum(0.0, figures.kernel_launch_us * 1e-6 - eff / n)
    return eff + launch, dict(clock_s=clocked - per_op, step_efficiency_s=eff - clocked, kernel_launch_s=launch)


def hidden_by(schemes: tuple[str, ...], ops, per_op) -> float:
    """Seconds of one microbatch's path that ``schemes`` hide: the collectives they name (forward and
    backward, :data:`HIDES`), up to the compute they run under (every non-communication op; for async-tp the
    GEMMs only)."""
    if not schemes:
        return 0.0
    roles = {r for s in schemes for r in HIDES[s]}
    comm = sum(t for op, t in zip(ops, per_op) if op.role.removeprefix("bwd.") in roles)
    if schemes == ("async-tp",):
        under = sum(t for op, t in zip(ops, per_op) if op.op_class is OpClass.GEMM)
    else:
        under = sum(t for op, t in zip(ops, per_op) if op.op_class is not OpClass.COMMUNICATION)
    return float(min(comm, under))


def units_of(ops, per_op, again, n_blocks: int):
    """One microbatch's compute by ZeRO-3 unit (:class:`lmcost.cost.train_overlap.Units`): the ops before
    the first layer op (embedding) and after the last (final norm, lm_head, loss), forward and backward, and
    the layer ops spread evenly over ``n_blocks`` blocks, the recompute forward (``again``: op indices)
    added to each block's backward."""
    from lmcost.cost.train_overlap import Units

    def split(idx):
        layer = [i for i in idx if ops[i].group]
        if not layer:
            return sum(per_op[i] for i in idx), 0.0, 0.0
        lo, hi = idx.index(layer[0]), idx.index(layer[-1])
        return (float(sum(per_op[i] for i in idx[:lo])), float(sum(per_op[i] for i in layer)),
                float(sum(per_op[i] for i in idx[hi + 1:])))

    fwd = [i for i, op in enumerate(ops) if not op.role.startswith("bwd.")]
    bwd = [i for i, op in enumerate(ops) if op.role.startswith("bwd.")]
    (hf, lf, tf), (tb, lb, hb) = split(fwd), split(bwd)
    re = float(sum(per_op[i] for i in again))
    n = max(1, n_blocks)
    return Units(head_fwd=hf, block_fwd=lf / n, tail_fwd=tf, head_bwd=hb, block_bwd=(lb + re) / n, tail_bwd=tb, n=n)


def data_parallel(cfg, gpu, setup, lay, states, units, figures: SystemFigures, model: str) -> dict:
    """The data-parallel communication of one step (:mod:`lmcost.cost.train_overlap`), seconds: ``dp_comm_s``
    (the gradient reduce issued), ``dp_comm_exposed_s``, ``param_gather_exposed_s`` and ``hidden_s`` (what
    ran under compute, for the SM contention). Over the ``dp x cp`` ranks that share the weights, across
    the nodes the layout's DP group spans. ZeRO-3: per microbatch, :func:`zero3_step` (root unit: the
    embedding and an untied lm_head, their share of the weights); ZeRO-0/1/2: the gradients reduced in
    buckets under the last microbatch's backward on this stage, and (ZeRO-1/2) the updated parameters
    gathered in buckets under the next forward, or after the step where the framework does not overlap it."""
    from lmcost.cost.collectives import collective
    from lmcost.cost.params import param_counts
    from lmcost.cost.train_overlap import Exposed, bucketed, buckets, zero3_step
    from lmcost.operators.parallel import cluster_for, group_nodes

    group = setup.dp * lay.cp
    none = dict(dp_comm_s=0.0, dp_comm_exposed_s=0.0, param_gather_exposed_s=0.0, hidden_s=0.0)
    if group <= 1:
        return none
    cluster = cluster_for(lay, gpu)
    nodes = min(group, group_nodes(lay, "dp", cluster.gpus_per_node))
    key = f"{model}_s"

    def timer(kind):
        # the dp x cp ranks sit tp GPUs apart: the fabric they see (a bridged pair, n - 1 links of a mesh)
        c = collective(kind, group, cluster.for_group(group, nodes, lay.tp), nodes=nodes)
        return lambda b: float(c.times(float(b))[key]) if b > 0 else 0.0

    gather, rs = timer("all_gather"), timer("reduce_scatter" if setup.zero >= 2 else "all_reduce")
    W, G = float(states.weights_unsharded_bytes), float(states.grads_unsharded_bytes)
    bucket = figures.bucket_bytes + figures.bucket_bytes_per_dp * group
    if setup.zero == 3 and lay.pp > 1:  # FSDP x PP (torchtitan): the stage gathered once per step and kept
        # unsharded over its microbatches (lmcost.cost.pipeline), its gradients reduce-scattered in buckets
        # under the last microbatch's backward
        forward = (units.block_fwd * units.n + units.head_fwd + units.tail_fwd) / lay.pp
        backward = (units.block_bwd * units.n + units.head_bwd + units.tail_bwd) / lay.pp
        par = bucketed(W, bucket, forward, gather, before=True, depth=figures.forward_prefetch)
        red = bucketed(G, bucket, backward, rs, before=False)
        return dict(dp_comm_s=red.comm_s, dp_comm_exposed_s=red.exposed_s, param_gather_exposed_s=par.exposed_s,
                    hidden_s=red.hidden_s + par.hidden_s)
    if setup.zero == 3:
        p = param_counts(cfg)
        root = min(1.0, (p["embedding"] + p["lm_head"]) / max(1, p["total"]))
        n, shard = units.n, setup.shard_group or group
        if shard < group:  # HSDP: gather and reduce-scatter in the shard group, all-reduce the shard across replicas
            gather, rs = _hsdp(lay, cluster, shard, group // shard, key)
        g, r = zero3_step(units, gather(W * (1 - root) / n), gather(W * root), rs(G * (1 - root) / n), rs(G * root),
                          forward_prefetch=figures.forward_prefetch, backward_prefetch=figures.backward_prefetch,
                          regather=figures.recompute_regather and setup.recompute == "full")
        m = setup.microbatches
        return dict(dp_comm_s=m * r.comm_s, dp_comm_exposed_s=m * r.exposed_s, param_gather_exposed_s=m * g.exposed_s,
                    hidden_s=m * (g.hidden_s + r.hidden_s))
    backward = (units.block_bwd * units.n + units.head_bwd + units.tail_bwd) / lay.pp  # this stage's
    red = bucketed(G, bucket, backward, rs, before=False)
    par = Exposed(0.0, 0.0)
    if setup.zero in (1, 2):
        forward = (units.block_fwd * units.n + units.head_fwd + units.tail_fwd) / lay.pp
        if figures.overlap_param_gather:
            par = bucketed(W, bucket, forward, gather, before=True, depth=figures.forward_prefetch)
        else:
            t = sum(gather(b) for b in buckets(W, bucket))
            par = Exposed(t, t)
    return dict(dp_comm_s=red.comm_s, dp_comm_exposed_s=red.exposed_s, param_gather_exposed_s=par.exposed_s,
                hidden_s=red.hidden_s + par.hidden_s)



def _hsdp(lay, cluster, shard: int, replicas: int, key: str):
    """HSDP's collectives (PyTorch FSDP HYBRID_SHARD): (gather(bytes), reduce(bytes)) seconds, the gather and
    reduce-scatter over ``shard`` ranks ``tp`` apart, then the reduced shard (bytes / shard) all-reduced over
    the ``replicas`` ranks ``shard x tp`` apart; each group across the nodes its ranks span."""
    from lmcost.cost.collectives import collective

    gpn = cluster.gpus_per_node
    inner = min(shard, -(-shard * lay.tp // gpn))
    outer = min(replicas, -(-replicas * shard * lay.tp // gpn))
    ag = collective("all_gather", shard, cluster, nodes=inner)
    rs = collective("reduce_scatter", shard, cluster, nodes=inner)
    ar = collective("all_reduce", replicas, cluster, nodes=outer)

    def gather(b):
        return float(ag.times(float(b))[key]) if b > 0 else 0.0

    def reduce(b):
        return float(rs.times(float(b))[key] + ar.times(float(b) / shard)[key]) if b > 0 else 0.0

    return gather, reduce
