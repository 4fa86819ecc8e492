"""Energy and dollars of a serving run: each engine step's joules from its roofline split, idle time at idle
power, and the GPU-hours a price turns into $ per million tokens.

Power model (per GPU; figures from the GPU YAML's ``power`` block, :class:`lmcost.hardware.power.GpuServingPower`,
and its ``tdp_w``). A step's time is a sum of operator groups (:data:`lmcost.cost.engine_step.GROUPS`), each
bound by compute (``*.compute``: FLOPs at peak) or by memory (``*.memory``), or a collective (``comm``), or at
the kernel floor (``floor``), plus the engine's CPU overheads. Each runs at one power level:

    P_compute = the power limit (TDP, or the cap):      groups *.compute
    P_memory  = memory_bound_fraction x TDP (<= cap):   groups *.memory and comm
    P_idle    = idle_fraction x TDP (<= cap):           floor, CPU overheads, and the engine idle

so a run's joules per GPU are  E = P_idle x span + sum_g (P_g - P_idle) x T_g,  T_g the time the run's steps
spent in group g (span: first arrival to last finish; the idle floor is drawn throughout). The compute-bound
level is the TDP because a compute-bound kernel stream is held at the power limit by the clock governor
(the premise of :func:`lmcost.hardware.power.power_clock`); the idle and memory-bound levels are priors until
measured (the YAML says which; reports/serve-energy.md sets the J/token they give against ML.ENERGY's).

Power cap (``--power-limit``): the SM clock falls to f = (P_cap / TDP)^(1/alpha) of the sustained one
(:func:`lmcost.hardware.power.power_clock`, Mudge 2001's cube law for alpha = 3), so the compute-bound groups'
time is divided by f and they draw P_cap; memory-bound time, collectives, the floor and the CPU overheads are
kept (the HBM clock is not capped) and draw min(P, P_cap). A cap at or above the TDP changes nothing.

How the times reach the power: :class:`Metered` wraps the step model the simulation calls and sums, per
GPU, the excess joules (over P_idle) of every step it runs: each step the simulation costs
one by one (:meth:`Metered.step_s`) and each closed-form run of decode steps it commits
(:meth:`Metered.decode_run`, summed cell by cell as the simulation sums the run's time; the one line the
simulation has for energy calls it). The energy tables
are the step model's own, each group's time weighted by its watts over the floor (``StepModel.scaled``):
the same operators, grid and interpolation as the times. They are a speculative step model's twin too
(:func:`energy_model`: draft and verification weighted alike). Wide EP's re-timed tokens table keeps each
operator group's compute seconds at its level and adds one group, ``wide_ep``, the all-to-all's exposed
seconds (DeepEP's, and what TBO leaves uncovered), drawn at the memory-bound level as a collective. A prefix cache's hits are prefill the steps do not run; KV offload's
loads from the host tier, busy time outside the step model, are drawn at the idle floor (the PCIe copy's own
power is not modelled).

Prefill vs decode attribution (``j_per_input_token``, ``usd_per_mtok_input``): in each step the
context-free operators (projections, FFN, collectives) split by tokens (prefill chunk tokens vs decodes),
the lm_head by sampling sequences (a chunk that completes a prompt samples its first token: prefill), the
attention by its phase; the engine's CPU overheads go to decode. Prefill's share of the busy time is its
seconds over the busy seconds. The excess joules follow the split exactly; the idle floor (P_idle x span:
the engine idle included) and the GPU-hours split by prefill's share of the busy time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from lmcost.basics.errors import LmcostError
from lmcost.cost.engine_step import StepModel
from lmcost.hardware.power import GpuServingPower, power_clock


@dataclass(frozen=True)
class ServePower:
    """A GPU's power levels while serving (W) and the clock a cap leaves (fraction of the sustained clock)."""

    idle_w: float
    memory_w: float
    compute_w: float
    tdp_w: float
    power_limit_w: float | None
    clock: float

    def group_w(self, group: str) -> float:
        """Watts of an operator group of :data:`lmcost.cost.engine_step.GROUPS` (the module docstring's levels)."""
        if group.endswith(".compute"):
            return self.compute_w
        return self.idle_w if group == "floor" else self.memory_w


