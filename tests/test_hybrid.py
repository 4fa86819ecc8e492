"""Hybrid stacks with constant-size state layers (issue 14): Mamba-2 (Nemotron-H), LFM2's short conv.

Oracles: transformers. Parameters of the default configs built on the meta device; matmul FLOPs of tiny
instances under FlopCounterMode (the whole model in tests/test_flop_oracle.py; here the conv, prefill
lengths that pad a chunk, other batches); the bytes of the cache object transformers fills in a prefill
and a decode step (keys, values, conv states, SSM states), exactly, at several batches and contexts.
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from conftest import filled_default, hf_json, hf_param_count
from lmcost import load_config, param_counts
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.apps.estimate import phase_dims
from lmcost.operators.forward import forward_ops
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf import filled
from lmcost.model.hf.hybrid import FAMILIES
from lmcost.cost.kvcache import kv_bytes, kv_bytes_per_token, state_bytes_per_sequence
from lmcost.model.loading import config_from_dict

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_flop_oracle import assert_prefill_and_decode_exact, cached, tiny_model  # noqa: E402

HYBRIDS = sorted([*FAMILIES, *filled.HYBRIDS])


def default_data(model_type: str) -> dict:
    """The transformers config class's defaults (a real model of each family), with what it leaves unset
    filled in (tests/data/filled-defaults.json)."""
    return filled_default(model_type)


@pytest.mark.parametrize("model_type", HYBRIDS)
def test_params_of_default_config_are_exact(model_type):
    data = default_data(model_type)
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


def test_nemotron_h_56b_params_and_state_worked_by_hand():
    # Nemotron-H-56B-Base-8K (tests/data/hf-configs), 118 blocks: 54 Mamba-2, 10 attention, 54 MLP.
    cfg = load_config("nemotron-h-56b")
    assert param_counts(cfg)["total"] == hf_param_count(hf_json("nemotron-h-56b-base-8k")) == 56_324_350_464
    # Per Mamba-2 layer and sequence: d_in = 256 heads * 64 = 16384; conv channels C = d_in + 2*g*N
    # = 16384 + 2*8*256 = 20480, conv state C * d_conv = 20480 * 4 = 81,920 elements * 2 (bf16) = 163,840 B;
    # SSM state 256 * 64 * 256 = 4,194,304 elements * 4 (fp32) = 16,777,216 B. Sum 16,941,056 B; x 54 layers
    # = 914,817,024 B (0.85 GiB) per sequence, whatever the context.
    assert state_bytes_per_sequence(cfg, Precision()) == 54 * (20480 * 4 * 2 + 256 * 64 * 256 * 4) == 914_817_024
    # KV per token: 10 attention layers * 2 (K, V) * 8 KV heads * 128 * 2 B = 40,960 B.
    assert kv_bytes_per_token(cfg, Precision()) == 10 * 2 * 8 * 128 * 2 == 40_960
    # At the 8K context: 914,817,024 + 8192 * 40,960 = 1,250,361,344 B per sequence.
    assert kv_bytes(cfg, Precision(), 1, 8192) == 914_817_024 + 8192 * 40_960 == 1_250_361_344
    assert kv_bytes(cfg, Precision(), 3, 8192) == 3 * 1_250_361_344


def _cache_nbytes(cache) -> int:
    """Bytes of every tensor transformers' cache object holds: keys, values, conv and recurrent states
    (and MiniMaxCache's lightning states, a list beside its layers)."""
    total = sum(t.nbytes for t in getattr(cache, "linear_cache", []) if torch.is_tensor(t))
    for layer in cache.layers:
        for value in vars(layer).values():
            tensors = value.values() if isinstance(value, dict) else [value]
            total += sum(t.nbytes for t in tensors if torch.is_tensor(t) and t.is_floating_point())
    return total


@pytest.mark.parametrize("model_type", HYBRIDS)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_state_and_kv_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    check_cache_bytes(model_type, dtype, name, b, s)


def check_cache_bytes(model_type, dtype, name, b, s):
    """The bytes of the cache transformers fills in a prefill of s and a decode step == lmcost's kv_bytes."""
    model, cfg = tiny_model(model_type)
    model = model.to(dtype)
    ids = torch.randint(0, 100, (b, s))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model(ids, use_cache=True)
        prec = Precision(weights=name, activations=name, kv_cache=name)
        # conv states in the model dtype (B_kv), SSM states in fp32 whatever it (recurrent.STATE_BYTES)
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, prec, b, s)
        model(ids[:, :1], **cached(model, out), use_cache=True)
        assert _cache_nbytes(out.past_key_values) == kv_bytes(cfg, prec, b, s + 1)


