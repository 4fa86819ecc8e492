"""The profiling backend end to end on the CPU: profile, validate (with its report), and the trace round trip."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from lmcost import ArchConfig, Settings
from lmcost.cli import app

pytestmark = pytest.mark.torch
pytest.importorskip("torch")
from lmcost.profiling import trace as traces  # noqa: E402
from lmcost.profiling.profile import measured_from_trace, profile  # noqa: E402

SMALL = dict(name="small-gqa", d_model=128, n_layers=2, vocab_size=512,
             attention=dict(n_heads=4, n_kv_heads=2), ffn=dict(activation="swiglu", d_ff=256))


def test_profile_measures_every_operator_and_the_trace_round_trips(tmp_path):
    import torch

    cfg = ArchConfig.model_validate(SMALL)
    run, measured, path = profile(cfg, layers=None, batch=2, prompt=32, steps=3, repeats=3,
                                  settings=Settings(kernel="flash", mla="absorbed"), trace_path=tmp_path / "t.json",
                                  threads=1)
    ops = measured.ops
    expected = {(ph, op.name) for ph in ("prefill", "decode") for op in run.ops(ph) if not op.name.endswith("attn.softmax")}
    assert set(zip(ops.phase, ops.name)) == expected
    # Samples: one prefill per repeat, one step scope per decode step (3 steps x 3 repeats).
    assert (ops.measured_time_s > 0).all() and (ops.spread_pct >= 0).all()
    assert (ops[ops.phase == "prefill"].samples == 3).all() and (ops[ops.phase == "decode"].samples == 9).all()
    # The run is controlled: one thread, set and recorded; the reference kernel read before and after.
    assert run.threads == 1 and torch.get_num_threads() == 1
    st = measured.steps
    assert st.threads == 1 and set(st.reference_s) == {"compute", "memory"} and min(map(min, st.reference_s.values())) > 0
    # Wall times: one prefill per unprofiled repeat, one time per decode step (3 steps x 3 repeats).
    assert len(st.wall["prefill"]) == 3 and len(st.wall["decode"]) == 9 and min(st.wall["decode"]) > 0
    # Consistent steps: a phase's operator rows are means over whole steps, the faster half by the sum of
    # their scopes, so they add up to the mean of those steps' sums: of 3 prefills the 2 fastest, of 9
    # decode steps the 5 fastest.
    assert len(st.scope_sum["prefill"]) == 3 and len(st.scope_sum["decode"]) == 9
    for phase, k in (("prefill", 2), ("decode", 5)):
        reported = sum(sorted(st.scope_sum[phase])[:k]) / k
        assert ops[ops.phase == phase].measured_time_s.sum() == pytest.approx(reported, rel=1e-12)
        # Each profiled step scope holds its operator scopes: the time outside them is not negative.
        assert all(s >= o for s, o in zip(st.scoped[phase], st.scope_sum[phase]))
    # Read the written trace again: the same tables and times.
    again = measured_from_trace(run, traces.load(path))
    pd.testing.assert_frame_equal(ops.reset_index(drop=True), again.ops.reset_index(drop=True))
    assert again.steps.to_dict() == st.to_dict()


@pytest.mark.slow  # a validate run profiled on the CPU
def test_validate_on_cpu_writes_its_report_and_the_trace_gives_the_same_table(tmp_path):
    cfg_path = tmp_path / "small.yaml"
    import yaml

    cfg_path.write_text(yaml.safe_dump(SMALL))
    gpu = tmp_path / "cpu.yaml"
    assert CliRunner().invoke(app, ["calibrate", "--quick", "-o", str(gpu)]).exit_code == 0
    args = ["--gpu", str(gpu), "--layers", "2", "--batch", "2", "--prompt", "32", "--gen", "3", "--repeats", "2",
            "--report-dir", str(tmp_path / "rep"), "--json"]
    r = CliRunner().invoke(app, ["validate", str(cfg_path), *args])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    # Every predicted class has a measured time (flash softmax is credited to attention), totals too.
    assert {x["op_class"] for x in rows} == {"embedding", "lm_head", "norm", "gemm", "attention", "elementwise", "total",
                                             "end to end"}
    assert all(x["measured_time_s"] > 0 and x["roofline_time_s"] > 0 and x["calibrated_time_s"] > 0 for x in rows), rows
    md = (tmp_path / "rep" / "validate-small-gqa-cpu-fp32.md").read_text()
    assert "torch 2." in md and "device: cpu" in md and "| decode | total |" in md and "Median absolute error" in md
    assert "| prefill | end to end |" in md and "reference kernel" in md and "outside operator scopes: prefill" in md
    # validate --trace on the trace that run wrote: the same measured table.
    r2 = CliRunner().invoke(app, ["validate", str(cfg_path), *args, "--trace", str(tmp_path / "rep" / "trace-small-gqa-b2.json")])
    assert r2.exit_code == 0, r2.output
    key = lambda x: (x["phase"], x["op_class"])
    assert {key(x): x["measured_time_s"] for x in json.loads(r2.stdout)} == {key(x): x["measured_time_s"] for x in rows}


def test_profile_refuses_a_run_that_does_not_fit():
    from lmcost import LmcostError, load_config
    with pytest.raises(LmcostError, match="the run needs about"):
        profile(load_config("llama-3.1-70b"), layers=80, batch=64, prompt=8192, steps=1, repeats=1)


def test_validate_trace_uses_the_recorded_run_and_refuses_another_model(tmp_path):
    cfg = ArchConfig.model_validate(SMALL)
    run, measured, path = profile(cfg, layers=None, batch=2, prompt=16, steps=2, repeats=1, trace_path=tmp_path / "t.json")
    import yaml

    cfg_path = tmp_path / "small.yaml"
    cfg_path.write_text(yaml.safe_dump(SMALL))
    # Flags that disagree with the trace (batch 64, prompt 1024) are overridden by what it recorded.
    r = CliRunner().invoke(app, ["validate", str(cfg_path), "--gpu", "h100", "--trace", str(path), "--layers", "0",
                                 "--batch", "64", "--prompt", "1024", "--report-dir", str(tmp_path / "rep"), "--json"])
    assert r.exit_code == 0, r.output
    assert "batch 2, prompt 16" in r.stderr
    assert {x["batch"] for x in json.loads(r.stdout)} == {2}
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(path), "--layers", "0"])
    assert r.exit_code == 2 and "it was taken on small-gqa, not gpt2" in r.stderr
    # A record of end-to-end times edited to a negative or boolean time is refused in one line, before
    # anything is said about the run.
    data = json.loads(path.read_text())
    for bad in ([-1.0], [True]):
        data["lmcost"]["step_times"]["wall"]["prefill"] = bad
        edited = tmp_path / "edited.json"
        edited.write_text(json.dumps(data))
        r = CliRunner().invoke(app, ["validate", str(cfg_path), "--gpu", "h100", "--trace", str(edited), "--layers", "0"])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith("error: --trace: its record of end-to-end times (lmcost.step_times) is malformed")


@pytest.mark.parametrize("content", ["[]", '{"traceEvents": []}', '{"traceEvents": [{"name": "x"}]}'])
def test_traces_without_timed_events_are_refused(tmp_path, content):
    p = tmp_path / "t.json"
    p.write_text(content)
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(p)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {p}: no timed events")


def test_profiler_marker_lines_are_filtered_and_other_lines_kept(capfd):
    # torch.profiler prints "USDT:... profiler_start/stop" on file descriptor 2; they are dropped, and
    # anything else written there meanwhile is passed on.
    import os

    from lmcost.profiling.quiet import without_profiler_lines

    with without_profiler_lines():
        os.write(2, b"USDT:2026-12-01 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"a real warning\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "a real warning" in err
