"""Prefix caching in ``lmcost serve`` (issue 28): the block cache per prefix id (:mod:`lmcost.apps.serve_prefix`)
in the scheduler's simulation, its workloads and its JSON.

Metamorphic: a workload whose every prefix id is distinct (no request can hit another's blocks), or one run
with caching off, gives the summary of the same requests without prefixes, number for number; a shared prefix
of N tokens saves exactly floor(min(N, prompt - 1) / block) whole blocks of prefill per request that hits.
Exact bytes: a cached prefix holds whole blocks x the KV bytes per token, counted once however many running
requests share it (worked by hand for llama-3-8b in the comments). Eviction: least recently used first.
Every run is tens of requests of llama-3-8b on tables to 4,096 tokens: each test well under 2 s.
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve, summarize
from lmcost.apps.serve_prefix import PrefixCache, apply_prefix, parse_prefix, prefill_flops
from lmcost.apps.serve_sim import Knobs, simulate
from lmcost.apps.serve_workload import Requests, make_requests, read_requests
from lmcost.apps.setup import resolve_precision
from lmcost.basics.errors import LmcostError
from lmcost.cli import app
from lmcost.cost.engine_step import StepModel
from lmcost.hardware.gpu import load_gpu
from lmcost.model.loading import load_config
from lmcost.operators.workload import Settings

BF16 = resolve_precision("bf16")
#: KV bytes per token of llama-3-8b in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072
LLAMA_KV = 2 * 32 * 8 * 128 * 2
KNOBS = Knobs(max_num_seqs=256, max_num_batched_tokens=4096)


@lru_cache(maxsize=None)
def step_model():
    cfg = load_config("llama-3-8b")
    return StepModel(cfg, load_gpu("h100"), BF16, Settings(logits="last", model="roofline"), max_tokens=4096,
                     max_seqs=256, max_context=4096)


class Prefilled:
    """A step model that counts the prompt tokens its steps prefill (the chunks' new tokens)."""

    def __init__(self, step):
        self.inner, self.prefilled = step, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step_s(self, n_decode, mean_context, chunks=(), n_out=None):
        self.prefilled += sum(c for _, c in chunks)
        return self.inner.step_s(n_decode, mean_context, chunks, n_out)


def sim(arrival, prompt, output, *, ids=None, toks=None, cap=50e9, step=None, knobs=KNOBS, **kw):
    cache = None if ids is None else PrefixCache(ids, toks, knobs.block_size, float(LLAMA_KV))
    return simulate(step or step_model(), knobs, np.asarray(arrival, float), np.asarray(prompt), np.asarray(output),
                    kv_capacity_bytes=cap, kv_per_token_bytes=float(LLAMA_KV), prefix_cache=cache, **kw)


def summary(tr) -> dict:
    return summarize(tr, dp=1, gpus=1, slo_ttft_s=0.2, slo_tpot_s=0.02, offered_rate=None)


# --- metamorphic ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cap_requests", [None, 6])
def test_distinct_ids_are_no_prefix_number_for_number(cap_requests):
    # 60 random requests at 30/s; every request its own id with a random prefix length: nothing can hit,
    # so the run is the plain run, step for step (the requests' blocks move to the cache and back, the bytes
    # the same). Also under a KV cache of ~6 requests admitted whole (TensorRT-LLM's GUARANTEED_NO_EVICT, no
    # preemption: a preempted request would hit its own blocks when admitted again), where the cached blocks
    # are evicted.
    rng = np.random.default_rng(5)
    n = 60
    arr = np.cumsum(rng.exponential(1 / 30, n))
    p, o = rng.integers(50, 600, n), rng.integers(2, 300, n)
    cap = 50e9 if cap_requests is None else cap_requests * (900 + 15) * LLAMA_KV
    knobs = KNOBS if cap_requests is None else Knobs(max_num_seqs=256, max_num_batched_tokens=4096,
                                                     admission="reserve_full", preemption="none")
    plain = sim(arr, p, o, cap=cap, knobs=knobs)
    cached = sim(arr, p, o, ids=np.arange(n), toks=rng.integers(0, p + 1), cap=cap, knobs=knobs)
    if cap_requests:
        assert sum(plain.blocked.values()) > 0 and cached.prefix_cache.evicted > 0
    assert cached.prefix_cache.hit_tokens == 0
    assert summary(cached) == summary(plain)
    assert np.array_equal(cached.kv_timeline, plain.kv_timeline)


def test_caching_off_is_no_prefix():
    # the library's run: --no-prefix-caching over a shared prefix = the same prompts without any prefix
    base = dict(model="llama-3-8b", requests=30, prompt="uniform:100:300", output="64", rate=20.0, seed=2)
    off = run_serve(ServeRequest(**base, prefix="shared:512", prefix_caching=False)).summary
    reqs = apply_prefix(make_requests(30, prompt="uniform:100:300", output="64", rate=20.0, seed=2), "shared:512")
    assert off.pop("prefix_cache") == dict(enabled=False, hit_rate=0.0, hit_tokens=0, saved_prefill_flops=0.0,
                                           evictions=0, peak_cached_bytes=0.0)
    # the same requests without prefix ids: prompts 512 + uniform(100, 300) as a replayed file would give them
    plain = run_serve(ServeRequest(**{**base, "prompt": None, "requests": None, "output": None, "rate": None,
                                      "seed": None}, workload_file=_jsonl(reqs))).summary
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "kv_use", "steps", "throughput"):
        assert off[key] == plain[key], key


