"""The step-level simulation of one serving engine replica: continuous batching with a token budget per
step, chunked prefill, a paged KV cache with on-demand or reserved admission and preemption by recompute,
run over a list of requests, fast.

The scheduler follows vLLM v1's (``vllm/v1/core/sched/scheduler.py``): each step first schedules every
running request (a decode takes 1 token; a partly prefilled prompt takes what is left of the budget),
then admits waiting requests in arrival order (FCFS) while the budget, ``max_num_seqs`` and the KV cache
allow; when a decode cannot get a KV block, the most recently admitted request is preempted and its KV
freed, to be recomputed (prompt + the tokens it had generated) when it is admitted again. An engine that
does not mix prefill and decode in one step (SGLang's default, ``enable_mixed_chunk`` False) runs a
prefill step whenever a prefill can be scheduled, the decodes waiting. TensorRT-LLM's
``GUARANTEED_NO_EVICT`` admits a request only if its whole prompt + output fits (``reserve_full``).

Speed: all decoding sequences advance together in every step, so they are held as aggregates (a step
counter D; each sequence's context is c0 + D - D0, their sum S0 + n*D; a heap of the counters at which
each finishes). A run of steps in which nothing can change but the contexts (no prefill to schedule, no
admission possible before the next arrival, no finish, the KV cache not full) is advanced in closed form:
its steps' times are affine in the step (the step time's context terms are linear in the context between
the tables' nodes), summed as an arithmetic series. A request costs O(log n) work; a simulation of
10,000 requests takes well under a second (benchmarks/bench_serve.py).

Speculative decoding (a step model with ``tokens_per_step`` a and ``decode_rows`` k + 1:
:mod:`lmcost.cost.spec_decode`): each decode step advances every decoding sequence by a tokens (a float), so
its context is c0 + a (D - D0), a request finishes ceil(remaining / a) steps after it enters, and a run of
steps stays affine in the step (the context grows by a per step); a decode takes k + 1 tokens of the budget
and KV slots in its step. a = 1, k = 0: the plain simulation, number for number.

KV accounting, in bytes of one GPU: a running sequence holds (tokens + block - 1) * per-token bytes (its
last block counted whole, an upper bound by less than a block) plus its constant state.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

#: States of a request.
_WAIT, _PRE, _DEC, _DONE = 0, 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """The scheduler settings the simulation reads (from an engine profile, :mod:`lmcost.hardware.engines`)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool = True
    mixed_batches: bool = True
    admission: str = "on_demand"       #: on_demand | reserve_full
    preemption: str = "recompute"      #: recompute | swap | none (swap is costed as recompute)
    block_size: int = 16
    step_overhead_s: float = 0.0       #: CPU time per step (scheduling, launch) on the critical path
    seq_overhead_s: float = 0.0        #: CPU time per scheduled sequence per step
    reserve_ratio: float = 0.0         #: share of running requests' remaining outputs kept free at admission


@dataclass(frozen=True, kw_only=True)
class Trace:
    """What a simulation measured: per request (arrays [n], seconds from the first arrival) and per step."""

    arrival_s: np.ndarray
    admitted_s: np.ndarray     #: first admission (prefill scheduled)
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    preemptions: np.ndarray    #: times each request was preempted
    #: inter-token gaps as segments: first and last gap of a run of k steps, k, sequences decoding
    itl_segments: np.ndarray   #: [segments, 4]
    #: KV cache in use over time: (time s, fraction of capacity, requests waiting, requests running)
    kv_timeline: np.ndarray    #: [samples, 4]
    steps: int                 #: engine steps simulated
    busy_s: float              #: time steps ran (the rest the engine was idle)
    blocked: dict = field(default_factory=dict)  #: steps in which admission was refused, by reason
    # prefix caching
    prefix_cache: object = None  #: the :class:`lmcost.apps.serve_prefix.PrefixCache` of the run (None: off)


class _Kv:
    """Bytes of the KV cache in use, against its capacity."""

    def __init__(self, capacity: float, per_token: float, per_seq: float, block: int):
        self.cap, self.tok, self.seq, self.pad = capacity, per_token, per_seq, block - 1

    def need(self, tokens: int) -> float:
        """Bytes a new sequence of ``tokens`` takes."""
        return self.tok * (tokens + self.pad) + self.seq


