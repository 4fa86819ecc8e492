"""Matmul FLOPs against torch.utils.flop_counter.FlopCounterMode on real transformers models.

For every supported model_type, a tiny random model built by transformers runs one prefill and one
decode step; FlopCounterMode counts its matmul FLOPs (mm/addmm/bmm, 2 per MAC; the addmm bias is
not counted; attention runs the eager path: full QKᵀ and PV with no causal discount, which is our
``naive`` kernel). Our GEMM + attention-matmul + lm_head + router FLOPs must equal it exactly.
MLA runs unabsorbed in transformers, which is our ``naive`` MLA mode.
"""

from __future__ import annotations

import warnings

import pytest

from lmcost.dtypes import Precision
from lmcost.estimate import phase_dims
from lmcost.graph import forward_ops
from lmcost.hf import SUPPORTED, from_hf_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

# Small widths under every name the families use (keys a family lacks are left alone).
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=96, vocab_size=128, head_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=4, num_local_experts=4, n_routed_experts=4,
            num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=24,
            q_lora_rank=40, qk_nope_head_dim=16, qk_rope_head_dim=8, qk_head_dim=24, v_head_dim=16,
            sliding_window=64, max_position_embeddings=256, n_group=1, topk_group=1, pad_token_id=None,
            n_embd=64, n_layer=2, n_head=4, n_positions=256, num_kv_heads=2)


def tiny_model(model_type: str):
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    data.update({k: v for k, v in TINY.items() if k in data})
    if data.get("layer_types") is not None:
        data["layer_types"] = None  # let the config derive it for 2 layers
    if model_type.startswith("deepseek"):
        data.update(num_key_value_heads=4, head_dim=8)  # MLA: heads all equal; RoPE on qk_rope_head_dim
    cfg = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in data.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # a loop of F.linear per expert: counted by FlopCounterMode
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model, from_hf_config(cfg.to_dict(), model_type)


def matmul_flops(cfg, phase, b, tokens):
    ops = forward_ops(cfg, phase_dims(cfg, Precision(), phase, b, tokens), kernel="naive", mla_mode="naive")
    return sum(op.flops * op.count for op in ops if op.matmul)


@pytest.mark.parametrize("model_type", SUPPORTED)
def test_matmul_flops_equal_flop_counter(model_type):
    model, cfg = tiny_model(model_type)
    b, s = 2, 12
    ids = torch.randint(0, 100, (b, s))
    with FlopCounterMode(display=False) as prefill, torch.no_grad():
        out = model(ids, use_cache=True)
    with FlopCounterMode(display=False) as decode, torch.no_grad():
        model(ids[:, :1], past_key_values=out.past_key_values, use_cache=True)
    assert matmul_flops(cfg, "prefill", b, s) == prefill.get_total_flops()
    # The decode step attends to the s cached tokens and itself: context t = s + 1.
    assert matmul_flops(cfg, "decode", b, s + 1) == decode.get_total_flops()
