"""Device memory of a run: weights + KV cache + activations (:class:`Footprint`), and the capacity
searches built on it.

The activation peak of a pass is the largest input + output of one of its operators plus the
residual stream [b, s, d] kept alive beside it: buffers of one operator are freed before the next
(an estimate of what an eager framework holds, not of its allocator's fragmentation).

Every function here takes one workload (ints: exact) or an array of batch sizes (each element equal
to the same batch taken alone, the arithmetic done in the same order).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.operators.recurrent import RECURRENT_KINDS, state_bytes
from lmcost.cost.params import param_counts
from lmcost.operators.attention import cached_tokens, kv_width
from lmcost.operators.sparse_attention import index_cache_bytes
from lmcost.operators.forward import Dims, forward_ops, layer_group_names
from lmcost.operators.ops import OpCost
from lmcost.operators.parallel import shard, stage_layers
from lmcost.operators.per_layer import layer_dims
from lmcost.operators.quant import weight_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class Footprint:
    """Bytes one GPU holds (bytes; ints for one workload where every term is whole, float where a dtype
    or recipe has fractional bytes; arrays over batch sizes for an array of them).

    ``comm_buffer_bytes`` and ``stage`` (the busiest pipeline stage, whose bytes these are) belong to a
    parallel layout (:func:`rank_footprint`); None on one GPU (:func:`footprint`).
    """

    weights_bytes: Any
    kv_cache_bytes: Any
    activations_bytes: Any
    total_bytes: Any
    comm_buffer_bytes: Any = None
    stage: Any = None

    def to_dict(self) -> dict:
        """The keys ``estimate --json`` prints under ``memory`` (the layout's two only under a layout)."""
        out = dict(weights_bytes=self.weights_bytes, kv_cache_bytes=self.kv_cache_bytes,
                   activations_bytes=self.activations_bytes)
        if self.comm_buffer_bytes is not None:
            out["comm_buffer_bytes"] = self.comm_buffer_bytes
        out["total_bytes"] = self.total_bytes
        if self.stage is not None:
            out["stage"] = self.stage
        return out

    def with_weights(self, extra) -> "Footprint":
        """This footprint with ``extra`` bytes of weights more (a vision tower held beside the decoder)."""
        return replace(self, weights_bytes=self.weights_bytes + extra, total_bytes=self.total_bytes + extra)


def weight_memory(cfg, precision: Precision, quant: str | None = None):
    """Bytes of the whole model's weights as stored: under the quantization recipe ``quant`` (the one in
    effect: :func:`lmcost.model.quant.effective`) its exact bytes per tensor
    (:func:`lmcost.operators.quant.weight_bytes`), else parameters x the weight dtype's bytes."""
    if quant:
        return weight_bytes(cfg, quant)["total"]
    return param_counts(cfg, precision)["total"] * precision.B_w


def activation_bytes(ops) -> list:
    """Each operator's activation bytes read + written, over the ops of a pass (phase records,
    :class:`lmcost.cost.phases.Records`, or a list of OpCost): what :func:`footprint` takes the peak of."""
    if hasattr(ops, "col"):
        return [r + w for r, w in zip(ops.col("act_read_bytes"), ops.col("act_write_bytes"))]
    return [op.act_read_bytes + op.act_write_bytes for op in ops]


def _most(values, default=0):
    """The largest of per-op values (Python's max over numbers; elementwise over arrays of batch sizes)."""
    values = list(values)
    if not values:
        return default
    if not any(isinstance(v, np.ndarray) for v in values):
        return max(values)
    return np.max(np.stack(np.broadcast_arrays(*values)), axis=0)


def _pick(better, new, old):
    """``new`` where ``better`` holds, else ``old`` (a bool, or elementwise over arrays)."""
    if isinstance(better, np.ndarray):
        return np.where(better, new, old)
    return new if better else old


def footprint(cfg, precision: Precision, *, batch, context: int, tokens: int, ops: list[OpCost] | None = None,
              act_bytes=None, block_size: int | None = None, quant: str | None = None) -> Footprint:
    """Bytes of weights (:func:`weight_memory`), of the KV cache of ``batch`` sequences at ``context``
    (paged in blocks of ``block_size`` tokens if given), and of the activations of a pass over ``tokens``
    new tokens per sequence: the peak of the ops of that pass (``ops``), or of each op's activation bytes
    read + written (``act_bytes``: :func:`activation_bytes`), and their total.
    """
    if act_bytes is None:
        act_bytes = activation_bytes(ops)
    weights = weight_memory(cfg, precision, quant)
    kv = kv_bytes(cfg, precision, batch, context, block_size)
    acts = _most(act_bytes) + batch * tokens * cfg.d_model * precision.B_a
    return Footprint(weights_bytes=weights, kv_cache_bytes=kv, activations_bytes=acts, total_bytes=weights + kv + acts)


def rank_footprint(cfg, precision: Precision, layout, *, batch, context: int, tokens: int, act_bytes,
                   comm_bytes=(), quant: str | None = None) -> Footprint:
    """Bytes one GPU of ``layout`` (:class:`lmcost.operators.parallel.Layout`) holds, for the busiest pipeline stage:
    its sharded weights (stage 0 has the embedding; the last stage the final norm and lm_head, a tied
    one as a copy), the KV cache of its layers for the ``batch``/dp sequences of its replica at ``context``
    (KV heads split over TP, a latent cache replicated), the activation peak of one pass over ``tokens``
    (``act_bytes``: each op's activation bytes on this GPU) plus the residual stream, and a staging buffer
    as large as its largest collective's payload (``comm_bytes``; an all-reduce runs in place, but the
    gathered logits are new memory). Never summed over GPUs: each GPU must hold its own.
    Under a quantization recipe ``quant`` a GPU's weights are its parameters times the recipe's bytes per
    parameter over the whole model (an approximation: the stage's mix of tensor kinds is not weighed).
    Over an array of batch sizes the busiest stage is chosen per batch.
    """

    seqs = batch // layout.dp
    x = shard(cfg, Dims.of(cfg, precision, seqs, 1, context), layout)
    best = None
    per_param = precision.B_w
    if quant:
        per_param = weight_memory(cfg, precision, quant) / param_counts(cfg, precision)["total"]
    for i, (params, kv_global, kv_local, state, kv_chunked) in enumerate(_stage_statics(cfg, precision, layout)):
        # per sequence: a global layer caches its t (t/cp under CP) tokens, a local one min(t, w), a chunked
        # one min(t, C); a constant-state layer its state (not split over TP or CP here: an upper bound)
        kv = seqs * (kv_global * x.t + (kv_local * cached_tokens(x, True) if kv_local else 0) + state
                     + (kv_chunked * cached_tokens(x, "chunked") if kv_chunked else 0))
        weights = params * per_param
        if best is None:
            best = (weights, kv, i)
        else:  # the first stage holding the most
            better = weights + kv > best[0] + best[1]
            best = tuple(_pick(better, new, old) for new, old in zip((weights, kv, i), best))
    weights, kv, stage = best
    acts = _most(act_bytes) + layout.microbatch(batch) * tokens * cfg.d_model * precision.B_a / layout.cp
    buffers = _most(comm_bytes)
    return Footprint(weights_bytes=weights, kv_cache_bytes=kv, activations_bytes=acts, comm_buffer_bytes=buffers,
                     total_bytes=weights + kv + acts + buffers, stage=stage)


_STAGES: dict = {}


def _stage_statics(cfg, precision: Precision, layout) -> list[tuple]:
    """Per pipeline stage of ``layout``: (parameters on one of its GPUs, KV bytes per cached token per
    sequence over its global layers, the same over its local layers, constant-state bytes per sequence
    over its recurrent layers, KV bytes per cached token over its chunked layers), built once per (config, precision,
    layout): the embedding on stage 0, the final norm and lm_head on the last (a tied table as a copy)."""
    key = (id(cfg), precision, layout)
    hit = _STAGES.get(key)
    if hit is not None and hit[0] is cfg:
        return hit[1]

    x = shard(cfg, Dims.of(cfg, precision, 1, 1, 1), layout)
    ops = forward_ops(cfg, x)
    per_layer: dict = {}
    for op in ops:
        if op.group:
            per_layer[op.group] = per_layer.get(op.group, 0) + op.params
    embed = sum(op.params for op in ops if op.role in ("embed", "pos_embed", "embed_norm"))  # + BLOOM's embed LayerNorm
    head = sum(op.params for op in ops if op.role in ("final_norm", "lm_head"))
    if cfg.tie_embeddings and layout.pp > 1 and cfg.embeddings:
        head += sum(op.params for op in ops if op.role == "embed")  # the last stage's copy of the tied table
    kinds = cfg.layer_kinds()
    groups = layer_group_names(cfg)
    width = kv_width(cfg, x) * x.B_kv + index_cache_bytes(cfg, x)  # + DSA's index keys (0 without)
    stages = stage_layers(cfg, layout.pp, layout.stage_split)
    out = []
    for i, layers in enumerate(stages):
        params = sum(per_layer[groups[j]] for j in layers)
        params += (embed if i == 0 else 0) + (head if i == len(stages) - 1 else 0)
        n_local = sum(1 for j in layers if kinds[j][0] in ("local", "local_nope"))
        n_chunked = sum(1 for j in layers if kinds[j][0] in ("chunked", "chunked_nope"))
        n_other = sum(1 for j in layers if kinds[j][0] in RECURRENT_KINDS or kinds[j][0] == "none")
        state = sum(state_bytes(cfg, kinds[j][0], precision.B_kv) for j in layers if kinds[j][0] in RECURRENT_KINDS)
        local_width = kv_width(cfg, layer_dims(cfg, x, "local")) * x.B_kv + index_cache_bytes(cfg, x)  # MiMo-V2-Flash
        out.append((params, (len(layers) - n_local - n_chunked - n_other) * width, n_local * local_width, state,
                    n_chunked * width))
    if len(_STAGES) > 256:
        _STAGES.clear()
    _STAGES[key] = (cfg, out)
    return out


def largest(fits, limit: int) -> int:
    """The largest n in [0, limit] with fits(n), for a ``fits`` that is true up to some n and false after
    (fits(0) is taken as true). Exponential then binary search: O(log limit) calls."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)  # fits(lo) is true; fits(hi) false, or hi is past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def check_block(block_size: int | None) -> None:
    """Raises: LmcostError unless block_size is None or a whole number of tokens from 1 to 2^31 (the
    longest context lmcost takes: a block past it holds no real cache)."""
    if block_size is not None and not 1 <= block_size <= 2**31:
        raise LmcostError("block_size", f"must be from 1 to {2**31:,}, got {block_size}",
                          "give tokens per block, e.g. 16")
