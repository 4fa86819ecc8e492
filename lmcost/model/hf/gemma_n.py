"""Hugging Face mappings of Gemma 4 (``gemma4_text``, ``gemma4_unified_text``) and Gemma 3n (``gemma3n_text``) and
their multimodal wrappers: per-layer input embeddings, KV sharing across layers, K=V attention, global layers of
their own width, AltUp and LAuReL (schema: :mod:`lmcost.model.layer_sharing`; operators:
:mod:`lmcost.operators.per_layer`, :mod:`lmcost.operators.altup`).

The reference is transformers 5.24's Gemma4TextConfig / Gemma4UnifiedTextConfig (defaults, the derived
layer_types, kv_sharing_modes, per_layer_config) and Gemma4TextModel / Gemma4UnifiedTextModel. Each was
checked exactly against it (tests/test_gemma_n.py, test_params.py, test_flop_oracle.py): parameters on the
meta device, FlopCounterMode matmul FLOPs of tiny instances (KV-shared, K=V, PLE and double-wide variants
among them) in prefill and decode, and the bytes of the cache object (whose KV-shared layers are
DummyLayers holding nothing).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import activation, mapped_layer_types
from lmcost.model.hf.registry import Wrapper, family, register

#: transformers' layer_types -> lmcost's attention kinds.
_KINDS = {"sliding_attention": "local", "full_attention": "global"}
#: The keys a per_layer_config entry may override (Gemma4TextConfig.__post_init__ writes these two).
_OVERRIDES = ("head_dim", "num_key_value_heads")
#: The MLP's gated kind -> the PLE gate's activation (both hidden_activation).
_GATE_ACT = {"geglu": "gelu", "swiglu": "silu", "reglu": "relu"}


def _refuse(r, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


def _layer_types(r, n_layers: int) -> list[str]:
    """layer_types, or Gemma4TextConfig's derivation (every 6th layer full); the last layer is forced full,
    as the config class does."""
    types = r.get("layer_types", None, kind=list)
    if types is None:
        types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layers)]
    kinds = mapped_layer_types(r, types, n_layers, _KINDS)
    return kinds[:-1] + ["global"]


def _global_widths(r, kinds: list[str], head_dim: int, h_kv: int, k_eq_v: bool) -> tuple[int, int]:
    """The global layers' (head_dim, num_key_value_heads): from ``per_layer_config`` (transformers 5.24's
    serialisation: {layer index: overrides}) or, absent, global_head_dim (512) and, with attention_k_eq_v,
    num_global_key_value_heads (Gemma4TextConfig.__post_init__).
    Raises: LmcostError for overrides on a sliding layer, global layers that differ, or another key."""
    hd = r.get("global_head_dim", 512)
    ghkv = r.get("num_global_key_value_heads", None, kind=int)
    plc = r.get("per_layer_config", None, kind=dict)
    if plc is None:
        return hd, (ghkv if (k_eq_v and ghkv is not None) else h_kv)
    seen = set()
    for key, over in plc.items():
        idx = int(key) if isinstance(key, str) and key.isdigit() else key
        if not isinstance(idx, int) or not 0 <= idx < len(kinds) or not isinstance(over, dict) \
                or any(k not in _OVERRIDES for k in over):
            _refuse(r, "per_layer_config", f"entry {key!r:.20} is not a layer index with head_dim / num_key_value_heads",
                    "give per-layer overrides of head_dim and num_key_value_heads only")
        if kinds[idx] != "global":
            _refuse(r, "per_layer_config", f"layer {idx} is a sliding layer with overrides; Gemma 4 overrides "
                    "only its full-attention layers", "remove the entry or write an lmcost YAML")
        seen.add((over.get("head_dim", head_dim), over.get("num_key_value_heads", h_kv)))
    globals_ = sum(k == "global" for k in kinds)
    if len(seen) > 1 or (seen and len(plc) != globals_):
        _refuse(r, "per_layer_config", "the full-attention layers' widths differ", "give every full-attention "
                "layer the same head_dim and num_key_value_heads, or write an lmcost YAML")
    return next(iter(seen)) if seen else (head_dim, h_kv)


def _gemma4(r, mt: str, *, window: int, ple: bool) -> dict:
    """Gemma4TextConfig / Gemma4UnifiedTextConfig -> ArchConfig fields (Gemma4TextModel: sandwich-norm layers of
    GQA with per-head q/k RMSNorm, a weightless v_norm and RoPE (proportional RoPE on the global layers rotates
    the whole head, zero frequencies past its fraction), a GeGLU MLP; sliding and full layers, the full ones
    with their own head_dim (and K/V heads with attention_k_eq_v); optionally the last num_kv_shared_layers
    reusing K/V, double-wide MLPs on those, PLE (``ple``: gemma4_text only)).
    With enable_moe_block (gemma4_text), every layer adds top_k_experts of num_experts GeGLU experts of
    moe_intermediate_size beside its MLP (lmcost's shared expert, with Gemma's own norms and router scales:
    :func:`lmcost.operators.per_layer.normed_branch_ops`).
    Refused: use_bidirectional_attention "all"
    (:func:`lmcost.model.hf.families.from_hf_config`; "vision" is read: text tokens stay causal).
    """
    moe = r.get("enable_moe_block", False)
    experts = [r.get(key, None, kind=int) for key in ("num_experts", "top_k_experts", "moe_intermediate_size")]
    if moe and None in experts:
        key = ("num_experts", "top_k_experts", "moe_intermediate_size")[experts.index(None)]
        _refuse(r, key, "missing with enable_moe_block: Gemma4TextConfig has no default and its experts cannot "
                "be built without it", f"set {key} (see the model card)")
    n_layers = r.get("num_hidden_layers", 30)
    kinds = _layer_types(r, n_layers)
    h = r.get("num_attention_heads", 8)
    h_kv = r.get("num_key_value_heads", 4)
    head_dim = r.get("head_dim", 256)
    k_eq_v = r.get("attention_k_eq_v", False)
    g_hd, g_hkv = _global_widths(r, kinds, head_dim, h_kv, k_eq_v)
    bias = r.get("attention_bias", False)
    shared = r.get("num_kv_shared_layers", 0, kind=int)
    if not 0 <= shared < n_layers:
        _refuse(r, "num_kv_shared_layers", f"{shared} is not in 0..{n_layers - 1} (every layer sharing K/V "
                "is an assistant model reading its target's)", "give fewer shared layers")
    attention = dict(n_heads=h, n_kv_heads=h_kv, head_dim=head_dim, qkv_bias=bias, out_bias=bias, qk_norm="head",
                     sliding_window=r.get("sliding_window", window), layer_pattern=kinds,
                     kv_shared_layers=shared, k_eq_v="global" if k_eq_v else "none", v_norm=True,
                     global_head_dim=g_hd if g_hd != head_dim else None,
                     global_n_kv_heads=g_hkv if g_hkv != h_kv else None)
    act = activation(r, "hidden_activation", "gelu_pytorch_tanh", True)
    double = r.get("use_double_wide_mlp", False)  # Gemma4TextMLP: 2 * intermediate_size on KV-shared layers
    out = dict(d_model=r.get("hidden_size", 2304), n_layers=n_layers, vocab_size=r.get("vocab_size", 262144),
               attention=attention,
               ffn=dict(activation=act, d_ff=r.get("intermediate_size", 9216), kv_shared_double=double and bool(shared)),
               norm="rmsnorm", block="sandwich", positions="rope",
               tie_embeddings=r.get("tie_word_embeddings", True))
    if moe:  # every layer: the dense MLP (the shared expert) beside top-k of num_experts
        out["moe"] = dict(n_experts=experts[0], top_k=experts[1], d_ff_expert=experts[2],
                          d_ff_shared=out["ffn"]["d_ff"], normed_branches=True)
    cap = r.get("final_logit_softcapping", None, kind=float)
    if cap is not None:
        out["final_logit_softcap"] = cap
    if ple:
        width = r.get("hidden_size_per_layer_input", 256, kind=int)
        vocab = r.get("vocab_size_per_layer_input", 262144)
        if width:  # 0 or null: Gemma4TextModel builds no PLE
            out["per_layer_input"] = dict(width=width, vocab=vocab, activation=_GATE_ACT[act])
    return out


@family("gemma4_text")
def gemma4_text(r, mt: str) -> dict:
    """Gemma4TextConfig -> ArchConfig fields (see :func:`_gemma4`; sliding_window 512, PLE of 256 per layer)."""
    return _gemma4(r, mt, window=512, ple=True)


@family("gemma4_unified_text")
def gemma4_unified_text(r, mt: str) -> dict:
    """Gemma4UnifiedTextConfig -> ArchConfig fields (see :func:`_gemma4`; sliding_window 1024, no PLE or MoE)."""
    return _gemma4(r, mt, window=1024, ple=False)


@family("gemma3n_text")
def gemma3n_text(r, mt: str) -> dict:
    """Gemma3nTextConfig -> ArchConfig fields (Gemma3nTextModel: AltUp's altup_num_inputs copies of the residual
    stream and LAuReL residuals of laurel_rank around sandwich-norm layers of GQA (per-head q/k RMSNorm, a
    weightless v_norm, RoPE) and a GeGLU MLP; every 5th layer full attention, the others sliding; the last
    num_kv_shared_layers reuse K/V; per-layer inputs of hidden_size_per_layer_input; logits soft-capped at 30).
    activation_sparsity_pattern is read: its Gaussian top-k is elementwise work not counted
    (:mod:`lmcost.operators.altup`). Refused: an intermediate_size that differs between layers."""
    n_layers = r.get("num_hidden_layers", 35)
    types = r.get("layer_types", None, kind=list)
    if types is None:  # Gemma3nTextConfig: every 5th layer full (the last one is not forced)
        types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(n_layers)]
    kinds = mapped_layer_types(r, types, n_layers, _KINDS)
    d_ff = r.data.get("intermediate_size")
    if isinstance(d_ff, list):  # one per layer (Gemma3nTextConfig's own form): all equal, or refused
        r.used.add("intermediate_size")
        if len(d_ff) != n_layers or len(set(map(repr, d_ff))) != 1:
            _refuse(r, "intermediate_size", f"{len(d_ff)} widths for {n_layers} layers, or widths that differ "
                    "between layers (not modelled)", "give one width for every layer, or write an lmcost YAML")
        d_ff = r._width("intermediate_size", d_ff[0])
    else:
        d_ff = r.get("intermediate_size", 16384)
    sparsity = r.get("activation_sparsity_pattern", None, kind=object)
    if sparsity is not None and not isinstance(sparsity, (list, int, float)):
        _refuse(r, "activation_sparsity_pattern", f"must be a number or a list, got {sparsity!r:.40}",
                "give one sparsity per layer")
    for key in ("altup_active_idx", "altup_coef_clip"):  # which copy is active; a clamp in training only
        r.get(key, None, kind=float)
    shared = r.get("num_kv_shared_layers", 15, kind=int)
    if not 0 <= shared < n_layers:
        _refuse(r, "num_kv_shared_layers", f"{shared} is not in 0..{n_layers - 1}", "give fewer shared layers")
    h, bias = r.get("num_attention_heads", 8), r.get("attention_bias", False)
    act = activation(r, "hidden_activation", "gelu_pytorch_tanh", True)
    cap = r.get("final_logit_softcapping", 30.0, kind=float)
    return dict(d_model=r.get("hidden_size", 2048), n_layers=n_layers, vocab_size=r.get("vocab_size", 262400),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 2), head_dim=r.get("head_dim", 256),
                               qkv_bias=bias, out_bias=bias, qk_norm="head", v_norm=True,
                               sliding_window=r.get("sliding_window", 512), layer_pattern=kinds,
                               kv_shared_layers=shared),
                ffn=dict(activation=act, d_ff=d_ff), norm="rmsnorm", block="sandwich", positions="rope",
                tie_embeddings=r.get("tie_word_embeddings", True), final_logit_softcap=cap,
                per_layer_input=dict(width=r.get("hidden_size_per_layer_input", 256),
                                     vocab=r.get("vocab_size_per_layer_input", 262144), activation=_GATE_ACT[act]),
                altup=dict(n_inputs=r.get("altup_num_inputs", 4), correct_scale=r.get("altup_correct_scale", True),
                           laurel_rank=r.get("laurel_rank", 64)))


#: Gemma4ForConditionalGeneration and Gemma4UnifiedForConditionalGeneration: the decoder is text_config.
register(Wrapper(model_type="gemma4", text_type="gemma4_text", ties=True))
register(Wrapper(model_type="gemma4_unified", text_type="gemma4_unified_text", ties=True))
#: Gemma3nForConditionalGeneration: the decoder is text_config; its MobileNet vision tower, audio encoder and
#: their embedders are not counted.
register(Wrapper(model_type="gemma3n", text_type="gemma3n_text", ties=True,
                 own=("audio_soft_tokens_per_image", "vision_soft_tokens_per_image")))