def serve_power(gpu, power_limit_w: float | None = None, field: str = "power_limit") -> ServePower:
    """``gpu``'s power levels (W) under ``power_limit_w`` (None: its default limit, the TDP) and the clock the
    cap allows (:func:`lmcost.hardware.power.power_clock`, the GPU's ``training.power_exponent`` or 3).
    Raises: LmcostError naming ``field`` for a GPU without ``tdp_w``, or power_clock's errors."""
    if not gpu.tdp_w:
        raise LmcostError("gpu", f"{gpu.name}'s YAML has no tdp_w to take its power from",
                          "add tdp_w (and a power block) to the GPU YAML")
    fig = gpu.power or GpuServingPower()
    alpha = gpu.training.power_exponent if gpu.training is not None else 3.0
    clock = power_clock(power_limit_w, gpu.tdp_w, alpha, field)
    top = gpu.tdp_w if power_limit_w is None else min(gpu.tdp_w, power_limit_w)
    return ServePower(idle_w=min(top, fig.idle_fraction * gpu.tdp_w),
                      memory_w=min(top, max(fig.idle_fraction, fig.memory_bound_fraction) * gpu.tdp_w),
                      compute_w=top, tdp_w=gpu.tdp_w, power_limit_w=power_limit_w, clock=clock)


def clocked(step, power: ServePower):
    """``step`` (:class:`lmcost.cost.engine_step.StepModel`) with its compute-bound groups' time divided by the
    cap's clock (the module docstring); ``step`` itself when the clock is 1 (no cap, or one at or above TDP)."""
    if power.clock >= 1.0:
        return step
    return step.scaled({g: s / power.clock if g.endswith(".compute") else s for g, s in step.scales.items()})


@lru_cache(maxsize=8)
def energy_model(step, power: ServePower):
    """``step``'s twin whose times are excess joules over the idle floor (each group's time x its watts less
    P_idle): a :class:`lmcost.cost.engine_step.StepModel` re-weighted (``scaled``; a group another feature adds
    to its tables, such as wide EP's exposed all-to-all, at the memory-bound level), or a speculative step model
    (:class:`lmcost.cost.spec_decode.SpecStepModel`) rebuilt over its target's and draft's twins."""
    if hasattr(step, "target"):
        from lmcost.cost.spec_decode import SpecStepModel

        return SpecStepModel(energy_model(step.target, power), step.method, step.k, step.tokens_per_step,
                             draft=None if step.draft is None else energy_model(step.draft, power),
                             head_weights_bytes=step.head_weights_bytes)
    groups = set(step.scales).union(*(t.parts for t in (step.tokens, step.head, step.prefill_attention)))
    return step.scaled({g: step.scales.get(g, 1.0) * (power.group_w(g) - power.idle_w) for g in groups})


