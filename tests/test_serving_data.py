"""The shipped measured serving points (lmcost/data/measurements/serving-silicon.csv, written by
benchmarks/convert_silicon.py from aiconfigurator-core 0.12.0's silicon_sample.csv): they parse, name
shipped models and GPUs, and carry the source's figures."""

from __future__ import annotations

import csv
from collections import Counter

import pytest

from conftest import ROOT
from lmcost import load_config
from lmcost.hardware.gpu import load_gpu

PATH = ROOT / "lmcost" / "data" / "measurements" / "serving-silicon.csv"
LINES = PATH.read_text().splitlines()
HEADER = [line for line in LINES if line.startswith("#")]
ROWS = {r["id"]: r for r in csv.DictReader(line for line in LINES if not line.startswith("#"))}


def test_header_cites_the_wheel():
    text = "\n".join(HEADER)
    assert "aiconfigurator-core 0.12.0" in text and "Apache-2.0" in text
    assert "aadc4aad0a00bf8a61c477c62bef43de479849c3aa0b1c3078068e08309eccc4" in text  # sha256 of the wheel
    assert LINES[len(HEADER)].startswith("id,source,engine,")  # the comments come first, then the columns


def test_rows_per_engine_as_the_converter_printed():
    # benchmarks/convert_silicon.py: "2439 of 5221 rows written"; by engine: sglang 465, trtllm 1281, vllm 693
    # (by gpu: b200 1080, h100-sxm 780, h200 579).
    assert len(ROWS) == 2439
    assert Counter(r["engine"] for r in ROWS.values()) == {"sglang": 465, "trtllm": 1281, "vllm": 693}
    assert Counter(r["gpu"] for r in ROWS.values()) == {"b200": 1080, "h100-sxm": 780, "h200": 579}


def test_every_model_and_gpu_loads_and_times_are_positive_seconds():
    for name in {r["model"] for r in ROWS.values()}:
        load_config(name)
    for name in {r["gpu"] for r in ROWS.values()}:
        load_gpu(name)
    for r in ROWS.values():
        # seconds, not ms: the fastest TTFT of the source is 25.4 ms, the slowest TPOT well under 1 s
        assert 0 < float(r["ttft_s"]) < 600 and 0 < float(r["tpot_s"]) < 1, r["id"]
        assert r["precision"] in ("bf16", "fp8", "fp4") and r["pp"] == "1"
        assert min(int(r[k]) for k in ("isl", "osl", "concurrency", "tp", "dp", "ep", "moe_tp")) >= 1


@pytest.mark.parametrize("row_id, expected", [
    # silicon_sample.csv line 96: ...,vllm,0.17.0,moonshotai/Kimi-K2.5,b200_sxm,fp4,agg,1024,1024,nvfp4,nvfp4,
    # 4,8,1,1,8,1,...,74.14093125262298,7.061564909699926 (batch 4, tp 8, pp 1, attention dp 1, moe tp 8, ep 1)
    ("kimik2_5_b200_vllm_fp4_agg_1024x1024_c4_cfg636",
     dict(engine="vllm", engine_version="0.17.0", model="kimi-k2", gpu="b200", precision="fp4", isl="1024",
          osl="1024", concurrency="4", tp="8", dp="1", ep="1", moe_tp="8", ttft_ms=74.14093125262298,
          tpot_ms=7.061564909699926)),
    # ...,sglang,0.5.9,deepseek-ai/DeepSeek-V3,h200_sxm,fp8,agg,1024,1024,fp8,fp8_block,16,8,1,1,8,1,...,
    # 285.8761207331554,16.62984173279305
    ("dsr1_h200_sglang_fp8_agg_1024x1024_c16_cfg81",
     dict(engine="sglang", engine_version="0.5.9", model="deepseek-v3", gpu="h200", precision="fp8",
          moe_quant="fp8_block", isl="1024", osl="1024", concurrency="16", tp="8", moe_tp="8",
          ttft_ms=285.8761207331554, tpot_ms=16.62984173279305)),
    # ...,trtllm,1.0.0rc3,Qwen/Qwen3-235B-A22B-FP8,h100_sxm,fp8,agg,512,128,fp8_block,fp8_block,4,4,1,,1,4,...,
    # 173.54799803749998,13.340653025 (attention dp blank -> 1; moe tp 1, ep 4)
    ("qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h100_sxm_trtllm_agg_512x128_c4_tp4_epnone_1",
     dict(engine="trtllm", engine_version="1.0.0rc3", model="qwen3-235b-a22b", gpu="h100-sxm", gemm_quant="fp8_block",
          isl="512", osl="128", concurrency="4", tp="4", dp="1", moe_tp="1", ep="4", ttft_ms=173.54799803749998,
          tpot_ms=13.340653025)),
])
def test_spot_rows_against_the_source(row_id, expected):
    row = ROWS[row_id]
    ttft_ms, tpot_ms = expected.pop("ttft_ms"), expected.pop("tpot_ms")
    assert {k: row[k] for k in expected} == expected
    assert float(row["ttft_s"]) == pytest.approx(ttft_ms / 1e3, rel=1e-15)
    assert float(row["tpot_s"]) == pytest.approx(tpot_ms / 1e3, rel=1e-15)
