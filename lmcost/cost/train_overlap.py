"""Exposed data-parallel communication of a training step, from a schedule rather than an assumption.

One model serves every case (:func:`schedule`): a compute stream runs units one after another, and one
communication stream (FIFO: the network is shared) runs the collectives they need. Unit i may start when
unit i - 1 has finished and the collective it needs first (``pre``, e.g. its parameters' all-gather) is
done; a collective it issues after it (``post``, e.g. its gradients' reduce-scatter) queues behind those
issued before. A ``pre`` collective is issued ``depth`` units ahead: when unit i - depth starts (at the
start for the first ``depth``), or, with depth 0, when unit i - 1 ends (just in time). The exposed time is
what the makespan adds to the compute alone: the first unit's gather, then per unit what its
communication exceeds the compute it hides under (exactly so for equal units), and the last ``post``
collective, which nothing hides.

Uses (:func:`zero3_step`, :func:`bucketed`):

- **ZeRO-3 / FSDP** (units = transformer blocks, one FSDP unit each, plus the root unit: embedding, final
  norm and lm_head, gathered first and kept through the backward, as FSDP keeps its root unsharded): per
  microbatch, the forward all-gathers each block's parameters (prefetched ``forward_prefetch`` units
  ahead); the backward gathers them again (FSDP reshards after the forward by default; Zhao et al. 2023,
  "PyTorch FSDP", VLDB) ``backward_prefetch`` units ahead (FSDP's default BACKWARD_PRE: 1), and again for
  the recompute forward where the framework re-fetches them (DeepSpeed ZeRO-3); each block's gradients are
  reduce-scattered after its backward. Gathers and reduce-scatters share the stream. The smaller the
  micro-batch, the less compute each gather hides under: the exposure grows as it shrinks.
- **DP gradient reduce** (ZeRO-0/1/2): gradients are reduced in buckets (DDP's 25 MiB, Megatron-Core's
  max(40M, 1M x dp) elements, DeepSpeed's 5e8: the framework YAML), each issued when the backward has
  produced it (evenly over the last microbatch's backward), so only the backward that remains hides it:
  the last bucket is exposed whole. One bucket exposes the whole reduce.
- **ZeRO-1/2 parameter all-gather**: the same buckets, all-gathered under the next forward where the
  framework overlaps it (Megatron-LM --overlap-param-gather), else after the optimizer step, exposed.

Times are per GPU, seconds; a collective's time is :mod:`lmcost.cost.collectives`' (latency per bucket
included, so more buckets cost more latency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def schedule(compute: list[float], pre: list[float], post: list[float], depth: int) -> float:
    """The makespan (s) of units with compute times ``compute``, each needing the collective ``pre[i]``
    before it starts and issuing ``post[i]`` when it ends, on one FIFO communication stream, ``pre``
    issued ``depth`` units ahead (the module docstring). Lists of equal length; times >= 0."""
    n = len(compute)
    free = 0.0  # the communication stream is busy until then

    def send(issue: float, dur: float) -> float:
        nonlocal free
        if dur > 0:
            free = max(issue, free) + dur
            return free
        return issue

    ready: list[float | None] = [None] * n
    for j in range(min(depth, n)):
        ready[j] = send(0.0, pre[j])
    t = 0.0
    for i in range(n):
        if ready[i] is None:  # just in time: issued when the unit before it ends
            ready[i] = send(t, pre[i])
        start = max(t, ready[i])
        ahead = i + depth
        if depth and ahead < n and ready[ahead] is None:
            ready[ahead] = send(start, pre[ahead])
        t = start + compute[i]
        send(t, post[i])
    return max(t, free)


@dataclass(frozen=True)
class Exposed:
    """Communication issued (``comm_s``) and the part the compute did not hide (``exposed_s``), seconds."""

    comm_s: float
    exposed_s: float

    @property
    def hidden_s(self) -> float:
        """The communication that ran under compute (s)."""
        return max(0.0, self.comm_s - self.exposed_s)


def exposed(compute: list[float], pre: list[float], post: list[float], depth: int) -> Exposed:
    """:func:`schedule`'s makespan less the compute: what the collectives add (:class:`Exposed`)."""
    return Exposed(sum(pre) + sum(post), max(0.0, schedule(compute, pre, post, depth) - sum(compute)))


