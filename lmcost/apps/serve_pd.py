"""Prefill/decode (P/D) disaggregation: ``lmcost serve --pd``. Two pools, each with its own GPUs, layout and
engine knobs: x prefill workers run every request's prompt (output 1: the first token, no decode), requests
spread round robin over them; the prompt's KV cache then moves to a decode worker over the cluster's link;
y decode workers take each request at prefill finish + transfer, its KV already in the cache
(:func:`lmcost.apps.serve_sim.simulate`'s ``prefilled``), round robin in the order they arrive there, and
generate the rest. As DistServe (Zhong et al., OSDI 2024), Splitwise (Patel et al., ISCA 2024), vLLM's P/D
connectors and SGLang's PD router run it: every token streams from the decode worker, so
TTFT = the prefill pool's first token + the KV transfer + the decode pool's admission wait; TPOT and ITL
are the decode pool's. Queueing counts the waits in both pools.

Under ``pd`` the request's ``tp``/``ep``/``dp`` and ``max_num_seqs``/``max_num_batched_tokens`` are the
decode pool's (one decode worker = that layout); ``prefill_tp``/``prefill_ep``/``prefill_dp`` and
``prefill_max_num_batched_tokens`` the prefill pool's (each defaults to the decode pool's value), and
``prefill_max_num_seqs`` the prefill pool's requests per step in each replica (default the engine's
``max_num_seqs``, capped at the prefill pool's token budget: :func:`prefill_seqs`): 1 is a prefill worker that
runs one prompt per step, first come first served, as
aiconfigurator's disaggregated configurations state it ((p)bs = prefill_batch_size 1 in every row of
aiconfigurator-core 0.12.0's silicon_sample.csv that gives the worker counts; TensorRT-LLM's context server
``max_batch_size``, SGLang's ``--max-running-requests`` on the prefill server). Every replica of both pools is simulated (not one
replica scaled, as aggregated serving's ``dp``): the decode pool's arrivals are the prefill pool's output.

KV transfer per request (:func:`kv_transfer`): bytes exact from the KV layout,
:func:`lmcost.cost.kvcache.kv_bytes` of the prompt, all layers of the whole model (per-token bytes x prompt
tokens under full attention; a sliding window caps its layers as the cache does). A TP mismatch between the
pools changes how the total is cut into pieces, not the total. The pieces move in parallel, one per GPU:
each GPU's piece is the prompt's KV on one GPU of its pool (:meth:`lmcost.cost.engine_step.StepModel.kv_space`:
the total / tp for GQA heads split over tp, the whole latent on every rank for MLA), and the transfer takes
the larger of the two pools' pieces as one send/recv (:func:`lmcost.cost.collectives.collective`, NCCL's p2p
model with the cluster's fitted figures) over the link: NVLink when both pools' GPUs fit in one node or
NVLink domain (a GB200 NVL72 rack is one), RDMA between nodes otherwise (``kv_link`` auto), or as named.
``none`` moves it free (a bound). Not modelled: the prefill worker holding the KV until it is sent, the
transfer overlapping the prefill layer by layer (a lower TTFT), and link contention between requests.

A closed loop (``concurrency``) is solved as a fixed point: request c + k arrives at the k-th finish; the
two pools are simulated again with those arrivals until they no longer change (each pass fixes at least one
more generation of requests, so at most n / c + 2 passes).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lmcost.apps.serve import ServeResult, Setup, check_requests, prepare, request_delay, summarize
from lmcost.apps.serve_energy import check_price, energy_keys
from lmcost.apps.serve_inputs import check_request
from lmcost.apps.serve_pd_features import PREFILL_WIDE_EP_OFF, pd_feature_keys, prefill_cache
from lmcost.apps.serve_pd_inputs import PD_FIELDS
from lmcost.apps.serve_sim import Trace, simulate
from lmcost.apps.setup import Say, quiet
from lmcost.basics.errors import LmcostError
from lmcost.cost.energy import Metered

@dataclass(frozen=True)
class Pools:
    """The two pools of a P/D run: their setups (:class:`lmcost.apps.serve.Setup`, one worker each), worker
    counts, and the KV link (name, the send/recv collective or None when free)."""

    prefill: Setup
    decode: Setup
    prefill_workers: int
    decode_workers: int
    link: str
    p2p: object = None

    def replicas(self, pool: Setup, workers: int) -> int:
        """Engine replicas of a pool: workers x each worker's data-parallel replicas."""
        return workers * pool.settings.layout.dp

    @property
    def gpus(self) -> tuple[int, int]:
        """GPUs of the prefill and decode pools."""
        return (self.prefill_workers * self.prefill.settings.layout.gpus,
                self.decode_workers * self.decode.settings.layout.gpus)


