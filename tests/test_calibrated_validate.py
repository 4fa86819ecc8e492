"""Issue 6's CPU acceptance: after `calibrate --device cpu`, `validate` on three small models (a GQA
Llama-like, an MoE, an MLA) gives a calibrated median absolute error over classes below the roofline's,
and the report prints both and names the fitting and evaluation sets.

Which model is nearer is a claim about measurements, and a measurement taken while other processes
share the cores is not the machine the calibration measured: under load the live errors move by tens
of points from run to run (issue 24). So the claim is checked on the committed quiet measurements
(reports/validate-cpu-repeat-run*/, with the calibration they were measured with), against today's
predictions; the live calibrate-then-validate run checks what no load changes: it runs, says what it
compared and which calibration, and every calibrated time is at or above its roofline."""

from __future__ import annotations

import json
import statistics

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import ROOT
from lmcost import load_config, load_gpu
from lmcost.cli import app

pytestmark = pytest.mark.torch
pytest.importorskip("torch")

MODELS = ["tiny-gqa", "tiny-moe", "tiny-mla"]
REPORTS = ROOT / "reports"


@pytest.mark.parametrize("run_dir", ["validate-cpu-repeat-run1", "validate-cpu-repeat-run2"])
@pytest.mark.parametrize("model", MODELS)
def test_calibrated_beats_roofline_on_committed_quiet_measurements(run_dir, model):
    from lmcost.model.config import truncate
    from lmcost.operators.workload import Settings
    from lmcost.profiling.profile import Run
    from lmcost.profiling.validate import predicted

    # The run the report states: 2 layers, batch 1, prompt 128, flash attention, MLA absorbed, fusion none,
    # one thread, on the calibration committed beside it.
    measured = pd.read_csv(REPORTS / run_dir / f"validate-ops-{model}-b1.csv")
    run = Run(truncate(load_config(model), 2), "cpu", "fp32", 1, 128, 8, 10,
              Settings(kernel="flash", mla="absorbed", fusion=()))
    pred = predicted(run, load_gpu(REPORTS / "cpu-calibration.yaml"))
    ops = pred.merge(measured[["phase", "name", "measured_time_s"]], on=["phase", "name"], how="outer")
    assert ops.notna().all().all() and len(ops) == len(measured), "every measured operator has its prediction"
    cls = ops.groupby(["phase", "op_class"])[["roofline_time_s", "calibrated_time_s", "measured_time_s"]].sum()
    assert {c for _, c in cls.index} >= {"gemm", "attention", "norm", "elementwise", "embedding"}
    med = {m: statistics.median(abs(cls[f"{m}_time_s"] / cls.measured_time_s - 1)) for m in ("roofline", "calibrated")}
    assert med["calibrated"] < med["roofline"], med


@pytest.mark.slow  # calibrate, then 3 models profiled: half a minute on a quiet core
def test_calibrate_then_validate_runs_and_reports_both_models(tmp_path):
    gpu = tmp_path / "cpu.yaml"
    r = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick", "--threads", "1", "-o", str(gpu)])
    assert r.exit_code == 0, r.output
    eff = load_gpu(gpu).efficiency
    assert eff is not None and eff.conditions["device"] == "cpu" and eff.conditions["dtype"] == "fp32"
    assert "microbenchmarks" in eff.conditions["fitting_set"]
    rep = tmp_path / "rep"
    # --retries 0: nothing below depends on the machine having been quiet.
    r = CliRunner().invoke(app, ["validate", *MODELS, "--gpu", str(gpu), "--device", "cpu", "--layers", "2",
                                 "--prompt", "96", "--gen", "4", "--repeats", "3", "--threads", "1", "--retries", "0",
                                 "--report-dir", str(rep), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    for model in MODELS:
        mine = [x for x in rows if x["model"].startswith(model)]
        assert {x["op_class"] for x in mine} >= {"gemm", "attention", "norm", "elementwise", "embedding", "total",
                                                "end to end"}
        for x in mine:  # measured, and the calibrated (expected) time never below the roofline (a lower bound)
            assert x["measured_time_s"] > 0 and x["calibrated_time_s"] >= x["roofline_time_s"] > 0, (model, x)
    md = (rep / "validate-tiny-gqa+tiny-moe+tiny-mla-cpu-fp32.md").read_text()
    assert "fitting set (calibrated model): lmcost calibrate microbenchmarks" in md
    assert "evaluation set (never used in fitting): tiny-gqa (2 layers)" in md and "tiny-mla (2 layers)" in md
    assert ("| phase | class | roofline (ms) | calibrated (ms) | measured (ms) | spread % | roofline error % | "
            "calibrated error % |") in md
    assert md.count("1 intra-op thread(s); reference kernel") == 3 and md.count("| decode | end to end |") == 3
    assert md.count("Median absolute error over classes: roofline") == 3


@pytest.mark.parametrize("args, start", [
    (["validate", "tiny-gqa", "bert-large-layer", "--gpu", "h100"], "error: model: bert-large-layer is a bare layer stack"),
    (["profile", "bert-large-layer"], "error: model: bert-large-layer is a bare layer stack"),
    (["validate", "tiny-gqa", "--gpu", "h100", "--report-dir", "{file}/sub"], "error: --report-dir: {file} is a file"),
    (["profile", "tiny-gqa", "--trace", "{file}/t.json"], "error: --trace: {file} is a file"),
    (["validate", "tiny-gqa", "gpt2", "--gpu", "h100", "--prompt", "1024"], "error: --prompt + 1: the decode step after 1024 tokens"),
    (["profile", "gpt2", "--prompt", "2000"], "error: --prompt + 1: the decode step after 2000 tokens"),
    (["validate", "tiny-gqa", "tiny-gqa", "--gpu", "h100"], "error: MODELS: a model is given twice"),
    (["validate", "tiny-gqa", "--gpu", "h100", "--batch", "1,1"], "error: --batch: a batch size is repeated"),
])
def test_refused_before_anything_runs_or_is_written(tmp_path, args, start):
    f = tmp_path / "afile"
    f.write_text("x")
    args = [a.replace("{file}", str(f)) for a in args]
    r = CliRunner().invoke(app, [*args, "--report-dir" if args[0] == "validate" and "--report-dir" not in args else "--layers",
                                 str(tmp_path / "rep") if args[0] == "validate" and "--report-dir" not in args else "1"])
    assert r.exit_code == 2 and r.stderr.startswith(start.replace("{file}", str(f))), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "rep").exists()


@pytest.mark.slow  # a calibration: 20 s
def test_calibrate_always_measures_the_vector_rate(tmp_path):
    out = tmp_path / "bf.yaml"
    r = CliRunner().invoke(app, ["calibrate", "--quick", "--dtypes", "bf16", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert set(load_gpu(out).peak_tflops) == {"fp32", "bf16"}


def test_a_trace_with_a_negative_duration_is_refused(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [dict(ph="X", cat="kernel", name="gemm", ts=0, dur=-5)]}))
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(p)])
    assert r.exit_code == 2 and "negative duration" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
