"""Shared fixtures: the real Hugging Face configs in ../shared/hf-configs and their parameter oracle."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HF_DIR = ROOT.parent / "shared" / "hf-configs"
HF_CONFIGS = sorted(HF_DIR.glob("*.json"))


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
