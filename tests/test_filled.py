"""Families whose config class leaves unset a setting its model needs (lmcost.model.hf.filled): DBRX, Nemotron,
Hunyuan dense and MoE, LFM2-MoE, Cohere's North text decoder.

Oracles: transformers (parameters on the meta device, the cache object after a prefill and a decode step,
the flags each mapping reads flipped), DBRX's model card for the published config, and the clamp's
arithmetic by hand. Their default configs, with the unset settings filled in (tests/data/filled-defaults.json),
are walked by test_params.py and test_flop_oracle.py (matmul FLOPs, prefill and decode) like every family,
and LFM2-MoE's states by test_hybrid.py.
"""

from __future__ import annotations

import json
import warnings

import pytest

from conftest import DATA, filled_default, hf_param_count
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts
from lmcost.model.hf.families import from_hf_config
from lmcost.operators.forward import Dims, forward_ops

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_flop_oracle import tiny_model  # noqa: E402
from test_hybrid import _cache_nbytes  # noqa: E402

ATTENTION_ONLY = ["cohere_compass_text", "dbrx", "hunyuan_v1_dense", "hunyuan_v1_moe", "nemotron"]


def dbrx_published() -> dict:
    return json.loads((DATA / "hf-published" / "dbrx-instruct.json").read_text())


@pytest.mark.parametrize("model_type", ATTENTION_ONLY)
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_kv_bytes_equal_transformers_cache(model_type, b, s):
    # The tiny instance of test_flop_oracle in bf16 (cohere_compass_text: a sliding RoPE layer and a full NoPE
    # one), after a prefill of s tokens and after one decode step.
    model, cfg = tiny_model(model_type)
    model = model.to(torch.bfloat16)
    ids = torch.randint(0, 100, (b, s))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids, use_cache=True)
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, Precision(), b, s)
        model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, Precision(), b, s + 1)


def test_dbrx_instruct_against_its_card():
    # databricks/dbrx-instruct's card: "132B total parameters of which 36B parameters are active on any input".
    # By hand: embed and lm_head 100352*6144 each; per layer Wqkv 6144*(6144 + 2*8*128), out_proj 6144^2, two
    # LayerNorms without bias 2*6144, router 16*6144, 16 experts of 3*6144*10752; a final norm. Active: 4 of 16.
    data = dbrx_published()
    ex = 3 * 6144 * 10752
    total = 2 * 100352 * 6144 + 40 * (6144 * 8192 + 6144**2 + 2 * 6144 + 16 * 6144 + 16 * ex) + 6144
    counts = param_counts(from_hf_config(data, "dbrx-instruct"))
    assert counts["total"] == total == hf_param_count(data) == 131_596_523_520
    assert counts["active_per_token"] == total - 40 * 12 * ex == 36_469_708_800
    assert round(total / 1e9) == 132 and counts["active_per_token"] // 10**9 == 36
    # KV per token: 40 layers x K and V x 8 heads x 128 x 2 bytes (bf16) = 160 KiB; max_seq_len is the context
    cfg = from_hf_config(data, "dbrx-instruct")
    assert kv_bytes(cfg, Precision(), 1, 1) == 40 * 2 * 8 * 128 * 2 and cfg.max_positions == 32768


def test_lfm2_8b_a1b_against_its_card():
    # LiquidAI/LFM2-8B-A1B's card: 8.3B parameters, 1.5B active. Filled default (filled-defaults.json): 24 layers,
    # 18 short convs (in_proj 2048*3*2048, out_proj 2048^2, depthwise conv 2048*3) and 6 GQA (q, o 2048^2, k, v
    # 512*2048, q/k norms 2*64); 2 dense SwiGLU FFNs 3*2048*7168, 22 MoE of 32 experts 3*2048*1792 (router
    # 32*2048, no bias: the expert bias is a buffer); two norms per layer; tied embedding 65536*2048, final norm.
    data = filled_default("lfm2_moe")
    e = 3 * 2048 * 1792
    total = (65536 * 2048 + 18 * (2048 * 6144 + 2048**2 + 2048 * 3) + 6 * (2 * 2048**2 + 2 * 512 * 2048 + 2 * 64)
             + 2 * 3 * 2048 * 7168 + 22 * (32 * e + 32 * 2048) + 24 * 2 * 2048 + 2048)
    counts = param_counts(from_hf_config(data, "lfm2_moe"))
    assert counts["total"] == total == hf_param_count(data)
    # the card's 1.5B is truncated (1.56B with the embedding), as the "37B" of DeepSeek-V3's 37.5B
    assert round(total / 1e9, 1) == 8.3 and counts["active_per_token"] // 10**8 == 15
    assert counts["active_per_token"] == total - 22 * 28 * e


def test_clip_qkv_is_a_clamp_of_q_k_v():
    # DBRX's tiny instance (4 heads of 16, 2 KV heads): per token q 4*16 and k, v 2*16 each clamped, 2 FLOPs
    # (max, min) per element; q read and written in the activation dtype, k and v in the KV dtype (fp8 here).
    cfg = from_hf_config(tiny_model("dbrx")[0].config.to_dict(), "dbrx")
    prec = Precision(kv_cache="fp8")
    b, s = 2, 5
    op = next(op for op in forward_ops(cfg, Dims.of(cfg, prec, b, s, s)) if op.role == "attn.clip_qkv")
    assert op.flops == 2 * b * s * (64 + 2 * 32)
    assert (op.act_read_bytes, op.kv_write_bytes) == (b * s * 64 * 2, b * s * 2 * 32 * 1)
    nemotron = from_hf_config(filled_default("nemotron"), "n")  # no clip_qkv: no clamp
    assert "attn.clip_qkv" not in {op.role for op in forward_ops(nemotron, Dims.of(nemotron, prec, 1, 1, 1))}


