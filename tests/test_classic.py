"""The older decoders of lmcost.model.hf.classic (apertus, apertus1p5_text, bitnet, ctrl, diffllama, granite_swa,
granitemoe_swa, nanochat, persimmon, xglm) against transformers: the KV cache it allocates, the layers it leaves unrotated, the
parameters with the flags the mappings read flipped from their defaults, the keys refused, and the reference
decoder's logits with Apertus's xIELU, Persimmon's per-head LayerNorms, BitNet's sub-layer norms and DiffLlama's differential attention loaded into transformers' models. Their
default configs are checked in tests/test_params.py and their matmul FLOPs (prefill and decode) in
tests/test_flop_oracle.py."""

from __future__ import annotations

import warnings

import pytest

from conftest import hf_decode_cache, hf_param_count
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts
from lmcost.model.hf.families import from_hf_config
from lmcost.model.hf.registry import mapped_in

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BF16 = Precision("bf16", "bf16", "bf16")
SMALL_MOE = dict(num_local_experts=4, num_experts_per_tok=2)


def test_the_file_maps_its_types():
    assert mapped_in("lmcost.model.hf.classic") == ["apertus", "apertus1p5_text", "bitnet", "ctrl", "diffllama",
                                                    "granite_swa",
                                                    "granitemoe_swa", "nanochat", "persimmon", "xglm"]


@pytest.mark.parametrize("model_type, over", [
    ("apertus", dict(num_key_value_heads=2)),
    ("apertus1p5_text", dict()),
    ("bitnet", dict(num_key_value_heads=2)),
    ("diffllama", dict(num_key_value_heads=2)),  # one K and V of all h_kv heads: the halves split V when read
    ("nanochat", dict(num_key_value_heads=2)),
    ("persimmon", dict()),
    # fairseq's and CTRL's own key names, 4 heads of 16
    ("xglm", dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=96, vocab_size=128)),
    ("ctrl", dict(n_embd=64, n_layer=2, n_head=4, dff=96, vocab_size=128)),
])
def test_global_caches_equal_transformers_tensors(model_type, over):
    # K and V [b, h_kv, t, d_h] per layer: 3 sequences at t = 5 + 14 = 19, 2 layers of h_kv heads of 16, bf16.
    tiny = model_type not in ("xglm", "ctrl")
    cfg, layers = hf_decode_cache(model_type, tiny=tiny, **over)
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    h_kv = over.get("num_key_value_heads", 4)
    assert kv_bytes(cfg, BF16, 3, 19) == allocated == 2 * 2 * h_kv * 16 * 2 * 3 * 19


@pytest.mark.parametrize("model_type, over", [
    ("granite_swa", dict()),
    ("granitemoe_swa", dict(**SMALL_MOE)),
])
def test_granite_swa_cache_against_transformers(model_type, over):
    # Layers 0 and 4 full (i % 4 == 0), the others sliding over w = 8; layer 2 without RoPE (theta 0).
    cfg, layers = hf_decode_cache(model_type, num_hidden_layers=5, num_key_value_heads=2, sliding_window=8,
                                  layer_rope_theta=[1e4, 1e4, 0, 1e4, 1e4], **over)
    kinds = ["global", "local", "local_nope", "local", "global"]
    assert [k for k, _ in cfg.layer_kinds()] == kinds
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    # transformers' sliding layers keep w - 1 = 7 tokens between steps, lmcost min(t, w) = 8 (the rolling buffer
    # the next query needs): one token more per sliding layer, K and V x 2 heads x 16 x 2 bytes per sequence.
    assert [layer.keys.shape[2] for layer in layers] == [19 if k == "global" else 7 for k in kinds]
    assert kv_bytes(cfg, BF16, 3, 19) == allocated + 3 * 3 * (2 * 2 * 16 * 2)


