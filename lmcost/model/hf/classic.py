"""Older and smaller decoders, each with one mechanism of its own beside Llama's or GPT's layout.

- ``apertus``, ``apertus1p5_text``: Llama attention with per-head RMSNorm on q and k, a plain MLP whose activation
  is xIELU with two learned scalars per layer (``ffn.activation: xielu``, :mod:`lmcost.operators.xielu`);
- ``granite_swa``, ``granitemoe_swa``: Granite (and GraniteMoE-shared) with sliding and full layers by
  ``layer_types``, a RoPE base per layer (``layer_rope_theta``; 0 is no RoPE on that layer) and a learned sink
  per head (as gpt-oss's, ``attention.sinks``);
- ``xglm``, ``ctrl``: fixed sinusoidal positions added to the embeddings (``positions: sinusoidal``,
  :mod:`lmcost.operators.sinusoidal`), biases everywhere, LayerNorms with bias;
- ``persimmon``: fused q/k/v with bias and a LayerNorm with weight and bias on each head of q and k
  (``attention.qk_norm: head_layernorm``), half-width RoPE, a squared-ReLU MLP with biases;
- ``bitnet``: Llama's layout with a squared-ReLU-gated MLP and sub-layer RMSNorms on the attention output and the
  MLP's inner activation (``sub_norms: true``, :mod:`lmcost.operators.sub_norms`), counted as transformers builds
  it (bf16 linears; the ternary weights of a checkpoint are its quantization_config's business);
- ``diffllama``: Llama with differential attention (``attention.differential``,
  :mod:`lmcost.operators.differential`);
- ``nanochat``: RMSNorms without weights everywhere (``norm_weight: false``), one also on the embeddings, per-head
  weightless RMSNorm of q and k after RoPE, a squared-ReLU MLP, soft-capped logits.

Each function maps the config as transformers 5.24 builds the model (the ``*ForCausalLM`` class of the type),
checked exactly against it: parameters on the meta device and FlopCounterMode matmul FLOPs of a tiny instance,
prefill and decode (tests/test_params.py, tests/test_flop_oracle.py), and the cache bytes
(tests/test_classic.py).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.llama_like import GRANITE_SCALARS, LLAMA_QKV_BIAS, FamilySpec, Softcaps
from lmcost.model.hf.moe import every_layer
from lmcost.model.hf.reader import Reader, _is, activation, mapped_layer_types, rotary_fraction
from lmcost.model.hf.registry import family
from lmcost.model.hf.windows import WINDOW_TYPES, Window


def _apertus_activation(r: Reader) -> str:
    """ApertusMLP's activation: xIELU (the class default) or any plain ACT2FN activation lmcost models."""
    if r.get("hidden_act", "xielu", kind=str) == "xielu":
        return "xielu"
    return activation(r, "hidden_act", "xielu", False)


@family("apertus", "apertus1p5_text")
def apertus(r: Reader, mt: str) -> dict:
    """Apertus (Swiss AI 2025; ApertusConfig/ApertusForCausalLM): Llama attention (attention_bias on q, k, v and
    o) with RMSNorm [d_h] on each head of q and k before RoPE, pre-norm blocks of RMSNorm, a plain MLP up/down
    without bias and xIELU. Apertus 1.5's text decoder (Apertus1p5TextForCausalLM) is the same with a larger
    vocabulary and an lm_head of output_vocab_size rows.
    Raises: LmcostError for an output_vocab_size other than null or vocab_size (a pruned lm_head, which lmcost's
    schema cannot give fewer rows than the embedding)."""
    d, h = r.get("hidden_size", 4096), r.get("num_attention_heads", 32)
    vocab = r.get("vocab_size", 266752 if mt == "apertus1p5_text" else 131072)
    if mt == "apertus1p5_text":
        out_vocab = r.get("output_vocab_size", None, kind=int)
        if out_vocab is not None and out_vocab != vocab:
            raise LmcostError(f"{r.source}: output_vocab_size", f"an lm_head of {out_vocab} rows beside an embedding "
                              f"of {vocab} is not modelled", "set output_vocab_size to null, or write an lmcost YAML")
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 32), vocab_size=vocab,
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", h),
                               head_dim=r.get("head_dim", None, kind=int), qkv_bias=bias, out_bias=bias,
                               qk_norm="head"),
                ffn=dict(activation=_apertus_activation(r), d_ff=r.get("intermediate_size", 14336)),
                norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", False))