def _pool_request(r, tp: int, ep: int, dp: int, **knobs):
    one = tp * dp == 1 and ep == 1
    return replace(r, tp=tp, ep=ep, dp=dp, cluster=None if one else r.cluster, pd=False,
                   **{k: None for k in PD_FIELDS}, **knobs)


def pools(r, say: Say = quiet, max_context: int | None = None) -> Pools:
    """Build both pools' setups from ``r`` (:class:`lmcost.apps.serve.ServeRequest` with ``pd``) and choose the
    link. Raises: LmcostError (kv_link) for NVLink asked of pools that span more than one node, or RDMA on a
    cluster with no network between nodes; the errors of :func:`lmcost.apps.serve.prepare` for either pool."""
    from lmcost.cost.collectives import collective
    from lmcost.operators.parallel import Layout, cluster_for

    dec = prepare(_pool_request(r, r.tp, r.ep, r.dp), say, max_context)
    budget = r.prefill_max_num_batched_tokens or r.max_num_batched_tokens
    try:
        pre = prepare(_pool_request(r, r.prefill_tp or r.tp, r.prefill_ep or r.ep, r.prefill_dp or r.dp,
                                    max_num_seqs=prefill_seqs(r, dec, budget), max_num_batched_tokens=budget,
                                    **PREFILL_WIDE_EP_OFF),
                      quiet, max_context)
    except LmcostError as e:
        raise prefill_error(e, r) from None
    x, y = r.prefill_workers or 1, r.decode_workers or 1
    link = r.kv_link or "auto"
    out = Pools(prefill=pre, decode=dec, prefill_workers=x, decode_workers=y, link=link)
    if link == "none":
        return out
    cluster = cluster_for(Layout(cluster=r.cluster), dec.gpu)
    total = sum(out.gpus)
    one_node = total <= cluster.gpus_per_node
    if link == "auto":
        link = "nvlink" if one_node or cluster.inter is None else "rdma"
        if not one_node and cluster.inter is None:
            raise LmcostError("kv_link", f"the pools' {total} GPUs span more than one {cluster.name} node "
                              f"({cluster.gpus_per_node} GPUs) and it has no network between nodes",
                              "use fewer workers, or a cluster with a network")
    if link == "nvlink" and not one_node:
        raise LmcostError("kv_link", f"nvlink: the pools' {total} GPUs span more than one {cluster.name} node or "
                          f"NVLink domain ({cluster.gpus_per_node} GPUs)", "use rdma, or fewer workers")
    if link == "rdma" and cluster.inter is None:
        raise LmcostError("kv_link", f"rdma: {cluster.name} has no network between nodes",
                          "use nvlink, or a cluster with a network")
    return replace(out, link=link, p2p=collective("send_recv", 2, cluster, 1 if link == "nvlink" else 2))


