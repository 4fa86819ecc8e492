"""Gemma 4 (gemma4_text, gemma4_unified_text and their wrappers) against transformers: per-layer inputs, KV
sharing across layers, K=V attention and global layers of their own width (lmcost.model.hf.gemma_n,
lmcost.operators.per_layer). The oracles: parameters of the transformers model on the meta device,
FlopCounterMode's matmul FLOPs of tiny instances (prefill and decode), and the bytes of the cache object
transformers fills (its KV-shared layers are DummyLayers holding nothing)."""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from unittest import mock

import pytest

from conftest import hf_param_count
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts
from lmcost.model.config import ArchConfig
from lmcost.model.hf.families import from_hf_config

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from test_flop_oracle import counted_matmul_flops, matmul_flops  # noqa: E402
from test_hybrid import _cache_nbytes  # noqa: E402

#: 6 tiny layers: sliding, sliding, full, sliding, sliding, full (every 3rd full), so that 2 KV-shared layers
#: (a sliding and a full one) each have a producer of their type among the first 4.
TINY = dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96, vocab_size=128, sliding_window=8, pad_token_id=None, global_head_dim=32,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)
#: The mechanisms, one by one and together: (model type, overrides of TINY).
VARIANTS = {
    "plain": ("gemma4_text", {}),
    "ple": ("gemma4_text", dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=112)),
    # with PLE: transformers 5.24's Gemma4TextModel._maybe_slice_kv_shared_inputs fails on KV sharing without it
    "kv_shared": ("gemma4_text", dict(num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                                      vocab_size_per_layer_input=112)),
    "k_eq_v": ("gemma4_text", dict(attention_k_eq_v=True, num_global_key_value_heads=1)),
    "all": ("gemma4_text", dict(hidden_size_per_layer_input=8, vocab_size_per_layer_input=112, num_kv_shared_layers=2,
                                use_double_wide_mlp=True, attention_k_eq_v=True, num_global_key_value_heads=1)),
    # Gemma 4's MoE beside the MLP (26B-A4B's layout): 2 of 4 experts of 32; then with double-wide shared layers
    "moe": ("gemma4_text", dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32)),
    "moe_shared": ("gemma4_text", dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32,
                                       num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8,
                                       vocab_size_per_layer_input=112)),
    "unified": ("gemma4_unified_text", dict(num_kv_shared_layers=2, use_double_wide_mlp=True, attention_k_eq_v=True)),
    # Gemma 3n: AltUp over 3 copies, LAuReL of rank 8, PLE, 2 KV-shared layers, Gaussian top-k on 2 layers' MLPs
    "gemma3n": ("gemma3n_text", dict(altup_num_inputs=3, laurel_rank=8, hidden_size_per_layer_input=8,
                                     vocab_size_per_layer_input=112, num_kv_shared_layers=2,
                                     activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0])),
    "gemma3n_unshared": ("gemma3n_text", dict(laurel_rank=8, hidden_size_per_layer_input=8,
                                              vocab_size_per_layer_input=112, num_kv_shared_layers=0,
                                              altup_correct_scale=False)),
}


@contextlib.contextmanager
def without_timm_tower():
    """Gemma3nModel builds its MobileNet vision tower through timm (AutoModel.from_config of its gemma3n_vision
    config), which this environment may lack: while this is active and timm is missing, that tower is an empty
    module. lmcost counts neither tower, so the decoder and lm_head (what the tests compare) are built as
    transformers builds them."""
    from transformers.models.gemma3n import modeling_gemma3n

    real = modeling_gemma3n.AutoModel.from_config

    def build(config, *args, **kwargs):
        if config.model_type == "gemma3n_vision" and importlib.util.find_spec("timm") is None:
            return torch.nn.Module()
        return real(config, *args, **kwargs)

    with mock.patch.object(modeling_gemma3n.AutoModel, "from_config", side_effect=build):
        yield


