"""Speed of the serving simulation (issue 27, ``lmcost.apps.serve_sim.simulate``): Llama-3-8B on an H100 under
the calibrated model, vLLM-like knobs (1,024 sequences, 8,192 tokens a step, chunked prefill, mixed steps),
requests of 1,000 prompt + 200 output tokens, Poisson at 10 requests/s (below the knee, ~22/s) and a closed
loop of 64 users; against a naive reference written here (one Python iteration per engine step, every
decoding sequence's context advanced one by one, no closed-form runs, the same step model). Goals: 10,000
requests under 1 s, 1,000,000 under 60 s, memory linear in the requests.

Prints: the StepModel build (median of rounds); each workload at 10,000 requests, the simulation and the
naive loop interleaved round by round (a busy spell slows both alike), medians and their ratio; both at
1,000,000 requests, one run each in a fresh process, with the peak RSS growth per request of the run (and at
100,000, to show it linear); and the TTFT/TPOT percentiles of both on 2,000 requests (equal to ~1e-6).

Run: .venv/bin/python benchmarks/bench_serve.py [rounds]; ``--features [rounds]``: issue 28's features' cost
(:func:`features`), e.g. against the checkout before them: reports/serve-speed.md.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from collections import deque

import numpy as np

N_SMALL, N_CHECK = 10_000, 2_000
RATE, USERS, ISL, OSL = 10.0, 64, 1000, 200


def setup():
    """(step model, knobs, KV capacity bytes, KV bytes per token), as ``lmcost serve`` builds them for vLLM's
    0.9 of the GPU's memory."""
    from lmcost.apps.serve_sim import Knobs
    from lmcost.apps.setup import resolve_precision
    from lmcost.cost.engine_step import StepModel
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings

    gpu, cfg = load_gpu("h100"), load_config("llama-3-8b")
    step = StepModel(cfg, gpu, resolve_precision("bf16"), Settings(logits="last", model="calibrated"),
                     max_tokens=8192, max_seqs=1024, max_context=ISL + OSL)
    kv = step.kv_space(8192)
    cap = 0.9 * gpu.memory_bytes - kv.weights_bytes - kv.activation_bytes
    return step, Knobs(max_num_seqs=1024, max_num_batched_tokens=8192), cap, kv.per_token_bytes


def workload(kind: str, n: int):
    """(arrival s, prompt, output, concurrency) of ``n`` requests: Poisson at RATE (seed 0) or a closed loop."""
    prompt, output = np.full(n, ISL), np.full(n, OSL)
    if kind == "poisson":
        return np.cumsum(np.random.default_rng(0).exponential(1 / RATE, n)), prompt, output, None
    return np.zeros(n), prompt, output, USERS


def fast(step, knobs, cap, tok, kind, n):
    from lmcost.apps.serve_sim import simulate

    arr, p, o, conc = workload(kind, n)
    tr = simulate(step, knobs, arr, p, o, kv_capacity_bytes=cap, kv_per_token_bytes=tok, concurrency=conc)
    assert tr.preemptions.sum() == 0  # the naive loop does not preempt: a cache that never runs short
    return tr.first_token_s - tr.arrival_s, (tr.finish_s - tr.first_token_s) / (o - 1)


