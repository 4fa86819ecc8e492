"""The checks of a :class:`lmcost.apps.serve.ServeRequest`'s own values, before anything is loaded: the
scheduler knobs within their ranges (a 0 would otherwise fall back to the engine's default, silently), a
sweep's rates, and the workload fields that mean nothing together (a replayed file's requests take no
generated lengths, rate or seed; a closed loop and offline arrivals have no arrival process; a sweep sets
each run's rate). The defaults of the generated workload are filled in here (:func:`workload_args`).
"""

from __future__ import annotations

from lmcost.apps.serve_pd_inputs import check_pd, whole_within as _whole_within
from lmcost.apps.serve_workload import check_rate
from lmcost.basics.errors import LmcostError

#: The generated workload's defaults, where the request leaves a field None.
WORKLOAD_DEFAULTS = dict(requests=1000, prompt="1024", output="256", seed=0)
#: Bounds of the scheduler knobs, past any engine's (vLLM caps max_num_seqs at 1,024 by default; blocks
#: are 1-256 tokens in the engines shipped); the token budget as any token count (2^31).
KNOB_BOUNDS = dict(max_num_seqs=2**20, max_num_batched_tokens=2**31, block_size=2**16)
#: What each knob counts, for its error's fix.
KNOB_UNITS = dict(max_num_seqs="sequences running at once", max_num_batched_tokens="tokens per step, e.g. 8192",
                  block_size="tokens per KV-cache block, e.g. 16")
#: The text fields that take a default when None: an empty one is refused, not taken for the default.
TEXT_FIELDS = ("prompt", "output", "arrival", "engine", "prefix")
#: The fields a replayed workload file makes meaningless (the file gives each request's arrival and lengths).
GENERATOR_FIELDS = ("requests", "prompt", "output", "rate", "rates", "arrival", "concurrency", "seed", "prefix")


def check_rates(rates) -> tuple[float, ...]:
    """A sweep's rates (requests/s) as floats, each within :func:`lmcost.apps.serve_workload.check_rate`'s
    bounds, none twice (nor two that print alike to 6 significant digits, as the sweep's rows label them).
    Raises: LmcostError naming ``rates``."""
    out: list[float] = []
    for v in rates:
        v = check_rate(v, "rates")
        if f"{v:g}" in {f"{u:g}" for u in out}:
            raise LmcostError("rates", f"{v:g} given twice (to 6 significant digits)", "give each rate once")
        out.append(float(v))
    return tuple(out)


def check_request(r) -> None:
    """Refuse what ``r`` (:class:`lmcost.apps.serve.ServeRequest`) asks that is out of range or means
    nothing. Raises: LmcostError naming the field: one of :data:`TEXT_FIELDS` given empty (a default is had
    by leaving it None), ``max_num_seqs``, ``max_num_batched_tokens``,
    ``block_size`` (not a whole number from 1 to :data:`KNOB_BOUNDS`), ``memory_fraction`` (outside
    (0, 1]), ``rates`` (:func:`check_rates`; with ``rate`` or ``concurrency``), a field of
    :data:`GENERATOR_FIELDS` given with ``workload_file``, ``arrival`` given without a rate."""
    check_pd(r)  # prefill/decode disaggregation's fields
    for name in TEXT_FIELDS:
        v = getattr(r, name, None)
        if isinstance(v, str) and not v.strip():
            raise LmcostError(name, "empty", "give a value, or leave it out for the default")
    for name, high in KNOB_BOUNDS.items():
        if getattr(r, name) is not None:
            _whole_within(getattr(r, name), name, high, KNOB_UNITS[name])
    f = r.memory_fraction
    if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1):
        raise LmcostError("memory_fraction", f"{f!r:.40} is outside (0, 1]", "give a share of GPU memory, e.g. 0.9")
    if r.workload_file is not None:
        for name in GENERATOR_FIELDS:
            if getattr(r, name) not in (None, ()):
                raise LmcostError(name, "has no effect with `workload_file` (the file gives each request's arrival "
                                  "and lengths)", "drop one of them")
        return
    if r.rates:
        check_rates(r.rates)
        for name in ("rate", "concurrency"):
            if getattr(r, name) is not None:
                raise LmcostError(name, "has no effect with `rates` (each run of the sweep has its rate)",
                                  "drop one of them")
    elif r.arrival is not None and r.rate is None:
        raise LmcostError("arrival", "has no effect without `rate` or `rates` (requests arrive all at once, or "
                          "as others finish with `concurrency`)", "give a rate, or drop the arrival process")


def workload_args(r) -> dict:
    """The keyword arguments of :func:`lmcost.apps.serve_workload.make_requests` but the rate: ``r``'s
    generated-workload fields, :data:`WORKLOAD_DEFAULTS` where None, and the arrival process (poisson
    where a rate is given, else offline: all at t = 0, or a closed loop with ``concurrency``)."""
    filled = {k: (v if getattr(r, k) is None else getattr(r, k)) for k, v in WORKLOAD_DEFAULTS.items()}
    arrival = r.arrival or ("poisson" if (r.rate is not None or r.rates) else "offline")
    return dict(n=filled.pop("requests"), **filled, arrival=arrival, concurrency=r.concurrency)
