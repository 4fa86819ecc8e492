"""A GPU's clock through a training run: the sustained fraction of its boost clock, and the clock a power cap
allows. Read from the ``training`` block of a GPU YAML (:class:`GpuTraining`); used by the training step
(:mod:`lmcost.cost.train_system`).

Power model (one formula, its exponent a figure to fit): board power at clock f is taken as
P(f) = TDP x (f / f_sustained)^alpha, so a cap P_cap below the TDP holds the clock at

    f / f_sustained = (P_cap / TDP)^(1 / alpha)        (1 at or above the TDP).

The prior alpha = 3 is the cube law of CMOS dynamic power, P = C V^2 f with the supply voltage V scaled in
proportion to f over the DVFS range (T. Mudge, "Power: a first-class architectural design constraint", IEEE
Computer 34(4), 2001). Static power and the memory's power, which a lower SM clock does not reduce, make the
effective exponent smaller and the loss larger: the fit on published runs sets it. Only compute-bound time
scales with the SM clock; the HBM clock is not capped, so memory-bound time is kept.

A GPU's board power while serving (:class:`GpuServingPower`, the ``power`` block of a GPU YAML; read by
:mod:`lmcost.cost.energy`): three levels as fractions of the TDP, idle (between steps and requests),
memory-bound work and compute-bound work (the power limit: a stream of dense GEMMs holds the board at it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from lmcost.basics.errors import LmcostError


class GpuTraining(BaseModel):
    """Figures of a GPU through a long training run.

    ``sustained_clock``: the fraction of the datasheet's boost clock the SMs hold through long dense GEMM
    runs at the default power limit (thermal and power throttling), 0.3 to 1; ``power_exponent``: alpha of
    the power model above (1 to 4); ``sources``: where each figure comes from (a measured figure, or the fit
    and its rows); ``fit``: the rows of the published runs a fitted figure came from (None: the prior)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    sustained_clock: float = Field(default=1.0, ge=0.3, le=1.0)
    power_exponent: float = Field(default=3.0, ge=1.0, le=4.0)
    #: The CUDA context a training process holds on this GPU (bytes; None: MemoryFigures' prior for its
    #: generation), written by ``lmcost fit --training`` (lmcost.calibration.training_memory_fit).
    context_bytes: int | None = Field(default=None, ge=0, le=1 << 34)
    sources: list[str] = []
    fit: dict[str, str | float | int] | None = None


def power_clock(power_limit_w: float | None, tdp_w: float | None, exponent: float, field: str = "power_limit") -> float:
    """The clock a power cap allows, as a fraction of the sustained clock: (P_cap / TDP)^(1/alpha), 1 at or
    above the TDP or without a cap (the module docstring's model and source).

    ``power_limit_w`` (W, None: the default limit), ``tdp_w`` (the GPU's TDP, W), ``exponent`` (alpha).
    Raises: LmcostError naming ``field`` for a cap that is not a number from 1 W to 100 kW, or a cap on a
    GPU whose YAML has no ``tdp_w``."""
    if power_limit_w is None:
        return 1.0
    if isinstance(power_limit_w, bool) or not isinstance(power_limit_w, (int, float)) or not 1 <= power_limit_w <= 1e5:
        raise LmcostError(field, f"must be a positive number of watts (each GPU takes caps from a quarter of its TDP "
                          f"up), got {power_limit_w!r}", "give the cap in watts, e.g. 500, or leave it out")
    if tdp_w is None:
        raise LmcostError(field, "the GPU's YAML has no tdp_w to scale the clock from",
                          "add tdp_w to the GPU YAML, or leave the cap out")
    return min(1.0, power_limit_w / tdp_w) ** (1.0 / exponent)


class GpuServingPower(BaseModel):
    """Board power of a GPU by what it runs, as fractions of its ``tdp_w`` (:mod:`lmcost.cost.energy`).

    ``idle_fraction``: the engine idle (no kernel running: between requests, and the CPU's share of a step);
    ``memory_bound_fraction``: HBM-bound kernels (decode's GEMVs and attention over the cache), and
    collectives; compute-bound kernels run at the power limit (1 x TDP, or the cap). ``sources``: where each
    figure comes from, or that it is a prior. The defaults are priors: 0.1 (70 W of an H100's 700 W) and 0.6
    (420 W), no measured figure cited; reports/serve-energy.md sets them against the published J/token."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    idle_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    memory_bound_fraction: float = Field(default=0.6, ge=0.0, le=1.0)
    sources: list[str] = []