def _conv_flops(counter) -> int:
    return sum(v for k, v in counter.get_flop_counts()["Global"].items() if "convolution" in str(k))


@pytest.mark.parametrize("model_type", HYBRIDS)
@pytest.mark.parametrize("b, s", [(1, 5), (3, 17)])
def test_matmul_flops_at_other_lengths_and_conv_flops(model_type, b, s):
    # s = 17 with chunk_size 8 (TINY): 3 chunks, the last padded with 7 zeros, as transformers' SSD pads it;
    # the gated DeltaNet's chunks are 64 (transformers' torch_chunk_gated_delta_rule): one, padded.
    cfg, prefill, decode = check_matmul_flops(model_type, b, s)
    # The conv: lmcost counts 2*K FLOPs (K MACs) per output (+1 bias, + SiLU's 4 in Mamba-2) of the s new
    # positions. transformers' torch conv pads K - 1 zeros on both sides and keeps s outputs, so
    # FlopCounterMode sees 2*K*C*b*(s + K - 1) in prefill; a decode step convolves [state (K), x (1)]
    # unpadded: 2 outputs, 2*K*C*b*2.
    K, C = _conv_shape(cfg)
    conv = [op for op in forward_ops(cfg, phase_dims(cfg, Precision(), "prefill", b, s)) if op.role == "mixer.conv"]
    per = 2 * K + (1 if _conv_bias(cfg) else 0) + (0 if cfg.recurrent.short_conv else 4)  # SiLU but in LFM2
    assert sum(op.flops * op.count for op in conv) == per * C * b * s * _n_conv_layers(cfg)
    assert _conv_flops(prefill) == 2 * K * C * b * (s + K - 1) * _n_conv_layers(cfg)
    assert _conv_flops(decode) == 2 * K * C * b * 2 * _n_conv_layers(cfg)


def check_matmul_flops(model_type, b, s):
    """Matmul FLOPs of a prefill of s and a decode step == FlopCounterMode's on the tiny model.
    Returns: (lmcost config, the prefill's counter, the decode step's counter)."""
    model, cfg = tiny_model(model_type)
    return (cfg, *assert_prefill_and_decode_exact(model, cfg, b, s))


def _conv_shape(cfg):
    """(K taps, channels) of the family's conv: Mamba-2 x, B, C; short conv d; gated DeltaNet q, k, v."""
    r = cfg.recurrent
    if r.mamba2 is not None:
        m = r.mamba2
        return m.d_conv, m.n_heads * m.head_dim + 2 * m.n_groups * m.d_state
    if r.gated_deltanet is not None:
        g = r.gated_deltanet
        return g.d_conv, 2 * g.n_k_heads * g.d_k + g.n_v_heads * g.d_v
    return r.short_conv.d_conv, cfg.d_model


def _conv_bias(cfg):
    r = cfg.recurrent
    return r.mamba2.conv_bias if r.mamba2 is not None else r.short_conv.bias if r.short_conv is not None else False


def _n_conv_layers(cfg):
    return sum(1 for k, _ in cfg.layer_kinds() if k in ("mamba2", "short_conv", "gated_deltanet"))


def test_lfm2_layer_kinds_and_ffn_width():
    # Lfm2Config: layer i is attention iff i in full_attn_idxs; Lfm2MLP's width with block_auto_adjust_ff_dim:
    # int(2 * 12288 / 3) = 8192, times 1.0, rounded up to a multiple of 256 = 8192.
    data = transformers.CONFIG_MAPPING["lfm2"]().to_dict()
    data.update(num_hidden_layers=4, full_attn_idxs=[1, 3], layer_types=None)
    cfg = from_hf_config(data, "lfm2")
    assert cfg.layer_kinds() == [("short_conv", "dense"), ("global", "dense")] * 2
    assert cfg.ffn.d_ff == 8192
    assert param_counts(cfg)["total"] == hf_param_count(data)
    # Per sequence: 2 conv layers * d (2560) * conv_L_cache (3) * 2 B (bf16) = 30,720 B of conv state.
    assert state_bytes_per_sequence(cfg, Precision()) == 2 * 2560 * 3 * 2 == 30_720


