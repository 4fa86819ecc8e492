"""The engines' kernel table (lmcost/data/measurements/engine-kernels.csv, issue 25): it loads whole through
lmcost's measurement loader, its rows are aiconfigurator-core 0.12.0's parquet values, and the public table
still loads as before. The figures asserted come from the parquet files (read by hand, quoted in comments),
datasheet peaks in the GPU YAMLs and the 2 FLOPs per MAC of a GEMM, not from the loader."""

import csv
import re
import sys
from collections import Counter
from itertools import product
from pathlib import Path

import pytest

from lmcost.basics.errors import LmcostError
from lmcost.calibration import measurements as M


@pytest.fixture(scope="module")
def table():
    ms, skipped = M.load_table(M.engine_table())
    with open(M.engine_table(), newline="") as f:
        rows = list(csv.DictReader(f))
    return ms, skipped, rows


def test_every_row_loads_with_its_engine(table):
    ms, skipped, rows = table
    assert skipped == [] and len(ms) == len(rows)
    assert {m.engine for m in ms} == {"vllm", "sglang", "trtllm"}
    assert all(m.engine_version == r["engine_version"] != "" for m, r in zip(ms, rows))
    # the brief's bounds on the shipped file: at most 15,000 rows, about 4 MB
    assert len(rows) <= 15_000 and M.engine_table().stat().st_size <= 4_000_000


def test_every_gpu_engine_op_has_rows(table):
    """Nine GPUs x three engines x three ops, each a table of thousands of rows in aic (the converter's
    printout, engine-kernels.md), so each keeps the full 40 default-kernel rows of at least one kernel."""
    ms, _, _ = table
    n = Counter((m.gpu.name, m.engine, m.op) for m in ms)
    gpus = ("a100-80gb", "h100-sxm", "h200", "b200", "b300", "gb200", "gb300", "l40s", "rtx-pro-6000")
    assert set(n) == set(product(gpus, ("vllm", "sglang", "trtllm"), ("gemm", "attention_prefill", "attention_decode")))
    assert min(n.values()) >= 40


def _row(ms, rows, source_part, parquet_row):
    hits = [(m, r) for m, r in zip(ms, rows)
            if source_part in r["source"] and r["notes"].startswith(f"parquet row {parquet_row};")]
    assert len(hits) == 1, (source_part, parquet_row)
    return hits[0]


def test_rows_are_the_parquet_values(table):
    ms, _, rows = table
    # h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet row 84897: torch.nn.functional.linear, bfloat16, m 16,
    # n 2048, k 2048, latency 0.006656000183688269 ms -> 6.6560 us
    m, r = _row(ms, rows, "h100_sxm/gemm/vllm/0.24.0/", 84897)
    assert (r["M"], r["N"], r["K"], r["dtype"]) == ("16", "2048", "2048", "bf16")
    assert m.time_s == pytest.approx(6.656e-6, rel=1e-6) and m.gpu.name == "h100-sxm"
    # b200_sxm/gemm/trtllm/1.3.0rc20/gemm_perf.parquet row 14475: torch_flow, nvfp4, m 17, n 16384, k 5120,
    # latency 0.01746133342385292 ms -> 17.4613 us
    m, r = _row(ms, rows, "b200_sxm/gemm/trtllm/1.3.0rc20/", 14475)
    assert (r["M"], r["N"], r["K"], r["dtype"]) == ("17", "16384", "5120", "fp4")
    assert m.time_s == pytest.approx(17.4613e-6, rel=1e-5)
    # h200_sxm/attention/sglang/0.5.14/generation_attention_perf.parquet row 7280: fa3, batch 64, isl 1,
    # step 131071, 2 heads, 1 KV head, head_dim 128, bf16 KV, latency 1.0351728439331054 ms; seq_kv = isl + step
    m, r = _row(ms, rows, "h200_sxm/attention/sglang/0.5.14/generation", 7280)
    assert (r["op"], r["batch"], r["seq_kv"], r["heads_q"], r["heads_kv"], r["head_dim"]) == \
        ("attention_decode", "64", "131072", "2", "1", "128")
    assert m.time_s == pytest.approx(1035.1728e-6, rel=1e-6) and m.impl_family == "fa3"