def test_granite_swa_nope_layers_are_the_layers_without_rope():
    # GraniteSWAModel passes no position embeddings to a layer whose layer_rope_theta is 0, and builds one rotary
    # embedding per distinct non-zero base.
    thetas = [1e4, 0, 5e5, 0, 1e4, 1e4]
    hf = transformers.GraniteSWAConfig(num_hidden_layers=6, layer_rope_theta=thetas)
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(hf)
    assert len(model.model.rotary_embs) == 2
    cfg = from_hf_config(hf.to_dict(), "granite_swa")
    assert [not k.endswith("_nope") for k, _ in cfg.layer_kinds()] == [bool(t) for t in thetas]
    assert [k.removesuffix("_nope") for k, _ in cfg.layer_kinds()] == ["global", "local", "local", "local",
                                                                        "global", "local"]


@pytest.mark.parametrize("model_type, over", [
    ("apertus", dict(attention_bias=True, num_key_value_heads=8, tie_word_embeddings=True)),
    ("apertus", dict(hidden_act="gelu", head_dim=64)),
    ("apertus1p5_text", dict(output_vocab_size=266752)),  # = vocab_size: transformers' canonical null
    ("granite_swa", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=False, sliding_window=None)),
    ("granite_swa", dict(layer_types=["full_attention"] * 2 + ["sliding_attention"] * 4)),
    ("granitemoe_swa", dict(shared_intermediate_size=1024, attention_bias=True)),
    ("nanochat", dict(attention_bias=True, num_key_value_heads=2, tie_word_embeddings=True)),
    ("bitnet", dict(attention_bias=True, num_key_value_heads=20, tie_word_embeddings=True)),
    ("diffllama", dict(attention_bias=True, num_key_value_heads=8, head_dim=128)),
    ("persimmon", dict(qk_layernorm=False, tie_word_embeddings=True)),
    ("xglm", dict(activation_function="relu", tie_word_embeddings=False, ffn_dim=1000)),
    ("ctrl", dict(tie_word_embeddings=False, dff=1000)),
])
def test_flags_are_exact(model_type, over):
    layers = "num_layers" if model_type == "xglm" else "n_layer" if model_type == "ctrl" else "num_hidden_layers"
    data = transformers.CONFIG_MAPPING[model_type](**{layers: 6, **over}).to_dict()
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)


def test_xielu_has_two_parameters_per_layer():
    # XIELUActivation: alpha_p and alpha_n, [1] each, per MLP (beta and eps are buffers). Apertus with xIELU has
    # 2 * 32 = 64 parameters more than the same model with a parameterless activation, in transformers and here.
    xielu = transformers.ApertusConfig().to_dict()
    relu2 = {**xielu, "hidden_act": "relu2"}
    ours = [param_counts(from_hf_config(d, "apertus"))["total"] for d in (xielu, relu2)]
    assert ours[0] - ours[1] == hf_param_count(xielu) - hf_param_count(relu2) == 2 * 32


def test_sinusoidal_tables_are_no_parameters():
    # CTRL's pos_encoding and XGLM's weights are buffers: n_positions or max_positions change no parameter count
    for mt, key in (("ctrl", "n_positions"), ("xglm", "max_position_embeddings")):
        counts = [param_counts(from_hf_config(transformers.CONFIG_MAPPING[mt](**{key: n}).to_dict(), mt))["total"]
                  for n in (256, 4096)]
        assert counts[0] == counts[1] == hf_param_count(transformers.CONFIG_MAPPING[mt]().to_dict())


@pytest.mark.parametrize("model_type, change, field", [
    ("apertus1p5_text", dict(output_vocab_size=131072), "output_vocab_size"),
    ("apertus", dict(hidden_act="mish"), "hidden_act"),
    ("granite_swa", dict(layer_rope_theta=[1e4] * 3), "layer_rope_theta"),
    ("granite_swa", dict(layer_rope_theta=[-1.0] * 24), "layer_rope_theta"),
    ("granite_swa", dict(layer_types=["chunked_attention"] * 24), "layer_types"),
    ("xglm", dict(activation_function="mish"), "activation_function"),
    ("xglm", dict(add_cross_attention=True), "add_cross_attention"),
    ("persimmon", dict(qk_layernorm="yes"), "qk_layernorm"),
    ("persimmon", dict(head_dim=128), "head_dim"),
    ("bitnet", dict(hidden_act="silu"), "hidden_act"),
    ("bitnet", dict(head_dim=64), "head_dim"),
    ("diffllama", dict(num_key_value_heads=3, num_attention_heads=30), "num_key_value_heads"),
])
def test_what_is_not_modelled_is_one_line(model_type, change, field):
    data = {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **change}
    with pytest.raises(LmcostError) as e:
        from_hf_config(data, model_type)
    assert e.value.field == f"{model_type}: {field}" and "\n" not in str(e.value)


