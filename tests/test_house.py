"""The house works as the README's Layout section says: adding a GPU is one YAML file."""

from __future__ import annotations

import yaml

from conftest import ROOT
from lmcost import Workload, estimate, load_config, load_gpu
from lmcost.apps.estimate import Settings


def test_a_gpu_is_one_yaml(tmp_path):
    # A new GPU is a YAML file and nothing else: the H100's datasheet figures and efficiency block under
    # another name, given by path, cost Llama-3-8B exactly as the shipped H100 does (the same figures in,
    # the same numbers out), and its name is the file's.
    data = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())
    data.update(name="my-accelerator", aliases=[], description="an accelerator of one's own")
    path = tmp_path / "my-accelerator.yaml"
    path.write_text(yaml.safe_dump(data))
    mine, shipped = load_gpu(str(path)), load_gpu("h100")
    assert mine.name == "my-accelerator"
    cfg, wl = load_config("llama-3-8b"), Workload(batch=8, prompt=2048, gen=256)
    for model in ("roofline", "calibrated"):
        a = estimate(cfg, mine, wl, settings=Settings(model=model)).to_dict()
        b = estimate(cfg, shipped, wl, settings=Settings(model=model)).to_dict()
        assert a.pop("gpu") == "my-accelerator" and b.pop("gpu") == "h100-sxm"
        assert a == b


def test_an_output_format_is_one_renderer(monkeypatch):
    # A machine format is one entry of MACHINE_FORMATS: every command decorated with machine_output then
    # takes its flag and emit prints it. Here a YAML format, registered for this test only, on a command
    # that emits {"flops": 2 * 4 * 8 * 16} (a 4x16 @ 16x8 GEMM: 2mnk = 1,024 FLOPs).
    import typer
    from typer.testing import CliRunner

    from lmcost.cli.app import emit, machine_output
    from lmcost.output import render

    monkeypatch.setitem(render.MACHINE_FORMATS, "yaml", render.MachineFormat(
        name="yaml", help="Print YAML in base units.", write=lambda data: yaml.safe_dump(data)))
    app = typer.Typer()

    @app.command()
    @machine_output
    def gemm():
        emit({"flops": 2 * 4 * 8 * 16})

    r = CliRunner().invoke(app, ["--yaml"])
    assert r.exit_code == 0 and yaml.safe_load(r.stdout) == {"flops": 1024}
    assert "--yaml" in CliRunner().invoke(app, ["--help"]).stdout
