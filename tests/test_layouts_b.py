"""The MoE and attention layouts of lmcost.model.hf.layouts_b (Laguna, Mellum, Solar Open, Sarvam-MoE, ...),
beyond the default configs that tests/test_params.py and tests/test_flop_oracle.py walk: the flags and per-layer
lists each mapping reads, exact against transformers.

Oracles: the transformers model of each config, on the meta device (parameters), under FlopCounterMode (matmul
FLOPs of a prefill and a decode step, eager attention and experts), and the cache object it fills (bytes).
"""

from __future__ import annotations

import warnings

import pytest

from conftest import hf_decode_cache, hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.layouts_b import FAMILIES

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_flop_oracle import assert_prefill_and_decode_exact  # noqa: E402
from test_hybrid import _cache_nbytes  # noqa: E402

BF16 = Precision()
#: Tiny experts for every family of this file (keys a config class lacks are left out).
TINY_MOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=48, n_shared_experts=1)

#: (model_type, overrides of tiny widths): layer lists of 4 layers, each with sliding and full layers, dense and
#: sparse ones, and the flags each mapping reads flipped from the class default.
VARIANTS = [
    ("laguna", dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
                    mlp_layer_types=["dense", "sparse", "sparse", "dense"], attention_bias=True)),
    ("laguna", dict(gating="per-element", num_attention_heads_per_layer=[4] * 4, num_key_value_heads=4)),
    ("mellum", dict(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8,
                    mlp_layer_types=["sparse", "dense", "sparse", "sparse"], attention_bias=True)),
    ("solar_open", dict(attention_bias=True, n_shared_experts=2, num_local_experts=3)),  # the alias wins
    # SarvamMoEConfig's aliases win over the canonical keys (attention_bias False, n_shared_experts 1, n_routed 4)
    ("sarvam_moe", dict(use_qkv_bias=True, use_qk_norm=False, first_k_dense_replace=2, num_shared_experts=2,
                        num_local_experts=5, num_experts=3)),
    ("mellum", dict(num_experts=3)),  # MellumConfig: the canonical num_local_experts (4) wins
    # the released period over 5 layers: DeltaNet, sliding (RoPE), DeltaNet, full (no RoPE), sliding
    ("lara_mini", dict(num_hidden_layers=5, sliding_window=8, attention_bias=True)),
]


def _config(model_type: str, over: dict) -> dict:
    """The class defaults with tiny widths (4 layers of 4 heads of 16, 2 KV heads, hidden 64) and ``over``."""
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    tiny = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, vocab_size=128, pad_token_id=None, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, **TINY_MOE)
    data.update({k: v for k, v in tiny.items() if k in data})
    for key in ("layer_types", "mlp_layer_types", "num_attention_heads_per_layer"):
        if data.get(key) is not None:
            data[key] = None  # derived for 4 layers unless ``over`` gives it
    return {**data, **over}


def _model(data: dict):
    cfg = transformers.CONFIG_MAPPING[data["model_type"]](**{k: v for k, v in data.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.AutoModelForCausalLM.from_config(cfg).eval(), from_hf_config(cfg.to_dict(), data["model_type"])


def test_every_family_of_the_file_is_exercised():
    assert sorted({mt for mt, _ in VARIANTS}) == sorted(FAMILIES)


@pytest.mark.parametrize("model_type, over", VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
def test_parameters_and_matmul_flops_equal_transformers(model_type, over):
    data = _config(model_type, over)
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)
    model, cfg = _model(data)
    assert_prefill_and_decode_exact(model, cfg, 2, 12)


@pytest.mark.parametrize("model_type", ["laguna", "mellum"])
@pytest.mark.parametrize("b, prompt, steps", [(1, 3, 2), (3, 5, 14)])
def test_kv_bytes_equal_the_cache_transformers_fills(model_type, b, prompt, steps):
    keys = transformers.CONFIG_MAPPING[model_type]().to_dict()
    over = {k: v for k, v in {**TINY_MOE, "mlp_layer_types": None, "num_attention_heads_per_layer": None}.items()
            if k in keys}
    cfg, layers = hf_decode_cache(model_type, b, prompt, steps, num_hidden_layers=4, num_key_value_heads=2,
                                  layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8, **over)
    t = prompt + steps
    assert [k for k, _ in cfg.layer_kinds()] == ["local", "global"] * 2
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    # Global layers hold t tokens; transformers' sliding layers keep min(t, w - 1) between steps, lmcost's rolling
    # buffer min(t, w) (tests/test_kv.py): one token more per sliding layer once t >= w = 8. K and V x 2 heads
    # x 16 x 2 bytes per token, layer and sequence.
    per_token = 2 * 2 * 16 * 2
    assert allocated == b * per_token * (2 * t + 2 * min(t, 7))
    assert kv_bytes(cfg, BF16, b, t) == b * per_token * (2 * t + 2 * min(t, 8))


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12)])
def test_lara_mini_state_and_kv_bytes_equal_the_cache(dtype, name, b, s):
    model, cfg = _model(_config("lara_mini", dict(num_hidden_layers=5, sliding_window=8)))
    assert [k for k, _ in cfg.layer_kinds()] == ["gated_deltanet", "local", "gated_deltanet", "global_nope", "local"]
    model = model.to(dtype)
    prec = Precision(weights=name, activations=name, kv_cache=name)
    per_token = 2 * 2 * 16 * prec.B_kv  # K and V x 2 heads x 16, per attention layer and sequence
    ids = torch.randint(0, 100, (b, s))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids, use_cache=True)
        for t in (s, s + 1):
            # DeltaNet conv and recurrent states as tests/test_hybrid.py checks them; the 2 sliding layers keep
            # min(t, w - 1) tokens between steps in transformers, min(t, w) in lmcost (tests/test_kv.py)
            extra = 2 * b * per_token * (min(t, 8) - min(t, 7))
            assert _cache_nbytes(out.past_key_values) + extra == kv_bytes(cfg, prec, b, t)
            model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)


def test_refusals_name_the_key():
    base = transformers.CONFIG_MAPPING["laguna"]().to_dict()
    with pytest.raises(LmcostError, match="num_attention_heads_per_layer"):
        from_hf_config({**base, "num_attention_heads_per_layer": [48] * 39 + [32]}, "laguna")
    with pytest.raises(LmcostError, match="moe_apply_router_weight_on_input"):
        from_hf_config({**base, "moe_apply_router_weight_on_input": True}, "laguna")
    with pytest.raises(LmcostError, match="mlp_layer_types"):
        from_hf_config({**base, "mlp_layer_types": ["dense"] * 3}, "laguna")
    with pytest.raises(LmcostError, match="gating"):
        from_hf_config({**base, "gating": "per-token"}, "laguna")
