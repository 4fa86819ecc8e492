"""Wide EP's experts under DeepEP run DeepGEMM (lmcost.cost.deepgemm): the factor is the held DeepGEMM row's
over the H100's peak, it replaces only the engine's fitted ``experts.compute`` and only under a DeepEP kernel,
and a power cap's clock on top of it is kept."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lmcost.apps.serve import ServeRequest, prepare
from lmcost.cost.deepgemm import DEEPGEMM_COMPUTE, expert_scales
from lmcost.hardware.engines import load_engine

ROOT = Path(__file__).resolve().parents[1]
V3 = dict(model="deepseek-v3", gpu="h100", dtype="fp8", engine="sglang", ep=32, dp=32, requests=8, prompt="64",
          output="8")


def test_factor_is_the_held_deepgemm_row_over_the_h100_peak():
    rows = [r for r in csv.DictReader((ROOT / "lmcost/data/measurements/public-kernels.csv").open())
            if r["implementation"] == "DeepGEMM" and (r["M"], r["N"], r["K"]) == ("1024", "18432", "7168")]
    assert len(rows) == 1
    us = float(rows[0]["time_us"])  # 279.0 us, published as 969.8 TFLOPS
    tflops = 2 * 1024 * 18432 * 7168 / (us * 1e-6) / 1e12
    assert tflops == pytest.approx(969.8, abs=0.1)
    assert DEEPGEMM_COMPUTE == pytest.approx(1978.9 / tflops, rel=1e-4) == pytest.approx(2.0405, abs=1e-4)


def test_only_deepep_kernels_under_the_engine_model_change_the_factor():
    fit = {"experts.compute": 10.0, "experts.memory": 1.3}
    s = {"experts.compute": 5.0, "experts.memory": 1.3, "comm": 4.0}  # 10 fitted, halved by a power cap's clock
    assert expert_scales(s, fit, "nccl") is s and expert_scales(s, None, "deepep-ht") is s
    out = expert_scales(s, fit, "deepep-ll")
    assert out == {"experts.compute": DEEPGEMM_COMPUTE / 2, "experts.memory": 1.3, "comm": 4.0}


@pytest.mark.parametrize("a2a", ["deepep-ht", "deepep-ll"])
def test_deepep_run_carries_deepgemm_and_nccl_the_fit(a2a):
    fitted = load_engine("sglang").time_scales["experts.compute"]
    dg = prepare(ServeRequest(**V3, a2a=a2a), max_context=128).wide_ep["step"].scales
    nc = prepare(ServeRequest(**V3, tbo=True), max_context=128).wide_ep["step"].scales
    assert dg["experts.compute"] == pytest.approx(DEEPGEMM_COMPUTE) and nc["experts.compute"] == fitted
    assert {g: v for g, v in dg.items() if g != "experts.compute"} == {g: v for g, v in nc.items()
                                                                        if g != "experts.compute"}
    roof = prepare(ServeRequest(**V3, a2a=a2a, time_model="roofline"), max_context=128).wide_ep["step"].scales
    assert roof["experts.compute"] == 1.0  # the lower bound takes no factor
