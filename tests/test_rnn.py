"""Recurrent (RNN-style) families (lmcost.model.hf.rnn, lmcost.operators.rnn): RecurrentGemma's RG-LRU blocks,
RWKV-4's time and channel mixing, xLSTM 7B's mLSTM blocks.

Oracles: transformers. Parameters of the default config on the meta device; matmul FLOPs of tiny instances
under FlopCounterMode (the whole model in tests/test_flop_oracle.py; here other batches and lengths, and the
conv); the bytes of the cache transformers fills in a prefill and a decode step (the DynamicCache's keys
and values, and the conv and RG-LRU states the recurrent blocks hold), at several batches and contexts.
"""

from __future__ import annotations

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
from lmcost.model.hf.rnn import FAMILIES
from lmcost.operators.forward import forward_ops

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_flop_oracle import assert_prefill_and_decode_exact, tiny_model  # noqa: E402
from test_hybrid import _conv_flops, check_cache_bytes  # noqa: E402

RNNS = sorted(FAMILIES)


def default_data(model_type: str) -> dict:
    return transformers.CONFIG_MAPPING[model_type]().to_dict()


@pytest.mark.parametrize("model_type", RNNS)
def test_params_of_default_config_are_exact(model_type):
    data = default_data(model_type)
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


def test_recurrent_gemma_2b_params_and_state_worked_by_hand():
    # RecurrentGemmaConfig's defaults (recurrentgemma-2b): 26 layers of (recurrent, recurrent, attention),
    # so 18 RG-LRU blocks and 8 local attention layers; d = lru_width = 2560, 10 heads of 256, MHA.
    data = default_data("recurrent_gemma")
    cfg = from_hf_config(data, "recurrent_gemma")
    # Per RG-LRU block: linear_y, linear_x 2 * (2560*2560 + 2560) = 13,112,320; linear_out 2560*2560 + 2560 =
    # 6,556,160; conv 2560*4 + 2560 = 12,800; gates 2 * (10 * 256 * 256 + 2560) = 1,315,840; Λ 2560:
    # 20,999,680. Attention: q, k, v 3 * 2560*2560 + o 2560*2560 + 2560 = 26,216,960.
    # MLP (width 7680 // 2 = 3840, biased): 2 * (2560*3840 + 3840) + 3840*2560 + 2560 = 29,501,440;
    # 2 norms 5,120. Embedding 256000*2560 = 655,360,000 (tied), final norm 2560.
    rec = 2 * (2560 * 2560 + 2560) + (2560 * 2560 + 2560) + (2560 * 4 + 2560) + 2 * (10 * 256 * 256 + 2560) + 2560
    att = 4 * 2560 * 2560 + 2560
    per = 29_501_440 + 5_120
    assert rec == 20_999_680 and att == 26_216_960
    total = 18 * (rec + per) + 8 * (att + per) + 655_360_000 + 2560
    assert param_counts(cfg)["total"] == hf_param_count(data) == total == 2_010_263_040
    # State per RG-LRU block and sequence: conv 2560 * (4 - 1) = 7,680 elements * 2 (bf16) = 15,360 B; the
    # RG-LRU state 2560 * 4 (fp32) = 10,240 B; 25,600 B * 18 blocks = 460,800 B per sequence.
    assert state_bytes_per_sequence(cfg, Precision()) == 18 * (2560 * 3 * 2 + 2560 * 4) == 460_800
    # KV per token (below the 2048 window): 8 layers * 2 * 10 heads * 256 * 2 B = 81,920 B.
    assert kv_bytes_per_token(cfg, Precision()) == 8 * 2 * 10 * 256 * 2 == 81_920
    assert kv_bytes(cfg, Precision(), 2, 1000) == 2 * (460_800 + 1000 * 81_920)


