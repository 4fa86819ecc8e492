"""``lmcost serve``: an inference server under load. A workload of requests (offline, a fixed concurrency,
Poisson or gamma arrivals at a rate, or a replayed JSONL) runs through an engine's scheduler
(:mod:`lmcost.apps.serve_sim`: continuous batching, chunked prefill, paged KV, preemption) whose every step
is costed by the same operators as ``estimate`` (:class:`lmcost.cost.engine_step.StepModel`), plus the
engine's CPU overheads per step and per scheduled sequence (:mod:`lmcost.hardware.engines`, fitted on
measured serving points: :mod:`lmcost.calibration.serving_fit`).

Python API::

    from lmcost.apps.serve import ServeRequest, run_serve
    res = run_serve(ServeRequest(model="llama-3-8b", gpu="h100", engine="vllm", rate=10.0, requests=2000))
    res.summary["ttft_s"]["p99"]     # seconds
    res.to_dict()                    # the JSON of `lmcost serve --json`

Definitions (as vLLM's and SGLang's benchmark scripts report them): TTFT = first token - arrival; TPOT =
(finish - first token) / (output - 1) per request (requests of one output token have none); ITL = the gap
between consecutive tokens of a request, over every token; E2E = finish - arrival; queueing = first
admission - arrival. Throughput = requests (and input/output tokens) over the span from the first arrival
to the last finish. Goodput (DistServe, Zhong et al. 2024): requests per second that meet every SLO given.
Data parallel replicas (``dp``) share the load round robin: one replica is simulated with every dp-th
request (each replica alike), throughput multiplied by dp.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from lmcost.apps.serve_energy import check_price, energy_keys, power_for
from lmcost.apps.serve_sim import Knobs, Trace, simulate
from lmcost.apps.setup import (Say, check_quant, checked_layout, quiet, resolve_precision, resolve_quant, say_uncalibrated,
                               select_efficiency)
from lmcost.basics.errors import LmcostError
from lmcost.cost.energy import Metered, clocked
from lmcost.cost.engine_step import StepModel
from lmcost.model.config import ArchConfig
from lmcost.hardware.gpu import GPU
from lmcost.operators.workload import Settings, check_positions, past_trained_context

PERCENTILES = (50, 90, 99)
#: How a step's time is predicted: ``engine`` (default): the roofline of each operator times the engine's
#: fitted factor for its group, plus the engine's fitted CPU overheads (:mod:`lmcost.apps.serve_fit`);
#: ``roofline``: the lower bound (no factor, no overhead); ``calibrated``: the GPU's calibrated kernel model
#: (:mod:`lmcost.cost.efficiency`) plus the engine's overheads.
TIME_MODELS = ("engine", "roofline", "calibrated")


@dataclass(frozen=True, kw_only=True)
class ServeFields:
    """The fields a serving run and a serving plan share: what runs (model, GPU, engine, precision, time
    model and kernel choices, expert imbalance, cluster), the generated workload (None: the defaults of
    :data:`lmcost.apps.serve_inputs.WORKLOAD_DEFAULTS`), the engine knobs not searched, and the SLOs (s).
    :class:`ServeRequest` and :class:`lmcost.apps.serve_plan.ServePlanRequest` add their own."""

    model: str | ArchConfig
    gpu: str | GPU = "h100"
    engine: str = "vllm"
    dtype: str = "auto"
    weight_dtype: str | None = None
    quant: str | None = None
    kv_dtype: str | None = None
    time_model: str = "engine"
    attention_kernel: str = "auto"
    runtime: str = "auto"
    imbalance: float = 1.0
    cluster: str | None = None
    requests: int | None = None
    prompt: str | None = None
    output: str | None = None
    arrival: str | None = None
    seed: int | None = None
    chunked_prefill: bool | None = None
    memory_fraction: float | None = None
    block_size: int | None = None
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class ServeRequest(ServeFields):
    """One ``lmcost serve`` run. Model/GPU/precision/layout fields as :class:`lmcost.apps.estimate.EstimateRequest`;
    ``engine``: a shipped engine profile name or YAML path (:func:`lmcost.hardware.engines.load_engine`), its
    scheduler knobs overridden by ``max_num_seqs`` ... ``block_size`` when given.
    Workload: ``requests`` requests with ``prompt``/``output`` length specs (:func:`lmcost.apps.serve_workload.lengths`)
    arriving at ``rate`` per second (``arrival`` poisson or gamma:CV), or all at once (no rate, no concurrency:
    offline), or a closed loop of ``concurrency`` users; or the requests of ``workload_file`` (JSONL). Workload
    fields left None take :data:`lmcost.apps.serve_inputs.WORKLOAD_DEFAULTS` (1,000 requests, prompt 1024,
    output 256, seed 0; poisson arrivals where a rate is given); those that mean nothing together are refused
    (:func:`lmcost.apps.serve_inputs.check_request`).
    SLOs: ``slo_ttft_s``, ``slo_tpot_s`` (seconds, per request) for goodput. ``rates``: a sweep (each rate a run).
    Wide EP (EP over attention-DP): ``a2a``, ``expert_load``, ``redundant_experts``, ``tbo``
    (:mod:`lmcost.apps.serve_wide_ep`; off by default).
    Prefix caching (:mod:`lmcost.apps.serve_prefix`): ``prefix`` a spec of shared prefixes for the generated
    workload (``shared:N``, ``groups:G:N``, ``sessions:TURNS``); ``prefix_caching`` on or off (None: the engine's
    default, :attr:`lmcost.hardware.engines.EngineProfile.prefix_caching`); ``kv_offload`` a host tier for
    evicted prefix blocks, ``cpu:SIZE[:GBPS]`` (:func:`lmcost.apps.serve_prefix.parse_offload`), or tiers from
    the node file: ``cpu``, ``disk[:SIZE[:GBPS]]``, ``cpu,disk`` (:func:`lmcost.apps.serve_offload.parse_tiers`)."""

    tp: int = 1
    ep: int = 1
    dp: int = 1
    nodes: int | None = None
    rate: float | None = None
    concurrency: int | None = None
    workload_file: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    rates: tuple = ()
    # wide EP (lmcost.apps.serve_wide_ep): all-to-all kernel, expert load model, EPLB replicas, two-batch overlap
    a2a: str = "nccl"
    expert_load: str | None = None
    redundant_experts: int = 0
    tbo: bool = False
    # speculative decoding (lmcost.apps.serve_spec): method (none, draft, eagle, eagle3, mtp, ngram), draft tokens
    # per step k, the draft model (method draft), acceptance: a mean accepted length or k per-position rates
    spec: str | None = None
    spec_tokens: int | None = None
    draft_model: str | ArchConfig | None = None
    acceptance: float | tuple | None = None
    # prefill/decode disaggregation (lmcost.apps.serve_pd): tp/ep/dp and the knobs above are the decode pool's
    pd: bool = False
    prefill_workers: int | None = None
    prefill_tp: int | None = None
    prefill_ep: int | None = None
    prefill_dp: int | None = None
    prefill_max_num_batched_tokens: int | None = None
    decode_workers: int | None = None
    kv_link: str | None = None
    # prefix caching
    prefix: str | None = None
    prefix_caching: bool | None = None
    kv_offload: str | None = None
    # energy and cost: a GPU power cap (W; None: the default limit) and a price ($ per GPU-hour; None: no cost)
    power_limit: float | None = None
    usd_per_gpu_hour: float | None = None
    # P/D prefill batch (lmcost.apps.serve_pd): requests per prefill step in each prefill replica (None: the engine's)
    prefill_max_num_seqs: int | None = None


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What a run is costed with: the model, GPU, precision, settings, engine profile and its knobs, the step
    model and the KV cache one GPU holds."""

    cfg: ArchConfig
    gpu: GPU
    precision: object
    settings: Settings
    engine: object
    knobs: Knobs
    step: StepModel
    kv_capacity_bytes: float
    kv_per_token_bytes: float
    kv_per_seq_bytes: float
    quant: str | None
    time_model: str = "engine"
    memory_fraction: float = 0.0  #: of the GPU's memory, as the engine's rule reads it
    wide_ep: dict | None = None  #: wide EP's model and figures (lmcost.apps.serve_wide_ep), None when off
    # prefix caching
    prefix_caching: bool = False  #: blocks of shared prefixes reused (:mod:`lmcost.apps.serve_prefix`)
    kv_offload: tuple | None = None  #: the host tier: (bytes per GPU, bytes/s), serve_offload.Tiers, or None
    power: object = None          #: the GPU's power levels (:class:`lmcost.cost.energy.ServePower`)
    usd_per_gpu_hour: float | None = None


