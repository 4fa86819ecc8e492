"""Hugging Face mappings of hybrid families whose layers mix attention with constant-size state layers
(Mamba-2, gated DeltaNet, short convolutions).

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields, called by :func:`lmcost.model.hf.families.from_hf_config`; the reader
(:class:`lmcost.model.hf.reader.Reader`) records the keys used, so a key no mapping reads is still refused.

Accepted families, each checked exactly against transformers (tests/test_hybrid.py, test_params.py,
test_flop_oracle.py): parameters of the default config on the meta device, matmul FLOPs of a tiny
instance in prefill and decode, and the bytes of the cache object after a prefill.
- ``nemotron_h``: blocks of one kind each (NemotronHBlock: norm, mixer, residual): ``M`` Mamba-2,
  ``*`` attention (GQA, no RoPE, no bias), ``-`` a squared-ReLU MLP, ``E`` a MoE of squared-ReLU experts
  with one shared expert.
- ``qwen3_next``: pre-norm layers of a gated DeltaNet or gated attention, each with a MoE (softmax top-k,
  a sigmoid-gated shared expert) or a dense SwiGLU MLP.
- ``bamba``: pre-norm layers of a Mamba-2 mixer or attention (RoPE on half of each head), each with a
  SwiGLU MLP.
- ``granitemoehybrid``: as bamba, with a MoE plus an ungated shared MLP (or the MLP alone), and RoPE
  only with position_embedding_type "rope".
- ``lfm2``: pre-norm layers of a gated short conv or attention (per-head RMSNorm on q and k), each with
  a SwiGLU FFN whose width LFM2's config derives (block_auto_adjust_ff_dim).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.linear_attention import gated_deltanet_fields, qwen_hybrid_layers
from lmcost.model.hf.reader import activation, mapped_layer_types, rotary_fraction
from lmcost.model.hf.registry import Wrapper, family, mapped_in, register

#: NemotronHConfig's layer letters (hybrid_override_pattern) and names (layers_block_type).
_NEMOTRON_LETTERS = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
_NEMOTRON_KINDS = {"linear_attention": ("mamba2", "none"), "full_attention": ("global", "none"),
                   "mlp": ("none", "dense"), "moe": ("none", "moe")}
#: Keys of NemotronHConfig that change nothing lmcost counts: initialisation, kernels, the MTP head
#: transformers does not build (its weights are ignored on load), casts of the residual.
_NEMOTRON_NO_COST = ("use_mamba_kernels", "expand", "time_step_min", "time_step_max", "time_step_limit",
                     "time_step_floor", "time_step_rank", "rescale_prenorm_residual", "residual_in_fp32",
                     "num_logits_to_keep", "mtp_layers_block_type", "mtp_hybrid_override_pattern",
                     "moe_shared_expert_overlap", "n_shared_experts")


def _refuse(r, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


def _mamba_heads(r, d: int, config_class: str) -> tuple[int, int]:
    """(mamba_n_heads, mamba_d_head) of a Bamba-style config: d_head "auto" is mamba_expand * hidden_size
    // heads, and heads x d_head must be mamba_expand x hidden_size, as the config class requires.
    Raises: LmcostError naming mamba_d_head otherwise (or a count below 1)."""
    heads, expand = r.count("mamba_n_heads", 128), r.count("mamba_expand", 2)
    d_head = r.get("mamba_d_head", "auto", kind=object)
    if d_head == "auto":
        d_head = expand * d // heads
    if not isinstance(d_head, int) or isinstance(d_head, bool) or d_head * heads != expand * d:
        _refuse(r, "mamba_d_head", f"{d_head!r:.20} x {heads} heads is not mamba_expand x hidden_size = {expand * d}, "
                f"which {config_class} requires", "make mamba_n_heads x mamba_d_head = mamba_expand x hidden_size")
    return heads, d_head


@family("nemotron_h")
def nemotron_h(r, mt: str) -> dict:
    """NemotronHConfig -> ArchConfig fields (transformers NemotronHModel: embeddings, blocks, norm_f, lm_head).

    ``sliding_window`` (a NemotronHConfig field) is read and ignored, as NemotronHAttention ignores it
    (unlike the llama mapping, whose config class has none: :func:`lmcost.model.hf.windows.ignored`).
    Refused: attention_bias or mamba_proj_bias true, moe_latent_size, a mamba activation
    other than SiLU, mamba_ssm_cache_dtype other than float32 (transformers ignores all of these, so the
    checkpoint's model would differ from what is counted).
    """
    for key in _NEMOTRON_NO_COST:
        r.get(key, None)
    types = r.get("layers_block_type", None, kind=list)
    alias = r.get("layer_types", None, kind=list)  # attribute_map alias
    pattern = r.get("hybrid_override_pattern", None, kind=str)
    if types is None:
        types = alias
    if types is None and pattern is not None:
        bad = [c for c in pattern if c not in _NEMOTRON_LETTERS]
        if bad:
            _refuse(r, "hybrid_override_pattern", f"unknown layer letter {bad[0]!r}",
                    "use M (Mamba-2), * (attention), - (MLP) and E (MoE)")
        types = [_NEMOTRON_LETTERS[c] for c in pattern]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's default
    for t in types:
        if t not in _NEMOTRON_KINDS:
            _refuse(r, "layers_block_type", f"layer type {t!r:.40} is not modelled",
                    "use linear_attention, full_attention, mlp and moe")
    n_layers = r.get("num_hidden_layers", None, kind=int)
    if n_layers is not None and n_layers != len(types):
        _refuse(r, "num_hidden_layers", f"{n_layers} differs from the {len(types)} layers of the layer pattern, "
                "which NemotronHConfig uses", "make num_hidden_layers the length of the pattern, or remove it")
    r.must_not("attention_bias", "attention bias (NemotronHAttention builds none)")
    r.must_not("mamba_proj_bias", "a Mamba projection bias separate from use_bias")
    r.get("sliding_window", None, kind=int)  # NemotronHConfig accepts it; NemotronHAttention never applies it
    if r.get("moe_latent_size", None, kind=int) is not None:
        _refuse(r, "moe_latent_size", "latent MoE projections are not modelled",
                "set moe_latent_size to null or write an lmcost YAML")
    if r.get("mamba_hidden_act", "silu") != "silu":
        _refuse(r, "mamba_hidden_act", "only SiLU after the Mamba-2 conv is modelled", "set mamba_hidden_act: silu")
    if r.get("mamba_ssm_cache_dtype", "float32") != "float32":
        _refuse(r, "mamba_ssm_cache_dtype", "transformers keeps the SSM state in float32",
                "set mamba_ssm_cache_dtype: float32")
    h = r.get("num_attention_heads", 32)
    head_dim = r.get("head_dim", 128)
    legacy = r.get("attention_head_dim", None, kind=int)  # published configs' name; transformers reads head_dim
    if legacy is not None and legacy != head_dim:
        _refuse(r, "attention_head_dim", f"{legacy} differs from head_dim={head_dim}, which transformers uses",
                "give head_dim the attention head width")
    d = r.get("hidden_size", 4096)
    kinds = [_NEMOTRON_KINDS[t] for t in types]
    bias = r.get("mlp_bias", False)
    out = dict(d_model=d, n_layers=len(types), vocab_size=r.get("vocab_size", 131072),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8), head_dim=head_dim),
               ffn=dict(activation=activation(r, "mlp_hidden_act", "relu2", False),
                        d_ff=r.get("intermediate_size", 21504), bias=bias),
               recurrent=dict(layer_pattern=[k[0] for k in kinds], ffn_pattern=[k[1] for k in kinds],
                              mamba2=dict(n_heads=r.get("mamba_num_heads", 128), head_dim=r.get("mamba_head_dim", 64),
                                          d_state=r.get("ssm_state_size", 128), n_groups=r.get("n_groups", 8),
                                          d_conv=r.get("conv_kernel", 4), chunk_size=r.get("chunk_size", 128),
                                          conv_bias=r.get("use_conv_bias", True), proj_bias=r.get("use_bias", False))),
               norm="rmsnorm", block="pre_norm", positions="none",
               tie_embeddings=r.get("tie_word_embeddings", False))
    n_experts = r.get("n_routed_experts", None, kind=int)
    if n_experts is None:
        n_experts = r.get("num_local_experts", 8)
    else:
        r.get("num_local_experts", None, kind=int)
    moe = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 2),
               d_ff_expert=r.get("moe_intermediate_size", 7688),
               # NemotronHMoE: one shared MLP of moe_shared_expert_intermediate_size, whatever n_shared_experts
               d_ff_shared=r.get("moe_shared_expert_intermediate_size", 7688))
    if "moe" in types:
        if bias:
            _refuse(r, "mlp_bias", "true with MoE layers: a bias on the shared expert is not modelled",
                    "set mlp_bias to false or write an lmcost YAML")
        out["moe"] = moe
    return out


@family("lfm2")
def lfm2(r, mt: str) -> dict:
    """Lfm2Config -> ArchConfig fields (transformers Lfm2Model: pre-norm layers of a short conv or GQA
    attention with per-head q/k RMSNorm and RoPE, each with a SwiGLU FFN; embedding_norm is the final norm)."""
    n_layers = r.get("num_hidden_layers", 32)
    types = r.get("layer_types", None, kind=list)
    idxs = r.get("full_attn_idxs", None, kind=list)
    if types is None:
        idxs = idxs if idxs is not None else list(range(n_layers))
        types = ["full_attention" if i in idxs else "conv" for i in range(n_layers)]
    mixers = mapped_layer_types(r, types, n_layers, {"full_attention": "global", "conv": "short_conv"})
    d_ff = r.get("intermediate_size", None, kind=int)
    legacy = r.get("block_ff_dim", None, kind=int)  # Lfm2Config pops it into intermediate_size
    d_ff = legacy if legacy is not None else (d_ff if d_ff is not None else 12288)
    if r.get("block_auto_adjust_ff_dim", True):  # Lfm2MLP's width
        d_ff = int(2 * d_ff / 3)
        mult = r.get("block_ffn_dim_multiplier", 1.0, kind=float)
        if mult is not None:
            d_ff = int(mult * d_ff)
            of = r.get("block_multiple_of", 256)
            d_ff = of * ((d_ff + of - 1) // of)
    else:
        r.get("block_ffn_dim_multiplier", None, kind=float)
        r.get("block_multiple_of", None, kind=int)
    tie = r.get("tie_word_embeddings", True)
    legacy_tie = r.get("tie_embedding", None, kind=bool)
    bias = r.get("conv_bias", False)
    h = r.get("num_attention_heads", 32)
    return dict(d_model=r.get("hidden_size", 2560), n_layers=n_layers, vocab_size=r.get("vocab_size", 65536),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8), qk_norm="head"),
                ffn=dict(activation="swiglu", d_ff=d_ff),
                recurrent=dict(layer_pattern=mixers,
                               short_conv=dict(d_conv=r.get("conv_L_cache", 3), bias=bias)),
                norm="rmsnorm", block="pre_norm", positions="rope",
                tie_embeddings=legacy_tie if legacy_tie is not None else tie)


@family("qwen3_next")
def qwen3_next(r, mt: str) -> dict:
    """Qwen3NextConfig -> ArchConfig fields (transformers Qwen3NextModel: pre-norm layers of a gated DeltaNet
    or gated attention (per-head q/k RMSNorm, partial RoPE, an output gate from q_proj), each with a MoE of
    softmax top-k experts and a sigmoid-gated shared expert, or a dense SwiGLU MLP on mlp_only_layers and
    off decoder_sparse_step). The zero-centred RMSNorms have one weight per element, as RMSNorm.
    Refused: hidden_act other than SiLU (it is also the conv's activation)."""
    n_layers, mixers = qwen_hybrid_layers(r, 48)
    h = r.get("num_attention_heads", 16)
    bias = r.get("attention_bias", False)
    out = dict(d_model=r.get("hidden_size", 2048), n_layers=n_layers, vocab_size=r.get("vocab_size", 151936),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 2), head_dim=r.get("head_dim", 256),
                              qkv_bias=bias, out_bias=bias, qk_norm="head", output_gate=True),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 5632)),
               recurrent=dict(layer_pattern=mixers, gated_deltanet=gated_deltanet_fields(r)),
               norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=rotary_fraction(r, 0.25),
               tie_embeddings=r.get("tie_word_embeddings", False))
    n_experts = r.get("num_experts", 512)
    step, only = r.count("decoder_sparse_step", 1), r.layers("mlp_only_layers", n_layers)
    dense = [i for i in range(n_layers) if i in only or n_experts == 0 or (i + 1) % step != 0]
    moe = dict(n_experts=max(n_experts, 1), top_k=r.get("num_experts_per_tok", 10),
               d_ff_expert=r.get("moe_intermediate_size", 512),
               d_ff_shared=r.get("shared_expert_intermediate_size", 512), shared_expert_gate=True, dense_layers=dense)
    if len(dense) < n_layers:
        out["moe"] = moe
    return out