def test_rwkv_params_and_state_worked_by_hand():
    # RwkvConfig's defaults (RWKV-4 7B: d 4096, 32 layers, d_ff 4 * 4096 = 16384, vocabulary 50277, untied).
    data = default_data("rwkv")
    cfg = from_hf_config(data, "rwkv")
    # Per layer: ln1, ln2 4*4096 = 16,384; time mixing: time_decay, time_first 8,192, three mixes 12,288,
    # key/value/receptance/output 4 * 4096² = 67,108,864; channel mixing: two mixes 8,192, key and value
    # 2 * 4096*16384 = 134,217,728, receptance 4096² = 16,777,216: 218,148,864. Embeddings and head
    # 2 * 50277*4096 = 411,869,184; pre_ln and ln_out (LayerNorms with bias) 2 * 8,192.
    per = 16_384 + 8_192 + 12_288 + 4 * 4096 ** 2 + 8_192 + 2 * 4096 * 16384 + 4096 ** 2
    assert per == 218_148_864
    assert param_counts(cfg)["total"] == hf_param_count(data) == 32 * per + 411_869_184 + 2 * 8_192 == 7_392_649_216
    # State per layer and sequence (RwkvModel's five [b, 4096, 32] tensors): x_prev of the time and channel
    # mixing 2 * 4096 * 2 (bf16) = 16,384 B; WKV numerator, denominator, max 3 * 4096 * 4 (fp32) = 49,152 B;
    # 65,536 B * 32 layers = 2 MiB per sequence, whatever the context; no KV cache.
    assert state_bytes_per_sequence(cfg, Precision()) == 32 * (2 * 4096 * 2 + 3 * 4096 * 4) == 2_097_152
    assert kv_bytes_per_token(cfg, Precision()) == 0
    assert kv_bytes(cfg, Precision(), 3, 5000) == 3 * 2_097_152


def test_xlstm_7b_params_and_state_worked_by_hand():
    # xLSTMConfig's defaults (xLSTM 7B): d 4096, 32 mLSTM blocks of 8 heads, q/k 4096 * 0.5 = 2048 wide,
    # v 4096; FFN round_up(4096 * 2.667 = 10924.03, 64) = 10944; vocabulary 50304, untied.
    data = default_data("xlstm")
    cfg = from_hf_config(data, "xlstm")
    # Per block: 2 RMSNorms 8,192; q, k, v, o-gate 4096 * (2*2048 + 2*4096) = 50,331,648; i/f gates 4096*16 + 16
    # = 65,552; head LayerNorm 4,096; out_proj 4096*4096 = 16,777,216; SwiGLU 3 * 4096*10944 = 134,479,872:
    # 201,666,576. Embeddings and lm_head 2 * 50304*4096 = 412,090,368; out_norm 4,096.
    per = 8_192 + 4096 * (2 * 2048 + 2 * 4096) + 4096 * 16 + 16 + 4_096 + 4096 * 4096 + 3 * 4096 * 10944
    assert per == 201_666_576
    assert param_counts(cfg)["total"] == hf_param_count(data) == 32 * per + 412_090_368 + 4_096 == 6_865_424_896
    # State per block and sequence (xLSTMCache, model dtype): 8 heads x (C 256 x 512 + n 256 + m 1)
    # = 1,050,632 elements * 2 B (bf16) = 2,101,264 B; x 32 blocks = 67,240,448 B per sequence; no KV cache.
    assert state_bytes_per_sequence(cfg, Precision()) == 32 * 8 * (256 * 512 + 256 + 1) * 2 == 67_240_448
    assert kv_bytes_per_token(cfg, Precision()) == 0


