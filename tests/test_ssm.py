"""State-space families (issue 29): Mamba-1 (mamba, falcon_mamba, jamba's Mamba layers) and Mamba-2 stacks alone.

Oracles: transformers. Parameters of the default configs built on the meta device; matmul FLOPs of tiny
instances under FlopCounterMode at other lengths and batches than tests/test_flop_oracle.py (and the conv's
FLOPs, which show the decode step ran from the cached conv state); the bytes of the cache object transformers
fills in a prefill and a decode step (conv states, SSM states, keys and values), exactly, at several batches
and contexts, in fp32 and bf16.
"""

from __future__ import annotations

import warnings

import pytest
import yaml

from conftest import hf_param_count
from lmcost import param_counts
from lmcost.apps.estimate import phase_dims
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes, kv_bytes_per_token, state_bytes_per_sequence
from lmcost.model.config import ArchConfig
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.ssm import FAMILIES
from lmcost.model.loading import config_from_dict
from lmcost.operators.forward import forward_ops

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_hybrid import _conv_flops, check_cache_bytes, check_matmul_flops  # noqa: E402

SSM_TYPES = sorted(FAMILIES)


@pytest.mark.parametrize("model_type", SSM_TYPES)
def test_params_of_default_config_are_exact(model_type):
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


@pytest.mark.parametrize("model_type", SSM_TYPES)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_state_and_kv_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    # conv states in the model dtype (B_kv); SSM states fp32 whatever it: Mamba-1's scan multiplies its state by
    # exp(dt*A) in fp32 from the first position, Mamba-2's SSD runs in fp32
    check_cache_bytes(model_type, dtype, name, b, s)


def _conv_shape(cfg):
    """(K taps, channels, bias) of the stack's conv: Mamba-1 over x (d_inner); Mamba-2 over x, B, C."""
    r = cfg.recurrent
    if r.mamba is not None:
        return r.mamba.d_conv, r.mamba.d_inner, r.mamba.conv_bias
    m = r.mamba2
    return m.d_conv, m.n_heads * m.head_dim + 2 * m.n_groups * m.d_state, m.conv_bias


@pytest.mark.parametrize("model_type", SSM_TYPES)
@pytest.mark.parametrize("b, s", [(1, 5), (3, 17)])
def test_matmul_flops_at_other_lengths_and_conv_flops(model_type, b, s):
    cfg, prefill, decode = check_matmul_flops(model_type, b, s)
    # lmcost: 2*K (+1 bias) + 4 (SiLU) FLOPs per output of the s new positions. transformers' prefill conv pads
    # K - 1 zeros on both sides: 2*K*C*b*(s + K - 1); a decode step from the cached conv state convolves
    # [state (K), x (1)] unpadded, 2 outputs: 2*K*C*b*2 (from no state it would pad as a prefill: K outputs)
    K, C, bias = _conv_shape(cfg)
    n_conv = sum(1 for k, _ in cfg.layer_kinds() if k in ("mamba", "mamba2"))
    conv = [op for op in forward_ops(cfg, phase_dims(cfg, Precision(), "prefill", b, s)) if op.role == "mixer.conv"]
    assert sum(op.flops * op.count for op in conv) == (2 * K + bias + 4) * C * b * s * n_conv
    assert _conv_flops(prefill) == 2 * K * C * b * (s + K - 1) * n_conv
    assert _conv_flops(decode) == 2 * K * C * b * 2 * n_conv


def test_mamba_130m_params_and_state_worked_by_hand():
    # MambaConfig's defaults: mamba-130m's widths (d 768) with 32 layers (mamba-130m has 24); E = 2 * 768 = 1536, N = 16, R = ceil(768 / 16) = 48, K = 4, vocabulary 50280, tied embeddings.
    cfg = from_hf_config(transformers.CONFIG_MAPPING["mamba"]().to_dict(), "mamba")
    # Per layer: norm 768; in_proj 768 * 3072 = 2,359,296; conv 1536 * 4 + 1536 = 7,680; x_proj 1536 * (48 + 32)
    # = 122,880; dt_proj 48 * 1536 + 1536 = 75,264; A_log 1536 * 16 = 24,576; D 1536; out_proj 1536 * 768
    # = 1,179,648: 3,771,648. Embedding 50280 * 768 = 38,615,040 (tied), final norm 768.
    layer = 768 + 2_359_296 + 7_680 + 122_880 + 75_264 + 24_576 + 1_536 + 1_179_648
    assert layer == 3_771_648
    assert param_counts(cfg)["total"] == 32 * layer + 38_615_040 + 768 == 159_308_544
    # Per layer and sequence: conv state 1536 * 4 = 6,144 elements * 2 (bf16) = 12,288 B; SSM state 1536 * 16
    # = 24,576 elements * 4 (fp32) = 98,304 B; 110,592 B per layer, * 32 = 3,538,944 B, whatever the context.
    assert state_bytes_per_sequence(cfg, Precision()) == 32 * (1536 * 4 * 2 + 1536 * 16 * 4) == 3_538_944
    assert kv_bytes_per_token(cfg, Precision()) == 0
    assert kv_bytes(cfg, Precision(), 3, 100_000) == 3 * 3_538_944
    assert cfg.attention_kind == "none"


