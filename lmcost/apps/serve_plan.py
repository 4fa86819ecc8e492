"""``lmcost serve-plan``: the serving planner on top of ``lmcost serve``. Every layout of ``gpus`` GPUs x
every engine setting searched (``max_num_seqs`` x ``max_num_batched_tokens``) for the best goodput per GPU
under SLOs stated as a percentile of TTFT and TPOT.

For each candidate (a layout, a pair of knobs) the answer is the highest offered rate (Poisson or gamma
arrivals) whose run (:func:`lmcost.apps.serve.run_once`, the same seeded requests scaled in time) meets both
SLOs at the percentile (TTFT p_k <= ``slo_ttft_s`` and TPOT p_k <= ``slo_tpot_s``) and does not saturate
(the queue does not grow: :func:`lmcost.apps.serve.summarize`); found by bisection on the rate, geometric,
between the candidate's static bound ``hi`` and ``hi`` / :data:`SPAN` (``iterations`` halvings of the
log-range: 8 give the rate to 256^(1/256) = 2.2%). The row then holds that run's figures as ``lmcost serve``
prints them at that rate (its check command): throughput over the span from the first arrival to the last
finish, drain included (so below the offered rate), and goodput (requests/s meeting both SLOs, per
request); candidates are ranked by that goodput per GPU.

The static bound (:func:`static_bound`): at most ``B`` sequences decode at once on a replica (the lesser of
``max_num_seqs`` and the KV cache's capacity at the shortest prompt + 1), and every output token after the
first takes a decode slot; a step of ``n`` <= ``B`` decodes (with or without prefill chunks beside them)
takes at least the roofline decode step of ``B`` sequences at the shortest context, per slot (a step's
roofline time is affine and increasing in its tokens, so time/slot falls with ``n``), times the engine's
smallest fitted time factor where below 1. So no run serves more than ``dp x B / (t_step x mean(output -
1))`` requests/s (the mean over the replica's share of the requests whose mean is least): neither the offered
rate found nor the throughput (hence goodput) of any run exceeds it: the bisection's upper bracket, and the
pruning bound. The step is
:func:`lmcost.cost.serving.serving_point`'s (the static-batch planner's) decode of ``dp x B`` sequences, one
step at context prompt + 1. Candidates are searched in waves of :data:`WAVE`, highest bound first; one
whose bound is below the best goodput found in an earlier wave is pruned (no run of it could serve more than
its bound), so pruning never changes the best row, and the rows never depend on the number of workers.

Parallelism: the candidates of a wave run as tasks of a pool, with no scheduler of our own: a
``concurrent.futures.ProcessPoolExecutor`` of ``jobs`` workers (default: every core; 1: in this
process), or a Ray cluster's (``ray``: an address, ``ray.util.multiprocessing.Pool``; the optional
extra ``lmcost[ray]``), or any object with ``map(fn, items)`` passed as ``pool``.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from functools import lru_cache, partial

import numpy as np

from lmcost.apps.serve import ServeFields, ServeRequest, check_requests, prepare, run_once
from lmcost.apps.setup import quiet
from lmcost.basics.errors import LmcostError

#: Percentiles an SLO may be stated at (those :func:`lmcost.apps.serve.summarize` reports).
PLAN_PERCENTILES = (50, 90, 99)
#: The default knobs searched (vLLM's max_num_seqs and token budget over their common range).
SEQS = (64, 128, 256, 512, 1024)
TOKENS = (2048, 4096, 8192, 16384)
#: The bisection's lower bracket: the static bound over this.
SPAN = 256.0
#: Candidates searched between two prunings, by default (fixed, so that the rows do not depend on the workers).
WAVE = 16
#: Requests per run at most, 100k as counts are typed (102,400): a search runs each candidate up to
#: ``iterations`` + 2 times, and a run of 100k takes seconds (``lmcost serve`` runs one rate of more).
MAX_REQUESTS = 100 * 1024
#: The row columns of :meth:`ServePlan.to_dict` and the CSV: ``offered_rate`` (requests/s arriving: the
#: highest meeting the SLOs), then the figures of the run at it as ``lmcost serve`` reports them
#: (``throughput.requests_per_s``, ``.output_tokens_per_s``, ``.output_tokens_per_s_per_gpu``,
#: ``goodput.requests_per_s``, ``.fraction``; ``goodput_requests_per_s_per_gpu``: goodput / GPUs, the rank).
RUN_COLUMNS = ("requests_per_s", "output_tokens_per_s", "output_tokens_per_s_per_gpu", "goodput_requests_per_s",
               "goodput_fraction", "goodput_requests_per_s_per_gpu")
COLUMNS = ("gpu", "layout", "tp", "ep", "dp", "max_num_seqs", "max_num_batched_tokens", "status", "offered_rate",
           *RUN_COLUMNS, "bound_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s",
           "tpot_p99_s", "runs", "reason")


@dataclass(frozen=True, kw_only=True)
class ServePlanRequest(ServeFields):
    """One serving plan. Model, GPU, engine, precision and time-model fields as
    :class:`lmcost.apps.serve.ServeRequest`; ``gpus``: the GPUs each layout uses (tp x dp, ep within).
    Workload as ServeRequest's (``requests`` per run, at most :data:`MAX_REQUESTS`; ``prompt``/``output``
    specs, ``arrival`` poisson or gamma:CV, ``seed``; None: :data:`lmcost.apps.serve_inputs.WORKLOAD_DEFAULTS`),
    every run at its rate.
    SLOs: ``slo_ttft_s``, ``slo_tpot_s`` (s, None: not judged) at the ``percentile`` (50, 90 or 99).
    Knobs searched: ``max_num_seqs`` x ``max_num_batched_tokens`` (tuples); the others fixed. Search:
    ``iterations`` bisection steps; ``prune`` with the static bound, every ``wave`` candidates; ``jobs`` workers (None: every core,
    1: in process) or a Ray cluster at ``ray`` (an address, ``auto``, or ``local`` for a new local one)."""

    gpus: int = 1
    percentile: int = 99
    max_num_seqs: tuple = SEQS
    max_num_batched_tokens: tuple = TOKENS
    iterations: int = 8
    prune: bool = True
    wave: int = WAVE
    jobs: int | None = None
    ray: str | None = None
    # P/D disaggregation (lmcost.apps.serve_plan_pd): xPyD pools of `gpus` GPUs in all, the ratios searched, the KV link
    pd: bool = False
    pd_ratios: tuple = ()
    kv_link: str | None = None


@dataclass
class ServePlan:
    """What :func:`plan_serving` found: ``rows`` (dicts of :data:`COLUMNS`), searched ones by the goodput per
    GPU of the run at their offered rate, best first, then the pruned (by bound), then those that failed; ``best`` (the first row, if it met the
    SLOs at some rate); ``candidates`` searched or pruned; ``pruned``; the workload's ``mean_output``."""

    request: ServePlanRequest
    rows: list = field(default_factory=list)
    candidates: int = 0
    pruned: int = 0
    mean_output: float = 0.0
    workers: str = "in process"

    @property
    def best(self) -> dict | None:
        return self.rows[0] if self.rows and self.rows[0]["status"] == "ok" else None

    def to_dict(self) -> dict:
        """The JSON of ``lmcost serve-plan --json`` (base units: seconds, requests/s, tokens/s per GPU)."""
        r = self.request
        keep = ("model", "gpu", "engine", "time_model", "gpus", "requests", "prompt", "output", "arrival", "seed",
                "slo_ttft_s", "slo_tpot_s", "percentile", "max_num_seqs", "max_num_batched_tokens", "iterations",
                "prune", *(("pd", "pd_ratios", "kv_link") if r.pd else ()))
        ask = {k: (v if isinstance(v, (str, int, float, bool, tuple, type(None))) else getattr(v, "name", str(v)))
               for k, v in asdict(r).items() if k in keep}
        best = self.best
        check = None if best is None else best.get("check_command") or "lmcost " + shlex.join(check_command(r, best))
        return {**ask, "mean_output_tokens": self.mean_output, "candidates": self.candidates, "pruned": self.pruned,
                "best": best, "check_command": check, "rows": self.rows}