@family("bamba")
def bamba(r, mt: str) -> dict:
    """BambaConfig -> ArchConfig fields (transformers BambaModel: pre-norm layers of a Mamba-2 mixer or GQA
    attention with RoPE on half of each head, each with a SwiGLU MLP). BambaConfig fixes
    partial_rotary_factor at 0.5 and derives layer i as attention iff i is in attn_layer_indices.
    Refused: hidden_act other than SiLU (it is also the Mamba conv's activation); a rotary fraction other
    than 0.5 (BambaConfig overwrites it)."""
    n_layers = r.get("num_hidden_layers", 32)
    # ibm-ai-platform/Bamba-9B's file carries these; BambaConfig has no such fields and the model reads neither
    r.used.update(("attn_rotary_emb", "use_mamba_kernels"))
    attn = r.layers("attn_layer_indices", n_layers)
    d = r.get("hidden_size", 4096)
    if r.get("hidden_act", "silu") != "silu":
        _refuse(r, "hidden_act", "only SiLU is modelled (the MLP's and the Mamba conv's activation)",
                "set hidden_act: silu")
    if rotary_fraction(r, 0.5) != 0.5:
        _refuse(r, "partial_rotary_factor", "BambaConfig fixes it at 0.5", "remove it or set it to 0.5")
    heads, d_head = _mamba_heads(r, d, "BambaConfig")
    h = r.get("num_attention_heads", 32)
    bias = r.get("attention_bias", False)
    r.get("z_loss_coefficient", 0.0, kind=float)  # a training loss term; the forward pass is the same
    r.get("num_logits_to_keep", None)
    r.get("time_step_limit", None, kind=list)  # the clamp of dt: no cost
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 128000),
                attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8), qkv_bias=bias, out_bias=bias,
                               head_dim=r.get("head_dim", None, kind=int)),  # BambaAttention: getattr, else d / h
                ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=r.get("intermediate_size", 14336),
                         bias=r.get("mlp_bias", False)),
                recurrent=dict(layer_pattern=["global" if i in attn else "mamba2" for i in range(n_layers)],
                               mamba2=dict(n_heads=heads, head_dim=d_head, d_state=r.get("mamba_d_state", 256),
                                           n_groups=r.get("mamba_n_groups", 1), d_conv=r.get("mamba_d_conv", 4),
                                           chunk_size=r.get("mamba_chunk_size", 256),
                                           conv_bias=r.get("mamba_conv_bias", True),
                                           proj_bias=r.get("mamba_proj_bias", False))),
                norm="rmsnorm", block="pre_norm", positions="rope", rotary_fraction=0.5,
                tie_embeddings=r.get("tie_word_embeddings", False))


