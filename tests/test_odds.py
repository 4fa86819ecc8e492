"""The decoders of lmcost.model.hf.odds, beyond the default configs that tests/test_params.py and
tests/test_flop_oracle.py walk: the per-layer lists and widths each mapping reads, exact against transformers.

Oracles: the transformers model of each config, on the meta device (parameters), under FlopCounterMode (matmul
FLOPs of a prefill and a decode step, eager attention and experts), and the cache object it fills (bytes).
"""

from __future__ import annotations

import warnings

import pytest

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.odds import FAMILIES

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import test_layouts_b  # noqa: E402
from test_hybrid import _cache_nbytes  # noqa: E402
from test_layouts_b import _config as layouts_b_config, _model  # noqa: E402

#: (model_type, overrides of tiny widths): 4 layers with sliding and full layers, dense and sparse ones, value
#: heads narrower than q/k heads (8 beside 16), and the flags each mapping reads flipped from the class default.
VARIANTS = [
    ("mimo_v2_flash", dict(layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                           mlp_layer_types=["sparse", "dense", "sparse", "dense"], v_head_dim=8, sliding_window=8,
                           attention_bias=True)),
    ("mimo_v2_flash", dict(num_key_value_heads=1, v_head_dim=24)),  # MQA on full layers, 2 KV heads on sliding ones
    # 5 attention and FFN experts, top 3: 6 query heads over 2 KV heads of 16; an untied lm_head, GELU experts
    ("jetmoe", dict(kv_channels=16, num_local_experts=5, num_experts_per_tok=3, tie_word_embeddings=False,
                    activation_function="gelu")),
    # dynamic mask attention over a window of 8 (a prefill of 12 tokens: dt_proj over 12 keys, the decode step's
    # over 8), GQA, biases on the attention and the MLP; and the class defaults (MHA, no window)
    ("doge", dict(sliding_window=8, attention_bias=True, mlp_bias=True)),
    ("doge", dict(num_key_value_heads=None, sliding_window=None)),
]


def _config(model_type: str, over: dict) -> dict:
    """The class defaults with tests/test_layouts_b.py's tiny widths (4 layers of 4 heads of 16, 2 KV heads,
    hidden 64, 4 experts of 32, top 2), MiMo's values as wide as its q/k heads, and ``over``."""
    return layouts_b_config(model_type, {**({"v_head_dim": 16} if model_type == "mimo_v2_flash" else {}), **over})


def test_every_family_of_the_file_is_exercised():
    assert sorted({mt for mt, _ in VARIANTS}) == sorted(FAMILIES)


@pytest.mark.parametrize("model_type, over", VARIANTS, ids=lambda v: v if isinstance(v, str) else "")
def test_parameters_and_matmul_flops_equal_transformers(model_type, over):
    # tests/test_layouts_b.py's check (meta-device parameters, FlopCounterMode prefill and decode) of this config
    data = _config(model_type, over)
    test_layouts_b.test_parameters_and_matmul_flops_equal_transformers(model_type, {k: data[k] for k in data
                                                                                     if k != "model_type"})


def test_mimo_parameters_by_hand():
    # Layer 0 sliding + MoE, layer 1 full + dense (d 64, 4 heads of 16, values of 8, 2 KV heads, 4 on sliding):
    # sliding attention q 64*64, k 64*4*16, v 64*4*8, o 4*8*64, sinks 4; full: k 64*2*16, v 64*2*8, no sinks;
    # MoE router 4*64 + 4 experts of 3*64*32; dense MLP 3*64*96; 2 norms of 64 per layer; embed, lm_head, norm.
    data = _config("mimo_v2_flash", dict(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"],
                                         mlp_layer_types=["sparse", "dense"], v_head_dim=8))
    sliding = 64 * 64 + 64 * 64 + 64 * 32 + 32 * 64 + 4
    full = 64 * 64 + 64 * 32 + 64 * 16 + 32 * 64
    expected = sliding + full + (4 * 64 + 4 * 3 * 64 * 32) + 3 * 64 * 96 + 4 * 64 + 2 * 128 * 64 + 64
    assert param_counts(from_hf_config(data, "mimo_v2_flash"))["total"] == expected == hf_param_count(data)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 5), (2, 11)])
