"""Pipeline stages of a training step: each stage's time per microbatch (uneven splits, the embedding on
the first stage, the head and loss on the last, recompute of some layers only), the step of the
1F1B/GPipe/interleaved schedules over unequal stages, and ZeRO-3 (FSDP) under pipeline parallelism.

**Stage times.** Stage i runs, per microbatch, the forward and backward operators of its layers (the
training graph's per-layer times, :func:`lmcost.operators.training.train_ops`, times its layers of each
group), the embedding's (first stage) or the final norm's, lm_head's and loss's (last stage), and its
pipeline sends: one activation send per model chunk it hands on (the last stage's last chunk hands on
none) and one gradient send per chunk it hands back (the first stage's first chunk none), pp x v - 1 of
each along a microbatch's path, as the interleaved schedule crosses (Narayanan et al. 2021, section 2.2.2).
Recompute adds the forward of its recomputed layers: all of them, or the first N of each model chunk
(``recompute_layers``: Megatron-LM's ``--recompute-granularity full --recompute-method block
--recompute-num-layers N``, which recomputes N layers of each pipeline stage's chunk and keeps the rest;
torchtitan's layer-selective AC, ``selective_ac_option`` k, checkpoints every k-th block, i.e.
N = floor(layers per stage / k)).

**The step over unequal stages.** m identical microbatches through stages of times t_i (forward +
backward + recompute per microbatch) in series: the steady state runs at the slowest stage (PipeDream,
Narayanan et al. 2019, section 3.1: "the slowest stage" bounds the pipeline's throughput), and the fill and
drain cross every other stage once: T = m max t + (sum t - max t) / v, the flow-shop makespan of
identical jobs (sum t + (m - 1) max t) for v = 1. With equal stages t it is (m + (pp - 1)/v) t, the 1F1B
and interleaved figure of Narayanan et al. 2021 (section 2.2); GPipe's bubble is the same (Huang et al.
2019). The bubble reported is (sum t - max t) / v.

**ZeRO-3 (FSDP) x PP.** torchtitan composes FSDP2 with PP (``parallelize_llama`` / ``apply_fsdp``: under PP
``reshard_after_forward`` defaults to False "to avoid per-microbatch all-gathers", and
``torch.distributed.pipelining``'s stages turn gradient sync off, ``set_requires_gradient_sync(False)``,
until the last microbatch's backward). Modelled so: each stage's parameters are all-gathered over dp once
per step (under the first microbatch's forward: only what exceeds it is exposed), kept unsharded for the
step, and its gradients accumulate unsharded (in the gradient dtype) until one reduce-scatter at the last
backward: the stage's whole weights and gradients are held on top of the sharded states
(:func:`fsdp_pp_unsharded_bytes`). DeepSpeed refuses ZeRO-3 with its pipeline engine; Megatron-LM shards
gradients and optimizer states only (ZeRO-1/2).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcost.basics.results import Result
from lmcost.operators.forward import layer_group_names

#: Operators without a layer that run on the first stage (the rest of them run on the last).
FIRST_STAGE_ROLES = ("embed", "pos_embed", "embed_norm", "tp.embed_all_reduce", "tp.embed_reduce_scatter")
SEND_ROLES = ("pp.send", "bwd.pp.send")


@dataclass(frozen=True, kw_only=True, slots=True)
class StageTimes(Result):
    """Per pipeline stage, first to last: seconds per microbatch of its forward, backward and recompute,
    and the FLOPs it recomputes per microbatch."""

    forward: list
    backward: list
    recompute: list
    recompute_flops: list

    @property
    def totals(self) -> list:
        """forward + backward + recompute per stage (seconds per microbatch)."""
        return [f + b + r for f, b, r in zip(self.forward, self.backward, self.recompute)]


def stage_times(cfg, ops: list, per_op, flops: list, again: list, chunks: list, pp: int, v: int = 1,
                recompute_layers: int | None = None) -> StageTimes:
    """Each stage's times of one microbatch (module docstring).

    ``ops``: the training graph's operators (templates with ``group``, ``count`` and ``role``); ``per_op``,
    ``flops``: their times (s) and FLOPs, every instance counted; ``again``: indices of the forward operators
    a recompute re-runs (per layer); ``chunks``: layer indices of each of the pp x v model chunks, chunk c on
    stage c mod pp (:func:`lmcost.operators.pipeline_split.chunk_layers`); ``recompute_layers``: recompute the
    first N layers of each chunk only (None: every layer ``again`` covers).
    Returns: :class:`StageTimes`. Raises: nothing (the layout is checked by the caller).
    """
    groups = layer_group_names(cfg)
    per_op = [float(t) for t in per_op]
    fwd_layer: dict = {}
    bwd_layer: dict = {}
    rec_layer: dict = {}
    rec_flops: dict = {}
    first = [0.0, 0.0]
    last = [0.0, 0.0]
    send = [0.0, 0.0]
    redo = set(again)
    for i, op in enumerate(ops):
        back = op.role.startswith("bwd.")
        if op.group:
            target = bwd_layer if back else fwd_layer
            target[op.group] = target.get(op.group, 0.0) + per_op[i] / op.count
            if i in redo:
                rec_layer[op.group] = rec_layer.get(op.group, 0.0) + per_op[i] / op.count
                rec_flops[op.group] = rec_flops.get(op.group, 0.0) + flops[i] / op.count
        elif op.role in SEND_ROLES:
            send[back] += per_op[i] / op.count
        elif op.role.removeprefix("bwd.") in FIRST_STAGE_ROLES:
            first[back] += per_op[i]
        else:
            last[back] += per_op[i]
    fwd, bwd, rec, rflops = [], [], [], []
    for s in range(pp):
        layers = [(n, j) for c in range(s, pp * v, pp) for n, j in enumerate(chunks[c])]
        f = sum(fwd_layer.get(groups[j], 0.0) for _, j in layers)
        b = sum(bwd_layer.get(groups[j], 0.0) for _, j in layers)
        redone = [j for n, j in layers if recompute_layers is None or n < recompute_layers]
        r = sum(rec_layer.get(groups[j], 0.0) for j in redone)
        f += send[0] * (v - (s == pp - 1)) + (first[0] if s == 0 else 0.0) + (last[0] if s == pp - 1 else 0.0)
        b += send[1] * (v - (s == 0)) + (first[1] if s == 0 else 0.0) + (last[1] if s == pp - 1 else 0.0)
        fwd.append(f)
        bwd.append(b)
        rec.append(r)
        rflops.append(sum(rec_flops.get(groups[j], 0.0) for j in redone))
    return StageTimes(forward=fwd, backward=bwd, recompute=rec, recompute_flops=rflops)


def pipeline_time(totals: list, microbatches: int, v: int = 1) -> tuple:
    """The pipeline's time over a step of ``microbatches`` through stages of ``totals`` seconds each per
    microbatch, ``v`` model chunks per stage (module docstring: m max t + (sum t - max t) / v).

    Returns: (pipeline seconds, bubble seconds, the slowest stage's index, 0-based)."""
    slowest = max(range(len(totals)), key=lambda i: totals[i])
    top = totals[slowest]
    bubble = (sum(totals) - top) / v
    return microbatches * top + bubble, bubble, slowest


def fsdp_pp_unsharded_bytes(states) -> int:
    """Bytes ZeRO-3 under PP holds beyond its shards (``states``: :class:`lmcost.cost.optimizers.ModelStates`
    of the stage): the stage's weights gathered for the whole step and its gradients accumulated
    unsharded until the last microbatch (torchtitan: ``reshard_after_forward=False`` under PP; module
    docstring)."""
    return states.weights_unsharded_bytes + states.grads_unsharded_bytes
