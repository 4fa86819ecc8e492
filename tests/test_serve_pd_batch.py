"""serve --pd's prefill batch (``prefill_max_num_seqs``, :mod:`lmcost.apps.serve_pd`) and the held-out rows
benchmarks/eval_serve_pd.py leaves out. Metamorphic: with one prompt per prefill step, n equal prompts that
arrive together leave the prefill pool at 1, 2, ..., n times one prompt's step (first come first served), so
their mean wait is (n + 1) / 2 steps; the refusals byte for byte; the blank-worker rows' twins as the source
gives them. Every run here is a handful of requests."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest
from lmcost.apps.serve_pd import pools, simulate_pd
from lmcost.cli import app

BASE = dict(model="llama-3-8b", gpu="h100", pd=True, kv_link="none")


def test_one_prompt_per_prefill_step_is_first_come_first_served():
    # 4 prompts of 1,000 tokens at 0 (budget 8,192: one step could take them all); with prefill_max_num_seqs 1
    # prompt k (1-based) leaves the prefill pool after k steps of one prompt each, at k x t1, t1 = one prompt
    # alone (the run of n = 1); the transfer is free (kv_link none) and the decode pool is idle on arrival
    one = pools(ServeRequest(**BASE, prefill_max_num_seqs=1))
    assert one.prefill.knobs.max_num_seqs == 1 and one.decode.knobs.max_num_seqs != 1  # the decode pool's: the engine's
    single, _ = simulate_pd(one, np.zeros(1), np.array([1000]), np.array([8]))
    t1 = single.prefill_done[0]
    run, tr = simulate_pd(one, np.zeros(4), np.full(4, 1000), np.full(4, 8))
    np.testing.assert_allclose(run.prefill_done, t1 * np.arange(1, 5), rtol=1e-12)
    # the mean TTFT's prefill part is (1 + 2 + 3 + 4) / 4 = 2.5 steps of one prompt
    np.testing.assert_allclose(run.prefill_done.mean(), 2.5 * t1, rtol=1e-12)
    # the engine's default batches all four into one step: they leave together, later than the first alone
    many, _ = simulate_pd(pools(ServeRequest(**BASE)), np.zeros(4), np.full(4, 1000), np.full(4, 8))
    assert np.ptp(many.prefill_done) == 0 and many.prefill_done[0] > t1


def test_prefill_batch_leaves_the_decode_pool_alone():
    # the field is the prefill pool's: the decode pool's setup is the same object-for-object as without it
    a, b = pools(ServeRequest(**BASE, prefill_max_num_seqs=2)), pools(ServeRequest(**BASE))
    assert a.decode.knobs == b.decode.knobs and a.prefill.knobs.max_num_seqs == 2


def test_prefill_batch_refusals_exact():
    runner = CliRunner()
    bad = runner.invoke(app, ["serve", "llama-3-8b", "--prefill-max-num-seqs", "2"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --prefill-max-num-seqs: has no effect without --pd (prefill/decode disaggregation); add --pd, or drop it"]
    zero = runner.invoke(app, ["serve", "llama-3-8b", "--pd", "--prefill-max-num-seqs", "0"])
    assert zero.exit_code == 2
    assert zero.stderr.strip().splitlines() == [
        "error: --prefill-max-num-seqs: 0 is not a whole number from 1 to 4,096; give a whole number, e.g. 1, 2, 4 or 8"]


def test_blank_worker_rows_and_their_twins():
    # silicon_sample.csv: 2026_04_06_deepseek_r1_h100_sxm_trtllm_fp8_disagg_8192x1024_c154_tp16_ep16_1738 leaves
    # the workers blank and records TP16 EP16 in both pools; dsr1_h100_trtllm_fp8_disagg_8192x1024_c154_cfg503 is
    # the same measurement (TTFT 31,382.7 ms, TPOT 52.86 ms, concurrency 154) with 1P2D and attention DP 16
    # in the prefill pool: its twin, with another layout
    import io

    import pandas as pd

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from eval_serve_pd import CSV, blank_rows

    df = pd.read_csv(io.StringIO(CSV.read_text()), comment="#")
    b = blank_rows(df).set_index("id")
    assert len(b) == 549  # the converter's header: 549 rows with the workers blank
    row = b.loc["2026_04_06_deepseek_r1_h100_sxm_trtllm_fp8_disagg_8192x1024_c154_tp16_ep16_1738"]
    assert row.twin == "dsr1_h100_trtllm_fp8_disagg_8192x1024_c154_cfg503" and bool(row.layout_differs)
