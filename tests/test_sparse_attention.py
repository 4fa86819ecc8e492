"""DeepSeek Sparse Attention (issue 29): the lightning indexer and top-k sparse MLA (lmcost.operators.sparse_attention),
mapped from deepseek_v32 and glm_moe_dsa (lmcost.model.hf.sparse).

Oracles: transformers. Parameters of the default configs on the meta device and matmul FLOPs of tiny instances
(also in tests/test_params.py and tests/test_flop_oracle.py; here at other batches and lengths, the top-k of 8
biting and not); the bytes of the cache object transformers fills (MLA's latent and RoPE key, and the indexer's
keys) after a prefill and a decode step; the pairs the sparse attention keeps, counted on the mask transformers'
eager path applies (the ``flash`` kernel's pairs). Worked figures by hand for DeepSeek-V3.2's sizes.
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes, kv_bytes_per_token
from lmcost.model.hf.families import from_hf_config
from lmcost.model.loading import config_from_dict
from lmcost.operators.assembly import phase_dims
from lmcost.operators.forward import forward_ops

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from test_flop_oracle import counted_matmul_flops, matmul_flops, tiny_model  # noqa: E402
from test_hybrid import _cache_nbytes  # noqa: E402

DSA = ["deepseek_v32", "glm_moe_dsa"]


def _ops(cfg, phase, b, tokens, kernel="flash", mla_mode="absorbed"):
    return forward_ops(cfg, phase_dims(cfg, Precision(), phase, b, tokens), kernel=kernel, mla_mode=mla_mode)


def _sum(ops, role, field="flops"):
    return sum(getattr(op, field) * op.count for op in ops if op.role == role)


@pytest.mark.parametrize("model_type", DSA)
def test_default_configs_params_exact(model_type):
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type", DSA)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_kv_and_index_cache_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    model, cfg = tiny_model(model_type)
    model = model.to(dtype)
    ids = torch.randint(0, 100, (b, s))
    prec = Precision(weights=name, activations=name, kv_cache=name)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids, use_cache=True)
        # DynamicIndexedLayer: latent [b,1,t,24], RoPE key [b,1,t,8] and index keys [b,t,16], 2 layers
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, prec, b, s) == 2 * b * s * (24 + 8 + 16) * prec.B_kv
        model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, prec, b, s + 1)


@pytest.mark.parametrize("model_type", DSA)
@pytest.mark.parametrize("b, s", [(2, 5), (3, 12), (1, 20)])
def test_matmul_flops_and_sparse_pairs_against_transformers(model_type, b, s):
    # Matmul FLOPs at other batches and lengths (s = 5 under the top-k of 8, every key selected; 12 and 20 over
    # it): transformers' eager path costs the same either way (dense attention under a mask, the indexer over all
    # keys), lmcost's naive kernel. The flash kernel computes only the (query, key) pairs the indexer selects: the
    # entries the mask of transformers' eager path leaves at 0 (causal and in the top-k), per head over the batch.
    model, cfg = tiny_model(model_type)
    module = __import__(type(model).__module__, fromlist=["eager_attention_forward"])
    kept, eager = [], module.eager_attention_forward

    def counting(mod, q, k, v, mask, **kw):
        kept.append(int((mask == 0).sum()))
        return eager(mod, q, k, v, mask, **kw)

    module.eager_attention_forward = counting
    try:
        ids = torch.randint(0, 100, (b, s))
        with FlopCounterMode(display=False) as prefill, torch.no_grad():
            out = model(ids, use_cache=True)
        with FlopCounterMode(display=False) as decode, torch.no_grad():
            model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    finally:
        module.eager_attention_forward = eager
    assert matmul_flops(cfg, "prefill", b, s) == counted_matmul_flops(prefill)
    assert matmul_flops(cfg, "decode", b, s + 1) == counted_matmul_flops(decode)
    L, h, m = cfg.n_layers, cfg.attention.n_heads, cfg.attention.mla
    per_pair = 2 * (m.kv_lora_rank + m.qk_rope_head_dim) + 2 * m.kv_lora_rank  # absorbed: scores over the latent
    for phase, tokens, got in (("prefill", s, sum(kept[:L])), ("decode", s + 1, sum(kept[L:]))):
        assert _sum(_ops(cfg, phase, b, tokens), "attn.sdpa") == got * h * per_pair
    # by hand, top-k 8: prefill sum_{j=1..s} min(j, 8); decode min(s + 1, 8), per sequence and layer
    assert sum(kept[:L]) == L * b * sum(min(j, 8) for j in range(1, s + 1))
    assert sum(kept[L:]) == L * b * min(s + 1, 8)


def test_indexer_flops_by_kernel_worked_by_hand():
    # Tiny deepseek_v32: index heads H = 4 of D = 16, 2 layers; b = 2, prompt 12.
    _, cfg = tiny_model("deepseek_v32")
    naive, flash = _ops(cfg, "prefill", 2, 12, "naive"), _ops(cfg, "prefill", 2, 12, "flash")
    # naive (transformers): all s*t = 144 scores per head: q.k D MACs each, the weighted head sum 1; 2 layers,
    # 2 FLOPs per MAC, over b * H = 8 (sequence, head) rows
    assert _sum(naive, "attn.indexer.score") == 2 * 2 * (2 * 4 * 144) * 16
    assert _sum(naive, "attn.indexer.weight_sum") == 2 * 2 * (2 * 4 * 144)
    # flash: the 78 causal pairs (12 * 13 / 2) per head, both matmuls in one kernel: D + 1 MACs each
    assert _sum(flash, "attn.indexer.score") == 2 * 2 * (2 * 4 * 78) * 17
    # decode at t = 13: every cached index key read once, [b, t, D] at 2 bytes, per layer
    dec = _ops(cfg, "decode", 2, 13)
    assert _sum(dec, "attn.indexer.score", "kv_read_bytes") == 2 * (2 * 13 * 16 * 2)
    # the indices written: min(j, 8) per query in flash; min(8, t) per query in transformers' [b,s,min(k,t)]
    assert _sum(flash, "attn.indexer.topk", "act_write_bytes") == 2 * 2 * (36 + 4 * 8) * 4
    assert _sum(naive, "attn.indexer.topk", "act_write_bytes") == 2 * 2 * 12 * 8 * 4


def test_deepseek_v32_decode_attention_stops_growing_past_top_k():
    # DeepSeek-V3.2 (DeepseekV32Config's defaults: 128 heads, latent 512 + RoPE 64, top-k 2048, 61 layers).
    cfg = from_hf_config(transformers.CONFIG_MAPPING["deepseek_v32"]().to_dict(), "v32")
    for t in (4096, 131072):
        ops = _ops(cfg, "decode", 1, t)
        # absorbed sparse MLA: 2048 pairs per head, scores over 576 and values over 512 dims
        assert _sum(ops, "attn.sdpa") == 61 * 2 * 128 * 2048 * (576 + 512)
        assert _sum(ops, "attn.sdpa", "kv_read_bytes") == 61 * 2048 * 576 * 2
        # the indexer reads all t index keys (128 dims, bf16) and scores them: 64 heads, 2*(128 + 1) FLOPs each
        assert _sum(ops, "attn.indexer.score", "kv_read_bytes") == 61 * t * 128 * 2
        assert _sum(ops, "attn.indexer.score") == 61 * 2 * 64 * t * 129
    # the dense path (transformers' mask) grows with t: all t keys per head, over the latent (absorbed) or the
    # up-projected 192-wide keys (naive MLA, as transformers runs it)
    assert _sum(_ops(cfg, "decode", 1, 131072, "naive"), "attn.score") == 61 * 2 * 128 * 131072 * 576
    assert _sum(_ops(cfg, "decode", 1, 131072, "naive", "naive"), "attn.score") == 61 * 2 * 128 * 131072 * 192


def test_kv_bytes_per_token_worked_by_hand_and_fp8_index_cache():
    data = transformers.CONFIG_MAPPING["deepseek_v32"]().to_dict()
    cfg = from_hf_config(data, "v32")
    # per layer: latent 512 + RoPE key 64 + index key 128 elements, bf16; 61 layers
    assert kv_bytes_per_token(cfg, Precision()) == 61 * (512 + 64 + 128) * 2 == 85_888
    # DeepSeek's inference code and vLLM keep the index keys in fp8 with a float32 scale per 128: 132 bytes
    fp8 = cfg.model_copy(update={"attention": cfg.attention.model_copy(
        update={"sparse": cfg.attention.sparse.model_copy(update={"index_cache": "fp8"})})})
    assert kv_bytes_per_token(fp8, Precision()) == 61 * ((512 + 64) * 2 + 132) == 78_324


V32_YAML = """
name: deepseek-v3.2
d_model: 7168
n_layers: 61
vocab_size: 129280
attention:
  n_heads: 128
  mla: {q_lora_rank: 1536, kv_lora_rank: 512, qk_nope_head_dim: 128, v_head_dim: 128}
  sparse: {index_heads: 64, index_head_dim: 128, top_k: 2048}
