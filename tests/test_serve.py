"""The serving engine simulation (issue 27): the step-time model against ``estimate``'s phases, and the
scheduler's metamorphic relations (what must hold whatever the engine's numbers: rate -> 0, offline batches,
the knee, closed loops, KV pressure, mixing, overheads) and invariants on random workloads.

Oracles: :class:`lmcost.cost.phases.PhaseCost` of the decode and prefill phase graphs (``estimate``'s
numbers) and :func:`lmcost.cost.serving.serving_point` (the static batch); the rest worked by hand in the
comments. Every step model is small (tables to 4,096 tokens and contexts): each test well under 2 s.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from lmcost.apps.serve import summarize
from lmcost.apps.serve_sim import Knobs, simulate
from lmcost.apps.setup import resolve_precision
from lmcost.cost.compile import phase_graph
from lmcost.cost.engine_step import StepModel
from lmcost.cost.phases import PhaseCost
from lmcost.cost.serving import serving_point
from lmcost.hardware.gpu import load_gpu
from lmcost.model.loading import load_config
from lmcost.operators.workload import Settings

BF16 = resolve_precision("bf16")
H100 = load_gpu("h100")
#: KV bytes per token of llama-3-8b in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes
LLAMA_KV = 2 * 32 * 8 * 128 * 2
ROOM = 50e9  # a cache that holds every request of these tests (380k tokens of llama-3-8b)


@lru_cache(maxsize=None)
def model(name: str, time_model: str) -> tuple:
    """(config, settings, step model) of ``name`` on an H100 in bf16, tables to 4,096 tokens, 256
    sequences and 4,096 positions."""
    cfg, s = load_config(name), Settings(logits="last", model=time_model)
    return cfg, s, StepModel(cfg, H100, BF16, s, max_tokens=4096, max_seqs=256, max_context=4096)


def run(step, knobs, arrival, prompt, output, cap=ROOM, **kw):
    return simulate(step, knobs, np.asarray(arrival, float), np.asarray(prompt), np.asarray(output),
                    kv_capacity_bytes=cap, kv_per_token_bytes=float(LLAMA_KV), **kw)


class Counting:
    """A step model that counts the tokens its steps sample from finished prefills (``n_out`` less the
    decodes: a closed-form decode run never holds a prefill, so every one goes through ``step_s``)."""

    def __init__(self, step):
        self.inner, self.sampled = step, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def step_s(self, n_decode, mean_context, chunks=(), n_out=None):
        self.sampled += n_out - n_decode
        return self.inner.step_s(n_decode, mean_context, chunks, n_out)


def tokens_out(counting: Counting, tr) -> int:
    """Tokens generated in a run: one per sequence of every decode step (the ITL segments: k steps of n
    sequences) plus one per finished prefill."""
    seg = tr.itl_segments
    return int(round(float((seg[:, 2] * seg[:, 3]).sum()))) + counting.sampled


# --- the step model against estimate's phases ----------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny-gqa", "llama-3-8b"])
@pytest.mark.parametrize("time_model", ["roofline", "calibrated"])
def test_decode_step_is_estimates(name, time_model):
    # a pure decode step is estimate's decode phase at batch n, context c: exactly (to rounding) on the
    # tabulated grid (every n to 64, every c to 256, then 5% in n and 2% in c), bilinear between its nodes.
    # Between them, 257.5 and 513.5: past a step of the calibrated split decode kernel's occupancy
    # (ceil(c / 256) splits on an H100), 0.5% off before the grid held both sides of each step.
    cfg, s, step = model(name, time_model)
    dec = phase_graph(cfg, BF16, "decode", s)

    def rel(n, c):
        ref = PhaseCost(dec.at(n, c), H100, BF16, "decode", time_model).time_s()
        return abs(step.step_s(n, c) / ref - 1)

    on = [(n, c) for n in (1, 7, 64, step._n[70]) for c in (1, 200, step._c[300])]
    assert all(n in step._n and c in step._c for n, c in on)
    assert max(rel(n, c) for n, c in on) < 1e-12
    off = [(n, c) for n in (1, 3, 100, 250) for c in (257.5, 513.5, 1000.5, 3001.5)]
    assert 100 not in step._n and 250 not in step._n
    assert max(rel(n, c) for n, c in off) < 1e-3


@pytest.mark.parametrize("time_model", ["roofline", "calibrated"])
def test_whole_prompt_chunk_is_prefill(time_model):
    # One chunk of a whole prompt of s tokens is the prefill phase to ~3e-4, not exactly: its per-token
    # operators are costed from the decode graph at batch s (the step's tokens flattened, as an engine runs
    # them), where the prefill graph has one sequence of s. They differ in RoPE: the prefill reads the cos/sin
    # table of s positions (s x d_h x 2 x 2 bytes more per layer: 512,000 B at s = 1000), a decode batch that
    # of one position its sequences share. On tiny-gqa (d = 64) that table weighs 5e-3 of the prefill.
    cfg, s, step = model("llama-3-8b", time_model)
    pre = phase_graph(cfg, BF16, "prefill", s)
    for n in (16, 1000, 4096):
        ref = PhaseCost(pre.at(1, n), H100, BF16, "prefill", time_model).time_s()
        assert step.step_s(0, 0, [(0, n)], 1) == pytest.approx(ref, rel=1e-3)


def test_chunks_telescope():
    # A prompt prefilled as chunks (0, a) then (a, b) attends to the same causal pairs as one chunk of a+b:
    # with S(k) = k(k+1)/2 the pairs of the first k queries, chunk 2's queries a+1..a+b see
    # sum_{q=a+1}^{a+b} q = S(a+b) - S(a) keys; a = 300, b = 200: 45,150 + 80,100 = 125,250 = S(500).
    # The step model's chunk attention is the difference of the prefill phase's attention (its sdpa FLOPs
    # 4 h d_h S(k) per layer: checked here, h = 32, d_h = 128) at the chunk's end and start.
    cfg, s, step = model("llama-3-8b", "roofline")
    pre = phase_graph(cfg, BF16, "prefill", s)
    rec = pre.at(1, 500)
    sdpa = rec.cols.flops[list(pre.names).index("layers.attn.sdpa")]
    assert sdpa == 4 * 32 * 128 * 125_250
    a, b = 300, 200
    attn = [step.step_s(0, 0, [(p, c)], 0) - step.tokens(c) for p, c in ((0, a), (a, b), (0, a + b))]
    assert attn[0] + attn[1] == pytest.approx(attn[2], rel=1e-12)
    ctx = [i for i, nm in enumerate(pre.names) if nm in ("layers.attn.sdpa", "layers.attn.softmax")]
    cost = PhaseCost(rec, H100, BF16, "prefill", "roofline")
    assert attn[2] == pytest.approx(cost.total_of(ctx, "roofline_s"), rel=1e-12)


# --- metamorphic relations of the scheduler ------------------------------------------------------------


@pytest.mark.parametrize("time_model", ["roofline", "calibrated"])
def test_rate_to_zero_is_one_prefill_and_decode(time_model):
    # requests 1,000 s apart each run alone: TTFT one prefill, TPOT the mean decode step of batch 1
    cfg, s, step = model("llama-3-8b", time_model)
    sp = serving_point(cfg, H100, BF16, s, batch=1, isl=1000, osl=200)
    tr = run(step, Knobs(max_num_seqs=256, max_num_batched_tokens=4096), [0, 1000, 2000], [1000] * 3, [200] * 3)
    assert tr.first_token_s - tr.arrival_s == pytest.approx(np.full(3, sp.ttft_s), rel=1e-3)
    assert (tr.finish_s - tr.first_token_s) / 199 == pytest.approx(np.full(3, sp.tpot_s), rel=1e-3)
    # the closed-form decode run is the sum of its 199 steps, at contexts 1001..1199, to rounding
    steps = sum(step.step_s(1, c) for c in range(1001, 1200))
    assert tr.finish_s - tr.first_token_s == pytest.approx(np.full(3, steps), rel=1e-12)


def test_run_into_last_cell():
    # a step model tabulated to the requests' last context (as `lmcost serve` builds it): the decode run
    # reaches the grid's last cell, whose line carries on, and is still the sum of its steps
    cfg, s = load_config("llama-3-8b"), Settings(logits="last", model="calibrated")
    step = StepModel(cfg, H100, BF16, s, max_tokens=2048, max_seqs=4, max_context=1200)
    tr = run(step, Knobs(max_num_seqs=4, max_num_batched_tokens=2048), [0, 100], [1000] * 2, [200] * 2)
    steps = sum(step.step_s(1, c) for c in range(1001, 1200))
    assert tr.finish_s - tr.first_token_s == pytest.approx(np.full(2, steps), rel=1e-12)


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_offline_batch_is_static_batch(batch):
    # chunking off, a budget of the whole batch's prompts, max_num_seqs = B: one prefill step of all B, then
    # osl - 1 decode steps of B together, the static batch of serving_point. Roofline: under the calibrated
    # model B chunks in one step pay B attention kernels' fixed cost (the step model sums each chunk's
    # prefill attention at batch 1) where the prefill phase pays one: TTFT +0.7% at B = 8 (see the report).
    cfg, s, step = model("llama-3-8b", "roofline")
    isl, osl = 128, 64
    sp = serving_point(cfg, H100, BF16, s, batch=batch, isl=isl, osl=osl)
    knobs = Knobs(max_num_seqs=batch, max_num_batched_tokens=4096, chunked_prefill=False)
    tr = run(step, knobs, np.zeros(batch), [isl] * batch, [osl] * batch)
    assert batch * osl / tr.finish_s.max() == pytest.approx(sp.tokens_per_s, rel=1e-3)
    assert tr.steps == osl  # one prefill step, osl - 1 decode steps


def test_knee():
    # 1000 + 200 tokens on llama-3-8b: the engine serves ~22 requests/s at most (~95 tokens per step of
    # ~45 ms). Below it the served rate follows the offered one; past it the served rate stays at the
    # engine's mu whatever is offered and the queue grows: with arrivals every 1/lambda, request i waits
    # about i (1/mu - 1/lambda), so p50 TTFT grows by (1/mu - 1/lambda) / 2 per request of the run.
    _, _, step = model("llama-3-8b", "calibrated")
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=4096)

    def served(rate, n):
        arr = np.arange(n) / rate
        su = summarize(run(step, knobs, arr, [1000] * n, [200] * n), dp=1, gpus=1, slo_ttft_s=None,
                       slo_tpot_s=None, offered_rate=rate)
        return su["throughput"]["requests_per_s"], su["ttft_s"]["p50"], su["saturated"]

    low = [served(r, 500) for r in (2, 5, 10)]
    assert [x[0] for x in low] == pytest.approx([2, 5, 10], rel=0.1)
    assert all(x[2] is None for x in low)
    (mu40, ttft1, sat), (mu40b, ttft2, _) = served(40, 1000), served(40, 2000)
    mu80 = served(80, 1000)[0]
    assert sat is not None and mu40 < 0.7 * 40
    assert mu80 == pytest.approx(mu40, rel=0.05)
    assert (ttft2 - ttft1) / 1000 == pytest.approx((1 / mu40b - 1 / 40) / 2, rel=0.1)


def test_closed_loop_of_one():
    # one user: each request enters as the last finishes, alone: TTFT one prefill, every time
    cfg, s, step = model("llama-3-8b", "calibrated")
    sp = serving_point(cfg, H100, BF16, s, batch=1, isl=700, osl=50)
    tr = run(step, Knobs(max_num_seqs=256, max_num_batched_tokens=4096), np.zeros(20), [700] * 20, [50] * 20,
             concurrency=1)
    assert tr.first_token_s - tr.arrival_s == pytest.approx(np.full(20, sp.ttft_s), rel=1e-3)
    assert tr.arrival_s[1:] == pytest.approx(tr.finish_s[:-1], rel=1e-15)


@pytest.mark.parametrize("admission", ["on_demand", "reserve_full"])
def test_small_cache(admission):
    # 16 requests of 200 + 300 tokens, all at once, into a cache of 3 whole requests (3 x 515 tokens with a
    # block's slack): on demand admits 7 prompts (215 tokens each), whose decodes outgrow it: preemptions;
    # reserving each request's prompt + output admits 3 at a time and never preempts. Either way every
    # request finishes with its 300 tokens (summed: 4,800).
    _, _, step = model("llama-3-8b", "roofline")
    cap = 3 * (500 + 15) * LLAMA_KV
    counting = Counting(step)
    knobs = Knobs(max_num_seqs=256, max_num_batched_tokens=4096, admission=admission)
    tr = run(counting, knobs, np.zeros(16), [200] * 16, [300] * 16, cap=cap)
    assert np.isfinite(tr.finish_s).all()
    assert tokens_out(counting, tr) == 16 * 300
    if admission == "on_demand":
        assert tr.preemptions.sum() > 0
    else:
        assert tr.preemptions.sum() == 0
        assert tr.kv_timeline[:, 3].max() == 3


def test_unmixed_engine_stalls_decodes():
    # SGLang's default runs a prefill step alone while decodes wait: their gap spans a prefill step and a
    # decode step, where a mixed engine's spans one mixed step
    _, _, step = model("llama-3-8b", "calibrated")
    arr = np.arange(300) / 10.0
    p99 = []
    for mixed in (True, False):
        tr = run(step, Knobs(max_num_seqs=256, max_num_batched_tokens=4096, mixed_batches=mixed), arr,
                 [1000] * 300, [200] * 300)
        p99.append(summarize(tr, dp=1, gpus=1, slo_ttft_s=None, slo_tpot_s=None, offered_rate=10)["itl_s"]["p99"])
    assert p99[1] > 1.2 * p99[0]


def test_overheads_per_step():
    # 4 requests at once, prompt 256, output 51: one prefill step of 4 chunks, then 50 decode steps of 4.
    # A step overhead o and a per-sequence one q add o + 4q to every step: TTFT by o + 4q, and the
    # decode (finish - first token) by 50 (o + 4q) = 50 (1e-4 + 4 x 2e-5) = 9e-3 s.
    _, _, step = model("llama-3-8b", "calibrated")
    base = dict(max_num_seqs=256, max_num_batched_tokens=4096)
    a, b = (run(step, Knobs(**base, **kw), np.zeros(4), [256] * 4, [51] * 4)
            for kw in ({}, dict(step_overhead_s=1e-4, seq_overhead_s=2e-5)))
    assert b.first_token_s - a.first_token_s == pytest.approx(np.full(4, 1.8e-4), rel=1e-9)
    dec_a, dec_b = a.finish_s - a.first_token_s, b.finish_s - b.first_token_s
    assert dec_b - dec_a == pytest.approx(np.full(4, 9e-3), rel=1e-9)


# --- invariants on random workloads --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_workload_invariants(seed):
    # Poisson arrivals, random lengths and knobs, a cache that may run short. Roofline: its step time grows
    # with every count (max of FLOPs and bytes over peaks), so no step is shorter than the one request's
    # decode alone at its first context (the calibrated model's GEMM waves are not monotone).
    rng = np.random.default_rng(seed)
    _, _, step = model("llama-3-8b", "roofline")
    n = 150
    arr = np.cumsum(rng.exponential(1 / rng.uniform(2, 40), n))
    prompt, output = rng.integers(1, 2000, n), rng.integers(1, 300, n)
    knobs = Knobs(max_num_seqs=int(rng.integers(4, 64)), max_num_batched_tokens=int(rng.integers(2048, 4097)),
                  chunked_prefill=bool(rng.integers(2)), mixed_batches=bool(rng.integers(2)),
                  admission=("on_demand", "reserve_full")[rng.integers(2)])
    cap = rng.uniform(1, 20) * 2300 * LLAMA_KV
    counting = Counting(step)
    tr = run(counting, knobs, arr, prompt, output, cap=cap)
    assert (tr.admitted_s >= tr.arrival_s).all()
    assert (tr.first_token_s >= tr.admitted_s).all()
    assert (tr.finish_s >= tr.first_token_s).all()
    multi = output > 1
    tpot = (tr.finish_s - tr.first_token_s)[multi] / (output[multi] - 1)
    alone = np.array([step.step_s(1, p + 1) for p in prompt[multi]])
    assert (tpot >= alone * (1 - 1e-12)).all()
    assert tokens_out(counting, tr) == output.sum()


def test_kv_cache_never_over_capacity_under_pressure():
    # A cache for ~6 requests of 1,000 + 400 tokens and 40 of them offline: admission keeps room for every
    # prompt being prefilled and its first token, decodes preempt the newest when a block is missing, so the
    # cache in use never passes its capacity (the fresh-user pass saw 100.94% before prompts in flight were
    # counted), and every request still finishes with its tokens.
    _, _, step = model("llama-3-8b", "roofline")
    per_token = 131072.0
    cap = per_token * (6 * 1400 + 6 * 15)
    knobs = Knobs(max_num_seqs=64, max_num_batched_tokens=2048)
    n = 40
    tr = simulate(step, knobs, np.zeros(n), np.full(n, 1000), np.full(n, 400), kv_capacity_bytes=cap,
                  kv_per_token_bytes=per_token)
    assert tr.preemptions.sum() > 0
    assert tr.kv_timeline[:, 1].max() <= 1.0 + 1e-12
    assert np.isfinite(tr.finish_s).all()