def prefill_seqs(r, dec: Setup, budget: int | None) -> int | None:
    """The prefill pool's ``max_num_seqs``: ``prefill_max_num_seqs`` when given, else the engine's default on the
    GPU capped at the prefill pool's token budget ``budget`` (``prefill_max_num_batched_tokens``, else
    ``max_num_batched_tokens``, else the engine's): vLLM refuses a budget below ``max_num_seqs``, and a budget
    the user set for both pools should not be refused against a default no flag but
    ``prefill_max_num_seqs`` lowers. None (the engine's default, uncapped) where the cap does not bind, so a
    budget at or above the default changes nothing."""
    if r.prefill_max_num_seqs is not None:
        return r.prefill_max_num_seqs
    e, g = dec.engine, dec.gpu
    default = e.seqs_for(g.memory_bytes, g.name)
    cap = budget or e.tokens_for(g.memory_bytes, g.name)
    return cap if cap < default else None


#: The prefill pool's fields of the request, by the aggregated field each stands for.
_PREFILL_OF = {"tp": "prefill_tp", "ep": "prefill_ep", "dp": "prefill_dp",
               "max_num_batched_tokens": "prefill_max_num_batched_tokens", "max_num_seqs": "prefill_max_num_seqs"}


def prefill_error(e: LmcostError, r) -> LmcostError:
    """``e``, raised building the prefill pool, as the user asked for it: each field of ``e`` (``tp``,
    ``tp/dp``) that the request sets for the prefill pool (``prefill_tp``) named as that field, and the
    message saying it is the prefill pool's (whose ``max_num_seqs`` is the engine's, not ``max_num_seqs``)."""
    mine = {f: p for f, p in _PREFILL_OF.items() if getattr(r, p, None) is not None}
    parts = [mine.get(f, f) for f in e.field.split("/")]
    what, fix = e.what, e.fix
    if "max_num_seqs" not in mine:  # the prefill pool's is the engine's: no flag lowers it but --prefill-max-num-seqs
        what = what.replace("max_num_seqs", "the engine's max_num_seqs", 1)
        fix = fix.replace(" or lower max_num_seqs", " or give `prefill_max_num_seqs`", 1)
    else:
        fix = fix.replace(" or lower max_num_seqs", " or lower `prefill_max_num_seqs`", 1)
    for f, p in mine.items():  # a field the text names in backticks (`ep`), shown as its flag
        what, fix = what.replace(f"`{f}`", f"`{p}`"), fix.replace(f"`{f}`", f"`{p}`")
    return LmcostError("/".join(parts), f"the prefill pool: {what}", fix)


