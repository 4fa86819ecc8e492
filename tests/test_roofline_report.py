"""Roofline figures, sweeps and the HTML report, read back from the figure data and opened in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT
from lmcost import Precision, Workload, estimate, load_config, load_gpu
from lmcost.cli import app
from lmcost.output.plots import roofline_figure
from lmcost.apps.report import write_report
from lmcost.basics.errors import LmcostError
from lmcost.apps.roofline import critical_batch, gemm_bound, roofline_points

pytest.importorskip("plotly")
BF16 = Precision()


def test_points_sit_where_the_numbers_say():
    cfg, gpus = load_config("llama-3-8b"), [load_gpu("h100"), load_gpu("a100")]
    points = roofline_points(cfg, gpus, [1, 8], 2048)
    fig = roofline_figure(points, gpus, "bf16", "t")
    drawn = [tr for tr in fig.data if tr.meta == "points"]
    assert len(drawn) == 2 * 2 * 2  # gpus x batches x phases
    for tr in drawn:
        phase, rest = tr.name.split(" b=")
        b, gpu = int(rest.split(" ")[0]), rest.split("(")[1].rstrip(")")
        # The same workload through `estimate`: prefill at prompt 2048, decode at context 2048.
        est_pre = estimate(cfg, load_gpu(gpu), Workload(b, 2048, 1))
        est_dec = estimate(cfg, load_gpu(gpu), Workload(b, 2047, 1))
        rows = (est_pre if phase == "prefill" else est_dec).op_classes
        rows = rows[rows.phase == phase].set_index("op_class")
        for x, y, cls in zip(tr.x, tr.y, tr.customdata):
            assert x == pytest.approx(rows.loc[cls, "flops"] / rows.loc[cls, "bytes"])
            assert y == pytest.approx(rows.loc[cls, "flops"] / rows.loc[cls, "time_s"])


def test_ridge_point_is_peak_over_bandwidth_from_the_yaml():
    raw = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())
    ridge = raw["peak_tflops"]["bf16"] * 1e12 / (raw["bandwidth_tb_s"] * 1e12)  # 989.4e12 / 3.35e12 = 295.3
    g = load_gpu("h100")
    fig = roofline_figure(roofline_points(load_config("llama-3-8b"), [g], [1], 512), [g], "bf16", "t")
    marker = next(tr for tr in fig.data if tr.meta == "ridge")
    assert marker.x[0] == pytest.approx(ridge) and marker.y[0] == pytest.approx(989.4e12)


@pytest.mark.parametrize("model, gpu", [("llama-3-8b", "h100"), ("qwen2.5-7b", "a100"), ("mixtral-8x7b", "h200")])
def test_critical_batch_is_where_the_decode_gemms_switch(model, gpu):
    cfg, g = load_config(model), load_gpu(gpu)
    c = critical_batch(cfg, g, BF16, 2048)
    assert gemm_bound(cfg, g, BF16, c - 1, 2048) == "memory"
    assert gemm_bound(cfg, g, BF16, c, 2048) == "compute"
    if cfg.moe is None:
        # A bf16 GEMM's intensity is about b (2 FLOPs per 2-byte weight per token): near the ridge point.
        assert g.ridge_point("bf16") < c < 1.5 * g.ridge_point("bf16")


def test_roofline_command(tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["roofline", "llama-3-8b", "--gpu", "h100", "--gpu", "a100", "--gpu", "mi300x",
                                 "--phase", "decode", "--batch", "1,8,64", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d["critical_batch"]) == {"h100-sxm", "a100-80gb", "mi300x"}
    assert {p["phase"] for p in d["points"]} == {"decode"}
    assert out.exists() and 'src="http' not in out.read_text()


def test_png_option_is_gone():
    # --png printed a failure and exited 0 where no image exporter was installed (issue 11): removed.
    r = CliRunner().invoke(app, ["roofline", "llama-3-8b", "--png"])
    assert r.exit_code == 2


def test_points_are_coloured_and_labelled_by_class():
    fig = roofline_figure(roofline_points(load_config("llama-3-8b"), [load_gpu("h100"), load_gpu("a100")], [1, 64], 2048),
                          [load_gpu("h100"), load_gpu("a100")], "bf16", "t")
    colours = {}
    for tr in (t for t in fig.data if t.meta == "points"):
        assert list(tr.text) == list(tr.customdata)  # each point labelled with its class
        for cls, colour in zip(tr.customdata, tr.marker.color):
            assert colours.setdefault(cls, colour) == colour  # one colour per class, across GPUs and phases
    assert len(set(colours.values())) == len(colours)
    legend = [t.name for t in fig.data if t.showlegend is not False and t.meta not in ("points", "ridge")]
    assert set(colours) <= set(legend) and not any("ceiling" in n for n in legend)
    roofs = [t.line.color for t in fig.data if t.name and t.name.endswith("roof (bf16)")]
    assert len(set(roofs)) == 2  # the two GPUs' roofs differ in colour


def test_report_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    target = tmp_path / "rep"
    write_report(load_config("llama-3-8b"), load_gpu("h100"), Workload(2, 256, 16), target)
    assert sorted(p.name for p in target.iterdir()) == ["index.html", "ops.csv", "roofline_points.csv", "summary.json"]
    before = (target / "summary.json").read_text()
    import pandas as pd

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_csv", boom)
    with pytest.raises(LmcostError, match="disk full"):  # one line, naming the folder and the cause
        write_report(load_config("mistral-7b"), load_gpu("h100"), Workload(1, 128, 4), target)
    # The old report is intact and no temporary folder is left beside it.
    assert (target / "summary.json").read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # network off: every host resolves to nothing, and no proxy is reachable
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9"]

#: Run in the rendered page once its figures are drawn: per figure, what plotly.js laid out (_fullLayout:
#: each axis' type and range, log10 units on a log axis; the annotations) and what the SVG shows (the
#: tick labels of each axis, and how many pairs of them overlap by more than a pixel), the extent of
#: each axis' data (_fullData and shapes), and every SVG text reading "new text"; written into the page
#: as JSON in <pre id="probe"> for --dump-dom to return. The same shape as figure_checks.drawn.
PROBE = """
window.addEventListener('load', () => setTimeout(() => {
  const out = {figures: {}, newText: 0};
  const put = (ax, v, data) => { if (v !== null && v !== undefined && isFinite(v) && (ax.type !== 'log' || v > 0))
                                   data.push(ax.type === 'log' ? Math.log10(v) : +v); };
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const fl = gd._fullLayout, axes = {};
    for (const k of Object.keys(fl)) {
      if (!/^[xy]axis[0-9]*$/.test(k)) continue;
      const ax = fl[k], letter = ax._id[0], boxes = [], data = [];
      for (const t of gd.querySelectorAll('g.' + ax._id + 'tick text')) {
        if (!t.textContent) continue;
        const r = t.getBoundingClientRect();
        boxes.push([r.left, r.top, r.right, r.bottom]);
      }
      let overlaps = 0;
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const a = boxes[i], b = boxes[j];
        if (a[0] < b[2] - 1 && b[0] < a[2] - 1 && a[1] < b[3] - 1 && b[1] < a[3] - 1) overlaps++;
      }
      for (const tr of gd._fullData) if (tr[letter + 'axis'] === ax._id) for (const v of (tr[letter] || [])) put(ax, v, data);
      for (const sh of fl.shapes || []) if (sh[letter + 'ref'] === ax._id) { put(ax, sh[letter + '0'], data); put(ax, sh[letter + '1'], data); }
      axes[ax._id] = {type: ax.type, range: ax.range, ticks: boxes.length, overlaps: overlaps,
                      data: data.length ? [Math.min(...data), Math.max(...data)] : null};
    }
    out.figures[gd.id] = {axes: axes,
                          annotations: (fl.annotations || []).map(a => ({text: a.text, x: a.x, y: a.y, xref: a.xref, yref: a.yref}))};
  }
  for (const t of document.querySelectorAll('svg text')) if (/new text/i.test(t.textContent)) out.newText++;
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 500));
"""


def _render(url: str, profile, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1300,900",
                           "--virtual-time-budget=10000", *extra, url], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (.ci/run installs Debian's chromium)")
@pytest.mark.browser
@pytest.mark.parametrize("gpu", ["h200", "a100", "mi300x"])
def test_report_renders_offline_in_chromium(gpu, tmp_path):
    # The report of each GPU, opened with the network off: no console error, every roofline point drawn,
    # and what the figures draw read back from the page (PROBE) passes figure_checks.problems with the
    # browser's own tick labels: none overlapping, at most 20 per axis (plotly adds 2 and 5 between
    # powers of ten on the roofline), no "new text". Issue 24: the H200's, A100's and MI300X's sweeps
    # ran their batch axes to 1e224, 1e163 and 1e272, with hundreds of overlapping labels.
    import html
    import re

    from figure_checks import problems

    target = tmp_path / "rep"
    write_report(load_config("llama-3-8b"), load_gpu(gpu), Workload(8, 1024, 64), target)
    page = (target / "index.html").read_text(encoding="utf-8")
    probe = target / "probe.html"  # the report with PROBE run after it: the report itself is left as written
    probe.write_text(page.replace("</body></html>", f"<script>{PROBE}</script></body></html>"), encoding="utf-8")
    profile = tmp_path / "profile"
    dom = _render(probe.as_uri(), profile, "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    console_errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and ("rror" in line or "Uncaught" in line)]
    assert console_errors == []
    # Plotly draws every marker as <path class="point ...">: the roofline div holds one per operator-class
    # point with finite intensity, plus one ridge marker.
    roof = dom.stdout.split('id="roofline"', 1)[1].split('id="sweeps"', 1)[0]
    pts = roofline_points(load_config("llama-3-8b"), [load_gpu(gpu)], [1, 8, 64], 1024)
    drawable = int((np.isfinite(pts.arithmetic_intensity) & (pts.bytes > 0) & (pts.flops > 0)).sum())
    assert len(re.findall(r'class="point[ "]', roof)) == drawable + 1
    seen = json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom.stdout, re.S).group(1)))
    assert seen["newText"] == 0
    assert set(seen["figures"]) == {"roofline", "sweeps"}
    for name, fig in seen["figures"].items():
        assert problems(fig, max_ticks=20) == [], name
        assert all(ax["ticks"] >= 2 for ax in fig["axes"].values()), name  # every axis labelled
    # The critical batch's label is drawn on the first sweep, inside its batch axis.
    crit = critical_batch(load_config("llama-3-8b"), load_gpu(gpu), BF16, 1024)
    label = next(a for a in seen["figures"]["sweeps"]["annotations"] if a["xref"] == "x")
    assert label["text"].endswith(f"from b = {crit}") and label["x"] == pytest.approx(np.log10(crit))
    if gpu == "h200":  # one screenshot: the page is drawn, not blank (a blank page has one or two colours)
        from PIL import Image

        shot = tmp_path / "shot.png"
        _render((target / "index.html").as_uri(), profile, f"--screenshot={shot}")
        colors = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50


def test_report_never_replaces_a_folder_that_is_not_a_report(tmp_path):
    from lmcost import LmcostError
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(LmcostError, match="exists and is not an lmcost report"):
        write_report(load_config("llama-3-8b"), load_gpu("h100"), Workload(1, 64, 4), mine)
    assert (mine / "notes.txt").read_text() == "keep me"
    for bad in (".", str(tmp_path)):  # an empty -o is refused as empty by its option (test_units)
        r = CliRunner().invoke(app, ["report", "llama-3-8b", "-o", bad])
        assert r.exit_code == 2 and r.stderr.startswith("error: -o: "), r.stderr


@pytest.mark.parametrize("args, prefix", [
    (["roofline", "llama-3-8b", "-o", "r.png"], "error: r.png: the figure is written as HTML"),
    (["roofline", "llama-3-8b", "--context", "0"], "error: --context: must be a whole number"),
    (["roofline", "llama-3-8b", "--batch", "x"], "error: --batch: 'x' is not a list of whole numbers"),
    (["kv", "gpt2", "--context", "4k"], "error: --context: 4096 exceeds the 1024 learned positions"),
    (["kv", "llama-2-7b", "--window", "999999999999"], "error: options: attention.sliding_window: "),
])
def test_figure_command_errors(args, prefix, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.stderr.startswith(prefix), r.stderr
    assert list(tmp_path.iterdir()) == []


def test_roofline_at_a_context_past_int64_flops():
    # 10M tokens of prefill: FLOPs past 2^63 as exact ints; the points are still finite numbers.
    pts = roofline_points(load_config("llama-3-8b"), [load_gpu("h100")], [1], 10 * 2**20)
    assert np.isfinite(pts[pts.bytes > 0].arithmetic_intensity.astype(float)).all()


def test_sweeps_say_what_their_colours_and_line_mean():
    from lmcost.output.plots import sweep_figure
    from lmcost.apps.roofline import batch_sweep, prompt_sweep

    cfg, g = load_config("llama-3-8b"), load_gpu("h100")
    c = critical_batch(cfg, g, BF16, 2048)
    fig = sweep_figure(batch_sweep(cfg, g, BF16, 2048, [2**i for i in range(12)]),
                       prompt_sweep(cfg, g, BF16, 1, [2**i for i in range(4, 18)]), "t", c)
    legend = {t.name for t in fig.data if t.showlegend is not False}
    assert legend == {"whole phase memory-bound", "whole phase compute-bound"}
    assert any(f"compute-bound<br>from b = {c}" in (a.text or "") for a in fig.layout.annotations)
    # Powers of ten only where the data spans three or more: batches 1..2048 (1, 10, 100, 1000); the
    # decode step's time (4.6 ms at b = 1 to 200 ms at b = 2048: 10, 100 only) is labelled 1, 2, 5 times them.
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick == "D2"
