"""Hugging Face mappings of recurrent (RNN-style) families (:mod:`lmcost.operators.rnn`): their layers keep a
constant-size state per sequence beside, or in place of, attention.

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``, as in
:mod:`lmcost.model.hf.hybrid`. Accepted families, each checked exactly against transformers (tests/test_rnn.py,
test_params.py, test_flop_oracle.py): parameters of the default config on the meta device, matmul FLOPs of a
tiny instance in prefill and decode, and the bytes of the cache transformers fills (its DynamicCache and the
states its recurrent blocks hold).
- ``recurrent_gemma``: Griffin (De et al. 2024): pre-norm residual blocks of an RG-LRU recurrent block or
  local (sliding-window) MQA/GQA attention, each with a gated GeLU MLP (with biases).
- ``rwkv``: RWKV-4 (Peng et al. 2023; transformers implements RWKV-4, its ``RwkvSelfAttention`` the WKV of
  time_decay/time_first): pre-LayerNorm blocks of time mixing and channel mixing, no attention.
- ``xlstm``: xLSTM 7B (Beck et al. 2025; transformers' native xLSTM: mLSTM blocks only, no sLSTM): pre-RMSNorm
  blocks of an mLSTM layer and a SwiGLU FFN, no attention.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import activation, rotary_fraction
from lmcost.model.hf.registry import family, mapped_in

#: RecurrentGemmaConfig's block names -> lmcost's mixer kinds (its attention blocks are always local).
_GRIFFIN_BLOCKS = {"recurrent": "rg_lru", "attention": "local"}


def _refuse(r, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


@family("recurrent_gemma")
def recurrent_gemma(r, mt: str) -> dict:
    """RecurrentGemmaConfig -> ArchConfig fields (transformers RecurrentGemmaModel: embeddings scaled by
    sqrt(d), layers of [RMSNorm, temporal block, residual, RMSNorm, MLP, residual], final norm, tied lm_head,
    logits soft-capped at logits_soft_cap).

    Temporal blocks: ``block_types`` repeated over the layers; ``recurrent`` is the RG-LRU block
    (:func:`lmcost.operators.rnn.rg_lru_ops`: lru_width, gates in num_attention_heads blocks, conv1d_width
    taps), ``attention`` local attention over attention_window_size tokens (head_dim = hidden_size // heads,
    RoPE on partial_rotary_factor of it, q/k/v biased by attention_bias, o_proj always biased). The MLP is
    gated (hidden_activation) with width intermediate_size // 2 and biases on all three projections
    (RecurrentGemmaMlp). The RMSNorms scale by (1 + w): one weight per element, as RMSNorm.
    Refused: a block type other than recurrent/attention; a head_dim other than hidden_size // heads
    (RecurrentGemmaConfig overwrites it).
    """
    for key in ("w_init_variance_scale", "final_w_init_variance_scale"):  # initialisation only
        r.get(key, None, kind=float)
    n_layers = r.get("num_hidden_layers", 26)
    d = r.get("hidden_size", 2560)
    h = r.count("num_attention_heads", 10)
    blocks = r.get("block_types", ["recurrent", "recurrent", "attention"], kind=list)
    if not blocks:
        _refuse(r, "block_types", "empty", "list the temporal blocks: recurrent, attention")
    for bt in blocks:
        if bt not in _GRIFFIN_BLOCKS:
            _refuse(r, "block_types", f"block type {bt!r:.40} is not modelled", "use recurrent and attention")
    head_dim = r.get("head_dim", None, kind=int)
    if head_dim is not None and head_dim != d // h:
        _refuse(r, "head_dim", f"{head_dim} differs from hidden_size // num_attention_heads = {d // h}, which "
                "RecurrentGemmaConfig uses", "remove head_dim or make it hidden_size // num_attention_heads")
    act = activation(r, "hidden_activation", "gelu_pytorch_tanh", True)
    if act != "geglu":  # it is also the GeLU of the recurrent block's y branch (mixer.y_act)
        _refuse(r, "hidden_activation", f"{act} is not modelled in the recurrent block", "use a GeLU")
    lru = r.get("lru_width", None, kind=int)
    bias = r.get("attention_bias", False)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 256000),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", None, kind=int), head_dim=d // h,
                               qkv_bias=bias, out_bias=True, sliding_window=r.get("attention_window_size", 2048)),
                ffn=dict(activation=act,
                         d_ff=r.get("intermediate_size", 3 * 2560) // 2, bias=True),
                recurrent=dict(layer_pattern=[_GRIFFIN_BLOCKS[bt] for bt in (blocks * n_layers)[:n_layers]],
                               rg_lru=dict(width=lru if lru is not None else d, n_blocks=h,
                                           d_conv=r.get("conv1d_width", 4))),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 0.5),
                final_logit_softcap=r.get("logits_soft_cap", 30.0, kind=float),
                tie_embeddings=r.get("tie_word_embeddings", True))


@family("rwkv")
def rwkv(r, mt: str) -> dict:
    """RwkvConfig -> ArchConfig fields (transformers RwkvForCausalLM: embeddings, the first block's pre_ln
    (lmcost's embedding_norm), blocks of [ln1, time mixing, residual, ln2, channel mixing, residual] with
    LayerNorms with biases, ln_out, head). ``rescale_every`` halves the hidden states every so many blocks
    in inference (and the weights that feed them): no cost counted. ``context_length`` is the trained context.
    Refused: attention_hidden_size other than hidden_size (transformers' cached state is hidden_size wide, so
    such a model cannot decode from its cache).
    """
    r.get("rescale_every", 6)
    d = r.get("hidden_size", 4096)
    width = r.get("attention_hidden_size", None, kind=int)
    if width is not None and width != d:
        _refuse(r, "attention_hidden_size", f"{width} differs from hidden_size={d}: transformers' RWKV state is "
                "hidden_size wide", "set attention_hidden_size to hidden_size or null")
    d_ff = r.get("intermediate_size", None, kind=int)
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 32), vocab_size=r.get("vocab_size", 50277),
                ffn=dict(activation="relu2", d_ff=d_ff if d_ff is not None else 4 * d),
                recurrent=dict(layer_pattern=["rwkv4"], ffn_pattern=["rwkv4_channel"], rwkv4={}),
                norm="layernorm", norm_bias=True, embedding_norm=True, block="pre_norm", positions="none",
                max_positions=r.get("context_length", 1024), tie_embeddings=r.get("tie_word_embeddings", False))


#: xLSTMConfig's kernel names: transformers' own model runs its native kernels whatever they say (the others
#: are the external xlstm package's, used only when it is installed).
_XLSTM_NO_COST = ("chunkwise_kernel", "sequence_kernel", "step_kernel", "norm_reduction_force_float32",
                  "return_last_states", "autocast_kernel_dtype", "eps", "norm_eps", "inference_state_dtype",
                  "add_out_norm")


def _round_up(x, of: int) -> int:
    """xLSTMConfig's round_up_to_next_multiple_of: int(ceil(x / of) * of) as it writes it."""
    return int(((x + of - 1) // of) * of)


@family("xlstm")
def xlstm(r, mt: str) -> dict:
    """xLSTMConfig -> ArchConfig fields (transformers xLSTMForCausalLM, native kernels: embeddings, blocks of
    [RMSNorm, mLSTM layer, residual, RMSNorm, SwiGLU FFN, residual], out_norm, lm_head, logits soft-capped at
    output_logit_soft_cap). The mLSTM's q/k width is int(hidden_size * qk_dim_factor), v's
    int(hidden_size * v_dim_factor) (xLSTMLayer); the FFN's round_up(hidden_size * ffn_proj_factor,
    ffn_round_up_to_multiple_of). weight_mode single or fused: the same weights, split or stacked.
    Refused: use_bias (RMSNorms with a bias); a q/k or v width that is not a multiple of 64 (xLSTMCache allocates
    the state at the width rounded up to 64, so the model cannot decode from its cache); embedding_dim or
    num_blocks other than hidden_size, num_hidden_layers; mode other than inference (the training kernels run
    other matmuls); max_inference_chunksize not a multiple of chunk_size (its pieces would change the chunks).
    """
    for key in _XLSTM_NO_COST:
        r.get(key, None, kind=object)
    d = r.get("hidden_size", 4096)
    n_layers = r.get("num_hidden_layers", 32)
    for key, want in (("embedding_dim", d), ("num_blocks", n_layers)):
        got = r.get(key, None, kind=int)
        if got is not None and got != want:
            _refuse(r, key, f"{got} differs from {want}, which the model also uses", f"set {key} to {want} or null")
    r.must_not("use_bias", "biases (on the RMSNorms too)")
    if r.get("mode", "inference") != "inference":
        _refuse(r, "mode", "only the inference kernels are modelled", "set mode: inference")
    h = r.count("num_heads", 8)
    widths = {}
    for key, default in (("qk_dim_factor", 0.5), ("v_dim_factor", 1.0)):
        w = int(d * r.get(key, default, kind=float))
        if w < 1 or w != _round_up(d * r.get(key, default, kind=float), 64) or w % h:
            _refuse(r, key, f"hidden_size x {key} = {w} is not a positive multiple of 64 and of num_heads={h}, "
                    "which xLSTMCache's state needs", f"make hidden_size x {key} a multiple of 64")
        widths[key] = w
    L = r.count("chunk_size", 64)
    if r.count("max_inference_chunksize", 16384) % L:
        _refuse(r, "max_inference_chunksize", f"not a multiple of chunk_size={L}: its pieces would change the chunks",
                "make it a multiple of chunk_size")
    r.get("weight_mode", "single", kind=str)
    d_ff = _round_up(d * r.get("ffn_proj_factor", 2.667, kind=float), r.count("ffn_round_up_to_multiple_of", 64))
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 50304),
                ffn=dict(activation="swiglu", d_ff=d_ff),
                recurrent=dict(layer_pattern=["mlstm"],
                               mlstm=dict(n_heads=h, qk_dim=widths["qk_dim_factor"], v_dim=widths["v_dim_factor"],
                                          chunk_size=L, gate_softcap=r.get("gate_soft_cap", 15.0, kind=float))),
                norm="rmsnorm", block="pre_norm", positions="none",
                final_logit_softcap=r.get("output_logit_soft_cap", 30.0, kind=float),
                tie_embeddings=r.get("tie_word_embeddings", False))


#: The model types this file maps (tests/test_rnn.py walks them).
FAMILIES = mapped_in(__name__)
