"""The architecture of a decoder-only transformer, validated once into a frozen pydantic model.

A model file is YAML (lmcost's own schema, see ``models/llama-3-8b.yaml``) or a Hugging Face
``config.json`` (mapped by :mod:`lmcost.hf`). Shipped models are found by name (``llama-3-8b``).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import LmcostError

Activation = Literal["relu", "gelu", "silu", "glu", "reglu", "geglu", "swiglu"]
#: Gated FFNs multiply act(x W_gate) by x W_up and so carry three matrices (Shazeer 2020, "GLU Variants").
GATED = {"glu", "reglu", "geglu", "swiglu"}


#: A width or count of elements: positive, and small enough that products of a few stay exact in
#: float64 sweeps (2^31 is past any real vocabulary or width).
PositiveInt = Annotated[int, Field(gt=0, le=2**31)]
#: Layers: a loop runs over them, so a typo like 10^20 must not hang the tool.
LayerCount = Annotated[int, Field(gt=0, le=100_000)]


class _Strict(BaseModel):
    # strict: `d_ff: true` or `n_heads: "32"` is an error, not 1 or 32.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


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
    tokens only. With a window and no pattern every layer is local (Mistral-7B-v0.1).
    """

    n_heads: PositiveInt
    n_kv_heads: Optional[PositiveInt] = None
    head_dim: Optional[PositiveInt] = None
    qkv_bias: bool = False
    out_bias: bool = False
    qk_norm: Literal["none", "head", "full"] = "none"
    sliding_window: Optional[PositiveInt] = None
    layer_pattern: Optional[list[Literal["local", "global"]]] = None
    mla: Optional[MLA] = None

    @model_validator(mode="after")
    def _check(self):
        h_kv = self.n_kv_heads or self.n_heads
        if self.n_heads % h_kv:
            raise ValueError(f"n_kv_heads: {h_kv} does not divide n_heads={self.n_heads}; "
                             f"set n_kv_heads to a divisor of {self.n_heads}")
        if self.layer_pattern is not None and "local" in self.layer_pattern and self.sliding_window is None:
            raise ValueError("sliding_window: not set, but layer_pattern has local layers; "
                             "set attention.sliding_window")
        if self.mla is not None and self.qk_norm != "none":
            raise ValueError("qk_norm: not modelled with mla (its latent has kv_a_norm); set qk_norm: none")
        if self.layer_pattern is not None and not self.layer_pattern:
            raise ValueError("layer_pattern: empty; give at least one of local/global, or remove it")
        return self


class FFN(_Strict):
    """The dense feed-forward block: up (and gate, if gated), activation, down."""

    activation: Activation
    d_ff: PositiveInt
    bias: bool = False


class MoE(_Strict):
    """Mixture of experts replacing the FFN in some layers.

    Layer i (0-based) is MoE when it is not in ``dense_layers`` and, if that list is not given,
    when i >= first_dense_layers and i % layer_freq == 0 (DeepSeek's first_k_dense_replace and
    moe_layer_freq). Shared experts run on every token; Qwen2-MoE also gates them with a d->1 projection.
    """

    n_experts: PositiveInt
    top_k: PositiveInt
    d_ff_expert: PositiveInt
    n_shared_experts: int = 0
    d_ff_shared: Optional[PositiveInt] = None
    shared_expert_gate: bool = False
    first_dense_layers: int = 0
    layer_freq: PositiveInt = 1
    dense_layers: Optional[list[int]] = None

    @model_validator(mode="after")
    def _check(self):
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k: {self.top_k} exceeds n_experts={self.n_experts}; set top_k <= n_experts")
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
    vocab_size: PositiveInt
    attention: Attention
    ffn: FFN
    moe: Optional[MoE] = None
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_bias: bool = False
    block: Literal["pre_norm", "post_norm", "sandwich", "parallel"] = "pre_norm"
    parallel_shared_norm: bool = True
    final_norm: bool = True
    positions: Literal["rope", "learned", "none"] = "rope"
    rotary_fraction: float = 1.0
    #: Learned positions: the rows of the position table (a prompt past it is refused). RoPE or no
    #: positions: the context the model was trained for (max_position_embeddings), past which
    #: estimates warn: the cost formulas still hold, the model's quality may not.
    max_positions: Optional[PositiveInt] = None
    tie_embeddings: bool = False
    embeddings: bool = True
    causal: bool = True
    dropout: bool = False
    z_loss: bool = False
    #: The checkpoint's quantization recipe (:mod:`lmcost.quant`; an HF ``quantization_config`` maps to
    #: one): prefill, decode and memory read weights in it unless a run names its own (``--quant``).
    quant: Optional[str] = None

    @model_validator(mode="after")
    def _check(self):
        a = self.attention
        if self.quant is not None:
            from .quant import RECIPES

            if self.quant not in RECIPES:
                raise ValueError(f"quant: unknown recipe {self.quant!r}; use one of {', '.join(RECIPES)}")
        if a.head_dim is None and a.mla is None and self.d_model % a.n_heads:
            raise ValueError(f"attention: d_model={self.d_model} is not a multiple of n_heads={a.n_heads}; "
                             "set attention.head_dim explicitly")
        if not 0 < self.rotary_fraction <= 1:
            raise ValueError("rotary_fraction: must be in (0, 1]; use 1.0 for RoPE on the whole head")
        m = self.moe
        if m is not None and m.dense_layers is not None and any(not 0 <= i < self.n_layers for i in m.dense_layers):
            raise ValueError(f"moe: dense_layers has an index outside 0..{self.n_layers - 1}; "
                             "list layer indices of this model")
        if m is not None and not any(f == "moe" for _, f in self.layer_kinds()):
            raise ValueError("moe: no layer is left a mixture of experts (first_dense_layers/layer_freq/dense_layers); "
                             "remove the moe section or lower first_dense_layers")
        if self.positions == "learned" and self.max_positions is None:
            raise ValueError("max_positions: missing, learned positions need it; set max_positions (rows of the table)")
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
        """mha, gqa, mqa or mla."""
        if self.attention.mla is not None:
            return "mla"
        if self.h_kv == self.attention.n_heads:
            return "mha"
        return "mqa" if self.h_kv == 1 else "gqa"

    def layer_kinds(self) -> list[tuple[str, str]]:
        """Per layer: (``local``|``global``, ``dense``|``moe``)."""
        a = self.attention
        pattern = a.layer_pattern or (["local"] if a.sliding_window else ["global"])
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
        return kinds

    def layer_groups(self) -> list[tuple[str, str, int]]:
        """Groups of identical layers: (attention kind, ffn kind, number of layers), in first-seen order."""
        return [(a, f, n) for (a, f), n in Counter(self.layer_kinds()).items()]


def truncate(cfg: ArchConfig, n_layers: int) -> ArchConfig:
    """``cfg`` with only ``n_layers`` blocks, to profile a big model on a small device (``--layers N``).

    The layer pattern restarts from layer 0 as in the full model; a MoE model keeps at least one MoE
    layer (its leading dense layers are cut to n_layers - 1). Raises: LmcostError if n_layers < 1.
    """
    if n_layers < 1:
        raise LmcostError("--layers", f"must be >= 1, got {n_layers}", "keep at least one block")
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
    data["name"] = f"{cfg.name} ({n_layers} layers)"
    return ArchConfig.model_validate(data)
