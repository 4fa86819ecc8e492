"""The MoE and attention layouts of lmcost.model.hf.layouts_a (aria_text, beam, cohere2_moe, exaone_moe, flint,
hy_v3) against transformers: the KV cache it allocates, the layers it leaves unrotated, its parameters with the
flags the mappings read flipped from their defaults, and the keys refused. Their default configs are checked in
tests/test_params.py and their matmul FLOPs (prefill and decode) in tests/test_flop_oracle.py."""

from __future__ import annotations

import warnings

import pytest

from conftest import hf_decode_cache, hf_param_count
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts
from lmcost.model.hf import layouts_a
from lmcost.model.hf.families import from_hf_config

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BF16 = Precision("bf16", "bf16", "bf16")
#: Few small experts (the defaults are up to 256 of width 2560), so a bf16 model of 4 layers builds in a blink.
SMALL_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)


def test_the_file_maps_its_six_types():
    assert layouts_a.FAMILIES == ["aria_text", "beam", "cohere2_moe", "exaone_moe", "flint", "hy_v3"]


@pytest.mark.parametrize("model_type, over, kinds", [
    # Cohere2-MoE, EXAONE-MoE: every 2nd layer full attention without RoPE (layer_types derived from the pattern)
    ("cohere2_moe", dict(sliding_window=8, sliding_window_pattern=2), ["local", "global_nope"] * 2),
    ("exaone_moe", dict(sliding_window=8, sliding_window_pattern=2, **SMALL_MOE), ["local", "global_nope"] * 2),
    # Flint: layers 0, 1 and the last full (NoPE), layer 2 sliding; Beam: the last layer full (NoPE)
    ("flint", dict(sliding_window=8, shared_expert_intermediate_size=48, **SMALL_MOE),
     ["global_nope", "global_nope", "local", "global_nope"]),
    ("beam", dict(sliding_window=8, n_group=1, topk_group=1, **SMALL_MOE), ["local", "local", "local", "global_nope"]),
    # Global layers only, 2 KV heads of 16 each
    ("hy_v3", dict(**SMALL_MOE), ["global"] * 4),
    ("aria_text", dict(), ["global"] * 4),
])
def test_kv_cache_against_transformers(model_type, over, kinds):
    cfg, layers = hf_decode_cache(model_type, **{"num_hidden_layers": 4, "num_key_value_heads": 2, **over})
    assert [k for k, _ in cfg.layer_kinds()] == kinds
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    # 3 sequences at t = 5 + 14 = 19. Global layers hold 19 tokens; transformers' sliding window layer keeps
    # w - 1 = 7 between steps, lmcost min(t, w) = 8 (the rolling buffer the next query needs): one token more
    # per sliding layer, K and V x 2 heads x 16 x 2 bytes per sequence (tests/test_attention_features.py).
    assert [layer.keys.shape[2] for layer in layers] == [19 if k.startswith("global") else 7 for k in kinds]
    windowed = sum(1 for k in kinds if not k.startswith("global"))
    assert kv_bytes(cfg, BF16, 3, 19) == allocated + windowed * 3 * (2 * 2 * 16 * 2)


def _rotated(model_type: str, layer, config) -> bool:
    """Whether transformers rotates this layer's q and k (each model's own rule, read off the built module)."""
    a = layer.self_attn
    if model_type == "cohere2_moe":
        return a.sliding_window is not None or a.force_rope
    if model_type == "exaone_moe":
        return a.sliding_window is None or a.is_sliding
    if model_type == "flint":
        return a.sliding_window is not None
    return config.rope_parameters[config.layer_types[a.layer_idx]] is not None  # BeamModel


@pytest.mark.parametrize("model_type, over", [
    ("cohere2_moe", dict(first_k_dense_replace=2)),  # dense prefix of period 1: global layers that rotate
    ("cohere2_moe", dict(first_k_dense_replace=3, prefix_dense_sliding_window_pattern=2)),
    ("exaone_moe", dict()),
    ("flint", dict()),
    ("beam", dict()),
    ("beam", dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                   "full_attention": {"rope_type": "default", "rope_theta": 1e6}})),
])
def test_nope_layers_are_the_layers_transformers_leaves_unrotated(model_type, over):
    hf = transformers.CONFIG_MAPPING[model_type](num_hidden_layers=12, **over)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf)
    rotated = [_rotated(model_type, layer, hf) for layer in model.model.layers]
    cfg = from_hf_config(hf.to_dict(), model_type)
    assert [not k.endswith("_nope") for k, _ in cfg.layer_kinds()] == rotated
    assert True in rotated


@pytest.mark.parametrize("model_type, over", [
    # RMSNorm (rms_norm_eps set), shared experts, a dense prefix of its own width, biases, GQA
    ("cohere2_moe", dict(rms_norm_eps=1e-5, num_shared_experts=2, first_k_dense_replace=2,
                         prefix_dense_intermediate_size=4096, attention_bias=True, num_key_value_heads=8,
                         tie_word_embeddings=False)),
    ("exaone_moe", dict(num_shared_experts=0, mlp_layer_types=["sparse", "dense"] * 3, num_key_value_heads=8)),
    # HYV3MLP(intermediate_size=0) falls back to intermediate_size (``or``)
    ("hy_v3", dict(num_shared_experts=0, attention_bias=True, mlp_layer_types=["dense"] * 2 + ["sparse"] * 4)),
    ("hy_v3", dict(num_shared_experts=2, num_local_experts=16)),
    ("aria_text", dict(moe_num_shared_experts=0, attention_bias=True, num_key_value_heads=8)),
    ("aria_text", dict(moe_num_shared_experts=3, head_dim=64)),
    ("flint", dict(decoder_sparse_step=2, mlp_only_layers=[5], shared_expert_intermediate_size=0,
                   attention_bias=True)),
    ("beam", dict(final_logit_softcapping=None, tie_word_embeddings=True, mlp_layer_types=["sparse"] * 6)),
])
def test_flags_are_exact(model_type, over):
    data = transformers.CONFIG_MAPPING[model_type](num_hidden_layers=6, **over).to_dict()
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type, change, field", [
    ("hy_v3", dict(mlp_bias=True), "mlp_bias"),
    ("aria_text", dict(mlp_bias=True), "mlp_bias"),
    ("aria_text", dict(hidden_act="gelu"), "hidden_act"),
    ("cohere2_moe", dict(sliding_window=None), "sliding_window"),
    ("cohere2_moe", dict(expert_selection_fn="top1"), "expert_selection_fn"),
    ("flint", dict(sliding_window=None), "sliding_window"),
    ("beam", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "rope_parameters"),
    ("beam", dict(attention_bias=True), "attention_bias"),
    ("beam", dict(mlp_layer_types=["dense"]), "mlp_layer_types"),
])
def test_what_is_not_modelled_is_one_line(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}" and "\n" not in str(e.value)


def test_beam_gate_bias_is_one_bias_per_head():
    # BeamAttention: gate_proj [h*d_h, d] without bias and gate_bias [h]; lmcost's gated q_proj [d, 2*h*d_h]
    # carries the gate's columns. Without the bias, each layer would be h = 48 parameters short.
    data = transformers.CONFIG_MAPPING["beam"]().to_dict()
    cfg = from_hf_config(data, "beam")
    no_bias = cfg.model_copy(update={"attention": cfg.attention.model_copy(update={"output_gate_bias": False})})
    assert param_counts(cfg)["total"] - param_counts(no_bias)["total"] == 52 * 48