# ---- the schema, and one-line errors ----

def _yaml(**recurrent):
    base = dict(name="h", d_model=64, n_layers=4, vocab_size=128, attention=dict(n_heads=4),
                ffn=dict(activation="swiglu", d_ff=96),
                recurrent=dict(layer_pattern=["mamba2", "global"],
                               mamba2=dict(n_heads=8, head_dim=8, d_state=16, n_groups=2)))
    base["recurrent"].update(recurrent)
    return base


def test_yaml_schema_example():
    text = """
name: tiny-hybrid
d_model: 64
n_layers: 4
vocab_size: 128
attention: {n_heads: 4, n_kv_heads: 2}
ffn: {activation: relu2, d_ff: 96}
recurrent:
  mamba2: {n_heads: 8, head_dim: 8, d_state: 16, n_groups: 2, d_conv: 4, chunk_size: 8}
  layer_pattern: [mamba2, none, global, none]
  ffn_pattern: [none, dense, none, dense]
positions: none
"""
    cfg = ArchConfig.model_validate(yaml.safe_load(text))
    assert cfg.layer_kinds() == [("mamba2", "none"), ("none", "dense"), ("global", "none"), ("none", "dense")]
    # Params: embed 128*64 + lm_head 64*128 + final norm 64 = 16,448; Mamba-2 layer: norm 64, in_proj
    # 64*(2*64 + 2*2*16 + 8) = 64*200 = 12,800, conv 128*4 + 128 = 640, A_log/dt_bias/D 24, gated norm 64,
    # out_proj 64*64 = 4096: 17,688; attention layer: norm 64 + q 4096 + k, v 2*2048 + o 4096 = 12,352;
    # MLP layer: norm 64 + up 6144 + down 6144 = 12,352 (two of them).
    assert param_counts(cfg)["total"] == 16_448 + 17_688 + 12_352 + 2 * 12_352


@pytest.mark.parametrize("change, field", [
    (dict(mamba2=None), "recurrent.mamba2"),                                  # a mamba2 layer without widths
    (dict(mamba2=dict(n_heads=8, head_dim=8, d_state=16, n_groups=3)), "recurrent.mamba2.n_groups"),
    (dict(layer_pattern=[]), "recurrent.layer_pattern"),
    (dict(layer_pattern=["mamba3"]), "recurrent.layer_pattern.0"),
    (dict(ffn_pattern=["moe"]), "recurrent"),                                 # moe layers, no moe section
    (dict(layer_pattern=["none"], ffn_pattern=["none"]), "recurrent"),        # a layer with nothing in it
    (dict(layer_pattern=["local", "mamba2"]), "recurrent"),                   # local layers, no window
    (dict(mamba2=dict(n_heads=8, head_dim=8, d_state=0)), "recurrent.mamba2.d_state"),
    (dict(short_conv=dict(d_conv=3, bias="yes")), "recurrent.short_conv.bias"),
])
def test_bad_recurrent_sections_are_one_line(change, field):
    with pytest.raises(LmcostError) as e:
        config_from_dict(_yaml(**change), "m.yaml")
    assert e.value.field == f"m.yaml: {field}"
    assert "\n" not in str(e.value) and "; " in str(e.value)


def test_recurrent_layers_need_pre_norm():
    data = _yaml()
    data["block"] = "parallel"
    with pytest.raises(LmcostError) as e:
        config_from_dict(data, "m.yaml")
    assert e.value.field == "m.yaml: block" and "\n" not in str(e.value)


@pytest.mark.parametrize("change, field", [
    (dict(hybrid_override_pattern="M*X", layers_block_type=None), "hybrid_override_pattern"),
    (dict(layers_block_type=["linear_attention", "cross_attention"]), "layers_block_type"),
    (dict(num_hidden_layers=7), "num_hidden_layers"),
    (dict(mamba_ssm_cache_dtype="float16"), "mamba_ssm_cache_dtype"),
    (dict(moe_latent_size=512), "moe_latent_size"),
    (dict(attention_head_dim=64), "attention_head_dim"),
    (dict(mamba_state_layout="x"), "mamba_state_layout"),                   # a key no mapping reads
])
def test_bad_nemotron_h_configs_are_one_line(change, field):
    data = transformers.CONFIG_MAPPING["nemotron_h"]().to_dict()
    data.update(change)
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)