def _jsonl(reqs: Requests, prefix: bool = False) -> str:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False)
    for j in range(reqs.n):
        line = dict(arrival_s=float(reqs.arrival_s[j]), prompt_tokens=int(reqs.prompt[j]),
                    output_tokens=int(reqs.output[j]))
        if prefix and reqs.prefix_id[j] >= 0:
            line.update(prefix_id=f"s{reqs.prefix_id[j]}", prefix_tokens=int(reqs.prefix_tokens[j]))
        f.write(json.dumps(line) + "\n")
    f.close()
    return f.name


@pytest.mark.parametrize("block, prompt, saved", [
    (16, 700, 96),   # N = 100: floor(100 / 16) = 6 whole blocks = 96 tokens per hit
    (16, 100, 96),   # prompt = N: the last token is computed, floor(99 / 16) = 6 blocks still
    (16, 97, 96),    # floor(96 / 16) = 6
    (16, 96, 80),    # floor(95 / 16) = 5 blocks: 80 tokens
    (1, 700, 100),   # SGLang's pages of 1 token: the whole prefix
])
def test_a_shared_prefix_saves_whole_blocks_per_hit(block, prompt, saved):
    # a closed loop of one user, 12 requests sharing a 100-token prefix (prompt at least 96 of it): the first
    # prefills its whole prompt, each of the 11 after it `saved` tokens fewer
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=4096, block_size=block)
    n, N = 12, min(100, prompt)
    counting = Prefilled(step_model())
    tr = sim(np.zeros(n), [prompt] * n, [20] * n, ids=[0] * n, toks=[N] * n, step=counting, knobs=knobs,
             concurrency=1)
    assert counting.prefilled == n * prompt - (n - 1) * saved
    assert tr.prefix_cache.hit_tokens == (n - 1) * saved and tr.prefix_cache.asked == n * prompt
    # TTFT: a hit prefills prompt - saved tokens after `saved` cached ones, as the step model costs that chunk
    step = step_model()
    ttft = tr.first_token_s - tr.arrival_s
    assert ttft[0] == pytest.approx(step.step_s(0, 0.0, [(0, prompt)], 1), rel=1e-12)
    assert ttft[1:] == pytest.approx(np.full(n - 1, step.step_s(0, 0.0, [(saved, prompt - saved)], 1)), rel=1e-12)


def test_sessions_hit_the_last_turns_context():
    # sessions:2 of 4 requests (2 sessions, a closed loop of one user so each turn starts after the last):
    # prompts [10, 20, 30, 40] + outputs [5, 6, 7, 8] -> turn 1 of session 0 (request 2) re-sends 10 + 5 = 15
    # tokens then its 30: prompt 45, prefix 15; request 3: 20 + 6 = 26, prompt 66, prefix 26
    reqs = apply_prefix(Requests(np.zeros(4), np.array([10, 20, 30, 40]), np.array([5, 6, 7, 8])), "sessions:2")
    assert reqs.prompt.tolist() == [10, 20, 45, 66] and reqs.prefix_tokens.tolist() == [0, 0, 15, 26]
    assert reqs.prefix_id.tolist() == [0, 1, 0, 1]
    # blocks of 4: request 2 finds session 0's cached context (10 + 5 - 1 = 14 tokens with KV: 3 blocks = 12
    # tokens, within its 15-token prefix and 44 = prompt - 1); request 3: 20 + 6 - 1 = 25 -> 6 blocks = 24
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=4096, block_size=4)
    tr = sim(reqs.arrival_s, reqs.prompt, reqs.output, ids=reqs.prefix_id, toks=reqs.prefix_tokens, knobs=knobs,
             concurrency=1)
    assert tr.prefix_cache.hits == {12: 1, 24: 1}


