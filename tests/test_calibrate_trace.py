"""Calibration writes a hardware YAML the tool accepts; foreign traces are classified by kernel name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from lmcost import load_config, load_gpu
from lmcost.cli import app
from lmcost.profiling import trace as traces

pytestmark = pytest.mark.torch
pytest.importorskip("torch")


@pytest.mark.slow  # a calibration: 20 s
def test_calibrate_writes_a_yaml_that_gpu_accepts(tmp_path):
    out = tmp_path / "cpu.yaml"
    r = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick", "-o", str(out)])
    assert r.exit_code == 0, r.output
    g = load_gpu(out)
    assert g.peak_flops("fp32") > 0 and g.bandwidth > 0 and g.kernel_floor_us > 0
    # It ends with a summary of what it measured: the fp32 peak it wrote, and the fit's error per kind.
    assert f"fp32 {g.peak_tflops['fp32']:.4g} TFLOP/s" in r.stderr and "fit, median |error| per kind" in r.stderr
    # The measured floor is a lower bound on every op's predicted time.
    from lmcost.apps.estimate import phase_ops
    from lmcost.basics.dtypes import Precision
    from lmcost.cost.roofline import op_time

    cfg = load_config("gpt2")
    for op in phase_ops(cfg, Precision("fp32", "fp32", "fp32"), "decode", 1, 16):
        assert op_time(op, g, Precision("fp32", "fp32", "fp32")).time_s >= g.kernel_floor_us * 1e-6
    r = CliRunner().invoke(app, ["estimate", "gpt2", "--gpu", str(out), "--dtype", "fp32", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["gpu"] == "local-cpu"


@pytest.mark.parametrize("name, cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "gemm"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel>", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "communication"),
    ("aten::addmm", "gemm"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
])
def test_kernel_names_are_classified(name, cls):
    assert traces.classify(name) == cls


def test_foreign_cpu_trace_attributes_self_time_once(tmp_path):
    # aten::linear (10 us) holds aten::addmm (8 us): 2 + 8 us of GEMM, nothing twice. aten::mm (5 us)
    # allocates its output with aten::empty (1 us): a helper that names no class, so GEMM too. A silu (2 us).
    ev = [dict(ph="X", cat="cpu_op", name="aten::linear", ts=0, dur=10, tid=1),
          dict(ph="X", cat="cpu_op", name="aten::addmm", ts=1, dur=8, tid=1),
          dict(ph="X", cat="cpu_op", name="aten::silu", ts=12, dur=2, tid=1),
          dict(ph="X", cat="cpu_op", name="aten::mm", ts=20, dur=5, tid=1),
          dict(ph="X", cat="cpu_op", name="aten::empty", ts=20.5, dur=1, tid=1)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    df = traces.kernel_class_times(traces.load(p)).set_index("op_class")
    assert df.loc["gemm", "measured_time_s"] == pytest.approx(15e-6)
    assert df.loc["elementwise", "measured_time_s"] == pytest.approx(2e-6)
    assert df.measured_time_s.sum() == pytest.approx(17e-6)


def test_measured_breakdown_on_cpu():
    from lmcost import load_config
    from lmcost.profiling.breakdown import measured_shares

    cfg = load_config("bert-large-layer")
    df = measured_shares(cfg, "train", 1, 32, repeats=1).set_index("op_class")
    assert df.measured_share.sum() == pytest.approx(1)
    # Forward + backward of d=1024, d_ff=4096 matmuls dominate the time even on a CPU.
    assert df.loc["tensor contraction", "measured_share"] > 0.5
    assert {"normalization", "element-wise"} <= set(df.index)


def test_a_training_step_of_an_mla_model_runs_backward():
    # MLA normalises its latent KV where the cache holds it; under autograd that in-place write made
    # backward fail ("modified by an inplace operation"), so under autograd it now writes a new tensor.
    import torch

    from lmcost import load_config
    from lmcost.model.config import truncate
    from lmcost.profiling.breakdown import measured_shares
    from lmcost.profiling.decoder import build_decoder

    cfg = truncate(load_config("tiny-mla"), 1)
    df = measured_shares(cfg, "train", 1, 16, repeats=1).set_index("op_class")
    assert df.measured_share.sum() == pytest.approx(1) and df.loc["tensor contraction", "measured_time_s"] > 0
    # The autograd path computes what the inference path computes: the same logits (the no-grad pass
    # normalises in place, the grad-enabled one out of place).
    model = build_decoder(cfg, max_batch=1, max_context=16, mla_mode="naive")
    ids = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids, 0)
    model.reset_cache()
    torch.testing.assert_close(model(ids, 0), expected)


def test_bad_trace_is_one_line(tmp_path):
    p = tmp_path / "t.json"
    p.write_text("{nope")
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(p)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {p}: not JSON")


def test_validate_a_foreign_gpu_trace_by_kernel_class(tmp_path):
    # Kernels of someone's run: 100 us + 20 us of GEMM, 50 us of flash attention, 10 us of SiLU.
    ev = [dict(ph="X", cat="kernel", name="sm90_xmma_gemm_bf16bf16_bf16f32", ts=0, dur=100),
          dict(ph="X", cat="kernel", name="ampere_bf16_s16816gemm_bf16_128x64", ts=100, dur=20),
          dict(ph="X", cat="kernel", name="flash_fwd_kernel", ts=120, dur=50),
          dict(ph="X", cat="kernel", name="vectorized_elementwise_kernel<silu_kernel>", ts=170, dur=10)]
    p = tmp_path / "theirs.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(p), "--layers", "2",
                                 "--batch", "1", "--prompt", "64", "--json"])
    assert r.exit_code == 0, r.output
    rows = {x["op_class"]: x for x in json.loads(r.stdout)}
    assert rows["gemm"]["measured_time_s"] == pytest.approx(120e-6)
    assert rows["attention"]["measured_time_s"] == pytest.approx(50e-6)
    assert rows["elementwise"]["measured_time_s"] == pytest.approx(10e-6)
    # Predictions for classes the trace lacks are still listed (measured 0); by kernel name the lm_head
    # counts as gemm, while an embedding lookup has kernels of its own (indexSelect).
    assert rows["norm"]["measured_time_s"] == 0 and rows["norm"]["roofline_time_s"] > 0
    assert rows["embedding"]["measured_time_s"] == 0 and "lm_head" not in rows
    assert rows["unpredicted"]["measured_time_s"] == 0


def _calibration(**conditions) -> dict:
    """The committed CPU calibration, its conditions set to this host (or to ``conditions``)."""
    import platform

    import torch
    import yaml

    data = yaml.safe_load((ROOT / "reports" / "cpu-calibration.yaml").read_text())
    data["efficiency"]["conditions"].update(host=platform.node(), device="cpu", torch=str(torch.__version__), threads=1,
                                            reference_drift_pct=2.0)
    data["efficiency"]["conditions"].update(conditions)
    return data


def test_a_truncated_calibration_cache_is_refused(tmp_path, monkeypatch):
    # A cache cut short at a line boundary still parses as YAML: it must not be used as a calibration.
    import pytest
    import yaml

    from lmcost.basics.errors import LmcostError
    from lmcost.profiling import cache, calibrate

    full = yaml.safe_dump(_calibration(), sort_keys=False).splitlines(keepends=True)
    cut = "".join(full[: next(i for i, line in enumerate(full) if line.startswith("sources:"))])  # sources, notes gone
    path = tmp_path / "calibration.yaml"
    path.write_text(cut)
    monkeypatch.setattr(cache, "cache_path", lambda device, threads: path)
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: pytest.fail("a usable cache was measured again"))
    with pytest.raises(LmcostError, match="incomplete"):
        cache.cached_calibration("cpu", threads=1)
    path.write_text("".join(full))
    assert cache.cached_calibration("cpu", threads=1).efficiency is not None


@pytest.mark.parametrize("conditions, why", [
    (dict(torch="2.0.0"), "it was made with torch '2.0.0'"),
    (dict(threads=4), "it was made with threads 4, this run has 1"),
    (dict(host="another-host"), "it was made with host 'another-host'"),
    (dict(reference_drift_pct=50.0), "its reference kernel moved 50% while it measured"),
    (dict(fit_median_abs_error_pct=dict(gemm=80.0)), "its GEMM fit error is 80.0%"),
])
def test_a_cached_calibration_is_used_only_for_its_own_conditions_and_quality(tmp_path, monkeypatch, conditions, why):
    import yaml

    from lmcost.profiling import cache, calibrate

    path = tmp_path / "calibration.yaml"
    path.write_text(yaml.safe_dump(_calibration(**conditions), sort_keys=False))
    monkeypatch.setattr(cache, "cache_path", lambda device, threads: path)
    calls = []
    monkeypatch.setattr(calibrate, "calibrate", lambda device, threads: calls.append(threads) or _calibration())
    said = []
    gpu = cache.cached_calibration("cpu", threads=1, say=said.append)
    assert calls == [1] and len(said) == 1 and why in said[0], said
    # Measured again and cached: the fresh calibration is the one used now, and the next time.
    assert gpu.efficiency.conditions["reference_drift_pct"] == 2.0
    assert cache.cached_calibration("cpu", threads=1, say=said.append).efficiency.conditions["threads"] == 1
    assert calls == [1]


def test_a_calibration_on_a_busy_machine_is_refused_with_one_line(tmp_path, monkeypatch):
    from lmcost.basics.errors import LmcostError
    from lmcost.profiling import cache, calibrate

    path = tmp_path / "calibration.yaml"
    monkeypatch.setattr(cache, "cache_path", lambda device, threads: path)
    calls = []
    monkeypatch.setattr(calibrate, "calibrate", lambda device, threads: calls.append(1) or _calibration(reference_drift_pct=60.0))
    with pytest.raises(LmcostError, match="the machine was busy while calibrating cpu: its reference kernel moved 60%"):
        cache.cached_calibration("cpu", threads=1)
    assert len(calls) == 3 and not path.exists()  # tried three times; nothing cached


def test_a_calibration_given_as_gpu_says_when_it_was_made_under_other_conditions():
    import platform

    from lmcost.hardware.gpu import GPU
    from lmcost.profiling.validate import calibration_notes

    gpu = GPU.model_validate(_calibration(threads=2, dtype="fp32"))
    assert calibration_notes(gpu, "cpu", "fp32", 2) == []
    notes = calibration_notes(gpu, "cpu", "bf16", 1)
    assert len(notes) == 1 and "threads 2 (this run: 1), dtype 'fp32' (this run: 'bf16')" in notes[0]
    assert platform.node() and calibration_notes(GPU.model_validate(_calibration(host="elsewhere")), "cpu", "fp32", 1)


@pytest.mark.parametrize("load, threads, said", [
    (5.1, 2, "load 5.1 on 2 cores"),  # issue 24's machine: six workers on 2 cores
    (1.1, 2, "load 1.1 on 2 cores"),  # more than one runnable process beyond what 2 threads leave (2 - 2 + 1)
    (0.9, 2, None),  # an idle VM's own noise
    (9.0, 1, None),  # one thread: nothing fewer to fall back to
])
def test_busy_compares_the_load_average_with_the_cores_the_threads_leave(monkeypatch, load, threads, said):
    import os

    from lmcost.profiling import cache

    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert cache.busy(threads) == said


def test_a_busy_machine_is_refused_before_calibrating_and_between_attempts(tmp_path, monkeypatch):
    # Issue 24: validate at 2 threads on a busy 2-core machine calibrated three times over 603 s, then
    # refused. Now it refuses in one line before measuring; and when the load rises after a failed
    # attempt, it stops there instead of measuring twice more.
    import os

    from lmcost.basics.errors import LmcostError
    from lmcost.profiling import cache, calibrate

    monkeypatch.setattr(cache, "cache_path", lambda device, threads: tmp_path / "calibration.yaml")
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.1, 5.0, 4.0))
    monkeypatch.setattr(calibrate, "calibrate", lambda *a, **k: pytest.fail("measured on a busy machine"))
    with pytest.raises(LmcostError) as e:
        cache.cached_calibration("cpu", threads=2)
    assert (e.value.field, e.value.what, e.value.fix) == (
        "threads", "the machine is busy (load 5.1 on 2 cores): calibrating cpu at 2 threads would fail its quality gate",
        "pass `threads` 1 or run on an idle machine")
    loads, calls = iter([0.5, 5.1]), []  # quiet before the first attempt, busy after it
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(calibrate, "calibrate", lambda device, threads: calls.append(threads) or _calibration(reference_drift_pct=60.0))
    with pytest.raises(LmcostError, match="the machine is busy"):
        cache.cached_calibration("cpu", threads=2)
    assert calls == [2]


def test_validate_at_the_default_thread_count_falls_back_to_one_on_a_busy_machine(monkeypatch):
    import os

    from lmcost.basics.errors import LmcostError
    from lmcost.profiling import cache, control, evaluate

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.1, 5.0, 4.0))
    monkeypatch.setattr(control, "physical_cores", lambda: 2)
    asked = []

    def stop(device, refresh=False, say=None, threads=None):
        asked.append(threads)
        raise LmcostError("calibration", "stopped here", "-")

    monkeypatch.setattr(cache, "cached_calibration", stop)
    said = []
    for threads, want in ((None, 1), (2, 2)):  # the default falls back; a count given is the caller's
        with pytest.raises(LmcostError, match="stopped here"):
            evaluate.validate(evaluate.ValidateRequest(models=("tiny-gqa",), threads=threads), say=said.append)
        assert asked[-1] == want
    assert said.count("note: the machine is busy (load 5.1 on 2 cores): calibrating and running at 1 thread; "
                      "pass `threads` to choose") == 1
