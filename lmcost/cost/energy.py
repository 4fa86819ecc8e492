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

How the times reach the power: :class:`Metered` wraps the step model the simulation calls and returns each
time as a :class:`Dual`, a float that carries the same time's excess joules (over P_idle) and its prefill
share beside it (forward-mode dual numbers: every time the simulation forms is a linear combination of the
step model's values and its CPU overheads, which carry no excess, so the sum it keeps of its busy time,
:attr:`lmcost.apps.serve_sim.Trace.busy_s`, carries the run's excess joules exactly, closed-form decode runs
included). The simulation itself is untouched.

Prefill vs decode attribution (``j_per_input_token``, ``usd_per_mtok_input``): in each step the
context-free operators (projections, FFN, collectives) split by tokens (prefill chunk tokens vs decodes),
the lm_head by sampling sequences (a chunk that completes a prompt samples its first token: prefill), the
attention by its phase. The excess joules follow that split exactly; the idle floor (P_idle x span: the
CPU's share of steps and the engine idle) and the GPU-hours split in proportion to the GPU work's seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcost.basics.errors import LmcostError
from lmcost.hardware.power import GpuServingPower, power_clock

_ZERO = (0.0, 0.0, 0.0, 0.0)


class Dual(float):
    """Seconds (the float's value) carrying ``parts`` = (excess joules over the idle floor, GPU seconds from
    the step model, of them prefill's, prefill's excess joules), per GPU. Sums, differences and products with
    plain numbers keep the parts linear (a plain number is a CPU overhead: no GPU work, no excess); a product
    or ratio of two Duals, and any other operation, is a plain float."""

    def __new__(cls, value: float, parts: tuple = _ZERO):
        d = float.__new__(cls, value)
        d.parts = parts
        return d

    def __add__(self, o):
        if isinstance(o, Dual):
            return Dual(float(self) + float(o), tuple(a + b for a, b in zip(self.parts, o.parts)))
        if isinstance(o, (int, float)):
            return Dual(float(self) + o, self.parts)
        return NotImplemented

    __radd__ = __add__

    def __sub__(self, o):
        if isinstance(o, Dual):
            return Dual(float(self) - float(o), tuple(a - b for a, b in zip(self.parts, o.parts)))
        if isinstance(o, (int, float)):
            return Dual(float(self) - o, self.parts)
        return NotImplemented

    def __rsub__(self, o):
        if isinstance(o, (int, float)):
            return Dual(o - float(self), tuple(-a for a in self.parts))
        return NotImplemented

    def __mul__(self, o):
        if isinstance(o, (int, float)) and not isinstance(o, Dual):
            return Dual(float(self) * o, tuple(a * o for a in self.parts))
        return float(self) * float(o) if isinstance(o, (int, float)) else NotImplemented

    __rmul__ = __mul__

    def __truediv__(self, o):
        if isinstance(o, (int, float)) and not isinstance(o, Dual):
            return Dual(float(self) / o, tuple(a / o for a in self.parts))
        return float(self) / float(o) if isinstance(o, (int, float)) else NotImplemented

    def __neg__(self):
        return Dual(-float(self), tuple(-a for a in self.parts))


def parts_of(x) -> tuple:
    """The parts of a :class:`Dual` (zeros for a plain number)."""
    return x.parts if isinstance(x, Dual) else _ZERO


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


class Metered:
    """The step model the simulation calls (:func:`lmcost.apps.serve_sim.simulate`), returning each time as a
    :class:`Dual` that carries its excess joules over the idle floor and its prefill share (module docstring).
    ``step``: a :class:`lmcost.cost.engine_step.StepModel` (already :func:`clocked`); ``power``: its levels.
    What it does not define (a method another feature adds) is the step model's own: its times then carry
    no excess joules (drawn at the idle floor), an undercount."""

    def __init__(self, step, power: ServePower):
        self._t = step
        self._e = step.scaled({g: s * (power.group_w(g) - power.idle_w) for g, s in step.scales.items()})

    def __getattr__(self, name):
        return getattr(self._t, name)

    def _decode(self, t: float, e: float) -> Dual:
        return Dual(t, (e, t, 0.0, 0.0))

    def tokens(self, n: int) -> Dual:
        """The context-free operators at ``n`` tokens, as decode work."""
        return self._decode(self._t.tokens(n), self._e.tokens(n))

    def head(self, n: int) -> Dual:
        """The lm_head over ``n`` sampling sequences, as decode work."""
        return self._decode(self._t.head(n), self._e.head(n))

    def decode_attention(self, n: int, c: float) -> Dual:
        """Attention over the cache of ``n`` decodes at mean context ``c``."""
        return self._decode(self._t.decode_attention(n, c), self._e.decode_attention(n, c))

    def step_s(self, n_decode: int, mean_context: float, chunks=(), n_out: int | None = None) -> Dual:
        """:meth:`lmcost.cost.engine_step.StepModel.step_s`, its prefill share by the module docstring's rule."""
        t, e = self._t, self._e
        value = t.step_s(n_decode, mean_context, chunks, n_out)
        if not chunks:
            return self._decode(value, e.step_s(n_decode, mean_context, chunks, n_out))
        new = sum(c for _, c in chunks)
        out = n_decode + len(chunks) if n_out is None else n_out
        share_t, share_h = new / (n_decode + new), (max(0, out - n_decode) / out if out else 0.0)
        pre_t = share_t * t.tokens(n_decode + new) + share_h * t.head(out)
        pre_e = share_t * e.tokens(n_decode + new) + share_h * e.head(out)
        for p, c in chunks:
            pre_t += t.prefill_attention(p + c) - t.prefill_attention(p)
            pre_e += e.prefill_attention(p + c) - e.prefill_attention(p)
        return Dual(value, (e.step_s(n_decode, mean_context, chunks, n_out), value, pre_t, pre_e))


def energy_summary(busy, span_s: float, power: ServePower, *, gpus: int, input_tokens: float,
                   output_tokens: float, requests: int) -> tuple[dict, float]:
    """The ``energy`` JSON of a run from one replica's busy time ``busy`` (a :class:`Dual`, s), ``span_s`` (s),
    its ``gpus``, and what it served (tokens and requests, all > 0). Definitions (module docstring's model):
    ``joules`` all GPUs over the span; ``j_per_token`` = joules / output tokens, as ML.ENERGY's energy per
    output token (GPU energy over the run divided by the tokens generated, Chung et al. 2025);
    ``j_per_input_token`` / ``j_per_output_token``: prefill's / decode's share (module docstring's rule) over
    input / output tokens; ``mean_power_w`` per GPU. Returns: (the dict, prefill's share of GPU work)."""
    excess, work, pre_t, pre_e = parts_of(busy)
    share = pre_t / work if work > 0 else 0.0
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