def test_jamba_layer_kinds_worked_by_hand():
    # JambaConfig: attention iff i % 8 == 4, MoE iff i % 2 == 1 (16 experts, 2 per token), no positions.
    cfg = from_hf_config(transformers.CONFIG_MAPPING["jamba"]().to_dict(), "jamba")
    kinds = cfg.layer_kinds()
    assert kinds[:8] == [("mamba", "dense"), ("mamba", "moe"), ("mamba", "dense"), ("mamba", "moe"),
                         ("global", "dense"), ("mamba", "moe"), ("mamba", "dense"), ("mamba", "moe")]
    assert sum(k == "global" for k, _ in kinds) == 4 and cfg.positions == "none"
    # KV per token: 4 attention layers * 2 (K, V) * 8 KV heads * 128 * 2 B = 16,384 B. State per sequence:
    # 28 Mamba layers * (8192 * 4 * 2 B conv + 8192 * 16 * 4 B SSM) = 28 * 589,824 = 16,515,072 B.
    assert kv_bytes_per_token(cfg, Precision()) == 4 * 2 * 8 * 128 * 2 == 16_384
    assert state_bytes_per_sequence(cfg, Precision()) == 28 * (8192 * 4 * 2 + 8192 * 16 * 4) == 16_515_072


# ---- the schema ----

def test_yaml_stack_of_mamba_layers_alone():
    # No attention or ffn section: no layer has attention or an FFN.
    text = """
name: tiny-mamba
d_model: 64
n_layers: 2
vocab_size: 128
recurrent:
  mamba: {d_inner: 128, dt_rank: 4, d_state: 16, d_conv: 4, bc_dt_norm: weighted}
  layer_pattern: [mamba]
  ffn_pattern: [none]
positions: none
"""
    cfg = ArchConfig.model_validate(yaml.safe_load(text))
    assert cfg.layer_kinds() == [("mamba", "none")] * 2
    # Params: embed 128*64 + lm_head 64*128 + final norm 64 = 16,448; per layer: norm 64, in_proj 64*256
    # = 16,384, conv 128*4 + 128 = 640, x_proj 128*(4 + 32) = 4,608, dt/B/C norms 4 + 32 = 36, dt_proj
    # 4*128 + 128 = 640, A_log 128*16 = 2,048, D 128, out_proj 128*64 = 8,192: 32,740.
    assert param_counts(cfg)["total"] == 16_448 + 2 * 32_740
    # A round trip keeps it (truncate, catalog show dump and reload the config)
    assert ArchConfig.model_validate(cfg.model_dump()) == cfg


@pytest.mark.parametrize("change, field", [
    (dict(ffn_pattern=None), "ffn"),                                  # dense layers, no ffn section
    (dict(layer_pattern=["mamba", "global"]), "attention"),           # attention layers, no attention section
    (dict(mamba=None), "recurrent.mamba"),                            # mamba layers without widths
    (dict(mamba=dict(d_inner=128, dt_rank=4, bc_dt_norm="yes")), "recurrent.mamba.bc_dt_norm"),
])
def test_bad_mamba_stacks_are_one_line(change, field):
    data = dict(name="m", d_model=64, n_layers=2, vocab_size=128,
                recurrent=dict(layer_pattern=["mamba"], ffn_pattern=["none"], mamba=dict(d_inner=128, dt_rank=4)))
    data["recurrent"].update(change)
    with pytest.raises(LmcostError) as e:
        config_from_dict(data, "m.yaml")
    assert e.value.field == f"m.yaml: {field}" and "\n" not in str(e.value)


@pytest.mark.parametrize("model_type, change, field", [
    ("mamba", dict(hidden_act="gelu"), "hidden_act"),                       # the conv's activation
    ("mamba", dict(time_step_rank="half"), "time_step_rank"),
    ("mamba2", dict(num_heads=64), "num_heads"),                            # 64 x 64 != 2 x 4096
    ("jamba", dict(attn_layer_offset=8), "attn_layer_offset"),
    ("falcon_mamba", dict(mamba_layout="x"), "mamba_layout"),               # a key no mapping reads
])
def test_bad_ssm_configs_are_one_line(model_type, change, field):
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    data.update(change)
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)


# ---- the reference decoder's Mamba-1 mixer against transformers' (same weights, same logits) ----