def kv_transfer(p: Pools, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KV moved per request (arrays [n]): total bytes (the prompt's KV, all layers of the whole model, and of a
    speculative drafter's: its KV moves with the target's), the bytes of the largest piece one GPU sends or
    receives, and the seconds it takes (the p2p model's calibrated
    time; its roofline under ``time_model`` roofline; 0 when the link is ``none``). Source of the bytes:
    :func:`lmcost.cost.kvcache.kv_bytes`; of the pieces: each pool's per-GPU KV per token and per sequence
    (:meth:`lmcost.cost.engine_step.StepModel.kv_space`)."""
    from lmcost.cost.kvcache import kv_bytes

    d = p.decode
    prompt = np.asarray(prompt, dtype=np.int64)
    cfgs = [d.cfg] + [m.cfg for m in (getattr(d.step, "draft", None),) if m is not None]  # spec: the drafter's
    total = np.array([sum(float(kv_bytes(c, d.precision, 1, int(t))) for c in cfgs) for t in prompt])
    piece = np.maximum(*(s.kv_per_token_bytes * prompt + s.kv_per_seq_bytes for s in (p.prefill, d)))
    if p.p2p is None:
        return total, piece, np.zeros(len(prompt))
    key = "roofline_s" if d.time_model == "roofline" else "calibrated_s"
    return total, piece, np.asarray(p.p2p.times(piece)[key], dtype=float)


@dataclass
class PdRun:
    """One P/D run: per request (arrays [n]) the arrival, the prefill pool's first token, the transfer time,
    the decode pool's arrival; per pool the replicas' traces (replica k serves requests k::replicas, by
    arrival at that pool: ``decode_order`` lists the requests as the decode pool received them)."""

    arrival: np.ndarray
    prompt: np.ndarray
    prefill_done: np.ndarray
    transfer_s: np.ndarray
    decode_arrival: np.ndarray
    decode_order: np.ndarray
    prefill_traces: list
    decode_traces: list
    passes: int = 1
    work: list = ()  # energy: (GPUs, lmcost.cost.energy.Metered) of every replica of both pools
    caches: list = ()  # prefix caching: each prefill replica's PrefixCache (lmcost.apps.serve_pd_features)


def _pool(p: Pools, setup: Setup, workers: int, arrival, prompt, output, prefilled: bool,
          prefix=None) -> tuple[list, dict]:
    """Simulate every replica of a pool (round robin over the requests given, in order); per request
    (index: position in the arrays) its admission, first token, finish and preemptions. ``prefix``: the
    requests' (prefix ids, prefix tokens), each replica a prefix cache of its own (the prefill pool's)."""
    R = p.replicas(setup, workers)
    n = len(arrival)
    got = {k: np.full(n, np.nan) for k in ("admitted", "first", "finish")}
    got["preempted"] = np.zeros(n, dtype=int)
    traces, got["work"], got["caches"] = [], [], []
    for k in range(min(R, n)):
        sl = slice(k, None, R)
        meter = Metered(setup.step, setup.power)  # energy: the joules of the replica's steps
        got["work"].append((setup.settings.layout.gpus / setup.settings.layout.dp, meter))
        got["caches"].append(prefill_cache(setup, prefix, sl))
        tr = simulate(meter, setup.knobs, arrival[sl], prompt[sl], output[sl],
                      kv_capacity_bytes=setup.kv_capacity_bytes, kv_per_token_bytes=setup.kv_per_token_bytes,
                      kv_per_seq_bytes=setup.kv_per_seq_bytes,
                      prefilled=np.ones(len(prompt[sl]), dtype=bool) if prefilled else None,
                      prefix_cache=got["caches"][-1])
        traces.append(tr)
        got["admitted"][sl], got["first"][sl], got["finish"][sl] = tr.admitted_s, tr.first_token_s, tr.finish_s
        got["preempted"][sl] = tr.preemptions
    return traces, got


def simulate_pd(p: Pools, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                transfer_s: np.ndarray | None = None, prefix=None) -> tuple[PdRun, Trace]:
    """Run requests (``arrival`` s ascending, ``prompt``/``output`` tokens, arrays [n]) through both pools:
    the prefill pool (output 1), the transfer (``transfer_s`` [n], default :func:`kv_transfer`'s), the
    decode pool (arriving prefilled). ``prefix``: the requests' (prefix ids, prefix tokens) arrays [n] for the
    prefill pool's prefix caches (None: no prefixes). Returns the :class:`PdRun` and one :class:`lmcost.apps.serve_sim.Trace`
    of every request for :func:`lmcost.apps.serve.summarize` (first token and finish the decode pool's;
    admission = arrival + both pools' queueing; steps, preemptions and blocked admissions of both pools;
    ITL and KV use the decode pool's; busy the GPU-weighted mean of every replica's)."""
    arrival, prompt, output = (np.asarray(a) for a in (arrival, prompt, output))
    if transfer_s is None:
        transfer_s = kv_transfer(p, prompt)[2]
    pre_tr, pre = _pool(p, p.prefill, p.prefill_workers, arrival, prompt, np.ones_like(output), False, prefix)
    d_arr = pre["first"] + transfer_s
    order = np.argsort(d_arr, kind="stable")
    dec_tr, dec = _pool(p, p.decode, p.decode_workers, d_arr[order], prompt[order], output[order], True)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    first, finish = dec["first"][back], dec["finish"][back]
    wait = pre["admitted"] - arrival + dec["admitted"][back] - d_arr
    segs = [t.itl_segments for t in dec_tr]
    tls = [t.kv_timeline for t in dec_tr]
    tl = np.concatenate(tls) if tls else np.zeros((0, 4))
    g_pre = p.prefill.settings.layout.gpus / p.prefill.settings.layout.dp
    g_dec = p.decode.settings.layout.gpus / p.decode.settings.layout.dp
    weights = [g_pre] * len(pre_tr) + [g_dec] * len(dec_tr)
    busy = sum(w * t.busy_s for w, t in zip(weights, pre_tr + dec_tr)) / sum(weights)
    blocked: dict = {}
    for t in pre_tr + dec_tr:
        for k, v in t.blocked.items():
            blocked[k] = blocked.get(k, 0) + v
    tr = Trace(arrival_s=arrival.astype(float), admitted_s=arrival + wait, first_token_s=first, finish_s=finish,
               prompt=prompt, output=output, preemptions=pre["preempted"] + dec["preempted"][back],
               itl_segments=np.concatenate(segs) if segs else np.zeros((0, 4)),
               kv_timeline=tl[np.argsort(tl[:, 0], kind="stable")], steps=sum(t.steps for t in pre_tr + dec_tr),
               busy_s=busy, blocked=blocked)
    return PdRun(arrival=arrival, prompt=prompt, prefill_done=pre["first"], transfer_s=transfer_s, decode_arrival=d_arr,
                 decode_order=order, prefill_traces=pre_tr, decode_traces=dec_tr, work=pre["work"] + dec["work"],
                 caches=pre["caches"]), tr


def closed_loop(p: Pools, prompt, output, concurrency: int, transfer_s=None, prefix=None) -> tuple[PdRun, Trace]:
    """:func:`simulate_pd` for a closed loop of ``concurrency`` users (the first at 0, request c + k at the
    k-th finish), solved as a fixed point (see the module's docstring). Returns as :func:`simulate_pd`."""
    n = len(prompt)
    arrival = np.zeros(n)
    for k in range(n // max(1, concurrency) + 3):
        run, tr = simulate_pd(p, arrival, prompt, output, transfer_s, prefix)
        nxt = np.zeros(n)
        nxt[concurrency:] = np.sort(tr.finish_s)[:max(0, n - concurrency)]
        if np.array_equal(nxt, arrival):
            break
        arrival = nxt
    run.passes = k + 1
    return run, tr


def pd_summary(p: Pools, run: PdRun, summary: dict) -> dict:
    """The ``pd`` block of a run's JSON: each pool's workers, layout, GPUs, busy fraction (of the run's span,
    mean over its replicas) and steps; the KV transfer (link, bytes per request mean and total, the largest
    piece per GPU, time mean/p50/p90/p99/max); the ratio xPyD and goodput per GPU over both pools."""
    from lmcost.apps.serve import _dist

    total, piece, _ = kv_transfer(p, run.prompt)
    span = summary["span_s"]
    gp, gd = p.gpus

    def pool(s: Setup, workers: int, traces: list, gpus: int) -> dict:
        lay = s.settings.layout
        busy = float(np.mean([t.busy_s for t in traces])) / span if traces and span > 0 else 0.0
        return dict(workers=workers, tp=lay.tp, ep=lay.ep, dp=lay.dp, gpus=gpus, busy_fraction=busy,
                    steps=int(sum(t.steps for t in traces)), max_num_seqs=s.knobs.max_num_seqs,
                    max_num_batched_tokens=s.knobs.max_num_batched_tokens)

    good = summary["goodput"]["requests_per_s"]
    return dict(prefill=pool(p.prefill, p.prefill_workers, run.prefill_traces, gp),
                decode=pool(p.decode, p.decode_workers, run.decode_traces, gd),
                kv_transfer=dict(link=p.link, bytes_per_request=float(total.mean()) if total.size else 0.0,
                                 bytes_total=float(total.sum()), piece_bytes_per_gpu=float(piece.mean()) if piece.size else 0.0,
                                 time_s=_dist(run.transfer_s)),
                ratio=f"{p.prefill_workers}P{p.decode_workers}D", gpus=gp + gd,
                goodput_requests_per_s_per_gpu=good / (gp + gd), closed_loop_passes=run.passes)


def run_pd(r, say: Say = quiet, progress=None) -> ServeResult:
    """``lmcost serve`` with ``pd``: the workload (as :func:`lmcost.apps.serve.run_serve` builds it) through both
    pools, each rate of a sweep a run. Returns :class:`lmcost.apps.serve.ServeResult` (its setup the decode
    pool's; each run's summary over all requests and both pools' GPUs, with its ``pd`` block,
    :func:`pd_summary`). Raises: LmcostError as :func:`check_pd`, :func:`pools`, and run_serve's checks; naming
    ``workload.output`` (or ``workload_file``) where every request's output is one token (nothing to decode)."""
    from lmcost.apps.serve_inputs import workload_args
    from lmcost.apps.serve_prefix import check_use, requests_for
    from lmcost.apps.serve_spec import check_spec

    check_request(r)  # the aggregated request's checks, and check_pd's
    check_spec(r)
    check_price(r.usd_per_gpu_hour)
    if not r.pd:
        raise LmcostError("pd", "run_pd serves two pools: the request does not ask for them", "set `pd`, or call run_serve")
    args = workload_args(r)

    def workload(rate):
        return requests_for(r, args, rate)

    rates = tuple(r.rates) or (r.rate,)
    first = workload(rates[0])
    check_use(r, first.prefix_id)
    if int(first.output.max()) < 2:  # the decode pool would run no step, yet each prompt's KV would move to it
        raise LmcostError("workload_file" if r.workload_file else "workload.output",
                          "every request has one output token: under pd the decode pool has nothing to decode",
                          "give outputs of 2 or more tokens, or serve without pd")
    top = int((first.prompt + first.output).max())
    p = pools(r, say, max_context=top)
    check_use(r, first.prefix_id, p.prefill)  # prefix caching is the prefill pool's (serve_pd_features)
    field = "workload_file" if r.workload_file else "workload.prompt"
    check_requests(p.prefill, first.prompt, np.ones_like(first.output), field)
    d = p.decode  # the decode pool prefills nothing (but a preempted request's recompute): its KV checks alone
    check_requests(replace(d, knobs=replace(d.knobs, chunked_prefill=True)), first.prompt, first.output, field)
    from lmcost.operators.workload import past_trained_context

    note = past_trained_context(d.cfg, top)  # as run_serve says it: the decode pool holds the whole context
    if note:
        say(note)
    wl = ({"file": str(r.workload_file)} if r.workload_file else
          {k: v for k, v in args.items() if k != "n"} | {"requests": len(first.prompt)})
    if r.prefix is not None:
        wl["prefix"] = r.prefix
    res = ServeResult(setup=d, sweep=bool(r.rates), workload=wl, gpus=sum(p.gpus))
    for k, rate in enumerate(rates):
        reqs = first if k == 0 else workload(rate)
        prefix = None if reqs.prefix_id is None else (reqs.prefix_id, reqs.prefix_tokens)
        if reqs.concurrency is not None:
            run, tr = closed_loop(p, reqs.prompt, reqs.output, reqs.concurrency, prefix=prefix)
        else:
            run, tr = simulate_pd(p, reqs.arrival_s, reqs.prompt, reqs.output, prefix=prefix)
        offered = rate if (rate is not None and reqs.concurrency is None and not r.workload_file) else None
        summary = summarize(tr, dp=1, gpus=sum(p.gpus), slo_ttft_s=r.slo_ttft_s, slo_tpot_s=r.slo_tpot_s,
                            offered_rate=offered, delay_s=request_delay(p.prefill, reqs.prompt))
        if reqs.concurrency is not None:
            summary["concurrency"] = reqs.concurrency
        summary["pd"] = pd_summary(p, run, summary)
        summary.update(pd_feature_keys(p, run, tr, reqs.prefix_id is not None))  # prefix, spec, wide EP
        summary.update(energy_keys(d, run.work, tr, summary))
        res.runs.append(summary)
        res.trace = tr
        if progress is not None:
            progress(len(reqs.prompt), len(reqs.prompt))
    return res