def test_bad_lfm2_layer_type_is_one_line():
    data = transformers.CONFIG_MAPPING["lfm2"]().to_dict()
    data["layer_types"] = ["conv", "sliding_attention"] + ["conv"] * 30
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == "c.json: layer_types" and "'sliding_attention'" in str(e.value)


# ---- the reference decoder's mixers against transformers' (same weights, same logits) ----

def test_reference_decoder_matches_transformers_nemotron_h():
    """Mamba-2 (conv + SiLU, chunked SSD from a zero state, the recurrent decode step, gated RMSNorm),
    attention without RoPE and squared-ReLU MLP blocks: the decoder's weights loaded into transformers'
    NemotronH give the same logits in one prefill of 9 (two chunks of 8, one padded) and in a prefill of
    8 + one decode step from the cached conv and SSM states."""
    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    hf_cfg = transformers.NemotronHConfig(
        hidden_size=64, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=128, ssm_state_size=16,
        mamba_num_heads=8, mamba_head_dim=8, n_groups=2, chunk_size=8, layer_norm_epsilon=1e-5,
        time_step_min=1e-9,  # the prefill clamps dt below at time_step_min; keep it out of the way
        pad_token_id=None)
    hf_cfg._attn_implementation = "eager"
    cfg = from_hf_config(hf_cfg.to_dict(), "nemotron_h")
    ours = build_decoder(cfg, max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"model.embeddings.weight": ours.embed, "model.norm_f.weight": ours.final_norm.weight,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        pre, m = f"model.layers.{i}.", layer.attn
        if layer.mixer_kind == "mamba2":
            state.update({pre + "norm.weight": layer.attn_norm.weight, pre + "mixer.in_proj.weight": m.w_in,
                          pre + "mixer.conv1d.weight": m.w_conv[:, None, :], pre + "mixer.conv1d.bias": m.b_conv,
                          pre + "mixer.dt_bias": m.dt_bias, pre + "mixer.A_log": m.A_log, pre + "mixer.D": m.D,
                          pre + "mixer.norm.weight": m.w_norm, pre + "mixer.out_proj.weight": m.w_out})
        elif layer.mixer_kind == "global":
            state[pre + "norm.weight"] = layer.attn_norm.weight
            state.update({pre + f"mixer.{n}_proj.weight": getattr(m, f"w{n}") for n in "qkvo"})
        else:
            state.update({pre + "norm.weight": layer.ffn_norm.weight, pre + "mixer.up_proj.weight": layer.ffn.w_up,
                          pre + "mixer.down_proj.weight": layer.ffn.w_down})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, state)


def test_reference_decoder_matches_transformers_lfm2():
    """LFM2's gated short conv (with biases) and attention with per-head q/k RMSNorm and RoPE: same logits
    as transformers' Lfm2 with the decoder's weights, in one prefill and in prefill + a decode step."""
    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    hf_cfg = transformers.Lfm2Config(
        hidden_size=64, num_hidden_layers=3, full_attn_idxs=[1], num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=128, conv_bias=True, norm_eps=1e-5, pad_token_id=None,
        tie_word_embeddings=False,  # load_state_dict wants a tied lm_head.weight that named_parameters omits
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})  # the decoder's RoPE base
    hf_cfg._attn_implementation = "eager"
    cfg = from_hf_config(hf_cfg.to_dict(), "lfm2")
    ours = build_decoder(cfg, max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"model.embed_tokens.weight": ours.embed, "model.embedding_norm.weight": ours.final_norm.weight}
    for i, layer in enumerate(ours.layers):
        pre, m, f = f"model.layers.{i}.", layer.attn, layer.ffn
        state.update({pre + "operator_norm.weight": layer.attn_norm.weight, pre + "ffn_norm.weight": layer.ffn_norm.weight,
                      pre + "feed_forward.w1.weight": f.w_gate, pre + "feed_forward.w3.weight": f.w_up,
                      pre + "feed_forward.w2.weight": f.w_down})
        if layer.mixer_kind == "short_conv":
            state.update({pre + "conv.in_proj.weight": m.w_in, pre + "conv.in_proj.bias": m.b_in,
                          pre + "conv.conv.weight": m.w_conv[:, None, :], pre + "conv.conv.bias": m.b_conv,
                          pre + "conv.out_proj.weight": m.w_out, pre + "conv.out_proj.bias": m.b_out})
        else:
            state.update({pre + f"self_attn.{n}_proj.weight": getattr(m, f"w{n}") for n in "qkv"})
            state.update({pre + "self_attn.out_proj.weight": m.wo, pre + "self_attn.q_layernorm.weight": m.q_norm.weight,
                          pre + "self_attn.k_layernorm.weight": m.k_norm.weight})
    state["lm_head.weight"] = ours.lm_head
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, state)


