"""Parameter counts against transformers on the meta device, and against published figures."""

from __future__ import annotations

import pytest
import yaml

from conftest import HF_CONFIGS, ROOT, filled_default, hf_json, hf_param_count
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
    # Where a class leaves unset what its model needs (DeepSeek-V2's top-k, DBRX's clip_qkv, ...), the
    # published checkpoint's value is filled in (tests/data/filled-defaults.json).
    data = filled_default(model_type)
    expected = hf_param_count(data)
    if model_type == "longcat_flash":  # less the gate_up rows transformers builds for its identity experts
        from test_mla_variants import longcat_unused_gate_up

        expected -= longcat_unused_gate_up(data)
    assert param_counts(from_hf_config(data, model_type))["total"] == expected


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


def test_kimi_k2_is_deepseek_v3_with_its_own_sizes():
    # moonshotai/Kimi-K2-Instruct's config.json names model_type kimi_k2 but architectures
    # DeepseekV3ForCausalLM and auto_map DeepseekV3Config: read as deepseek_v3 by lmcost and transformers.
    data = {**hf_json("kimi-k2"), "model_type": "deepseek_v3"}
    skip = {"name", "source", "aliases", "quant"}
    assert load_config("kimi-k2").model_dump(exclude=skip) == from_hf_config(data, "kimi-k2").model_dump(exclude=skip)
    assert param_counts(load_config("kimi-k2"))["total"] == hf_param_count(data)


@pytest.mark.parametrize("name, total, active, card", [
    # Llama-3.1-8B's card: 8.03B; the same 8,030,261,248 as Llama-3-8B (only RoPE scaling and context differ).
    ("llama-3.1-8b", 8_030_261_248, 8_030_261_248, (8.03, 8.03)),
    # Qwen3-32B's card: 32.8B. Embed and lm_head 2*151936*5120; per layer q, o 2*8192*5120, k, v 2*1024*5120,
    # MLP 3*5120*25600, two norms 2*5120, q/k norms 2*128; a final norm.
    ("qwen3-32b", 2 * 151936 * 5120 + 64 * (2 * 8192 * 5120 + 2 * 1024 * 5120 + 3 * 5120 * 25600 + 2 * 5120 + 256)
     + 5120, None, (32.8, 32.8)),
    # Qwen3-235B-A22B's card: 235B total, 22B activated. Per layer attention 2*8192*4096 + 2*512*4096, 128
    # experts of 3*4096*1536, router 128*4096, norms 2*4096 + 2*128; active: 8 of the 128 experts.
    ("qwen3-235b-a22b", 2 * 151936 * 4096 + 94 * (2 * 8192 * 4096 + 2 * 512 * 4096 + 128 * 3 * 4096 * 1536
     + 128 * 4096 + 2 * 4096 + 256) + 4096, 235_093_634_560 - 94 * 120 * 3 * 4096 * 1536, (235, 22)),
    # gpt-oss-120b, arXiv 2508.10925 table 1: 116.83B total, 5.13B active without the embedding (counted
    # here: + 201088 * 2880 = 0.58B).
    ("gpt-oss-120b", 116_829_156_672, 5_711_982_912, (116.83, 5.71)),
    # Kimi-K2 tech report (arXiv 2507.20534): 1.04T total, 32B activated. The release has no MTP module
    # (num_nextn_predict_layers 0): 1.026T; the report's 1.04T is with one, as DeepSeek-V3's 685B (one more
    # MoE layer, 17.1B, and its 2 * 7168^2 projection): 1.0437T.
    ("kimi-k2", 1_026_408_209_408, 32_861_477_888, (None, 32)),
])
def test_published_serving_model_figures(name, total, active, card):
    p = param_counts(load_config(name))
    assert p["total"] == total and p["active_per_token"] == (active or total)
    # A card's "32.8B" is rounded; a whole "22B" or "32B" is truncated (DeepSeek-V3's "37B" is 37.5B).
    for figure, count in zip(card, (total, p["active_per_token"])):
        if isinstance(figure, float):
            assert round(count / 1e9, len(str(figure).partition(".")[2])) == figure
        elif figure is not None:
            assert count // 10**9 == figure
    if name == "kimi-k2":
        mtp = param_counts(load_config(name).model_copy(update={"n_layers": 62}))["total"] - total + 2 * 7168**2
        assert round((total + mtp) / 1e12, 2) == 1.04


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
