"""The architecture of a decoder-only transformer, validated once into a frozen pydantic model.

A model file is YAML (lmcost's own schema, see ``lmcost/data/models/llama-3-8b.yaml``) or a Hugging Face
``config.json`` (mapped by :mod:`lmcost.model.hf.families`). Shipped models are found by name (``llama-3-8b``).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal, Optional, Union

from pydantic import Field, model_validator

from lmcost.basics.errors import LmcostError
from lmcost.model.layer_sharing import AltUp, PerLayerInput, check_sharing, shared_kinds
from lmcost.model.mixers import FFN_KINDS, MIXER_KINDS, RECURRENT_KINDS, GatedDeltaNet, Mamba2, Recurrent, ShortConv  # noqa: F401
from lmcost.model.mixers import fill_unused_sections
from lmcost.model.quant import RECIPES
from lmcost.model.sparse import SparseAttention
from lmcost.model.schema import (ATTENTION_KINDS, MAX_LAYERS, MAX_POSITIONS, MAX_VOCAB, MAX_WIDTH,  # noqa: F401
                                 LayerCount, PositiveInt, Positions, _Strict, has_rope, mask_of)

#: xielu: Apertus's xIELU (Huang et al. 2024, arXiv 2411.13010), a plain activation with two learned scalars
#: per layer (:mod:`lmcost.operators.xielu`).
#: relu2_glu: the squared ReLU gated, relu(x W_gate)^2 * x W_up (BitNet b1.58's MLP).
Activation = Literal["relu", "relu2", "gelu", "silu", "glu", "reglu", "geglu", "swiglu", "xielu", "relu2_glu"]
#: Gated FFNs multiply act(x W_gate) by x W_up and so carry three matrices (Shazeer 2020, "GLU Variants").
GATED = {"glu", "reglu", "geglu", "swiglu", "relu2_glu"}


class MLA(_Strict):
    """Multi-head latent attention (DeepSeek-V2, section 2.1): K and V are rebuilt from a cached latent.

    The cache holds per token the latent c_KV (kv_lora_rank = d_c) and one shared RoPE key (d_r).
    """

    q_lora_rank: Optional[PositiveInt] = None
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: PositiveInt = 64
    v_head_dim: PositiveInt


class Attention(_Strict):
    """Attention of every layer. ``n_kv_heads`` = ``n_heads`` is MHA, 1 is MQA, between is GQA.

    ``layer_pattern`` repeats over the layers; ``local`` layers attend to the last ``sliding_window``
    tokens only, ``chunked`` layers to the keys of their own chunk of ``chunk_size`` positions, and a
    ``_nope`` kind (``global_nope``...) applies no RoPE (see ATTENTION_KINDS). With a window and no
    pattern every layer is local (Mistral-7B-v0.1).
    """

    n_heads: PositiveInt
    n_kv_heads: Optional[PositiveInt] = None
    head_dim: Optional[PositiveInt] = None
    qkv_bias: bool = False
    out_bias: bool = False
    #: head/full: RMSNorm with weights per head / over the projection; l2: per head without weights, on
    #: the layers with RoPE only (Llama 4's Llama4TextL2Norm); head_layernorm: a LayerNorm with weight and bias
    #: per head (Persimmon's q_layernorm/k_layernorm).
    qk_norm: Literal["none", "head", "full", "l2", "head_layernorm"] = "none"
    sliding_window: Optional[Positions] = None
    layer_pattern: Optional[list[Literal[ATTENTION_KINDS]]] = None
    mla: Optional[MLA] = None
    #: Chunked layers (Llama 4): a query attends only to the keys of its own chunk of chunk_size positions.
    chunk_size: Optional[Positions] = None
    #: Attention sinks (gpt-oss): one learned logit per head joins each query's softmax (h params per layer);
    #: ``local``: on the sliding-window layers only (MiMo-V2-Flash).
    sinks: Union[bool, Literal["local"]] = False
    #: Gemma-2: scores become c * tanh(scores / c) before the softmax (not expressible in a fused kernel).
    logit_softcap: Optional[float] = None
    #: Llama 4: on NoPE layers queries are scaled by log1p(floor((pos + 1) / floor_scale)) * attn_scale + 1.
    temperature_tuning: bool = False
    #: Qwen3-Next's gated attention: q_proj also yields a gate per head [h*d_h] (q_proj is [d, 2*h*d_h], each
    #: head's query then gate), and the attention output is multiplied by sigmoid(gate) before o_proj.
    output_gate: bool = False
    #: Beam's gate bias: one learned bias per head added to the output gate before its sigmoid (gate_bias [h],
    #: broadcast over d_h); needs output_gate.
    output_gate_bias: bool = False
    #: Laguna's softplus output gate (:mod:`lmcost.operators.output_gate`): g_proj [d, h] (``head``: one gate per
    #: head, broadcast over d_h) or [d, h*d_h] (``element``), and the attention output times softplus(x W_g).
    softplus_gate: Optional[Literal["head", "element"]] = None
    #: MiMo-V2-Flash (:mod:`lmcost.operators.layer_heads`): value heads of this width beside q/k heads of head_dim
    #: (v_proj [d, h_kv*v_head_dim], o_proj [h*v_head_dim, d]); null: head_dim.
    v_head_dim: Optional[PositiveInt] = None
    #: MiMo-V2-Flash: the KV heads of the local (sliding-window) layers, where they differ from n_kv_heads.
    local_kv_heads: Optional[PositiveInt] = None
    #: JetMoE's mixture of attention heads (:mod:`lmcost.operators.mixture_of_attention`): q_proj and o_proj are
    #: moa_experts experts of n_kv_heads heads each, of which a router picks n_heads / n_kv_heads per token.
    moa_experts: Optional[PositiveInt] = None
    #: Doge's dynamic mask attention (:mod:`lmcost.operators.dynamic_mask`): a bias per key and KV head from the
    #: values, dt_proj [h_kv*d_h, h_kv] (+ bias with qkv_bias) and A [h_kv], added to every score.
    dynamic_mask: bool = False
    #: DeepSeek Sparse Attention (:mod:`lmcost.model.sparse`): a lightning indexer picks each query's top_k keys.
    sparse: Optional[SparseAttention] = None
    #: DBRX: q, k and v are clamped to [-clip_qkv, clip_qkv] after their projection (an elementwise pass).
    clip_qkv: Optional[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = None
    #: Gemma 3n/4 (:mod:`lmcost.model.layer_sharing`): the last kv_shared_layers layers reuse an earlier layer's
    #: K/V; k_eq_v "global": the global layers' k_proj serves as values; v_norm: a weightless RMSNorm on values;
    #: global_head_dim/global_n_kv_heads: the global layers' own widths.
    kv_shared_layers: Annotated[int, Field(ge=0, le=MAX_LAYERS)] = 0
    k_eq_v: Literal["none", "global"] = "none"
    v_norm: bool = False
    global_head_dim: Optional[PositiveInt] = None
    global_n_kv_heads: Optional[PositiveInt] = None
    #: DiffLlama's differential attention (:mod:`lmcost.operators.differential`): two softmax maps over q and k, one
    #: per half of the value heads, the second subtracted with a learned weight (4 vectors [d_h] per layer).
    differential: bool = False

    @model_validator(mode="after")
    def _check(self):
        h_kv = self.n_kv_heads or self.n_heads
        if self.n_heads % h_kv:
            raise ValueError(f"n_kv_heads: {h_kv} does not divide n_heads={self.n_heads}; "
                             f"set n_kv_heads to a divisor of {self.n_heads}")
        if self.layer_pattern is not None and any(mask_of(k) == "local" for k in self.layer_pattern) \
                and self.sliding_window is None:
            raise ValueError("sliding_window: not set, but layer_pattern has local layers; "
                             "set attention.sliding_window")
        if self.mla is not None and self.qk_norm != "none":
            raise ValueError("qk_norm: not modelled with mla (its latent has kv_a_norm); set qk_norm: none")
        if self.layer_pattern is not None and not self.layer_pattern:
            raise ValueError("layer_pattern: empty; give at least one of local/global, or remove it")
        if self.layer_pattern is not None and any(mask_of(k) == "chunked" for k in self.layer_pattern) \
                and self.chunk_size is None:
            raise ValueError("chunk_size: not set, but layer_pattern has chunked layers; set attention.chunk_size")
        if self.mla is not None and (self.sinks or self.temperature_tuning or self.logit_softcap is not None
                                     or any(k.endswith("_nope") or k == "chunked" for k in self.layer_pattern or [])):
            raise ValueError("mla: sinks, soft-capping, temperature tuning, chunked and NoPE layers are not modelled "
                             "with mla; remove them or the mla section")
        if self.output_gate_bias and not self.output_gate:
            raise ValueError("output_gate_bias: a bias of the output gate needs output_gate: true; set it or remove the bias")
        if self.mla is not None and (self.output_gate or self.softplus_gate):
            raise ValueError("output_gate: not modelled with mla; remove it or the mla section")
        if self.output_gate and self.softplus_gate:
            raise ValueError("softplus_gate: one output gate per layer; remove output_gate or softplus_gate")
        if self.local_kv_heads is not None and self.n_heads % self.local_kv_heads:
            raise ValueError(f"local_kv_heads: {self.local_kv_heads} does not divide n_heads={self.n_heads}; "
                             f"set local_kv_heads to a divisor of {self.n_heads}")
        if (self.v_head_dim or self.local_kv_heads) and (self.mla is not None or self.output_gate or self.softplus_gate):
            raise ValueError("v_head_dim: value heads of their own width and local_kv_heads are not modelled with mla "
                             "or an output gate; remove them or those")
        if self.v_head_dim and (self.differential or self.clip_qkv or self.k_eq_v != "none" or self.v_norm):
            raise ValueError("v_head_dim: value heads of their own width are not modelled with differential, clip_qkv, "
                             "k_eq_v or v_norm; remove v_head_dim or those")
        if self.moa_experts is not None and self.moa_experts < self.n_heads // (self.n_kv_heads or self.n_heads):
            raise ValueError(f"moa_experts: {self.moa_experts} experts, but each token picks n_heads / n_kv_heads = "
                             f"{self.n_heads // (self.n_kv_heads or self.n_heads)}; give at least that many")
        if self.moa_experts is not None and (self.mla is not None or self.output_gate or self.softplus_gate
                                             or self.v_head_dim or self.local_kv_heads):
            raise ValueError("moa_experts: a mixture of attention heads is not modelled with mla, output gates, "
                             "v_head_dim or local_kv_heads; remove them or moa_experts")
        if self.dynamic_mask and (self.mla is not None or self.chunk_size or self.moa_experts):
            raise ValueError("dynamic_mask: not modelled with mla, chunked layers or a mixture of heads; remove it or "
                             "chunk_size/mla/moa_experts")
        if self.sparse is not None:
            SparseAttention.check_attention(self)
        if self.differential and (self.mla is not None or self.sinks or (self.n_kv_heads or self.n_heads) % 2
                                  or self.n_heads % 2):
            raise ValueError("differential: needs an even number of heads and of KV heads, without mla or sinks; "
                             "set n_kv_heads even, or remove differential")
        if self.logit_softcap is not None and not self.logit_softcap > 0:
            raise ValueError(f"logit_softcap: must be > 0, got {self.logit_softcap}; use null for no capping")
        return self

    @model_validator(mode="after")
    def _check_clip_qkv(self):
        if self.mla is not None and self.clip_qkv is not None:
            raise ValueError("clip_qkv: not modelled with mla; remove it or the mla section")
        return self


class FFN(_Strict):
    """The dense feed-forward block: up (and gate, if gated), activation, down."""

    activation: Activation
    d_ff: PositiveInt
    bias: bool = False
    #: gpt-oss's clamped SwiGLU (both set, swiglu only): g = min(gate, limit), u = clamp(up, -limit, limit),
    #: out = (u + 1) * g * sigmoid(alpha * g) (transformers GptOssExperts._apply_gate).
    swiglu_limit: Optional[float] = None
    swiglu_alpha: Optional[float] = None
    #: Gemma 4's use_double_wide_mlp: the FFN of a KV-shared layer is 2*d_ff wide.
    kv_shared_double: bool = False

    @model_validator(mode="after")
    def _check(self):
        if (self.swiglu_limit is None) != (self.swiglu_alpha is None):
            raise ValueError("swiglu_limit: give swiglu_limit and swiglu_alpha together, or neither")
        if self.swiglu_limit is not None and not (self.swiglu_limit > 0 and self.swiglu_alpha > 0):
            raise ValueError(f"swiglu_limit: the clamp limit and swiglu_alpha must be > 0, got {self.swiglu_limit} and "
                             f"{self.swiglu_alpha}; give gpt-oss's figures (7.0 and 1.702) or remove both")
        if self.swiglu_limit is not None and self.activation != "swiglu":
            raise ValueError(f"swiglu_limit: the clamped SwiGLU needs activation swiglu, got {self.activation}; "
                             "set activation: swiglu or remove swiglu_limit/swiglu_alpha")
        return self


class MoE(_Strict):
    """Mixture of experts replacing the FFN in some layers.

    Layer i (0-based) is MoE when it is not in ``dense_layers`` and, if that list is not given,
    when i >= first_dense_layers and i % layer_freq == 0 (DeepSeek's first_k_dense_replace and
    moe_layer_freq). Shared experts run on every token; Qwen2-MoE also gates them with a d->1 projection.
    """

    n_experts: PositiveInt
    top_k: PositiveInt
    d_ff_expert: PositiveInt
    n_shared_experts: Annotated[int, Field(le=MAX_WIDTH)] = 0
    d_ff_shared: Optional[PositiveInt] = None
    shared_expert_gate: bool = False
    #: gpt-oss: a bias on the router [E] and on every expert's gate/up [2*d_e] and down [d] projections.
    router_bias: bool = False
    expert_bias: bool = False
    first_dense_layers: int = 0
    layer_freq: PositiveInt = 1
    dense_layers: Optional[list[int]] = None
    #: Variants of the MoE block (:mod:`lmcost.operators.moe_variants`): zero-computation (identity) experts the
    #: router may pick beside the n_experts FFN experts (LongCat-Flash), the MoE beside the layer's dense FFN
    #: (``shortcut``, LongCat-Flash's ScMoE), an RMSNorm on the MoE block's output (``post_norm``, A.X-K1).
    zero_experts: Annotated[int, Field(ge=0, le=MAX_WIDTH)] = 0
    shortcut: bool = False
    post_norm: bool = False
    #: JetMoE: one bias [d] added to the MoE block's combined output.
    output_bias: bool = False
    #: Gemma 4's layout (:func:`lmcost.operators.per_layer.normed_branch_ops`): the shared expert (its dense MLP)
    #: and the routed experts each have their own pre/post RMSNorms, and the router normalises its input and scales
    #: each expert's weight by a learned [E].
    normed_branches: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.top_k > self.n_experts + self.zero_experts:
            raise ValueError(f"top_k: {self.top_k} exceeds n_experts={self.n_experts}"
                             + (f" + zero_experts={self.zero_experts}" if self.zero_experts else "")
                             + "; set top_k <= n_experts")
        for name in ("n_shared_experts", "first_dense_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0; use 0 for none")
        return self

    @property
    def d_sh(self) -> int:
        """Total width of the shared experts (they act as one FFN of this width)."""
        if self.d_ff_shared is not None:
            return self.d_ff_shared
        return self.n_shared_experts * self.d_ff_expert


class ArchConfig(_Strict):
    """A decoder-only transformer (or a bare stack of blocks). Widths are counts of elements; nothing
    here depends on dtype.

    ``embeddings: false`` drops the token embedding, final norm and lm_head (a bare layer stack, like
    the BERT-large encoder layer of Ivanov et al. 2021); ``causal: false`` makes attention bidirectional;
    ``dropout`` and ``z_loss`` cost something only in a training step.

    Raises (at construction, as pydantic ValidationError turned into LmcostError by the loaders):
    heads that do not divide, a head width that cannot be derived, non-positive widths, unknown keys.
    """

    name: str
    aliases: list[str] = []
    source: str = ""
    d_model: PositiveInt
    n_layers: LayerCount
    vocab_size: Annotated[int, Field(gt=0, le=MAX_VOCAB)]
    attention: Attention
    ffn: FFN
    moe: Optional[MoE] = None
    #: Hybrid stacks: constant-state mixers (Mamba-2, gated DeltaNet, short conv) and per-layer mixer/FFN kinds.
    recurrent: Optional[Recurrent] = None
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_bias: bool = False
    #: False: the block and final norms have no learned weight or bias (OLMo-1's LayerNorm).
    norm_weight: bool = True
    block: Literal["pre_norm", "post_norm", "sandwich", "parallel"] = "pre_norm"
    parallel_shared_norm: bool = True
    final_norm: bool = True
    #: rope, a learned table, none, ALiBi (Press et al. 2022: a per-head linear bias on the scores, no table), or
    #: sinusoidal: a fixed table of sines and cosines added to the embeddings, no parameters (Vaswani et al.
    #: 2017, section 3.5; XGLM, CTRL).
    positions: Literal["rope", "learned", "none", "alibi", "sinusoidal"] = "rope"
    rotary_fraction: float = 1.0
    #: Learned positions: the rows of the position table (a prompt past it is refused). RoPE or no
    #: positions: the context the model was trained for (max_position_embeddings), past which
    #: estimates warn: the cost formulas still hold, the model's quality may not.
    max_positions: Optional[Positions] = None
    #: Learned positions: rows of the table past max_positions that no position uses (OPT and BioGPT offset
    #: positions by 2, a padding convention): parameters, not context.
    position_offset: Annotated[int, Field(ge=0, le=16)] = 0
    tie_embeddings: bool = False
    #: Doge: each residual add weights its skip per channel, w [d] * x + f(x) (:mod:`lmcost.operators.residual_scale`).
    residual_scale: bool = False
    #: BitNet's sub-layer norms (:mod:`lmcost.operators.sub_norms`): a norm (``norm``) of the attention output
    #: [h*d_h] before o_proj and of the FFN's inner activation [d_ff] before its down projection.
    sub_norms: bool = False
    #: BLOOM's word_embeddings_layernorm: a norm (``norm``, with ``norm_bias``) of the embeddings before the
    #: first block.
    embedding_norm: bool = False
    #: A bias on the lm_head (GPT-J, CodeGen, Phi-1/2): V parameters, kept when the weight is tied.
    lm_head_bias: bool = False
    #: A multimodal wrapper's vision tower and projector (elements, :mod:`lmcost.model.vision`): not part of the
    #: decoder's costs or its total; ``estimate --vision`` adds their weights to memory.
    vision_params: Annotated[int, Field(ge=0, le=10**15)] = 0  # a petaparameter is past any tower
    embeddings: bool = True
    causal: bool = True
    dropout: bool = False
    z_loss: bool = False
    #: Gemma-2: logits become c * tanh(logits / c) (final_logit_softcapping); null: no capping.
    final_logit_softcap: Optional[float] = None
    #: The checkpoint's quantization recipe (:mod:`lmcost.operators.quant`; an HF ``quantization_config`` maps to
    #: one): prefill, decode and memory read weights in it unless a run names its own (``--quant``).
    quant: Optional[str] = None
    #: Gemma 3n/4's per-layer input embeddings (PLE, :mod:`lmcost.model.layer_sharing`); null: none.
    per_layer_input: Optional[PerLayerInput] = None
    #: Gemma 3n's AltUp streams and LAuReL residuals (:class:`lmcost.model.layer_sharing.AltUp`); null: none.
    altup: Optional[AltUp] = None
    #: Multi-token prediction modules the checkpoint ships (DeepSeek-V3's MTP, DeepSeek-AI 2024 section 2.2; HF
    #: ``num_nextn_predict_layers``): not part of the decoder's costs; ``serve --spec mtp`` drafts with one.
    mtp_modules: Annotated[int, Field(ge=0, le=16)] = 0

    @model_validator(mode="before")
    @classmethod
    def _unused_sections(cls, data):
        return fill_unused_sections(data)  # a Mamba/Mamba-2 stack alone needs no attention or ffn section

    @model_validator(mode="after")
    def _check(self):
        a = self.attention
        if self.quant is not None:
            if self.quant not in RECIPES:
                raise ValueError(f"quant: unknown recipe {self.quant!r}; use one of {', '.join(RECIPES)}")
            if self.quant == "mxfp4" and self.moe is None:
                raise ValueError("quant: mxfp4 stores routed experts only (as gpt-oss) and this model has none; "
                                 "use nvfp4 for 4-bit weights everywhere")
        if a.head_dim is None and a.mla is None and self.d_model % a.n_heads:
            raise ValueError(f"attention: d_model={self.d_model} is not a multiple of n_heads={a.n_heads}; "
                             "set attention.head_dim explicitly")
        if not 0 < self.rotary_fraction <= 1:
            raise ValueError("rotary_fraction: must be in (0, 1]; use 1.0 for RoPE on the whole head")
        if self.final_logit_softcap is not None and not self.final_logit_softcap > 0:
            raise ValueError(f"final_logit_softcap: must be > 0, got {self.final_logit_softcap}; use null for none")
        m = self.moe
        if m is not None and m.dense_layers is not None and any(not 0 <= i < self.n_layers for i in m.dense_layers):
            raise ValueError(f"moe: dense_layers has an index outside 0..{self.n_layers - 1}; "
                             "list layer indices of this model")
        if m is not None and not any(f == "moe" for _, f in self.layer_kinds()):
            raise ValueError("moe: no layer is left a mixture of experts (first_dense_layers/layer_freq/dense_layers); "
                             "remove the moe section or lower first_dense_layers")
        if self.positions == "alibi" and (a.mla is not None or any(
                mask_of(k) != "global" for k, _ in self.layer_kinds() if k in ATTENTION_KINDS)):
            raise ValueError("positions: alibi is modelled on global attention without mla; use rope, or remove "
                             "the sliding-window/chunked layers and the mla section")
        if self.sub_norms and (m is not None or a.mla is not None):
            raise ValueError("sub_norms: modelled with dense FFNs and without mla (BitNet); remove the moe or mla "
                             "section, or sub_norms")
        if self.ffn.activation == "xielu" and m is not None:
            raise ValueError("ffn: xielu is modelled in dense FFNs only (Apertus); use another activation or "
                             "remove the moe section")
        if self.positions == "learned" and self.max_positions is None:
            raise ValueError("max_positions: missing, learned positions need it; set max_positions (rows of the table)")
        rec = self.recurrent
        if rec is not None:
            if a.layer_pattern is not None:
                raise ValueError("attention: layer_pattern is replaced by recurrent.layer_pattern in a hybrid; "
                                 "name the attention kinds in recurrent.layer_pattern and remove attention.layer_pattern")
            for name in ("layer_pattern", "ffn_pattern"):
                pattern = getattr(rec, name)
                if pattern is not None and len(pattern) > self.n_layers:
                    raise ValueError(f"recurrent: {name} has {len(pattern)} entries for {self.n_layers} layers; "
                                     "give one entry per layer, or a period that repeats")
            if any(mask_of(k) == "local" for k in rec.layer_pattern) and a.sliding_window is None:
                raise ValueError("recurrent: layer_pattern has local layers but attention.sliding_window is not set; "
                                 "set attention.sliding_window")
            if any(mask_of(k) == "chunked" for k in rec.layer_pattern) and a.chunk_size is None:
                raise ValueError("recurrent: layer_pattern has chunked layers but attention.chunk_size is not set; "
                                 "set attention.chunk_size")
            if rec.ffn_pattern is not None and "moe" in rec.ffn_pattern and m is None:
                raise ValueError("recurrent: ffn_pattern has moe layers but there is no moe section; add moe")
            if any(k == ("none", "none") for k in self.layer_kinds()):
                raise ValueError("recurrent: a layer has neither a mixer nor an FFN (layer_pattern none with "
                                 "ffn_pattern none); give it one")
            if self.block not in ("pre_norm",):
                raise ValueError(f"block: {self.block} is not modelled with recurrent layers; use pre_norm")
        if self.residual_scale and (rec is not None or self.block != "pre_norm"):
            raise ValueError("residual_scale: modelled on pre_norm blocks without recurrent layers; remove it or use "
                             "block: pre_norm")
        check_sharing(self)
        return self

    # ---- derived dims, computed here and nowhere else ----
    @property
    def h_kv(self) -> int:
        return self.attention.n_kv_heads or self.attention.n_heads

    @property
    def d_h(self) -> int:
        a = self.attention
        return a.head_dim or self.d_model // a.n_heads

    @property
    def d_rot(self) -> int:
        """Rotary width per head (r): RoPE rotates this many of d_h dims (0 without RoPE)."""
        if self.positions != "rope":
            return 0
        if self.attention.mla is not None:
            return self.attention.mla.qk_rope_head_dim
        return int(self.d_h * self.rotary_fraction)

    @property
    def gated(self) -> bool:
        return self.ffn.activation in GATED

    @property
    def attention_kind(self) -> str:
        """mha, gqa, mqa or mla; ``none`` for a stack with no attention layer (Mamba)."""
        if self.recurrent is not None and not any(k in ATTENTION_KINDS for k in self.recurrent.layer_pattern):
            return "none"
        if self.attention.mla is not None:
            return "mla"
        if self.h_kv == self.attention.n_heads:
            return "mha"
        return "mqa" if self.h_kv == 1 else "gqa"

    def layer_kinds(self) -> list[tuple[str, str]]:
        """Per layer: (mixer, ffn): the mixer one of ATTENTION_KINDS, or with a ``recurrent`` section one of
        MIXER_KINDS (a constant-state mixer, or ``none``); the ffn ``dense``, ``moe`` or ``none``."""
        a, rec = self.attention, self.recurrent
        pattern = a.layer_pattern or (["local"] if a.sliding_window else ["global"])
        if rec is not None:
            pattern = rec.layer_pattern
            if rec.ffn_pattern is not None:
                return [(pattern[i % len(pattern)], rec.ffn_pattern[i % len(rec.ffn_pattern)])
                        for i in range(self.n_layers)]
        kinds = []
        for i in range(self.n_layers):
            m = self.moe
            if m is None:
                moe = False
            elif m.dense_layers is not None:
                moe = i not in m.dense_layers
            else:
                moe = i >= m.first_dense_layers and i % m.layer_freq == 0
            kinds.append((pattern[i % len(pattern)], "moe" if moe else "dense"))
        return shared_kinds(kinds, a.kv_shared_layers)

    def layer_groups(self) -> list[tuple[str, str, int]]:
        """Groups of identical layers: (attention kind, ffn kind, number of layers), in first-seen order."""
        return [(a, f, n) for (a, f), n in Counter(self.layer_kinds()).items()]


def layers_note(cfg: ArchConfig, layers: int | None) -> str | None:
    """A note when ``layers`` asks for more blocks than ``cfg`` has (:func:`truncate` keeps them all), else
    None; the field in backticks, as a library note writes it."""
    if layers and layers > cfg.n_layers:
        return f"note: `layers` {layers} exceeds {cfg.name}'s {cfg.n_layers} layers: all {cfg.n_layers} are used"
    return None


def truncate(cfg: ArchConfig, n_layers: int) -> ArchConfig:
    """``cfg`` with only ``n_layers`` blocks, to profile a big model on a small device (``--layers N``).

    The layer pattern restarts from layer 0 as in the full model; a MoE model keeps at least one MoE
    layer (its leading dense layers are cut to n_layers - 1). Raises: LmcostError if n_layers < 1.
    """
    if n_layers < 1:
        raise LmcostError("layers", f"must be >= 1, got {n_layers}", "keep at least one block")
    if n_layers >= cfg.n_layers:
        return cfg
    data = cfg.model_dump()
    data["n_layers"] = n_layers
    m = data.get("moe")
    if m is not None:
        if m["dense_layers"] is not None:
            m["dense_layers"] = [i for i in m["dense_layers"] if i < n_layers - 1]
        m["first_dense_layers"] = min(m["first_dense_layers"], n_layers - 1)
        if not any(i >= m["first_dense_layers"] and i % m["layer_freq"] == 0 for i in range(n_layers)):
            m["layer_freq"] = 1
    # KV sharing: the last kv_shared_layers of the full model share; the first n_layers keep those among them
    data["attention"]["kv_shared_layers"] = max(0, cfg.attention.kv_shared_layers - (cfg.n_layers - n_layers))
    data["name"] = f"{cfg.name} ({n_layers} layers)"
    return ArchConfig.model_validate(data)