def test_reference_decoder_matches_transformers_qwen3_next():
    """The gated DeltaNet (conv + SiLU over q, k, v; the chunked delta rule in one padded chunk of 64; the
    decode step's recurrence from the cached states; gated RMSNorm per head) and gated attention (partial
    RoPE, per-head q/k norms, sigmoid output gate) with a MoE (sigmoid-gated shared expert) and a dense
    layer: same logits as transformers' Qwen3Next with the decoder's weights (its zero-centred RMSNorms
    hold weight - 1; top-k weights not renormalised, as the decoder's router)."""
    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    hf_cfg = transformers.Qwen3NextConfig(
        hidden_size=64, num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=128,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        mlp_only_layers=[1], norm_topk_prob=False, rms_norm_eps=1e-5, pad_token_id=None)
    hf_cfg._attn_implementation = "eager"
    cfg = from_hf_config(hf_cfg.to_dict(), "qwen3_next")
    ours = build_decoder(cfg, max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"model.embed_tokens.weight": ours.embed, "model.norm.weight": ours.final_norm.weight - 1,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        pre, m, f = f"model.layers.{i}.", layer.attn, layer.ffn
        state.update({pre + "input_layernorm.weight": layer.attn_norm.weight - 1,
                      pre + "post_attention_layernorm.weight": layer.ffn_norm.weight - 1})
        if layer.mixer_kind == "gated_deltanet":
            state.update({pre + "linear_attn.in_proj_qkvz.weight": m.w_qkvz, pre + "linear_attn.in_proj_ba.weight": m.w_ba,
                          pre + "linear_attn.conv1d.weight": m.w_conv[:, None, :], pre + "linear_attn.dt_bias": m.dt_bias,
                          pre + "linear_attn.A_log": m.A_log, pre + "linear_attn.norm.weight": m.w_norm,
                          pre + "linear_attn.out_proj.weight": m.w_out})
        else:
            state.update({pre + f"self_attn.{n}_proj.weight": getattr(m, f"w{n}") for n in "qkvo"})
            state.update({pre + "self_attn.q_norm.weight": m.q_norm.weight - 1,
                          pre + "self_attn.k_norm.weight": m.k_norm.weight - 1})
        if i == 1:
            state.update({pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                          pre + "mlp.down_proj.weight": f.w_down})
            continue
        sh = f.shared
        state.update({pre + "mlp.gate.weight": f.w_router, pre + "mlp.experts.gate_up_proj": torch.cat([f.w_gate, f.w_up], 1),
                      pre + "mlp.experts.down_proj": f.w_down, pre + "mlp.shared_expert.gate_proj.weight": sh.w_gate,
                      pre + "mlp.shared_expert.up_proj.weight": sh.w_up, pre + "mlp.shared_expert.down_proj.weight": sh.w_down,
                      pre + "mlp.shared_expert_gate.weight": f.w_shared_gate})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, state)


def test_qwen3_next_80b_params_and_state_worked_by_hand():
    # Qwen3-Next-80B-A3B is Qwen3NextConfig's default: 48 layers, every 4th gated attention (12), the rest
    # gated DeltaNet (36); 512 experts of 512, 10 per token, one shared expert of 512.
    data = transformers.CONFIG_MAPPING["qwen3_next"]().to_dict()
    cfg = from_hf_config(data, "qwen3_next")
    assert param_counts(cfg)["total"] == hf_param_count(data) == 79_674_391_296
    # Per DeltaNet layer and sequence: conv channels 2*16*128 + 32*128 = 8192, * 4 taps = 32,768 elements
    # * 2 (bf16) = 65,536 B; state 32 heads * 128 * 128 = 524,288 elements * 4 (fp32) = 2,097,152 B;
    # 2,162,688 B per layer, * 36 = 77,856,768 B (74.25 MiB) per sequence.
    assert state_bytes_per_sequence(cfg, Precision()) == 36 * (8192 * 4 * 2 + 32 * 128 * 128 * 4) == 77_856_768
    # KV per token: 12 layers * 2 * 2 KV heads * 256 * 2 B = 24,576 B.
    assert kv_bytes_per_token(cfg, Precision()) == 12 * 2 * 2 * 256 * 2 == 24_576