def tiny(name: str):
    """A tiny transformers model of a variant (eager attention) and lmcost's config of it."""
    model_type, over = VARIANTS[name]
    kw = {**TINY, **over}
    if model_type == "gemma3n_text":
        kw.pop("global_head_dim")  # Gemma 4's only
    if model_type == "gemma4_text":
        kw.setdefault("hidden_size_per_layer_input", 0)  # PLE only where the variant asks
    cfg = transformers.CONFIG_MAPPING[model_type](**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"  # a loop of F.linear per expert: counted by FlopCounterMode
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    return model, from_hf_config(cfg.to_dict(), model_type)


@pytest.mark.parametrize("name", VARIANTS)
def test_params_equal_transformers(name):
    model, cfg = tiny(name)
    assert param_counts(cfg)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("b, s", [(2, 5), (1, 13)])
def test_matmul_flops_and_cache_bytes_equal_transformers(name, b, s):
    model, cfg = tiny(name)
    ids = torch.randint(0, 100, (b, s))
    with FlopCounterMode(display=False) as prefill, torch.no_grad():
        out = model(ids, use_cache=True)
    assert matmul_flops(cfg, "prefill", b, s) == counted_matmul_flops(prefill)
    cache = out.past_key_values
    assert _cache_nbytes(cache) == _as_transformers_holds(cfg, b, s)
    with FlopCounterMode(display=False) as decode, torch.no_grad():
        model(ids[:, :1], past_key_values=cache, use_cache=True)
    assert matmul_flops(cfg, "decode", b, s + 1) == counted_matmul_flops(decode)
    assert _cache_nbytes(cache) == _as_transformers_holds(cfg, b, s + 1)


def _as_transformers_holds(cfg, b, t):
    """lmcost's KV bytes (fp32) less what transformers' cache does not hold: past the window (t >= w = 8),
    DynamicSlidingWindowLayer keeps w - 1 tokens, lmcost's rolling buffer min(t, w) (tests/test_kv.py): one
    token of K and V (2 heads x 16, 4 bytes) per sliding layer that keeps a cache (the unshared ones)."""
    own_sliding = sum(m == "local" for m, _ in cfg.layer_kinds())
    fewer = own_sliding * b * 2 * 2 * 16 * 4 if t >= 8 else 0
    return kv_bytes(cfg, Precision(weights="fp32", activations="fp32", kv_cache="fp32"), b, t) - fewer


def test_kv_sharing_shows_in_the_cache():
    # Layers [sliding, sliding, full, sliding, sliding, full]; with 2 shared, the last sliding and full layer keep
    # nothing. At b=1, t=5 (under the window) in fp32, K and V of a sliding layer are 2 * 5 * 4 * (2 heads x 16)
    # bytes and of a full one 2 * 5 * 4 * (2 x 32): 4 + 2 such layers unshared, 3 + 1 shared.
    fp32 = Precision(weights="fp32", activations="fp32", kv_cache="fp32")
    _, plain = tiny("plain")
    model, shared = tiny("kv_shared")
    assert kv_bytes(plain, fp32, 1, 5) == 2 * 5 * 4 * (4 * 2 * 16 + 2 * 2 * 32)
    assert kv_bytes(shared, fp32, 1, 5) == 2 * 5 * 4 * (3 * 2 * 16 + 1 * 2 * 32)
    with torch.no_grad():
        out = model(torch.randint(0, 100, (1, 5)), use_cache=True)
    assert _cache_nbytes(out.past_key_values) == kv_bytes(shared, fp32, 1, 5)
    assert sum(type(layer).__name__ == "DummyLayer" for layer in out.past_key_values.layers) == 2


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4_unified_text"])
def test_default_configs_and_their_variants_match_transformers(model_type):
    # The config classes' defaults (30 layers, every 6th full with head_dim 512) and, on them, KV sharing with
    # double-wide MLPs, K=V with one global K/V head, global widths given the published way
    # (global_head_dim, num_global_key_value_heads) rather than transformers' per_layer_config, and (gemma4_text)
    # the MoE beside every MLP.
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    assert param_counts(from_hf_config(data, model_type))["total"] == hf_param_count(data)
    base = {k: v for k, v in data.items() if k != "per_layer_config"}
    for over in (dict(num_kv_shared_layers=10, use_double_wide_mlp=True),
                 dict(attention_k_eq_v=True, num_global_key_value_heads=1, global_head_dim=384),
                 *([dict(enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=512)]
                   if model_type == "gemma4_text" else [])):
        d = {**base, **over}
        assert param_counts(from_hf_config(d, model_type))["total"] == hf_param_count(d)


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_unified", "gemma3n"])
@pytest.mark.parametrize("wrapper_ties, text_ties", [(False, True), (True, False)])
def test_wrappers_tie_by_their_own_key(model_type, wrapper_ties, text_ties):
    # Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration and Gemma3nForConditionalGeneration
    # tie lm_head to the decoder's embedding by the wrapper's tie_word_embeddings, whatever text_config says:
    # the decoder (less the towers and their embedders) on the meta device, against lmcost's count.
    data = transformers.CONFIG_MAPPING[model_type]().to_dict()
    data["tie_word_embeddings"], data["text_config"]["tie_word_embeddings"] = wrapper_ties, text_ties
    cfg = transformers.CONFIG_MAPPING[model_type](**{k: v for k, v in data.items() if k != "model_type"})
    with warnings.catch_warnings(), without_timm_tower(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    towers = ("vision_tower", "audio_tower", "embed_vision", "embed_audio")
    decoder = sum(p.numel() for n, p in model.named_parameters() if not any(t in n for t in towers))
    assert param_counts(from_hf_config(data, model_type))["total"] == decoder


def test_gemma4_worked_by_hand():
    # gemma4_text's defaults: d 2304, 30 layers (25 sliding of head_dim 256, 5 full of 512), 8 heads, 4 K/V
    # heads, GeGLU 9216, vocabulary 262144 tied, PLE 256 per layer from a 262144-row table.
    # Sliding layer: q, o 2*2304*2048, k, v 2*2304*1024, MLP 3*2304*9216, 4 norms 4*2304, q/k norms 2*256,
    # PLE gate/proj 2*2304*256 and its norm 2304. Full layer: q, o 2*2304*4096, k, v 2*2304*2048, q/k 2*512.
    # Model: embedding 262144*2304, PLE table 262144*30*256, projection 2304*30*256, its norm 256, final norm.
    common = 3 * 2304 * 9216 + 4 * 2304 + 2 * 2304 * 256 + 2304
    sliding = 2 * 2304 * 2048 + 2 * 2304 * 1024 + 2 * 256 + common
    full = 2 * 2304 * 4096 + 2 * 2304 * 2048 + 2 * 512 + common
    model = 262144 * 2304 + 262144 * 30 * 256 + 2304 * 30 * 256 + 256 + 2304
    cfg = from_hf_config(transformers.CONFIG_MAPPING["gemma4_text"]().to_dict(), "gemma4_text")
    assert param_counts(cfg)["total"] == 25 * sliding + 5 * full + model


def test_refusals_name_the_key():
    data = {**TINY, "model_type": "gemma4_text"}
    with pytest.raises(LmcostError, match="num_experts: missing with enable_moe_block"):
        from_hf_config({**data, "enable_moe_block": True}, "x")
    with pytest.raises(LmcostError, match="use_bidirectional_attention"):
        from_hf_config({**data, "use_bidirectional_attention": "all"}, "x")
    with pytest.raises(LmcostError, match="num_kv_shared_layers"):
        from_hf_config({**data, "num_kv_shared_layers": 6}, "x")
    # a shared full layer with no full layer before the shared ones to read from (transformers refuses it too)
    with pytest.raises(LmcostError, match="kv_shared_layers"):
        from_hf_config({**data, "num_kv_shared_layers": 4}, "x")


def test_yaml_schema_expresses_the_mechanisms():
    # An lmcost YAML (dict) with every field: a KV-shared layer costs no k/v projections, a K=V global
    # layer no v_proj; each shows in the ops by name.
    cfg = ArchConfig.model_validate(dict(
        name="g", d_model=64, n_layers=4, vocab_size=128, tie_embeddings=True, block="sandwich",
        attention=dict(n_heads=4, n_kv_heads=2, head_dim=16, qk_norm="head", sliding_window=8,
                       layer_pattern=["local", "global"], kv_shared_layers=2, k_eq_v="global", v_norm=True,
                       global_head_dim=32, global_n_kv_heads=1),
        ffn=dict(activation="geglu", d_ff=96, kv_shared_double=True),
        per_layer_input=dict(width=8, vocab=96)))
    assert [m for m, _ in cfg.layer_kinds()] == ["local", "global", "local_shared", "global_shared"]
    from lmcost.operators.forward import Dims, forward_ops
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1))
    roles = {(op.group, op.role) for op in ops}
    assert ("layers.global", "attn.k_proj") in roles and ("layers.global", "attn.v_proj") not in roles
    assert ("layers.local", "attn.v_proj") in roles
    assert not {("layers.local_shared", r) for r in ("attn.k_proj", "attn.v_proj", "attn.k_norm")} & roles
    # the shared global layer's FFN is 2*96 wide and its query 4 heads of 32
    up = [op for op in ops if op.group == "layers.global_shared" and op.role in ("ffn.up", "attn.q_proj")]
    assert sorted(op.params for op in up) == [64 * 4 * 32, 64 * 2 * 96]


