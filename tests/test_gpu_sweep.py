"""`lmcost op` against kernels timed on this project's lent H200 (tests/data/gpu-kernels-h200.csv: 402 kernels
by benchmarks/gpu_kernels.py, profiler kernel durations, timed twice; reports/h200-kernels.md). No lmcost figure
was fitted on these rows: they are held out. The bounds asserted are physics (no kernel beats its roofline),
hand-worked counts, and the held-out errors measured when the sweep landed (reports/h200-kernels.md), as guards."""

import csv
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import eval_gpu_kernels as E  # noqa: E402

TABLE = ROOT / "tests" / "data" / "gpu-kernels-h200.csv"


@pytest.fixture(scope="module")
def rows():
    with open(TABLE, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def evaluated(rows):
    return E.evaluate(rows, "h200")


def test_the_sweep_is_whole_and_repeatable(rows):
    assert len(rows) == 402 and all(r["status"] == "ok" for r in rows)
    # every fused kernel matched its fp32 reference to bf16 rounding (rel. error < 1e-2; 0 where the op is the
    # identity, rope at position 0)
    assert max(float(r["check"]) for r in rows if r["check"]) < 1e-2
    # run to run: the median case moved 0.3% between the two runs (reports/h200-kernels.md)
    spread = [abs(float(r["time_us"]) / float(r["time_us_repeat"]) - 1) for r in rows]
    assert statistics.median(spread) < 0.01


def test_no_kernel_beats_its_roofline(evaluated):
    # The roofline is a lower bound: a measured kernel faster than lmcost's FLOPs / peak and bytes / bandwidth
    # would mean lmcost counts too much work (or the datasheet is wrong). Every one of the 402 rows is at or
    # above it under every setting.
    assert evaluated and all(r["measured"] >= r["roofline"] for r in evaluated)


def test_a_gemm_by_hand(rows, evaluated):
    # F.linear 8192 x 28672 x 4096 (Llama-3-8B gate_up at 8192 tokens): 2 * 8192 * 28672 * 4096 =
    # 1,924,145,348,608 FLOPs; at H200's dense bf16 peak 989.4 TFLOP/s that is 1944.76 us, under the
    # 2640.41 us measured (729 TFLOP/s, 74% of peak).
    (row,) = [r for r in rows if r["op"] == "gemm" and (r["M"], r["N"], r["K"]) == ("8192", "28672", "4096")]
    assert float(row["time_us"]) == pytest.approx(2640.412)
    (rec,) = [r for r in evaluated if r["row"] is row and r["setting"] == "auto"]
    assert rec["roofline"] == pytest.approx(1_924_145_348_608 / 989.4e12, rel=1e-9)


def _median_error(evaluated, cls, setting):
    errs = [abs(r["calibrated"] / r["measured"] - 1) for r in evaluated if r["cls"] == cls and r["setting"] == setting]
    assert errs
    return statistics.median(errs)


@pytest.mark.parametrize("cls, setting, bound", [
    # held-out medians when the sweep landed (reports/h200-kernels.md), with a margin for refits
    ("GEMM bf16", "auto", 0.12),                     # 8.5%
    ("GEMM fp8 (tensorwise)", "auto", 0.12),         # 7.6%
    ("prefill attention", "--kernel fa2", 0.12),     # 7.2%
    ("prefill over a KV cache", "--kernel fa2", 0.2),  # 14.3%
    ("decode attention", "--kernel fa2", 0.3),       # 22.1%
])
def test_held_out_errors_stay_where_they_were_measured(evaluated, cls, setting, bound):
    assert _median_error(evaluated, cls, setting) <= bound


@pytest.mark.parametrize("bad", ["abc", "-1", "0"])
def test_a_row_without_a_time_is_refused(tmp_path, capsys, bad):
    # a time that is not a positive number (line 4 of the copy) is refused in one line, exit 2, not scored
    with open(TABLE, newline="") as fh:
        rows = list(csv.reader(fh))
    rows[3][rows[0].index("time_us")] = bad
    path = tmp_path / "k.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    assert E.main([str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: csv: {path} line 4: time_us is '{bad}', not a time in microseconds > 0; fix that row, "
                   "or give benchmarks/gpu_kernels.py's kernels.csv as written"]