# --- exact bytes ------------------------------------------------------------------------------------------------

def test_cached_prefix_bytes_are_whole_blocks_counted_once():
    # llama-3-8b, blocks of 16, a 100-token prefix: 6 whole blocks = 96 tokens x 131,072 B = 12,582,912 B,
    # pinned once however many running requests reference it, evictable (not pinned) once none does
    c = PrefixCache([7, 7, 7], [100, 100, 100], 16, float(LLAMA_KV))
    assert c.peek(0, 700) == (0, 0.0)
    assert c.prefilled(0, 700) == 96 and c.pinned_bytes == 12_582_912
    assert c.peek(1, 700) == (96, 0.0)       # already pinned: admitting it pins nothing more
    assert c.admit(1, 700) == 96 and c.pinned_bytes == 12_582_912
    c.release(0, 700 + 50 - 1)
    c.release(1, 700 + 50 - 1)
    assert c.pinned_bytes == 0 and c.evictable_bytes == 12_582_912   # its id's longest prefix is 100: no more
    assert c.peek(2, 700) == (96, 12_582_912)   # a new hit pins the blocks again


def test_running_requests_share_the_prefix_in_the_kv_bytes():
    # a warm-up request (id 0, prefix 100) finishes, then 8 requests of prompt 400 + output 40 arrive at once
    # (prefilled in one step of 3,200 tokens, or 8 x 304 with the cache); with caching each holds its own
    # 400 + 40 - 96 tokens and the 96 cached ones once, so the peak KV (all 8 decoding at their last step,
    # the same contexts either way) is 7 x 96 tokens x 131,072 B = 88,080,384 B lower than without
    cap = 1e9
    arr, p, o = [0.0] + [5.0] * 8, [400] * 9, [2] + [40] * 8
    plain = sim(arr, p, o, cap=cap)
    cached = sim(arr, p, o, ids=[0] * 9, toks=[100] * 9, cap=cap)
    assert cached.prefix_cache.hit_tokens == 8 * 96
    drop = plain.kv_timeline[:, 1].max() - cached.kv_timeline[:, 1].max()
    assert drop * cap == pytest.approx(7 * 96 * LLAMA_KV, rel=1e-9)


def test_saved_flops_are_the_prefills_of_the_hits():
    # llama-3-8b, a hit of 96 tokens: 2 FLOPs per parameter per token over the 32 blocks' 218,112,000 weights
    # (README: parameters per block) = 2 x 96 x 6,979,584,000 = 1.3401e12, plus the causal attention's
    # QK^T and PV, 2 x 2 x 32 layers x 32 heads x 128 x 96 x 97 / 2 pairs = 2.44e9, and norms: within 1%.
    # Not the lm_head (the last token is still computed: 2 x 4096 x 128,256 = 1.05e9 per token)
    hand = 2 * 96 * 32 * 218_112_000 + 4 * 32 * 32 * 128 * 96 * 97 / 2
    cfg = load_config("llama-3-8b")
    assert prefill_flops(cfg, BF16, None, 96) == pytest.approx(hand, rel=1e-2)


# --- eviction ---------------------------------------------------------------------------------------------------

def test_eviction_is_least_recently_used():
    # three ids of 2 blocks each cached, then unreferenced, used in the order 0, 1, 2, then 0 again: room for
    # 4 blocks evicts id 1's 2 (the least recently used), room for 1 more evicts id 2's and one of id 0's
    c = PrefixCache([0, 1, 2, 0], [32, 32, 32, 32], 16, 1.0)
    for i in range(3):
        c.prefilled(i, 40)
        c.release(i)
    c.admit(3, 40)
    c.release(3)
    assert c.evictable_bytes == 6 * 16
    c.evict(4 * 16)
    assert c.chain == {0: 2, 2: 2} and c.evicted == 2
    c.evict(1 * 16)
    assert c.chain == {0: 1} and c.evicted == 5