class Metered:
    """The step model the simulation calls (:func:`lmcost.apps.serve_sim.simulate`), which sums the GPU work of
    the steps it runs: :meth:`step_s` (one step, run as soon as asked) and :meth:`decode_run` (a closed-form
    run of decode steps, called when the simulation commits one) add their excess joules over the idle
    floor, and :meth:`step_s` prefill's seconds and excess joules (module docstring). ``step``: a
    :class:`lmcost.cost.engine_step.StepModel` (already :func:`clocked`) or a speculative one; ``power``: its
    levels. Every other attribute is the step model's own, so a step costed through another method (a
    feature that adds one) carries no excess joules (drawn at the idle floor): an undercount, until it
    reports its work here."""

    def __init__(self, step, power: ServePower):
        self._t = step
        self._e = energy_model(step, power)
        self.excess_j = 0.0                      #: per GPU, over the steps run
        self.prefill_s = self.prefill_j = 0.0    #: of them, prefill's seconds and excess joules
        if type(step) is StepModel:  # the same sums, each table read once for both models (bit for bit)
            self.step_s, self.decode_attention = self._plain_step_s, self._noted_decode_attention
        self._seen: dict = {}  # (n, context) -> the twin's decode attention there, read beside the time's

    def __getattr__(self, name):
        return getattr(self._t, name)

    def step_s(self, n_decode: int, mean_context: float, chunks=(), n_out: int | None = None) -> float:
        """:meth:`lmcost.cost.engine_step.StepModel.step_s`, its work summed (prefill's by the module
        docstring's rule; a speculative decode's rows are k + 1 tokens at the target, and the drafter's pass
        over a prompt counts to decode)."""
        t, e = self._t, self._e
        value = t.step_s(n_decode, mean_context, chunks, n_out)
        self.excess_j += e.step_s(n_decode, mean_context, chunks, n_out)
        if chunks:
            new = sum(c for _, c in chunks)
            finishing = len(chunks) if n_out is None else n_out - n_decode
            rows = n_decode * getattr(t, "decode_rows", 1)
            share_h = finishing / (rows + finishing) if rows + finishing else 0.0
            for m, key in ((t, "prefill_s"), (e, "prefill_j")):
                base = getattr(m, "target", m)
                part = new / (rows + new) * base.tokens(rows + new) + share_h * base.head(rows + finishing)
                for p, c in chunks:
                    part += base.prefill_attention(p + c) - base.prefill_attention(p)
                setattr(self, key, getattr(self, key) + part)
        return value

    def _plain_step_s(self, n_decode: int, mean_context: float, chunks=(), n_out: int | None = None) -> float:
        """:meth:`step_s` for a plain :class:`lmcost.cost.engine_step.StepModel` (one row a decode): its and its
        twin's table values read once each (the prefill share's tokens and head terms are the step's own, as
        rows + new and rows + finishing are its tokens and samples), added in the order :meth:`step_s` adds
        them, so every sum is bit for bit the same (tests/test_serve_energy.py checks); the simulation's hot
        path, where the generic one cost 1.5x plain simulation time (reports/serve-speed.md)."""
        t, e = self._t, self._e
        new = sum(c for _, c in chunks)
        tokens = n_decode + new
        out = n_decode + len(chunks) if n_out is None else n_out
        tk, ek = t.tokens(tokens), e.tokens(tokens)
        th, eh = t.head(out), e.head(out)
        ta, ea = t.decode_attention_pair(e, n_decode, mean_context)
        value, excess = tk + th + ta, ek + eh + ea
        if chunks:
            tp, ep = t.prefill_attention, e.prefill_attention
            finishing = out - n_decode
            share_h = finishing / out if out else 0.0
            part_t, part_e = new / tokens * tk + share_h * th, new / tokens * ek + share_h * eh
            for p, c in chunks:
                a, b = tp(p + c) - tp(p), ep(p + c) - ep(p)
                value += a
                excess += b
                part_t += a
                part_e += b
            self.prefill_s += part_t
            self.prefill_j += part_e
        self.excess_j += excess
        return value

    def decode_run(self, n: int, mean_context: float, k: int, cells=None) -> None:
        """Sum the work of ``k`` decode steps of ``n`` sequences from ``mean_context`` (each step's context a
        more, a the step model's ``tokens_per_step``, 1 but under speculative decoding): tokens(n) + head(n) +
        decode_attention(n, c) per step, the attention summed cell by cell of its grid, in each of which it is
        affine in the context (the trapezoid of its ends is exact), as the simulation sums the run's time (its
        seconds are the simulation's busy time; all decode work). ``cells``: the simulation's segments of the
        run, (first, last step's seconds, steps, n) each: its steps per cell, the walk of the grid done
        (the same cells: the run's steps end where the walk's would)."""
        e, seen = self._e, self._seen
        adv = getattr(self._t, "tokens_per_step", 1)
        excess = k * (e.tokens(n) + e.head(n))
        c, j = float(mean_context), 0
        steps = iter(() if cells is None else [cell[2] for cell in cells])
        while j < k:
            m = next(steps, 0)
            if not m:
                end = e.context_cell_end(c)
                m = k - j if end == math.inf else max(1, min(k - j, math.floor((end - c) / adv) + 1))
            x = c + adv * (m - 1)
            a, b = seen.get((n, c)), seen.get((n, x))
            excess += m * ((e.decode_attention(n, c) if a is None else a)
                           + (e.decode_attention(n, x) if b is None else b)) / 2
            c, j = c + adv * m, j + m
        self.excess_j += excess
        seen.clear()

    def _noted_decode_attention(self, n: int, c: float) -> float:
        """The step model's :meth:`~lmcost.cost.engine_step.StepModel.decode_attention`, the twin's value at the
        same point noted for :meth:`decode_run` (the simulation reads the time at every cell's first and last
        step of a closed-form run before it commits the run: the same points; bit for bit the twin's own)."""
        value, self._seen[n, c] = self._t.decode_attention_pair(self._e, n, c)
        if len(self._seen) > 4096:  # runs evaluated and not committed: none is read twice
            self._seen.clear()
        return value


