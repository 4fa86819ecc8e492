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

KV offload (``--kv-offload cpu:SIZE[:GBPS]``, :func:`parse_offload`): a host-memory tier of SIZE bytes per
GPU below the GPU cache, as vLLM's KV offloading connector (``kv_offloading_size``), LMCache and SGLang's
HiCache keep one. Blocks evicted from the GPU move to it (the tail of an id's chain on the GPU, the blocks
after it on the host), evicted from it least recently used id first, tail first, when it is full. A request
whose prefix goes on past the GPU's blocks into the host's loads those (they move back to the GPU cache) in
``bytes / GBPS`` seconds, charged on the critical path of the step that runs its first prefill chunk (vLLM's
KV connector loads before the forward: ``start_load_kv``), not recomputed. GBPS defaults to PCIe Gen5 x16,
64 GB/s per direction (NVIDIA H100 PCIe datasheet, 2023: "PCIe Gen5 128 GB/s", both directions; the DGX
H100's GPUs sit on Gen5 x16 too): the link's peak, an upper bound on what a copy achieves; no measured
load rate is modelled. The copies to the host on eviction are taken as overlapped (not charged).
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
#: Host link bandwidth of the offload tier where the spec gives none, bytes/s per GPU per direction: PCIe
#: Gen5 x16 (NVIDIA H100 PCIe datasheet, 2023: "PCIe Gen5: 128 GB/s", the two directions together).
HOST_LINK_BYTES_S = 64e9
#: Byte units of an offload SIZE (binary, as ``--bytes``): K = 2^10 ... T = 2^40, or KiB ... TiB.
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "KiB": 2**10, "MiB": 2**20,
          "GiB": 2**30, "TiB": 2**40}
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


def parse_offload(spec: str) -> tuple:
    """``cpu:SIZE[:GBPS]`` as (bytes per GPU, host link bytes/s): SIZE a number of bytes with a binary unit
    (``256G`` = 256 GiB; at least 1 byte once floored); a fractional SIZE takes a unit and is floored to whole
    bytes (``1.5G`` = 1.5 x 2^30 = 1,610,612,736 B); GBPS decimal GB/s per direction (default :data:`HOST_LINK_BYTES_S`).
    Raises: LmcostError naming ``kv_offload``, saying which part is wrong: another tier or form, a unit not in
    K, M, G, T (KiB...), a fractional size without a unit, a size of 0 bytes or past 2^50, or a bandwidth outside
    0.001 to 10,000 GB/s."""
    fix = "give cpu:SIZE or cpu:SIZE:GBPS, e.g. cpu:256G, cpu:1.5G or cpu:256G:50 (binary units; GB/s per direction)"
    m = re.fullmatch(r"cpu:([0-9]+(?:\.[0-9]*)?)([A-Za-z]*)(?::([0-9]+(?:\.[0-9]*)?))?", str(spec).strip(),
                     flags=re.ASCII)
    if m is None:
        what = ("is not cpu:SIZE[:GBPS] (SIZE a number with a unit, GBPS a number)"
                if str(spec).strip().startswith("cpu:") else "is not an offload tier (cpu or disk)")
        raise LmcostError("kv_offload", f"{spec!r:.60} {what}", fix)
    if m.group(2) not in _UNITS:
        raise LmcostError("kv_offload", f"{spec!r:.60}: {m.group(2)!r} is not a binary unit (K, M, G, T, or KiB, "
                          "MiB, GiB, TiB)", fix)
    if "." in m.group(1) and _UNITS[m.group(2)] == 1:
        raise LmcostError("kv_offload", f"{spec!r:.60}: a size in bytes is a whole number", "give a whole number of "
                          "bytes, or a unit: cpu:1.5G is 1.5 GiB")
    size = math.floor(float(m.group(1)) * _UNITS[m.group(2)])
    bw = HOST_LINK_BYTES_S if m.group(3) is None else float(m.group(3)) * 1e9
    if size > 2**50 or not 1e6 <= bw <= 1e13:
        raise LmcostError("kv_offload", f"{spec!r:.60} is outside 0 to 1 PiB, or 0.001 to 10,000 GB/s", fix)
    if size == 0:  # the flag's text only: PrefixCache still takes a 0-byte tier (the metamorphic tests' no tier)
        raise LmcostError("kv_offload", f"{spec!r:.60} is a tier of 0 bytes: it would hold nothing",
                          "give a size of at least 1 byte, e.g. cpu:256G, or drop the offload tier")
    return size, bw


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


