"""``lmcost serve-plan --pd``: the serving planner over prefill/decode (P/D) pools (issue 28: "the planner
searches pool sizes and layouts (xPyD)"). The runs are ``lmcost serve --pd``'s (:mod:`lmcost.apps.serve_pd`);
the search, the bisection on the rate, the waves and the pools of jobs are :mod:`lmcost.apps.serve_plan`'s.

Candidates: every split of the ``gpus`` budget into a prefill pool of P GPUs and a decode pool of D = gpus - P
(P, D >= 1, every GPU used, as the aggregated planner's layouts use exactly ``gpus``); in a pool of g GPUs,
x workers of one layout of g / x GPUs (:func:`lmcost.apps.plan.layouts`: TP within a node, for a MoE EP
inside TP or over attention-DP; no pipeline stages, and no data-parallel replicas of a dense model inside a
worker, which are x more workers); ``pd_ratios`` keeps only the xPyD named; x the knobs searched
(``max_num_seqs`` the decode pool's, ``max_num_batched_tokens`` both pools', as ``lmcost serve --pd`` sets
them: the prefill pool's ``max_num_seqs`` is the engine's capped at the budget,
:func:`lmcost.apps.serve_pd.prefill_seqs`, so its check command reruns it as searched). A layout whose weights leave no KV cache, or a request it cannot hold, is that candidate's row,
"cannot run". Every candidate is ranked by goodput per GPU over all x + y workers' GPUs; TTFT is the prefill
pool's first token + the KV transfer + the decode pool's wait, TPOT the decode pool's (:func:`run_pd`'s).

The static bound (:func:`pd_bound`, requests/s), for the bisection's upper bracket and pruning. Over a run of
N requests whose span (first arrival to last finish) is S, each engine replica is busy at most S, and each
step of the simulation takes at least ``o + tokens(n)`` seconds for its n scheduled tokens (``o``: the
engine's overhead per step; ``tokens``: the step model's context-free operators,
:class:`lmcost.cost.engine_step.StepModel`; the lm_head, the attention and the per-sequence overheads are
>= 0 and dropped):

- prefill pool (R_p = x x dp_p replicas, steps of n <= T = the token budget tokens, every prompt token
  prefilled once): S >= sum(prompt) / R_p x min_{n<=T} (o + tokens(n)) / n, so
  N / S <= R_p / (mean(prompt) x min_{n<=T} (o + tokens(n)) / n);
- decode pool (R_d = y x dp_d replicas, steps of n <= B decodes, B = the lesser of ``max_num_seqs`` and the
  sequences whose KV at the shortest prompt fits the cache; every output token after the first decoded,
  each step taking at least ``o + o_seq n + step_s(n, min(prompt))``, the decode attention growing with
  the context): N / S <= R_d / (mean(output - 1) x min_{n<=B} (o + o_seq n + step_s(n, c_min)) / n).

The bound is the lesser of the two. Each minimum is exact for the tabulated step model: the tables are
linear between their nodes, where (a + b n) / n is monotone, so the minimum is at a node (every integer up
to the dense limit, the geometric nodes past it, and the end). It holds whatever the round robin deals
each replica (the busiest replica holds at least the mean share), and it bounds throughput, hence goodput.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from functools import lru_cache

import numpy as np

from lmcost.apps.serve import check_requests, request_delay, summarize
from lmcost.apps.serve_pd import pd_summary, pools, simulate_pd
from lmcost.apps.serve_pd_inputs import KV_LINKS
from lmcost.apps.serve_plan import (ServePlan, ServePlanRequest, _row, _search_task, _serve_request, _Task, _workload,
                                    check_command, check_fixed, plan_tasks, search_candidates, verdict)
from lmcost.apps.setup import quiet
from lmcost.basics.errors import LmcostError
from lmcost.output.serve_plan import pool_label

#: An xPyD ratio as ``pd_ratios`` names it: x prefill workers, y decode workers.
RATIO = re.compile(r"([1-9][0-9]{0,3})P([1-9][0-9]{0,3})D")


def parse_ratios(ratios) -> tuple[tuple[int, int], ...]:
    """``pd_ratios`` (strings like ``1P2D``) as (x, y) pairs. Raises: LmcostError (``pd_ratios``) for one that is
    not xPyD (x, y whole numbers 1-9,999), or one given twice."""
    out = []
    for v in ratios:
        m = RATIO.fullmatch(str(v).strip().upper())
        if m is None:
            raise LmcostError("pd_ratios", f"{v!r:.40} is not xPyD", "write x prefill and y decode workers, e.g. 1P2D")
        pair = (int(m[1]), int(m[2]))
        if pair in out:
            raise LmcostError("pd_ratios", f"{pair[0]}P{pair[1]}D given twice", "give each ratio once")
        out.append(pair)
    return tuple(out)


def pool_layouts(cfg, gpus: int, per_node: int, cluster: str | None) -> list:
    """(workers, layout of one worker) that fill a pool of ``gpus`` GPUs: for each worker size w dividing
    ``gpus``, the layouts of w GPUs that split ``cfg`` (:func:`lmcost.apps.plan.layouts`) without pipeline
    stages, and with data-parallel replicas only beside expert parallelism (a dense model's DPk worker is
    k workers)."""
    from lmcost.apps.plan import divisors, layouts

    out = []
    for w in divisors(gpus):
        found, _ = layouts(cfg, w, per_node, cluster)
        out += [(gpus // w, lay) for lay in found if lay.pp == 1 and (lay.dp == 1 or lay.ep > 1)]
    return out


def pd_candidates(req: ServePlanRequest) -> tuple:
    """Check ``req`` (P/D) and list its candidates. Returns (GPU, [((x, prefill layout), (y, decode layout),
    max_num_seqs, max_num_batched_tokens)]). Raises: LmcostError as :func:`lmcost.apps.serve_plan.check_fixed`
    (model, GPU, engine, precision, workload); ``gpus`` below 2 (a pool each) or above 65,536; ``kv_link`` unknown;
    ``pd_ratios`` (:func:`parse_ratios`; none of them fills ``gpus`` GPUs with a layout that splits the model);
    ``imbalance`` other than 1 where no candidate has expert parallelism; ``cluster`` unknown."""
    from lmcost.apps.plan import _per_node
    from lmcost.apps.setup import checked_layout

    from lmcost.operators.workload import check_count

    check_count("gpus", req.gpus, 65536)  # as check_plan_request, which check_fixed skips (it is given one GPU)
    if req.gpus < 2 or isinstance(req.gpus, bool):
        raise LmcostError("gpus", f"{req.gpus!r:.20} GPUs cannot hold a prefill pool and a decode pool",
                          "give 2 or more (each pool has a GPU at least)")
    if req.kv_link is not None and req.kv_link not in KV_LINKS:
        raise LmcostError("kv_link", f"unknown link {req.kv_link!r:.40}", f"use one of {', '.join(KV_LINKS)}")
    ratios = parse_ratios(req.pd_ratios)
    cfg, hw, _ = check_fixed(replace(req, gpus=1, cluster=None, imbalance=1.0, pd=False, pd_ratios=(), kv_link=None))
    per_node = _per_node(hw, req.gpus, req.cluster)
    pairs = []
    for p in range(1, req.gpus):
        for x, lp in pool_layouts(cfg, p, per_node, req.cluster):
            for y, ld in pool_layouts(cfg, req.gpus - p, per_node, req.cluster):
                if not ratios or (x, y) in ratios:
                    pairs.append(((x, lp), (y, ld)))
    if not pairs:
        raise LmcostError("pd_ratios", f"no layout of {cfg.name} fills {req.gpus} GPUs as "
                          f"{', '.join(f'{x}P{y}D' for x, y in ratios)}", "name other ratios, or another `gpus`")
    if req.imbalance != 1.0:
        ep = [lay for pair in pairs for _, lay in pair if lay.ep > 1]
        if not ep:
            raise LmcostError("imbalance", f"applies to expert parallelism, and no pool of {cfg.name} on {req.gpus} "
                              "GPUs has it", "drop it")
        checked_layout(hw, tp=ep[0].tp, ep=ep[0].ep, dp=ep[0].dp, imbalance=req.imbalance, cluster=req.cluster)
    return hw, [(pre, dec, s, t) for pre, dec in pairs for s in req.max_num_seqs for t in req.max_num_batched_tokens]


def _pd_request(req: ServePlanRequest, pre: tuple, dec: tuple, seqs: int, tokens: int):
    """The ``lmcost serve --pd`` request of one candidate (its rate set per run)."""
    (x, lp), (y, ld) = pre, dec
    sr = _serve_request(req, ld, seqs, tokens)
    return replace(sr, imbalance=req.imbalance if max(lp.ep, ld.ep) > 1 else 1.0, pd=True, prefill_workers=x,
                   prefill_tp=lp.tp, prefill_ep=lp.ep, prefill_dp=lp.dp, decode_workers=y, kv_link=req.kv_link)


@lru_cache(maxsize=16)
def _pools(sr, top: int):
    """:func:`lmcost.apps.serve_pd.pools`, kept for the bisection after the bound (in this process)."""
    return pools(sr, quiet, max_context=top)


def _min_per_item(cost, top: int, nodes) -> float:
    """min over whole n in 1..``top`` of cost(n) / n, at the tables' ``nodes`` (see the module docstring)."""
    pts = set(range(1, min(top, 4096) + 1)) | {int(v) for v in nodes if 1 <= v <= top} | {top}
    return min(cost(n) / n for n in sorted(pts))