# ---- the rest of the tool on hybrid stacks ----

@pytest.mark.parametrize("model_type", HYBRIDS)
def test_quantized_weights_count_every_mixer_tensor(model_type):
    # Every parameter is stored once: bf16 weights are 2 bytes per parameter, fp32 4, mixers included.
    from lmcost.operators.quant import weight_bytes

    cfg = from_hf_config(default_data(model_type), model_type)
    n = param_counts(cfg)["total"]
    assert weight_bytes(cfg, "bf16")["total"] == 2 * n and weight_bytes(cfg, "fp32")["total"] == 4 * n


def test_breakdown_keeps_the_recurrent_ops():
    # Ivanov et al.'s classes: the SSD matmuls are tensor contractions, conv/gates/state element-wise;
    # none is dropped, so the classes sum to the phase's FLOPs.
    from lmcost.hardware.gpu import load_gpu
    from lmcost.apps.roofline import breakdown

    cfg = load_config("nemotron-h-56b")
    gpu = load_gpu("h100-sxm")
    ops = forward_ops(cfg, phase_dims(cfg, Precision(), "prefill", 1, 512))
    assert breakdown(cfg, gpu, Precision(), "prefill", 1, 512).flops.sum() == sum(op.flops * op.count for op in ops)


@pytest.mark.parametrize("argv, field", [
    (["estimate", "nemotron-h-56b", "--tp", "2"], "--tp"),
    (["train", "nemotron-h-56b"], "model"),
    (["kv", "nemotron-h-56b", "--window", "4096"], "--window"),
])
def test_unmodelled_uses_of_state_layers_are_one_line(argv, field, capsys, monkeypatch):
    import sys

    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith(f"error: {field}: ") and "\n" not in err


@pytest.mark.parametrize("model_type, change, field", [
    ("bamba", dict(mamba_d_head=32), "mamba_d_head"),                           # 128 x 32 != 2 x 4096
    ("granitemoehybrid", dict(position_embedding_type="alibi"), "position_embedding_type"),
    ("qwen3_next", dict(hidden_act="gelu"), "hidden_act"),                      # also the conv's activation
    ("qwen3_next", dict(layer_types=["linear_attention", "sliding_attention"] * 24), "layer_types"),
])
def test_bad_hybrid_configs_are_one_line(model_type, change, field):
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    data.update(change)
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)


def test_hybrid_patterns_longer_than_the_model_or_doubled_are_refused():
    # A recurrent pattern longer than the model was silently cut; an attention pattern beside it was ignored.
    from lmcost.model.loading import load_config

    data = load_config("nemotron-h-56b").model_dump()
    longer = {**data, "recurrent": {**data["recurrent"], "layer_pattern": data["recurrent"]["layer_pattern"] * 2}}
    with pytest.raises(ValueError, match="recurrent: layer_pattern has 236 entries for 118 layers"):
        ArchConfig.model_validate(longer)
    both = {**data, "attention": {**data["attention"], "layer_pattern": ["global"]}}
    with pytest.raises(ValueError, match="attention: layer_pattern is replaced by recurrent.layer_pattern"):
        ArchConfig.model_validate(both)


def test_estimate_names_the_state_beside_the_kv_cache():
    # Nemotron-H-56B: 914,817,024 B of state per sequence (worked above) + 40,960 B of KV per token.
    from lmcost import Workload, estimate, load_config, load_gpu
    est = estimate(load_config("nemotron-h-56b"), load_gpu("h200"), Workload(batch=2, prompt=1000, gen=24)).to_dict()
    kv = est["kv_cache"]
    assert kv["state_bytes_per_sequence"] == 914_817_024 and kv["bytes_per_token"] == 40_960
    assert kv["bytes_total"] == 2 * (914_817_024 + 1024 * 40_960)