@dataclass(frozen=True)
class Units:
    """One microbatch's compute on one GPU, by ZeRO-3 unit (s): ``head`` the layers before the first block
    (embedding), ``block_fwd``/``block_bwd`` one block's forward and backward (its recompute forward
    included), ``tail_fwd``/``tail_bwd`` the final norm, lm_head and loss, ``n`` blocks."""

    head_fwd: float
    block_fwd: float
    tail_fwd: float
    head_bwd: float
    block_bwd: float
    tail_bwd: float
    n: int


def zero3_step(u: Units, gather_s: float, root_gather_s: float, rs_s: float, root_rs_s: float, *,
               forward_prefetch: int, backward_prefetch: int, regather: bool) -> tuple[Exposed, Exposed]:
    """ZeRO-3/FSDP communication of one microbatch (the module docstring): (parameter gathers, gradient
    reduce-scatters), each with its exposed part. ``gather_s``/``rs_s``: one block's all-gather and
    reduce-scatter (s); ``root_*``: the root unit's; ``regather``: the recompute forward gathers again.
    The reduce-scatters' exposure is what they add to the backward with its gathers alone."""
    n = u.n
    fwd = exposed([u.head_fwd] + [u.block_fwd] * n + [u.tail_fwd], [root_gather_s] + [gather_s] * n + [0.0],
                  [0.0] * (n + 2), forward_prefetch)
    again = gather_s * (2 if regather else 1)
    comp = [u.tail_bwd] + [u.block_bwd] * n + [u.head_bwd]
    pre = [0.0] + [again] * n + [0.0]
    alone = exposed(comp, pre, [0.0] * (n + 2), backward_prefetch)
    both = exposed(comp, pre, [0.0] + [rs_s] * n + [root_rs_s], backward_prefetch)
    gathers = Exposed(fwd.comm_s + alone.comm_s, fwd.exposed_s + alone.exposed_s)
    return gathers, Exposed(both.comm_s - alone.comm_s, max(0.0, both.exposed_s - alone.exposed_s))


def buckets(total_bytes: float, bucket_bytes: float) -> list[float]:
    """``total_bytes`` cut into buckets of ``bucket_bytes`` (the last one the remainder); [] for nothing."""
    if total_bytes <= 0:
        return []
    k = max(1, math.ceil(total_bytes / bucket_bytes))
    return [bucket_bytes] * (k - 1) + [total_bytes - bucket_bytes * (k - 1)]


def bucketed(total_bytes: float, bucket_bytes: float, window_s: float, time_of, *, before: bool,
             depth: int = 0) -> Exposed:
    """A collective over ``total_bytes`` cut into buckets (:func:`buckets`), under ``window_s`` seconds of
    compute that each bucket's share of bytes spans. ``time_of(bytes)``: one bucket's time (s).
    ``before`` False: each bucket issued when its share of the window has run (gradients reduced as the
    backward makes them: the last bucket exposed); True: each needed before its share runs, issued
    ``depth`` shares ahead (parameters gathered for the forward)."""
    sizes = buckets(total_bytes, bucket_bytes)
    if not sizes:
        return Exposed(0.0, 0.0)
    comp = [window_s * b / total_bytes for b in sizes]
    once = {b: time_of(b) for b in set(sizes)}  # every bucket but the last is one size: each size timed once
    times = [once[b] for b in sizes]
    zeros = [0.0] * len(sizes)
    return exposed(comp, times, zeros, depth) if before else exposed(comp, zeros, times, 0)
