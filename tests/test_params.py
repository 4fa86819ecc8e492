"""Parameter counts against transformers on the meta device, and against published figures."""

from __future__ import annotations

import pytest
import yaml

from conftest import HF_CONFIGS, ROOT, hf_json, hf_param_count
from lmcost import load_config, param_counts
from lmcost.model.config import ArchConfig
from lmcost.model.hf.families import SUPPORTED, from_hf_config

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("path", HF_CONFIGS, ids=lambda p: p.stem)
def test_shared_configs_match_transformers_exactly(path):
    data = hf_json(path.stem)
    assert param_counts(load_config(path))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_every_supported_family_matches_transformers_defaults(model_type):
    # The transformers config class's own defaults are a real model of each family (Gemma-7B,
    # GPT-NeoX-20B, Qwen1.5-MoE, DeepSeek-V3, ...): a second oracle for families without a shared file.
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    if data.get("num_experts_per_tok") is None and "n_routed_experts" in data:
        # DeepseekV2Config and Dots1Config leave it unset (their router cannot run without it, so the
        # mapping refuses the null); 6 is DeepSeek-V2's and dots.llm1's value
        data["num_experts_per_tok"] = 6
    if model_type == "dots1":
        data.update(n_routed_experts=128, n_shared_experts=2)  # Dots1Config leaves them unset; dots.llm1's values
    if model_type == "ministral" and data.get("head_dim") is None:
        data["head_dim"] = 128  # MinistralConfig leaves it unset and its model needs it; Ministral-8B's value
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


def test_published_llama_figures():
    # Meta's model cards: Llama-3-8B 8,030,261,248 and Llama-2-7B 6,738,415,616 parameters.
    assert param_counts(load_config("llama-3-8b"))["total"] == 8_030_261_248
    assert param_counts(load_config("llama-2-7b"))["total"] == 6_738_415_616


def test_mixtral_total_and_active():
    # Mistral AI, "Mixtral of experts" (2024): 46.7B total, 12.9B active per token (k=2 of 8 experts).
    p = param_counts(load_config("mixtral-8x7b"))
    assert round(p["total"] / 1e9, 1) == 46.7
    assert round(p["active_per_token"] / 1e9, 1) == 12.9


def test_deepseek_v3_active():
    # DeepSeek-V3 technical report, abstract: 671B total, 37B activated per token (main model, no MTP).
    p = param_counts(load_config("deepseek-v3"))
    assert round(p["total"] / 1e9) == 671
    assert 37e9 <= p["active_per_token"] < 38e9


def test_tied_lm_head_counts_zero():
    p = param_counts(load_config("gpt2"))
    # GPT-2 small: 124,439,808 with the lm_head tied to the 50257 x 768 embedding (+1024 x 768 positions).
    assert p["lm_head"] == 0
    assert p["embedding"] == 50257 * 768 + 1024 * 768
    assert p["total"] == 124_439_808


def test_gated_ffn_of_eight_thirds_matches_plain_four():
    # SwiGLU with d_ff = 8/3 d has 3 * d * 8d/3 = 8 d^2 weights, as a plain FFN with d_ff = 4d (2 * 4 d^2).
    base = yaml.safe_load((ROOT / "lmcost" / "data" / "models" / "llama.yaml").read_text())
    d = 3072
    gated = ArchConfig.model_validate({**base, "d_model": d, "ffn": {"activation": "swiglu", "d_ff": 8 * d // 3}})
    plain = ArchConfig.model_validate({**base, "d_model": d, "ffn": {"activation": "gelu", "d_ff": 4 * d}})
    assert param_counts(gated)["total"] == param_counts(plain)["total"]


@pytest.mark.parametrize("path", HF_CONFIGS, ids=lambda p: p.stem)
def test_shipped_yaml_equals_hf_import(path):
    # lmcost/data/models/*.yaml are the HF configs written in lmcost's schema: same architecture, field by field.
    # The checkpoint's quantization recipe (quant, from quantization_config) is not architecture: the
    # shipped YAMLs describe the bf16 model.
    skip = {"name", "source", "aliases", "quant"}
    from_hf = load_config(path).model_dump(exclude=skip)
    shipped = load_config(path.stem).model_dump(exclude=skip)
    assert shipped == from_hf


def test_schema_example_is_llama_3_8b():
    # lmcost/data/models/llama.yaml spells out head_dim (128 = 4096 / 32), which llama-3-8b leaves derived.
    example, llama = load_config("llama"), load_config("llama-3-8b")
    assert example.d_h == llama.d_h == 128
    skip = {"name": True, "source": True, "aliases": True, "attention": {"head_dim"}}
    assert example.model_dump(exclude=skip) == llama.model_dump(exclude=skip)


@pytest.mark.parametrize("model_type, changes", [
    ("gemma", {}),                                            # GemmaConfig: head_dim=256; 3072 / 16 would be 192
    ("gemma2", {}),
    ("gemma3_text", {}),
    ("qwen3", {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8}),  # Qwen3-0.6B: 128, not 64
])
def test_a_config_without_head_dim_takes_its_class_default(model_type, changes):
    data = {k: v for k, v in transformers.CONFIG_MAPPING[model_type]().to_dict().items() if k != "head_dim"}
    data.update(changes)
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)