def _granite_swa_layers(r: Reader, n_layers: int) -> Window:
    """GraniteSWAConfig's layers: layer_types (absent: layer i full when i % 4 == 0, else sliding), the window
    (sliding_window, 128; null: the sliding layers attend to everything, as GraniteSWAAttention then passes no
    window), and layer_rope_theta (absent: the global base everywhere), whose 0 entries are layers without RoPE
    (``_nope`` kinds; a list longer than the layers is read as far as the layers go, as GraniteSWAModel indexes
    it). Raises: LmcostError for a layer_rope_theta shorter than the layers or with an entry that is not a
    number >= 0."""
    window = r.get("sliding_window", 128, kind=int)
    types = r.get("layer_types", None, kind=list)
    kinds = (mapped_layer_types(r, types, n_layers, WINDOW_TYPES) if types is not None
             else ["global" if i % 4 == 0 else "local" for i in range(n_layers)])
    if not window:
        kinds = ["global"] * n_layers
    thetas = r.get("layer_rope_theta", None, kind=list)
    if thetas is not None:
        if len(thetas) < n_layers or any(not _is(t, float) or t < 0 for t in thetas):
            raise LmcostError(f"{r.source}: layer_rope_theta", f"must be at least {n_layers} numbers >= 0 (one per layer, "
                              "0: no RoPE)", "give one RoPE base per layer, or remove layer_rope_theta")
        kinds = [k if t else f"{k}_nope" for k, t in zip(kinds, thetas[:n_layers])]
    return (window if "local" in {k.removesuffix("_nope") for k in kinds} else None), kinds


_GRANITE_SWA = FamilySpec(model_type="granite_swa", no_cost=GRANITE_SCALARS, window=_granite_swa_layers, tie=True)
_GRANITEMOE_SWA = FamilySpec(model_type="granitemoe_swa", mlp_bias=None, no_cost=GRANITE_SCALARS,
                             window=_granite_swa_layers,
                             moe=every_layer("num_local_experts", "num_experts", 8, 2,
                                             shared_key="shared_intermediate_size"))


@family("granite_swa", "granitemoe_swa")
def granite_swa(r: Reader, mt: str) -> dict:
    """Granite with sliding windows (GraniteSWAForCausalLM, GraniteMoeSWAForCausalLM): Granite's (or
    GraniteMoE-shared's) layout, the layers of :func:`_granite_swa_layers`, and a learned sink logit per head
    (``sinks`` [h], applied by transformers as a post-softmax scale sigmoid(lse - sink), the same extra softmax
    logit as gpt-oss's). Raises: LmcostError as the Granite mappings and :func:`_granite_swa_layers`."""
    out = (_GRANITE_SWA if mt == "granite_swa" else _GRANITEMOE_SWA)(r, mt)
    out["attention"]["sinks"] = True
    return out


def _sinusoidal(r: Reader) -> None:
    """Keys of XGLM's and CTRL's embeddings that cost nothing: the scale sqrt(d) of the token embeddings (one
    multiply per element, uncounted as Granite's multipliers are)."""
    r.get("scale_embedding", True)