def test_truncation_keeps_the_shared_tail_and_profile_refuses():
    # 6 layers, the last 2 shared: the first 5 keep 1 shared (layer 4), the first 4 none (a profile's --layers).
    from lmcost.model.config import truncate
    from lmcost.profiling.profile import check_runnable

    _, cfg = tiny("all")
    assert [truncate(cfg, n).attention.kv_shared_layers for n in (6, 5, 4, 1)] == [2, 1, 0, 0]
    assert [m for m, _ in truncate(cfg, 5).layer_kinds()][-1] == "local_shared"
    with pytest.raises(LmcostError, match="KV sharing across layers, K=V attention, value norms, global layers of "
                                          "their own width, per-layer inputs"):
        check_runnable(cfg)


def test_parameter_table_names_shared_layers():
    # Gemma 3n's default: sliding and global layers, and their KV-sharing copies at the end of the stack; the
    # table names all four groups by what they are, not by the internal kinds (local_shared...).
    from lmcost.operators.forward import group_label

    cfg = from_hf_config(transformers.CONFIG_MAPPING["gemma3n_text"]().to_dict(), "gemma3n_text")
    assert [group_label(cfg, g) for g in param_counts(cfg)["per_block"]] == [
        "attention (sliding window) + MLP", "attention (global) + MLP",
        "attention (sliding window, K/V shared) + MLP", "attention (global, K/V shared) + MLP"]
