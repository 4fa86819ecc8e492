"""``lmcost serve``'s energy and cost (issue 28): the request's ``power_limit`` and ``usd_per_gpu_hour``
checked, the GPU's power levels, and the ``energy`` (every run) and ``cost`` (with a price) keys of a run's
summary. The model is :mod:`lmcost.cost.energy`'s; the cap's bounds are training's
(:data:`lmcost.apps.train_checks.MIN_POWER_FRACTION` to :data:`~lmcost.apps.train_checks.MAX_POWER_FRACTION`
x TDP). No price is assumed anywhere: without ``usd_per_gpu_hour`` a run has no ``cost``.
"""

from __future__ import annotations

from types import SimpleNamespace

from lmcost.apps.setup import Say, quiet
from lmcost.apps.train_checks import MAX_POWER_FRACTION, MIN_POWER_FRACTION
from lmcost.basics.errors import LmcostError
from lmcost.cost.energy import ServePower, cost_summary, energy_summary, serve_power

#: The highest price per GPU-hour taken ($): a typo guard, far past any cloud's list price.
MAX_USD_PER_GPU_HOUR = 1e4


def check_price(usd_per_gpu_hour) -> None:
    """Raises: LmcostError (usd_per_gpu_hour) for a price that is not a number in (0, 1e4] $."""
    p = usd_per_gpu_hour
    if p is None:
        return
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= MAX_USD_PER_GPU_HOUR:
        raise LmcostError("usd_per_gpu_hour", f"{p!r:.40} is not a price in (0, {MAX_USD_PER_GPU_HOUR:g}] $ per GPU-hour",
                          "give what one GPU-hour costs you, e.g. 2.5 (no default price is assumed)")


def power_for(gpu, power_limit_w, say: Say = quiet) -> ServePower:
    """``gpu``'s power levels under the cap (:func:`lmcost.cost.energy.serve_power`). Raises: LmcostError
    (power_limit) for a cap outside 0.25 to 2 x the GPU's TDP (training's bounds, and their source), or
    serve_power's errors (a cap that is no number). The range is checked first, so that a number far out
    of it (1e9 W) hears the GPU's range, not serve_power's coarser bounds."""
    number = isinstance(power_limit_w, (int, float)) and not isinstance(power_limit_w, bool)
    if number and gpu.tdp_w:
        lo, hi = MIN_POWER_FRACTION * gpu.tdp_w, MAX_POWER_FRACTION * gpu.tdp_w
        if not lo <= power_limit_w <= hi:
            raise LmcostError("power_limit", f"{power_limit_w:g} W is outside the caps {gpu.name} takes: {lo:g} W "
                              f"({MIN_POWER_FRACTION:.0%} of its {gpu.tdp_w:g} W TDP) to {hi:g} W",
                              f"give {lo:g} to {hi:g} W, or leave the cap out")
    power = serve_power(gpu, power_limit_w)
    if power_limit_w is not None:
        if power_limit_w >= gpu.tdp_w:
            say(f"note: a {power_limit_w:g} W cap is at or above {gpu.name}'s {gpu.tdp_w:g} W TDP (its default "
                "limit): it changes nothing")
    return power


def energy_keys(setup, meter, tr, summary: dict) -> dict:
    """The ``energy`` key (and ``cost`` with the setup's price) of one run: one replica's trace ``tr``
    simulated with ``meter`` (:class:`lmcost.cost.energy.Metered`, which summed its work), the replicas alike
    as :func:`lmcost.apps.serve.summarize` takes them (this one's figures times the share of all requests it
    served); or, ``meter`` a list of (GPUs, meter) of every replica simulated (P/D's two pools,
    :mod:`lmcost.apps.serve_pd`), ``tr`` the trace of all requests and its busy time their GPU-weighted mean:
    the meters' work as a mean per GPU over all their GPUs."""
    n = len(tr.prompt)
    if isinstance(meter, list):
        scale, gpus = 1.0, sum(w for w, _ in meter)
        meter = SimpleNamespace(**{k: sum(w * getattr(m, k) for w, m in meter) / gpus
                                   for k in ("excess_j", "prefill_s", "prefill_j")})
    else:
        lay = setup.settings.layout
        scale = summary["requests"] / n
        gpus = lay.gpus // lay.dp * scale
    counts = dict(gpus=gpus, input_tokens=float(tr.prompt.sum()) * scale,
                  output_tokens=float(tr.output.sum()) * scale, requests=summary["requests"])
    span = summary["span_s"]
    energy, share = energy_summary(meter, tr.busy_s, span, setup.power, **counts)
    out = {"energy": energy}
    if setup.usd_per_gpu_hour is not None:
        out["cost"] = cost_summary(setup.usd_per_gpu_hour, span, share, **counts)
    return out