@pytest.mark.parametrize("model_type, over", [
    ("nemotron", dict(attention_bias=True, mlp_bias=True, head_dim=64, partial_rotary_factor=0.25)),
    ("hunyuan_v1_dense", dict(attention_bias=True, num_key_value_heads=None, tie_word_embeddings=True)),
    ("hunyuan_v1_moe", dict(num_experts=8, moe_topk=2, num_key_value_heads=4, intermediate_size=2048)),
    ("hunyuan_v1_moe", dict(num_local_experts=4, num_experts_per_tok=[2] * 32)),
    ("lfm2_moe", dict(num_dense_layers=0, tie_embedding=False, conv_bias=True)),
    ("lfm2_moe", dict(num_dense_layers=30)),  # more than the layers: every FFN dense
    ("cohere_compass_text", dict(attention_bias=True, num_key_value_heads=8, num_hidden_layers=4,
                                 layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                              "full_attention"],
                                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                  "full_attention": None})),
    ("dbrx", dict(d_model=1024, n_heads=8, ffn_config={"ffn_hidden_size": 512, "moe_num_experts": 8, "moe_top_k": 2,
                                                       "ffn_act_fn": {"name": "gelu"}})),
])
def test_flags_and_widths_flipped_are_exact(model_type, over):
    data = {**filled_default(model_type), **over}
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type, change, field", [
    # transformers cannot build these either (tested below where it fails at construction)
    ("nemotron", dict(num_key_value_heads=None), "num_key_value_heads"),
    ("hunyuan_v1_dense", dict(head_dim=None), "head_dim"),
    ("hunyuan_v1_moe", dict(head_dim=None), "head_dim"),
    ("lfm2_moe", dict(layer_types=None), "layer_types"),
    ("cohere_compass_text", dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4}), "rope_parameters"),
    ("dbrx", dict(attn_config={"clip_qkv": 8, "kv_n_heads": 8}), "attn_config: rope_theta"),
    # DbrxAttention's clamp(min=None, max=None) raises at the first forward
    ("dbrx", dict(attn_config={"kv_n_heads": 8, "rope_theta": 5e5}), "attn_config: clip_qkv"),
    ("dbrx", dict(tie_word_embeddings=True), "tie_word_embeddings"),
    ("dbrx", dict(ffn_config={"moe_num_experts": 4, "moe_top_k": 1, "shared_experts": 1}), "ffn_config: shared_experts"),
    ("hunyuan_v1_moe", dict(moe_topk=[1, 2] * 16), "moe_topk"),  # a top-k per layer
    ("lfm2_moe", dict(num_dense_layers=-1), "num_dense_layers"),
])
def test_unset_or_unmodelled_settings_are_one_line(model_type, change, field):
    data = {**filled_default(model_type), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)
    if field in ("num_key_value_heads", "head_dim", "layer_types", "rope_parameters", "attn_config: rope_theta"):
        with pytest.raises(Exception):  # the settings' oracle: transformers cannot build the model without them
            hf_param_count(data)


def test_dbrx_yaml_carries_clip_qkv():
    # The schema field round-trips through lmcost's YAML (model_dump -> config_from_dict) and is refused with MLA.
    from lmcost.model.config import ArchConfig
    from lmcost.model.loading import config_from_dict

    cfg = from_hf_config(dbrx_published(), "dbrx-instruct")
    assert cfg.attention.clip_qkv == 8
    assert config_from_dict(cfg.model_dump(exclude_none=True), "dbrx.yaml") == cfg
    bad = cfg.model_dump()
    bad["attention"].update(mla=dict(kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64))
    with pytest.raises(ValueError, match="clip_qkv: not modelled with mla"):
        ArchConfig.model_validate(bad)


def test_clip_qkv_saved_copy_equals_autograd(monkeypatch):
    # The reference decoder's in-place clamp keeps a copy of q, k and v for its backward: tiny-gqa (4 layers,
    # b = 2, s = 64, fp32: 128 tokens x (8 + 2 * 2 heads) x 64 x 4 bytes = 393,216 B a layer) with and without
    # clip_qkv, ours against the tensors autograd saves.
    from lmcost import load_config
    from lmcost.cost.activations import layer_activation_bytes
    from lmcost.operators.parallel import Layout
    from test_activations import FP32, _measure

    base = load_config("tiny-gqa")
    clipped = base.model_copy(update={"name": "tiny-gqa-clip",
                                      "attention": base.attention.model_copy(update={"clip_qkv": 0.05})})
    ours = {c.name: layer_activation_bytes(c, FP32, Layout(), 2, 64).per_layer["layers"] for c in (base, clipped)}
    measured = {c.name: _measure(c, "flash", "naive", 2, 64, monkeypatch)["layers"] for c in (base, clipped)}
    assert ours["tiny-gqa-clip"] - ours["tiny-gqa"] == 128 * 12 * 64 * 4 == 393_216
    assert measured["tiny-gqa-clip"] - measured["tiny-gqa"] == base.n_layers * 393_216