def check_plan_request(r: ServePlanRequest) -> None:
    """Refuse what ``r`` asks that is out of range. Raises: LmcostError naming ``gpus`` (not 1..65,536),
    ``percentile`` (not one of :data:`PLAN_PERCENTILES`), ``slo_ttft_s``/``slo_tpot_s`` (not > 0 and finite),
    ``max_num_seqs``/``max_num_batched_tokens`` (empty, or a value twice; each value as
    :func:`lmcost.apps.serve_inputs.check_request`), ``iterations`` (not 1..30), ``wave`` (not 1..4,096), ``jobs`` (not 1..4,096),
    ``requests`` (not 1..:data:`MAX_REQUESTS`), ``arrival`` (offline: a plan needs a rate)."""
    from lmcost.operators.workload import check_count

    check_count("gpus", r.gpus, 65536)
    if r.percentile not in PLAN_PERCENTILES:
        raise LmcostError("percentile", f"{r.percentile!r:.40} is not one of {', '.join(map(str, PLAN_PERCENTILES))}",
                          "state the SLOs at p50, p90 or p99")
    for name in ("slo_ttft_s", "slo_tpot_s"):
        v = getattr(r, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0)):
            raise LmcostError(name, f"{v!r:.40} is not a time > 0", "give seconds, e.g. 0.5")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        values = tuple(getattr(r, name))
        if not values:
            raise LmcostError(name, "no value to search", "give one or more, e.g. 128,256")
        if len(set(values)) != len(values):
            raise LmcostError(name, "a value given twice", "give each once")
    check_count("iterations", r.iterations, 30)
    n = r.requests
    if n is not None and not (isinstance(n, int) and not isinstance(n, bool) and n > MAX_REQUESTS):
        check_count("requests", n, MAX_REQUESTS)
    elif n is not None:
        raise LmcostError("requests", f"{n:,} per run is over the planner's 100k ({MAX_REQUESTS:,}): each candidate "
                          f"runs up to {r.iterations + 2} times, and a run of 100k takes seconds",
                          f"give at most {MAX_REQUESTS:,}, or check one rate of more with lmcost serve")
    check_count("wave", r.wave, 4096)
    if r.jobs is not None:
        check_count("jobs", r.jobs, 4096)
    if r.arrival == "offline":
        raise LmcostError("arrival", "offline arrivals have no rate to search", "use poisson or gamma:CV")
    for name in ("pd_ratios", "kv_link"):  # P/D's own (lmcost.apps.serve_plan_pd checks their values)
        if getattr(r, name) not in (None, ()) and not r.pd:
            raise LmcostError(name, "has no effect without `pd` (prefill/decode pools)", "add `pd`, or drop it")


