"""Quantization recipes (issue 14): bytes per format from the block layouts, llama.cpp's per-tensor rules
for GGUF mixes, AWQ's 16-bit embeddings, and estimates whose weight and decode bytes follow the recipe."""

from __future__ import annotations

import json
import sys
from fractions import Fraction

import pytest

from conftest import HF_DIR, hf_json
from lmcost import LmcostError, Precision, Workload, estimate, load_config, load_gpu
from lmcost.cli import main
from lmcost.operators.forward import Dims
from lmcost.model.hf.families import from_hf_config
from lmcost.cost.params import param_counts
from lmcost.cost.compile import phase_records
from lmcost.operators.assembly import build_ops
from lmcost.operators.quant import weight_bytes
from lmcost.model.quant import FORMATS, RECIPES, recipe, use_more_bits
from lmcost.operators.workload import Settings


# ---- formats: bytes per block from the block structs ----

@pytest.mark.parametrize("name, block, layout", [
    ("Q4_0", 32, 2 + 32 // 2),                # fp16 d + 32 nibbles
    ("Q8_0", 32, 2 + 32),                     # fp16 d + 32 int8
    ("Q5_0", 32, 2 + 4 + 16),                 # fp16 d + 32 high bits + 32 nibbles
    ("Q5_1", 32, 2 + 2 + 4 + 16),             # + fp16 min
    ("Q4_K", 256, 2 + 2 + 12 + 256 // 2),     # d, dmin, 8 x (6-bit scale + 6-bit min), nibbles = 144
    ("Q5_K", 256, 2 + 2 + 12 + 32 + 128),     # Q4_K + 256 high bits = 176
    ("Q6_K", 256, 128 + 64 + 16 + 2),         # low nibbles, high 2 bits, 16 int8 scales, fp16 d = 210
    ("MXFP4", 32, 32 // 2 + 1),               # 32 e2m1 + e8m0 = 17
    ("NVFP4", 16, 16 // 2 + 1),               # 16 e2m1 + e4m3 = 9
    ("AWQ-g128", 128, Fraction(128, 2) + 2 + Fraction(1, 2)),  # nibbles + fp16 scale + 4-bit zero
])
def test_block_bytes_from_the_layout(name, block, layout):
    f = FORMATS[name]
    assert (f.block, f.block_bytes) == (block, layout)


def test_scale_extras_per_tensor_row_and_tile():
    rows, cols = 256, 384
    assert FORMATS["FP8-tensor"].nbytes(rows, cols) == rows * cols + 4
    assert FORMATS["FP8-channel"].nbytes(rows, cols) == rows * cols + 4 * rows
    assert FORMATS["FP8-block128"].nbytes(rows, cols) == rows * cols + 4 * (2 * 3)  # 2 x 3 tiles of 128x128
    assert FORMATS["NVFP4"].nbytes(rows, cols) == rows * (384 // 16) * 9 + 4
    assert FORMATS["GPTQ-g128"].nbytes(rows, cols) == rows * 3 * Fraction(133, 2) + 4 * cols  # + g_idx
    assert FORMATS["INT8-channel"].nbytes(rows, cols) == rows * cols + 2 * rows
    # bits per weight: Q4_K 4.5, Q6_K 6.5625, AWQ 4 + 20/128, fp8-block128 8 + 32/16384 on a whole tile
    assert FORMATS["Q4_K"].bits_per_weight == 4.5 and FORMATS["Q6_K"].bits_per_weight == 6.5625
    assert FORMATS["AWQ-g128"].bits_per_weight == 4 + 20 / 128 == 4.15625
    assert 8 * FORMATS["FP8-block128"].nbytes(128, 128) / 128**2 == 8 + 32 / 16384


def test_unknown_recipe_lists_them():
    with pytest.raises(LmcostError) as e:
        recipe("q3_k_xl")
    assert e.value.field == "quant" and "q4_k_m" in e.value.fix and "nvfp4" in e.value.fix


# ---- GGUF Q4_K_M, Llama-3-8B, worked by hand ----

def test_use_more_bits_layers_of_32():
    # n/8 = 4, 7n/8 = 28: layers 0-3, 28-31, and (i - 4) % 3 == 2: 6, 9, ..., 27 (8 of them) -> 16 layers
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27,
                                                              28, 29, 30, 31]


def test_llama_3_8b_q4_k_m_by_hand():
    # d 4096, 32 layers, kv 1024, d_ff 14336 (56 blocks of 256), vocab 128256.
    # Tensors: token_embd Q4_K; output Q6_K; per layer attn_q, attn_k, attn_output, ffn_gate, ffn_up Q4_K;
    # attn_v and ffn_down Q6_K in the 16 use_more_bits layers, Q4_K in the other 16; 65 norms F32.
    # -> Q4_K: 1 + 32*5 + 16 + 16 = 193 tensors, Q6_K: 1 + 16 + 16 = 33, F32: 2*32 + 1 = 65
    # (the counts llama.cpp prints loading Meta-Llama-3-8B Q4_K_M).
    cfg = load_config("llama-3-8b")
    w = weight_bytes(cfg, "q4_k_m")
    assert {k: t for k, (t, _) in w["by_format"].items()} == {"Q4_K": 193, "Q6_K": 33, "F32": 65}
    q4k = lambda rows, cols: rows * (cols // 256) * 144
    q6k = lambda rows, cols: rows * (cols // 256) * 210
    layer = 2 * q4k(4096, 4096) + q4k(1024, 4096) + 2 * q4k(14336, 4096)  # q, o, k, gate, up
    total = (q4k(128256, 4096) + q6k(128256, 4096) + 32 * layer
             + 16 * (q6k(1024, 4096) + q4k(1024, 4096))           # attn_v
             + 16 * (q6k(4096, 14336) + q4k(4096, 14336))         # ffn_down
             + 65 * 4096 * 4)                                     # norms F32
    assert total == 4_912_898_048 == w["total"]
    assert w["by_kind"]["embedding"] == 128256 * 16 * 144 and w["by_kind"]["lm_head"] == 128256 * 16 * 210
    # 4.89 bits per weight on average, not 4 (a published file adds a few MB of metadata and tokenizer)
    assert 8 * w["total"] / param_counts(cfg)["total"] == pytest.approx(4.894, abs=1e-3)


def test_llama_70b_q4_k_m_attn_v_quirk():
    # 80 layers: use_more_bits holds for 10 + 10 + 20 = 40; the other 40 attn_v are Q5_K (the 70B rule),
    # their ffn_down Q4_K. Q6_K: output + 40 attn_v + 40 ffn_down = 81; Q4_K: embd + 80*5 + 40 = 441.
    w = weight_bytes(load_config("llama-3.1-70b"), "q4_k_m")
    assert {k: t for k, (t, _) in w["by_format"].items()} == {"Q4_K": 441, "Q5_K": 40, "Q6_K": 81, "F32": 161}
    assert w["by_format"]["Q5_K"][1] == 40 * 1024 * (8192 // 256) * 176


def test_tied_table_takes_the_output_type():
    # gpt2 ties lm_head to wte: llama.cpp stores token_embd as the output (Q6_K), once.
    w = weight_bytes(load_config("gpt2"), "q4_0")
    assert w["by_format"]["Q6_K"] == (1, 50257 * (768 // 256) * 210)


# ---- AWQ g128 on Llama-3.1-70B against plain int4 ----

def test_awq_g128_llama_70b_and_the_int4_shortfall():
    cfg = load_config("llama-3.1-70b")
    d, d_kv, d_ff, V, L = 8192, 1024, 28672, 128256, 80
    linear = L * (2 * d * d + 2 * d_kv * d + 3 * d_ff * d)         # 68,451,041,280 weights in the layers
    awq = linear // 128 * Fraction(133, 2)                          # 4.15625 bits each
    sixteen = 2 * (2 * V * d + (2 * L + 1) * d)                     # embedding, lm_head, norms fp16
    w = weight_bytes(cfg, "awq-g128")
    assert w["total"] == awq + sixteen == 39_767_785_472
    # --weight-dtype int4 counts every parameter at 4 + 16/128 bits: 8.5% light
    int4 = param_counts(cfg)["total"] * Precision(weights="int4").B_w
    assert 1 - int4 / w["total"] == pytest.approx(0.0852, abs=5e-4)
    assert 8 * w["total"] / param_counts(cfg)["total"] == pytest.approx(4.509, abs=1e-3)


def test_fp8_block128_and_mxfp4_bits():
    cfg = load_config("deepseek-v3")
    w = weight_bytes(cfg, "fp8-block128")
    assert set(w["by_format"]) == {"FP8-block128", "BF16"}
    assert w["by_kind"]["embedding"] == w["by_kind"]["lm_head"] == 129280 * 7168 * 2
    m = weight_bytes(load_config("mixtral-8x7b"), "mxfp4")
    assert m["by_kind"]["expert"] == 32 * 3 * 8 * 14336 * 4096 // 32 * 17
    assert weight_bytes(load_config("llama-3-8b"), "bf16")["total"] == 2 * param_counts(load_config("llama-3-8b"))["total"]


# ---- estimates follow the recipe ----

def test_estimate_weights_and_decode_bytes_follow_the_recipe():
    cfg, gpu, wl = load_config("llama-3-8b"), load_gpu("h100"), Workload(batch=1, prompt=128, gen=8)
    base = estimate(cfg, gpu, wl)
    est = estimate(cfg, gpu, wl, settings=Settings(quant="q4_k_m"))
    w = weight_bytes(cfg, "q4_k_m")
    assert est.memory["weights_bytes"] == w["total"]
    dec = phase_records(cfg, Precision(), "decode", 1, wl.context, Settings(quant="q4_k_m"))
    read = sum(wb * c for wb, c in zip(dec.col("weight_bytes"), dec.col("count")))
    # a decode step reads every tensor but the embedding table, of which it gathers one row (16 Q4_K blocks)
    assert read == pytest.approx(w["total"] - w["by_kind"]["embedding"] + 16 * 144, rel=1e-12)
    plain = phase_records(cfg, Precision(), "decode", 1, wl.context, Settings())
    others = [sum(r.col(f)) for r in (dec, plain) for f in ("flops", "act_read_bytes", "kv_read_bytes")]
    assert others[:3] == others[3:]  # only weight bytes change
    assert est.decode["bytes"] < base.decode["bytes"] and est.to_dict()["settings"]["quant"] == "q4_k_m"
    assert base.to_dict()["settings"]["quant"] is None


def test_bf16_recipe_is_the_default_numbers():
    cfg, gpu, wl = load_config("mixtral-8x7b"), load_gpu("h100"), Workload(batch=4, prompt=64, gen=4)
    a, b = estimate(cfg, gpu, wl), estimate(cfg, gpu, wl, settings=Settings(quant="bf16"))
    assert a.decode["bytes"] == b.decode["bytes"] and a.prefill["bytes"] == b.prefill["bytes"]
    assert a.memory["weights_bytes"] == b.memory["weights_bytes"]


def test_fusion_and_layouts_keep_the_recipe():
    cfg, gpu, wl = load_config("deepseek-v2-lite"), load_gpu("h100"), Workload(batch=2, prompt=64, gen=4)
    s = Settings(quant="awq-g128", fusion=("silu_mul", "qkv", "gate_up", "moe_grouped"))
    est = estimate(cfg, gpu, wl, settings=s)
    assert est.decode["bytes"] < estimate(cfg, gpu, wl).decode["bytes"]


def test_quant_refused_in_a_training_step():
    cfg = load_config("tiny-gqa")
    with pytest.raises(LmcostError) as e:
        build_ops(cfg, Dims.of(cfg, Precision(), 1, 8, 8), "train", Settings(quant="q4_0"))
    assert e.value.field == "quant"


# ---- HF quantization_config ----

def _hf(name):
    return json.loads((HF_DIR / f"{name}.json").read_text())


def test_hf_quantization_config_selects_the_recipe():
    cfg = from_hf_config(_hf("deepseek-v3"))
    assert cfg.quant == "fp8-block128"
    assert param_counts(cfg) == param_counts(load_config("deepseek-v3"))
    est = estimate(cfg, load_gpu("h200"), Workload(batch=1, prompt=16, gen=2))
    assert est.memory["weights_bytes"] == weight_bytes(cfg, "fp8-block128")["total"]
    assert est.to_dict()["settings"]["quant"] == "fp8-block128"
    base = {k: v for k, v in _hf("llama-3-8b").items()}
    for qc, want in (({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, "awq-g128"),
                     ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}, "gptq-g128"),
                     ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8-tensor")):
        assert from_hf_config({**base, "quantization_config": qc}).quant == want
    # mxfp4 stores routed experts only: a MoE takes it, a dense model refuses it in one line
    assert from_hf_config({**_hf("mixtral-8x7b"), "quantization_config": {"quant_method": "mxfp4"}}).quant == "mxfp4"
    with pytest.raises(LmcostError) as e:
        from_hf_config({**base, "quantization_config": {"quant_method": "mxfp4"}}, "cfg.json")
    assert e.value.field == "quant" or e.value.field.endswith("quant")


@pytest.mark.parametrize("qc, key", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quant_method"),
    ({"quant_method": "awq", "bits": 4, "group_size": 64}, "group_size"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "bits"),
    ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size"),
])
def test_hf_quantization_config_refused_in_one_line(qc, key, tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hf("llama-3-8b"), "quantization_config": qc}))
    monkeypatch.setattr(sys, "argv", ["lmcost", "estimate", str(path)])
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and f"quantization_config.{key}" in lines[0], lines
    assert "supported:" in lines[0]


@pytest.mark.parametrize("args", [["--quant", "q4_k_m", "--weight-dtype", "int4"], ["--quant", "q3"], ["--quant", "mxfp4"]])
def test_cli_quant_errors(args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lmcost", "estimate", "llama-3-8b", *args])
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: --quant"), lines


def test_cli_header_and_json_name_the_recipe(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lmcost", "estimate", "llama-3-8b", "--quant", "nvfp4", "--gen", "2", "--json"])
    try:
        main()
    except SystemExit as e:
        assert e.code in (0, None)
    data = json.loads(capsys.readouterr().out)
    assert data["settings"]["quant"] == "nvfp4"
    assert data["memory"]["weights_bytes"] == weight_bytes(load_config("llama-3-8b"), "nvfp4")["total"]


def test_every_recipe_costs_every_shipped_kind():
    for name in RECIPES:
        for model in ("deepseek-v2-lite", "gpt2", "tiny-mla", "mixtral-8x7b"):
            assert weight_bytes(load_config(model), name)["total"] > 0


# ---- recipe bytes against published file sizes ----

#: (shipped model, recipe, published size in GB = 1e9 B, rounded to 0.01 GB as the model cards print it).
#: Sources: the "Provided files" tables of TheBloke/Llama-2-7B-GGUF and TheBloke/Mistral-7B-v0.1-GGUF
#: (https://huggingface.co/TheBloke/...), and the sizes of the model.safetensors of TheBloke/Llama-2-7B-AWQ,
#: TheBloke/Mistral-7B-v0.1-AWQ and TheBloke/Llama-2-7B-GPTQ (main branch: 4-bit, group 128, g_idx kept).
PUBLISHED = [
    ("llama-2-7b", "q4_0", 3.83), ("llama-2-7b", "q4_k_m", 4.08), ("llama-2-7b", "q5_k_m", 4.78),
    ("llama-2-7b", "q6_k", 5.53), ("llama-2-7b", "q8_0", 7.16),
    ("mistral-7b", "q4_0", 4.11), ("mistral-7b", "q4_k_m", 4.37), ("mistral-7b", "q5_k_m", 5.13),
    ("mistral-7b", "q6_k", 5.94), ("mistral-7b", "q8_0", 7.70),
    ("llama-2-7b", "awq-g128", 3.89), ("mistral-7b", "awq-g128", 4.15), ("llama-2-7b", "gptq-g128", 3.90),
]


@pytest.mark.parametrize("model, recipe, gb", PUBLISHED, ids=lambda v: str(v))
def test_recipe_bytes_match_published_file_sizes(model, recipe, gb):
    # A file = the weights + metadata (GGUF: the 32,000-token tokenizer and keys, about 1 MB; safetensors:
    # a JSON header, under 1 MB). The printed size is rounded to 0.01 GB: the weights lie within
    # [gb - 0.005 - 0.003, gb + 0.005] GB, and within the 0.5%.
    w = weight_bytes(load_config(model), recipe)["total"]
    assert (gb - 0.008) * 1e9 <= w <= (gb + 0.005) * 1e9
    assert abs(w / (gb * 1e9) - 1) < 0.005


@pytest.mark.parametrize("qc, key", [
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["gate"]}, "modules_to_not_convert"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "lm_head": True}, "lm_head"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": False}, "zero_point"),
    ({"quant_method": "fp8", "ignored_layers": ["lm_head", "model.layers.0.mlp"]}, "ignored_layers"),
    ({"quant_method": "fp8", "weight_block_size": [128, 128], "shard_scales": True}, "shard_scales"),
])
def test_quantization_config_keys_that_change_storage_are_refused(qc, key):
    # Each of these stores something no recipe holds (16-bit modules, a 4-bit lm_head, no zero-points)
    # or is unknown: one line naming the key, never ignored.
    data = {**hf_json("llama-3-8b"), "quantization_config": qc}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "cfg.json")
    assert e.value.field == f"cfg.json: quantization_config.{key}"


def test_quantization_configs_as_published_are_read():
    # TheBloke's AWQ and GPTQ files and DeepSeek-V3's fp8 block config carry how-it-was-made keys only.
    awq = {"quant_method": "awq", "zero_point": True, "group_size": 128, "bits": 4, "version": "gemm"}
    gptq = {"bits": 4, "group_size": 128, "damp_percent": 0.1, "desc_act": False, "sym": True,
            "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model", "quant_method": "gptq"}
    fp8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    for qc, name in ((awq, "awq-g128"), (gptq, "gptq-g128"), (fp8, "fp8-block128")):
        assert from_hf_config({**hf_json("llama-3-8b"), "quantization_config": qc}, "cfg.json").quant == name


@pytest.mark.parametrize("name, per_vector", [("q4_k_m", 4), ("awq-g128", 2)])
def test_rwkv_token_shift_vectors_are_costed(name, per_vector):
    # RWKV-4 (d = 64, 2 layers): its 1-D tensors per layer are 2 LayerNorms (4d), the time-mix token-shift
    # ratios (3d), time_decay and time_first (2d) and the channel-mix ratios (2d, ffn.token_shift): 11d; plus
    # the embeddings' LayerNorm and the final one (4d): 2*704 + 256 = 1,664 elements, F32 under GGUF, F16 under AWQ.
    cfg = from_hf_config(dict(model_type="rwkv", hidden_size=64, attention_hidden_size=64, intermediate_size=256,
                              num_hidden_layers=2, vocab_size=128, context_length=1024,
                              tie_word_embeddings=False), "rwkv")
    assert weight_bytes(cfg, name)["by_kind"]["vector"] == per_vector * 1664
    r = estimate(cfg, load_gpu("h100"), Workload(batch=1, prompt=128, gen=8), settings=Settings(quant=name))
    assert r.memory["weights_bytes"] == weight_bytes(cfg, name)["total"]
