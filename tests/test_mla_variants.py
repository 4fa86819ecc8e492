"""The MLA and MoE variants of lmcost.model.hf.mla_variants (issue 29): Youtu, MiniCPM3, GLM-4.x-Lite, Sarvam, A.X-K1,
LongCat-Flash (zero-computation experts, the shortcut MoE), Kolibri-1, AFMoE.

Oracles: transformers. Parameters of the default configs on the meta device (tests/test_params.py walks them
all; LongCat-Flash's here, less the gate_up rows transformers builds for its identity experts), matmul FLOPs
under FlopCounterMode (tests/test_flop_oracle.py), and here the bytes of the cache object transformers fills
in a prefill and a decode step (transformers 5.24 caches MLA's latent and RoPE key, [b,1,t,d_c] and
[b,1,t,d_r], as lmcost counts them), at several batches and contexts; published figures of LongCat-Flash.
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.model.config import ArchConfig
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.mla_variants import __name__ as MODULE
from lmcost.model.hf.registry import mapped_in
from lmcost.model.loading import config_from_dict
from lmcost.operators.forward import forward_ops

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hybrid import check_cache_bytes  # noqa: E402

VARIANTS = ["afmoe", "axk1", "glm4_moe_lite", "kolibri1", "longcat_flash", "minicpm3", "sarvam_mla", "youtu"]


def test_the_group_maps_the_variants():
    # the FamilySpec entries report llama_like's module; the functions this one's
    assert set(mapped_in(MODULE)) == {"afmoe", "kolibri1", "longcat_flash"}
    for mt in VARIANTS:
        from_hf_config(transformers.CONFIG_MAPPING[mt]().to_dict(), mt)


def longcat_unused_gate_up(data: dict) -> int:
    """Parameters of LongcatFlashExperts.gate_up_proj's rows for the identity experts, which transformers 5.24
    builds (gate_up_proj is [E + Z, 2*d_e, d], down_proj [E, d, d_e]) and no expert reads: read off the
    model's own tensors on the meta device."""
    cfg = transformers.CONFIG_MAPPING[data["model_type"]](**{k: v for k, v in data.items() if k != "model_type"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    total = 0
    for layer in model.model.layers:
        up, down = layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj
        total += (up.shape[0] - down.shape[0]) * up.shape[1] * up.shape[2]
    return total


def test_longcat_flash_published_sizes():
    data = transformers.CONFIG_MAPPING["longcat_flash"]().to_dict()
    p = param_counts(from_hf_config(data, "longcat_flash"))
    # transformers builds 741,053,585,408 on the meta device; 28 layers x 256 identity experts x 2 x 2048 x 6144
    # of them are gate_up rows no expert reads (180,388,626,432): the checkpoint's 560.66B remain.
    assert longcat_unused_gate_up(data) == 28 * 256 * 2 * 2048 * 6144 == 180_388_626_432
    assert p["total"] == hf_param_count(data) - 180_388_626_432 == 560_664_958_976
    # LongCat-Flash technical report (arXiv 2509.01322), abstract: 560B total, 18.6B-31.3B activated per token
    # (27B on average), the activated count without the input embedding (131072 x 6144). An FFN expert is
    # 3 x 6144 x 2048 in each of 28 layers; lmcost's expectation k*E/(E+Z) = 12 * 512/768 = 8 FFN experts per token.
    assert p["total"] // 10**9 == 560
    active, expert = p["active_per_token"] - 131072 * 6144, 28 * 3 * 6144 * 2048
    assert active // 10**9 == 27
    assert (active - 8 * expert) // 10**8 == 186 and (active + 4 * expert) // 10**8 == 313  # 0 and 12 FFN experts


@pytest.mark.parametrize("model_type", VARIANTS)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_kv_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    # contexts below the tiny models' 64-token window (tests/test_kv.py has the window's own check)
    check_cache_bytes(model_type, dtype, name, b, s)


def test_mla_cache_per_token_worked_by_hand():
    # GLM-4.x-Lite's default config: 47 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes = 54,144 B
    # per token; LongCat-Flash's 28 layers are 56 attention blocks: 56 x 576 x 2 = 64,512 B.
    for mt, per_token in (("glm4_moe_lite", 47 * 576 * 2), ("longcat_flash", 56 * 576 * 2)):
        cfg = from_hf_config(transformers.CONFIG_MAPPING[mt]().to_dict(), mt)
        assert kv_bytes(cfg, Precision(), 3, 1000) == 3 * 1000 * per_token


@pytest.mark.parametrize("model_type, over", [
    ("axk1", dict(mlp_layer_types=["dense"] * 3 + ["sparse"] * 58, n_shared_experts=2)),
    ("axk1", dict(first_k_dense_replace=2, moe_layer_freq=2, mlp_layer_types=None)),  # the legacy derivation
    ("glm4_moe_lite", dict(n_shared_experts=0, attention_bias=True, q_lora_rank=None)),
    ("longcat_flash", dict(router_bias=True, attention_bias=True, zero_expert_num=0)),
    ("afmoe", dict(num_dense_layers=3, num_shared_experts=0, global_attn_every_n_layers=2, layer_types=None)),
    ("afmoe", dict(num_dense_layers=32)),                                    # every layer dense: no moe section
    ("kolibri1", dict(num_local_experts=64, shared_expert_intermediate_size=1024, tie_word_embeddings=True)),
    ("minicpm3", dict(q_lora_rank=None, mlp_bias=True)),
    ("sarvam_mla", dict(q_lora_rank=1024, first_k_dense_replace=3, num_key_value_heads=None)),
])
def test_flags_flipped_are_exact(model_type, over):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **over}
    expected = hf_param_count(data)
    if model_type == "longcat_flash":
        expected -= longcat_unused_gate_up(data)
    assert param_counts(from_hf_config(data, model_type))["total"] == expected


@pytest.mark.parametrize("model_type, change, field", [
    ("glm4_moe_lite", dict(mlp_layer_types=["dense", "moe"] * 23 + ["dense"]), "mlp_layer_types"),
    ("axk1", dict(mlp_layer_types=["sparse"] * 60), "mlp_layer_types"),
    ("axk1", dict(q_lora_rank=None), "q_lora_rank"),
    ("longcat_flash", dict(q_lora_rank=None), "q_lora_rank"),
    ("longcat_flash", dict(moe_topk=900), "moe_topk"),                         # more picks than 512 + 256 experts
    ("afmoe", dict(attention_bias=True), "attention_bias"),
    ("kolibri1", dict(layer_types=["chunked_attention"] * 50), "layer_types"),
    ("minicpm3", dict(scale_emb="12"), "scale_emb"),
    ("youtu", dict(num_local_experts=8), "num_local_experts"),             # a key Youtu's dense model never reads
])
def test_bad_configs_are_one_line(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)


def test_yaml_schema_of_the_moe_variants():
    text = """
name: tiny-longcat
d_model: 64
n_layers: 2
vocab_size: 128
attention: {n_heads: 4, mla: {q_lora_rank: 32, kv_lora_rank: 24, qk_nope_head_dim: 16, qk_rope_head_dim: 8,
                              v_head_dim: 16}}
ffn: {activation: swiglu, d_ff: 96}
moe: {n_experts: 4, top_k: 2, d_ff_expert: 32, zero_experts: 4, shortcut: true, post_norm: true, layer_freq: 2}
"""
    cfg = ArchConfig.model_validate(yaml.safe_load(text))
    assert cfg.layer_kinds() == [("global", "moe"), ("global", "dense")]
    # Layer 0's FFN sublayer: the dense SwiGLU (3 x 64 x 96 = 18,432), the router over 4 + 4 experts
    # (64 x 8 = 512), 4 experts of 3 x 64 x 32 = 6,144 each (24,576) and the post-MoE norm (64): 43,584;
    # layer 1's: the dense SwiGLU alone, 18,432.
    per = param_counts(cfg)["per_block"]
    assert per["layers.moe"] - per["layers.dense"] == 512 + 24_576 + 64
    ops = {op.name: op for op in forward_ops(cfg, _dims(cfg, 3, 5))}
    # 15 tokens x 2 picks, one of them an FFN expert in expectation (2 x 4/8): 15 pairs of 2 x 64 x 32 FLOPs
    assert ops["layers.moe.moe.expert.up"].flops == 15 * 2 * 64 * 32
    assert ops["layers.moe.moe.router"].flops == 15 * 2 * 64 * 8
    assert ops["layers.moe.ffn.up"].flops == ops["layers.dense.ffn.up"].flops == 15 * 2 * 64 * 96
    assert "layers.moe.moe.shortcut_residual" in ops and "layers.moe.moe.post_norm" in ops


def _dims(cfg, b, s):
    from lmcost.apps.estimate import phase_dims

    return phase_dims(cfg, Precision(), "prefill", b, s)


def test_zero_experts_bound_top_k():
    data = dict(name="m", d_model=64, n_layers=1, vocab_size=128, attention=dict(n_heads=4),
                ffn=dict(activation="swiglu", d_ff=96), moe=dict(n_experts=4, top_k=6, d_ff_expert=32, zero_experts=1))
    with pytest.raises(LmcostError) as e:
        config_from_dict(data, "m.yaml")
    assert e.value.field == "m.yaml: moe.top_k" and "zero_experts=1" in str(e.value)


# ---- the reference decoder's MoE variants (lmcost.profiling.moe_variants, decoder_ffn.MoE) ----

LONGCAT_LIKE = dict(
    name="longcat-like", d_model=64, n_layers=2, vocab_size=128,
    attention=dict(n_heads=4, mla=dict(q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                       v_head_dim=12)),
    ffn=dict(activation="swiglu", d_ff=96),
    moe=dict(n_experts=4, top_k=2, d_ff_expert=32, d_ff_shared=48, zero_experts=4, shortcut=True, post_norm=True,
             layer_freq=2, router_bias=True))


def _longcat_decoder(kernel="flash", mla_mode="absorbed", picks=(0, 4), **kw):
    """The reference decoder of LONGCAT_LIKE with its routing fixed: the router's weight zeroed, so its bias
    alone scores the 4 FFN and 4 identity experts, and every token picks ``picks`` (FFN expert 0 and identity
    expert 4: one FFN expert per token, lmcost's expectation k*E/(E+Z) = 2*4/8)."""
    from lmcost.profiling.decoder import build_decoder
    from test_decoder import MAX_B, MAX_T

    cfg = ArchConfig.model_validate(LONGCAT_LIKE)
    model = build_decoder(cfg, max_batch=MAX_B, max_context=MAX_T, kernel=kernel, mla_mode=mla_mode, **kw)
    with torch.no_grad():
        for layer in model.layers:
            moe = getattr(layer.ffn, "moe", None)
            if moe is not None:
                moe.w_router.zero_()
                moe.b_router.zero_()
                moe.b_router[list(picks)] = torch.tensor([1.0, 0.5])
    return cfg, model


def test_decoder_parameters_and_cache_of_the_moe_variants():
    cfg, model = _longcat_decoder()
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg)["total"]
    from test_decoder import MAX_B, MAX_T

    assert sum(t.nbytes for t in model.kv_cache_tensors()) == kv_bytes(cfg, Precision("fp32", "fp32", "fp32"),
                                                                       MAX_B, MAX_T)


