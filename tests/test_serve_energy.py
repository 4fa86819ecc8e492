"""Energy and cost of a serving run (issue 28, lmcost.cost.energy): metamorphic relations (a price doubled
doubles every cost; a cap at or above the TDP changes nothing; an engine idle half the time adds exactly
idle power x idle time; dp replicas add joules and GPUs, not J/token; the meter sums the closed-form decode
runs as the steps one by one), one J/token worked by hand, and the refusals of bad inputs.

Power figures: the H100 SXM YAML's (TDP 700 W; priors idle 0.1 and memory-bound 0.6 of it: 70 W, 420 W).
Each run is llama-3-8b on one H100, a few requests: well under a second each.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.apps.serve_sim import Knobs, simulate
from lmcost.basics.errors import LmcostError
from lmcost.cli import app
from lmcost.cost.energy import Metered, ServePower, serve_power
from lmcost.hardware.gpu import load_gpu

BASE = dict(model="llama-3-8b", gpu="h100", requests=8, prompt="512", output="64")


def serve(**kw) -> dict:
    return run_serve(ServeRequest(**(BASE | kw))).summary


def test_price_doubled_doubles_every_cost():
    one, two = serve(usd_per_gpu_hour=2.0)["cost"], serve(usd_per_gpu_hour=4.0)["cost"]
    assert two["gpu_hours"] == one["gpu_hours"]
    for k in ("usd", "usd_per_mtok_input", "usd_per_mtok_output", "usd_per_mtok", "usd_per_request"):
        assert two[k] == pytest.approx(2 * one[k], rel=1e-12), k
    # and by hand: GPU-hours x price over the tokens (8 x 512 in, 8 x 64 out), the input/output split by the
    # prefill share of the GPU work
    s = serve(usd_per_gpu_hour=2.0)
    usd = s["span_s"] / 3600 * 2.0
    assert one["usd_per_mtok"] == pytest.approx(usd / (8 * 576) * 1e6, rel=1e-12)
    assert one["usd_per_mtok_input"] == pytest.approx(usd * s["energy"]["prefill_share"] / (8 * 512) * 1e6, rel=1e-12)
    assert one["usd_per_mtok_output"] == pytest.approx(usd * (1 - s["energy"]["prefill_share"]) / (8 * 64) * 1e6,
                                                       rel=1e-12)


def test_no_price_no_cost_and_energy_always():
    s = serve()
    assert "cost" not in s and s["energy"]["j_per_token"] > 0


@pytest.mark.parametrize("cap", [700.0, 1000.0])
def test_cap_at_or_above_tdp_changes_nothing(cap):
    free, capped = serve(rate=20.0), serve(rate=20.0, power_limit=cap)
    assert capped["energy"].pop("power_limit_w") == cap
    free["energy"].pop("power_limit_w")
    assert capped == free


def test_cap_below_tdp_slows_compute_and_caps_power():
    # 500 W of 700: the clock (500/700)^(1/3) = 0.8939 of the sustained one; compute-bound time / 0.8939,
    # memory-bound time kept: an offline batch (prefill compute-bound) takes longer, but by less than 1/0.8939
    free, capped = serve(), serve(power_limit=500.0)
    assert capped["energy"]["clock"] == pytest.approx((500 / 700) ** (1 / 3), rel=1e-12)
    assert capped["energy"]["power_w"] == dict(idle=70.0, memory_bound=420.0, compute_bound=500.0)
    ratio = capped["span_s"] / free["span_s"]
    assert 1.0 < ratio < 700 ** (1 / 3) / 500 ** (1 / 3)


def _jsonl(path, arrivals, prompt=512, output=64):
    path.write_text("".join(json.dumps(dict(arrival_s=a, prompt_tokens=prompt, output_tokens=output)) + "\n"
                            for a in arrivals))
    return str(path)


def test_idle_half_the_time_adds_idle_power_times_idle_time(tmp_path):
    # one batch of 8 at t = 0 (span s), then the same batch again at t = 3 s: the engine is empty when it
    # arrives, so it runs alike; busy 2 s, idle 2 s (half): joules = 2 x one batch's + 70 W x 2 s
    one = run_serve(ServeRequest(model="llama-3-8b", gpu="h100", workload_file=_jsonl(tmp_path / "a.jsonl", [0.0] * 8)))
    a = one.summary
    s = a["span_s"]
    two = run_serve(ServeRequest(model="llama-3-8b", gpu="h100",
                                 workload_file=_jsonl(tmp_path / "b.jsonl", [0.0] * 8 + [3 * s] * 8))).summary
    assert two["span_s"] == pytest.approx(4 * s, rel=1e-12)
    assert two["busy_fraction"] == pytest.approx(0.5, rel=1e-9)
    assert two["energy"]["joules"] == pytest.approx(2 * a["energy"]["joules"] + 70.0 * 2 * s, rel=1e-9)


def test_dp_replicas_add_joules_not_j_per_token():
    # dp 2 with twice the requests: each replica serves the same 8 as dp 1's one
    one, two = run_serve(ServeRequest(**BASE)), run_serve(ServeRequest(**(BASE | dict(requests=16, dp=2))))
    assert two.setup.settings.layout.gpus == 2 * one.setup.settings.layout.gpus
    e1, e2 = one.summary["energy"], two.summary["energy"]
    assert e2["joules"] == pytest.approx(2 * e1["joules"], rel=1e-12)
    for k in ("j_per_token", "j_per_input_token", "j_per_output_token", "j_per_request", "mean_power_w"):
        assert e2[k] == pytest.approx(e1[k], rel=1e-12), k


def test_decode_only_j_per_token_by_hand():
    # One request, a 1-token prompt and 64 output tokens, on the roofline (no CPU overheads): 64 steps of
    # batch 1, every operator memory-bound (a GEMV does ~1 FLOP per byte against the H100's 295; only the
    # attention over 1-2 tokens has a compute-bound part, under 1e-6 of the time), the engine never idle.
    # So every second is at the memory-bound power, 0.6 x 700 = 420 W, and J/token = 420 W x span / 64.
    s = serve(requests=1, prompt="1", output="64", time_model="roofline")
    e = s["energy"]
    assert s["busy_fraction"] == pytest.approx(1.0, rel=1e-12)
    assert e["mean_power_w"] == pytest.approx(420.0, rel=1e-6)
    assert e["j_per_token"] == pytest.approx(420.0 * s["span_s"] / 64, rel=1e-6)
    assert e["j_per_request"] == pytest.approx(420.0 * s["span_s"], rel=1e-6)


def test_meter_sums_every_step_closed_form_runs_included():
    # With 1 W for every group, no idle floor and no CPU overhead (the roofline), a run's excess joules are
    # its busy time, to rounding: the closed-form decode runs (the simulation sums their
    # time as arithmetic series) are summed by the meter as the steps one by one are. A run without the meter's
    # report of its closed-form runs would fall short of the busy time by those runs' share (most of it here).
    from lmcost.apps.setup import resolve_precision
    from lmcost.cost.engine_step import StepModel
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings

    step = StepModel(load_config("llama-3-8b"), load_gpu("h100"), resolve_precision("bf16"),
                     Settings(logits="last", model="roofline"), max_tokens=2048, max_seqs=64, max_context=2048)
    watt = ServePower(idle_w=0.0, memory_w=1.0, compute_w=1.0, tdp_w=700.0, power_limit_w=None, clock=1.0)
    rng = np.random.default_rng(0)
    n = 40
    meter = Metered(step, watt)
    tr = simulate(meter, Knobs(max_num_seqs=16, max_num_batched_tokens=2048),
                  np.sort(rng.uniform(0, 2, n)), rng.integers(10, 600, n), rng.integers(2, 300, n),
                  kv_capacity_bytes=50e9, kv_per_token_bytes=131072.0)
    floor = sum(float(np.sum(v)) for g, v in step.tokens.parts.items() if g == "floor")
    assert floor == 0.0  # no op at the kernel floor here, so every GPU second is at 1 W
    assert meter.excess_j == pytest.approx(tr.busy_s, rel=1e-9)
    assert 0 < meter.prefill_s < tr.busy_s and meter.prefill_j == pytest.approx(meter.prefill_s, rel=1e-9)
    closed = tr.itl_segments[tr.itl_segments[:, 2] >= 2]
    assert closed[:, 2].sum() > tr.steps / 2  # most steps ran in closed-form runs


def test_meter_fast_path_is_the_generic_sums_bit_for_bit():
    # The oracle is the meter's generic path (step_s, decode_run and decode_attention as for any step model):
    # on a plain StepModel the meter reads each table once for the time and the joules, notes the joules'
    # decode attention at the points the simulation reads, and takes a run's cells from the simulation
    # (reports/serve-speed.md). Exactness, not closeness: every figure equal to the last bit, under a cap
    # (clocked compute, joules weighted apart from the times), with chunked prefills and closed-form runs,
    # and decode_attention_pair equal to each model's decode_attention on and off the grid (n = 0, past it).
    from lmcost.apps.setup import resolve_precision
    from lmcost.cost.energy import clocked
    from lmcost.cost.engine_step import StepModel
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings

    gpu = load_gpu("h100")
    power = serve_power(gpu, 500.0)
    step = clocked(StepModel(load_config("llama-3-8b"), gpu, resolve_precision("bf16"),
                             Settings(logits="last", model="calibrated"), max_tokens=2048, max_seqs=64,
                             max_context=2048), power)
    rng = np.random.default_rng(1)
    n = 120
    args = (Knobs(max_num_seqs=32, max_num_batched_tokens=1024), np.sort(rng.uniform(0, 6, n)),
            rng.integers(10, 1500, n), rng.integers(1, 400, n))
    fast, slow = Metered(step, power), Metered(step, power)
    del slow.step_s, slow.decode_attention  # the class's generic methods and the step model's own lookup
    a, b = (simulate(m, *args, kv_capacity_bytes=4e9, kv_per_token_bytes=131072.0) for m in (fast, slow))
    assert np.array_equal(a.finish_s, b.finish_s) and a.steps == b.steps
    assert (a.itl_segments[:, 2] >= 2).sum() > 10  # closed-form runs were metered
    assert (fast.excess_j, fast.prefill_s, fast.prefill_j) == (slow.excess_j, slow.prefill_s, slow.prefill_j)
    twin = fast._e
    for nn, c in [(0, 10.0), (1, 1.0), (7, 300.5), (64, 2048.0), (90, 3000.25), (33, 257.0)]:
        assert step.decode_attention_pair(twin, nn, c) == (step.decode_attention(nn, c), twin.decode_attention(nn, c))


def test_bad_inputs_refused():
    with pytest.raises(LmcostError) as e:
        serve(power_limit=100.0)  # under a quarter of 700 W
    assert e.value.field == "power_limit" and "175 W" in str(e.value)
    for bad in (0.0, -1.0, True, 1e5):
        with pytest.raises(LmcostError) as e:
            serve(usd_per_gpu_hour=bad)
        assert e.value.field == "usd_per_gpu_hour"
    gpu = load_gpu("h100").model_copy(update=dict(tdp_w=None))
    with pytest.raises(LmcostError) as e:
        serve_power(gpu)
    assert e.value.field == "gpu"


def test_cli_flags_and_lines():
    r = CliRunner().invoke(app, ["serve", "llama-3-8b", "--requests", "8", "--prompt", "512", "--output", "64",
                                 "--usd-per-gpu-hour", "2.5", "--power-limit", "600"])
    assert r.exit_code == 0, r.output
    assert "J per output token" in r.output and "under a 600 W cap" in r.output and "per million input" in r.output
    r = CliRunner().invoke(app, ["serve", "llama-3-8b", "--requests", "8", "--usd-per-gpu-hour", "free"])
    assert r.exit_code == 2 and "error: --usd-per-gpu-hour: 'free' is not a number" in r.output
    r = CliRunner().invoke(app, ["serve", "llama-3-8b", "--requests", "8", "--power-limit", "5000"])
    assert r.exit_code == 2 and "error: --power-limit: 5000 W is outside the caps h100-sxm takes" in r.output


WIDE = dict(model="tiny-moe", ep=8, dp=8, engine="sglang")


@pytest.mark.parametrize("watts", [1.0, 2.0], ids=["1W", "2W"])
@pytest.mark.parametrize("kw", [dict(model="llama-3-8b", spec="ngram", spec_tokens=3, acceptance=2.0),
                                dict(model="llama-3-8b", spec="eagle", spec_tokens=2, acceptance=1.7),
                                dict(WIDE, a2a="deepep-ll"), dict(WIDE, a2a="deepep-ht", tbo=True),
                                dict(WIDE, a2a="nccl", tbo=True)],
                         ids=["ngram", "eagle", "wide-ep", "wide-ep-ht-tbo", "wide-ep-nccl-tbo"])
def test_meter_under_spec_decoding_and_wide_ep(kw, watts):
    # As test_meter_sums_every_step_closed_form_runs_included, through the other step models serve builds:
    # speculative decoding (contexts advance by the accepted length per step, draft and verification tables)
    # and wide EP (its re-timed tokens table: each group's compute, and the exposed all-to-all at the
    # memory-bound level). At W watts for every group the excess joules are W x the busy time; at 2 W a group
    # the meter leaves unweighted (drawn at 1 W over the floor, as wide EP's was) falls short of 2 x busy.
    from lmcost.apps.serve import prepare
    from lmcost.apps.serve_workload import make_requests

    setup = prepare(ServeRequest(**kw, time_model="roofline"), max_context=1024)
    watt = ServePower(idle_w=0.0, memory_w=watts, compute_w=watts, tdp_w=700.0, power_limit_w=None, clock=1.0)
    reqs = make_requests(n=32, prompt="256", output="uniform:16:200", seed=1, rate=20.0, arrival="poisson",
                         concurrency=None)
    meter = Metered(setup.step, watt)
    tr = simulate(meter, setup.knobs, reqs.arrival_s, reqs.prompt, reqs.output,
                  kv_capacity_bytes=setup.kv_capacity_bytes, kv_per_token_bytes=setup.kv_per_token_bytes,
                  kv_per_seq_bytes=setup.kv_per_seq_bytes)
    assert tr.itl_segments[:, 2].max() >= 2  # closed-form runs did happen
    assert meter.excess_j == pytest.approx(watts * tr.busy_s, rel=1e-9)


@pytest.mark.parametrize("kw", [dict(BASE), dict(BASE, spec="eagle", spec_tokens=2, acceptance=1.7),
                                dict(BASE, prefix_caching=True, prefix="shared:384"),
                                dict(WIDE, requests=24, prompt="256", output="32", a2a="deepep-ht"),
                                dict(WIDE, requests=24, prompt="256", output="32", a2a="deepep-ll", tbo=True),
                                dict(WIDE, requests=24, prompt="256", output="32", a2a="nccl")],
                         ids=["plain", "eagle", "prefix", "deepep-ht", "deepep-ll-tbo", "nccl"])
def test_busy_seconds_drawn_between_idle_and_tdp(kw):
    # Every busy second is drawn at a level of the module's model: per GPU, the joules over the idle floor
    # (mean power - idle) x span lie between busy x (memory-bound - idle) (420 - 70 = 350 W over the floor
    # here, where no operator sits at the kernel floor: the roofline, no CPU overhead) and busy x (TDP - idle),
    # so busy x idle <= joules - idle x span <= busy x TDP, as the invariant asks. Wide EP's exposed
    # all-to-all drawn at 1 W over the floor (the fresh user's 75 W at 100% busy) fails the lower bound.
    s = serve(**kw, time_model="roofline")
    e, span = s["energy"], s["span_s"]
    busy, idle = s["busy_fraction"] * span, e["power_w"]["idle"]
    excess = (e["mean_power_w"] - idle) * span
    assert busy > 0 and (idle, e["power_w"]["compute_bound"]) == (70.0, 700.0)
    assert busy * idle <= excess <= busy * 700.0


def test_pd_energy_counts_both_pools():
    # P/D 1P1D on two H100s: both GPUs are held the whole span (gpu_hours = 2 x span / 3600, by hand) and draw
    # at least the idle floor (70 W) throughout and at most the TDP; the prefill GPU idles most of the run, so
    # the pair spends more per output token than one aggregated GPU serving the same requests
    from lmcost.apps.serve_pd import run_pd

    kw = dict(model="llama-3-8b", gpu="h100", requests=40, prompt="512", output="64", rate=4.0, usd_per_gpu_hour=2.0)
    pd = run_pd(ServeRequest(**kw, pd=True)).summary
    agg = serve(**kw)
    assert pd["cost"]["gpu_hours"] == pytest.approx(2 * pd["span_s"] / 3600, rel=1e-12)
    assert 70.0 <= pd["energy"]["mean_power_w"] <= 700.0
    assert pd["energy"]["joules"] == pytest.approx(2 * pd["energy"]["mean_power_w"] * pd["span_s"], rel=1e-12)
    assert pd["energy"]["j_per_token"] > agg["energy"]["j_per_token"]
