"""Matmul FLOPs against torch.utils.flop_counter.FlopCounterMode on real transformers models.

For every supported model_type, a tiny random model built by transformers runs one prefill and one
decode step; FlopCounterMode counts its matmul FLOPs (mm/addmm/bmm, 2 per MAC; the addmm bias is
not counted; attention runs the eager path: full QKᵀ and PV with no causal discount, which is our
``naive`` kernel). Hybrids' Mamba-2 scan runs transformers' torch path, the SSD of Dao & Gu 2024
(Listing 1): its einsums (bmm) are modelled exactly by ``mixer.ssm``. Our GEMM + attention-matmul + lm_head + router FLOPs must equal it exactly.
MLA runs unabsorbed in transformers, which is our ``naive`` MLA mode.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import rnn_models

from lmcost.basics.dtypes import Precision
from lmcost.apps.estimate import phase_dims
from lmcost.operators.forward import forward_ops
from lmcost.model.hf.families import SUPPORTED, from_hf_config
from conftest import FILLED, filled_default

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
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
            n_embd=64, n_layer=2, n_head=4, n_positions=256, rotary_dim=8, word_embed_proj_dim=64, ffn_dim=96, num_kv_heads=2,
            # hybrids (lmcost.model.hf.hybrid): Mamba-2 widths, a chunk of 8 so 12 tokens make 2 chunks (one padded)
            ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=8, n_groups=2, chunk_size=8,
            moe_shared_expert_intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=8, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
            mamba_n_groups=2, mamba_chunk_size=8, shared_intermediate_size=48,
            # DSA (lmcost.model.hf.sparse): a top-k of 8 under the 12-token prompt, so the selection bites
            index_n_heads=4, index_head_dim=16, index_topk=8)


#: lmcost.model.hf.layouts_a: 2-layer configs whose derived layouts leave no MoE layer (Flint: layers 0 and 1
#: dense and global; Beam: the first 3 dense) get one dense layer then one MoE layer (and Flint a sliding one).
LAYOUTS_A_TINY = {"flint": dict(mlp_only_layers=[0], layer_types=["full_attention", "sliding_attention"]),
                  "beam": dict(mlp_layer_types=["dense", "sparse"])}


#: lmcost.model.hf.classic: keys of their own at TINY widths (XGLM's fairseq names, CTRL's dff).
CLASSIC_TINY = {"xglm": dict(d_model=64, num_layers=2, attention_heads=4), "ctrl": dict(dff=96)}


def tiny_model(model_type: str, **over):
    """A tiny transformers model of ``model_type`` (its defaults, filled where the class leaves a width unset,
    at TINY widths, ``over`` on top) and lmcost's config of it."""
    data = filled_default(model_type)
    data.update({k: v for k, v in TINY.items() if k in data})
    if data.get("layer_types") is not None:
        data["layer_types"] = None  # let the config derive it for 2 layers
    for key in ("no_rope_layers", "moe_layers",  # per-layer lists (Llama 4, SmolLM3): derived for 2 layers
                "mlp_layer_types", "num_attention_heads_per_layer",  # (Laguna, Mellum, MiMo-V2-Flash)
                "indexer_types"):  # (the DSA families)
        if data.get(key) is not None:
            data[key] = None
    if model_type == "llama4_text":
        # Llama4TextMoe runs every expert on every token (a dense bmm over all E): its matmul FLOPs are the
        # top-k dispatch lmcost counts only when E = k; layer 0 dense (of intermediate_size_mlp), layer 1 MoE
        data.update(num_local_experts=2, num_experts_per_tok=2, interleave_moe_layer_step=2,
                    intermediate_size_mlp=80)
    if model_type.startswith("deepseek") or model_type in MLA_VARIANTS or model_type == "glm_moe_dsa":
        data.update(num_key_value_heads=4, head_dim=8)  # MLA: heads all equal; RoPE on qk_rope_head_dim
    if model_type in ("kolibri1", "afmoe"):  # a sliding layer with RoPE, then a global one without
        data["layer_types"] = ["sliding_attention", "full_attention"]
    if model_type == "longcat_flash":  # one layer: two blocks, the shortcut MoE beside the first
        data.update(num_layers=1, ffn_hidden_size=96, expert_ffn_hidden_size=32, moe_topk=2, zero_expert_num=4)
    if model_type == "lfm2":
        data["full_attn_idxs"] = [1]  # layer 0 a short conv, layer 1 attention (the default is all attention)
    if model_type == "bamba":
        data["attn_layer_indices"] = [1]  # layer 0 Mamba-2, layer 1 attention (the default is all Mamba-2)
    if model_type == "granitemoehybrid":  # Mamba-2 then attention (the default is all Mamba-2), with RoPE
        data.update(layer_types=["linear_attention", "full_attention"], position_embedding_type="rope")
    if model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        data["layer_types"] = ["linear_attention", "full_attention"]  # derived for 2 layers: no attention layer
    if model_type == "minimax":
        # lightning attention's blocks: 12 tokens make a full block and a partial one; no window (refused)
        data.update(block_size=8, sliding_window=None)
    if model_type == "mamba2":  # Mamba2Config requires num_heads x head_dim = expand x hidden_size (2 x 64)
        data.update(num_heads=8, head_dim=16, state_size=16)
    if model_type == "jamba":  # layer 0 Mamba-1 with the MLP, layer 1 attention with the MoE (the default: both Mamba)
        data.update(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_dt_rank=8)
    if model_type in ("mamba", "falcon_mamba"):
        data["time_step_rank"] = 8  # a tiny rank (the default config's ceil(768 / 16) = 48 stays in its to_dict)
    if model_type == "gemma3n_text":  # per-layer lists of the 35 default layers; no KV sharing in 2 layers
        data.update(activation_sparsity_pattern=None, num_kv_shared_layers=0, laurel_rank=8,
                    hidden_size_per_layer_input=8, vocab_size_per_layer_input=112)
    if model_type.startswith("gemma4"):  # per_layer_config overrides the 30 default layers: the tiny 2 derive theirs
        data.pop("per_layer_config")
        data.update(global_head_dim=32, **({"hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 112}
                                           if "hidden_size_per_layer_input" in data else {}))
    data.update(LAYOUTS_A_TINY.get(model_type, {}))
    data.update(FILLED.get(model_type, {}).get("tiny", {}))  # nested widths, per-layer lists (filled-defaults.json)
    data.update(CLASSIC_TINY.get(model_type, {}))
    data.update(rnn_models.TINY.get(model_type, {}))
    data.update(over)
    cfg = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in data.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # a loop of F.linear per expert: counted by FlopCounterMode
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # no autograd: FlopCounterMode's module tracker hooks the grads of a module's tensor arguments, and
        # DbrxExpertGLU's are views of its weights taken under no_grad, which have none to hook
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval().requires_grad_(False)
    if model_type == "longcat_flash":
        _route_as_expected(model)
    model = rnn_models.adapt(model_type, model)  # RecurrentGemma returns no cache: a view that does
    return model, from_hf_config(cfg.to_dict(), model_type)


#: MLA decoders of lmcost.model.hf.mla_variants: heads all equal, RoPE on qk_rope_head_dim, as DeepSeek's.
MLA_VARIANTS = {"youtu", "minicpm3", "glm4_moe_lite", "sarvam_mla", "axk1", "longcat_flash"}


def _route_as_expected(model) -> None:
    """LongCat-Flash's routing made the expectation lmcost counts: which of its 4 FFN and 4 identity experts a
    token picks depends on the data, and lmcost counts k*E/(E+Z) = 2*4/8 = 1 FFN expert per token. With the
    router's weight zeroed every score is 1/8, and the correction bias picks FFN expert 0 and identity
    expert 4 for every token: one FFN expert each, exactly."""
    for layer in model.model.layers:
        router = layer.mlp.router
        with torch.no_grad():
            router.classifier.weight.zero_()
            router.e_score_correction_bias.zero_()
            router.e_score_correction_bias[0], router.e_score_correction_bias[4] = 1.0, 0.5
def cached(model, out) -> dict:
    """The prefill's cache under the keyword the model's forward reads: ``cache`` where it names one (Mamba,
    Mamba-2: transformers 5.24 renames only ``cache_params`` to it, and a ``past_key_values`` falls into their
    **kwargs unread, so the step would start from no state), else ``past_key_values``."""
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: out.past_key_values}


