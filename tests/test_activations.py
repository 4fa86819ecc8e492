"""Activation memory of a training step (lmcost.cost.activations): Korthikanti et al.'s closed forms, what
autograd actually saves on the reference decoder, recomputation, TP/SP and pipeline schedules."""

from __future__ import annotations

import contextlib

import pytest

from lmcost import load_config
from lmcost.cost.activations import (
    RECOMPUTE,
    SCORE_KEYS,
    in_flight,
    layer_activation_bytes,
    peak_activation_bytes,
)
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.operators.parallel import Layout
from oracles import korthikanti_config, korthikanti_layer_bytes

FP16 = Precision("fp16", "fp16", "fp16")
FP32 = Precision("fp32", "fp32", "fp32")


# ---------------------------------------------------------------------------------------------------
# Korthikanti et al. 2022, eq. 1 and Table 2, on GPT-3 175B's layer


def test_korthikanti_gpt3_layer():
    # GPT-3 175B (their Table 3): h = 12288, a = 96; s = 2048, b = 1, fp16.
    # sbh = 2048 * 1 * 12288 = 25,165,824
    # eq. 1: sbh(34 + 5as/h) = 34 * 25,165,824 + 5 * 96 * 2048^2 * 1 = 855,638,016 + 2,013,265,920 = 2,868,903,936
    s, b, h, a = 2048, 1, 12288, 96
    assert korthikanti_layer_bytes(s, b, h, a) == 2_868_903_936
    cfg = korthikanti_config()
    ours = layer_activation_bytes(cfg, FP16, Layout(), b, s, kernel="naive")
    # Every one of the paper's terms matches ours exactly (LayerNorm inputs, the QKV input, Q, K, softmax
    # output, 1-byte dropout masks, dropout output, V, the projection inputs, the GELU input). The one
    # difference: each of the two LayerNorms also keeps its mean and rstd (fp32, 8 bytes per token), which
    # the paper leaves out: + 2 * 8 * s * b = 32,768 bytes.
    assert ours.per_layer["layers"] == 2_868_903_936 + 32_768
    # The layer's saved tensors, key by key, in units of sbh (scores in units of as^2b):
    sbh, as2b = s * b * h, a * s * s * b
    t = ours.tensors["layers"]
    assert t["block.input"] == t["ffn_norm.input"] == t["attn.input"] == t["ffn.input"] == 2 * sbh
    assert t["attn.q"] == t["attn.k"] == t["attn.v"] == t["attn.o"] == 2 * sbh
    assert t["ffn.up.output"] == t["ffn.down.input"] == 8 * sbh                       # GELU input, fc2 input
    assert t["attn.out_dropout.mask"] == t["ffn.out_dropout.mask"] == sbh             # 1 byte per element
    assert (t["attn.p"], t["attn.dropout_mask"], t["attn.p_dropped"]) == (2 * as2b, as2b, 2 * as2b)
    assert t["attn_norm.stats"] == t["ffn_norm.stats"] == 8 * s * b


@pytest.mark.parametrize("tp,sp,recompute", [(8, False, "none"), (8, True, "none"), (8, False, "selective"),
                                             (8, True, "selective"), (1, False, "selective"), (1, False, "full")])
def test_korthikanti_table2(tp, sp, recompute):
    # Table 2 rows: TP sbh(10 + 24/t + 5as/(ht)) = 578,813,952 at t = 8; TP+SP sbh(34/t + 5as/(ht))
    # = 358,612,992; selective drops 5as/(ht); full keeps 2sbh. Ours adds the two LayerNorms' fp32 mean
    # and rstd: 16sb, replicated under TP (16sb/t under SP, where the norms see s/t tokens); full keeps
    # only the layer input.
    s, b, h, a = 2048, 1, 12288, 96
    ours = layer_activation_bytes(korthikanti_config(), FP16, Layout(tp=tp, sp=sp), b, s, recompute, kernel="naive")
    stats = 0 if recompute == "full" else 16 * s * b / (tp if sp else 1)
    assert ours.per_layer["layers"] == pytest.approx(korthikanti_layer_bytes(s, b, h, a, tp, sp, recompute) + stats,
                                                        rel=1e-15)


