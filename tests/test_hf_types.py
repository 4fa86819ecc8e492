"""Every causal-LM model type transformers maps, walked: lmcost accepts it exactly or refuses it in one line.

The oracle is transformers itself: each type's default config built on the meta device. Accepted
families are checked for exact parameters (tests/test_params.py) and FlopCounterMode matmul FLOPs
(tests/test_flop_oracle.py) over ``lmcost.model.hf.families.SUPPORTED``; the multimodal wrappers here, against the
decoder inside the wrapper's model. Refused types must carry a reason (the README lists them) and
raise LmcostError naming model_type.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.families import SUPPORTED, WRAPPERS, accepted_types, from_hf_config
from lmcost.model.hf.verdicts import REFUSED, types_markdown
from lmcost.cost.params import param_counts

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from test_gemma_n import without_timm_tower  # noqa: E402

CAUSAL = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
README = Path(__file__).resolve().parents[1] / "README.md"


def test_at_least_120_causal_lm_types_are_accepted():
    # Issue 29's bar: at least 120 of transformers 5.24's decoder-only model types, each exact (the walkers of
    # tests/test_params.py and tests/test_flop_oracle.py check every one of them).
    assert len(set(accepted_types()) & set(CAUSAL)) >= 120


def test_every_type_is_accepted_or_refused_with_a_reason():
    accepted = set(accepted_types())
    assert not accepted & set(REFUSED), "a type both accepted and refused"
    assert set(CAUSAL) - accepted - set(REFUSED) == set(), "a causal-LM type with no verdict"


@pytest.mark.parametrize("model_type", [t for t in CAUSAL if t not in SUPPORTED])
def test_each_type_outside_the_families(model_type):
    try:
        data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    except Exception:  # gemma4_assistant: its config class refuses its own defaults
        data = {"model_type": model_type}
    if model_type in accepted_types():  # a multimodal wrapper: the decoder, exactly
        cfg = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in data.items() if k != "model_type"})
        with warnings.catch_warnings(), without_timm_tower():  # gemma3n's MobileNet tower needs timm
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                model = transformers.AutoModelForCausalLM.from_config(cfg)
        # the towers and (Gemma 3n) their embedders into the decoder's width
        tower = ("vision_tower", "multi_modal_projector", "vision_model", "audio_tower", "embed_vision", "embed_audio")
        decoder = sum(p.numel() for n, p in model.named_parameters() if not any(t in n for t in tower))
        ours = from_hf_config(data, model_type)
        assert param_counts(ours)["total"] == decoder
        # the tower: counted exactly (Gemma 3's SigLIP), or said not to be
        assert ours.vision_params == sum(p.numel() for p in model.parameters()) - decoder or "not counted" in ours.source
        return
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert "\n" not in str(e.value)
    if model_type in WRAPPERS:  # refused for its decoder, which is named
        assert e.value.field == f"{model_type}: text_config.model_type"
        assert WRAPPERS[model_type].text_type in str(e.value)
    else:
        assert e.value.field == f"{model_type}: model_type" and REFUSED[model_type] in str(e.value)


def test_readme_lists_the_types():
    # regenerate with: python -m lmcost.model.hf (between the README's hf-types markers)
    assert types_markdown(accepted_types()) in README.read_text()


def test_gemma3_wrapper_ties_by_its_own_key():
    # Gemma3ForConditionalGeneration ties lm_head by the wrapper's tie_word_embeddings, not the text
    # config's: untied, the decoder gains a [262208, 2560] lm_head (checked against transformers above
    # for the default; here by the table's arithmetic).
    data = transformers.CONFIG_MAPPING["gemma3"]().to_dict()
    tied = param_counts(from_hf_config(data, "gemma3"))["total"]
    data["tie_word_embeddings"], data["text_config"]["tie_word_embeddings"] = False, True
    t = data["text_config"]
    assert param_counts(from_hf_config(data, "gemma3"))["total"] == tied + t["vocab_size"] * t["hidden_size"]


def test_wrapper_of_an_unmodelled_decoder_is_one_line():
    with pytest.raises(LmcostError) as e:
        from_hf_config({"model_type": "mistral3", "text_config": {"model_type": "reformer"}}, "cfg.json")
    assert e.value.field == "cfg.json: text_config.model_type"
    with pytest.raises(LmcostError) as e:
        from_hf_config({"model_type": "gemma3", "text_config": "gemma"}, "cfg.json")
    assert e.value.field == "cfg.json: text_config"


@pytest.mark.parametrize("model_type, over", [
    ("stablelm", dict(use_parallel_residual=True, use_qkv_bias=True)),
    ("hyperclovax", dict(use_post_norm=False, attention_bias=True)),
    ("granitemoeshared", dict(shared_intermediate_size=1024)),
    ("glm4_moe", dict(use_qk_norm=True, attention_bias=True)),
    ("gptj", dict(n_inner=8192, tie_word_embeddings=True)),
    ("cwm", dict(mlp_bias=True)),
    ("phimoe", dict(attention_bias=True, sliding_window=2048)),
    ("jais2", dict(attention_bias=False, mlp_bias=False)),
    ("gpt_bigcode", dict(multi_query=False)),
    ("opt", dict(do_layer_norm_before=False, layer_norm_elementwise_affine=False, enable_bias=False)),
    ("opt", dict(_remove_final_layer_norm=True)),
    ("gpt_neo", dict(attention_types=[[["global"], 24]], intermediate_size=4096)),
    ("ernie4_5_moe", dict(moe_layer_interval=2, moe_layer_start_index=3, moe_layer_end_index=20,
                          moe_num_shared_experts=0, tie_word_embeddings=False)),
    ("vaultgemma", dict(attention_bias=True, tie_word_embeddings=False)),
])
def test_flags_of_the_table_families_are_exact(model_type, over):
    # Each flag a table entry reads, flipped from its default, against the transformers model it builds.
    from conftest import hf_param_count

    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **over}
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type, key", [("stablelm", "qk_layernorm"), ("phi", "qk_layernorm"),
                                             ("phimoe", "lm_head_bias"), ("olmo", "clip_qkv"),
                                             ("ernie4_5_moe", "use_bias")])
def test_flags_lmcost_does_not_model_are_refused(model_type, key):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), key: True}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {key}"


@pytest.mark.parametrize("change, field", [
    (dict(vision_config="siglip"), "g.json: vision_config"),
    (dict(vision_config={"hidden_size": -1}), "g.json: vision_config.hidden_size"),
])
def test_a_broken_vision_config_is_one_line(change, field):
    data = {**transformers.CONFIG_MAPPING["gemma3"]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "g.json")
    assert e.value.field == field


@pytest.mark.parametrize("model_type, change, field", [
    ("qwen2_moe", dict(decoder_sparse_step=0), "decoder_sparse_step"),
    ("qwen3_moe", dict(mlp_only_layers=[-1, "x"]), "mlp_only_layers"),
    ("qwen3_next", dict(full_attention_interval=0, layer_types=None), "full_attention_interval"),
    ("bamba", dict(mamba_n_heads=0), "mamba_n_heads"),
    ("bamba", dict(attn_layer_indices=[999]), "attn_layer_indices"),
    ("gemma3_text", dict(layer_types=["sliding_attention"] * 10), "layer_types"),
])
def test_periods_counts_and_layer_lists_are_checked(model_type, change, field):
    # a period of 0 divided by zero, and a layer list of the wrong entries ran as if absent: one line now
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}"


def test_keys_of_published_files_that_transformers_never_reads():
    # EleutherAI/gpt-j-6b's file carries rotary: true and gradient_checkpointing; Granite-4.0-H's the legacy
    # layer names (mamba, attention), position_embedding_type "nope", init_method and normalization_function.
    # transformers reads none of them (it remaps the layer names): the same parameters as without them.
    from conftest import hf_param_count

    gptj = {**transformers.CONFIG_MAPPING["gptj"]().to_dict(), "rotary": True, "gradient_checkpointing": False}
    assert param_counts(from_hf_config(gptj, "gptj"))["total"] == hf_param_count(gptj) == 6_050_882_784
    granite = transformers.CONFIG_MAPPING["granitemoehybrid"](num_hidden_layers=4).to_dict()
    legacy = {**granite, "layer_types": ["mamba", "attention", "mamba", "mamba"], "position_embedding_type": "nope",
              "init_method": "mup", "normalization_function": "rmsnorm"}
    modern = {**granite, "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"]}
    assert from_hf_config(legacy, "g") == from_hf_config(modern, "g").model_copy(update={"name": "g"})
    assert param_counts(from_hf_config(legacy, "g"))["total"] == hf_param_count(modern)


@pytest.mark.parametrize("value", ["4096", 4096.0, True, float("nan"), -5, 0])
def test_a_bad_width_names_the_config_key(value):
    # was "d_model: input should be a valid integer", lmcost's field, not the key in the file
    data = {**transformers.CONFIG_MAPPING["llama"]().to_dict(), "hidden_size": value}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "cfg.json")
    # NaN is caught first, as not a finite number (any key); the others as not a whole number >= 1
    said = "finite number" if value != value else "whole number >= 1"
    assert e.value.field == "cfg.json: hidden_size" and said in str(e.value)


def test_bamba_9b_file_keys_transformers_never_reads():
    # ibm-ai-platform/Bamba-9B's config.json carries attn_rotary_emb and use_mamba_kernels; BambaConfig has
    # neither field, so the model (and its parameter count) does not change with them.
    from conftest import hf_param_count

    data = transformers.CONFIG_MAPPING["bamba"](num_hidden_layers=4, attn_layer_indices=[1]).to_dict()
    published = {**data, "attn_rotary_emb": 64, "use_mamba_kernels": True}
    assert param_counts(from_hf_config(published, "b"))["total"] == hf_param_count(data)


def test_architectures_table_is_transformers_causal_lm_mapping_inverted():
    from lmcost.model.hf.architectures import CLASSES

    assert set(CLASSES) == set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    assert all(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[mt] == cls for cls, mt in CLASSES.items())


def test_an_unknown_model_type_is_read_through_its_architectures():
    # moonshotai/Kimi-K2-Instruct: model_type kimi_k2 (custom code), architectures [DeepseekV3ForCausalLM].
    from conftest import hf_json
    from lmcost.basics.errors import LmcostNote

    data = hf_json("kimi-k2")
    with pytest.warns(LmcostNote, match="read as deepseek_v3 because architectures names DeepseekV3ForCausalLM"):
        cfg = from_hf_config(data, "kimi-k2.json")
    # the published total (model card: 1T; tests/test_params.py checks 1,026,408,209,408 against transformers)
    assert param_counts(cfg)["total"] == param_counts(from_hf_config({**data, "model_type": "deepseek_v3"}))["total"]
    assert "read as deepseek_v3" in cfg.source
    # no modelled class: the unknown type's error; a refused type stays refused whatever it names
    with pytest.raises(LmcostError, match="unknown model_type"):
        from_hf_config({**data, "architectures": ["NoSuchForCausalLM"]}, "x.json")
    with pytest.raises(LmcostError, match="LSH"):
        from_hf_config({**data, "model_type": "reformer"}, "x.json")
