"""Training-step accounting: FlopCounterMode on a real forward + backward, and Ivanov et al.'s BERT table."""

from __future__ import annotations

import warnings

import pytest

from lmcost import Precision, Settings, load_config, load_gpu
from lmcost.apps.estimate import phase_ops
from lmcost.model.hf.families import from_hf_config
from lmcost.apps.roofline import breakdown

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402


@pytest.mark.parametrize("model_type", ["llama", "gpt2", "mixtral"])
def test_train_step_matmul_flops_equal_flop_counter(model_type):
    # A tiny transformers model, eager attention, loss on every token, loss.backward(): FlopCounterMode
    # counts forward and backward matmuls; ours (naive kernel, no causal discount) must equal it.
    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, pad_token_id=None)
    if model_type == "gpt2":
        kw = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    else:
        kw.update(intermediate_size=96, num_key_value_heads=2)
    if model_type == "mixtral":
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    cfg = transformers.CONFIG_MAPPING[model_type](**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, 100, (2, 16))
    with FlopCounterMode(display=False) as fc:
        model(ids, labels=ids).loss.backward()
    ours = from_hf_config(cfg.to_dict(), model_type)
    ops = phase_ops(ours, Precision("fp32", "fp32", "fp32"), "train", 2, 16, Settings(kernel="naive"))
    # The embedding's backward is a scatter-add, not a matmul; everything else with matmul=True counts.
    assert sum(op.flops * op.count for op in ops if op.matmul) == fc.get_total_flops()


def test_bert_large_layer_tensor_contractions_hand_worked():
    # B=8, J=K=512, N=1024, H=16, P=64, I=4096 (Ivanov et al. 2021, section 2).
    # Forward: QKV 2·B·J·N·3N + QKᵀ and ·V 2·(2·B·H·J·K·P) + output 2·B·J·N·N + FFN 2·(2·B·J·N·I)
    B, J, N, H, P, I = 8, 512, 1024, 16, 64, 4096
    fwd = 2 * B * J * N * 3 * N + 2 * (2 * B * H * J * J * P) + 2 * B * J * N * N + 2 * (2 * B * J * N * I)
    assert fwd == 111_669_149_696
    ops = phase_ops(load_config("bert-large-layer"), Precision("fp16", "fp16", "fp16"), "train", 8, 512,
                    Settings(kernel="naive"))
    assert sum(op.flops * op.count for op in ops if op.matmul) == 3 * fwd  # backward = 2 x forward


def test_bert_large_layer_flop_shares_match_ivanov_table_1():
    # Ivanov et al. 2021, Table 1 (BERT-large encoder layer, forward + backward, PyTorch on a V100):
    # tensor contraction 99.80%, normalization (incl. softmax) 0.17%, element-wise 0.03% of FLOPs.
    df = breakdown(load_config("bert-large-layer"), load_gpu("v100"), Precision("fp16", "fp16", "fp16"),
                   "train", 8, 512, Settings(kernel="naive")).set_index("op_class")
    for cls, published in (("tensor contraction", 99.80), ("normalization", 0.17), ("element-wise", 0.03)):
        assert abs(100 * df.loc[cls, "flops_share"] - published) <= 0.1, (cls, df.loc[cls, "flops_share"])
