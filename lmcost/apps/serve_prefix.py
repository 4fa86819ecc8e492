"""Prefix caching for ``lmcost serve``: workloads whose requests share prefixes (a system prompt, a few
system prompts, the turns of a chat session or an agent loop), and the block cache the simulation
(:func:`lmcost.apps.serve_sim.simulate`) keeps of them, as vLLM v1's automatic prefix caching, SGLang's
RadixAttention and TensorRT-LLM's KV block reuse do.

The cache (:class:`PrefixCache`) is a radix tree of depth one: each prefix id holds a chain of cached KV
blocks of ``block`` tokens (whole blocks only: vLLM hashes full blocks, ``vllm/v1/core/kv_cache_utils.py``).
A request of id ``p`` whose first ``L`` prompt tokens are ``p``'s sequence hits ``min(chain, floor(min(L,
prompt - 1) / block))`` blocks (vLLM computes at least the last prompt token, to sample from its logits:
``vllm/v1/core/kv_cache_manager.py``, ``get_computed_blocks`` caps the hit at ``num_tokens - 1``) and
prefills only the rest, its chunks' attention still reading the cached keys. Blocks referenced by running
requests are counted once in the KV bytes (pinned); blocks no running request references stay cached,
evictable: they take no room from admissions (vLLM's free block queue holds them) and are evicted least
recently used first, id by id, tail blocks first, when the running requests need their room. When a
prefill completes, the request's full blocks up to its id's longest prefix (the most ``prefix_tokens`` any
request of the id names) join the chain, the request switching to the chain's copy of blocks another
request cached meanwhile (as SGLang's radix cache frees the duplicate); when a request finishes, its prompt
and output blocks up to that length join too (a chat's next turn re-sends them). A preempted request
releases its blocks to the cache, and hits them when it is admitted again.

Workloads (:func:`apply_prefix`, ``--prefix SPEC``): ``shared:N`` (every request's prompt is an N-token
system prompt, the same for all, followed by its own ``--prompt`` tokens), ``groups:G:N`` (G system prompts
of N tokens; each request draws one, uniformly), ``sessions:TURNS`` (multi-turn chat: ceil(n / TURNS)
sessions; request j is turn j // S of session j % S, so a session's turns arrive S requests apart; turn k's
prompt is turn k-1's prompt and output followed by ``--prompt`` new user tokens; an agent loop is the same
with short ``--output``). A replayed JSONL names ``prefix_id`` and ``prefix_tokens`` per line
(:func:`lmcost.apps.serve_workload.read_requests`).

KV offload to host memory is not modelled here (evicted blocks are dropped, a later request recomputes
them).
"""

from __future__ import annotations

import math
import re
from collections import Counter, OrderedDict
from dataclasses import replace

import numpy as np

from lmcost.apps.serve_workload import MAX_LENGTH, MAX_REQUESTS, Requests
from lmcost.basics.counts import parse_count
from lmcost.basics.errors import LmcostError

#: The forms of ``--prefix``, as its errors list them.
FORMS = "shared:N (one N-token system prompt), groups:G:N (G of them, drawn per request) or sessions:TURNS"
#: The lm_head's operators: a hit saves none of them (the last prompt token is always computed and sampled).
_HEAD = ("lm_head", "tp.logits_all_gather")


def _part(text: str, spec: str, name: str, low: int, high: int) -> int:
    try:
        v = parse_count(text)
    except ValueError:
        v = None
    if v is None or not low <= v <= high:
        raise LmcostError("workload.prefix", f"{name} {text!r:.30} of {spec!r:.60} is not a whole number from "
                          f"{low:,} to {high:,}", f"give {FORMS}")
    return v


def parse_prefix(spec: str) -> tuple:
    """``spec`` as ``("shared", N)``, ``("groups", G, N)`` or ``("sessions", TURNS)``. N and G are counts
    (:func:`lmcost.basics.counts.parse_count`: ``8k`` = 8,192). Raises: LmcostError naming ``workload.prefix``
    for another form or a figure out of range (N 1 to MAX_LENGTH, G and TURNS 1 to MAX_REQUESTS)."""
    text = str(spec).strip().lower()
    m = re.fullmatch(r"(shared|groups|sessions):([^:]*)(?::([^:]*))?", text)
    if m is None or (m.group(1) == "groups") != (m.group(3) is not None):
        raise LmcostError("workload.prefix", f"{spec!r:.60} is not a prefix spec", f"give {FORMS}")
    kind, a, b = m.groups()
    if kind == "shared":
        return kind, _part(a, text, "N", 1, MAX_LENGTH)
    if kind == "groups":
        return kind, _part(a, text, "G", 1, MAX_REQUESTS), _part(b, text, "N", 1, MAX_LENGTH)
    return kind, _part(a, text, "TURNS", 1, MAX_REQUESTS)


