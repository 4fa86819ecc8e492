"""Every figure draws what it should, read from its JSON (tests/figure_checks.py; no browser): axes within
their data, no annotation without text or off its axis, tick labels that do not crowd, for every figure
kind (the report's roofline and sweeps, roofline's several GPUs, kv, plan) on several GPUs.
tests/test_roofline_report.py reads the same back from the page Chromium renders."""

from __future__ import annotations

import math

import pytest

from figure_checks import drawn, problems
from lmcost import Precision, Workload, load_config, load_gpu

pytest.importorskip("plotly")

GPUS = ["a100", "h100", "h200", "mi300x", "l40s"]


@pytest.fixture(scope="module")
def llama():
    return load_config("llama-3-8b")


@pytest.mark.parametrize("gpu", GPUS)
def test_report_figures(llama, gpu):
    from lmcost.apps.report import report_figures

    figs = report_figures(llama, load_gpu(gpu), Workload(8, 1024, 64))
    for fig in (figs.roofline, figs.sweeps):
        assert problems(drawn(fig)) == [], (gpu, fig.layout.title.text)


@pytest.mark.parametrize("model, prompt", [("mixtral-8x7b", 2048), ("gpt2", 512), ("qwen2.5-7b", 32768)])
def test_report_figures_of_other_models(model, prompt):
    # A MoE model (its GEMMs turn compute-bound past the swept batches, or near their end), a learned
    # position table of 1024 (the prefill sweep stops there), a long context.
    from lmcost.apps.report import report_figures

    figs = report_figures(load_config(model), load_gpu("h200"), Workload(4, prompt, 16))
    for fig in (figs.roofline, figs.sweeps):
        assert problems(drawn(fig)) == [], (model, fig.layout.title.text)


def test_the_critical_batch_line_and_its_label_sit_at_the_critical_batch(llama):
    # H200: the batch where the decode GEMMs turn compute-bound at context 1024 (224, from
    # lmcost.apps.roofline.critical_batch, itself tested in test_roofline_report). The line is a shape,
    # placed in data units on the log axis; its label an annotation, placed in log10 units there.
    from lmcost.apps.report import report_figures

    figs = report_figures(llama, load_gpu("h200"), Workload(8, 1024, 64))
    c = figs.critical
    lines = [(s.x0, s.xref) for s in figs.sweeps.layout.shapes]
    assert lines == [(c, "x"), (c, "x2")]
    labels = [a for a in figs.sweeps.layout.annotations if a.xref == "x"]
    assert len(labels) == 1 and labels[0].x == pytest.approx(math.log10(c)) and f"b = {c}" in labels[0].text
    seen = drawn(figs.sweeps)["axes"]["x"]
    assert seen["range"][0] < math.log10(c) < seen["range"][1]
    assert seen["ticks"] == 4  # 1, 10, 100, 1000 over batches 1..2048


def test_roofline_of_several_gpus(llama):
    from lmcost.apps.roofline import roofline_points
    from lmcost.output.plots import roofline_figure

    gpus = [load_gpu(g) for g in ("a100", "h200", "mi300x", "l40s")]
    fig = roofline_figure(roofline_points(llama, gpus, [1, 64], 4096), gpus, "bf16", "t")
    assert problems(drawn(fig)) == []
    # A ceiling per peak, not per dtype: the H200's fp8 and int8 (both 1978.9 T) share one line and label.
    assert [t.text[-1] for t in fig.data if (t.name or "").startswith("h200 fp8")] == ["fp8, int8"]


@pytest.mark.parametrize("gpu", GPUS)
def test_kv_figure(llama, gpu):
    from lmcost.apps.kv import curves
    from lmcost.apps.kv_run import free_memory
    from lmcost.output.plots import kv_figure

    g = load_gpu(gpu)
    fig = kv_figure(curves(llama, g, ["base", "mqa", "mla:512"], 131072, 4), free_memory(llama, g, Precision(), None), "t")
    assert problems(drawn(fig)) == []


@pytest.mark.parametrize("gpu, tpot", [("a100", 0.05), ("h100", 0.001), ("h200", 0.05)])
def test_plan_figure(gpu, tpot):
    # TPOT 1 ms is 1000 tokens/s per user, past every point: the line (and the axis) still reach it.
    from lmcost.apps.plan import PlanRequest, run_plan
    from lmcost.output.plots import plan_figure

    plan = run_plan(PlanRequest(model="llama-3-8b", gpu=(gpu,), n_gpus=2, ttft=0.5, tpot=tpot)).plan
    fig = plan_figure(plan.points, plan.front, "t", 0.5, tpot)
    seen = drawn(fig)
    assert problems(seen) == []
    label = next(a for a in seen["annotations"] if a["text"].startswith("TPOT SLO"))
    assert label["x"] == pytest.approx(math.log10(1 / tpot))


def test_the_checks_bite():
    # The report's sweep as it was drawn before issue 24: add_vline's label passed the batch (224) where a
    # log axis takes log10 of it, and the second line's label had no text; over 224 decades dtick = 1
    # gives 224 labels.
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 2048], y=[3, 90]))
    fig.add_vline(x=224, annotation_text="decode GEMMs compute-bound from b = 224")
    fig.add_vline(x=224, annotation_position="top left")
    fig.update_xaxes(type="log", dtick=1)
    found = problems(drawn(fig))
    assert any("annotation without text" in p for p in found)
    assert any(p.startswith("axis x runs over [0, 224]") for p in found)
    assert any("225 tick labels" in p for p in found)
    # A label off its axis' range, where the range is fixed: placed, not stretching.
    fig = go.Figure(go.Scatter(x=[1, 2048], y=[3, 90]))
    fig.update_xaxes(type="log", range=[0, 3.4], dtick=1)
    fig.add_annotation(x=224, y=50, text="b = 224")
    assert problems(drawn(fig)) == ["annotation 'b = 224' at x = 224 on x, outside its range [0, 3.4]"]
    # A browser's read-back of overlapping labels.
    assert problems({"axes": {"x": dict(type="log", range=[0, 1], data=[0, 1], ticks=3, overlaps=2)},
                     "annotations": []}) == ["axis x: 2 pairs of tick labels overlap"]