def simulate(step, knobs: Knobs, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray, *,
             kv_capacity_bytes: float, kv_per_token_bytes: float, kv_per_seq_bytes: float = 0.0,
             concurrency: int | None = None, progress=None, prefilled: np.ndarray | None = None,
             prefix_cache=None) -> Trace:
    """Run requests (``arrival`` seconds ascending, ``prompt`` and ``output`` tokens, arrays [n]) through one
    engine replica whose step time is ``step.step_s`` (:class:`lmcost.cost.engine_step.StepModel`).

    ``concurrency``: a closed loop of that many users (arrivals ignored: a request enters when one
    finishes, the first ``concurrency`` at 0). ``progress(done, n)``: called now and then.
    ``prefilled`` (bool [n], P/D disaggregation: :mod:`lmcost.apps.serve_pd`): requests that arrive with their
    prompt's KV and first token (from a prefill worker): admitted as any (the KV admission checks apply), each
    enters decode at once (no prefill chunk; its first token here is its admission) and takes one token of the
    step's budget; one preempted recomputes its prompt here like any other.
    ``prefix_cache``: a :class:`lmcost.apps.serve_prefix.PrefixCache` over these requests (None: no prefix
    caching): a request prefills only what it does not find cached, and the cache's referenced blocks are
    counted once in the KV bytes (its unreferenced ones evicted as the running requests need room).
    Every request must fit the KV cache alone and have a prompt within the token budget when prefill is not
    chunked (the caller checks, :func:`lmcost.apps.serve.check_requests`).
    Returns: :class:`Trace`.
    """
    n = len(prompt)
    P = [int(v) for v in prompt]
    O = [int(v) for v in output]
    arr = [float(v) for v in arrival] if concurrency is None else [0.0] * n
    admitted = [math.nan] * n
    first = [math.nan] * n
    fin = [math.nan] * n
    pre_n = [0] * n
    need_pre = P[:]                  # tokens to prefill on admission (prompt, + generated after a recompute)
    gen = [0] * n                    # tokens generated so far
    state = [_WAIT] * n
    ready = [False] * n if prefilled is None else [bool(v) for v in prefilled]  # P/D: KV arrived with it
    c0 = [0] * n                     # decode: context at counter D0
    d0 = [0] * n
    epoch = [0] * n
    fin_d = [0] * n                  # decode: the counter at which it finishes
    F = 0                            # their sum over decoding sequences (remaining outputs: F - n_dec * D)
    pcache = prefix_cache
    hit = [0] * n                    # prefix: tokens of this admission found cached (not prefilled)
    shared = [0] * n                 # prefix: tokens of its context in the cache's blocks (counted there)
    kv = _Kv(kv_capacity_bytes, kv_per_token_bytes, kv_per_seq_bytes, knobs.block_size)
    max_seqs, budget0 = knobs.max_num_seqs, knobs.max_num_batched_tokens
    chunked, mixed = knobs.chunked_prefill, knobs.mixed_batches
    reserve = knobs.admission == "reserve_full"
    ratio = knobs.reserve_ratio
    ov_step, ov_seq = knobs.step_overhead_s, knobs.seq_overhead_s
    step_s, tokens_s, head_s, dec_attn = step.step_s, step.tokens, step.head, step.decode_attention
    cell_end = step.context_cell_end
    # speculative decoding (lmcost.cost.spec_decode): a decode step advances each sequence by ``adv`` tokens (the
    # expected accepted, a float) and takes ``rows`` tokens of the step's budget and KV slots (k + 1); 1 and 1 plain
    adv, rows = getattr(step, "tokens_per_step", 1), getattr(step, "decode_rows", 1)
    ran = getattr(step, "decode_run", None)  # told each closed-form run committed (lmcost.cost.energy.Metered)

    waiting: deque = deque()
    prefilling: list = []            # [i, done] in admission order
    order: list = []                 # running requests in admission order (lazy: stale entries skipped)
    heap: list = []                  # (finish counter, i, epoch)
    n_dec = 0
    S0 = 0                           # sum over decoding sequences of c0 - d0
    D = 0
    t = 0.0
    used = 0.0                       # KV bytes held, except the decodes' growth since their D0 (see below)
    pend = 0                         # tokens admitted but not yet in the cache (prompts + their first tokens)
    dec_tok = 0                      # KV: tokens of decoding sequences at their entry, minus d0 each (as S0)
    reserved = 0.0
    nxt = min(n, concurrency) if concurrency is not None else 0
    if concurrency is not None:
        waiting.extend(range(nxt))
    done = 0
    steps = 0
    busy = 0.0
    last_dec_end = 0.0
    itl: list = []
    timeline: list = []
    blocked = {"max_num_seqs": 0, "kv_cache": 0, "token_budget": 0}
    running = 0
    report_every = max(1, n // 100)

    def kv_used() -> float:
        u = used + kv.tok * (dec_tok + adv * n_dec * D)
        return u if pcache is None else u + pcache.pinned_bytes

    def room_for(tokens: int, extra: float = 0.0) -> bool:
        """Whether a new request of ``tokens`` fits beside the running ones (the prompts being prefilled counted
        whole) and the share ``reserve_ratio`` of their remaining outputs (SGLang's new_token_ratio: admission
        leaves room for decodes to grow); ``extra``: cached bytes its admission would pin. Speculative decodes:
        the k slots each takes this step beyond its one."""
        return (kv_used() + kv.tok * (pend + (rows - 1) * n_dec) + kv.need(tokens + 1) + extra
                + ratio * kv.tok * adv * (F - n_dec * D) <= kv.cap)

    def own(i: int) -> tuple:
        """(tokens request ``i`` would prefill, cached bytes it would pin) if admitted now."""
        if pcache is None:
            return need_pre[i], 0.0
        h, extra = pcache.peek(i, need_pre[i])
        return need_pre[i] - h, extra

    def finish(i: int) -> None:
        nonlocal done, running, used, reserved, nxt
        fin[i] = t
        if pcache is not None:
            pcache.release(i, P[i] + O[i] - 1)
        state[i] = _DONE
        running -= 1
        done += 1
        used -= kv.tok * kv.pad + kv.seq
        if reserve:
            reserved -= kv.need(P[i] + O[i])
        if concurrency is not None and nxt < n:
            arr[nxt] = t
            waiting.append(nxt)
            nxt += 1
        if progress is not None and done % report_every == 0:
            progress(done, n)

    def leave_decode(i: int) -> None:
        nonlocal n_dec, S0, dec_tok, F
        n_dec -= 1
        F -= fin_d[i]
        S0 -= c0[i] - adv * d0[i]
        dec_tok -= c0[i] - shared[i] - adv * d0[i]
        epoch[i] += 1

    def enter_decode(i: int) -> None:
        nonlocal n_dec, S0, dec_tok, used, last_dec_end, F, pend
        gen[i] += 1  # the token the prefill samples
        pend -= 1  # now counted in the decode's context (or freed)
        if n_dec == 0:  # the first decoder after a time without any: its next gap counts from this token
            last_dec_end = t
        if first[i] != first[i]:
            first[i] = t
        if pcache is not None:
            shared[i] = pcache.prefilled(i, hit[i] + need_pre[i])
        if gen[i] >= O[i]:
            used -= kv.tok * need_pre[i]
            finish(i)
            return
        used -= kv.tok * need_pre[i]  # its tokens are now counted as a decode's
        state[i] = _DEC
        c0[i], d0[i] = need_pre[i] + hit[i] + 1, D
        n_dec += 1
        S0 += c0[i] - adv * D
        dec_tok += c0[i] - shared[i] - adv * D
        fin_d[i] = D + (O[i] - gen[i] if adv == 1 else math.ceil((O[i] - gen[i]) / adv))
        F += fin_d[i]
        heapq.heappush(heap, (fin_d[i], i, epoch[i]))

    def finish_decodes() -> None:
        """Finish the decoding requests whose last token the step counter has reached (stale heap entries of
        preempted requests skipped)."""
        while heap and heap[0][0] <= D:
            _, i, e = heapq.heappop(heap)
            if e == epoch[i] and state[i] == _DEC:
                leave_decode(i)
                gen[i] = O[i]
                finish(i)

    def preempt() -> bool:
        """Free the most recently admitted running request (recompute). False if none can go."""
        nonlocal running, used, reserved, pend
        while order and state[order[-1]] not in (_PRE, _DEC):
            order.pop()
        if not order:
            return False
        i = order.pop()
        if state[i] == _DEC:
            gen[i] += D - d0[i] if adv == 1 else min(int(adv * (D - d0[i])), O[i] - gen[i] - 1)
            leave_decode(i)
        else:
            for k, (j, got) in enumerate(prefilling):
                if j == i:
                    used -= kv.tok * got
                    pend -= need_pre[i] - got + 1
                    del prefilling[k]
                    break
        used -= kv.tok * kv.pad + kv.seq
        if reserve:
            reserved -= kv.need(P[i] + O[i])
        need_pre[i] = P[i] + gen[i]
        ready[i] = False
        if pcache is not None:
            pcache.release(i)
            hit[i] = shared[i] = 0
        state[i] = _WAIT
        running -= 1
        pre_n[i] += 1
        waiting.appendleft(i)
        return True

    while done < n:
        if concurrency is None:
            while nxt < n and arr[nxt] <= t:
                waiting.append(nxt)
                nxt += 1
        if not prefilling and n_dec == 0 and not waiting:
            if nxt >= n:
                raise RuntimeError("serve: requests lost track of")
            t = max(t, arr[nxt])
            continue
        if pcache is not None:  # the unreferenced cached blocks within the room the running requests leave
            pcache.evict(kv.cap - kv_used() - kv.tok * pend)
        # the decodes' KV: one token each this step; preempt the newest until it fits (and admit nothing new
        # in a step that preempted, as vLLM's scheduler does: else a prefill-first engine re-admits what it
        # just preempted and the decodes starve)
        preempted = False
        while n_dec and kv_used() + kv.tok * (pend + rows * n_dec) > kv.cap and knobs.preemption != "none":
            if not preempt():
                break
            preempted = True
        # a run of pure decode steps in closed form
        if n_dec and not prefilling:
            head_i = waiting[0] if waiting else None
            can_admit = running < max_seqs and (
                head_i is None or (reserved + kv.need(P[head_i] + O[head_i]) <= kv.cap if reserve
                                   else room_for(*own(head_i))))
            if head_i is None or not can_admit:
                while heap and (heap[0][2] != epoch[heap[0][1]] or state[heap[0][1]] != _DEC):
                    heapq.heappop(heap)
                K = heap[0][0] - D
                if kv.tok > 0:
                    K = min(K, int((kv.cap - kv_used()) // (kv.tok * adv * n_dec)))
                if K >= 2:
                    base = ov_step + ov_seq * n_dec + tokens_s(n_dec) + head_s(n_dec)
                    gap = (arr[nxt] - t if head_i is None and can_admit and concurrency is None and nxt < n
                           else math.inf)
                    # the run cell by cell of the decode-attention grid, in each of which the step time is
                    # affine in the step (a + b j): an arithmetic series; it stops at the step that ends at or
                    # past the next arrival (k a + b k(k-1)/2 >= gap)
                    m = (S0 + adv * n_dec * D) / n_dec
                    k, dt, runs = 0, 0.0, []
                    while k < K and dt < gap:
                        e, end = K - k, cell_end(m)
                        if end < math.inf:
                            e = min(e, math.floor((end - m) / adv) + 1)
                        a = base + dec_attn(n_dec, m)
                        b = (base + dec_attn(n_dec, m + adv * (e - 1)) - a) / (e - 1) if e > 1 else 0.0
                        seg = e * a + b * e * (e - 1) / 2
                        if dt + seg > gap:
                            left = gap - dt
                            if b > 1e-300:
                                h = b / 2
                                j = math.ceil((-(a - h) + math.sqrt((a - h) ** 2 + 4 * h * left)) / (2 * h))
                            else:
                                j = math.ceil(left / a)
                            e = min(e, max(1, j))
                            seg = e * a + b * e * (e - 1) / 2
                        runs.append((a, a + b * (e - 1), e, n_dec))
                        dt += seg
                        k += e
                        m += adv * e
                    if k >= 2:
                        if head_i is not None:  # waiting requests held back the whole run: by what
                            blocked["max_num_seqs" if running >= max_seqs else "kv_cache"] += k
                        itl.append((runs[0][0] + t - last_dec_end, *runs[0][1:]))
                        itl.extend(runs[1:])
                        t += dt
                        busy += dt
                        if ran is not None:
                            ran(n_dec, (S0 + adv * n_dec * D) / n_dec, k, runs)
                        D += k
                        steps += k
                        last_dec_end = t
                        timeline.append((t, kv_used() / kv.cap, len(waiting), running))
                        finish_decodes()
                        continue
        # one step: decodes first, then partial prefills, then admissions
        budget = budget0 - (rows * n_dec if mixed else 0)
        prefill_only = False
        entered = False
        chunks = []
        for entry in prefilling:
            if budget <= 0:
                break
            i, got = entry
            left = need_pre[i] - got
            c = min(left, budget) if chunked else (left if left <= budget else 0)
            if c:
                chunks.append((entry, c))
                budget -= c
        if waiting and budget <= 0:  # the decodes took the whole budget
            blocked["token_budget"] += 1
        while waiting and budget > 0:
            i = waiting[0]
            if running >= max_seqs:
                blocked["max_num_seqs"] += 1
                break
            need, extra = own(i)
            c = 1 if ready[i] else min(need, budget) if chunked else need
            if c > budget:
                if not chunked and mixed and n_dec and not chunks and c <= budget0:
                    # a whole prompt that fits the budget only without the decodes: a prefill step, the decodes
                    # waiting (an engine without chunked prefill schedules it so; else it starves)
                    budget, prefill_only = budget0, True
                else:
                    blocked["token_budget"] += 1
                    break
            if reserve:
                if reserved + kv.need(P[i] + O[i]) > kv.cap:
                    blocked["kv_cache"] += 1
                    break
            elif preempted or not room_for(need, extra + (kv.tok * (rows + n_dec) if ready[i] else 0.0)):
                # room for the whole prompt (P/D: a prefilled request decodes in this step, as do the others)
                blocked["kv_cache"] += 1
                break
            waiting.popleft()
            if reserve:
                reserved += kv.need(P[i] + O[i])
            state[i] = _PRE
            running += 1
            used += kv.tok * kv.pad + kv.seq
            if admitted[i] != admitted[i]:
                admitted[i] = t
            if pcache is not None:
                hit[i] = shared[i] = pcache.admit(i, need_pre[i])
                need_pre[i] -= hit[i]
                pcache.evict(kv.cap - kv_used() - kv.tok * (pend + need_pre[i] + 1))
            entry = [i, 0]
            pend += need_pre[i] + 1  # its prompt and the token its prefill samples
            if ready[i]:  # P/D: its prompt's KV is in the cache already: it decodes from this step on
                order.append(i)
                used += kv.tok * need_pre[i]
                pend -= need_pre[i]
                budget -= 1
                entered = True
                enter_decode(i)
                continue
            prefilling.append(entry)
            order.append(i)
            chunks.append((entry, c))
            budget -= c
        dec_run = 0 if prefill_only else n_dec if (mixed or not chunks) else 0
        if not chunks and not dec_run and entered:  # P/D: prefilled requests of one token, done on admission
            continue
        if not chunks and not dec_run:
            # nothing can run: wait for the next arrival (the cache is held by prefills that cannot go on)
            if concurrency is None and nxt < n:
                t = max(t, arr[nxt])
                continue
            raise RuntimeError("serve: no request can be scheduled (a request larger than the KV cache)")
        m = (S0 + adv * n_dec * D) / n_dec if dec_run else 0.0
        pc = [(hit[e[0]] + e[1], c) for e, c in chunks]
        completing = sum(1 for e, c in chunks if e[1] + c == need_pre[e[0]])
        dt = ov_step + ov_seq * (dec_run + len(chunks)) + step_s(dec_run, m, pc, dec_run + completing)
        if pcache is not None and pcache.pending_s:  # KV offload: loads from the host tier before the forward
            dt += pcache.take_load_s()
        t += dt
        busy += dt
        steps += 1
        for e, c in chunks:
            e[1] += c
            used += kv.tok * c
            pend -= c
        if dec_run:
            itl.append((t - last_dec_end, t - last_dec_end, 1, dec_run))
            last_dec_end = t
            D += 1
        # the cache in use at the step's end, before the requests it finished free theirs
        timeline.append((t, kv_used() / kv.cap, len(waiting), running))
        if dec_run:
            finish_decodes()
        if chunks:
            still = []
            for e in prefilling:
                if e[1] >= need_pre[e[0]]:
                    enter_decode(e[0])
                else:
                    still.append(e)
            prefilling[:] = still

    def arr_(v):
        return np.array(v, dtype=float)

    return Trace(arrival_s=arr_(arr), admitted_s=arr_(admitted), first_token_s=arr_(first), finish_s=arr_(fin),
                 prompt=np.asarray(prompt), output=np.asarray(output), preemptions=np.array(pre_n),
                 itl_segments=np.array(itl, dtype=float).reshape(-1, 4),
                 kv_timeline=np.array(timeline, dtype=float).reshape(-1, 4), steps=steps, busy_s=busy,
                 blocked=blocked, prefix_cache=pcache)
