"""The attention kernel of a training step: its backward's rate, and ring attention's overlap under CP.

- **backward rate**: a flash kernel's backward (2.5x its forward's FLOPs: dQ, dK, dV with the scores
  recomputed, :mod:`lmcost.operators.training`) reaches a lower fraction of peak than its forward; the
  GPU's fitted attention figures (``efficiency.attention_prefill``, per family) are forward timings, so
  the calibrated backward's time is divided by the family's backward/forward rate
  (:meth:`lmcost.cost.feature_figures.FeatureFigures.backward_fraction`). Training attention is
  compute-bound, so scaling the kernel's time scales its compute term (and its few microseconds of
  launch overhead with it).
- **ring attention** (Liu et al. 2023; Megatron-LM and Transformer Engine's context parallelism): under
  cp ranks each rank's s/cp queries meet the whole sequence's keys in cp steps of one K/V block each
  (the per-block kernel: :func:`lmcost.operators.parallel._context_parallel` gives the training record
  cp launches over s/cp-sized blocks); the send of the next block (``cp.kv_ring``, cp - 1 per layer;
  K/V and their gradients in the backward) runs beside the current block's attention, so only what
  exceeds it is exposed:

      exposed = (cp - 1) x max(0, t_send - overlap x t_block),   t_block = t_attention / cp

  per layer and pass, t_attention the layer's attention kernel time (all its blocks).
"""

from __future__ import annotations

import numpy as np

#: Roles of the attention kernel a ring step overlaps: a flash kernel, or a naive kernel's core.
ATTENTION_ROLES = ("attn.sdpa", "attn.score", "attn.softmax", "attn.value")
RING_ROLES = ("cp.kv_ring", "bwd.cp.kv_ring")


def backward_scaled(ops, per_op: np.ndarray, fraction: float) -> np.ndarray:
    """``per_op`` (seconds over their layers, one per op of ``ops``) with each flash backward
    (``bwd.attn.sdpa``) divided by ``fraction``, its rate over the forward's (a new array)."""
    out = np.array(per_op, dtype=float)
    for i, op in enumerate(ops):
        if op.role == "bwd.attn.sdpa":
            out[i] /= fraction
    return out


def ring_exposed(ops, per_op: np.ndarray, counts, overlap: float = 1.0) -> tuple[np.ndarray, float, float]:
    """Ring attention's K/V sends with their hidden part taken off (module docstring).

    ``ops``: a training graph's records; ``per_op``: seconds over their layers (one per op); ``counts``: the
    layers each op runs in (a ring op's count is layers x (cp - 1)); ``overlap``: the fraction of a block's
    attention time that hides a send (1).
    Returns: (per_op with each ring op's time its exposed part, seconds exposed, seconds hidden), over
    the graph's layers (one microbatch's path). A graph without ring ops comes back unchanged."""
    out = np.array(per_op, dtype=float)
    exposed = hidden = 0.0
    for i, op in enumerate(ops):
        if op.role not in RING_ROLES:
            continue
        bwd = op.role.startswith("bwd.")
        attn = [j for j, o in enumerate(ops) if o.group == op.group and o.role.startswith("bwd.") == bwd
                and o.role.removeprefix("bwd.") in ATTENTION_ROLES]
        layers = counts[attn[0]] if attn else 0
        if not layers:
            continue
        sends = counts[i] / layers  # cp - 1 per layer
        t_block = sum(per_op[j] for j in attn) / layers / (sends + 1)
        t_send = per_op[i] / counts[i]
        out[i] = counts[i] * max(0.0, t_send - overlap * t_block)
        exposed += out[i]
        hidden += per_op[i] - out[i]
    return out, float(exposed), float(hidden)
