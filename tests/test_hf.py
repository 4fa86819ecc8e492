"""Hugging Face config mapping: layer patterns against transformers, and clear errors for what is not modelled."""

from __future__ import annotations

import pytest

from conftest import hf_json, hf_param_count
from lmcost.basics.errors import LmcostError
from lmcost.model.hf.families import from_hf_config

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model_type, over", [
    ("gemma2", {}),                                                              # alternating local/global
    ("gemma3_text", {"num_hidden_layers": 14}),                                  # 5 local : 1 global
    ("qwen2", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 4}),
    ("olmo3", {"num_hidden_layers": 10}),                                        # 3 local : 1 global
    ("ministral", {"head_dim": 128}),                                            # every layer local
    ("dots1", {"max_window_layers": 3, "num_hidden_layers": 6, "n_routed_experts": 8, "n_shared_experts": 1,
               "num_experts_per_tok": 2}),
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
    ({"hidden_act": "mish"}, "hidden_act"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"model_type": "bert"}, "model_type"),
    ({"cross_attention_layers": [3, 8]}, "cross_attention_layers"),
])
def test_unmodelled_fields_are_errors(change, field):
    data = {**hf_json("llama-3-8b"), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "config.json")
    assert e.value.field == f"config.json: {field}"


@pytest.mark.parametrize("model_type", ["llama", "minicpm3", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa", "minimax_m2"])
def test_a_window_where_the_config_class_has_none_is_refused(model_type):
    # LlamaConfig and its kin have no sliding_window: the models never apply one, so a window set is refused
    # (as bloom's and mamba's mappings refuse it); null (none) is accepted.
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    with pytest.raises(LmcostError) as e:
        from_hf_config({**data, "sliding_window": 1024}, model_type)
    assert str(e.value) == (f"{model_type}: sliding_window: {model_type} has no sliding window (its config class has "
                            "no such key, and its attention attends to every token); remove sliding_window, or write "
                            "an lmcost YAML")
    assert from_hf_config({**data, "sliding_window": None}, model_type).attention.sliding_window is None


def test_gemma2_config_with_both_activation_keys():
    # Gemma-2 config.json files carry hidden_act and hidden_activation; the model applies the latter.
    data = transformers.CONFIG_MAPPING["gemma2"]().to_dict()
    data.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")
    assert from_hf_config(data, "gemma2").ffn.activation == "geglu"


def test_the_shared_configs_are_all_here():
    # The 13 published configs copied from the developers' shared hf-configs: all modelled since issue 14;
    # 12 shipped as lmcost/data/models/*.yaml, qwen3-30b-a3b checked on its own (test_qwen3_moe_published_config_is_exact).
    # Issue 27 added the 5 models of the measured serving points: 4 here, kimi-k2 read as deepseek_v3 in test_params.
    from conftest import HF_CONFIGS, HF_DIR, UNSUPPORTED

    assert len(HF_CONFIGS) == 16
    assert {p.stem for p in HF_DIR.glob("*.json")} - {p.stem for p in HF_CONFIGS} == UNSUPPORTED


def test_qwen3_moe_published_config_is_exact():
    # Qwen3-30B-A3B (refused before issue 14): 30.5B parameters, as transformers builds it; 3.3B active.
    from lmcost import param_counts
    data = hf_json("qwen3-30b-a3b")
    p = param_counts(from_hf_config(data, "qwen3-30b-a3b"))
    assert p["total"] == hf_param_count(data) == 30_532_122_624
    assert round(p["active_per_token"] / 1e9, 1) == 3.4  # 3,353,032,704: the model card's "3.3B" rounds down


@pytest.mark.parametrize("model_type, over", [
    ("glm", {}),                                                                 # default 0.5, in rope_parameters
    ("glm4", {"partial_rotary_factor": 0.25}),                                   # a top-level key, as in old files
])
def test_glm_rotary_width_matches_transformers(model_type, over):
    # RoPE rotates int(head_dim x partial_rotary_factor) dims: twice the inv_freq entries transformers builds.
    import torch

    hf = transformers.CONFIG_MAPPING[model_type](num_hidden_layers=1, **over)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    data = hf.to_dict()
    data.update(over)
    assert from_hf_config(data, model_type).d_rot == 2 * model.model.rotary_emb.inv_freq.numel()


def test_internlm3_bias_keys_and_aliases():
    # InternLM3's config.json spells the biases qkv_bias and bias (attribute_map onto attention_bias, mlp_bias).
    base = transformers.CONFIG_MAPPING["internlm3"](num_hidden_layers=2).to_dict()
    for k in ("attention_bias", "mlp_bias"):
        base.pop(k)
    cfg = from_hf_config({**base, "qkv_bias": True, "bias": True}, "internlm3")
    assert cfg.attention.qkv_bias and cfg.attention.out_bias and cfg.ffn.bias
    assert param_counts_equal({**base, "qkv_bias": True, "bias": True})
    with pytest.raises(LmcostError) as e:
        from_hf_config({**base, "qkv_bias": True, "bias": False}, "internlm3")
    assert e.value.field == "internlm3: qkv_bias"


def param_counts_equal(data: dict) -> bool:
    from lmcost import param_counts
    return param_counts(from_hf_config(data, data["model_type"]))["total"] == hf_param_count(data)


def test_granite_multipliers_change_nothing_counted_but_only_for_granite():
    data = transformers.CONFIG_MAPPING["granite"](num_hidden_layers=2, residual_multiplier=0.22,
                                                  embedding_multiplier=12.0, logits_scaling=8.0).to_dict()
    assert param_counts_equal(data)
    with pytest.raises(LmcostError) as e:
        from_hf_config({**hf_json("llama-3-8b"), "residual_multiplier": 0.22}, "config.json")
    assert e.value.field == "config.json: residual_multiplier"


@pytest.mark.parametrize("model_type, change, field", [
    ("cohere", {"use_qk_norm": True}, "use_qk_norm"),                            # per-head LayerNorm on q, k
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv"),                                    # clamps q, k, v
    ("olmoe", {"head_dim": 64}, "head_dim"),                                     # its q_norm is hidden_size wide
    ("ministral", {"head_dim": None}, "head_dim"),                               # MinistralModel needs it
    ("deepseek_v2", {"num_experts_per_tok": None}, "num_experts_per_tok"),       # DeepseekV2Config's default
    ("dots1", {"n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": None}, "num_experts_per_tok"),
    ("dots1", {"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": None}, "n_shared_experts"),
])
def test_unmodelled_fields_of_new_families_are_errors(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}"



# Adding a family that reuses known mechanisms is one registry entry in one file: a FamilySpec.
LLAMA_KEYS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=100, max_position_embeddings=256, attention_bias=False)


@pytest.fixture
def registered():
    """Registers FamilySpecs for the test and takes them out of the registry after it."""
    from lmcost.model.hf.registry import FAMILIES, register

    added = []
    yield lambda spec: added.append(register(spec))
    for spec in added:
        FAMILIES.pop(spec.model_type)


def test_a_new_family_is_one_registry_entry(registered):
    from lmcost import param_counts
    from lmcost.model.hf.llama_like import FamilySpec

    with pytest.raises(LmcostError, match="unknown model_type 'toy_llama'"):
        from_hf_config({**LLAMA_KEYS, "model_type": "toy_llama"})
    registered(FamilySpec(model_type="toy_llama"))  # the whole addition: Llama under another name
    toy = from_hf_config({**LLAMA_KEYS, "model_type": "toy_llama"}, "toy.json")
    llama = from_hf_config({**LLAMA_KEYS, "model_type": "llama"}, "toy.json")
    assert toy.source == "Hugging Face config.json (toy_llama)"
    assert toy == llama.model_copy(update={"source": toy.source})
    assert param_counts(toy) == param_counts(llama)


def test_a_new_family_reuses_mechanisms_by_name(registered):
    # A made-up family with Qwen2's attention biases (q, k and v, not o): parameters are Llama's plus the
    # biases, by hand: per layer q 4 heads x 16 + k 2 x 16 + v 2 x 16 = 128, over 2 layers = 256.
    from lmcost import param_counts
    from lmcost.model.hf.llama_like import FamilySpec, Flag

    registered(FamilySpec(model_type="toy_qwen", qkv_bias=Flag("attention_bias", True), out_bias=None))
    toy = from_hf_config({**LLAMA_KEYS, "model_type": "toy_qwen", "attention_bias": True})
    llama = from_hf_config({**LLAMA_KEYS, "model_type": "llama"})
    assert toy.attention.qkv_bias and not toy.attention.out_bias
    assert param_counts(toy)["total"] == param_counts(llama)["total"] + 256


def test_a_model_type_registers_once():
    from lmcost.model.hf.llama_like import FamilySpec
    from lmcost.model.hf.registry import register

    with pytest.raises(ValueError, match="'llama' is registered twice"):
        register(FamilySpec(model_type="llama"))


@pytest.mark.parametrize("model_type, key, value", [("gemma3", "hidden_size", 1), ("gemma3", "num_hidden_layers", 100),
                                                     ("qwen3_5", "num_hidden_layers", 100), ("llama4", "vocab_size", 7)])
def test_a_wrapper_refuses_the_decoders_keys_at_its_top_level(model_type, key, value):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), key: value}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert str(e.value) == (f"{model_type}: {key}: not a key of the {model_type} wrapper: the decoder's keys go in "
                            f"text_config; move {key} into text_config, or remove it")


