"""Hugging Face mappings of state-space families: stacks of Mamba-1 (selective scan) or Mamba-2 (SSD) layers,
alone or beside attention.

Each function is registered (:func:`lmcost.model.hf.registry.family`) for its ``model_type``: (reader,
model_type) -> ArchConfig fields. Checked exactly against transformers (tests/test_ssm.py, test_params.py,
test_flop_oracle.py): parameters of the default config on the meta device, matmul FLOPs of a tiny instance in
prefill and decode, and the bytes of the cache object (conv and SSM states, keys and values).
- ``mamba``: MambaModel: embeddings, pre-norm blocks of a Mamba-1 mixer alone (no FFN), norm_f, lm_head.
- ``falcon_mamba``: as mamba, with RMSNorms without weight on dt, B and C after x_proj.
- ``mamba2``: Mamba2Model: pre-norm blocks of a Mamba-2 mixer alone.
- ``jamba``: pre-norm layers of a Mamba-1 mixer (weighted RMSNorms on dt, B, C) or attention (GQA, no
  positions), each with a SwiGLU MLP or a MoE of SwiGLU experts (softmax top-k, no shared expert).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import activation
from lmcost.model.hf.registry import family, mapped_in

#: Keys of the Mamba configs that change nothing lmcost counts: initialisation, kernel choices, the dt clamp,
#: the residual's dtype.
_MAMBA_NO_COST = ("time_step_scale", "time_step_min", "time_step_max", "time_step_init_scheme", "time_step_floor",
                  "time_step_limit", "rescale_prenorm_residual", "residual_in_fp32", "use_mambapy",
                  "use_falcon_mambapy", "use_associative_scan", "use_mamba_kernels", "num_logits_to_keep")


def _refuse(r, key: str, what: str, fix: str):
    raise LmcostError(f"{r.source}: {key}", what, fix)


def _no_cost(r):
    for key in _MAMBA_NO_COST:
        r.get(key, None)


def _silu_conv(r, key: str):
    """The conv's activation must be SiLU (the only one modelled after the depthwise conv)."""
    if r.get(key, "silu") != "silu":
        _refuse(r, key, "only SiLU after the Mamba conv is modelled", f"set {key}: silu")


def _d_inner(r, d: int) -> int:
    """MambaMixer's intermediate_size: the config's, else expand * hidden_size (MambaConfig derives it only
    when it is not given)."""
    d_in = r.count("expand", 2) * d
    stored = r.get("intermediate_size", None, kind=int)
    return d_in if stored is None else stored


def _dt_rank(r, key: str, d: int) -> int:
    """dt_rank: "auto" is ceil(hidden_size / 16) (MambaConfig)."""
    rank = r.get(key, "auto", kind=object)
    if rank == "auto":
        return -(-d // 16)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        _refuse(r, key, f"{rank!r:.20} is not a width", f"give {key} as a whole number >= 1 or \"auto\"")
    return rank


def _mamba_stack(r, mt: str, bc_dt_norm: str) -> dict:
    """MambaConfig / FalconMambaConfig -> ArchConfig fields: blocks of norm, Mamba-1 mixer, residual."""
    _no_cost(r)
    _silu_conv(r, "hidden_act")
    d = r.get("hidden_size", 768)
    n_layers = r.get("num_hidden_layers", 32)
    mamba = dict(d_inner=_d_inner(r, d), dt_rank=_dt_rank(r, "time_step_rank", d),
                 d_state=r.get("state_size", 16), d_conv=r.get("conv_kernel", 4),
                 conv_bias=r.get("use_conv_bias", True), proj_bias=r.get("use_bias", False), bc_dt_norm=bc_dt_norm)
    return dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 50280),
                recurrent=dict(layer_pattern=["mamba"], ffn_pattern=["none"], mamba=mamba),
                norm="rmsnorm", block="pre_norm", positions="none", tie_embeddings=r.get("tie_word_embeddings", True))


@family("mamba")
def mamba(r, mt: str) -> dict:
    """MambaConfig -> ArchConfig fields (transformers MambaForCausalLM: embeddings, MambaBlocks, norm_f, lm_head
    tied by default). Refused: hidden_act other than SiLU (the conv's activation)."""
    return _mamba_stack(r, mt, "none")


@family("falcon_mamba")
def falcon_mamba(r, mt: str) -> dict:
    """FalconMambaConfig -> ArchConfig fields: Mamba's, with FalconMambaMixer's RMSNorms without weight on dt,
    B and C (mixer_rms_eps, no cost)."""
    return _mamba_stack(r, mt, "weightless")