def _add_and_trim(blocks: dict, lru: OrderedDict, key: int, k: int, over: int) -> list:
    """Add ``k`` blocks to id ``key`` of a host or disk tier (``blocks`` per id, ``lru`` oldest first; ``key``
    becomes the most recent), then drop least recently used ids' blocks until ``over`` (blocks past the tier's
    capacity, counting the ``k``) is gone. Returns: [(id, blocks dropped)] in eviction order, the caller's
    counters to update (and a host tier's drops to spill)."""
    blocks[key] = blocks.get(key, 0) + k
    lru[key] = None
    lru.move_to_end(key)
    out = []
    for q in list(lru):
        if over <= 0:
            break
        d = min(blocks[q], over)
        blocks[q] -= d
        over -= d
        if not blocks[q]:
            del blocks[q], lru[q]
        if d:
            out.append((q, d))
    return out


class PrefixCache:
    """The block cache of one replica (the module docstring), over its requests' ``ids`` and ``tokens``
    (lists [n]: prefix id, -1 none; prefix tokens). ``block``: tokens per KV block; ``per_token_bytes``: KV
    bytes per token on one GPU. Counts in blocks; ``pinned_bytes`` the referenced blocks' bytes (the
    simulation adds them to the requests' own).

    Statistics: ``asked`` (tokens to prefill over every admission, before the cache), ``hit_tokens``,
    ``hits`` (a Counter: tokens of a hit -> admissions), ``evicted`` (blocks), ``peak_blocks`` (cached, pinned or
    not)."""

    def __init__(self, ids, tokens, block: int, per_token_bytes: float, offload: tuple | None = None):
        self.ids, self.L, self.B = [int(v) for v in ids], [int(v) for v in tokens], int(block)
        self.block_bytes = per_token_bytes * block
        # the host tier (offload: (bytes, bytes/s)): id -> blocks held after its GPU chain, LRU, statistics
        self.offload = offload
        self.host_cap = int(offload[0] // self.block_bytes) if offload and self.block_bytes > 0 else 0
        self.host: dict = {}
        self.host_lru: OrderedDict = OrderedDict()
        self.host_used = self.host_peak = self.loaded = self.stored = self.host_evicted = 0
        self.load_s = self.pending_s = 0.0
        # the disk tier below it (serve_offload.Tiers: offload[2:4]): id -> blocks after its host range, LRU
        self.disk_cap = int(offload[2] // self.block_bytes) if offload and len(offload) > 2 and self.block_bytes > 0 else 0
        self.disk: dict = {}
        self.disk_lru: OrderedDict = OrderedDict()
        self.disk_used = self.disk_peak = self.disk_loaded = self.disk_evicted = 0
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

    def _split(self, i: int, need: int) -> tuple:
        """(blocks request ``i`` finds on the GPU, blocks it would load from the host, then from the disk)."""
        p = self.ids[i]
        if p < 0:
            return 0, 0, 0
        want, g = min(self.L[i], need - 1) // self.B, self.chain.get(p, 0)
        gpu = min(g, want)
        host = min(self.host.get(p, 0), want - gpu) if gpu == g else 0
        return gpu, host, (min(self.disk.get(p, 0), want - gpu - host) if gpu == g and host == self.host.get(p, 0)
                           else 0)

    def peek(self, i: int, need: int) -> tuple:
        """(tokens request ``i``, needing ``need`` tokens prefilled, would take from the cache, the host tier's
        included; bytes that admitting it would newly pin)."""
        h = sum(self._split(i, need))
        return h * self.B, (max(0, h - self.pin.get(self.ids[i], 0)) * self.block_bytes if h else 0.0)

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
        gpu, host, disk = self._split(i, need)
        h = (gpu + host + disk) * self.B
        self.asked += need
        p = self.ids[i]
        if host or disk:  # the host's (then the disk's) blocks move back after the GPU's, before its first chunk
            self._host_take(p, host + disk)
            self.chain[p] = self.chain.get(p, 0) + host + disk
            self.cached += host + disk
            self.peak_blocks = max(self.peak_blocks, self.cached)
            self.loaded += host
            self.disk_loaded += disk
            if host:
                self.pending_s += host * self.block_bytes / self.offload[1]
            if disk:
                self.pending_s += disk * self.block_bytes / self.offload[3]
        if p >= 0 and p in self.chain:
            self._touch(p)
        if h:
            self.hit_tokens += h
            self.hits[h] += 1
            self._ref(i, h // self.B)
        return h

    def _host_take(self, p: int, k: int) -> None:
        """Drop ``k`` blocks of id ``p``'s host range from its head, then of its disk range (they moved to the
        GPU or were computed)."""
        if k > 0 and p in self.host:
            t = min(k, self.host[p])
            self.host[p] -= t
            self.host_used -= t
            k -= t
            if not self.host[p]:
                del self.host[p], self.host_lru[p]
        if k > 0 and p in self.disk:
            t = min(k, self.disk[p])
            self.disk[p] -= t
            self.disk_used -= t
            if not self.disk[p]:
                del self.disk[p], self.disk_lru[p]

    def take_load_s(self) -> float:
        """Seconds of host-tier loads admitted since the last call (the simulation adds them to the step)."""
        t, self.pending_s = self.pending_s, 0.0
        self.load_s += t
        return t

    def _insert(self, p: int, blocks: int) -> None:
        if blocks > self.chain.get(p, 0):
            self._host_take(p, blocks - self.chain.get(p, 0))
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
                if self.host_cap or self.disk_cap:
                    self._offload(p, k)
            if not self.chain[p]:
                del self.chain[p], self.lru[p]
            if over <= 0:
                return


    def _offload(self, p: int, k: int) -> None:
        """The ``k`` blocks evicted from id ``p``'s GPU tail join the head of its host range; the host tier then
        evicts least recently used ids' tails while over its capacity."""
        self.stored += k
        self.host_used += k
        out = _add_and_trim(self.host, self.host_lru, p, k, self.host_used - self.host_cap)
        for q, d in out:
            self.host_evicted += d
            self.host_used -= d
            if self.disk_cap:
                self._spill(q, d)
        self.host_peak = max(self.host_peak, self.host_used)

    def _spill(self, q: int, d: int) -> None:
        """The ``d`` blocks evicted from id ``q``'s host tail join the head of its disk range; the disk tier
        then drops least recently used ids' tails while over its capacity."""
        self.disk_used += d
        for _, e in _add_and_trim(self.disk, self.disk_lru, q, d, self.disk_used - self.disk_cap):
            self.disk_evicted += e
            self.disk_used -= e
        self.disk_peak = max(self.disk_peak, self.disk_used)


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
    (one GPU); with an offload tier, ``offload``: its capacity and bandwidth, ``hit_tokens`` loaded from it,
    ``bytes_loaded`` and ``bytes_offloaded`` (to and from the GPU), ``load_s`` (the loads' seconds, summed),
    ``evictions`` (blocks dropped from it) and ``peak_bytes`` (one GPU's share). Counts over every replica
    (``scale``: all requests / this replica's); ``cache`` None when caching is off."""
    if cache is None:
        return dict(enabled=False, hit_rate=0.0, hit_tokens=0, saved_prefill_flops=0.0, evictions=0,
                    peak_cached_bytes=0.0)
    cfg, prec, quant = setup.cfg, setup.precision, setup.settings.quant
    saved = sum(k * prefill_flops(cfg, prec, quant, h) for h, k in cache.hits.items())
    out = dict(enabled=True, hit_rate=cache.hit_tokens / cache.asked if cache.asked else 0.0,
               hit_tokens=int(round(scale * cache.hit_tokens)), saved_prefill_flops=float(scale * saved),
               evictions=int(round(scale * cache.evicted)), peak_cached_bytes=cache.peak_blocks * cache.block_bytes)
    if cache.offload is not None:
        bb = cache.block_bytes
        out["offload"] = dict(tier="cpu", capacity_bytes=cache.offload[0], bandwidth_bytes_per_s=cache.offload[1],
                              hit_tokens=int(round(scale * cache.loaded * cache.B)),
                              bytes_loaded=scale * cache.loaded * bb, bytes_offloaded=scale * cache.stored * bb,
                              load_s=scale * cache.load_s, evictions=int(round(scale * cache.host_evicted)),
                              peak_bytes=cache.host_peak * bb)
        if len(cache.offload) > 2:  # the tiers of serve_offload (cpu, disk, cpu,disk): per tier, and what they buy
            tiers = tiers_summary(cache, scale)
            first = tiers["tiers"][cache.offload.names[0]]
            out["offload"].update(tier=",".join(cache.offload.names), bandwidth_bytes_per_s=first["bandwidth_bytes_per_s"],
                                  capacity_bytes=sum(v["capacity_bytes"] for v in tiers["tiers"].values()),
                                  hit_tokens=sum(v["hit_tokens"] for v in tiers["tiers"].values()),
                                  bytes_loaded=sum(v["bytes_loaded"] for v in tiers["tiers"].values()),
                                  evictions=tiers["tiers"][cache.offload.names[-1]]["evictions"],
                                  peak_bytes=sum(v["peak_bytes"] for v in tiers["tiers"].values()), **tiers)
    return out


def tiers_summary(cache, scale: float) -> dict:
    """``prefix_cache.offload.tiers`` and ``capacity_tokens`` of a run with :class:`lmcost.apps.serve_offload.Tiers`: per tier,
    ``capacity_bytes`` and ``capacity_tokens`` (whole blocks the tier holds, tokens: the capacity it buys
    beyond the GPU cache, one GPU), ``bandwidth_bytes_per_s``, ``hit_tokens`` (loaded from it), ``bytes_loaded``,
    ``load_s`` (bytes_loaded / bandwidth), ``evictions`` (blocks leaving it: spilled to disk, or dropped) and
    ``peak_bytes``; counts over every replica (``scale``, as :func:`lmcost.apps.serve_prefix.summary`)."""
    t, bb = cache.offload, cache.block_bytes
    rows = dict(cpu=(t.cpu_bytes, t.cpu_bytes_s, cache.host_cap, cache.loaded, cache.host_evicted, cache.host_peak),
                disk=(t.disk_bytes, t.disk_bytes_s, cache.disk_cap, cache.disk_loaded, cache.disk_evicted,
                      cache.disk_peak))
    tiers = {}
    for name in t.names:
        size, bw, cap, loaded, evicted, peak = rows[name]
        tiers[name] = dict(capacity_bytes=size, capacity_tokens=cap * cache.B, bandwidth_bytes_per_s=bw,
                           hit_tokens=int(round(scale * loaded * cache.B)), bytes_loaded=scale * loaded * bb,
                           load_s=scale * loaded * bb / bw, evictions=int(round(scale * evicted)),
                           peak_bytes=peak * bb)
    return dict(tiers=tiers, capacity_tokens=sum(v["capacity_tokens"] for v in tiers.values()), sources=t.sources)


def requests_for(r, args: dict, rate):
    """The requests of ``r`` (:class:`lmcost.apps.serve.ServeRequest`) at ``rate``: its workload file's, or
    generated (:func:`lmcost.apps.serve_workload.make_requests` with ``args``) and given ``r.prefix``'s
    prefixes (:func:`apply_prefix`). Raises: the errors of those functions."""
    from lmcost.apps.serve_workload import make_requests, read_requests

    if r.workload_file:
        return read_requests(r.workload_file)
    reqs = make_requests(rate=rate, **args)
    return reqs if r.prefix is None else apply_prefix(reqs, r.prefix, args["seed"])


def check_use(r, prefix_id, setup=None) -> None:
    """Raises: LmcostError (``prefix_caching``, ``kv_offload``) for one given while the workload names no
    prefixes (``prefix_id`` None); (``kv_offload``) for a tier beside caching off in ``setup`` (when given)."""
    for name in ("prefix_caching", "kv_offload"):
        if getattr(r, name) is not None and prefix_id is None:
            raise LmcostError(name, "has no effect: the workload names no prefixes", "give a prefix spec (shared:N, "
                              "groups:G:N, sessions:TURNS) or prefix_id in the workload file, or drop it")
    if setup is not None and setup.kv_offload is not None and not setup.prefix_caching:
        raise LmcostError("kv_offload", "has no effect with prefix caching off (the tier holds evicted prefix blocks)",
                          "turn prefix caching on, or drop the offload tier")