@family("granitemoehybrid")
def granitemoehybrid(r, mt: str) -> dict:
    """GraniteMoeHybridConfig -> ArchConfig fields (transformers GraniteMoeHybridModel: pre-norm layers of a
    Mamba-2 mixer or GQA attention, each with a MoE of num_local_experts SwiGLU experts of intermediate_size
    (top-k, then a softmax over the k) plus an ungated SwiGLU shared MLP of shared_intermediate_size, or,
    with no experts, that MLP alone). RoPE only with position_embedding_type "rope" (the default is none).
    Granite's multipliers scale embeddings, residual branches, scores and logits: nothing counted.
    Refused: hidden_act other than SiLU; a partial rotary factor (its rotary embedding spans the head)."""
    for key in ("embedding_multiplier", "logits_scaling", "residual_multiplier", "attention_multiplier"):
        r.get(key, None, kind=float)
    n_layers = r.get("num_hidden_layers", 32)
    alias = r.get("layers_block_type", None, kind=list)  # attribute_map alias of layer_types
    types = r.get("layer_types", None, kind=list) or alias or ["linear_attention"] * n_layers
    mixers = mapped_layer_types(r, types, n_layers, {"linear_attention": "mamba2", "full_attention": "global"})
    if r.get("hidden_act", "silu") != "silu":
        _refuse(r, "hidden_act", "only SiLU is modelled (the MLPs' and the Mamba conv's activation)",
                "set hidden_act: silu")
    rope = r.get("position_embedding_type", None, kind=str)
    if rope not in (None, "rope", "nope"):  # the model rotates only with "rope"; Granite-4.0-H says "nope"
        _refuse(r, "position_embedding_type", f"{rope!r:.20} is not modelled", "use rope, nope or null (no positions)")
    if rope == "rope" and rotary_fraction(r, 1.0) != 1.0:
        _refuse(r, "partial_rotary_factor", "GraniteMoeHybrid's rotary embedding spans the whole head",
                "remove it or set it to 1.0")
    d = r.get("hidden_size", 4096)
    heads, d_head = _mamba_heads(r, d, "GraniteMoeHybridConfig")
    h = r.get("num_attention_heads", 32)
    bias = r.get("attention_bias", False)
    r.get("time_step_limit", None, kind=list)  # the clamp of dt: no cost
    shared = r.get("shared_intermediate_size", 1024)
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 32000),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 32), qkv_bias=bias, out_bias=bias,
                              head_dim=r.get("head_dim", None, kind=int)),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=shared),
               recurrent=dict(layer_pattern=mixers,
                              mamba2=dict(n_heads=heads, head_dim=d_head, d_state=r.get("mamba_d_state", 256),
                                          n_groups=r.get("mamba_n_groups", 1), d_conv=r.get("mamba_d_conv", 4),
                                          chunk_size=r.get("mamba_chunk_size", 256),
                                          conv_bias=r.get("mamba_conv_bias", True),
                                          proj_bias=r.get("mamba_proj_bias", False))),
               norm="rmsnorm", block="pre_norm", positions="rope" if rope == "rope" else "none",
               tie_embeddings=r.get("tie_word_embeddings", False))
    n_experts = r.get("num_local_experts", 8)
    top_k = r.get("num_experts_per_tok", 2)
    d_e = r.get("intermediate_size", 11008)
    if n_experts > 0:
        out["moe"] = dict(n_experts=n_experts, top_k=top_k, d_ff_expert=d_e, d_ff_shared=shared)
    return out


#: Qwen3.5's multimodal wrappers: their decoders (gated DeltaNet with a gated attention output) are mapped in
#: lmcost.model.hf.linear_attention.
register(Wrapper(model_type="qwen3_5", text_type="qwen3_5_text", ties=False))
register(Wrapper(model_type="qwen3_5_moe", text_type="qwen3_5_moe_text", ties=False))

#: The model types this file maps (tests/test_hybrid.py walks them).
FAMILIES = mapped_in(__name__)
