"""Hugging Face config mapping: layer patterns against transformers, and clear errors for what is not modelled."""

from __future__ import annotations

import pytest

from conftest import hf_json, hf_param_count
from lmcost.errors import LmcostError
from lmcost.hf import from_hf_config

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type, over", [
    ("gemma2", {}),                                                              # alternating local/global
    ("gemma3_text", {"num_hidden_layers": 14}),                                  # 5 local : 1 global
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 4}),
])
def test_layer_pattern_matches_transformers(model_type, over):
    # transformers derives config.layer_types itself; we derive it from the raw fields (layer_types removed).
    hf = transformers.CONFIG_MAPPING[model_type](**over)
    data = hf.to_dict()
    expected = ["local" if t == "sliding_attention" else "global" for t in hf.layer_types]
    data.pop("layer_types")
    cfg = from_hf_config(data, model_type)
    assert [kind for kind, _ in cfg.layer_kinds()] == expected
    assert cfg.attention.sliding_window == hf.sliding_window


def test_mistral_window_covers_every_layer():
    cfg = from_hf_config(hf_json("mistral-7b-v0.1"), "mistral")
    assert {kind for kind, _ in cfg.layer_kinds()} == {"local"} and cfg.attention.sliding_window == 4096


def test_falcon_new_decoder_architecture():
    # Falcon-40B style: GQA via num_kv_heads, two norms in the parallel block; parameters as transformers.
    data = transformers.CONFIG_MAPPING["falcon"](new_decoder_architecture=True, num_kv_heads=8, hidden_size=1024,
                                                num_attention_heads=16, num_hidden_layers=2).to_dict()
    cfg = from_hf_config(data, "falcon")
    assert cfg.h_kv == 8 and cfg.block == "parallel" and not cfg.parallel_shared_norm
    from lmcost import param_counts

    assert param_counts(cfg)["total"] == hf_param_count(data)


def test_deepseek_moe_layers():
    # DeepSeek-V3: first_k_dense_replace = 3 dense layers, then 58 MoE layers.
    cfg = from_hf_config(hf_json("deepseek-v3"), "ds")
    kinds = [f for _, f in cfg.layer_kinds()]
    assert kinds[:3] == ["dense"] * 3 and kinds[3:] == ["moe"] * 58


@pytest.mark.parametrize("change, field", [
    ({"alibi": True, "model_type": "falcon"}, "alibi"),
    ({"hidden_act": "mish"}, "hidden_act"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"model_type": "bert"}, "model_type"),
    ({"cross_attention_layers": [3, 8]}, "cross_attention_layers"),
])
def test_unmodelled_fields_are_errors(change, field):
    data = {**hf_json("llama-3-8b"), **change}
    if data["model_type"] == "falcon":
        data = {**hf_json("falcon-7b"), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "config.json")
    assert e.value.field == f"config.json: {field}"


def test_llama_ignores_sliding_window_as_transformers_does():
    # LlamaConfig accepts sliding_window, but LlamaModel never applies it: no window, no error.
    cfg = from_hf_config({**hf_json("llama-3-8b"), "sliding_window": 4096}, "llama")
    assert cfg.attention.sliding_window is None


def test_gemma2_config_with_both_activation_keys():
    # Gemma-2 config.json files carry hidden_act and hidden_activation; the model applies the latter.
    data = transformers.CONFIG_MAPPING["gemma2"]().to_dict()
    data.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
    assert from_hf_config(data, "gemma2").ffn.activation == "geglu"


def test_the_shared_configs_are_all_here():
    # The 13 published configs copied from the developers' shared hf-configs: 10 modelled, 3 refused until issue 14.
    from conftest import HF_CONFIGS, HF_DIR, UNSUPPORTED

    assert len(HF_CONFIGS) == 10
    assert {p.stem for p in HF_DIR.glob("*.json")} - {p.stem for p in HF_CONFIGS} == UNSUPPORTED


@pytest.mark.parametrize("stem, model_type", [("qwen3-30b-a3b", "qwen3_moe"), ("gpt-oss-20b", "gpt_oss"),
                                              ("nemotron-h-56b-base-8k", "nemotron_h")])
def test_unmodelled_families_are_refused_with_one_line(stem, model_type):
    with pytest.raises(LmcostError) as e:
        from_hf_config(hf_json(stem), stem)
    assert e.value.field == f"{stem}: model_type" and repr(model_type) in str(e.value)
