"""The token mixers of hybrid stacks that keep a constant-size state per sequence (Mamba-2, LFM2's short
convolution, the gated DeltaNet, ...): their widths, and the ``recurrent`` section that says which mixer and FFN
each layer has. Their operators: :mod:`lmcost.operators.recurrent`. A new mixer is a schema here, a kind in
RECURRENT_KINDS and a field of :class:`Recurrent`."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import model_validator

from lmcost.model.schema import ATTENTION_KINDS, PositiveInt, _Strict

#: Token mixers with a constant-size state, entries of a config's ``recurrent.layer_pattern`` (their operators:
#: :mod:`lmcost.operators.recurrent`).
RECURRENT_KINDS = ("mamba2", "short_conv", "gated_deltanet", "lightning", "mamba", "rg_lru", "rwkv4", "mlstm")
#: Token mixers with a constant-size state (:mod:`lmcost.operators.recurrent`), entries of ``recurrent.layer_pattern``
#: beside the attention kinds; ``none`` is a block with no mixer (Nemotron-H's MLP and MoE blocks).
MIXER_KINDS = ATTENTION_KINDS + RECURRENT_KINDS + ("none",)
FFN_KINDS = ("dense", "moe", "none", "rwkv4_channel")


class Mamba2(_Strict):
    """A Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs", section 7; HF Mamba2Mixer/NemotronHMamba2Mixer).

    in_proj d -> [z (d_in), x (d_in), B (g*N), C (g*N), dt (h)] with d_in = n_heads*head_dim; a depthwise
    causal conv of d_conv taps over x, B, C; the SSD scan with state [n_heads, head_dim, d_state] per sequence
    (computed in chunks of chunk_size); gated RMSNorm over d_in (in n_groups groups); out_proj d_in -> d.
    """

    n_heads: PositiveInt
    head_dim: PositiveInt
    d_state: PositiveInt
    n_groups: PositiveInt = 1
    d_conv: PositiveInt = 4
    chunk_size: PositiveInt = 256
    conv_bias: bool = True
    proj_bias: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.n_heads % self.n_groups:
            raise ValueError(f"n_groups: {self.n_groups} does not divide n_heads={self.n_heads}; "
                             "set n_groups to a divisor of n_heads")
        return self


class ShortConv(_Strict):
    """LFM2's gated short convolution (Liquid AI, LFM2 technical report; HF Lfm2ShortConv): in_proj d -> 3d
    (B, C, x), B*x, a depthwise causal conv of d_conv taps (conv_L_cache), C*., out_proj d -> d.
    ``bias``: on in_proj, out_proj and the conv (HF ``conv_bias``)."""

    d_conv: PositiveInt = 3
    bias: bool = False


class GatedDeltaNet(_Strict):
    """A gated DeltaNet mixer (Yang et al. 2024, "Gated Delta Networks"; HF Qwen3NextGatedDeltaNet):
    q, k [n_k_heads, d_k] and v, z [n_v_heads, d_v] and per-v-head b, a; a depthwise causal conv of d_conv
    taps over q, k, v; the gated delta rule with state [n_v_heads, d_k, d_v] per sequence; gated RMSNorm
    per head over d_v; out_proj n_v_heads*d_v -> d."""

    n_k_heads: PositiveInt
    n_v_heads: PositiveInt
    d_k: PositiveInt
    d_v: PositiveInt
    d_conv: PositiveInt = 4
    chunk_size: PositiveInt = 64

    @model_validator(mode="after")
    def _check(self):
        if self.n_v_heads % self.n_k_heads:
            raise ValueError(f"n_v_heads: {self.n_v_heads} is not a multiple of n_k_heads={self.n_k_heads}; "
                             "set n_v_heads to a multiple of n_k_heads")
        return self


class Lightning(_Strict):
    """MiniMax's lightning attention (MiniMax-01, arXiv 2501.08313, section 2.2.1; HF MiniMaxLightningAttention):
    qkv_proj d -> 3*h*d_h then SiLU; linear attention per head with a fixed per-head decay, in blocks of
    block_size (intra-block QKᵀ with the decay mask, inter-block through the state KᵀV [h, d_h, d_h], kept
    in the model dtype); RMSNorm over h*d_h; a sigmoid output gate from d; out_proj h*d_h -> d."""

    n_heads: PositiveInt
    head_dim: PositiveInt
    block_size: PositiveInt = 256
class Mamba(_Strict):
    """A Mamba-1 mixer (Gu & Dao 2023, "Mamba", section 3 and Algorithm 2; HF MambaMixer/JambaMambaMixer).

    in_proj d -> [x (d_inner), z (d_inner)]; a depthwise causal conv of d_conv taps (+ SiLU) over x; x_proj
    d_inner -> [dt (dt_rank), B (d_state), C (d_state)]; dt_proj dt_rank -> d_inner (its bias is the scan's
    delta bias); the selective scan with state [d_inner, d_state] per sequence; D skip; y * SiLU(z); out_proj
    d_inner -> d. ``bc_dt_norm``: RMSNorms over dt, B and C after x_proj: ``weighted`` (Jamba), ``weightless``
    (Falcon-Mamba), ``none`` (Mamba)."""

    d_inner: PositiveInt
    dt_rank: PositiveInt
    d_state: PositiveInt = 16
    d_conv: PositiveInt = 4
    conv_bias: bool = True
    proj_bias: bool = False
    bc_dt_norm: Literal["none", "weighted", "weightless"] = "none"


class RGLRU(_Strict):
    """Griffin's recurrent block (De et al. 2024, "Griffin", section 2.4 and fig. 2; HF
    RecurrentGemmaRecurrentBlock): y = GeLU(W_y x), u = conv(W_x x) (a depthwise causal conv of d_conv taps,
    with bias), the RG-LRU over u (its input and recurrence gates block-diagonal in n_blocks blocks of
    width/n_blocks, with biases), W_out (RG-LRU(u) * y); all three projections with biases.
    ``width``: the RG-LRU width (HF lru_width)."""

    width: PositiveInt
    n_blocks: PositiveInt
    d_conv: PositiveInt = 4

    @model_validator(mode="after")
    def _check(self):
        if self.width % self.n_blocks:
            raise ValueError(f"n_blocks: {self.n_blocks} does not divide width={self.width}; "
                             "set n_blocks to a divisor of width")
        return self


class RWKV4(_Strict):
    """RWKV-4's time mixing (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era", section 4.1-4.2;
    HF RwkvSelfAttention): token shift, key/value/receptance projections d -> width, the WKV recurrence with
    per-channel decay and bonus, sigmoid(r) * wkv, output width -> d. Its layers' FFN is the channel mixing,
    ffn_pattern ``rwkv4_channel`` (token shift, key d -> ffn.d_ff, squared ReLU, value d_ff -> d, a sigmoid
    receptance gate d -> d). ``width``: HF attention_hidden_size (null: d_model)."""

    width: Optional[PositiveInt] = None


class MLSTM(_Strict):
    """xLSTM's mLSTM layer (Beck et al. 2024, "xLSTM", section 2.3; as xLSTM 7B, Beck et al. 2025, and HF
    xLSTMLayer): q, k [n_heads, qk_dim/n_heads], v and an output gate [v_dim] from d, input and forget gates per
    head (with biases, soft-capped); the matrix memory C [qk_dim/n_heads, v_dim/n_heads] per head with its normalizer n
    and stabilizer m, run in chunks of chunk_size (the chunkwise form) and the remainder step by step; a LayerNorm
    per head; sigmoid(o) * h; out_proj v_dim -> d."""

    n_heads: PositiveInt
    qk_dim: PositiveInt
    v_dim: PositiveInt
    chunk_size: PositiveInt = 64
    #: The input and forget gates' soft cap c * tanh(g / c) (HF gate_soft_cap); null: none.
    gate_softcap: Optional[float] = 15.0

    @model_validator(mode="after")
    def _check(self):
        if self.qk_dim % self.n_heads or self.v_dim % self.n_heads:
            raise ValueError(f"n_heads: {self.n_heads} does not divide qk_dim={self.qk_dim} and v_dim={self.v_dim}; "
                             "set n_heads to a common divisor")
        return self


class Recurrent(_Strict):
    """Hybrid layer stacks: the widths of each constant-state mixer and which mixer and FFN each layer has.

    ``layer_pattern`` (repeated over the layers, like attention.layer_pattern, which it replaces) names each
    layer's mixer: an attention kind (ATTENTION_KINDS), a constant-state mixer (RECURRENT_KINDS: ``mamba2``,
    ``short_conv``, ``gated_deltanet``, ...) or ``none``. ``ffn_pattern`` (repeated likewise) names each layer's FFN: ``dense``, ``moe`` or ``none``;
    without it the moe section decides as in a transformer. A layer with neither is refused.
    """

    layer_pattern: list[Literal[MIXER_KINDS]]
    ffn_pattern: Optional[list[Literal[FFN_KINDS]]] = None
    mamba2: Optional[Mamba2] = None
    short_conv: Optional[ShortConv] = None
    gated_deltanet: Optional[GatedDeltaNet] = None
    lightning: Optional[Lightning] = None
    mamba: Optional[Mamba] = None
    rg_lru: Optional[RGLRU] = None
    rwkv4: Optional[RWKV4] = None
    mlstm: Optional[MLSTM] = None

    @model_validator(mode="after")
    def _check(self):
        if not self.layer_pattern:
            raise ValueError("layer_pattern: empty; name each layer's mixer (global, mamba2, short_conv, ...)")
        if self.ffn_pattern is not None and not self.ffn_pattern:
            raise ValueError("ffn_pattern: empty; name each layer's FFN (dense, moe, none), or remove it")
        for kind in RECURRENT_KINDS:
            if kind in self.layer_pattern and getattr(self, kind) is None:
                raise ValueError(f"{kind}: layer_pattern has {kind} layers but no {kind} section; "
                                 f"add recurrent.{kind} with its widths")
        return self


#: What a stack of constant-state mixers alone (Mamba, Mamba-2) writes for the ``attention`` and ``ffn`` sections
#: it has no use for (:func:`fill_unused_sections`): no layer reads them.
UNUSED_ATTENTION = {"n_heads": 1}
UNUSED_FFN = {"activation": "silu", "d_ff": 1}


def fill_unused_sections(data):
    """A config (dict, before validation) whose ``recurrent.layer_pattern`` names no attention kind may leave
    out ``attention``, and one whose ``recurrent.ffn_pattern`` is all ``none`` may leave out ``ffn``: they get
    UNUSED_ATTENTION / UNUSED_FFN, which no layer reads (pure Mamba and Mamba-2 stacks). Anything else is
    returned as given (validation then names what is missing)."""
    rec = data.get("recurrent") if isinstance(data, dict) else None
    if not isinstance(rec, dict) or not isinstance(rec.get("layer_pattern"), list):
        return data
    data = dict(data)
    if "attention" not in data and not any(k in ATTENTION_KINDS for k in rec["layer_pattern"]):
        data["attention"] = dict(UNUSED_ATTENTION)
    ffns = rec.get("ffn_pattern")
    if "ffn" not in data and isinstance(ffns, list) and ffns and all(f == "none" for f in ffns):
        data["ffn"] = dict(UNUSED_FFN)
    return data