def _serve_request(r: ServePlanRequest, lay, seqs: int, tokens: int) -> ServeRequest:
    """The ``lmcost serve`` request of one candidate (its rate set per run)."""
    shared = {f.name: getattr(r, f.name) for f in fields(ServeFields)}
    shared.update(imbalance=r.imbalance if lay.ep > 1 else 1.0, arrival=r.arrival or "poisson")
    return ServeRequest(**shared, tp=lay.tp, ep=lay.ep, dp=lay.dp, rate=1.0, max_num_seqs=seqs,
                        max_num_batched_tokens=tokens)


def _workload(sr: ServeRequest, rate: float):
    from lmcost.apps.serve_inputs import workload_args
    from lmcost.apps.serve_workload import make_requests

    return make_requests(rate=rate, **workload_args(sr))


@lru_cache(maxsize=16)
def _cached_setup(sr: ServeRequest, top: int):
    return prepare(sr, quiet, max_context=top)


def _setup(sr: ServeRequest, top: int):
    """:func:`lmcost.apps.serve.prepare`, kept for the bisection after the bound (in this process; a request
    whose model or GPU object is not hashable is prepared each time)."""
    try:
        hash(sr)
    except TypeError:
        return prepare(sr, quiet, max_context=top)
    return _cached_setup(sr, top)