# ---------------------------------------------------------------------------------------------------
# The oracle: what autograd saves on the reference decoder


_MEASURED: dict = {}


def _measure(cfg, kernel, mla_mode, b, s, monkeypatch):
    """Bytes of the distinct storages autograd saves in one training forward (cross-entropy loss), by where
    they are first saved: {"layers": ..., "other": ...}. Parameters and the RoPE tables (constants) skipped.
    Kept per (model, kernel, MLA mode, b, s) for the module: two tests read the same measurement."""
    key = (cfg.name, kernel, mla_mode, b, s)
    if key not in _MEASURED:
        _MEASURED[key] = _measure_once(cfg, kernel, mla_mode, b, s, monkeypatch)
    return _MEASURED[key]


def _measure_once(cfg, kernel, mla_mode, b, s, monkeypatch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from lmcost.profiling import decoder

    scopes = ["other"]

    @contextlib.contextmanager
    def scope(name):
        scopes.append(name)
        try:
            yield
        finally:
            scopes.pop()

    monkeypatch.setattr(decoder, "record_function", scope)
    model = decoder.build_decoder(cfg, max_batch=b, max_context=s, kernel=kernel, mla_mode=mla_mode).trainable()
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {t.untyped_storage().data_ptr() for t in (model.rope_cos, model.rope_sin) if t is not None}
    seen: dict = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = ("layers" if scopes[-1].startswith("layers") else "other", t.untyped_storage().nbytes())
        return t

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, s), generator=g)
    targets = torch.randint(0, cfg.vocab_size, (b, s), generator=g)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(ids, 0)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    loss.backward()  # the graph the hooks saw is a real, complete training step
    out = {"layers": 0, "other": 0}
    for where, nbytes in seen.values():
        out[where] += nbytes
    return out


# Measured analytic/autograd ratios (b = 2, s = 64, fp32, CPU, torch 2.13; layers, whole model):
#   tiny-gqa flash (SDPA's CPU flash kernel): 1.0000, 1.0000 (the same bytes, less the loss's 4-byte scalar)
#   tiny-gqa naive:                            0.9998, 0.9998 (the causal mask, a bool [s,t] constant that
#                                              masked_fill keeps, is not counted as an activation)
#   tiny-moe flash:                            1.0000, 1.0000
#   tiny-mla naive (up-projected, explicit):   0.9969, 0.9974 (the reference keeps kv_a_norm's and kv_b_proj's
#                                              inputs as views of [b,s,d_c+d_r] buffers that carry the RoPE
#                                              key beside the latent: 2*b*s*d_r*4 bytes a layer; and the mask)
ORACLE_TOLERANCE = 0.01


@pytest.mark.parametrize("name,kernel,mla_mode", [
    ("tiny-gqa", "flash", "naive"), ("tiny-gqa", "naive", "naive"), ("tiny-mla", "naive", "naive"),
    pytest.param("tiny-moe", "flash", "naive", marks=pytest.mark.slow),  # its 8 experts: the costliest
])
@pytest.mark.torch
def test_saved_bytes_match_autograd(name, kernel, mla_mode, monkeypatch):
    # Up-projected MLA runs on the explicit (naive) kernel: SDPA has no CPU flash kernel for d_qk != d_v
    # (it falls back to the math backend, which keeps the score matrix, unlike any flash kernel).
    cfg = load_config(name)
    b, s = 2, 64
    measured = _measure(cfg, kernel, mla_mode, b, s, monkeypatch)
    ours = layer_activation_bytes(cfg, FP32, Layout(), b, s, kernel=kernel, mla_mode=mla_mode)
    layers = sum(ours.per_layer[g] * ours.layers[g] for g in ours.per_layer)
    total = layers + ours.embedding + ours.head
    assert layers / measured["layers"] == pytest.approx(1, abs=ORACLE_TOLERANCE)
    assert total / (measured["layers"] + measured["other"]) == pytest.approx(1, abs=ORACLE_TOLERANCE)