@pytest.mark.parametrize("model_type", RNNS)
@pytest.mark.parametrize("dtype, name", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
@pytest.mark.parametrize("b, s", [(1, 2), (3, 12), (2, 21)])
def test_state_and_kv_bytes_equal_transformers_cache(model_type, dtype, name, b, s):
    check_cache_bytes(model_type, dtype, name, b, s)


@pytest.mark.parametrize("model_type", RNNS)
@pytest.mark.parametrize("b, s", [(1, 5), (3, 17)])
def test_matmul_flops_at_other_lengths_and_conv_flops(model_type, b, s):
    model, cfg = tiny_model(model_type)
    prefill, decode = assert_prefill_and_decode_exact(model, cfg, b, s)
    # The RG-LRU block's conv: lmcost counts 2*K FLOPs (+1 bias) per output of the s new positions over
    # C = lru_width channels. transformers' nn.Conv1d pads K - 1 zeros on both sides (then keeps s outputs):
    # FlopCounterMode sees 2*K*C*b*(s + K - 1) in prefill; a decode step sums state * weight elementwise
    # (RecurrentGemmaRecurrentBlock): no convolution.
    # RWKV's token shift is a pad and a mix (RwkvSelfAttention.time_shift): no convolution either.
    g = cfg.recurrent.rg_lru
    if g is None:
        assert _conv_flops(prefill) == _conv_flops(decode) == 0
        return
    K, C = g.d_conv, g.width
    n = sum(1 for k, _ in cfg.layer_kinds() if k == "rg_lru")
    conv = [op for op in forward_ops(cfg, phase_dims(cfg, Precision(), "prefill", b, s)) if op.role == "mixer.conv"]
    assert sum(op.flops * op.count for op in conv) == (2 * K + 1) * C * b * s * n
    assert _conv_flops(prefill) == 2 * K * C * b * (s + K - 1) * n
    assert _conv_flops(decode) == 0


def test_yaml_schema_example():
    text = """
name: tiny-griffin
d_model: 64
n_layers: 3
vocab_size: 128
attention: {n_heads: 4, n_kv_heads: 1, sliding_window: 32, out_bias: true}
ffn: {activation: geglu, d_ff: 96, bias: true}
recurrent:
  rg_lru: {width: 48, n_blocks: 4, d_conv: 4}
  layer_pattern: [rg_lru, rg_lru, local]
tie_embeddings: true
"""
    cfg = ArchConfig.model_validate(yaml.safe_load(text))
    assert cfg.layer_kinds() == [("rg_lru", "dense"), ("rg_lru", "dense"), ("local", "dense")]
    # Params: embedding 128*64 = 8,192 (tied) + final norm 64; per layer 2 norms 128 and the MLP 2*(64*96 + 96)
    # + 96*64 + 64 = 18,688; RG-LRU block: linear_y, linear_x 2*(64*48 + 48) = 6,240, linear_out 48*64 + 64
    # = 3,136, conv 48*4 + 48 = 240, gates 2*(4*12*12 + 48) = 1,248, Λ 48: 10,912; attention: q 64*64,
    # k, v 2*64*16, o 64*64 + 64 = 10,304.
    assert param_counts(cfg)["total"] == 8_192 + 64 + 3 * (128 + 18_688) + 2 * 10_912 + 10_304


@pytest.mark.parametrize("change, field", [
    (dict(rg_lru=dict(width=48, n_blocks=5)), "recurrent.rg_lru.n_blocks"),    # 5 does not divide 48
    (dict(rg_lru=None), "recurrent.rg_lru"),                                     # rg_lru layers, no widths
])
def test_bad_rg_lru_sections_are_one_line(change, field):
    from lmcost.model.loading import config_from_dict

    data = dict(name="g", d_model=64, n_layers=2, vocab_size=128, attention=dict(n_heads=4),
                ffn=dict(activation="geglu", d_ff=96),
                recurrent=dict(layer_pattern=["rg_lru", "global"], rg_lru=dict(width=48, n_blocks=4)))
    data["recurrent"].update(change)
    with pytest.raises(LmcostError) as e:
        config_from_dict(data, "m.yaml")
    assert e.value.field == f"m.yaml: {field}" and "\n" not in str(e.value)


@pytest.mark.parametrize("change, field", [
    (dict(block_types=["recurrent", "mlp"]), "block_types"),
    (dict(head_dim=128), "head_dim"),                              # the config class overwrites it: 2560 // 10
    (dict(hidden_activation="silu"), "hidden_activation"),         # the recurrent block's y branch is a GeLU
    (dict(lru_state_dtype="float16"), "lru_state_dtype"),          # a key no mapping reads
])
def test_bad_recurrent_gemma_configs_are_one_line(change, field):
    bad_config_is_one_line("recurrent_gemma", change, field)


@pytest.mark.parametrize("change, field", [
    (dict(attention_hidden_size=2048), "attention_hidden_size"),   # transformers' state is hidden_size wide
    (dict(rescale_every="6"), "rescale_every"),
    (dict(time_mix_extra=1), "time_mix_extra"),                    # a key no mapping reads
])
def test_bad_rwkv_configs_are_one_line(change, field):
    bad_config_is_one_line("rwkv", change, field)


@pytest.mark.parametrize("change, field", [
    (dict(use_bias=True), "use_bias"),                              # RMSNorms with a bias
    (dict(qk_dim_factor=0.3), "qk_dim_factor"),                     # 1228: not a multiple of 64
    (dict(mode="train"), "mode"),
    (dict(num_blocks=16), "num_blocks"),
    (dict(max_inference_chunksize=100), "max_inference_chunksize"),  # not a multiple of chunk_size 64
])
def test_bad_xlstm_configs_are_one_line(change, field):
    bad_config_is_one_line("xlstm", change, field)


def bad_config_is_one_line(model_type, change, field):
    data = default_data(model_type)
    data.update(change)
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, "c.json")
    assert e.value.field == f"c.json: {field}" and "\n" not in str(e.value)