@pytest.mark.parametrize("kernel, mla_mode", [("flash", "absorbed"), ("naive", "naive")])
def test_decoder_flops_and_scopes_of_the_moe_variants(kernel, mla_mode):
    from lmcost.profiling.decoder import analytic_names, scope_names
    from test_decoder import S, flops_equal_analytic, profiled_names, token_ids

    cfg, model = _longcat_decoder(kernel, mla_mode, sdpa_backend="math")
    ids = token_ids()
    flops_equal_analytic(cfg, model, ids, mla_mode)
    expected = analytic_names(cfg, kernel, mla_mode)
    assert scope_names(model) == expected and profiled_names(model, ids[:, S:], S) == expected
    assert {"layers.moe.moe.shortcut_residual", "layers.moe.moe.post_norm", "layers.moe.ffn.up"} <= expected


def test_decoder_identity_experts_return_the_token():
    # Both picks identity experts (4 and 5): the routed part of the MoE is x * (p_4 + p_5), p = softmax over the
    # 8 router biases [0, 0, 0, 0, 1, 0.5, 0, 0] (the router's weight zeroed); the shared expert adds to it.
    from contextlib import nullcontext

    cfg, model = _longcat_decoder(picks=(4, 5))
    moe = model.layers[0].ffn.moe
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(torch.tensor([0, 0, 0, 0, 1.0, 0.5, 0, 0]), dim=0)
    with torch.no_grad():
        routed = moe(x, None, lambda name: nullcontext()) - moe.shared(x.reshape(6, 64), None,
                                                                      lambda name: nullcontext()).view(2, 3, 64)
    torch.testing.assert_close(routed, x * (p[4] + p[5]), rtol=1e-5, atol=1e-6)


def test_decoder_prefill_then_decode_equals_one_prefill_with_the_moe_variants():
    from test_decoder import S, token_ids

    _, model = _longcat_decoder(kernel="naive", mla_mode="naive")
    ids = token_ids()
    full = model(ids, 0)
    model.reset_cache()
    prefill, step = model(ids[:, :S], 0), model(ids[:, S:], S)
    torch.testing.assert_close(prefill, full[:, :S], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-4, atol=1e-4)