@family("xglm")
def xglm(r: Reader, mt: str) -> dict:
    """XGLM (Lin et al. 2022, section 2.1; XGLMConfig/XGLMForCausalLM): fairseq's decoder: token embeddings
    scaled by sqrt(d), a sinusoidal table added (positions offset by 2, a buffer that grows with the input),
    pre-norm blocks of LayerNorms with bias, q/k/v/o with bias, an MLP fc1/fc2 of ffn_dim with bias, a final
    LayerNorm, the lm_head (no bias) tied by default. Raises: LmcostError as the reader does."""
    _sinusoidal(r)
    return dict(d_model=r.get("d_model", 1024), n_layers=r.get("num_layers", 24), vocab_size=r.get("vocab_size", 256008),
                attention=dict(n_heads=r.get("attention_heads", 16), qkv_bias=True, out_bias=True),
                ffn=dict(activation=activation(r, "activation_function", "gelu", False), d_ff=r.get("ffn_dim", 4096),
                         bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="sinusoidal",
                max_positions=r.get("max_position_embeddings", 2048),
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("ctrl")
def ctrl(r: Reader, mt: str) -> dict:
    """CTRL (Keskar et al. 2019, section 3; CTRLConfig/CTRLLMHeadModel): token embeddings scaled by sqrt(d)
    plus the sinusoidal table of n_positions rows (a buffer), pre-norm blocks of LayerNorms with bias, Wq/Wk/Wv
    and dense with bias, a ReLU MLP of dff with bias, a final LayerNorm, an lm_head with bias, its weight tied
    by default. Raises: LmcostError as the reader does."""
    return dict(d_model=r.get("n_embd", 1280), n_layers=r.get("n_layer", 48), vocab_size=r.get("vocab_size", 246534),
                attention=dict(n_heads=r.get("n_head", 16), qkv_bias=True, out_bias=True),
                ffn=dict(activation="relu", d_ff=r.get("dff", 8192), bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="sinusoidal",
                max_positions=r.get("n_positions", 256), lm_head_bias=True,
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("persimmon")
def persimmon(r: Reader, mt: str) -> dict:
    """Persimmon (Adept 2023; PersimmonConfig/PersimmonForCausalLM): fused query_key_value [d, 3d] and dense with
    bias, with qk_layernorm a LayerNorm (weight and bias) of width hidden_size / heads on each head of q and k
    before RoPE, RoPE on partial_rotary_factor (0.5) of each head, LayerNorms with bias, an MLP
    dense_h_to_4h/dense_4h_to_h with bias and hidden_act (squared ReLU), an untied lm_head.
    Raises: LmcostError for a head_dim other than hidden_size / heads (PersimmonAttention's width, which its
    rotary embedding would not match)."""
    qk = r.get("qk_layernorm", True)
    d, h = r.get("hidden_size", 4096), r.get("num_attention_heads", 64)
    head_dim = r.get("head_dim", None, kind=int)
    if head_dim is not None and head_dim * h != d:
        raise LmcostError(f"{r.source}: head_dim", f"{head_dim} x {h} heads is not hidden_size={d}, the width "
                          "PersimmonAttention builds", "remove head_dim")
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 36),
                vocab_size=r.get("vocab_size", 262144),
                attention=dict(n_heads=h, qkv_bias=True, out_bias=True, qk_norm="head_layernorm" if qk else "none"),
                ffn=dict(activation=activation(r, "hidden_act", "relu2", False), d_ff=r.get("intermediate_size", 16384),
                         bias=True),
                norm="layernorm", norm_bias=True, block="pre_norm", positions="rope",
                rotary_fraction=rotary_fraction(r, 0.5), tie_embeddings=r.get("tie_word_embeddings", False))


_NANOCHAT = FamilySpec(model_type="nanochat", qkv_bias=LLAMA_QKV_BIAS, mlp_bias=None, qk_norm="l2", norm_weight=False,
                       gated=False, activation_default="relu2", softcaps=Softcaps(attention=None, final=15.0))


@family("nanochat")
def nanochat(r: Reader, mt: str) -> dict:
    """nanochat (Karpathy 2025; NanoChatConfig/NanoChatForCausalLM): Llama's attention (attention_bias on q, k, v
    and o) with a weightless RMSNorm of each head of q and k after RoPE (the schema's ``l2``), RMSNorms without
    weights before each sublayer, on the embeddings (the final norm's module, applied first too) and at the end,
    a plain MLP fc1/fc2 without bias (squared ReLU), logits soft-capped at final_logit_softcapping (15).
    Raises: LmcostError as the Llama-like table does."""
    out = _NANOCHAT(r, mt)
    out["embedding_norm"] = True
    return out


@family("bitnet")
def bitnet(r: Reader, mt: str) -> dict:
    """BitNet b1.58 (Ma et al. 2024, section 2; BitNetConfig/BitNetForCausalLM): Llama attention (attention_bias on
    q, k, v and o) with an RMSNorm of the attention output [hidden_size] before o_proj, a gated MLP relu(x W_gate)^2 *
    x W_up with an RMSNorm [intermediate_size] before down_proj, pre-norm blocks of RMSNorm, an untied lm_head.
    Raises: LmcostError for a hidden_act other than relu2 (the sub-norm layout is modelled with BitNet's own), or a
    head_dim x heads other than hidden_size (attn_sub_norm is hidden_size wide)."""
    if r.get("hidden_act", "relu2", kind=str) != "relu2":
        raise LmcostError(f"{r.source}: hidden_act", f"{r.data['hidden_act']!r:.40} is not modelled for bitnet",
                          "use relu2, or write an lmcost YAML")
    d, h = r.get("hidden_size", 2560), r.get("num_attention_heads", 20)
    head_dim = r.get("head_dim", None, kind=int)
    if head_dim is not None and head_dim * h != d:
        raise LmcostError(f"{r.source}: head_dim", f"{head_dim} x {h} heads is not hidden_size={d}, the width of "
                          "BitNet's attn_sub_norm", "remove head_dim")
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 30), vocab_size=r.get("vocab_size", 128256),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 5), qkv_bias=bias, out_bias=bias),
                ffn=dict(activation="relu2_glu", d_ff=r.get("intermediate_size", 6912)),
                norm="rmsnorm", block="pre_norm", positions="rope", sub_norms=True,
                tie_embeddings=r.get("tie_word_embeddings", False))


_DIFFLLAMA = FamilySpec(model_type="diffllama", mlp_bias=None, ignores=("lambda_std_dev",))


@family("diffllama")
def diffllama(r: Reader, mt: str) -> dict:
    """DiffLlama (Ye et al. 2024; DiffLlamaConfig/DiffLlamaForCausalLM): Llama's layout (attention_bias on q, k, v
    and o, an MLP without bias) with differential attention: two attention calls over one half of the value heads
    each, combined per head pair with four learned lambda vectors [d_h] per layer. lambda_std_dev is an
    initialisation width. Raises: LmcostError for an odd number of KV heads (DiffLlamaAttention refuses it)."""
    out = _DIFFLLAMA(r, mt)
    att = out["attention"]
    if att["n_kv_heads"] % 2 or att["n_heads"] % 2:
        raise LmcostError(f"{r.source}: num_key_value_heads", f"{att['n_kv_heads']} KV heads of {att['n_heads']}: "
                          "DiffLlamaAttention splits the value heads into two halves", "use an even number of heads")
    att["differential"] = True
    return out