# ---- the reference decoder against transformers (an independent oracle of the new operators) ----

def _same_logits(hf, ours, state: dict) -> None:
    """Load ``state`` (every parameter of ``hf``) into transformers' model; the decoder's logits equal its own in
    one prefill of 9 tokens and in a prefill of 8 then one decode step."""
    assert set(state) == {n for n, _ in hf.named_parameters()}
    hf.load_state_dict({**hf.state_dict(), **state}, strict=True)  # its buffers (xIELU's beta and eps) as they are
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids, 0), expected, rtol=1e-4, atol=1e-4)
        ours.reset_cache()
        ours(ids[:, :8], 0)
        torch.testing.assert_close(ours(ids[:, 8:], 8)[:, -1], expected[:, -1], rtol=1e-4, atol=1e-4)


def _decoder(hf_cfg, model_type):
    from lmcost.profiling.decoder import build_decoder

    hf_cfg._attn_implementation = "eager"
    ours = build_decoder(from_hf_config(hf_cfg.to_dict(), model_type), max_batch=2, max_context=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg).eval()
    return ours, hf


def _llama_state(ours, attn_norm: str, ffn_norm: str) -> dict:
    """The decoder's embedding, final norm, lm_head, q/k/v/o and block norms under transformers' Llama-style names
    (each model's block norms named as given)."""
    state = {"model.embed_tokens.weight": ours.embed, "model.norm.weight": ours.final_norm.weight,
             "lm_head.weight": ours.lm_head}
    for i, layer in enumerate(ours.layers):
        pre = f"model.layers.{i}."
        state.update({pre + f"self_attn.{n}_proj.weight": getattr(layer.attn, f"w{n}") for n in "qkvo"})
        state.update({pre + attn_norm + ".weight": layer.attn_norm.weight, pre + ffn_norm + ".weight": layer.ffn_norm.weight})
    return state


def test_decoder_matches_transformers_apertus():
    """xIELU (its two scalars, loaded into ApertusMLP's act_fn) and per-head q/k RMSNorm, with GQA and RoPE."""
    hf_cfg = transformers.ApertusConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=96, vocab_size=128, pad_token_id=None,
                                        rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    ours, hf = _decoder(hf_cfg, "apertus")
    state = _llama_state(ours, "attention_layernorm", "feedforward_layernorm")
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        state.update({pre + "self_attn.q_norm.weight": a.q_norm.weight, pre + "self_attn.k_norm.weight": a.k_norm.weight,
                      pre + "mlp.up_proj.weight": f.w_up, pre + "mlp.down_proj.weight": f.w_down,
                      pre + "mlp.act_fn.alpha_p": f.act.alpha_p, pre + "mlp.act_fn.alpha_n": f.act.alpha_n})
    with torch.no_grad():  # away from transformers' initial values, so the loaded scalars are the ones used
        for layer in ours.layers:
            layer.ffn.act.alpha_p.add_(0.3)
            layer.ffn.act.alpha_n.sub_(0.2)
    _same_logits(hf, ours, state)