@dataclass
class ServeResult:
    """A run (or a sweep of runs): the setup, the summary of each run (:func:`summarize`) and the trace of the
    last (for figures)."""

    setup: Setup
    runs: list = field(default_factory=list)       #: summaries, one per rate (one for a single run)
    trace: Trace | None = None
    sweep: bool = False                            #: a sweep of rates (its JSON lists ``sweep``, even of one)
    workload: dict = field(default_factory=dict)   #: what was run: the workload's fields as resolved
    # P/D: every GPU of both pools (None: the setup's layout's); settings.tp/ep/dp stay the decode worker's
    gpus: int | None = None

    @property
    def summary(self) -> dict:
        return self.runs[-1]

    def best_rate(self, percentile: int = 99) -> float | None:
        """Of a sweep, the highest rate (requests/s) whose run meets every SLO given at ``percentile`` (TTFT and
        TPOT p-th percentiles at most the SLOs) without saturating; None without SLOs or when none does."""
        ok = [r["rate"] for r in self.runs if r["rate"] is not None and not r["saturated"] and meets(r, percentile)]
        return max(ok) if ok and self.runs[0]["goodput"] is not None else None

    def to_dict(self) -> dict:
        """The JSON of ``lmcost serve --json`` (base units: seconds, tokens, bytes). ``settings.gpus`` is every
        GPU the run holds (under P/D both pools'; ``settings.tp/ep/dp`` and the knobs are then the decode
        worker's, as ``settings.layout_of`` says)."""
        s = self.setup
        lay = s.settings.layout
        head = dict(model=s.cfg.name, gpu=s.gpu.name, engine=dict(name=s.engine.name, version=s.engine.version),
                    workload=self.workload,
                    precision=dict(weights=s.precision.weights, activations=s.precision.activations,
                                   kv_cache=s.precision.kv_cache),
                    settings=dict(model=s.time_model, quant=s.quant, tp=lay.tp, ep=lay.ep, dp=lay.dp,
                                  gpus=self.gpus or lay.gpus,
                                  max_num_seqs=s.knobs.max_num_seqs,
                                  max_num_batched_tokens=s.knobs.max_num_batched_tokens,
                                  chunked_prefill=s.knobs.chunked_prefill, mixed_batches=s.knobs.mixed_batches,
                                  admission=s.knobs.admission, block_size=s.knobs.block_size,
                                  memory_fraction=s.memory_fraction,
                                  step_overhead_s=s.knobs.step_overhead_s, seq_overhead_s=s.knobs.seq_overhead_s),
                    kv_cache=dict(capacity_bytes=s.kv_capacity_bytes, per_token_bytes=s.kv_per_token_bytes,
                                  capacity_tokens=(int(s.kv_capacity_bytes // s.kv_per_token_bytes)
                                                   if s.kv_per_token_bytes else None)))
        if self.gpus is not None:  # P/D
            head["settings"]["layout_of"] = "decode worker"
        if not self.sweep:
            return {**head, **self.runs[0]}
        g = self.runs[0]["goodput"]
        best = None
        if g["slo_ttft_s"] is not None or g["slo_tpot_s"] is not None:
            best = dict(rate=self.best_rate(99), percentile=99)
        return {**head, "sweep": self.runs, "best_rate": best}


def meets(run: dict, percentile: int = 99) -> bool:
    """Whether a run's TTFT and TPOT at ``percentile`` (50, 90 or 99) are within the SLOs its goodput was
    judged on (an SLO not given is met)."""
    g, key = run["goodput"], f"p{percentile}"
    return all(g[slo] is None or (run[lat][key] is not None and run[lat][key] <= g[slo])
               for slo, lat in (("slo_ttft_s", "ttft_s"), ("slo_tpot_s", "tpot_s")))


def _dist(v: np.ndarray, w: np.ndarray | None = None) -> dict:
    """mean, p50, p90, p99 (and max) of ``v``, weighted by ``w`` if given; None for an empty array."""
    if v.size == 0:
        return {k: None for k in ("mean", "p50", "p90", "p99", "max")}
    if w is None:
        qs = np.percentile(v, PERCENTILES)
        mean = float(v.mean())
    else:
        order = np.argsort(v)
        v, w = v[order], w[order]
        cum = np.cumsum(w)
        qs = [v[min(len(v) - 1, int(np.searchsorted(cum, q / 100 * cum[-1])))] for q in PERCENTILES]
        mean = float(np.dot(v, w) / cum[-1])
    return {"mean": mean, **{f"p{q}": float(x) for q, x in zip(PERCENTILES, qs)}, "max": float(v.max())}


def summarize(tr: Trace, *, dp: int, gpus: int, slo_ttft_s: float | None, slo_tpot_s: float | None,
              offered_rate: float | None, delay_s=0.0, n_total: int | None = None) -> dict:
    """The figures of one run (one replica's trace; ``dp`` replicas alike): throughput, latency distributions,
    goodput, KV use and saturation. ``delay_s`` (per request, s): time outside the engine's steps before the
    first token (the engine's request overheads), added to TTFT and E2E. Units: seconds, tokens, requests.
    A TPOT SLO that judged no request (every output one token) adds ``goodput.tpot_judged`` 0."""
    ttft = tr.first_token_s - tr.arrival_s + delay_s
    e2e = tr.finish_s - tr.arrival_s + delay_s
    multi = tr.output > 1
    tpot = (tr.finish_s[multi] - tr.first_token_s[multi]) / (tr.output[multi] - 1)
    queue = tr.admitted_s - tr.arrival_s
    span = float(tr.finish_s.max() - tr.arrival_s.min())
    n = len(ttft)
    seg = tr.itl_segments
    if len(seg):  # a run of k steps as its first and last gap, each half its weight (gaps affine in the step)
        vals = np.concatenate([seg[:, 0], seg[:, 1]])
        wts = np.concatenate([seg[:, 2] * seg[:, 3] / 2, seg[:, 2] * seg[:, 3] / 2])
        itl = _dist(vals, wts)
    else:
        itl = _dist(np.array([]))
    # the replicas alike: this one's figures times the share of all requests it served (dp when they split evenly)
    scale = n_total / n if n_total is not None else dp
    reqs_s = scale * n / span
    window = float(tr.arrival_s.max() - tr.arrival_s.min())
    # the rate the requests arrived at (n - 1 gaps over the window): a sample of a bursty process strays from
    # the rate asked, and the served rate is judged against this one
    arrived = scale * (n - 1) / window if window > 0 and n > 1 else None
    ok = np.ones(n, dtype=bool)
    if slo_ttft_s is not None:
        ok &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        t_all = np.zeros(n)
        t_all[multi] = tpot
        ok &= t_all <= slo_tpot_s
    judged_none = slo_tpot_s is not None and not multi.any()  # every output one token: no TPOT to judge
    out_tok, in_tok = float(tr.output.sum()), float(tr.prompt.sum())
    kv = tr.kv_timeline
    saturated = None
    if offered_rate is not None and n >= 8:
        # overload: the queueing delay keeps growing over the arrivals (requests wait i (1/mu - 1/lambda) more
        # at the i-th past capacity: the last quarter, by arrival, waits more than twice the second, beyond a
        # service time); a run within capacity waits alike throughout
        order = np.argsort(tr.arrival_s, kind="stable")
        q = len(order) // 4
        early, late = float(queue[order[q:2 * q]].mean()), float(queue[order[3 * q:]].mean())
        # (or the served rate is under half the offered: a burst past capacity, too short to build a trend)
        service = float(np.median(ttft - queue))
        if late - early > early + 2 * service or reqs_s < 0.5 * offered_rate:
            blocked = {k: v for k, v in tr.blocked.items() if v}
            what = max(blocked, key=blocked.get) if blocked else "compute"
            saturated = dict(offered_rate=offered_rate, served_rate=reqs_s, limit=what, queue_early_s=early,
                             queue_late_s=late,
                             note=f"the queue grows (requests wait {early:.3g} s in the second quarter, {late:.3g} s "
                                  f"in the last): {offered_rate:.3g} requests/s is past what this layout serves "
                                  f"({reqs_s:.3g}/s), limited by {what}")
    return {
        "rate": offered_rate,
        "requests": n_total if n_total is not None else dp * n,
        "arrival_rate": arrived,
        "throughput": dict(requests_per_s=reqs_s, input_tokens_per_s=scale * in_tok / span,
                           output_tokens_per_s=scale * out_tok / span,
                           output_tokens_per_s_per_gpu=scale * out_tok / span / gpus,
                           tokens_per_s_per_gpu=scale * (in_tok + out_tok) / span / gpus),
        "ttft_s": _dist(ttft), "tpot_s": _dist(tpot), "itl_s": itl, "e2e_s": _dist(e2e), "queue_s": _dist(queue),
        "goodput": dict(requests_per_s=scale * int(ok.sum()) / span, fraction=float(ok.mean()),
                        slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s,
                        **({"tpot_judged": 0} if judged_none else {})),  # the TPOT SLO judged no request
        "kv_use": dict(peak_fraction=float(kv[:, 1].max()) if len(kv) else 0.0,
                         mean_fraction=float(np.average(kv[:, 1])) if len(kv) else 0.0),
        "preemptions": int(tr.preemptions.sum()),
        "steps": tr.steps, "busy_fraction": tr.busy_s / span if span > 0 else 0.0, "span_s": span,
        "saturated": saturated,
    }


def kv_capacity(engine, knobs: Knobs, gpu: GPU, step: StepModel, memory_fraction: float) -> tuple:
    """(capacity bytes, per-token bytes, per-sequence bytes) of one GPU's KV cache under ``engine``'s rule:
    ``total``: fraction x memory - weights - the activation peak of a prefill of the token budget (vLLM's
    gpu_memory_utilization, which covers all three); ``free``: fraction x (memory - weights - activations)
    (TensorRT-LLM's free_gpu_memory_fraction). Raises: LmcostError if nothing is left for a cache."""
    space = step.kv_space(knobs.max_num_batched_tokens)
    mem = gpu.memory_bytes
    if getattr(engine, "memory_fraction_of", "total") == "free":
        cap = memory_fraction * (mem - space.weights_bytes - space.activation_bytes)
    else:
        cap = memory_fraction * mem - space.weights_bytes - space.activation_bytes
    if cap <= 0:
        if space.weights_bytes < memory_fraction * mem:  # the weights fit: the step's activations take the rest
            raise LmcostError("max_num_batched_tokens", f"a step of {knobs.max_num_batched_tokens:,} tokens needs "
                              f"{space.activation_bytes / 1e9:.1f} GB of activations beside {space.weights_bytes / 1e9:.1f}"
                              f" GB of weights, leaving no KV cache in {memory_fraction:g} of {mem / 1e9:.0f} GB",
                              "lower the token budget per step")
        raise LmcostError("gpu", f"the weights ({space.weights_bytes / 1e9:.1f} GB per GPU) and activations leave no "
                          f"room for a KV cache in {memory_fraction:g} of {mem / 1e9:.0f} GB",
                          "use more GPUs (tp), a smaller weight dtype, or a larger memory fraction")
    return cap, space.per_token_bytes, space.per_seq_bytes


def engine_knobs(engine, gpu: GPU, r: ServeRequest) -> tuple[Knobs, float]:
    """The scheduler knobs of ``engine`` on ``gpu`` (its documented defaults, which may depend on the GPU's
    memory), each overridden by the request's when given, and the memory fraction."""
    seqs = r.max_num_seqs or engine.seqs_for(gpu.memory_bytes, gpu.name)
    tokens = r.max_num_batched_tokens or engine.tokens_for(gpu.memory_bytes, gpu.name)
    chunked = engine.chunked_prefill if r.chunked_prefill is None else r.chunked_prefill
    knobs = Knobs(max_num_seqs=seqs, max_num_batched_tokens=tokens, chunked_prefill=chunked,
                  mixed_batches=engine.mixed_batches, admission=engine.admission, preemption=engine.preemption,
                  block_size=r.block_size or engine.block_size, reserve_ratio=engine.reserve_ratio,
                  step_overhead_s=engine.step_overhead_us * 1e-6,
                  seq_overhead_s=engine.seq_overhead_us * 1e-6)
    if knobs.max_num_batched_tokens < knobs.max_num_seqs:
        raise LmcostError("max_num_batched_tokens", f"a budget of {knobs.max_num_batched_tokens:,} tokens per step is "
                          f"below max_num_seqs {knobs.max_num_seqs:,}: a step could not give every running sequence "
                          "its token (vLLM refuses it so)", "raise the token budget or lower max_num_seqs")
    return knobs, (r.memory_fraction or engine.memory_fraction)


def prepare(r: ServeRequest, say: Say = quiet, max_context: int | None = None) -> Setup:
    """Load and check what ``r`` names and build its step model (for contexts up to ``max_context``)."""
    from lmcost.hardware.engines import load_engine
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config

    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    # the engine overheads (serve-fit) were fitted on the block's own kernel figures: auto keeps them here
    hw = select_efficiency(r.gpu if isinstance(r.gpu, GPU) else load_gpu(r.gpu), r.attention_kernel, r.runtime,
                           designs=False)
    from lmcost.apps import serve_wide_ep as wep

    wep.check(r, cfg)
    imbalance, imbalance_source = wep.imbalance(r, cfg)
    layout = checked_layout(hw, tp=r.tp, ep=r.ep, dp=r.dp, imbalance=imbalance, cluster=r.cluster, nodes=r.nodes)
    layout.check(cfg)  # heads, KV heads, experts and FFN width split over tp and ep
    engine = load_engine(r.engine)
    check_quant(cfg, r.quant, r.weight_dtype, [hw])  # before the dtype (see check_quant)
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, [hw], say)
    cfg, quant = resolve_quant(cfg, r.quant, r.weight_dtype, say)
    if r.time_model not in TIME_MODELS:
        raise LmcostError("time_model", f"unknown value {r.time_model!r}", f"use one of {', '.join(TIME_MODELS)}")
    settings = Settings(logits="last", model="calibrated" if r.time_model == "calibrated" else "roofline",
                        layout=layout, quant=quant)
    knobs, fraction = engine_knobs(engine, hw, r)
    if r.time_model == "roofline":  # the lower bound: no engine factor, no CPU overhead
        knobs = replace(knobs, step_overhead_s=0.0, seq_overhead_s=0.0)
    top = max_context or (cfg.max_positions or 131072)
    from lmcost.apps.serve_spec import method_of, spec_step
    rows = 1 + r.spec_tokens if method_of(r) else 1  # speculative decoding: a decode verifies k + 1 tokens
    sizes = dict(max_tokens=max(knobs.max_num_batched_tokens, rows * knobs.max_num_seqs),
                 max_seqs=rows * knobs.max_num_seqs, max_context=top)
    step = StepModel(cfg, hw, precision, settings, **sizes)
    if r.time_model == "engine":
        step = step.scaled(engine.time_scales)
    power = power_for(hw, getattr(r, "power_limit", None), say)
    step = clocked(step, power)  # a cap below the TDP slows the compute-bound groups
    wide = None
    if wep.active(r):  # wide EP re-times the target's step, before a draft is built beside it
        from lmcost.operators.parallel import cluster_for

        step, wide = wep.attach(r, cfg, precision, settings, step, cluster_for(layout, hw), imbalance_source,
                                engine.time_scales if r.time_model == "engine" else None)
    if method_of(r):
        step = spec_step(r, step, say=say, **sizes)
        if wide is not None:  # an MTP module's MoE layer through the same all-to-all
            step = wep.attach_draft(r, step, precision, settings, cluster_for(layout, hw))
    if r.time_model != "roofline":  # the engine's gaps between the step's kernels, per step
        knobs = replace(knobs, step_overhead_s=knobs.step_overhead_s + engine.kernel_overhead_us * 1e-6 * step.kernels)
    cap, per_tok, per_seq = kv_capacity(engine, knobs, hw, step, fraction)
    if wide is not None:
        cap -= wide["redundant_bytes"]
        if cap <= 0:
            raise LmcostError("redundant_experts", f"{r.redundant_experts} replicas take "
                              f"{wide['redundant_bytes'] / 1e9:.1f} GB per GPU, leaving no KV cache",
                              "use fewer redundant experts or more GPUs")
    if r.time_model == "calibrated":
        say_uncalibrated(hw, r.time_model, say)
    elif r.attention_kernel != "auto" or r.runtime != "auto":
        say(f"note: `attention_kernel` and `runtime` choose the calibrated model's figures: under `time_model` "
            f"{r.time_model} they change nothing")
    for line in engine.notes_for_serve():
        say(line)
    return Setup(cfg=cfg, gpu=hw, precision=precision, settings=settings, engine=engine, knobs=knobs, step=step,
                 kv_capacity_bytes=cap, kv_per_token_bytes=per_tok, kv_per_seq_bytes=per_seq, quant=quant,
                 time_model=r.time_model, memory_fraction=fraction, wide_ep=wide,
                 prefix_caching=engine.prefix_caching if getattr(r, "prefix_caching", None) is None else r.prefix_caching,
                 kv_offload=_offload(r, layout, hw), power=power,
                 usd_per_gpu_hour=getattr(r, "usd_per_gpu_hour", None))