def apply_prefix(reqs: Requests, spec: str, seed: int = 0) -> Requests:
    """``reqs`` (generated, :func:`lmcost.apps.serve_workload.make_requests`) with the prefixes of ``spec``
    (:func:`parse_prefix`; the forms in the module docstring): prompts lengthened and ``prefix_id`` /
    ``prefix_tokens`` set. ``groups`` draws each request's group with its own generator (seeded ``(seed,
    28)``), so the lengths and arrivals are those of the same seed without a prefix.
    Shapes: as :class:`Requests`. Raises: LmcostError naming ``workload.prefix`` (:func:`parse_prefix`) or
    ``workload.prompt`` for a session's prompt past MAX_LENGTH tokens."""
    form = parse_prefix(spec)
    n, p, o = reqs.n, reqs.prompt.copy(), reqs.output
    if form[0] == "shared":
        ids, toks = np.zeros(n, dtype=np.int64), np.full(n, form[1], dtype=np.int64)
        p = p + form[1]
    elif form[0] == "groups":
        ids = np.random.default_rng((seed, 28)).integers(0, form[1], n).astype(np.int64)
        toks = np.full(n, form[2], dtype=np.int64)
        p = p + form[2]
    else:
        s = math.ceil(n / form[1])
        ids, toks = np.arange(n, dtype=np.int64) % s, np.zeros(n, dtype=np.int64)
        for j in range(s, n):  # turn k re-sends turn k-1's prompt and output, then its new tokens
            toks[j] = p[j - s] + o[j - s]
            p[j] += toks[j]
        if p.max() > MAX_LENGTH:
            raise LmcostError("workload.prompt", f"a session's last turn re-sends {int(p.max()):,} tokens, past "
                              f"{MAX_LENGTH:,}", "give fewer turns or shorter prompts and outputs")
    return replace(reqs, prompt=p, prefix_id=ids, prefix_tokens=toks)