def counted_matmul_flops(counter) -> int:
    """FlopCounterMode's total less its aten.convolution FLOPs: the hybrids' depthwise conv1d is vector
    work in lmcost (``mixer.conv``, not a matmul), checked on its own in tests/test_hybrid.py."""
    conv = sum(v for k, v in counter.get_flop_counts().get("Global", {}).items() if "convolution" in str(k))
    return counter.get_total_flops() - conv


def matmul_flops(cfg, phase, b, tokens):
    ops = forward_ops(cfg, phase_dims(cfg, Precision(), phase, b, tokens), kernel="naive", mla_mode="naive")
    return sum(op.flops * op.count for op in ops if op.matmul)


def assert_prefill_and_decode_exact(model, cfg, b: int, s: int):
    """Run ``model`` (transformers) on a prefill of b x s random tokens, then one decode step, under
    FlopCounterMode; assert lmcost's matmul FLOPs of ``cfg`` equal the counted ones in both (the decode step
    attends to the s cached tokens and itself: context s + 1). Returns: the two counters."""
    ids = torch.randint(0, 100, (b, s))
    with FlopCounterMode(display=False) as prefill, torch.no_grad():
        out = model(ids, use_cache=True)
    with FlopCounterMode(display=False) as decode, torch.no_grad():
        model(ids[:, :1], **cached(model, out), use_cache=True)
    assert matmul_flops(cfg, "prefill", b, s) == counted_matmul_flops(prefill)
    assert matmul_flops(cfg, "decode", b, s + 1) == counted_matmul_flops(decode)
    return prefill, decode