def _offload(r, layout, hw) -> tuple | None:
    """The request's KV offload tiers on its node, parsed (None without one): serve_offload.parse_tiers."""
    if getattr(r, "kv_offload", None) is None:
        return None
    from lmcost.apps.serve_offload import parse_tiers
    from lmcost.operators.parallel import cluster_for
    try:
        cluster = cluster_for(layout, hw)
    except LmcostError:  # a GPU with no shipped node: the tiers by hand only (cpu:SIZE[:GBPS] as before)
        cluster = None
    return parse_tiers(r.kv_offload, cluster)


def check_requests(setup: Setup, prompt: np.ndarray, output: np.ndarray, field: str = "workload.prompt") -> None:
    """Raises: LmcostError (naming ``field``: the prompt option, or the workload file) for a request past the
    model's learned positions, one whose KV cache alone exceeds the capacity, or (prefill not chunked) a
    prompt over the token budget."""
    cfg, knobs = setup.cfg, setup.knobs
    total = prompt + output
    i = int(np.argmax(total))
    if cfg.positions == "learned" and total[i] > cfg.max_positions:
        raise LmcostError(field, f"request {i}'s prompt + output, {int(total[i]):,} tokens, exceeds the "
                          f"{cfg.max_positions:,} learned positions of {cfg.name}",
                          f"keep prompt + output <= {cfg.max_positions:,}")
    if setup.kv_per_token_bytes * knobs.block_size + setup.kv_per_seq_bytes > setup.kv_capacity_bytes:
        raise LmcostError("block_size", f"one block of {knobs.block_size:,} tokens ({setup.kv_per_token_bytes * knobs.block_size / 1e9:.2f}"
                          f" GB) is more than the {setup.kv_capacity_bytes / 1e9:.2f} GB KV cache one GPU holds",
                          "use a block of 16 to 256 tokens")
    need = setup.kv_per_token_bytes * (total + knobs.block_size - 1) + setup.kv_per_seq_bytes
    big = np.flatnonzero(need > setup.kv_capacity_bytes)
    if big.size:
        j = int(big[0])
        if field == "workload.prompt" and output[j] > prompt[j]:
            field = "workload.output"
        raise LmcostError(field, f"request {j} needs {need[j] / 1e9:.2f} GB of KV cache (prompt {int(prompt[j])}"
                          f" + output {int(output[j])} tokens), more than the {setup.kv_capacity_bytes / 1e9:.2f} GB "
                          "one GPU holds", "use shorter requests, more GPUs (tp), or a smaller KV dtype")
    if not knobs.chunked_prefill:
        long = np.flatnonzero(prompt > knobs.max_num_batched_tokens)
        if long.size:
            j = int(long[0])
            raise LmcostError(field, f"request {j}'s prompt of {int(prompt[j])} tokens exceeds the "
                              f"{knobs.max_num_batched_tokens}-token budget of a step without chunked prefill",
                              "raise `max_num_batched_tokens` or turn chunked prefill on")