def energy_summary(meter: Metered, busy_s: float, span_s: float, power: ServePower, *, gpus: int,
                   input_tokens: float, output_tokens: float, requests: int) -> tuple[dict, float]:
    """The ``energy`` JSON of a run from the work ``meter`` summed over one replica's steps, their ``busy_s``
    and ``span_s`` (s), its ``gpus``, and what it served (tokens and requests, all > 0). Definitions (module docstring's model):
    ``joules`` all GPUs over the span; ``j_per_token`` = joules / output tokens, as ML.ENERGY's energy per
    output token (GPU energy over the run divided by the tokens generated, Chung et al. 2025);
    ``j_per_input_token`` / ``j_per_output_token``: prefill's / decode's share (module docstring's rule) over
    input / output tokens; ``mean_power_w`` per GPU. Returns: (the dict, prefill's share of GPU work)."""
    excess, pre_t, pre_e = meter.excess_j, meter.prefill_s, meter.prefill_j
    share = min(1.0, pre_t / busy_s) if busy_s > 0 else 0.0
    floor = power.idle_w * span_s
    per_gpu = floor + excess
    pre = pre_e + share * floor
    return dict(joules=per_gpu * gpus, j_per_token=per_gpu * gpus / output_tokens,
                j_per_input_token=pre * gpus / input_tokens, j_per_output_token=(per_gpu - pre) * gpus / output_tokens,
                j_per_request=per_gpu * gpus / requests, mean_power_w=per_gpu / span_s if span_s > 0 else power.idle_w,
                prefill_share=share, power_w=dict(idle=power.idle_w, memory_bound=power.memory_w,
                                                 compute_bound=power.compute_w),
                power_limit_w=power.power_limit_w, clock=power.clock), share


def cost_summary(usd_per_gpu_hour: float, span_s: float, prefill_share: float, *, gpus: float,
                 input_tokens: float, output_tokens: float, requests: float) -> dict:
    """The ``cost`` JSON of a run: ``gpu_hours`` = GPUs x span / 3600 (every GPU held the whole span) and
    ``usd_per_gpu_hour`` x that, per million input tokens (prefill's share of the GPU work), per million
    output tokens (decode's share), per million tokens (all of it over input + output tokens: blended) and
    per request. Counts as served by all GPUs (all > 0)."""
    hours = gpus * span_s / 3600.0
    usd = hours * usd_per_gpu_hour
    return dict(usd_per_gpu_hour=usd_per_gpu_hour, gpu_hours=hours, usd=usd,
                usd_per_mtok_input=usd * prefill_share / input_tokens * 1e6,
                usd_per_mtok_output=usd * (1.0 - prefill_share) / output_tokens * 1e6,
                usd_per_mtok=usd / (input_tokens + output_tokens) * 1e6, usd_per_request=usd / requests)