def test_mimo_kv_bytes_equal_the_cache(dtype, name, b, s):
    # sliding layers keep 4 KV heads (2 x num_key_value_heads) of K [16] and V [8]; the full layer 2 heads
    model, cfg = _model(_config("mimo_v2_flash", dict(
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        v_head_dim=8, sliding_window=8)))
    assert [k for k, _ in cfg.layer_kinds()] == ["local", "global", "local", "local"]
    prec = Precision(weights=name, activations=name, kv_cache=name)
    for t, cached in _cache_bytes(model, dtype, b, s):
        # the 3 sliding layers keep min(t, w - 1) tokens between steps in transformers, min(t, w) in lmcost
        # (tests/test_kv.py): one token of 4 x (16 + 8) elements more per sliding layer once t >= w = 8
        per_token = {"local": 4 * (16 + 8), "global": 2 * (16 + 8)}
        expected = b * prec.B_kv * (3 * per_token["local"] * min(t, 7) + per_token["global"] * t)
        assert cached == expected
        extra = 3 * b * prec.B_kv * per_token["local"] * (min(t, 8) - min(t, 7))
        assert kv_bytes(cfg, prec, b, t) == expected + extra


def _cache_bytes(model, dtype, b: int, s: int) -> list[tuple[int, int]]:
    """(context, bytes of transformers' cache object) after a prefill of b x s random tokens in ``dtype``, and
    after one decode step more."""
    model = model.to(dtype)
    ids = torch.randint(0, 100, (b, s))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids, use_cache=True)
        first = _cache_nbytes(out.past_key_values)
        model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
        return [(s, first), (s + 1, _cache_nbytes(out.past_key_values))]


def test_mimo_window_rules():
    base = transformers.CONFIG_MAPPING["mimo_v2_flash"]().to_dict()
    # MiMoV2FlashConfig: sliding_window_size + 1 (the query and the window before it)
    assert from_hf_config({**base, "sliding_window_size": 127}, "x").attention.sliding_window == 128
    assert transformers.CONFIG_MAPPING["mimo_v2_flash"](sliding_window_size=127).sliding_window == 128
    with pytest.raises(LmcostError, match="sliding_window"):
        from_hf_config({**base, "sliding_window": None}, "x")
    full = {**base, "layer_types": ["full_attention"] * 48}  # no sliding layer: no second head layout, no sinks
    a = from_hf_config(full, "x").attention
    assert (a.local_kv_heads, a.sinks, a.layer_pattern) == (None, False, ["global"])
    assert param_counts(from_hf_config(full, "x"))["total"] == hf_param_count(full)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 5), (2, 11)])
def test_jetmoe_kv_bytes_equal_the_cache(dtype, name, b, s):
    # the cache keeps K and V of the 2 shared KV heads of 16 (not the 6 query heads the 3 experts give a token):
    # 4 layers x 2 x 2 x 16 elements per token and sequence
    model, cfg = _model(_config("jetmoe", dict(kv_channels=16, num_local_experts=5, num_experts_per_tok=3)))
    assert (cfg.attention.n_heads, cfg.h_kv) == (6, 2)
    prec = Precision(weights=name, activations=name, kv_cache=name)
    for t, cached in _cache_bytes(model, dtype, b, s):
        assert cached == b * t * 4 * 2 * 2 * 16 * prec.B_kv == kv_bytes(cfg, prec, b, t)


def test_jetmoe_heads_are_derived():
    # JetMoeConfig derives num_attention_heads = num_key_value_heads * num_experts_per_tok, but a value in the file
    # is set over it, and JetMoeAttention never reads it (its queries are num_experts_per_tok experts' outputs of
    # num_key_value_heads heads each): the same model, 2 x 16 heads, whatever the file says
    data = {**transformers.CONFIG_MAPPING["jetmoe"]().to_dict(), "num_attention_heads": 7}
    cfg = from_hf_config(data, "x")
    assert cfg.attention.n_heads == 16 * 2
    assert param_counts(cfg)["total"] == hf_param_count(data)


@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 5), (2, 11)])
def test_doge_kv_bytes_equal_the_cache(dtype, name, b, s):
    # the cache keeps K and V only (the dynamic mask is recomputed from V each pass): 4 layers x 2 x 2 heads x 16
    model, cfg = _model(_config("doge", dict(sliding_window=None)))
    prec = Precision(weights=name, activations=name, kv_cache=name)
    for t, cached in _cache_bytes(model, dtype, b, s):
        assert cached == b * t * 4 * 2 * 2 * 16 * prec.B_kv == kv_bytes(cfg, prec, b, t)


def test_doge_refuses_the_cross_domain_moe():
    base = transformers.CONFIG_MAPPING["doge"]().to_dict()
    with pytest.raises(LmcostError, match="is_moe"):
        from_hf_config({**base, "is_moe": True}, "x")