def run_once(setup: Setup, reqs, *, dp: int, slo_ttft_s=None, slo_tpot_s=None, rate=None, progress=None) -> tuple:
    """Simulate one replica's share (every dp-th request) of ``reqs`` (:class:`lmcost.apps.serve_workload.Requests`)
    and summarize. Returns: (summary dict, trace)."""
    arrival, prompt, output = reqs.arrival_s[::dp], reqs.prompt[::dp], reqs.output[::dp]
    conc = None if reqs.concurrency is None else max(1, reqs.concurrency // dp)
    cache = None
    if reqs.prefix_id is not None and setup.prefix_caching:
        from lmcost.apps.serve_prefix import PrefixCache
        cache = PrefixCache(reqs.prefix_id[::dp], reqs.prefix_tokens[::dp], setup.knobs.block_size,
                            setup.kv_per_token_bytes, setup.kv_offload)
    meter = Metered(setup.step, setup.power)  # the step model, summing the joules of the steps run
    tr = simulate(meter, setup.knobs, arrival, prompt, output, kv_capacity_bytes=setup.kv_capacity_bytes,
                  kv_per_token_bytes=setup.kv_per_token_bytes, kv_per_seq_bytes=setup.kv_per_seq_bytes,
                  concurrency=conc, progress=progress, prefix_cache=cache)
    lay = setup.settings.layout
    summary = summarize(tr, dp=dp, gpus=lay.gpus, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, offered_rate=rate,
                        delay_s=request_delay(setup, prompt), n_total=len(reqs.prompt))
    if reqs.concurrency is not None:
        summary["concurrency"] = reqs.concurrency
    if setup.wide_ep is not None:
        from lmcost.apps.serve_wide_ep import summary as wide_ep_summary

        summary["wide_ep"] = wide_ep_summary(setup.wide_ep, float(tr.prompt.sum() + tr.output.sum()) / max(tr.steps, 1))
    if hasattr(setup.step, "tokens_per_step"):  # speculative decoding
        from lmcost.apps.serve_spec import spec_summary
        summary["spec"] = spec_summary(setup, tr)
    if reqs.prefix_id is not None:
        from lmcost.apps.serve_prefix import summary as prefix_summary
        summary["prefix_cache"] = prefix_summary(cache, setup, scale=len(reqs.prompt) / len(prompt))
    summary.update(energy_keys(setup, meter, tr, summary))
    return summary, tr


def request_delay(setup: Setup, prompt: np.ndarray) -> np.ndarray | float:
    """Seconds each request spends outside the engine's steps before its first token (the engine profile's
    request and per-prompt-token overheads; none under the roofline, a lower bound)."""
    if setup.time_model == "roofline":
        return 0.0
    e = setup.engine
    return (e.request_overhead_us + e.prompt_token_overhead_us * np.asarray(prompt, dtype=float)) * 1e-6


def run_serve(r: ServeRequest, say: Say = quiet, progress=None) -> ServeResult:
    """Load, check and simulate what ``r`` asks (a sweep over ``r.rates`` if given).

    Returns: :class:`ServeResult`. Raises: LmcostError for out-of-range knobs and fields that mean nothing
    together (:func:`lmcost.apps.serve_inputs.check_request`), unknown names, bad workload inputs
    (:mod:`lmcost.apps.serve_workload`), a request that cannot be served alone (:func:`check_requests`), a
    layout whose weights leave no room for a KV cache, and the errors of :func:`prepare`.
    """
    from lmcost.apps.serve_inputs import check_request, workload_args
    from lmcost.apps.serve_prefix import check_use, requests_for

    check_request(r)
    from lmcost.apps.serve_spec import check_spec
    check_spec(r)
    if r.pd:  # prefill/decode disaggregation: two pools, lmcost.apps.serve_pd (it imports this module)
        raise LmcostError("pd", "run_serve serves one pool", "call lmcost.apps.serve_pd.run_pd")
    check_price(r.usd_per_gpu_hour)
    args = workload_args(r)

    def workload(rate):
        return requests_for(r, args, rate)

    rates = tuple(r.rates) or (r.rate,)
    first = workload(rates[0])
    check_use(r, first.prefix_id)  # prefix caching's fields need prefixes
    if len(first.prompt) < r.dp:
        raise LmcostError("workload_file" if r.workload_file else "requests",
                          f"{len(first.prompt)} requests cannot reach each of the {r.dp} data-parallel replicas",
                          f"give at least {r.dp} requests (each replica serves every dp-th)")
    top = int((first.prompt + first.output).max())
    setup = prepare(r, say, max_context=top)
    check_use(r, first.prefix_id, setup)
    check_requests(setup, first.prompt, first.output, "workload_file" if r.workload_file else "workload.prompt")
    note = past_trained_context(setup.cfg, top)
    if note:
        say(note)
    from lmcost.apps.serve_inputs import workload_args

    wl = ({"file": str(r.workload_file)} if r.workload_file else
          {k: v for k, v in workload_args(r).items() if k != "n"} | {"requests": len(first.prompt)})
    if r.prefix is not None:
        wl["prefix"] = r.prefix
    res = ServeResult(setup=setup, sweep=bool(r.rates), workload=wl)
    for k, rate in enumerate(rates):
        reqs = first if k == 0 else workload(rate)
        offered = rate if (rate is not None and reqs.concurrency is None and not r.workload_file) else None
        summary, tr = run_once(setup, reqs, dp=setup.settings.layout.dp, slo_ttft_s=r.slo_ttft_s,
                               slo_tpot_s=r.slo_tpot_s, rate=offered, progress=progress)
        res.runs.append(summary)
        res.trace = tr
    return res
