"""Hybrid stacks whose recurrent layers are linear attention (lmcost.model.hf.linear_attention): Qwen3.5's
gated DeltaNet, MiniMax's lightning attention.

Oracles: transformers, as tests/test_hybrid.py: parameters of the default configs on the meta device
(tests/test_params.py walks every supported type), matmul FLOPs of tiny instances under FlopCounterMode
(tests/test_flop_oracle.py at b=2, s=12; here other batches and lengths, one and two chunks), and the bytes
of the cache object transformers fills in a prefill and a decode step, exactly, at several batches and
contexts.
"""

from __future__ import annotations

import warnings

import pytest

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes_per_token, state_bytes_per_sequence
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.linear_attention import FAMILIES

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from test_flop_oracle import tiny_model  # noqa: E402

import test_hybrid  # noqa: E402
from test_hybrid import check_cache_bytes, check_matmul_flops  # noqa: E402

LINEAR = sorted(FAMILIES)


@pytest.mark.parametrize("model_type", LINEAR)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_state_and_kv_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    check_cache_bytes(model_type, dtype, name, b, s)


@pytest.mark.parametrize("model_type", LINEAR)
@pytest.mark.parametrize("b, s", [(1, 5), (3, 70)])
def test_matmul_flops_at_other_lengths(model_type, b, s):
    # s = 70: two chunks of 64 (the second padded with 58 zeros), as transformers' torch chunked rules pad.
    check_matmul_flops(model_type, b, s)


def test_qwen3_5_9b_params_and_state_worked_by_hand():
    # Qwen3_5TextConfig's default (Qwen3.5-9B's decoder): 32 layers, every 4th gated attention (8), the
    # rest gated DeltaNet (24), d 4096, a dense SwiGLU MLP of 12288, vocab 248320, untied.
    data = transformers.CONFIG_MAPPING["qwen3_5_text"]().to_dict()
    cfg = from_hf_config(data, "qwen3_5_text")
    # DeltaNet layer: in_proj_qkv 4096*(2*16*128 + 32*128) = 4096*8192, in_proj_z 4096*4096, in_proj_b and
    # in_proj_a 2*4096*32, conv 8192*4, A_log and dt_bias 2*32, norm 128, out_proj 4096*4096.
    gdn = 4096 * 8192 + 4096 * 4096 + 2 * 4096 * 32 + 8192 * 4 + 64 + 128 + 4096 * 4096
    # Attention layer: q_proj 4096 -> 2*16*256 (query and gate), k, v 4096 -> 4*256 each, o 16*256 -> 4096,
    # q/k norms 2*256.
    attn = 4096 * 8192 + 2 * 4096 * 1024 + 4096 * 4096 + 512
    layer = 3 * 4096 * 12288 + 2 * 4096  # MLP and the two norms
    total = 2 * 248320 * 4096 + 4096 + 24 * (gdn + layer) + 8 * (attn + layer)
    assert param_counts(cfg)["total"] == hf_param_count(data) == total
    # Per DeltaNet layer and sequence: conv state 8192 channels * 4 taps * 2 B (bf16) = 65,536 B; state
    # 32 * 128 * 128 * 4 B (fp32) = 2,097,152 B; * 24 layers = 51,904,512 B. KV: 8 * 2 * 4 * 256 * 2 B per token.
    assert state_bytes_per_sequence(cfg, Precision()) == 24 * (8192 * 4 * 2 + 32 * 128 * 128 * 4) == 51_904_512
    assert kv_bytes_per_token(cfg, Precision()) == 8 * 2 * 4 * 256 * 2 == 32_768


def test_qwen3_5_wrapper_maps_its_decoder():
    # Qwen3_5Config's text_config is a Qwen3_5TextConfig: the wrapper maps to the same decoder.
    data = transformers.CONFIG_MAPPING["qwen3_5_moe"]().to_dict()
    text = transformers.CONFIG_MAPPING["qwen3_5_moe_text"]().to_dict()
    assert param_counts(from_hf_config(data, "w"))["total"] == param_counts(from_hf_config(text, "t"))["total"]


def test_lightning_continuing_a_sequence_runs_the_recurrence():
    # A second pass of 5 tokens after a prefill of 12 (t = 17 > s = 5): transformers' lightning layer finds
    # its state in the cache and steps the recurrence per token (2*d_h² MACs per head and token), as a
    # decode step does, not the blocked form; attention scores the 5 queries against the 17 keys.
    from lmcost.operators.forward import Dims, forward_ops
    from test_flop_oracle import counted_matmul_flops

    model, cfg = tiny_model("minimax")
    ids = torch.randint(0, 100, (2, 17))
    with torch.no_grad():
        out = model(ids[:, :12], use_cache=True)
        with FlopCounterMode(display=False) as second:
            model(ids[:, 12:], past_key_values=out.past_key_values, use_cache=True)
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 2, 5, 17), kernel="naive")
    assert sum(op.flops * op.count for op in ops if op.matmul) == counted_matmul_flops(second)
    rule = [op for op in ops if op.role == "mixer.lightning"]
    assert sum(op.flops * op.count for op in rule) == 2 * 2 * 4 * 5 * 2 * 16 * 16  # b*h*s*2*d_h² MACs, 1 layer