def naive(step, knobs, cap, tok, kind, n):
    """The reference: vLLM v1's step as serve_sim schedules it (running requests first, then FCFS admission
    while the budget, max_num_seqs and the KV cache allow; a chunk's KV counted as it is computed, a decode's
    at its context), one step per iteration, each decode's context kept and advanced by itself. No
    preemption (the benchmark's cache holds every request). Returns (TTFT, TPOT) arrays."""
    arr, prompt, output, conc = workload(kind, n)
    arr, P, O = [float(a) for a in arr], [int(v) for v in prompt], [int(v) for v in output]
    pad = knobs.block_size - 1
    first, fin = [math.nan] * n, [math.nan] * n
    gen = [0] * n
    ctx: dict = {}                  # decoding request -> context of its next step
    prefilling: list = []           # [i, tokens done], admission order
    waiting: deque = deque()
    nxt = min(n, conc) if conc else 0
    waiting.extend(range(nxt))
    t, done = 0.0, 0

    def finish(i):
        nonlocal done, nxt
        fin[i] = t
        done += 1
        if conc and nxt < n:
            arr[nxt] = t
            waiting.append(nxt)
            nxt += 1

    while done < n:
        if not conc:
            while nxt < n and arr[nxt] <= t:
                waiting.append(nxt)
                nxt += 1
        if not ctx and not prefilling and not waiting:
            t = max(t, arr[nxt])
            continue
        used = tok * (sum(c + pad for c in ctx.values()) + sum(g + pad for _, g in prefilling))
        budget = knobs.max_num_batched_tokens - len(ctx)
        chunks = []
        for e in prefilling:
            if budget <= 0:
                break
            c = min(P[e[0]] - e[1], budget)
            chunks.append((e, c))
            budget -= c
        while waiting and budget > 0 and len(ctx) + len(prefilling) < knobs.max_num_seqs:
            i = waiting[0]
            if used + tok * (P[i] + pad) > cap:
                break
            waiting.popleft()
            e = [i, 0]
            prefilling.append(e)
            used += tok * pad
            c = min(P[i], budget)
            chunks.append((e, c))
            budget -= c
        nd = len(ctx)
        mean = sum(ctx.values()) / nd if nd else 0.0
        ends = sum(1 for e, c in chunks if e[1] + c == P[e[0]])
        t += (knobs.step_overhead_s + knobs.seq_overhead_s * (nd + len(chunks))
              + step.step_s(nd, mean, [(e[1], c) for e, c in chunks], nd + ends))
        for e, c in chunks:
            e[1] += c
        for i in sorted(ctx):       # one token each
            ctx[i] += 1
            gen[i] += 1
            if gen[i] >= O[i]:
                del ctx[i]
                finish(i)
        still = []
        for e in prefilling:
            i = e[0]
            if e[1] < P[i]:
                still.append(e)
                continue
            gen[i], first[i] = 1, t
            if O[i] <= 1:
                finish(i)
            else:
                ctx[i] = P[i] + 1
        prefilling[:] = still
    ttft = np.array(first) - np.array(arr)
    return ttft, (np.array(fin) - np.array(first)) / (np.array(O) - 1)


def big(n: int) -> None:
    """In a fresh process: one simulation of ``n`` requests per workload; print seconds and the peak RSS
    growth (Linux: VmHWM reset through /proc/self/clear_refs) per request."""
    step, knobs, cap, tok = setup()
    for kind in ("poisson", "closed"):
        workload(kind, n)  # the inputs' arrays, then the peak reset: what simulate and its trace add
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        rss0 = _hwm()
        t0 = time.perf_counter()
        fast(step, knobs, cap, tok, kind, n)
        el = time.perf_counter() - t0
        print(f"{kind} {n} {el:.3f} {(_hwm() - rss0) / n:.0f}")