def test_gemm_flops_are_2mnk_and_fp4_runs_at_the_fp4_peak(table):
    ms, _, rows = table
    for m, r in zip(ms, rows):
        if m.op == "gemm":
            assert m.main.flops == 2 * int(r["M"]) * int(r["N"]) * int(r["K"])
    # b200 row 14475 above, fp4 at B200's dense NVFP4 9,000 TFLOP/s (b200.yaml): compute 2*17*16384*5120 /
    # 9e15 = 0.317 us; bytes (17*5120 + 5120*16384 + 17*16384) * (0.5 + 1/16) = 47,423,232 B over 8 TB/s
    # = 5.93 us: memory-bound.
    m, _ = _row(ms, rows, "b200_sxm/gemm/trtllm/1.3.0rc20/", 14475)
    assert m.gpu.peak_flops("fp4") == 9000e12 and m.gpu.bandwidth == 8e12
    assert m.roofline_s == pytest.approx((17 * 5120 + 5120 * 16384 + 17 * 16384) * 0.5625 / 8e12, rel=1e-9)
    # a compute-bound fp4 row: b200 trtllm row 146, 4097 x 65536 x 51200: 2MNK / 9e15 = 3.0549 ms
    m, r = _row(ms, rows, "b200_sxm/gemm/trtllm/1.3.0rc20/", 146)
    assert m.roofline_s == pytest.approx(2 * 4097 * 65536 * 51200 / 9000e12, rel=1e-9)


def test_decode_rows_attend_isl_plus_step_keys(table):
    """seq_kv = isl + step (engine-kernels.md cites aic's key s = isl + step), checked on every decode row."""
    _, _, rows = table
    dec = [r for r in rows if r["op"] == "attention_decode"]
    assert dec
    for r in dec:
        isl, step = map(int, re.search(r"isl (\d+), step (\d+)", r["notes"]).groups())
        assert (int(r["seq_q"]), int(r["seq_kv"])) == (1, isl + step)


def test_new_gpus_families_and_engine_kernel_families(table):
    ms, _, _ = table
    fam = {m.gpu.name: m.family for m in ms}
    assert fam == {"a100-80gb": "ampere", "h100-sxm": "hopper", "h200": "hopper", "b200": "blackwell",
                   "b300": "blackwell", "gb200": "blackwell", "gb300": "blackwell", "l40s": "ada",
                   "rtx-pro-6000": "blackwell-ws"}
    impl = {m.implementation: m.impl_family for m in ms if m.op.startswith("attention")}
    # vLLM's flash-attn fork: FA3 on Hopper, FA2 on Ampere/Ada; its FA4 label is no family lmcost has
    assert (impl["vllm_flash_attn_fa3"], impl["fa3"], impl["vllm_flash_attn_fa2"], impl["vllm_flash_attn"],
            impl["vllm_flash_attn_fa4"]) == ("fa3", "fa3", "fa2", "fa2", "auto")


def test_public_table_loads_as_before():
    # lmcost main @ 775edba, before this change: load_table() gave 296 measurements and 21 rows left out
    # (317 data rows: the README's "317 published single-kernel timings", "21 rows are left out")
    ms, skipped = M.load_table()
    assert (len(ms), len(skipped)) == (296, 21)
    assert {(m.engine, m.engine_version) for m in ms} == {("", "")}


HEAD = "device,dtype,op,implementation,M,N,K,time_us,source\n"


@pytest.mark.parametrize("row, field, what", [
    ("h100-sxm,fp4,gemm,x,64,64,64,10,s", "dtype", "h100-sxm has no fp4 rate"),  # Hopper: no FP4 tensor cores
    ("b200,fp4,softmax,x,64,64,,10,s", "dtype", "fp4 is a matmul rate, not a storage dtype of softmax"),
])
def test_fp4_refused_where_it_means_nothing(tmp_path, row, field, what):
    p = tmp_path / "t.csv"
    p.write_text(HEAD + row + "\n")
    with pytest.raises(LmcostError) as e:
        M.load_table(p)
    assert e.value.field == f"t.csv row 1: {field}" and e.value.what == what