@pytest.mark.torch
def test_gqa_flash_matches_autograd_exactly(monkeypatch):
    # tiny-gqa, b = 2, s = 64, fp32; per layer (bytes):
    # attn_norm: x, x_hat (fp32) 2 * 128*512*4 = 524,288 + rstd 128*4 = 512
    # q/k/v input 262,144; Q 262,144; K, V 2 * 128*2*64*4 = 65,536 each; O 262,144; lse 2*8*64*4 = 4,096
    # ffn_norm 524,800; gate/up input 262,144; g, silu(g), u 3 * 128*1408*4 = 2,162,688; down input 720,896
    # = 5,116,928 per layer; 4 layers = 20,467,712
    measured = _measure(load_config("tiny-gqa"), "flash", "naive", 2, 64, monkeypatch)
    ours = layer_activation_bytes(load_config("tiny-gqa"), FP32, Layout(), 2, 64)
    assert ours.per_layer["layers"] == 5_116_928 and measured["layers"] == 4 * 5_116_928
    # Head: final norm 524,800 + lm_head input 262,144 + log-probs 128*8000*4 = 4,096,000 + targets 1,024;
    # embedding: the ids, 1,024; in all 4,884,992. Autograd also keeps the loss's total weight (a 4-byte scalar).
    assert ours.head + ours.embedding == 4_884_992 and measured["other"] == 4_884_992 + 4


# ---------------------------------------------------------------------------------------------------
# Recomputation, TP, pipeline schedules


@pytest.mark.parametrize("name", ["tiny-gqa", "tiny-moe", "tiny-mla", "llama-3-8b"])
def test_recompute_orders(name):
    cfg = load_config(name)
    for kernel in ("flash", "naive"):
        per = {r: layer_activation_bytes(cfg, FP16, Layout(), 1, 512, r, kernel=kernel).per_layer for r in RECOMPUTE}
        for g in per["none"]:
            assert per["full"][g] < per["selective"][g] <= per["none"][g]
            # with flash nothing score-sized is saved: selective recomputation saves nothing
            assert (per["selective"][g] == per["none"][g]) == (kernel == "flash")
    full = layer_activation_bytes(cfg, FP16, Layout(), 1, 512, "full")
    assert full.per_layer["layers"] == 512 * cfg.d_model * 2                   # the layer input [b,s,d]
    assert full.transient == max(layer_activation_bytes(cfg, FP16, Layout(), 1, 512).per_layer.values())


def test_tp_divides_the_sharded_part():
    cfg = load_config("llama-3-8b")
    one = layer_activation_bytes(cfg, FP16, Layout(), 1, 1024, kernel="naive").tensors["layers"]
    four = layer_activation_bytes(cfg, FP16, Layout(tp=4), 1, 1024, kernel="naive").tensors["layers"]
    sp = layer_activation_bytes(cfg, FP16, Layout(tp=4, sp=True), 1, 1024, kernel="naive").tensors["layers"]
    sharded = {"attn.q", "attn.k", "attn.v", "attn.o", "ffn.gate.output", "ffn.up.output", "ffn.act(gate)",
               "ffn.down.input", *SCORE_KEYS} & set(one)
    for key in one:
        assert four[key] == (one[key] / 4 if key in sharded else one[key]), key
        assert sp[key] == one[key] / 4, key  # SP shards the rest: norms, and the GEMM inputs kept sharded


def test_pipeline_in_flight_by_hand():
    # 1F1B, p = 4, m = 8: stage i runs p - i - 1 warm-up forwards, then one more before its first backward.
    assert [in_flight("1f1b", 4, 8, i) for i in range(4)] == [4, 3, 2, 1]
    assert [in_flight("gpipe", 4, 8, i) for i in range(4)] == [8] * 4
    assert in_flight("1f1b", 4, 2, 0) == 2  # fewer microbatches than stages
    # Interleaved, p = 4, v = 2: 2*(4-0-1) + (2-1)*4 + 1 = 11 chunks of L/8 layers on stage 0, i.e.
    # L * (1 + (p-1)/(p*v)) = L * 11/8 layer-microbatches (Korthikanti et al. 2022, section 4.2.3).
    assert [in_flight("interleaved", 4, 8, i, 2) for i in range(4)] == [11, 9, 7, 5]