def test_a_tiny_cache_evicts_the_least_recently_used_prefix():
    # one user; prompts of 700 tokens, 20 out, prefixes of 512 (32 blocks of 16); a KV cache of 1,300 tokens.
    # Two cached prefixes (1,024 tokens) fit beside a request that hits one (223 own tokens with a block's
    # slack + 512 pinned); a request of a third id does not: admitted, it holds 15 + 701 tokens (its block's
    # slack, its prompt and first token), leaving 584 of the 1,024 cached: 440 tokens = 28 blocks evicted, from
    # the least recently used id, tail first; at its last step 700 + 19 + 15 = 734, leaving 566: 29 (the
    # decodes' growth evicts at the end of their closed-form run). Ids in the order 0, 1, 0, 2, 0: id 1's
    # blocks go (0 was used after it) and the last 0 hits all 512 tokens, as the second did. In the order
    # 0, 1, 2, 0: id 0's go, 3 or 4 of its blocks left: the last 0 hits 48 or 64.
    cap = 1300 * LLAMA_KV
    for order, hits in (([0, 1, 0, 2, 0], ({512: 2},)), ([0, 1, 2, 0], ({48: 1}, {64: 1}))):
        n = len(order)
        tr = sim(np.zeros(n), [700] * n, [20] * n, ids=order, toks=[512] * n, cap=cap, concurrency=1)
        assert dict(tr.prefix_cache.hits) in hits, order
        if len(order) == 5:  # the last request's 512-token hit leaves room for what is left (3-4 + 32 blocks)
            assert 28 <= tr.prefix_cache.evicted <= 29
        assert (tr.kv_timeline[:, 1] <= 1.0).all()


# --- workloads and the JSON -------------------------------------------------------------------------------------

def test_prefix_workloads():
    base = make_requests(50, prompt="uniform:10:20", output="8", rate=5.0, seed=3)
    shared = apply_prefix(base, "shared:1k")
    assert (shared.prompt == base.prompt + 1024).all() and (shared.prefix_tokens == 1024).all()
    assert (shared.arrival_s == base.arrival_s).all() and (shared.prefix_id == 0).all()
    groups = apply_prefix(base, "groups:3:64", seed=3)
    assert set(groups.prefix_id.tolist()) == {0, 1, 2} and (groups.prompt == base.prompt + 64).all()
    assert parse_prefix("sessions:4") == ("sessions", 4)
    for bad in ("shared", "shared:0", "groups:3", "sessions:2:3", "radix:4", "shared:1e3"):
        with pytest.raises(LmcostError) as e:
            parse_prefix(bad)
        assert e.value.field == "workload.prefix"


def test_a_jsonl_names_prefixes(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 5, "prefix_id": "sys", "prefix_tokens": 64}\n'
                 '{"arrival_s": 1, "prompt_tokens": 100, "output_tokens": 5}\n'
                 '{"arrival_s": 2, "prompt_tokens": 90, "output_tokens": 5, "prefix_id": 3, "prefix_tokens": 90}\n'
                 '{"arrival_s": 3, "prompt_tokens": 80, "output_tokens": 5, "prefix_id": "sys", "prefix_tokens": 64}\n')
    r = read_requests(f)
    assert r.prefix_id.tolist() == [0, -1, 1, 0] and r.prefix_tokens.tolist() == [64, 0, 90, 64]
    plain = tmp_path / "p.jsonl"
    plain.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 5}\n')
    assert read_requests(plain).prefix_id is None
    for line, key in (('"prefix_id": "a"', "prefix_tokens"), ('"prefix_tokens": 3', "prefix_id"),
                      ('"prefix_id": "a", "prefix_tokens": 101', "prefix_tokens"),
                      ('"prefix_id": -2, "prefix_tokens": 1', "prefix_id")):
        f.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 5, ' + line + '}\n')
        with pytest.raises(LmcostError) as e:
            read_requests(f)
        assert e.value.field.endswith(f"line 1: {key}"), e.value.field


def test_json_and_the_line():
    # a closed loop of one user, 10 requests of a 600-token system prompt + 100 own tokens: 9 hits of 592
    # tokens (37 blocks of 16) of 10 x 700 asked: hit rate 5,328 / 7,000; peak cached 37 x 16 x 131,072 B
    r = CliRunner().invoke(app, ["serve", "llama-3-8b", "--requests", "10", "--concurrency", "1", "--prompt", "100",
                                 "--output", "16", "--prefix", "shared:600", "--json"])
    assert r.exit_code == 0, r.stderr
    pc = json.loads(r.stdout)["prefix_cache"]
    assert pc["enabled"] and pc["hit_tokens"] == 9 * 592 and pc["hit_rate"] == pytest.approx(5328 / 7000, rel=1e-12)
    assert pc["peak_cached_bytes"] == 37 * 16 * LLAMA_KV and pc["evictions"] == 0
    human = CliRunner().invoke(app, ["serve", "tiny-gqa", "--requests", "10", "--concurrency", "1", "--prompt", "100",
                                     "--output", "16", "--prefix", "shared:600"])
    assert "prefix cache: on, hit rate" in human.stdout