def test_a_cut_off_row_is_refused(tmp_path):
    # A row with fewer fields than the header (here its first 10 of 25) is refused, naming it, not dropped.
    from lmcost.basics.errors import LmcostError
    from lmcost.calibration.measurements import engine_table, load_table

    lines = engine_table().read_text().splitlines()
    bad = tmp_path / "cut.csv"
    bad.write_text("\n".join([lines[0], lines[1], ",".join(lines[2].split(",")[:10])]) + "\n")
    with pytest.raises(LmcostError, match="row 2: fewer fields than the header"):
        load_table(bad)


def test_an_fp4_row_on_an_amd_device_is_mxfp4(tmp_path):
    # A user's fp4 GEMM row is read in its device's FP4 format: 64 x 64 x 64 on B200 (NVFP4, 9/16 B per
    # element) counts A, B and C at 64*64*0.5625 = 2304 B each (the loader's lower bound: C at fp4 bytes,
    # FP4_BYTES), 6912 B; on MI355X (MXFP4, 17/32 B) 64*64*0.53125 = 2176 B each, 6528 B.
    p = tmp_path / "t.csv"
    p.write_text(HEAD + "b200,fp4,gemm,x,64,64,64,10,s\nmi355x,fp4,gemm,x,64,64,64,10,s\n")
    ms, _ = M.load_table(p)
    assert [m.ops[0].bytes for m in ms] == [6912, 6528]


def test_sglang_default_attention_on_sm100_and_sm103_is_trtllm_mha(table):
    """SGLang 0.5.14's own dispatch, not aic's lane map, decides its default attention kernel on Blackwell. The
    sglang 0.5.14 wheel (PyPI sglang==0.5.14), sglang/srt/server_args.py, ServerArgs._get_default_attn_backend
    (lines 4407-4450): an MHA model (Llama, Qwen) gets fa3 on Hopper, trtllm_mha where is_sm100_supported()
    (compute capability 10.x: B200, GB200 SM100; B300, GB300 SM103), else flashinfer if available (SM120),
    else triton. aic's attention_lane_defaults.yaml says SM100/103 -> triton, citing a Qwen3.5-MoE hybrid
    (server_args.py lines 4180-4218 give those hybrids triton): the converter overrides it there only."""
    ROOT = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import convert_aic_kernels as C

    assert {k: v[0] for k, v in C.LANE_OVERRIDES.items()} == {("sglang", "0.5.14", 100): "trtllm_mha",
                                                              ("sglang", "0.5.14", 103): "trtllm_mha"}
    assert all("_get_default_attn_backend" in v[1] and "server_args.py" in v[1] for v in C.LANE_OVERRIDES.values())
    # aic's map as it reads (systems/attention_lane_defaults.yaml lines 8-16): overridden on SM100/103 only
    aic = {"sglang": {"0.5.14": {90: "fa3", 100: "triton", 103: "triton", 120: "flashinfer"}}}
    assert [C.default_lane(aic, "sglang", "0.5.14", sm)[0] for sm in (90, 100, 103, 120)] == [
        "fa3", "trtllm_mha", "trtllm_mha", "flashinfer"]
    assert "overriding aic's 'triton'" in C.default_lane(aic, "sglang", "0.5.14", 100)[1]
    assert C.default_lane(aic, "vllm", "0.24.0", 100)[0] is None

    _, _, rows = table
    for gpu in ("b200", "b300", "gb200", "gb300"):
        for op in ("attention_prefill", "attention_decode"):
            rs = [r for r in rows if (r["device"], r["engine"], r["op"]) == (gpu, "sglang", op)]
            dflt = Counter(r["implementation"] for r in rs if r["default_kernel"] == "True")
            other = Counter(r["implementation"] for r in rs if r["default_kernel"] != "True")
            # the converter keeps 40 rows of the default kernel and 12 of each other one (--per-default/--per-other)
            assert dflt == {"trtllm_mha": 40} and other == {"triton": 12, "flashinfer": 12}, (gpu, op, dflt, other)
    # SM120 (RTX PRO 6000): flashinfer, as both aic and SGLang's source say; triton is the swept alternative
    rs = [r for r in rows if (r["device"], r["engine"], r["op"]) == ("rtx-pro-6000", "sglang", "attention_prefill")]
    assert {r["implementation"] for r in rs if r["default_kernel"] == "True"} == {"flashinfer"}
