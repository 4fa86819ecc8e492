"""Shared fixtures: the real Hugging Face configs in tests/data/hf-configs and their parameter oracle.

The configs are copies of the published config.json files (copied from the developers' shared hf-configs folder):
everything a test reads lives in the repository, so the tests pass on a clone with nothing beside it.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
HF_DIR = DATA / "hf-configs"
#: Configs outside the shipped-model checks: gpt-oss and Nemotron-H, families lmcost does not model yet (issue 14),
#: refused with one line; qwen3-30b-a3b, modelled since and checked exactly in test_hf (no shipped YAML of it).
UNSUPPORTED = {"qwen3-30b-a3b", "gpt-oss-20b", "nemotron-h-56b-base-8k"}
HF_CONFIGS = sorted(p for p in HF_DIR.glob("*.json") if p.stem not in UNSUPPORTED)


def hf_json(stem: str) -> dict:
    return json.loads((HF_DIR / f"{stem}.json").read_text())


def hf_param_count(data: dict) -> int:
    """sum(p.numel()) of the transformers model built on the meta device: the independent oracle."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.CONFIG_MAPPING[data["model_type"]](**{k: v for k, v in data.items() if k != "model_type"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())