@pytest.mark.parametrize("args, flag", [
    (["--prefix-caching"], "--prefix-caching"),                   # no prefixes in the workload
    (["--prefix", "groups:0:10"], "--prefix"),
    (["--prefix", ""], "--prefix"),
    (["--prefix", "sessions:3", "--rates", "1,2", "--prompt", "2147483000"], "--prompt"),
])
def test_bad_prefix_inputs_are_one_line(args, flag):
    r = CliRunner().invoke(app, ["serve", "tiny-gqa", "--requests", "20", *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag}: "), r.stderr


def test_a_workload_file_takes_no_prefix_spec(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 20}\n')
    r = CliRunner().invoke(app, ["serve", "tiny-gqa", "--workload", str(f), "--prefix", "shared:10"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --prefix: has no effect with --workload"), r.stderr


# --- KV offload -------------------------------------------------------------------------------------------------

def test_an_offload_tier_of_nothing_is_no_offload():
    # the LRU case below, under the same tiny cache, with a host tier of 0 bytes: evicted blocks go nowhere,
    # the run is the run without a tier, number for number
    cap, order = 1300 * LLAMA_KV, [0, 1, 2, 0]
    n = len(order)
    args = (np.zeros(n), [700] * n, [20] * n)
    plain = simulate(step_model(), KNOBS, *map(np.asarray, args), kv_capacity_bytes=cap,
                     kv_per_token_bytes=float(LLAMA_KV), concurrency=1,
                     prefix_cache=PrefixCache(order, [512] * n, 16, float(LLAMA_KV)))
    none = simulate(step_model(), KNOBS, *map(np.asarray, args), kv_capacity_bytes=cap,
                    kv_per_token_bytes=float(LLAMA_KV), concurrency=1,
                    prefix_cache=PrefixCache(order, [512] * n, 16, float(LLAMA_KV), (0, 64e9)))
    assert plain.prefix_cache.evicted > 0 and none.prefix_cache.stored == 0
    assert summary(none) == summary(plain)


def test_offloaded_blocks_load_back_at_the_links_rate():
    # ids 0, 1, 2, 0 under the tiny cache: id 0's evicted tail (the hits of 48 or 64 tokens show 29 or 28 of
    # its 32 blocks gone) moves to a 1 GiB host tier and the last request loads it back: a hit of all 512
    # tokens, the host's blocks x 16 x 131,072 B at 64 GB/s charged in its first prefill step:
    # 29 blocks = 60,817,408 B in 950.3 us
    cap, order = 1300 * LLAMA_KV, [0, 1, 2, 0]
    n = len(order)
    counting = Prefilled(step_model())
    tr = sim(np.zeros(n), [700] * n, [20] * n, step=counting, cap=cap, concurrency=1)
    off = simulate(step_model(), KNOBS, np.zeros(n), np.full(n, 700), np.full(n, 20), kv_capacity_bytes=cap,
                   kv_per_token_bytes=float(LLAMA_KV), concurrency=1,
                   prefix_cache=PrefixCache(order, [512] * n, 16, float(LLAMA_KV), (2**30, 64e9)))
    c = off.prefix_cache
    assert dict(c.hits) == {512: 1}
    loaded = c.loaded
    assert loaded in (28, 29) and c.load_s == pytest.approx(loaded * 16 * LLAMA_KV / 64e9, rel=1e-12)
    # its TTFT: the load, then a prefill of 700 - 512 tokens after 512 cached ones
    ttft = off.first_token_s[3] - off.arrival_s[3]
    step = step_model()
    assert ttft == pytest.approx(c.load_s + step.step_s(0, 0.0, [(512, 188)], 1), rel=1e-12)
    assert tr.first_token_s[3] - tr.arrival_s[3] > ttft  # without any cache it prefills 700


@pytest.mark.parametrize("spec, want", [("cpu:256G", (256 * 2**30, 64e9)), ("cpu:1", (1, 64e9)),
                                        ("cpu:1TiB:50", (2**40, 50e9))])
def test_offload_specs(spec, want):
    from lmcost.apps.serve_prefix import parse_offload

    assert parse_offload(spec) == want


@pytest.mark.parametrize("args, flag", [
    (["--kv-offload", "cpu:64GB"], "--kv-offload"),
    (["--kv-offload", "gpu:1G"], "--kv-offload"),
    (["--kv-offload", "cpu:1G"], "--kv-offload"),                                   # no prefixes
    (["--kv-offload", "cpu:1G", "--prefix", "shared:64", "--no-prefix-caching"], "--kv-offload"),
])
def test_bad_offload_inputs_are_one_line(args, flag):
    r = CliRunner().invoke(app, ["serve", "tiny-gqa", "--requests", "20", *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {flag}: "), r.stderr
