"""Attention features of the modern families (issue 14): sinks (gpt-oss), chunked local attention and
interleaved MoE/dense layers (Llama 4), NoPE layers (Llama 4, SmolLM3), logit soft-capping (Gemma-2's
keys, in the schema), and gpt-oss's MXFP4 checkpoint.

Oracles: transformers models on the meta device (parameters), the cache transformers allocates after a
prefill and decode steps of a tiny bf16 instance (KV bytes), the reference decoder under FlopCounterMode
and the profiler (FLOPs, scopes), and counts worked by hand in the comments. The FlopCounterMode check of
each accepted family against transformers runs in tests/test_flop_oracle.py (parametrized over SUPPORTED).
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from conftest import hf_decode_cache as _decode_cache, hf_json, hf_param_count, in_pieces
from lmcost import param_counts
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.apps.estimate import Settings, phase_ops
from lmcost.operators.forward import Dims, forward_ops
from lmcost.model.hf.families import from_hf_config
from lmcost.cost.kvcache import kv_bytes
from lmcost.model.loading import load_config
from lmcost.operators.quant import weight_bytes

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from lmcost.profiling.decoder import analytic_names, build_decoder, scope_names  # noqa: E402

BF16 = Precision()
GIB = 2 ** 30


# ---------------------------------------------------------------------------------------------------
# Parameters against transformers on the meta device, and the published figures


@pytest.mark.parametrize("name, data, expected", [
    # gpt-oss model card (arXiv 2508.10925, table 1): 20.91B and 116.83B total parameters. GptOssConfig's
    # defaults are gpt-oss-120b (36 layers, 128 experts).
    ("gpt-oss-20b", hf_json("gpt-oss-20b"), 20_914_757_184),
    ("gpt-oss-120b", transformers.CONFIG_MAPPING["gpt_oss"]().to_dict(), 116_829_156_672),
    # Llama4TextConfig's defaults are Llama-4-Scout-17B-16E's text model (48 layers, 16 experts top 1, chunk
    # 8192, NoPE every 4th layer): 107.77B (Meta's "109B" counts the vision encoder too).
    ("llama-4-scout-text", transformers.CONFIG_MAPPING["llama4_text"]().to_dict(), 107_769_861_120),
    # SmolLM3Config's defaults are SmolLM3-3B (36 layers, NoPE every 4th, tied embeddings).
    ("smollm3-3b", transformers.CONFIG_MAPPING["smollm3"]().to_dict(), 3_075_098_624),
    # Cohere2Config's defaults (Command A's widths: 8192 x 40 layers, 3 sliding : 1 global NoPE, parallel
    # block) and Exaone4Config's (4096 x 32 layers, 3 sliding : 1 global NoPE, qk-norm, post-norm).
    ("cohere2", transformers.CONFIG_MAPPING["cohere2"]().to_dict(), 34_980_831_232),
    ("exaone4", transformers.CONFIG_MAPPING["exaone4"]().to_dict(), 9_429_069_824),
])
def test_parameters_equal_transformers_on_meta(name, data, expected):
    assert param_counts(from_hf_config(data, name))["total"] == hf_param_count(data) == expected


def test_gpt_oss_20b_layers_and_active_parameters():
    cfg = from_hf_config(hf_json("gpt-oss-20b"), "gpt-oss-20b")
    assert cfg.attention.layer_pattern == ["local", "global"] and cfg.attention.sliding_window == 128
    assert cfg.attention.sinks and cfg.moe.router_bias and cfg.moe.expert_bias and cfg.quant == "mxfp4"
    # Model card table 1: 3.61B active parameters per token: 4 of 32 experts and the unembedding, not the
    # embedding table (a lookup): 4,187,440,704 - 201088 x 2880 = 3,608,307,264.
    p = param_counts(cfg)
    assert p["active_per_token"] - p["embedding"] == 3_608_307_264
    assert round((p["active_per_token"] - p["embedding"]) / 1e9, 2) == 3.61


def test_llama4_scout_layer_kinds():
    cfg = from_hf_config(transformers.CONFIG_MAPPING["llama4_text"]().to_dict(), "scout")
    # Llama4TextConfig: no_rope_layers [1, 1, 1, 0]*12 -> RoPE layers chunked, every 4th layer global NoPE.
    assert cfg.attention.layer_pattern == ["chunked", "chunked", "chunked", "global_nope"]
    assert cfg.attention.chunk_size == 8192 and cfg.attention.qk_norm == "l2" and cfg.attention.temperature_tuning
    assert {f for _, f in cfg.layer_kinds()} == {"moe"}  # interleave_moe_layer_step 1: every layer
    # Maverick-style interleaving: every 2nd layer MoE, the others dense of intermediate_size_mlp.
    data = transformers.CONFIG_MAPPING["llama4_text"](num_hidden_layers=4, interleave_moe_layer_step=2).to_dict()
    cfg = from_hf_config(data, "maverick-like")
    assert [f for _, f in cfg.layer_kinds()] == ["dense", "moe", "dense", "moe"]
    assert param_counts(cfg)["total"] == hf_param_count(data)


def test_smollm3_sliding_nope_layers():
    # SmolLM3Config with use_sliding_window: the NoPE layers slide (layer_types derived), as transformers.
    data = transformers.CONFIG_MAPPING["smollm3"](num_hidden_layers=8, use_sliding_window=True,
                                                 sliding_window=4096).to_dict()
    expected = ["local" if t == "sliding_attention" else "global" for t in data["layer_types"]]
    data.pop("layer_types")
    cfg = from_hf_config(data, "smollm3")
    assert [k.removesuffix("_nope") for k, _ in cfg.layer_kinds()] == expected
    assert cfg.attention.layer_pattern == ["global", "global", "global", "local_nope"]
    assert param_counts(cfg)["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type", ["llama4_text", "smollm3", "cohere2", "exaone4"])
def test_nope_layers_are_the_layers_transformers_leaves_unrotated(model_type):
    # Which layers apply RoPE, read off the built transformers attention modules (use_rope, or Cohere2's and
    # EXAONE-4's rule: rotate on sliding layers when a window is set).
    hf = transformers.CONFIG_MAPPING[model_type](num_hidden_layers=8)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf)
    rotated = []
    for layer in model.model.layers:
        a = layer.self_attn
        rotated.append(bool(a.use_rope) if hasattr(a, "use_rope") else
                       (a.sliding_window is not None if model_type == "cohere2" else a.is_sliding))
    cfg = from_hf_config(hf.to_dict(), model_type)
    assert [not k.endswith("_nope") for k, _ in cfg.layer_kinds()] == rotated
    assert False in rotated and True in rotated


# ---------------------------------------------------------------------------------------------------
# gpt-oss's MXFP4 checkpoint, by hand and against the model card


def test_gpt_oss_quantization_config_maps_to_experts_only_mxfp4():
    cfg = from_hf_config(hf_json("gpt-oss-20b"), "gpt-oss-20b")
    w = weight_bytes(cfg, cfg.quant)
    # MXFP4 holds exactly the routed experts: 24 layers x 3 tensors (gate, up, down); everything else bf16.
    assert w["by_format"]["MXFP4"] == (72, w["by_kind"]["expert"])
    assert set(w["by_format"]) == {"MXFP4", "BF16"}


@pytest.mark.parametrize("name, data, by_hand, card_gib", [
    # gpt-oss-20b: d = 2880, L = 24, h = 64, h_kv = 8, d_h = 64, V = 201088, E = 32, d_ff = 2880.
    #   experts MXFP4 (17 B per 32 weights): 24 x 32 x 3 x 2880 x 2880 x 17/32         = 10,152,345,600
    #   attention bf16: 24 x 2880 x (2 x 4096 + 2 x 512) x 2                          =  1,274,019,840
    #   1-D tensors bf16 per layer: q/k/v/o biases 4096 + 512 + 512 + 2880, sinks 64, two norms 5760,
    #     router bias 32, expert biases 32 x (2 x 2880 + 2880); 24 x 290,336 + final norm 2880, x 2 =     13,941,888
    #   router bf16: 24 x 32 x 2880 x 2                                              =      4,423,680
    #   embedding and lm_head bf16: 2 x 201088 x 2880 x 2                             =  2,316,533,760
    #   total 13,761,264,768 B = 12.816 GiB; the model card (arXiv 2508.10925, table 1) gives 12.8 GiB.
    ("gpt-oss-20b", hf_json("gpt-oss-20b"), 13_761_264_768, 12.8),
    # gpt-oss-120b: L = 36, E = 128, the rest as above.
    #   experts 36 x 128 x 3 x 2880^2 x 17/32 = 60,914,073,600; attention 36 x 53,084,160 = 1,911,029,760;
    #   1-D: (36 x (8000 + 64 + 5760 + 128 + 128 x 8640) + 2880) x 2 = 80,636,544; router 36 x 128 x 2880 x 2
    #   = 26,542,080; embedding + lm_head 2,316,533,760. Total 65,248,815,744 B = 60.768 GiB; card 60.8 GiB.
    ("gpt-oss-120b", {**transformers.CONFIG_MAPPING["gpt_oss"]().to_dict(),
                      "quantization_config": hf_json("gpt-oss-20b")["quantization_config"]}, 65_248_815_744, 60.8),
])
def test_gpt_oss_checkpoint_bytes_by_hand_and_model_card(name, data, by_hand, card_gib):
    cfg = from_hf_config(data, name)
    total = weight_bytes(cfg, cfg.quant)["total"]
    assert total == by_hand
    # The card rounds to 0.1 GiB: any size within +-0.05 GiB prints as its figure (12.816 and 60.768 do:
    # +0.13% and -0.05%).
    assert abs(total / GIB - card_gib) <= 0.05


# ---------------------------------------------------------------------------------------------------
# KV cache against the tensors transformers allocates


def hf_decode_cache(model_type, b=3, prompt=5, steps=14, **over):
    """conftest.hf_decode_cache with 4 layers of 2 KV heads (a local/global or chunked period fits)."""
    return _decode_cache(model_type, b, prompt, steps, **{"num_hidden_layers": 4, "num_key_value_heads": 2, **over})


@pytest.mark.parametrize("model_type, over, kinds", [
    ("gpt_oss", dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2),
     ["local", "global", "local", "global"]),
    ("llama4_text", dict(attention_chunk_size=8, no_rope_layer_interval=2, num_local_experts=2, intermediate_size_mlp=80),
     ["chunked", "global_nope", "chunked", "global_nope"]),
    ("smollm3", dict(use_sliding_window=True, sliding_window=8, no_rope_layer_interval=2),
     ["global", "local_nope", "global", "local_nope"]),
    # Cohere2, EXAONE 4: every 2nd layer full attention without RoPE (layer_types derived from the pattern)
    ("cohere2", dict(sliding_window=8, sliding_window_pattern=2), ["local", "global_nope", "local", "global_nope"]),
    ("exaone4", dict(sliding_window=8, sliding_window_pattern=2), ["local", "global_nope", "local", "global_nope"]),
])
def test_kv_cache_against_transformers(model_type, over, kinds):
    cfg, layers = hf_decode_cache(model_type, **over)
    assert [k for k, _ in cfg.layer_kinds()] == kinds
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    # 3 sequences at t = 5 + 14 = 19. Global layers hold 19 tokens; transformers' sliding window layer
    # (DynamicSlidingWindowLayer, also used for chunked layers with the chunk as its window) keeps w - 1 = 7
    # between steps, ours min(t, w) = 8 (a rolling buffer of w, as the next query needs): one token more per
    # windowed layer, K and V x 2 heads x 16 x 2 bytes per sequence.
    assert [layer.keys.shape[2] for layer in layers] == [19 if k.startswith("global") else 7 for k in kinds]
    per_token = 2 * 2 * 16 * 2
    windowed = sum(1 for k in kinds if not k.startswith("global"))
    assert kv_bytes(cfg, BF16, 3, 19) == allocated + windowed * 3 * per_token


def test_kv_bytes_per_token_of_the_published_models():
    # gpt-oss-20b: 2 x 8 x 64 x 2 B = 2048 B per token and layer; 24 layers below the window, then the 12
    # local layers stop at 128 tokens. At t = 8192: 12 x 8192 x 2048 + 12 x 128 x 2048 = 204,472,320 B.
    oss = from_hf_config(hf_json("gpt-oss-20b"), "gpt-oss-20b")
    assert kv_bytes(oss, BF16, 1, 1) == 24 * 2048
    assert kv_bytes(oss, BF16, 1, 8192) == 12 * 8192 * 2048 + 12 * 128 * 2048 == 204_472_320
    # Llama-4-Scout: 2 x 8 x 128 x 2 B = 4096 B per token and layer, 48 layers; past 8192 the 36 chunked layers
    # hold one chunk. At t = 131072: 12 x 131072 x 4096 + 36 x 8192 x 4096 = 7,650,410,496 B.
    scout = from_hf_config(transformers.CONFIG_MAPPING["llama4_text"]().to_dict(), "scout")
    assert kv_bytes(scout, BF16, 1, 1) == 48 * 4096
    assert kv_bytes(scout, BF16, 1, 131072) == 12 * 131072 * 4096 + 36 * 8192 * 4096 == 7_650_410_496


# ---------------------------------------------------------------------------------------------------
# A chunked layer, by hand


def one_layer(**attention):
    return ArchConfig.model_validate(dict(name="one", d_model=64, n_layers=1, vocab_size=128,
                                          attention=dict(n_heads=4, n_kv_heads=2, **attention),
                                          ffn=dict(activation="swiglu", d_ff=96)))


def attn_op(cfg, name, s, t, kernel="flash"):
    ops = forward_ops(cfg, Dims.of(cfg, BF16, 1, s, t), kernel)
    return next(op for op in ops if op.name == f"layers.attn.{name}")


def test_chunked_pairs_keys_and_cache_by_hand():
    # Chunk C = 4; the query at position j (1-based) sees the ((j - 1) mod 4) + 1 keys of its chunk.
    cfg = one_layer(chunk_size=4, layer_pattern=["chunked"])
    # Prefill of 10: 1+2+3+4 + 1+2+3+4 + 1+2 = 23 pairs per head; h = 4 heads, d_h = 16:
    # sdpa FLOPs 2 x 4 x 23 x (16 + 16) = 5888; keys read t - floor((t - s)/C) x C = 10.
    sdpa = attn_op(cfg, "sdpa", 10, 10)
    assert sdpa.flops == 5888 and sdpa.mnk == (2, 10, 2 * 23)
    assert sdpa.kv_read_bytes == 10 * 2 * 2 * 16 * 2  # 10 keys, K and V, 2 heads x 16, bf16
    # A pass of 4 at positions 4..7 (t = 7): pairs 4 + 1 + 2 + 3 = 10; keys from its first query's chunk
    # start (position 1) to 7: 7. The naive kernel scores all 4 x 7 = 28 per head: 2 x 4 x 28 x 16 FLOPs.
    assert attn_op(cfg, "sdpa", 4, 7).flops == 2 * 4 * 10 * 32
    assert attn_op(cfg, "score", 4, 7, "naive").flops == 2 * 4 * 28 * 16
    # Decode at t = 11: position 11 is the 3rd of its chunk (9..12): 3 pairs, 3 keys read.
    dec = attn_op(cfg, "sdpa", 1, 11)
    assert dec.flops == 2 * 4 * 3 * 32 and dec.kv_read_bytes == 3 * 2 * 2 * 16 * 2
    # The cache holds min(t, C) = 4 tokens: 4 x 2 x 2 x 16 x 2 B per sequence.
    assert kv_bytes(cfg, BF16, 1, 11) == 4 * 2 * 2 * 16 * 2
    # NoPE: a global_nope layer has no RoPE op; a RoPE layer rotates q (4 x 16) and k (2 x 16) per token.
    nope = one_layer(layer_pattern=["global_nope"])
    names = {op.role for op in forward_ops(nope, Dims.of(nope, BF16, 1, 10, 10))}
    assert "attn.rope" not in names and "attn.rope" in {op.role for op in forward_ops(cfg, Dims.of(cfg, BF16, 1, 1, 1))}


def test_sinks_and_softcap_costs_by_hand():
    # Sinks: h = 4 params per layer, 5 FLOPs per softmax row (b x h x s = 1 x 4 x 10 rows).
    cfg = one_layer(sinks=True)
    sinks = attn_op(cfg, "sinks", 10, 10)
    assert sinks.params == 4 and sinks.flops == 5 * 4 * 10 and sinks.kernels == 0
    # Soft-capping: 3 FLOPs per score; naive: its own kernel over the written 4 x 10 x 10 scores (read + write
    # in bf16); flash: inside the kernel over the 55 causal pairs per head.
    cap = one_layer(logit_softcap=50.0)
    naive = attn_op(cap, "softcap", 10, 10, "naive")
    assert naive.flops == 3 * 400 and naive.bytes == 2 * 400 * 2
    flash = attn_op(cap, "softcap", 10, 10)
    assert flash.flops == 3 * 4 * 55 and flash.bytes == 0 and flash.kernels == 0
    # Final logit soft-capping: 3 FLOPs per logit, one kernel over [b, s, V].
    final = ArchConfig.model_validate({**one_layer().model_dump(), "final_logit_softcap": 30.0})
    op = next(op for op in forward_ops(final, Dims.of(final, BF16, 1, 10, 10)) if op.name == "logit_softcap")
    assert op.flops == 3 * 10 * 128


# ---------------------------------------------------------------------------------------------------
# The reference decoder


B, S, MAX_B, MAX_T = 2, 8, 3, 16
FEATURES = {
    "sinks_local_global_moe_biases_clamped": dict(
        attention=dict(n_heads=4, n_kv_heads=2, qkv_bias=True, out_bias=True, sinks=True, sliding_window=4,
                       layer_pattern=["local", "global"]),
        ffn=dict(activation="swiglu", d_ff=96, swiglu_limit=7.0, swiglu_alpha=1.702),
        moe=dict(n_experts=4, top_k=2, d_ff_expert=32, router_bias=True, expert_bias=True)),
    "chunked_nope_l2_temperature_interleaved_moe": dict(
        attention=dict(n_heads=4, n_kv_heads=2, qk_norm="l2", chunk_size=4, temperature_tuning=True,
                       layer_pattern=["chunked", "chunked", "global_nope"]), n_layers=3,
        ffn=dict(activation="swiglu", d_ff=96),
        moe=dict(n_experts=4, top_k=1, d_ff_expert=32, n_shared_experts=1, dense_layers=[1])),
    "softcap_local_nope_sandwich": dict(
        attention=dict(n_heads=4, n_kv_heads=2, logit_softcap=50.0, sliding_window=4,
                       layer_pattern=["local_nope", "global"]),
        ffn=dict(activation="geglu", d_ff=96), final_logit_softcap=30.0, block="sandwich"),
}


def feature_config(name):
    return ArchConfig.model_validate({**dict(name=name, d_model=64, n_layers=2, vocab_size=128), **FEATURES[name]})


def decoder(name, kernel):
    cfg = feature_config(name)
    # SDPA has no sinks or soft-capping: those models run explicit matmuls; the others pin SDPA's math backend
    explicit = cfg.attention.sinks or cfg.attention.logit_softcap is not None
    return cfg, build_decoder(cfg, max_batch=MAX_B, max_context=MAX_T, kernel=kernel,
                              sdpa_backend=None if (explicit or kernel == "naive") else "math")


def ids(n=12):
    return torch.randint(0, 128, (B, n), generator=torch.Generator().manual_seed(1))


@pytest.fixture
def one_thread():
    """Tiny tensors run fastest on one intra-op thread; the setting is restored for the tests after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kernel", ["flash", "naive"])
