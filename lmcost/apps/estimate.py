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

Modules: the inputs and their checks are :mod:`lmcost.graph.workload`; phases, records and totals are
:mod:`lmcost.cost.phases`; this module only assembles the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import GPU
from lmcost.cost.kvcache import kv_bytes_per_token, state_bytes_per_sequence
from lmcost.cost.memory import footprint, rank_footprint
from lmcost.cost.params import param_counts
from lmcost.graph.parallel import cluster_for, staged
# Re-exported for callers of the API before the split into workload / phases / estimate (issue 10).
from lmcost.cost.phases import (PhaseCost, grid, op_table, op_totals, phase_ops, phase_records,  # noqa: F401
                                phase_totals, time_over_steps)
from lmcost.graph.assembly import ALL_PHASES, PHASES, phase_dims  # noqa: F401
from lmcost.graph.workload import (MAX_COUNT, MAX_GEN, Settings, Workload, check_api_types, check_count,  # noqa: F401
                       check_positions, require_decoder)


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
    #: The config's own quantization recipe (``cfg.quant``), used when the settings name none.
    quant_of_model: str | None = None

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
                          quant=self.settings.quant or self.quant_of_model,
                          layout=dict(tp=self.settings.layout.tp, pp=self.settings.layout.pp,
                                      ep=self.settings.layout.ep, dp=self.settings.layout.dp,
                                      cp=self.settings.layout.cp, sp=self.settings.layout.sp,
                                      gpus=self.settings.layout.gpus, ep_imbalance=self.settings.layout.imbalance,
                                      cluster=self.cluster,
                                      batch_per_gpu=self.settings.layout.microbatch(self.workload.batch)),
                          attention_kernel=self.selection[0] if self.selection else None,
                          runtime=self.selection[1] if self.selection else None),
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
    """Parameters, KV cache, memory, prefill and decode costs and times of ``workload`` on ``gpu``.

    Memory is weights + KV cache at the final context + the activation peak of prefill
    (:func:`lmcost.cost.memory.footprint`). FLOPs and bytes are exact ints. Under a quantization recipe
    (``settings.quant``, else ``cfg.quant``: :mod:`lmcost.graph.quant`) weight bytes read and held follow it.
    Raises: LmcostError if the GPU has no peak for the activation dtype, or the context exceeds a
    learned position table; TypeError if an argument is not the kind of object named.
    """
    check_api_types(cfg, gpu, precision, settings, workload)
    wl = workload
    require_decoder(cfg)
    check_positions(cfg, wl.context, "prompt + gen", f"context {wl.context}")
    layout = settings.layout
    layout.check(cfg, wl.batch)
    if wl.prompt % layout.cp:
        raise LmcostError("workload.prompt", f"{wl.prompt} tokens do not split over cp={layout.cp} ranks",
                          f"use a prompt that is a multiple of {layout.cp}")
    if layout.sp and (wl.prompt * layout.microbatch(wl.batch)) % layout.tp:
        raise LmcostError("workload.prompt", f"a prefill's {layout.microbatch(wl.batch)} x {wl.prompt} tokens do not split "
                          f"over tp={layout.tp} (`sp`)", f"use a prompt that is a multiple of {layout.tp}")
    # One GPU's pass: batch / (dp * pp) sequences (the whole batch on one GPU). With pp stages the pp
    # microbatches of a prefill leave the pipeline after 2pp - 1 stage times, and a decode step of each
    # microbatch is one round through all stages: the path's time (Narayanan et al. 2021, section 2.2).
    b = layout.microbatch(wl.batch)
    fill = (2 * layout.pp - 1) / layout.pp
    params = param_counts(cfg, precision)
    pre = phase_records(cfg, precision, "prefill", b, wl.prompt, settings)
    dec = phase_records(cfg, precision, "decode", b, wl.context, settings)
    pre_cost, dec_cost = PhaseCost.of_phases([pre, dec], gpu, precision, ["prefill", "decode"], settings.model)
    ttft = pre_cost.time_s() * fill
    steps_s = time_over_steps(cfg, gpu, precision, "decode", b, wl.prompt + 1, wl.prompt + wl.gen - 1,
                              settings, dec_cost)
    tpot = steps_s / (wl.gen - 1) if wl.gen > 1 else None
    total_s = ttft + steps_s
    ttft_band = tpot_band = None
    if settings.model == "calibrated" and gpu.efficiency is not None and gpu.efficiency.bands:
        # each op's band summed over ops (errors within a class move together)
        lo, hi = (pre_cost.total_of(range(pre.n_ops), k) for k in ("calibrated_low_s", "calibrated_high_s"))
        ttft_band = (min(ttft, fill * max(lo, pre_cost.total_of(range(pre.n_ops), "roofline_s"))), fill * hi)
        if wl.gen > 1:
            tpot_band = tuple(time_over_steps(cfg, gpu, precision, "decode", b, wl.prompt + 1,
                                              wl.prompt + wl.gen - 1, settings, dec_cost, key=k) / (wl.gen - 1)
                              for k in ("calibrated_low_s", "calibrated_high_s"))

    acts = [ar + aw for ar, aw in zip(pre.col("act_read_bytes"), pre.col("act_write_bytes"))]
    quant = settings.quant or cfg.quant
    if layout.single:
        mem = footprint(cfg, precision, batch=wl.batch, context=wl.context, act_bytes=acts, tokens=wl.prompt,
                        quant=quant)
    else:
        mem = rank_footprint(cfg, precision, layout, batch=wl.batch, context=wl.context, tokens=wl.prompt,
                             act_bytes=acts, comm_bytes=staged(pre), quant=quant)
    if settings.vision:
        # The tower's weights per replica, whole on every GPU (it is not split by the layout).
        tower = cfg.vision_params * precision.B_w
        mem = dict(mem, weights_bytes=mem["weights_bytes"] + tower, total_bytes=mem["total_bytes"] + tower)
    return Estimate(
        model=cfg.name, gpu=gpu.name, precision=precision, workload=wl, settings=settings, params=params,
        kv_cache=dict(bytes_per_token=kv_bytes_per_token(cfg, precision), bytes_total=mem["kv_cache_bytes"],
                      state_bytes_per_sequence=state_bytes_per_sequence(cfg, precision),
                      context=wl.context, batch=wl.batch),
        memory=dict(**mem, capacity_bytes=gpu.memory_bytes, fits=bool(mem["total_bytes"] <= gpu.memory_bytes)),
        ttft_s=ttft, tpot_s=tpot,
        throughput_tokens_per_s=wl.batch * wl.gen / total_s, phases=(pre_cost, dec_cost),
        ttft_band_s=ttft_band, tpot_band_s=tpot_band,
        selection=(gpu.efficiency.kernel, gpu.efficiency.runtime) if gpu.efficiency is not None else None,
        cluster=None if layout.single else cluster_for(layout, gpu).name, quant_of_model=cfg.quant)