@family("mamba2")
def mamba2(r, mt: str) -> dict:
    """Mamba2Config -> ArchConfig fields (transformers Mamba2ForCausalLM: embeddings, Mamba2Blocks of norm,
    Mamba2Mixer, residual; norm_f; lm_head). ``time_step_rank`` is read and unused, as Mamba2Mixer ignores it.
    Refused: num_heads x head_dim other than expand x hidden_size (Mamba2Config refuses it); hidden_act other
    than SiLU."""
    _no_cost(r)
    _silu_conv(r, "hidden_act")
    r.get("time_step_rank", None, kind=object)
    d = r.get("hidden_size", 4096)
    heads, head_dim = r.count("num_heads", 128), r.count("head_dim", 64)
    if heads * head_dim != r.count("expand", 2) * d:
        _refuse(r, "num_heads", f"{heads} heads x head_dim {head_dim} is not expand x hidden_size = "
                f"{r.count('expand', 2) * d}, which Mamba2Config requires", "make num_heads x head_dim = expand x hidden_size")
    m = dict(n_heads=heads, head_dim=head_dim, d_state=r.get("state_size", 128), n_groups=r.get("n_groups", 8),
             d_conv=r.get("conv_kernel", 4), chunk_size=r.get("chunk_size", 256),
             conv_bias=r.get("use_conv_bias", True), proj_bias=r.get("use_bias", False))
    return dict(d_model=d, n_layers=r.get("num_hidden_layers", 64), vocab_size=r.get("vocab_size", 32768),
                recurrent=dict(layer_pattern=["mamba2"], ffn_pattern=["none"], mamba2=m),
                norm="rmsnorm", block="pre_norm", positions="none", tie_embeddings=r.get("tie_word_embeddings", False))


@family("jamba")
def jamba(r, mt: str) -> dict:
    """JambaConfig -> ArchConfig fields (transformers JambaForCausalLM: pre-norm layers, attention iff
    i % attn_layer_period == attn_layer_offset, else a Mamba-1 mixer with weighted RMSNorms on dt, B, C;
    the FFN a MoE of num_experts SwiGLU experts of intermediate_size iff num_experts > 1 and
    i % expert_layer_period == expert_layer_offset, else a SwiGLU MLP; no positional encoding).
    Refused: hidden_act other than SiLU (the MLP's and the Mamba conv's activation)."""
    _no_cost(r)
    _silu_conv(r, "hidden_act")
    d = r.get("hidden_size", 4096)
    n_layers = r.get("num_hidden_layers", 32)
    a_per, a_off = r.count("attn_layer_period", 8), r.get("attn_layer_offset", 4)
    e_per, e_off = r.count("expert_layer_period", 2), r.get("expert_layer_offset", 1)
    for key, off, per in (("attn_layer_offset", a_off, a_per), ("expert_layer_offset", e_off, e_per)):
        if not 0 <= off < per:
            _refuse(r, key, f"{off} is not in 0..{per - 1}, which JambaConfig requires", "give an offset below the period")
    n_experts = r.get("num_experts", 16)
    mamba = dict(d_inner=r.count("mamba_expand", 2) * d, dt_rank=_dt_rank(r, "mamba_dt_rank", d),
                 d_state=r.get("mamba_d_state", 16), d_conv=r.get("mamba_d_conv", 4),
                 conv_bias=r.get("mamba_conv_bias", True), proj_bias=r.get("mamba_proj_bias", False),
                 bc_dt_norm="weighted")
    d_ff = r.get("intermediate_size", 14336)
    h = r.get("num_attention_heads", 32)
    out = dict(d_model=d, n_layers=n_layers, vocab_size=r.get("vocab_size", 65536),
               attention=dict(n_heads=h, n_kv_heads=r.get("num_key_value_heads", 8)),
               ffn=dict(activation=activation(r, "hidden_act", "silu", True), d_ff=d_ff),
               recurrent=dict(layer_pattern=["global" if i % a_per == a_off else "mamba" for i in range(n_layers)],
                              mamba=mamba),
               norm="rmsnorm", block="pre_norm", positions="none", tie_embeddings=r.get("tie_word_embeddings", False))
    dense = [i for i in range(n_layers) if n_experts <= 1 or i % e_per != e_off]
    if len(dense) < n_layers:
        out["moe"] = dict(n_experts=n_experts, top_k=r.get("num_experts_per_tok", 2), d_ff_expert=d_ff,
                          dense_layers=dense)
    else:
        r.get("num_experts_per_tok", None, kind=int)
    return out


#: The model types this file maps (tests/test_ssm.py walks them).
FAMILIES = mapped_in(__name__)
