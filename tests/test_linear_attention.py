"""Hybrid stacks whose recurrent layers are linear attention (lmcost.model.hf.linear_attention): Qwen3.5's
gated DeltaNet, ...

Oracles: transformers, as tests/test_hybrid.py: parameters of the default configs on the meta device
(tests/test_params.py walks every supported type), matmul FLOPs of tiny instances under FlopCounterMode
(tests/test_flop_oracle.py at b=2, s=12; here other batches and lengths, one and two chunks), and the bytes
of the cache object transformers fills in a prefill and a decode step, exactly, at several batches and
contexts.
"""

from __future__ import annotations

import pytest

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.basics.dtypes import Precision
from lmcost.cost.kvcache import kv_bytes_per_token, state_bytes_per_sequence
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.linear_attention import FAMILIES

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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
