"""The engine fit (lmcost.apps.serve_fit): it recovers figures it is given, and what lmcost ships is what
the committed report measured."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmcost.apps.serve_fit import PARAMS, figures, fit, points, precision_of, simulate_points
from lmcost.hardware.engines import load_engine

ROOT = Path(__file__).resolve().parents[1]


def _rows(n_points):
    # closed loops on llama-3-8b / H100 at four concurrencies and two prompt lengths
    rows = []
    for k, (c, isl) in enumerate([(1, 512), (8, 512), (32, 2048), (64, 1024), (16, 4096), (4, 1024)][:n_points]):
        rows.append(dict(id=f"p{k}", engine="vllm", model="llama-3-8b", gpu="h100", precision="bf16", gemm_quant="",
                         isl=isl, osl=64, concurrency=c, tp=1, pp=1, dp=1, ep=1, ttft_s=1.0, tpot_s=1.0))
    return pd.DataFrame(rows)


def test_fit_recovers_the_predictions_of_known_figures():
    # "Measured" points made by the simulation itself under known engine figures (factor 2 on memory-bound
    # GEMMs, 300 us per step, 5 ms per request): the fit, started from none, must reproduce those
    # measurements (the oracle is the simulation with the figures it was given).
    pts = points(_rows(6), "vllm", requests_per_user=2, time_model="roofline")
    truth = np.zeros(len(PARAMS))
    truth[PARAMS.index("gemm.memory")] = np.log(2.0)
    truth[PARAMS.index("step_overhead_us")] = 300.0
    truth[PARAMS.index("request_overhead_us")] = 5000.0
    measured = simulate_points(pts, truth)
    for p, (ttft, tpot) in zip(pts, measured):
        p.row["ttft_s"], p.row["tpot_s"] = ttft, tpot
    before = np.median(np.abs(simulate_points(pts, np.zeros(len(PARAMS))) / measured - 1))
    f = fit(pts, iterations=4)
    after = np.abs(f["pred"] / measured - 1)
    assert before > 0.2  # the figures matter: without them the points are >20% off (24% here)
    assert np.median(after) < 0.02 and after.max() < 0.1


def test_fp8_and_fp4_rows_cost_as_the_engines_run_them():
    assert precision_of({"precision": "fp8", "gemm_quant": "fp8", "model": "llama-3.1-70b"}) == {"dtype": "fp8", "quant": None}
    assert precision_of({"precision": "fp8", "gemm_quant": "fp8_block", "model": "deepseek-v3"})["quant"] == "fp8-block128"
    assert precision_of({"precision": "fp4", "gemm_quant": "nvfp4", "model": "qwen3-32b"})["quant"] == "nvfp4"
    assert precision_of({"precision": "bf16", "gemm_quant": "", "model": "qwen3-32b"}) == {"dtype": "bf16", "quant": None}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_shipped_figures_are_the_reports(engine):
    # lmcost/data/engines/*.yaml carries the figures benchmarks/fit_serving.py fitted (reports/serve-fit.json)
    fitted = json.loads((ROOT / "reports" / "serve-fit.json").read_text())[engine]["figures"]
    e = load_engine(engine)
    assert {k: getattr(e, k) for k in PARAMS[9:]} == {k: fitted[k] for k in PARAMS[9:]}
    assert {g: e.time_scales.get(g, 1.0) for g in PARAMS[:9]} == {g: fitted[g] for g in PARAMS[:9]}
    assert figures(np.zeros(len(PARAMS)))["gemm.memory"] == 1.0