def test_a_wrapper_reads_its_text_config_as_a_mapping_of_its_own_decoder():
    data = transformers.CONFIG_MAPPING["gemma3"]().to_dict()
    with pytest.raises(LmcostError) as e:
        from_hf_config({**data, "text_config": []}, "g")
    assert str(e.value) == "g: text_config: must be a mapping, got []; write text_config as the decoder's JSON object"
    default = from_hf_config(data, "g")
    assert from_hf_config({**data, "text_config": {}}, "g").d_model == default.d_model  # {}: the defaults
    with pytest.raises(LmcostError) as e:
        from_hf_config({**data, "text_config": {"model_type": "mamba"}}, "g")
    assert str(e.value) == ("g: text_config.model_type: 'mamba' is modelled, but not as the gemma3 decoder "
                            "(gemma3_text); give the gemma3 decoder's type, or map the decoder's config.json alone")
    mistral3 = transformers.CONFIG_MAPPING["mistral3"]().to_dict()  # Ministral 3 publishes ministral3 decoders
    mistral3["text_config"] = transformers.CONFIG_MAPPING["ministral3"]().to_dict()
    assert from_hf_config(mistral3, "m").n_layers == mistral3["text_config"]["num_hidden_layers"]


@pytest.mark.parametrize("types, line", [
    (["full"] * 77, "77 entries for 78 layers; give one entry per layer (num_hidden_layers), or remove indexer_types"),
    (["full"] * 79, "79 entries for 78 layers; give one entry per layer (num_hidden_layers), or remove indexer_types"),
    (["bogus"] * 78, "indexer type 'bogus' is not full or shared; give full (or shared) for each layer, or remove "
                     "indexer_types"),
])
def test_glm_moe_dsa_indexer_types_are_one_known_entry_per_layer(types, line):
    data = transformers.CONFIG_MAPPING["glm_moe_dsa"]().to_dict()
    assert data["num_hidden_layers"] == 78
    with pytest.raises(LmcostError) as e:
        from_hf_config({**data, "indexer_types": types}, "g")
    assert str(e.value) == f"g: indexer_types: {line}"