@pytest.mark.parametrize("name", FEATURES)
def test_reference_decoder_matches_the_analytic_model(name, kernel, one_thread):
    cfg, model = decoder(name, kernel)
    assert sum(p.numel() for p in model.parameters()) == param_counts(cfg)["total"]
    assert sum(t.nbytes for t in model.kv_cache_tensors()) == kv_bytes(cfg, Precision("fp32", "fp32", "fp32"),
                                                                         MAX_B, MAX_T)
    x = ids()

    def analytic(phase, tokens):
        ops = phase_ops(cfg, Precision(), phase, B, tokens, Settings(kernel="naive"))
        return sum(op.flops * op.count for op in ops if op.matmul)

    with FlopCounterMode(display=False) as prefill:
        model(x[:, :S], 0)
    with FlopCounterMode(display=False) as decode:
        model(x[:, S:S + 1], S)
    assert prefill.get_total_flops() == analytic("prefill", S)
    assert decode.get_total_flops() == analytic("decode", S + 1)
    # Profiler scopes are the analytic names: sinks run inside the softmax (flash: inside attn.sdpa, with the
    # soft-capping), so neither has a scope of its own there.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model.reset_cache()
        model(x[:, :S], 0)
    assert {e.name for e in prof.events() if "::" not in e.name} == analytic_names(cfg, kernel) == scope_names(model)
    # Prefill 3, a pass of 4 across a chunk boundary (positions 3..6, chunk 4), then decode steps that
    # wrap the rolling buffers: the logits of one prefill of 12.
    model.reset_cache()
    full = model(x, 0)
    torch.testing.assert_close(in_pieces(model, x, 3, 7), full, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel", ["flash", "naive"])
def test_chunked_layer_sees_its_own_chunk_only(kernel):
    """One chunked layer of chunk 4: the token at position 9 (chunk 8..11) sees positions 8 and 9; changing
    position 7 (the previous chunk) changes nothing, changing position 8 does."""
    cfg = one_layer(chunk_size=4, layer_pattern=["chunked"])
    model = build_decoder(cfg, max_batch=B, max_context=MAX_T, kernel=kernel)
    x = ids(10)
    base = model(x, 0)[:, -1]
    for pos, changes in ((7, False), (8, True)):
        other = x.clone()
        other[:, pos] = (other[:, pos] + 1) % 128
        model.reset_cache()
        assert (not torch.allclose(model(other, 0)[:, -1], base, rtol=1e-5, atol=1e-5)) == changes, pos


def test_sinks_take_probability_mass():
    """With sinks the attention weights of a row sum to less than 1 (the sink takes the rest): the same
    weights with sinks at -inf give the plain softmax."""
    cfg = feature_config("sinks_local_global_moe_biases_clamped")
    model = build_decoder(cfg, max_batch=B, max_context=MAX_T, kernel="naive")
    x = ids(6)
    with_sinks = model(x, 0)
    for layer in model.layers:
        layer.attn.sinks.data.fill_(float("-inf"))
    model.reset_cache()
    plain = model(x, 0)
    assert not torch.allclose(with_sinks, plain, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# Bad input: one line each


@pytest.mark.parametrize("change, field", [
    (dict(attention=dict(n_heads=4, layer_pattern=["chunked", "global"])), "attention.chunk_size"),
    (dict(attention=dict(n_heads=4, layer_pattern=["local_nope"])), "attention.sliding_window"),
    (dict(attention=dict(n_heads=4, layer_pattern=["sliding"])), "attention.layer_pattern.0"),
    (dict(attention=dict(n_heads=4, logit_softcap=0.0)), "attention.logit_softcap"),
    (dict(attention=dict(n_heads=4, sinks=True, mla=dict(kv_lora_rank=16, qk_nope_head_dim=8, v_head_dim=8))),
     "attention.mla"),
    (dict(ffn=dict(activation="swiglu", d_ff=96, swiglu_limit=7.0)), "ffn.swiglu_limit"),
    (dict(ffn=dict(activation="geglu", d_ff=96, swiglu_limit=7.0, swiglu_alpha=1.7)), "ffn.swiglu_limit"),
    (dict(final_logit_softcap=-1.0), "final_logit_softcap"),
])
def test_bad_schema_input_is_one_line(tmp_path, change, field):
    data = {**dict(name="bad", d_model=64, n_layers=2, vocab_size=128, attention=dict(n_heads=4),
                   ffn=dict(activation="swiglu", d_ff=96)), **change}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LmcostError) as e:
        load_config(path)
    assert e.value.field.endswith(f": {field}") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("model_type, change, field", [
    ("gpt_oss", {"experts_per_token": 2}, "experts_per_token"),                 # disagrees with num_experts_per_tok
    ("gpt_oss", {"layer_types": ["chunked_attention"] * 36}, "layer_types"),    # not a gpt-oss layer type
    ("llama4_text", {"attention_chunk_size": None}, "attention_chunk_size"),    # chunked layer_types, no chunk
    ("llama4_text", {"no_rope_layers": [1, 0]}, "no_rope_layers"),              # one entry per layer
    ("smollm3", {"layer_types": ["sliding_attention"] * 36}, "layer_types"),    # use_sliding_window is false
    ("smollm3", {"hidden_act": "gelu"}, "hidden_act"),
])
def test_bad_hf_input_is_one_line(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}" and "\n" not in str(e.value)


@pytest.mark.parametrize("model_type, change, caps", [
    ("gemma2", {}, (50.0, 30.0)),                                                 # Gemma2Config's defaults
    ("gemma2", {"attn_logit_softcapping": None, "final_logit_softcapping": None}, (None, None)),
    ("gemma3_text", {"final_logit_softcapping": 30.0}, (None, 30.0)),
])
def test_gemma_soft_capping_is_mapped(model_type, change, caps):
    data = {**transformers.CONFIG_MAPPING[model_type](num_hidden_layers=2).to_dict(), **change}
    cfg = from_hf_config(data, model_type)
    assert (cfg.attention.logit_softcap, cfg.final_logit_softcap) == caps
    roles = {op.role for op in forward_ops(cfg, Dims.of(cfg, BF16, 1, 4, 4), "naive")}
    assert ("attn.softcap" in roles) == (caps[0] is not None) and ("logit_softcap" in roles) == (caps[1] is not None)


@pytest.mark.parametrize("name", ["sinks_local_global_moe_biases_clamped", "chunked_nope_l2_temperature_interleaved_moe"])
def test_training_tensors_are_the_decoders(name):
    # The parameter tensors training reads off the graph (optimizer states, ZeRO) have the reference
    # decoder's shapes: the sinks [h], the expert biases [E, d_e] / [E, d] beside the stacked matrices.
    from lmcost.cost.optimizers import param_tensors

    cfg = feature_config(name)
    model = build_decoder(cfg, max_batch=1, max_context=8)
    ours = sorted(tuple(t.shape) for t in param_tensors(cfg)[0] for _ in range(t.count))
    assert ours == sorted(tuple(p.shape) for p in model.parameters())