ffn: {activation: swiglu, d_ff: 18432}
moe: {n_experts: 256, top_k: 8, d_ff_expert: 2048, n_shared_experts: 1, first_dense_layers: 3}
"""


def test_yaml_sparse_section_is_the_hf_import():
    ours = config_from_dict(yaml.safe_load(V32_YAML))
    data = transformers.CONFIG_MAPPING["deepseek_v32"]().to_dict()
    hf = from_hf_config(data, "v32")
    assert ours.attention.sparse == hf.attention.sparse
    assert param_counts(ours)["total"] == hf_param_count(data)
    assert kv_bytes(ours, Precision(), 3, 5000) == kv_bytes(hf, Precision(), 3, 5000)
    for phase, t in (("prefill", 3000), ("decode", 9000)):
        for kernel in ("flash", "naive"):
            assert [op.flops for op in _ops(ours, phase, 2, t, kernel)] == [op.flops for op in _ops(hf, phase, 2, t, kernel)]


@pytest.mark.parametrize("change, said", [
    ({"mla": None}, "q_lora_rank"),
    ({"sparse": {"index_heads": 4, "index_head_dim": 32, "top_k": 8}}, "narrower"),
    ({"sliding_window": 128}, "sliding"),
    ({"sparse": {"index_heads": 4, "index_head_dim": 128, "top_k": 8, "index_cache": "int4"}}, "index_cache"),
])
def test_bad_sparse_sections_are_one_line(change, said):
    data = yaml.safe_load(V32_YAML)
    data["attention"] = {k: v for k, v in {**data["attention"], **change}.items() if v is not None}
    with pytest.raises(LmcostError) as e:
        config_from_dict(data)
    assert "\n" not in str(e.value) and said in str(e.value)


@pytest.mark.parametrize("model_type, change, field", [
    ("glm_moe_dsa", dict(indexer_types=None, index_topk_freq=4), "indexer_types"),
    ("glm_moe_dsa", dict(indexer_types=["full", "shared"] * 39), "indexer_types"),
    ("deepseek_v32", dict(layer_types=["full_attention"] * 61), "layer_types"),
    ("deepseek_v32", dict(mlp_layer_types=["dense", "moe"] * 30 + ["dense"]), "mlp_layer_types"),
])
def test_what_dsa_mappings_refuse(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}"


def test_glm_index_topk_freq_one_is_every_layer_full():
    # GlmMoeDsaConfig: layer i runs its indexer when max(i - offset + 1, 0) % freq == 0: freq 1 is every layer
    data = {**transformers.CONFIG_MAPPING["glm_moe_dsa"]().to_dict(), "indexer_types": None, "index_topk_freq": 1}
    assert param_counts(from_hf_config(data, "g"))["total"] == hf_param_count(data)


# ---------------------------------------------------------------------------------------------------
# The reference decoder's DSA layer (lmcost.profiling.sparse_attention), with a top-k of 4 that bites: a
# prompt of 8 and decode steps up to 12 keys (tests/test_decoder.py runs its generic checks at a top-k of 16).
# 16 index heads: an index score of exactly 0 (every head's ReLU zero: a tie the top-k breaks as it likes, so a
# long prefill and its pieces could pick different keys) is then rare, and absent at these seeds.

BITING = dict(name="dsa", d_model=64, n_layers=2, vocab_size=128, ffn=dict(activation="swiglu", d_ff=96),
              attention=dict(n_heads=4, mla=dict(q_lora_rank=32, kv_lora_rank=24, qk_nope_head_dim=16,
                                                 qk_rope_head_dim=8, v_head_dim=12),
                             sparse=dict(index_heads=16, index_head_dim=16, top_k=4)))


def _decoder(kernel="flash", mla_mode="absorbed", top_k=4):
    from lmcost.model.config import ArchConfig
    from lmcost.profiling.decoder import build_decoder

    a = BITING["attention"]
    data = {**BITING, "attention": {**a, "sparse": {**a["sparse"], "top_k": top_k}}}
    return build_decoder(ArchConfig.model_validate(data), max_batch=3, max_context=16, kernel=kernel,
                         mla_mode=mla_mode, sdpa_backend="math")


def _ids(n=12):
    return torch.randint(0, 128, (2, n), generator=torch.Generator().manual_seed(1))


def test_decoder_kernels_agree_and_pieces_equal_one_prefill():
    from conftest import in_pieces

    ids = _ids()
    outs = []
    for kernel in ("flash", "naive"):
        for mla_mode in ("absorbed", "naive"):
            model = _decoder(kernel, mla_mode)
            full = model(ids, 0)
            # prefill 3, a chunk of 4, then decode steps: the indexer's cache and selection carry over
            torch.testing.assert_close(in_pieces(model, ids, 3, 7), full, rtol=1e-4, atol=1e-4)
            outs.append(full)
    for out in outs[1:]:  # the gather kernel and the masked dense ones attend to the same keys
        torch.testing.assert_close(out, outs[0], rtol=1e-4, atol=1e-4)
    # the top-k bites: with every key selected (top-k 16) the logits differ
    assert not torch.allclose(_decoder(top_k=16)(ids, 0), outs[0], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kernel, mla_mode", [("naive", "absorbed"), ("naive", "naive"), ("flash", "absorbed")])
def test_decoder_flops(kernel, mla_mode):
    # naive: the masked dense path, the analytic naive count, prefill and decode. flash (the gather kernel), in a
    # decode step: the analytic flash count exactly (min(t, 4) = 4 keys per head; the indexer scores all t keys,
    # which are the causal ones for one query); its prefill pads each query to 4 keys (32 pairs, not 26).
    from lmcost.model.config import ArchConfig

    cfg = ArchConfig.model_validate(BITING)
    model, ids = _decoder(kernel, mla_mode), _ids(9)
    with FlopCounterMode(display=False) as prefill:
        model(ids[:, :8], 0)
    with FlopCounterMode(display=False) as decode:
        model(ids[:, 8:], 8)

    def analytic(phase, tokens, k):
        return sum(op.flops * op.count for op in _ops(cfg, phase, 2, tokens, k, mla_mode) if op.matmul)

    assert decode.get_total_flops() == analytic("decode", 9, kernel)
    if kernel == "naive":
        assert prefill.get_total_flops() == analytic("prefill", 8, "naive")
    else:
        h, pairs = 4, (8 * 4 - (1 + 2 + 3 + 4 * 5)) * 2  # padded pairs per head over the batch, per layer
        assert prefill.get_total_flops() == analytic("prefill", 8, "flash") + 2 * (
            2 * h * pairs * (24 + 8 + 24)  # gather kernel's extra pairs
            + 2 * 2 * (64 - 36) * 16 * (16 + 1))  # the indexer's non-causal scores, 16 heads, D + 1 MACs


def test_estimate_header_names_dsa():
    # deepseek_v32 is MLA with DeepSeek Sparse Attention: the header says both (deepseek_v3's says MLA alone).
    from lmcost.cli.estimate import attention_label

    cfg = from_hf_config(transformers.CONFIG_MAPPING["deepseek_v32"]().to_dict(), "deepseek_v32")
    assert attention_label(cfg) == "MLA + DSA"
    assert attention_label(from_hf_config(transformers.CONFIG_MAPPING["deepseek_v3"]().to_dict(), "v3")) == "MLA"