def _mamba_layer_state(pre, m):
    """transformers' MambaMixer / FalconMambaMixer / JambaMambaMixer parameters from the decoder's MambaMixer."""
    state = {pre + "in_proj.weight": m.w_in, pre + "conv1d.weight": m.w_conv[:, None, :], pre + "conv1d.bias": m.b_conv,
             pre + "x_proj.weight": m.w_x, pre + "dt_proj.weight": m.w_dt, pre + "dt_proj.bias": m.b_dt,
             pre + "A_log": m.A_log, pre + "D": m.D, pre + "out_proj.weight": m.w_out}
    if m.w_norm is not None:  # Jamba's weighted RMSNorms of dt, B, C
        R, N = m.R, m.N
        state.update({pre + "dt_layernorm.weight": m.w_norm[:R], pre + "b_layernorm.weight": m.w_norm[R:R + N],
                      pre + "c_layernorm.weight": m.w_norm[R + N:]})
    return state


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
def test_reference_decoder_matches_transformers_mamba(model_type):
    """The Mamba-1 mixer (conv + SiLU, x_proj, Falcon-Mamba's weightless norms of dt, B, C, dt_proj, the
    selective scan from a zero state, the decode step from the cached conv and SSM states, D skip, gate):
    the decoder's weights loaded into transformers' model give the same logits in one prefill and in a
    prefill + one decode step."""
    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    eps = dict(mixer_rms_eps=1e-5) if model_type == "falcon_mamba" else {}  # the decoder's norm epsilon
    hf_cfg = transformers.CONFIG_MAPPING[model_type](
        hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=16, time_step_rank=8, layer_norm_epsilon=1e-5,
        tie_word_embeddings=False, pad_token_id=None, **eps)
    cfg = from_hf_config(hf_cfg.to_dict(), model_type)
    ours = build_decoder(cfg, max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"backbone.embeddings.weight": ours.embed, "backbone.norm_f.weight": ours.final_norm.weight,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        state[f"backbone.layers.{i}.norm.weight"] = layer.attn_norm.weight
        state.update(_mamba_layer_state(f"backbone.layers.{i}.mixer.", layer.attn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, state)


def test_reference_decoder_matches_transformers_jamba():
    """Jamba: Mamba-1 layers with weighted RMSNorms of dt, B, C beside attention without positions, with a
    SwiGLU MLP or a MoE (softmax top-2 of 4, weights not renormalised): same logits as transformers' Jamba
    with the decoder's weights, in one prefill and in prefill + a decode step."""
    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    hf_cfg = transformers.JambaConfig(
        hidden_size=64, num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=2, expert_layer_period=2,
        expert_layer_offset=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96, num_experts=4,
        num_experts_per_tok=2, vocab_size=128, mamba_d_state=16, mamba_dt_rank=8, rms_norm_eps=1e-5,
        pad_token_id=None)
    hf_cfg._attn_implementation = "eager"
    cfg = from_hf_config(hf_cfg.to_dict(), "jamba")
    assert cfg.layer_kinds() == [("mamba", "dense"), ("mamba", "moe"), ("global", "dense"), ("mamba", "moe")]
    ours = build_decoder(cfg, max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    state = {"model.embed_tokens.weight": ours.embed, "model.final_layernorm.weight": ours.final_norm.weight,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        pre, m, f = f"model.layers.{i}.", layer.attn, layer.ffn
        state.update({pre + "input_layernorm.weight": layer.attn_norm.weight,
                      pre + "pre_ff_layernorm.weight": layer.ffn_norm.weight})
        if layer.mixer_kind == "mamba":
            state.update(_mamba_layer_state(pre + "mamba.", m))
        else:
            state.update({pre + f"self_attn.{n}_proj.weight": getattr(m, f"w{n}") for n in "qkvo"})
        if i % 2 == 0:
            state.update({pre + "feed_forward.gate_proj.weight": f.w_gate, pre + "feed_forward.up_proj.weight": f.w_up,
                          pre + "feed_forward.down_proj.weight": f.w_down})
        else:
            state.update({pre + "feed_forward.router.weight": f.w_router,
                          pre + "feed_forward.experts.gate_up_proj": torch.cat([f.w_gate, f.w_up], 1),
                          pre + "feed_forward.experts.down_proj": f.w_down})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, state)


def test_attention_variants_of_a_stack_without_attention_are_refused():
    # Mamba-2 alone has no attention layer: mha/mla variants would print rows identical to the base model.
    from lmcost.model.variants import default_labels, derive

    cfg = from_hf_config(transformers.CONFIG_MAPPING["mamba2"]().to_dict(), "mamba2")
    assert default_labels(cfg) == ["base"]
    with pytest.raises(LmcostError, match="mamba2 has no attention layers"):
        derive(cfg, "mla:512")