def pd_bound(p, prompt: np.ndarray, output: np.ndarray) -> float:
    """The most requests/s pools ``p`` (:class:`lmcost.apps.serve_pd.Pools`) could serve of requests of
    ``prompt``/``output`` tokens (arrays [n]): the lesser of the prefill pool's and the decode pool's bounds
    (the module docstring's derivation). Units: requests/s; inf for a workload with no token to move."""
    pre, dec = p.prefill, p.decode
    prompt, output = np.asarray(prompt, dtype=float), np.asarray(output, dtype=float)
    bound = np.inf
    T, o = pre.knobs.max_num_batched_tokens, pre.knobs.step_overhead_s
    per = _min_per_item(lambda n: o + pre.step.tokens(n), T, pre.step.tokens.xs)
    if per > 0 and prompt.mean() > 0:
        bound = p.replicas(pre, p.prefill_workers) / (per * prompt.mean())
    decodes = float(np.mean(output - 1))
    if decodes > 0:
        c = int(prompt.min())
        need = dec.kv_per_token_bytes * c + dec.kv_per_seq_bytes
        b = dec.knobs.max_num_seqs if need <= 0 else max(1, min(dec.knobs.max_num_seqs,
                                                                int(dec.kv_capacity_bytes // need)))
        k = dec.knobs
        step = dec.step
        nodes = [*step.tokens.xs, *step.head.xs, *getattr(step, "_n", ())]
        per = _min_per_item(lambda n: k.step_overhead_s + k.seq_overhead_s * n + step.step_s(n, c), b, nodes)
        if per > 0:
            bound = min(bound, p.replicas(dec, p.decode_workers) / (per * decodes))
    return float(bound)


def _pd_bound_task(t: _Task) -> tuple:
    """(static bound in requests/s, None) or (None, why the candidate cannot run), as run_pd checks it."""
    try:
        p = _pools(t.sr, t.top)
        reqs = _workload(t.sr, 1.0)
        check_requests(p.prefill, reqs.prompt, np.ones_like(reqs.output))
        d = p.decode  # as run_pd: the decode pool's KV checks alone
        check_requests(replace(d, knobs=replace(d.knobs, chunked_prefill=True)), reqs.prompt, reqs.output)
        return pd_bound(p, reqs.prompt, reqs.output), None
    except LmcostError as e:
        return None, str(e)


def pd_run(p, sr, rate: float) -> dict:
    """The summary ``lmcost serve --pd`` prints of ``sr`` at ``rate`` (:func:`lmcost.apps.serve_pd.run_pd`'s
    run of generated arrivals: both pools simulated, summarized over their GPUs, with its ``pd`` block)."""
    reqs = _workload(sr, rate)
    run, tr = simulate_pd(p, reqs.arrival_s, reqs.prompt, reqs.output)
    summary = summarize(tr, dp=1, gpus=sum(p.gpus), slo_ttft_s=sr.slo_ttft_s, slo_tpot_s=sr.slo_tpot_s,
                        offered_rate=rate, delay_s=request_delay(p.prefill, reqs.prompt))
    summary["pd"] = pd_summary(p, run, summary)
    return summary


def _pd_search_task(t: _Task, on_run=None) -> dict:
    """:func:`lmcost.apps.serve_plan._search_task`'s bisection over :func:`pd_run`'s runs."""
    p = _pools(t.sr, t.top)
    return _search_task(t, on_run, judge=lambda rate: verdict(t, pd_run(p, t.sr, rate)))


def pd_check_command(r: ServePlanRequest, row: dict) -> tuple[str, ...]:
    """The ``lmcost serve --pd`` arguments that run a P/D ``row`` alone: the decode worker's layout and the knobs
    as :func:`lmcost.apps.serve_plan.check_command` gives a row's, then the pools (``row["pd"]``)."""
    pd = row["pd"]
    pre = pd["prefill"]
    argv = check_command(r, {k: v for k, v in row.items() if k != "pd"})
    argv += ("--pd", "--prefill-workers", str(pre["workers"]), "--prefill-tp", str(pre["tp"]), "--prefill-ep",
             str(pre["ep"]), "--prefill-dp", str(pre["dp"]), "--decode-workers", str(pd["decode"]["workers"]))
    if r.kv_link is not None:
        argv += ("--kv-link", r.kv_link)
    if r.imbalance != 1.0 and pre["ep"] > 1 and pd["decode"]["ep"] == 1:  # (the decode pool's ep gives it else)
        argv += ("--ep-imbalance", str(r.imbalance))
    return argv


def plan_pd(req: ServePlanRequest, progress=None, pool=None) -> ServePlan:
    """:func:`lmcost.apps.serve_plan.plan_serving` over P/D pools (the module docstring): every candidate's
    highest offered rate meeting the SLOs, ranked by goodput per GPU over both pools. Rows as the aggregated
    planner's (``layout``: ``xPyD: prefill | decode``; ``tp``/``ep``/``dp`` the decode worker's), each with
    ``pd`` (``ratio``, ``gpus``, ``kv_link``, and ``prefill``/``decode``: workers, tp, ep, dp, GPUs), and a
    row that met the SLOs with ``check_command`` (the ``lmcost serve --pd`` that reruns it).
    Raises: LmcostError as :func:`pd_candidates`, each candidate's :func:`lmcost.apps.serve_inputs.check_request`,
    a workload with no decode, and the pool's."""
    hw, cands = pd_candidates(req)
    srs = [_pd_request(req, *c) for c in cands]
    tasks, plan = plan_tasks(req, srs)

    def row(i, status, **kw):
        (x, lp), (y, ld), s, t = cands[i]
        out = _row(hw.name, ld, s, t, status, gpus=req.gpus, **kw)
        found = kw.get("found")
        link = found["summary"]["pd"]["kv_transfer"]["link"] if found else req.kv_link or "auto"
        pd = dict(ratio=f"{x}P{y}D", gpus=req.gpus, kv_link=link,
                  prefill=dict(workers=x, tp=lp.tp, ep=lp.ep, dp=lp.dp, gpus=x * lp.gpus),
                  decode=dict(workers=y, tp=ld.tp, ep=ld.ep, dp=ld.dp, gpus=y * ld.gpus))
        out.update(layout=f"{x}P{y}D: {pool_label(pd['prefill'])} | {pool_label(pd['decode'])}", pd=pd)
        return out

    search_candidates(plan, tasks, row, progress, pool, bound_task=_pd_bound_task, search_task=_pd_search_task,
                      gpus=[req.gpus] * len(tasks))
    for r in plan.rows:
        if r["status"] == "ok":
            r["check_command"] = "lmcost " + shlex.join(pd_check_command(req, r))
    return plan
