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