class PrefixCache:
    """The block cache of one replica (the module docstring), over its requests' ``ids`` and ``tokens``
    (lists [n]: prefix id, -1 none; prefix tokens). ``block``: tokens per KV block; ``per_token_bytes``: KV
    bytes per token on one GPU. Counts in blocks; ``pinned_bytes`` the referenced blocks' bytes (the
    simulation adds them to the requests' own).

    Statistics: ``asked`` (tokens to prefill over every admission, before the cache), ``hit_tokens``,
    ``hits`` (a Counter: tokens of a hit -> admissions), ``evicted`` (blocks), ``peak_blocks`` (cached, pinned or
    not)."""

    def __init__(self, ids, tokens, block: int, per_token_bytes: float):
        self.ids, self.L, self.B = [int(v) for v in ids], [int(v) for v in tokens], int(block)
        self.block_bytes = per_token_bytes * block
        self.cap: dict = {}
        for p, L in zip(self.ids, self.L):
            if p >= 0:
                self.cap[p] = max(self.cap.get(p, 0), L)
        self.chain: dict = {}            # id -> blocks cached
        self.refs: dict = {}             # id -> Counter(blocks referenced -> running requests)
        self.pin: dict = {}              # id -> the most blocks a running request references
        self.held = [0] * len(self.ids)  # blocks each request references
        self.lru: OrderedDict = OrderedDict()
        self.cached = self.pinned = 0
        self.asked = self.hit_tokens = self.evicted = self.peak_blocks = 0
        self.hits: Counter = Counter()

    @property
    def pinned_bytes(self) -> float:
        return self.pinned * self.block_bytes

    @property
    def evictable_bytes(self) -> float:
        return (self.cached - self.pinned) * self.block_bytes

    def peek(self, i: int, need: int) -> tuple:
        """(tokens request ``i``, needing ``need`` tokens prefilled, would take from the cache; bytes that
        admitting it would newly pin)."""
        p = self.ids[i]
        if p < 0 or p not in self.chain:
            return 0, 0.0
        h = min(self.chain[p], min(self.L[i], need - 1) // self.B)
        return h * self.B, max(0, h - self.pin.get(p, 0)) * self.block_bytes

    def _ref(self, i: int, blocks: int) -> None:
        """Request ``i`` now references ``blocks`` of its id's chain (0: none)."""
        p = self.ids[i]
        old = self.held[i]
        if old == blocks:
            return
        c = self.refs.setdefault(p, Counter())
        if old:
            c[old] -= 1
            if not c[old]:
                del c[old]
        if blocks:
            c[blocks] += 1
        self.held[i] = blocks
        new = max(c) if c else 0
        self.pinned += new - self.pin.get(p, 0)
        self.pin[p] = new

    def _touch(self, p: int) -> None:
        self.lru[p] = None
        self.lru.move_to_end(p)

    def admit(self, i: int, need: int) -> int:
        """Admit request ``i`` (``need`` tokens to prefill): pin its hit and count it. Returns the hit, tokens."""
        h, _ = self.peek(i, need)
        self.asked += need
        if self.ids[i] >= 0 and self.ids[i] in self.chain:
            self._touch(self.ids[i])
        if h:
            self.hit_tokens += h
            self.hits[h] += 1
            self._ref(i, h // self.B)
        return h

    def _insert(self, p: int, blocks: int) -> None:
        if blocks > self.chain.get(p, 0):
            self.cached += blocks - self.chain.get(p, 0)
            self.chain[p] = blocks
            self.peak_blocks = max(self.peak_blocks, self.cached)
        if p in self.chain:
            self._touch(p)

    def prefilled(self, i: int, tokens: int) -> int:
        """Request ``i``'s prefill completed, its context ``tokens`` long: its full blocks up to its id's
        longest prefix join the chain, and it references them. Returns the tokens it references in the cache."""
        p = self.ids[i]
        if p < 0:
            return 0
        own = min(tokens, self.cap[p]) // self.B
        self._insert(p, own)
        self._ref(i, max(own, self.held[i]))
        return self.held[i] * self.B

    def release(self, i: int, context: int | None = None) -> None:
        """Request ``i`` left (finished with ``context`` tokens in its KV, or preempted: None): its blocks stay
        cached, unpinned; a finished request's blocks up to its id's longest prefix join the chain."""
        p = self.ids[i]
        if p < 0:
            return
        self._ref(i, 0)
        if context is not None:
            self._insert(p, min(context, self.cap[p]) // self.B)

    def evict(self, room_bytes: float) -> None:
        """Evict unreferenced blocks, least recently used id first and its tail first, until those left take at
        most ``room_bytes`` (the KV cache's room beside the running requests)."""
        if self.block_bytes <= 0:
            return
        over = math.ceil((self.evictable_bytes - room_bytes) / self.block_bytes - 1e-9)
        if over <= 0:
            return
        for p in list(self.lru):
            k = min(over, self.chain[p] - self.pin.get(p, 0))
            if k > 0:
                self.chain[p] -= k
                self.cached -= k
                self.evicted += k
                over -= k
            if not self.chain[p]:
                del self.chain[p], self.lru[p]
            if over <= 0:
                return


def prefill_flops(cfg, precision, quant, tokens: int) -> int:
    """FLOPs of a prefill of ``tokens`` tokens of one sequence, the whole model (every GPU of a replica), less
    the lm_head: what a prefix-cache hit of ``tokens`` saves (its queries' work: the rest of the prompt's
    chunks still attend to the cached keys, and the last token is still computed and sampled). From the
    prefill phase's operator graph (:func:`lmcost.cost.compile.phase_graph`), as ``estimate`` counts them."""
    from lmcost.cost.compile import phase_graph
    from lmcost.operators.workload import Settings

    g = phase_graph(cfg, precision, "prefill", Settings(logits="last", quant=quant))
    rec = g.at(1, int(tokens))
    return int(sum(f * c for f, c, name in zip(rec.cols.flops, rec.cols.count, g.names) if name not in _HEAD))


def summary(cache: PrefixCache | None, setup, *, scale: float) -> dict:
    """The ``prefix_cache`` figures of a run: ``enabled``, ``hit_rate`` (tokens served from the cache / tokens
    to prefill, every admission counted: the prompt tokens when nothing is preempted), ``hit_tokens``,
    ``saved_prefill_flops`` (:func:`prefill_flops` of each hit), ``evictions`` (blocks), ``peak_cached_bytes``
    (one GPU). Counts over every replica (``scale``: all requests / this replica's); ``cache`` None when
    caching is off."""
    if cache is None:
        return dict(enabled=False, hit_rate=0.0, hit_tokens=0, saved_prefill_flops=0.0, evictions=0,
                    peak_cached_bytes=0.0)
    cfg, prec, quant = setup.cfg, setup.precision, setup.settings.quant
    saved = sum(k * prefill_flops(cfg, prec, quant, h) for h, k in cache.hits.items())
    return dict(enabled=True, hit_rate=cache.hit_tokens / cache.asked if cache.asked else 0.0,
                hit_tokens=int(round(scale * cache.hit_tokens)), saved_prefill_flops=float(scale * saved),
                evictions=int(round(scale * cache.evicted)), peak_cached_bytes=cache.peak_blocks * cache.block_bytes)