def test_peak_over_schedules():
    cfg = load_config("tiny-gqa")  # 4 layers: one per stage at pp = 4
    layout = Layout(pp=4)
    acts = layer_activation_bytes(cfg, FP32, layout, 2, 64)
    layer = acts.per_layer["layers"]
    f1b = peak_activation_bytes(cfg, FP32, layout, 2, 64, 8)
    # stage 0: 4 microbatches of its one layer and the embedding; the last stage: 1 of its layer and the head
    assert f1b.per_stage[0] == 4 * (layer + acts.embedding)
    assert f1b.per_stage[3] == layer + acts.head
    assert (f1b.stage, f1b.in_flight) == (0, 4)
    gp = peak_activation_bytes(cfg, FP32, layout, 2, 64, 8, schedule="gpipe")
    assert gp.in_flight == 8 and gp.per_stage[3] == 8 * (layer + acts.head) == gp.bytes
    # Interleaved on llama-3-8b (32 layers), p = 4, v = 2, m = 8: stage 0 holds 11 chunks of 4 layers.
    llama = load_config("llama-3-8b")
    lay = Layout(pp=4)
    per = layer_activation_bytes(llama, FP16, lay, 1, 2048)
    il = peak_activation_bytes(llama, FP16, lay, 1, 2048, 8, schedule="interleaved", virtual_stages=2)
    assert il.per_stage[0] == pytest.approx(11 * 4 * per.per_layer["layers"] + 6 * per.embedding)
    # Full recomputation: the layer inputs, plus one layer's saved set rebuilt at its backward.
    full = peak_activation_bytes(llama, FP16, lay, 1, 2048, 8, "full")
    assert full.per_stage[0] == 4 * (8 * 2048 * 4096 * 2 + per.embedding) + per.per_layer["layers"]


def test_bad_arguments_are_one_line():
    cfg = load_config("tiny-gqa")
    with pytest.raises(LmcostError, match="recompute"):
        layer_activation_bytes(cfg, FP32, Layout(), 1, 8, "some")
    with pytest.raises(LmcostError, match="schedule"):
        peak_activation_bytes(cfg, FP32, Layout(pp=2), 1, 8, 4, schedule="zb")
    with pytest.raises(LmcostError, match="virtual_stages"):
        peak_activation_bytes(cfg, FP32, Layout(pp=2), 1, 8, 4, virtual_stages=2)
    with pytest.raises(LmcostError, match="virtual_stages"):
        peak_activation_bytes(cfg, FP32, Layout(pp=4), 1, 8, 4, schedule="interleaved", virtual_stages=2)


@pytest.mark.torch
def test_alibi_and_embedding_norm_match_autograd(monkeypatch):
    # BLOOM-like (ALiBi, a LayerNorm of the embeddings), naive kernel: the bias add keeps nothing (the softmax
    # keeps its own output), the embeddings' LayerNorm is counted with the embedding. Measured: 0.9959 (layers;
    # the bool causal mask, a constant, is not counted), 0.9964 (whole model).
    from lmcost.model.config import ArchConfig

    cfg = ArchConfig.model_validate(dict(
        name="tiny-bloom", d_model=48, n_layers=2, vocab_size=128,
        attention=dict(n_heads=6, qkv_bias=True, out_bias=True),
        ffn=dict(activation="gelu", d_ff=96, bias=True), norm="layernorm", norm_bias=True, positions="alibi",
        embedding_norm=True, tie_embeddings=True))
    measured = _measure(cfg, "naive", "naive", 2, 64, monkeypatch)
    ours = layer_activation_bytes(cfg, FP32, Layout(), 2, 64, kernel="naive")
    layers = sum(ours.per_layer[g] * ours.layers[g] for g in ours.per_layer)
    assert layers / measured["layers"] == pytest.approx(1, abs=ORACLE_TOLERANCE)
    assert (layers + ours.embedding + ours.head) / (measured["layers"] + measured["other"]) == pytest.approx(
        1, abs=ORACLE_TOLERANCE)