def static_bound(setup, prompt: np.ndarray, output: np.ndarray) -> float:
    """The most requests/s a candidate could serve (the module docstring): ``dp x B / (t x mean(output - 1))``
    with ``t`` the roofline decode step of ``B`` sequences per replica at context min(prompt) + 1
    (:func:`lmcost.cost.serving.serving_point`, the static planner's), over the engine's smallest fitted
    time factor where below 1 (engine time model), and mean(output - 1) the least of the dp replicas' shares
    (every dp-th request, as :func:`lmcost.apps.serve.run_once` deals them). Units: requests/s; inf for a
    workload with no decode."""
    from lmcost.cost.serving import serving_point

    lay = setup.settings.layout
    isl = int(prompt.min())
    out = np.asarray(output)
    decodes = min(float(np.mean(out[k::lay.dp] - 1)) for k in range(min(lay.dp, len(out))))
    if decodes <= 0:
        return math.inf
    need = setup.kv_per_token_bytes * (isl + 1) + setup.kv_per_seq_bytes
    b = setup.knobs.max_num_seqs if need <= 0 else max(1, min(setup.knobs.max_num_seqs,
                                                              int(setup.kv_capacity_bytes // need)))
    p = serving_point(setup.cfg, setup.gpu, setup.precision, replace(setup.settings, model="roofline"),
                      batch=lay.dp * b, isl=isl, osl=2)
    scale = 1.0
    if setup.time_model == "engine":
        scale = min([1.0, *(float(v) for v in getattr(setup.engine, "time_scales", {}).values())])
    return lay.dp * b / (float(p.decode_s) * scale * decodes)


@dataclass(frozen=True)
class _Task:
    """One candidate's work, sent to a worker: ``bound`` (None: compute the bound only)."""

    sr: ServeRequest
    top: int
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    percentile: int
    iterations: int
    bound: float | None = None


def _bound_task(t: _Task) -> tuple:
    """(static bound in requests/s, None) or (None, why it cannot run)."""
    try:
        setup = _setup(t.sr, t.top)
        reqs = _workload(t.sr, 1.0)
        check_requests(setup, reqs.prompt, reqs.output)
        return static_bound(setup, reqs.prompt, reqs.output), None
    except LmcostError as e:
        return None, str(e)


def _judge(t: _Task, setup, rate: float) -> tuple:
    """(meets, summary, why not) of one run at ``rate`` (the run ``lmcost serve`` makes of ``t.sr`` at it)."""
    summary, _ = run_once(setup, _workload(t.sr, rate), dp=setup.settings.layout.dp, slo_ttft_s=t.sr.slo_ttft_s,
                          slo_tpot_s=t.sr.slo_tpot_s, rate=rate)
    return verdict(t, summary)


def verdict(t: _Task, summary: dict) -> tuple:
    """(meets, summary, why not) of a run's ``summary`` against ``t``'s SLOs at its percentile, unsaturated."""
    k = f"p{t.percentile}"
    why = []
    if summary["saturated"]:
        why.append(f"saturated ({summary['saturated']['limit']})")
    for name, key, slo in (("TTFT", "ttft_s", t.slo_ttft_s), ("TPOT", "tpot_s", t.slo_tpot_s)):
        v = summary[key][k]
        if slo is not None and v is not None and v > slo:
            why.append(f"{name} {k} {v:.3g} s > {slo:.3g} s")
    return not why, summary, "; ".join(why)


def _search_task(t: _Task, on_run=None, judge=None) -> dict:
    """The highest rate of ``t``'s candidate meeting the SLOs (the module docstring's bisection): a dict of
    rate (None if none), its run's summary, runs and the reason none met. ``on_run()``: after each run.
    ``judge(rate)``: (meets, summary, why not) of a run at ``rate`` (None: :func:`_judge`'s, aggregated)."""
    if judge is None:
        judge = partial(_judge, t, _setup(t.sr, t.top))
    hi = t.bound
    tick = on_run or (lambda: None)
    ok, summary, why = judge(hi)
    runs = 1
    tick()
    if ok:
        return dict(rate=hi, summary=summary, runs=runs, reason="meets the SLOs at its static bound")
    lo = hi / SPAN
    ok, low, why_low = judge(lo)
    runs += 1
    tick()
    if not ok:
        return dict(rate=None, summary=low, runs=runs, reason=f"no rate meets the SLOs: at {lo:.3g} requests/s "
                    f"{why_low}")
    for _ in range(t.iterations):
        mid = math.sqrt(lo * hi)
        ok, s, w = judge(mid)
        runs += 1
        tick()
        if ok:
            lo, low = mid, s
        else:
            hi, why = mid, w
    return dict(rate=lo, summary=low, runs=runs, reason=f"at {hi:.3g} requests/s: {why}")


def _row(gpu: str, lay, seqs: int, tokens: int, status: str, bound=None, found=None, gpus=1, reason="") -> dict:
    row = dict(gpu=gpu, layout=lay.describe(), tp=lay.tp, ep=lay.ep, dp=lay.dp, max_num_seqs=seqs,
               max_num_batched_tokens=tokens, status=status, offered_rate=None, **dict.fromkeys(RUN_COLUMNS),
               bound_rate=bound, **{f"{m}_{p}_s": None for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
               runs=0, reason=reason)
    if found is not None:
        s, rate = found["summary"], found["rate"]
        row.update(runs=found["runs"], reason=found["reason"] or reason)
        for m in ("ttft", "tpot"):
            for p in ("p50", "p90", "p99"):
                row[f"{m}_{p}_s"] = s[f"{m}_s"][p]
        if rate is not None:
            th, g = s["throughput"], s["goodput"]
            row.update(offered_rate=rate, requests_per_s=th["requests_per_s"],
                       output_tokens_per_s=th["output_tokens_per_s"],
                       output_tokens_per_s_per_gpu=th["output_tokens_per_s_per_gpu"],
                       goodput_requests_per_s=g["requests_per_s"], goodput_fraction=g["fraction"],
                       goodput_requests_per_s_per_gpu=g["requests_per_s"] / gpus)
    return row


def check_command(r: ServePlanRequest, row: dict) -> tuple[str, ...]:
    """The ``lmcost serve`` arguments that run ``row`` (a candidate with a rate) alone: its layout, knobs and
    offered rate, and every workload, SLO, engine, kernel and precision field ``r`` gave (the EP imbalance
    where the row's layout has ep)."""
    model = r.model if isinstance(r.model, str) else r.model.name
    gpu = r.gpu if isinstance(r.gpu, str) else r.gpu.name
    argv = ["serve", model, "--gpu", gpu, "--engine", r.engine, "--model", r.time_model, "--tp", str(row["tp"]),
            "--ep", str(row["ep"]), "--dp", str(row["dp"]), "--max-num-seqs", str(row["max_num_seqs"]),
            "--max-num-batched-tokens", str(row["max_num_batched_tokens"]), "--rate", repr(float(row["offered_rate"]))]
    given = (("--dtype", r.dtype if r.dtype != "auto" else None), ("--weight-dtype", r.weight_dtype),
             ("--quant", r.quant), ("--kv-dtype", r.kv_dtype), ("--cluster", r.cluster),
             ("--kernel", r.attention_kernel if r.attention_kernel != "auto" else None),
             ("--runtime", r.runtime if r.runtime != "auto" else None),
             ("--ep-imbalance", r.imbalance if row["ep"] > 1 and r.imbalance != 1.0 else None), ("--requests", r.requests),
             ("--prompt", r.prompt), ("--output", r.output), ("--arrival", r.arrival), ("--seed", r.seed),
             ("--memory-fraction", r.memory_fraction), ("--block-size", r.block_size),
             ("--slo-ttft", None if r.slo_ttft_s is None else f"{r.slo_ttft_s!r}s"),
             ("--slo-tpot", None if r.slo_tpot_s is None else f"{r.slo_tpot_s!r}s"))
    for flag, v in given:
        if v is not None:
            argv += [flag, str(v)]
    if r.chunked_prefill is not None:
        argv.append("--chunked-prefill" if r.chunked_prefill else "--no-chunked-prefill")
    return tuple(argv)


def make_pool(jobs: int | None, ray: str | None, tasks: int):
    """The pool the candidates run on: a Ray cluster's (``ray``), a process pool of ``jobs`` workers (None:
    ``os.cpu_count()``, at most one per task), or None (in process). Returns (pool or None, label).
    Raises: LmcostError (ray) when ray is not installed or its cluster cannot be reached."""
    if ray is not None:
        try:
            import ray as ray_mod
            from ray.util.multiprocessing import Pool
        except ImportError:
            raise LmcostError("ray", "not installed; a search on a Ray cluster needs it",
                              "pip install 'lmcost[ray]'") from None
        try:
            if not ray_mod.is_initialized():
                ray_mod.init(**({} if ray == "local" else {"address": ray}), include_dashboard=False,
                             log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise LmcostError("ray", f"cannot reach the cluster at {ray!r:.60} ({str(e).splitlines()[0][:120]})",
                              "start a cluster with ray's `ray start`, or give its address") from None
        return Pool(), f"Ray cluster {ray}"
    n = min(jobs or os.cpu_count() or 1, max(1, tasks))
    if n <= 1:
        return None, "in process"
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=n), f"{n} processes"


def _map(pool, fn, items: list, tick) -> list:
    """``fn`` over ``items`` on ``pool`` (in order), ``tick(result)`` after each."""
    it = map(fn, items) if pool is None else (pool.imap(fn, items) if hasattr(pool, "imap") else pool.map(fn, items))
    out = []
    for x in it:
        out.append(x)
        tick(x)
    return out


def check_fixed(req: ServePlanRequest) -> tuple:
    """Check all that ``req`` asks of every candidate alike, before any is searched, as ``lmcost serve`` does
    (so that a wrong name or choice is one error, not a note per candidate). Returns: (config, GPU with its
    efficiency block's choices, layouts of ``gpus`` GPUs that split the model, without pipeline stages).

    Raises: LmcostError as :func:`check_plan_request`; for an unknown model, GPU or engine (or an engine YAML
    that does not load); a kernel family or runtime the GPU has no figures of
    (:func:`lmcost.apps.setup.select_efficiency`); an unknown dtype, or one the GPU has no peak for
    (``dtype``); ``quant`` with ``weight_dtype`` or unknown (:func:`lmcost.apps.setup.resolve_quant`);
    ``time_model`` unknown; ``cluster`` with one GPU, or unknown; ``imbalance`` outside 1..64, or other
    than 1 where no layout has expert parallelism; ``gpus`` when no layout splits the model."""
    from lmcost.apps.plan import _per_node, layouts
    from lmcost.apps.serve import TIME_MODELS
    from lmcost.apps.setup import check_quant, checked_layout, resolve_precision, resolve_quant, select_efficiency
    from lmcost.hardware.engines import load_engine
    from lmcost.hardware.gpu import GPU, load_gpu
    from lmcost.model.config import ArchConfig
    from lmcost.model.loading import load_config
    from lmcost.operators.parallel import Layout

    check_plan_request(req)
    cfg = req.model if isinstance(req.model, ArchConfig) else load_config(req.model)
    hw = select_efficiency(req.gpu if isinstance(req.gpu, GPU) else load_gpu(req.gpu), req.attention_kernel,
                           req.runtime, designs=False)  # as serve: its overheads were fitted on the block's figures
    load_engine(req.engine)
    check_quant(cfg, req.quant, req.weight_dtype, [hw])  # before the dtype (see check_quant)
    hw.peak_flops(resolve_precision(req.dtype, req.weight_dtype, req.kv_dtype, [hw], quiet).activations)
    resolve_quant(cfg, req.quant, req.weight_dtype, quiet)
    if req.time_model not in TIME_MODELS:
        raise LmcostError("time_model", f"unknown value {req.time_model!r:.40}", f"use one of {', '.join(TIME_MODELS)}")
    wl = _workload(_serve_request(req, Layout(), 1, 1), 1.0)  # the lengths every candidate serves
    top = int((wl.prompt + wl.output).max())
    if cfg.positions == "learned" and top > cfg.max_positions:
        raise LmcostError("workload.prompt", f"a request's prompt + output, {top:,} tokens, exceeds the "
                          f"{cfg.max_positions:,} learned positions of {cfg.name}",
                          f"keep prompt + output <= {cfg.max_positions:,}")
    if req.cluster is not None and req.gpus == 1:
        raise LmcostError("cluster", "one GPU runs no collectives, so the cluster and its nodes change nothing",
                          "drop it, or raise `gpus`")
    found, bad = layouts(cfg, req.gpus, _per_node(hw, req.gpus, req.cluster), req.cluster)
    lays = [lay for lay in found if lay.pp == 1]
    if not lays:
        raise LmcostError("gpus", f"no layout of {req.gpus} GPUs splits {cfg.name} ({bad[0][1] if bad else 'none'})",
                          "try another `gpus` count")
    if req.imbalance != 1.0:
        ep = [lay for lay in lays if lay.ep > 1]
        if not ep:
            why = "has no routed experts" if cfg.moe is None else f"has no expert parallelism on {req.gpus} GPU(s)"
            raise LmcostError("imbalance", f"applies to expert parallelism, and {cfg.name} {why}", "drop it")
        checked_layout(hw, tp=ep[0].tp, ep=ep[0].ep, dp=ep[0].dp, imbalance=req.imbalance, cluster=req.cluster)
    return cfg, hw, lays


def plan_tasks(req, srs: list) -> tuple:
    """The search tasks of ``srs`` (one serve request per candidate, each checked) and the empty plan they fill.
    Raises: LmcostError (``workload.output``) for a workload with no decode (every output one token)."""
    from lmcost.apps.serve_inputs import check_request

    for sr in srs:
        check_request(sr)
    first = _workload(srs[0], 1.0)
    if int(first.output.max()) < 2:
        raise LmcostError("workload.output", "every request has one output token: no decode, no TPOT to plan",
                          "give outputs of 2 or more tokens")
    top = int((first.prompt + first.output).max())
    tasks = [_Task(sr, top, req.slo_ttft_s, req.slo_tpot_s, req.percentile, req.iterations) for sr in srs]
    plan = ServePlan(request=req, candidates=len(tasks), mean_output=float(first.output.mean()))
    return tasks, plan


def plan_serving(req: ServePlanRequest, progress=None, pool=None) -> ServePlan:
    """Search every layout of ``req.gpus`` GPUs x the knobs of ``req`` for the best goodput per GPU under the
    SLOs (the module docstring: the bisection, the static bound and pruning, the pools).

    ``progress(done, total, runs)``: candidates done (searched, pruned or failed) of all, and the runs
    simulated so far, at the start and after each candidate (and each run, in process) (None: nothing).
    ``pool``: an object with ``map(fn, items)`` (or ``imap``) to run the tasks on, kept open (None: one made
    from ``req.jobs`` and ``req.ray``, closed after).
    Returns: :class:`ServePlan`. Raises: LmcostError for ``pd`` (P/D pools:
    :func:`lmcost.apps.serve_plan_pd.plan_pd`), what every candidate shares (:func:`check_fixed`), each candidate's knobs (:func:`lmcost.apps.serve_inputs.check_request`), a workload with no decode (all
    outputs 1), and the pool's (:func:`make_pool`). What fails for one candidate alone (no room for its KV
    cache, a request it cannot hold) is that candidate's row, "cannot run".
    """
    if req.pd:  # prefill/decode pools: lmcost.apps.serve_plan_pd (it imports this module)
        raise LmcostError("pd", "plan_serving searches one pool", "call lmcost.apps.serve_plan_pd.plan_pd")
    cfg, hw, lays = check_fixed(req)
    cands = [(lay, s, t) for lay in lays for s in req.max_num_seqs for t in req.max_num_batched_tokens]
    srs = [_serve_request(req, lay, s, t) for lay, s, t in cands]
    tasks, plan = plan_tasks(req, srs)

    def row(i, status, **kw):
        lay, s, t = cands[i]
        return _row(hw.name, lay, s, t, status, gpus=req.gpus, **kw)

    return search_candidates(plan, tasks, row, progress, pool)


def search_candidates(plan: ServePlan, tasks: list, row, progress=None, pool=None, bound_task=_bound_task,
                      search_task=_search_task, gpus=None) -> ServePlan:
    """Search ``tasks`` (one per candidate) as the module docstring says: every static bound (``bound_task``),
    then waves of :attr:`ServePlanRequest.wave`, highest bound per GPU first, each searched (``search_task``)
    unless its bound per GPU is below the best goodput per GPU found (``gpus[i]``: candidate i's GPUs;
    None: all alike, compared per candidate). ``row(i, status, bound=, found=, reason=)``: candidate i's row.
    Fills and returns ``plan`` (rows ranked). ``progress`` and ``pool`` as :func:`plan_serving`'s."""
    req = plan.request
    per = [1] * len(tasks) if gpus is None else list(gpus)
    unit = "requests/s" if gpus is None else "requests/s per GPU"
    done = {"n": 0, "runs": 0}

    def tick(k=1, runs=0):
        done["n"] += k
        done["runs"] += runs
        if progress:
            progress(done["n"], len(tasks), done["runs"])

    own = pool is None
    if own:
        pool, label = make_pool(req.jobs, req.ray, len(tasks))
    else:
        label = type(pool).__name__
    search = search_task
    if pool is None:  # in process: say each run, as a candidate's search may take minutes
        search = partial(search_task, on_run=lambda: tick(0, 1))
    plan.workers = label
    rows = []
    tick(0)
    try:
        bounds = _map(pool, bound_task, tasks, lambda _: None)
        live = []
        for i, (task, (bound, why)) in enumerate(zip(tasks, bounds)):
            if bound is None:
                rows.append(row(i, "cannot run", reason=why))
                tick()
            else:
                live.append((bound / per[i], i, replace(task, bound=bound)))
        live.sort(key=lambda c: -c[0])  # stable: equal bounds keep the candidates' order
        best = 0.0
        for w in range(0, len(live), req.wave):
            wave = live[w:w + req.wave]
            run = [c for c in wave if not (req.prune and c[0] < best)]
            for bound, i, task in wave:
                if req.prune and bound < best:
                    rows.append(row(i, "pruned", bound=task.bound, reason=f"static bound {bound:.3g} "
                                    f"{unit} below the best goodput found, {best:.3g}"))
                    plan.pruned += 1
                    tick()
            results = _map(pool, search, [c[2] for c in run],
                           lambda res: tick(1, 0 if pool is None else res["runs"]))
            for (bound, i, task), res in zip(run, results):
                ok = res["rate"] is not None
                r = row(i, "ok" if ok else "no rate", bound=task.bound, found=res)
                rows.append(r)
                if ok:
                    best = max(best, r["goodput_requests_per_s"] / per[i])
    finally:
        if own and pool is not None:
            (pool.shutdown if hasattr(pool, "shutdown") else pool.close)()
    order = {"ok": 0, "pruned": 1, "no rate": 2, "cannot run": 3}
    rows.sort(key=lambda x: (order[x["status"]], -(x["goodput_requests_per_s_per_gpu"] or 0.0),
                             -(x["offered_rate"] or 0.0), -(x["bound_rate"] or 0.0)))
    plan.rows = rows
    return plan