def test_minimax_params_and_state_worked_by_hand():
    # MiniMaxConfig's default: 32 layers alternating softmax (even) and lightning (odd) attention, d 4096,
    # 32 heads of 128 (8 KV heads), 8 experts of 14336 (top 2), vocab 32000, untied.
    data = transformers.CONFIG_MAPPING["minimax"]().to_dict()
    cfg = from_hf_config(data, "minimax")
    moe = 8 * 3 * 4096 * 14336 + 8 * 4096 + 2 * 4096           # experts, router, two norms
    attn = 2 * 4096 * 4096 + 2 * 4096 * 1024                    # q, o and k, v
    lightning = 4096 * 3 * 4096 + 4096 * 4096 + 4096 * 4096 + 4096  # qkv_proj, output_gate, out_proj, norm
    total = 2 * 32000 * 4096 + 4096 + 16 * (attn + moe) + 16 * (lightning + moe)
    assert param_counts(cfg)["total"] == hf_param_count(data) == total
    # State per lightning layer and sequence: 32 heads * 128 * 128 in bf16 = 1 MiB; 16 layers = 16 MiB.
    assert state_bytes_per_sequence(cfg, Precision()) == 16 * 32 * 128 * 128 * 2 == 16_777_216
    assert kv_bytes_per_token(cfg, Precision()) == 16 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("model_type, change, field", [
    ("minimax", dict(hidden_act="gelu"), "hidden_act"),          # also lightning attention's q, k, v activation
    ("minimax", dict(sliding_window=4096), "sliding_window"),    # a mask over a cache that keeps every key
    ("minimax", dict(layer_types=["linear_attention", "sliding_attention"] * 16), "layer_types"),
    ("qwen3_5_text", dict(hidden_act="gelu"), "hidden_act"),
    ("olmo_hybrid", dict(hidden_act="gelu"), "hidden_act"),
    ("qwen3_5_moe_text", dict(layer_types=["linear_attention"] * 3), "layer_types"),   # 3 entries for 40 layers
])
def test_bad_linear_attention_configs_are_one_line(model_type, change, field):
    test_hybrid.test_bad_hybrid_configs_are_one_line(model_type, change, field)


def test_lightning_yaml_section():
    # A lightning layer in lmcost YAML: qkv 64 -> 192, gate 64 -> 64, out 64 -> 64, norm 64: 20,544 params
    # beside its mixer norm (64); the attention layer 4*4096 + 64; embed + lm_head + final norm 16,448.
    from lmcost.model.config import ArchConfig

    cfg = ArchConfig.model_validate(dict(
        name="l", d_model=64, n_layers=2, vocab_size=128, attention=dict(n_heads=4), positions="none",
        ffn=dict(activation="relu2", d_ff=96),
        recurrent=dict(layer_pattern=["lightning", "global"], ffn_pattern=["none", "none"],
                       lightning=dict(n_heads=4, head_dim=16, block_size=8))))
    assert param_counts(cfg)["total"] == 16_448 + (64 + 20_544) + (64 + 4 * 4096)
    with pytest.raises(LmcostError) as e:
        from lmcost.model.loading import config_from_dict
        config_from_dict(dict(cfg.model_dump(exclude={"source", "aliases"}),
                              recurrent=dict(layer_pattern=["lightning"])), "m.yaml")
    assert e.value.field == "m.yaml: recurrent.lightning"


def test_reference_lightning_mixer_matches_transformers():
    """The reference decoder's lightning attention with transformers' weights and layer-1 slopes gives
    MiniMaxLightningAttention's output: a prefill of 9 (blocks of 4, 4 and an unpadded 1) from empty, and
    a prefill of 8 then a step of 1 from the cached state (its recurrence)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    from lmcost.profiling.decoder import build_decoder

    hf_cfg = transformers.MiniMaxConfig(
        hidden_size=64, num_hidden_layers=3, layer_types=["full_attention", "linear_attention", "full_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=128,
        num_local_experts=4, block_size=4, pad_token_id=None)
    cfg = from_hf_config(hf_cfg.to_dict(), "minimax")
    ours = build_decoder(cfg, max_batch=2, max_context=16).layers[1].attn
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval().model.layers[1].self_attn
    with torch.no_grad():
        hf.qkv_proj.weight.copy_(ours.w_qkv)
        hf.output_gate.weight.copy_(ours.w_gate)
        hf.out_proj.weight.copy_(ours.w_out)
        hf.norm.weight.copy_(ours.w_norm)
        ours.slope.copy_(hf.slope_rate)
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1))
    sc = lambda name: nullcontext()  # noqa: E731

    def run(*a, **k):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return hf(*a, position_embeddings=None, attention_mask=None, **k)[0]

    with torch.no_grad():
        torch.testing.assert_close(ours(x, SimpleNamespace(p=0), sc), run(x), rtol=1e-4, atol=1e-5)
        cache = MiniMaxCache()
        run(x[:, :8], cache=cache)
        ours(x[:, :8], SimpleNamespace(p=0), sc)
        torch.testing.assert_close(ours(x[:, 8:], SimpleNamespace(p=8), sc), run(x[:, 8:], cache=cache),
                                   rtol=1e-4, atol=1e-5)


def test_olmo_hybrid_widths_derived_as_its_config_does():
    # A file without the DeltaNet widths, KV heads or layer_types: OlmoHybridConfig derives 30 heads each,
    # d_k = int(0.75 * 3840 / 30) = 96, d_v = 192, every 4th layer attention; transformers' model of the
    # same file is the oracle. Without rope_theta the attention layers take no RoPE (NoPE).
    data = transformers.CONFIG_MAPPING["olmo_hybrid"]().to_dict()
    for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                "num_key_value_heads", "layer_types"):
        del data[key]
    data["rope_parameters"] = {"rope_type": "default"}
    cfg = from_hf_config(data, "olmo_hybrid")
    g = cfg.recurrent.gated_deltanet
    assert (g.n_k_heads, g.n_v_heads, g.d_k, g.d_v, cfg.attention.n_kv_heads) == (30, 30, 96, 192, 30)
    assert cfg.positions == "none" and [k for k, _ in cfg.layer_kinds()][:4] == ["gated_deltanet"] * 3 + ["global"]
    assert param_counts(cfg)["total"] == hf_param_count(data)