#: transformers' OpenAIGPTLMHeadModel keeps no KV cache (its forward returns none): its prefill is
#: checked; lmcost's decode step is the cached one, the same formulas as every other family.
NO_CACHE = {"openai-gpt"}


#: Flags that change a layer, each checked as a family's defaults are: Falcon-RW's ALiBi in place of RoPE.
FLAGGED = {"falcon-alibi": ("falcon", {"alibi": True}),
           # lmcost.model.hf.classic: a Granite-SWA layer without RoPE, Persimmon without its q/k LayerNorms,
           # Apertus with a plain activation of ACT2FN in place of xIELU
           "granite_swa-nope": ("granite_swa", {"layer_rope_theta": [10000.0, 0.0]}),
           "persimmon-no-qk-norm": ("persimmon", {"qk_layernorm": False}),
           "apertus-relu2": ("apertus", {"hidden_act": "relu2"})}


@pytest.mark.parametrize("model_type, over", [(t, {}) for t in SUPPORTED] + list(FLAGGED.values()),
                         ids=SUPPORTED + list(FLAGGED))
def test_matmul_flops_equal_flop_counter(model_type, over):
    model, cfg = tiny_model(model_type, **over)
    b, s = 2, 12
    ids = torch.randint(0, 100, (b, s))
    with FlopCounterMode(display=False) as prefill, torch.no_grad():
        out = model(ids, use_cache=True)
    if model_type in NO_CACHE:  # no decode step to count: the model recomputes the whole prefix
        assert getattr(out, "past_key_values", None) is None
        assert matmul_flops(cfg, "prefill", b, s) == counted_matmul_flops(prefill)
        return
    with FlopCounterMode(display=False) as decode, torch.no_grad():
        model(ids[:, :1], **cached(model, out), use_cache=True)
    assert matmul_flops(cfg, "prefill", b, s) == counted_matmul_flops(prefill)
    # The decode step attends to the s cached tokens and itself: context t = s + 1.
    assert matmul_flops(cfg, "decode", b, s + 1) == counted_matmul_flops(decode)
