"""One serving point: TTFT, TPOT, throughput and memory per GPU of a model on a parallel layout at a
batch, exactly. ``estimate`` asks it for one batch; ``plan`` for an array of batches per layout, each
element equal bit for bit to that batch asked alone (the same per-operator values, summed in the same
order), so the two never disagree.

For ``batch`` concurrent sequences of ``isl`` prompt tokens that each generate ``osl`` tokens, on the
layout of ``settings.layout`` (:class:`lmcost.operators.parallel.Layout`):

- one GPU's pass is a microbatch of batch / (dp * pp) sequences (``Layout.microbatch``);
- TTFT: the prefill of that microbatch times the pipeline fill (2pp - 1)/pp (:func:`pipeline_fill`);
- decode: the first token comes out of prefill; each of the other osl - 1 costs one decode step at
  context isl + 1, ..., isl + osl - 1, summed exactly (:func:`lmcost.cost.steps.time_over_steps`); TPOT
  is their mean (None for osl = 1; NaN in an array);
- throughput: batch * osl / (TTFT + the decode steps) tokens/s over the layout; per GPU, divided by
  its GPUs; per user, 1 / TPOT;
- memory per GPU (:mod:`lmcost.cost.memory`): weights + the KV cache at the final context isl + osl +
  the prefill's activation peak (under a layout: the busiest stage, with its collectives' buffers), and
  a vision tower's weights beside the decoder when ``settings.vision``; it fits when at most the GPU's;
- bound: of one decode step at the final context, as ``estimate`` reports its decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.memory import Footprint, activation_bytes, footprint, rank_footprint
from lmcost.cost.compile import phase_records
from lmcost.cost.phases import PhaseCost, op_times
from lmcost.cost.steps import time_over_steps
from lmcost.cost.roofline import bound
from lmcost.operators.parallel import staged
from lmcost.operators.workload import (MAX_COUNT, Settings, check_api_types, check_count, check_positions,
                                   require_decoder)
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.model.quant import effective

#: Past this magnitude (at the largest batch) an array of batch sizes is evaluated as Python ints, not
#: int64: a per-operator product could otherwise wrap.
_INT64_SAFE = 2**60


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingPoint:
    """TTFT, TPOT, throughput and memory per GPU of a layout at a batch (or, field by field, at each
    batch of an array): seconds, tokens/s, bytes."""

    batch: Any                  #: concurrent sequences over the layout
    isl: int                    #: prompt tokens per sequence
    osl: int                    #: generated tokens per sequence
    gpus: int                   #: GPUs of the layout
    ttft_s: Any                 #: time to the first token (s)
    tpot_s: Any                 #: mean time per output token after the first (s); None for osl = 1
    decode_s: Any               #: the osl - 1 decode steps together (s)
    tokens_per_s: Any           #: tokens/s over the layout
    tokens_per_s_per_gpu: Any
    tokens_per_s_per_user: Any  #: 1 / TPOT; None for osl = 1
    memory: Footprint           #: bytes per GPU (the busiest stage under a layout)
    fits: Any                   #: memory.total_bytes <= the GPU's memory
    bound: Any                  #: 'compute' or 'memory': a decode step at the final context
    quant: str | None           #: the quantization recipe in effect (:func:`lmcost.model.quant.effective`)
    #: For one batch: the prefill and the decode step at the final context (:class:`PhaseCost`), for
    #: callers that report them op by op (``estimate``); None for an array of batches.
    phases: tuple | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """Plain Python values (arrays as lists): the point's fields, memory as its JSON keys."""
        def plain(v):
            return v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v

        out = {k: plain(getattr(self, k)) for k in ("batch", "isl", "osl", "gpus", "ttft_s", "tpot_s", "decode_s",
                                                    "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user")}
        out["memory"] = {k: plain(v) for k, v in self.memory.to_dict().items()}
        out.update(fits=plain(self.fits), bound=plain(self.bound), quant=self.quant)
        return out


def pipeline_fill(layout) -> float:
    """Stage times a prefill takes over one stage's, (2pp - 1)/pp: the pp microbatches of a pass leave
    the pipeline after 2pp - 1 stage times, each stage 1/pp of the layers (Narayanan et al. 2021, section
    2.2); a decode step of each microbatch is one round through all stages, its time the path's."""
    return (2 * layout.pp - 1) / layout.pp