def test_reference_decoder_matches_transformers_recurrent_gemma():
    """The RG-LRU block (GeLU y branch, biased conv from its K - 1 cached inputs, block-diagonal gates, the
    reset at position 0, the fp32 recurrence from the cached state) and local MQA with partial RoPE and a
    biased o_proj, with biased GeGLU MLPs and soft-capped logits: the decoder's weights loaded into
    transformers' RecurrentGemma give the same logits (its RMSNorms hold weight - 1; its embeddings are
    scaled by sqrt(64) = 8, so they hold the decoder's / 8, with an untied lm_head)."""
    hf_cfg = transformers.RecurrentGemmaConfig(
        hidden_size=64, num_hidden_layers=3, block_types=["recurrent", "attention"], num_attention_heads=4,
        num_key_value_heads=1, intermediate_size=192, vocab_size=128, lru_width=48, attention_window_size=4,
        rms_norm_eps=1e-5, pad_token_id=None, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    hf_cfg._attn_implementation = "eager"

    def weights(ours):
        state = {"model.embed_tokens.weight": ours.embed / 8, "model.final_norm.weight": ours.final_norm.weight - 1,
                 "lm_head.weight": ours.lm_head}
        for i, layer in enumerate(ours.layers):
            pre, m, f = f"model.layers.{i}.", layer.attn, layer.ffn
            t = pre + "temporal_block."
            state.update({pre + "temporal_pre_norm.weight": layer.attn_norm.weight - 1,
                          pre + "channel_pre_norm.weight": layer.ffn_norm.weight - 1,
                          pre + "mlp_block.gate_proj.weight": f.w_gate, pre + "mlp_block.gate_proj.bias": f.b_gate,
                          pre + "mlp_block.up_proj.weight": f.w_up, pre + "mlp_block.up_proj.bias": f.b_up,
                          pre + "mlp_block.down_proj.weight": f.w_down, pre + "mlp_block.down_proj.bias": f.b_down})
            if layer.mixer_kind == "rg_lru":
                state.update({t + "linear_y.weight": m.w_y, t + "linear_y.bias": m.b_y, t + "linear_x.weight": m.w_x,
                              t + "linear_x.bias": m.b_x, t + "linear_out.weight": m.w_out, t + "linear_out.bias": m.b_out,
                              t + "conv_1d.weight": m.w_conv[:, None, :], t + "conv_1d.bias": m.b_conv,
                              t + "rg_lru.recurrent_param": m.lam, t + "rg_lru.input_gate_weight": m.w_i,
                              t + "rg_lru.input_gate_bias": m.b_i, t + "rg_lru.recurrent_gate_weight": m.w_a,
                              t + "rg_lru.recurrent_gate_bias": m.b_a})
            else:
                state.update({t + f"{n}_proj.weight": getattr(m, f"w{n}") for n in "qkvo"})
                state[t + "o_proj.bias"] = m.bo
        return state

    _same_logits_as(hf_cfg, "recurrent_gemma", weights)


def test_reference_decoder_matches_transformers_rwkv():
    """RWKV-4's time mixing (token shift from the cached x, the stable WKV from the cached numerator,
    denominator and max, sigmoid receptance) and channel mixing (token shift, squared ReLU, sigmoid gate),
    LayerNorms with biases and the first block's pre_ln: the decoder's weights loaded into transformers' Rwkv
    give the same logits (rescale_every 0: no halving in inference)."""
    hf_cfg = transformers.RwkvConfig(hidden_size=64, num_hidden_layers=2, intermediate_size=96, vocab_size=128,
                                     rescale_every=0, layer_norm_epsilon=1e-5)

    def weights(ours):
        state = {"rwkv.embeddings.weight": ours.embed, "rwkv.blocks.0.pre_ln.weight": ours.embed_norm.weight,
                 "rwkv.blocks.0.pre_ln.bias": ours.embed_norm.bias, "rwkv.ln_out.weight": ours.final_norm.weight,
                 "rwkv.ln_out.bias": ours.final_norm.bias, "head.weight": ours.lm_head}
        for i, layer in enumerate(ours.layers):
            pre, m, f = f"rwkv.blocks.{i}.", layer.attn, layer.ffn
            a, c = pre + "attention.", pre + "feed_forward."
            state.update({pre + "ln1.weight": layer.attn_norm.weight, pre + "ln1.bias": layer.attn_norm.bias,
                          pre + "ln2.weight": layer.ffn_norm.weight, pre + "ln2.bias": layer.ffn_norm.bias,
                          a + "time_decay": m.decay, a + "time_first": m.first, a + "time_mix_key": m.mu_k.view(1, 1, -1),
                          a + "time_mix_value": m.mu_v.view(1, 1, -1), a + "time_mix_receptance": m.mu_r.view(1, 1, -1),
                          a + "key.weight": m.w_k, a + "value.weight": m.w_v, a + "receptance.weight": m.w_r,
                          a + "output.weight": m.w_o, c + "time_mix_key": f.mu_k.view(1, 1, -1),
                          c + "time_mix_receptance": f.mu_r.view(1, 1, -1), c + "key.weight": f.w_k,
                          c + "value.weight": f.w_v, c + "receptance.weight": f.w_r})
        return state

    _same_logits_as(hf_cfg, "rwkv", weights)


def test_reference_decoder_matches_transformers_xlstm():
    """xLSTM's mLSTM (soft-capped gates, two chunks of 4 in the chunkwise form then a step, or a decode step
    from the cached C, n, m; the head LayerNorm and sigmoid output gate) with SwiGLU FFNs and soft-capped
    logits: the decoder's weights loaded into transformers' xLSTM give the same logits."""
    hf_cfg = transformers.xLSTMConfig(hidden_size=128, num_hidden_layers=2, num_heads=4, vocab_size=128,
                                      chunk_size=4, norm_eps=1e-5, pad_token_id=None)

    def weights(ours):
        state = {"backbone.embeddings.weight": ours.embed, "backbone.out_norm.weight": ours.final_norm.weight,
                 "lm_head.weight": ours.lm_head}
        for i, layer in enumerate(ours.layers):
            pre, m, f = f"backbone.blocks.{i}.", layer.attn, layer.ffn
            x = pre + "mlstm_layer."
            q, k, v, o = m.w_qkvo.split([m.qk, m.qk, m.v, m.v])
            state.update({pre + "norm_mlstm.weight": layer.attn_norm.weight, pre + "norm_ffn.weight": layer.ffn_norm.weight,
                          x + "q.weight": q, x + "k.weight": k, x + "v.weight": v, x + "ogate_preact.weight": o,
                          x + "igate_preact.weight": m.w_if[:m.h], x + "igate_preact.bias": m.b_if[:m.h],
                          x + "fgate_preact.weight": m.w_if[m.h:], x + "fgate_preact.bias": m.b_if[m.h:],
                          x + "multihead_norm.weight": m.w_norm, x + "out_proj.weight": m.w_out,
                          pre + "ffn.proj_up_gate.weight": f.w_gate, pre + "ffn.proj_up.weight": f.w_up,
                          pre + "ffn.proj_down.weight": f.w_down})
        return state

    _same_logits_as(hf_cfg, "xlstm", weights)


def _same_logits_as(hf_cfg, model_type: str, weights) -> None:
    """The reference decoder of lmcost's config of ``hf_cfg`` and transformers' model of it, loaded with the
    decoder's weights (``weights(decoder)``: every transformers parameter by name), give the same logits in a
    prefill and in prefill + a decode step (tests/test_decoder.py's _same_logits)."""
    import warnings

    from test_decoder import _same_logits

    from lmcost.profiling.decoder import build_decoder

    ours = build_decoder(from_hf_config(hf_cfg.to_dict(), model_type), max_batch=2, max_context=16)
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same_logits(hf, ours, weights(ours))