def _hwm() -> int:
    """Peak resident set of this process (bytes)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def main(rounds: int = 3) -> None:
    builds = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        step, knobs, cap, tok = setup()
        builds.append(time.perf_counter() - t0)
    print(f"StepModel build (llama-3-8b, h100, calibrated; 8,192 tokens, 1,024 sequences, {ISL + OSL} positions), "
          f"median of {rounds}: {statistics.median(builds):.3f} s")
    for kind in ("poisson", "closed"):
        label = f"Poisson {RATE:g}/s" if kind == "poisson" else f"closed loop of {USERS}"
        a, b = fast(step, knobs, cap, tok, kind, N_CHECK), naive(step, knobs, cap, tok, kind, N_CHECK)
        worst = 0.0
        for x, y in zip(a, b):
            px, py = np.percentile(x, (50, 90, 99)), np.percentile(y, (50, 90, 99))
            worst = max(worst, float(np.max(np.abs(px / py - 1))))
        print(f"{label}, {N_CHECK:,} requests: TTFT p50/p90/p99 {', '.join(f'{v * 1e3:.3f}' for v in np.percentile(a[0], (50, 90, 99)))} ms, "
              f"TPOT {', '.join(f'{v * 1e3:.3f}' for v in np.percentile(a[1], (50, 90, 99)))} ms; "
              f"largest relative difference to the naive loop {worst:.1e}")
        times: dict = {"simulate": [], "naive": []}
        for _ in range(rounds):
            for name, fn in (("simulate", fast), ("naive", naive)):
                t0 = time.perf_counter()
                fn(step, knobs, cap, tok, kind, N_SMALL)
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{label}, {N_SMALL:,} requests, median of {rounds}: simulate {med['simulate']:.3f} s, naive loop "
              f"{med['naive']:.3f} s ({med['naive'] / med['simulate']:.1f}x faster; goal < 1 s)")
    for n in (100_000, 1_000_000):
        out = subprocess.run([sys.executable, __file__, "--big", str(n)], capture_output=True, text=True, check=True)
        for line in out.stdout.split("\n"):
            if line:
                kind, _, sec, per = line.split()
                label = f"Poisson {RATE:g}/s" if kind == "poisson" else f"closed loop of {USERS}"
                print(f"{label}, {n:,} requests: simulate {float(sec):.2f} s, peak RSS growth {per} B per request"
                      + ("; goal < 60 s" if n == 1_000_000 else ""))


def features(rounds: int = 5) -> None:
    """Issue 28: the simulation of N_SMALL requests at Poisson RATE (and the closed loop, for the first two) as
    ``lmcost serve`` runs it now, each feature's cost against the plain simulation, round by round
    interleaved, medians: ``plain`` (the bare StepModel, as above), ``metered`` (:class:`lmcost.cost.energy.Metered`
    around it: every ``lmcost serve`` run, energy being always on), ``prefix`` (metered, a PrefixCache: 16
    sessions whose requests share the first 768 of their 1,000 prompt tokens), ``spec`` (metered, ngram
    drafting of k = 3 at a mean acceptance of 2.2 tokens a step: a setting, no measured figure) and ``pd``
    (metered, the decode pool of P/D: every request arrives prefilled). On a checkout without the meter (before
    issue 28, e.g. cc61557) only ``plain`` runs: run both checkouts alternately for the before/after table."""
    from lmcost.apps.serve_sim import simulate

    step, knobs, cap, tok = setup()
    try:
        from lmcost.apps.serve_prefix import PrefixCache
        from lmcost.cost.energy import Metered, serve_power
        from lmcost.cost.spec_decode import SpecStepModel
    except ImportError:
        Metered = None
    for kind in ("poisson", "closed"):
        arr, p, o, conc = workload(kind, N_SMALL)
        cases = {"plain": lambda: dict(step=step)}
        if Metered is not None:
            power = serve_power(step.gpu)
            ids = [i % 16 for i in range(N_SMALL)]
            cases["metered"] = lambda: dict(step=Metered(step, power))
            if kind == "poisson":
                cases["prefix"] = lambda: dict(step=Metered(step, power), prefix_cache=PrefixCache(
                    ids, [768] * N_SMALL, knobs.block_size, tok))
                cases["spec"] = lambda: dict(step=Metered(SpecStepModel(step, "ngram", 3, 2.2), power))
                cases["pd"] = lambda: dict(step=Metered(step, power), prefilled=np.ones(N_SMALL, dtype=bool))
        times: dict = {k: [] for k in cases}
        for _ in range(rounds):
            for name, make in cases.items():
                kw = make()
                t0 = time.perf_counter()
                simulate(kw.pop("step"), knobs, arr, p, o, kv_capacity_bytes=cap, kv_per_token_bytes=tok,
                         concurrency=conc, **kw)
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{kind}, {N_SMALL:,} requests, median of {rounds}: " + ", ".join(
            f"{k} {v:.3f} s ({v / med['plain']:.2f}x)" for k, v in med.items()), flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--big":
        big(int(sys.argv[2]))
    elif len(sys.argv) > 1 and sys.argv[1] == "--features":
        features(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