def _columns(per_op: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per-op seconds [ops, batches] times counts, summed per batch: the dot product
    :meth:`PhaseCost.time_s` takes of one workload (``@`` of two vectors), taken row by row of the
    contiguous [batches, ops] by ``np.vecdot``, which calls the same dot kernel on each row."""
    return np.vecdot(np.ascontiguousarray(per_op.T), counts)


def _batches(batch) -> np.ndarray:
    """``batch`` as a 1-D int64 array. Raises: LmcostError unless every count is in [1, 2^31]."""
    arr = np.asarray(batch)
    if arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
        raise LmcostError("batch", "must be an int or a non-empty 1-D array of ints", "give batch sizes as ints")
    bad = arr[(arr < 1) | (arr > MAX_COUNT)]
    if bad.size:
        check_count("batch", int(bad[0]))
    return arr.astype(np.int64)


def _exact(cfg, precision: Precision, settings: Settings, batch: np.ndarray, isl: int, osl: int) -> np.ndarray:
    """``batch`` as Python ints (an object array) where a per-operator value at the largest batch comes
    near int64's range (values grow with the batch, and an int64 product could wrap), else as it is."""
    top = settings.layout.microbatch(int(batch.max()))
    recs = [phase_records(cfg, precision, phase, top, tokens, settings)
            for phase, tokens in (("prefill", isl), ("decode", isl + osl))]
    if any(abs(v) >= _INT64_SAFE for rec in recs for col in rec.cols for v in col if v is not None):
        return batch.astype(object)
    return batch


def _check(cfg: ArchConfig, settings: Settings, batch, isl: int, osl: int, vector: bool) -> None:
    """The checks of a serving point's inputs (the first failing batch of an array is named).
    Raises: LmcostError."""
    require_decoder(cfg)
    check_count("isl", isl)
    check_count("osl", osl)
    check_positions(cfg, isl + osl, "prompt + gen", f"context {isl + osl}")
    layout = settings.layout
    if vector:
        layout.check(cfg)
        for b in batch[batch % (layout.dp * layout.pp) != 0][:1]:
            layout.check(cfg, int(b))
    else:
        layout.check(cfg, batch)
    if isl % layout.cp:
        raise LmcostError("workload.prompt", f"{isl} tokens do not split over cp={layout.cp} ranks",
                          f"use a prompt that is a multiple of {layout.cp}")
    if layout.sp:
        micro = layout.microbatch(batch)
        for m in np.atleast_1d(micro)[np.atleast_1d(isl * micro) % layout.tp != 0][:1]:
            raise LmcostError("workload.prompt", f"a prefill's {m} x {isl} tokens do not split over tp={layout.tp} (`sp`)",
                              f"use a prompt that is a multiple of {layout.tp}")


def serving_point(cfg: ArchConfig, gpu: GPU, precision: Precision, settings: Settings = Settings(), *,
                  batch, isl: int, osl: int) -> ServingPoint:
    """The serving point of ``batch`` sequences (an int, or a 1-D array of ints: every field then an
    array over them) of ``isl`` prompt tokens generating ``osl`` tokens, on ``settings.layout`` of
    ``gpu``. The model and its sources: the module docstring.

    Returns: :class:`ServingPoint`. Raises: LmcostError for a bidirectional model, counts out of range,
    a context past learned positions, a layout that cannot split the model or a batch that does not split
    over dp x pp, a prompt that does not split over cp (or over tp under SP); TypeError for an argument of
    the wrong kind.
    """
    check_api_types(cfg, gpu, precision, settings)
    vector = np.ndim(batch) > 0
    if vector:
        batch = _batches(batch)
    _check(cfg, settings, batch, isl, osl, vector)
    if vector:
        batch = _exact(cfg, precision, settings, batch, isl, osl)
    layout, model, context = settings.layout, settings.model, isl + osl
    b = layout.microbatch(batch)
    pre = phase_records(cfg, precision, "prefill", b, isl, settings)
    dec = phase_records(cfg, precision, "decode", b, context, settings)
    phases = None
    if vector:
        t_pre, t_dec = (op_times(r, gpu, precision, (model,)) for r in (pre, dec))
        counts_pre, counts_dec = (np.array(r.col("count"), dtype=float) for r in (pre, dec))
        prefill_s = _columns(getattr(t_pre, f"{model}_s"), counts_pre)
        compute_s, memory_s = _columns(t_dec.compute_s, counts_dec), _columns(t_dec.memory_s, counts_dec)
        steps_s = time_over_steps(cfg, gpu, precision, "decode", b, isl + 1, context - 1, settings, t_dec)
    else:
        phases = PhaseCost.of_phases([pre, dec], gpu, precision, ["prefill", "decode"], model)
        every = range(dec.n_ops)
        prefill_s = phases[0].time_s()
        compute_s, memory_s = phases[1].total_of(every, "compute_s"), phases[1].total_of(every, "memory_s")
        steps_s = time_over_steps(cfg, gpu, precision, "decode", b, isl + 1, context - 1, settings, phases[1])
    ttft = prefill_s * pipeline_fill(layout)
    if osl > 1:
        tpot = steps_s / (osl - 1)
        per_user = 1.0 / tpot
    else:
        tpot = per_user = np.full(len(batch), np.nan) if vector else None
    throughput = batch * osl / (ttft + steps_s)
    quant = effective(cfg, settings.quant)
    if layout.single:
        mem = footprint(cfg, precision, batch=batch, context=context, act_bytes=activation_bytes(pre), tokens=isl,
                        quant=quant)
    else:
        mem = rank_footprint(cfg, precision, layout, batch=batch, context=context, tokens=isl,
                             act_bytes=activation_bytes(pre), comm_bytes=staged(pre), quant=quant)
    if settings.vision:  # the tower's weights per replica, whole on every GPU (the layout does not split it)
        mem = mem.with_weights(cfg.vision_params * precision.B_w)
    if vector:  # every field over the batches, those that do not grow with them (weights) included
        mem = Footprint(**{k: np.broadcast_to(np.asarray(v), batch.shape) for k, v in mem.to_dict().items()})
    fits = mem.total_bytes <= gpu.memory_bytes
    return ServingPoint(batch=batch, isl=isl, osl=osl, gpus=layout.gpus, ttft_s=ttft, tpot_s=tpot, decode_s=steps_s,
                        tokens_per_s=throughput, tokens_per_s_per_gpu=throughput / layout.gpus,
                        tokens_per_s_per_user=per_user, memory=mem, fits=fits if vector else bool(fits),
                        bound=bound(compute_s, memory_s), quant=quant, phases=phases)