def test_decoder_matches_transformers_persimmon():
    """Fused q/k/v ([heads, (q, k, v), d_h] along the rows) with bias, a LayerNorm with bias on each head of q and
    k, RoPE on half of each head, LayerNorms with bias, a squared-ReLU MLP with biases."""
    hf_cfg = transformers.PersimmonConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          intermediate_size=96, vocab_size=128, layer_norm_eps=1e-5)
    ours, hf = _decoder(hf_cfg, "persimmon")
    state = {"model.embed_tokens.weight": ours.embed, "model.final_layernorm.weight": ours.final_norm.weight,
             "model.final_layernorm.bias": ours.final_norm.bias, "lm_head.weight": ours.lm_head}
    per_head = lambda *m: torch.stack([x.reshape(4, 16, *x.shape[1:]) for x in m], 1).flatten(0, 2)  # noqa: E731
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        state.update({pre + "self_attn.query_key_value.weight": per_head(a.wq, a.wk, a.wv),
                      pre + "self_attn.query_key_value.bias": per_head(a.bq, a.bk, a.bv),
                      pre + "self_attn.dense.weight": a.wo, pre + "self_attn.dense.bias": a.bo,
                      pre + "mlp.dense_h_to_4h.weight": f.w_up, pre + "mlp.dense_h_to_4h.bias": f.b_up,
                      pre + "mlp.dense_4h_to_h.weight": f.w_down, pre + "mlp.dense_4h_to_h.bias": f.b_down})
        for name, mine in (("input_layernorm", layer.attn_norm), ("post_attention_layernorm", layer.ffn_norm),
                           ("self_attn.q_layernorm", a.q_norm), ("self_attn.k_layernorm", a.k_norm)):
            state.update({pre + name + ".weight": mine.weight, pre + name + ".bias": mine.bias})
    _same_logits(hf, ours, state)


def test_decoder_matches_transformers_bitnet():
    """Sub-layer RMSNorms on the attention output and on relu(gate)^2 * up before the down projection, with GQA."""
    hf_cfg = transformers.BitNetConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, intermediate_size=96, vocab_size=128, rms_norm_eps=1e-5,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    ours, hf = _decoder(hf_cfg, "bitnet")
    state = _llama_state(ours, "input_layernorm", "post_attention_layernorm")
    for i, layer in enumerate(ours.layers):
        a, f, pre = layer.attn, layer.ffn, f"model.layers.{i}."
        state.update({pre + "self_attn.attn_sub_norm.weight": a.sub_norm.weight,
                      pre + "mlp.gate_proj.weight": f.w_gate, pre + "mlp.up_proj.weight": f.w_up,
                      pre + "mlp.down_proj.weight": f.w_down, pre + "mlp.ffn_sub_norm.weight": f.sub_norm.weight})
    _same_logits(hf, ours, state)


def test_diffllama_lambdas_are_four_vectors_per_layer():
    # DiffLlamaAttention: lambda_q1, lambda_k1, lambda_q2, lambda_k2 [head_dim]; its groupnorm has no weight. With
    # 16 layers of head_dim 64, 16 * 4 * 64 = 4,096 parameters beyond Llama's.
    data = transformers.DiffLlamaConfig().to_dict()
    llama = {k: v for k, v in {**data, "model_type": "llama"}.items() if k != "lambda_std_dev"}
    assert param_counts(from_hf_config(data, "diffllama"))["total"] - param_counts(from_hf_config(llama, "llama"))[
        "total"] == 16 * 4 * 64 == hf_param_count(data) - hf_param_count(llama)


def test_decoder_matches_transformers_diffllama():
    """Two attention calls over the halves of the value heads, combined per head pair with lambda and a weightless
    RMSNorm; one layer, whose lambda_init (0.2 at layer 0) is the reference's."""
    hf_cfg = transformers.DiffLlamaConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=128,
                                          rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    ours, hf = _decoder(hf_cfg, "diffllama")
    state = _llama_state(ours, "input_layernorm", "post_attention_layernorm")
    a, f = ours.layers[0].attn, ours.layers[0].ffn
    state.update({f"model.layers.0.self_attn.{n}": getattr(a.diff, n) for n in
                  ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
    state.update({f"model.layers.0.mlp.{n}_proj.weight": getattr(f, f"w_{n}") for n in ("gate", "up", "down")})
    _same_logits(hf, ours, state)
