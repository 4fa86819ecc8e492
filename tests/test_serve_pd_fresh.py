"""What a second fresh user found in ``lmcost serve --pd`` and ``serve-plan --pd`` (issue 28): the note on a
context past the trained positions said under ``--pd`` as without it; the prefill pool's ``max_num_seqs`` capped
at its token budget (vLLM refuses a budget below ``max_num_seqs``); serve-plan's GPU count named as ``--gpus``;
the wide-EP line under ``--pd``; a zero-size offload tier refused at the flag; output 1 under ``--pd`` refused
and a TPOT SLO that judged no request said so. Every run here is a handful of requests."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.apps.serve_pd import pools, run_pd
from lmcost.cli import app

runner = CliRunner()


def test_past_trained_context_noted_under_pd_as_without():
    # the oracle is the aggregated run's note: llama-3.1-8b is trained for 131,072 positions, 200,000 + 2 is past
    kw = dict(model="llama-3.1-8b", gpu="h100", requests=1, prompt=200_000, output=2, rate=1.0)
    agg, pd = [], []
    run_serve(ServeRequest(**kw), agg.append)
    run_pd(ServeRequest(**kw, pd=True, kv_link="none"), pd.append)
    note = [s for s in agg if "131,072" in s]
    assert len(note) == 1 and "200,002" in note[0]
    assert [s for s in pd if "131,072" in s] == note


def test_prefill_max_num_seqs_capped_at_its_token_budget():
    # vLLM's default max_num_seqs on an H100 (80 GB >= 70 GiB) is 1,024 (EngineArgs.get_batch_defaults); a token
    # budget of 64 for both pools caps the prefill pool's at 64 instead of refusing it
    p = pools(ServeRequest(model="llama-3-8b", gpu="h100", pd=True, max_num_seqs=64, max_num_batched_tokens=64))
    assert (p.prefill.knobs.max_num_seqs, p.decode.knobs.max_num_seqs) == (64, 64)
    # a budget of its own (32) caps it lower; a budget at or above 1,024 leaves the engine's 1,024 as before
    p = pools(ServeRequest(model="llama-3-8b", gpu="h100", pd=True, max_num_seqs=16, max_num_batched_tokens=2048,
                           prefill_max_num_batched_tokens=32))
    assert p.prefill.knobs.max_num_seqs == 32
    assert pools(ServeRequest(model="llama-3-8b", gpu="h100", pd=True)).prefill.knobs.max_num_seqs == 1024
    # given, prefill_max_num_seqs is kept (and refused against a smaller budget, as before)
    p = pools(ServeRequest(model="llama-3-8b", gpu="h100", pd=True, max_num_seqs=8, max_num_batched_tokens=64,
                           prefill_max_num_seqs=8))
    assert p.prefill.knobs.max_num_seqs == 8


def test_plan_pd_runs_a_small_budget_and_its_check_reproduces_it():
    r = runner.invoke(app, ["serve-plan", "llama-3-8b", "--gpu", "h100", "--gpus", "2", "--pd", "--requests", "10",
                            "--prompt", "256", "--output", "8", "--slo-ttft", "1s", "--slo-tpot", "50ms",
                            "--max-num-seqs", "16", "--max-num-batched-tokens", "32", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert rows and all("cannot run" not in str(x.get("note", "")) for x in rows)
    cmd = rows[0]["check_command"].split()[1:]
    again = runner.invoke(app, cmd + ["--json"])
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout)["pd"]["prefill"]["max_num_seqs"] == 32


def test_plan_pd_names_gpus_past_the_largest_degree():
    # serve-plan has no --dp: the P/D search refuses its GPU count as the aggregated search does, byte for byte
    argv = ["serve-plan", "llama-3-8b", "--gpu", "h100", "--requests", "10", "--gpus", "100000", "--slo-ttft", "1s"]
    agg, pd = runner.invoke(app, argv), runner.invoke(app, argv + ["--pd"])
    assert agg.exit_code == pd.exit_code == 2
    assert pd.stderr.strip().splitlines() == agg.stderr.strip().splitlines() == [
        "error: --gpus: must be a whole number from 1 to 65,536, got 100000; pass --gpus in that range"]


def test_tbo_cost_printed_under_pd_and_negative_in_the_json():
    # a decode pool of EP8 x attention DP8 at a handful of users: steps of a few tokens, where TBO's split GEMMs
    # read the weights twice and cost more than the overlap hides; the JSON's negative saving is printed as a cost
    argv = ["serve", "deepseek-v2-lite", "--tp", "1", "--ep", "8", "--dp", "8", "--pd", "--prefill-tp", "1",
            "--prefill-ep", "1", "--prefill-dp", "1", "--concurrency", "8", "--requests", "16", "--prompt", "128",
            "--output", "8", "--a2a", "deepep-ll", "--tbo"]
    d = json.loads(runner.invoke(app, argv + ["--json"]).stdout)
    saved = d["wide_ep"]["step"]["overlap_saved_s"]
    assert saved < 0 and d["wide_ep"]["pool"] == "decode"
    text = runner.invoke(app, argv)
    assert text.exit_code == 0, text.stderr
    assert "TBO costs" in text.stdout and "(its split GEMMs outweigh the overlap)" in text.stdout


def test_zero_size_offload_tier_refused_at_the_flag():
    # 0 bytes, and a size that floors to 0 bytes (0.0001 KiB = 0.1024 B), hold nothing: one line, exit 2
    for spec in ("cpu:0G", "cpu:0.0001K"):
        r = runner.invoke(app, ["serve", "tiny-gqa", "--requests", "8", "--prefix", "shared:64", "--kv-offload", spec])
        assert r.exit_code == 2
        assert r.stderr.strip().splitlines() == [
            f"error: --kv-offload: '{spec}' is a tier of 0 bytes: it would hold nothing; give a size of at least 1 "
            "byte, e.g. cpu:256G, or drop the offload tier"]


def test_output_one_refused_under_pd_and_an_unjudged_tpot_slo_said():
    base = ["serve", "llama-3-8b", "--gpu", "h100", "--requests", "8", "--prompt", "128", "--output", "1",
            "--rate", "5", "--slo-tpot", "1ms"]
    pd = runner.invoke(app, base + ["--pd"])
    assert pd.exit_code == 2
    assert pd.stderr.strip().splitlines() == [
        "error: --output: every request has one output token: under pd the decode pool has nothing to decode; give "
        "outputs of 2 or more tokens, or serve without pd"]
    # aggregated: no request has a TPOT, so the TPOT SLO judged none of the 8, and the summary says so
    d = json.loads(runner.invoke(app, base + ["--json"]).stdout)
    assert d["goodput"]["tpot_judged"] == 0 and d["tpot_s"]["p50"] is None
    text = runner.invoke(app, base)
    assert "the TPOT SLO judged none: every output is one token, no TPOT" in text.stdout
    # with a token to decode the key is absent, as before
    two = json.loads(runner.invoke(app, base[:-5] + ["2", "--rate", "5", "--slo-tpot", "1ms", "--json"]).stdout)
    assert "tpot_judged" not in two["goodput"]