@pytest.mark.parametrize("model_type, key", [("bloom", "hidden_size"), ("longcat_flash", "hidden_size"), ("mpt", "d_model"),
                                             ("gemma3n_text", "hidden_size"), ("mamba2", "hidden_size"),
                                             ("rwkv", "hidden_size"), ("minicpm3", "hidden_size"),
                                             ("qwen3_next", "num_hidden_layers"), ("jamba", "vocab_size"),
                                             ("qwen3", "head_dim"), ("mixtral", "num_local_experts"),
                                             ("gemma2", "num_key_value_heads")])
def test_a_null_width_is_refused_not_defaulted(model_type, key):
    # transformers' strict config classes annotate these int, not int | None: a null is no default
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), key: None}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert str(e.value) == (f"{model_type}: {key}: must be a whole number >= 1, got null; write {key} as a positive "
                            "whole number (see the model card), or remove it")


def test_a_null_where_the_config_class_derives_one_is_still_a_default():
    llama = transformers.CONFIG_MAPPING["llama"]().to_dict()
    cfg = from_hf_config({**llama, "num_key_value_heads": None, "head_dim": None}, "llama")
    assert cfg.attention.n_kv_heads == llama["num_attention_heads"]


def test_a_nested_section_refuses_a_key_no_mapping_reads():
    # MPT's attn_config and DBRX's attn_config/ffn_config are read key by key (lmcost.model.hf.reader.Reader.done):
    # an unknown key inside one is named with its section, as a top-level one is.
    with pytest.raises(LmcostError) as e:
        from_hf_config({"model_type": "mpt", "attn_config": {"rope_kind": "x"}}, "mpt.json")
    assert e.value.field == "mpt.json: attn_config: rope_kind" and "not understood by the mpt mapping" in str(e.value)
