"""The whole model as a list of operators for one forward pass, and the dims it is evaluated at.

Prefill and decode are the same graph at different dims (s = t = prompt; s = 1, t = context).
Data flows one way: ArchConfig + Dims -> ops (this module) -> roofline -> tables.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from lmcost.operators.altup import altup_block_ops, altup_input_ops, altup_output_ops
from lmcost.basics.dtypes import Precision
from lmcost.operators.ffn import dense_ffn_ops
from lmcost.operators.moe_variants import moe_layer_ops
from lmcost.basics.notation import symbols
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, add, elementwise, linear, lookup, norm
from lmcost.operators.per_layer import (layer_attention_ops, layer_dims, normed_branch_ops, per_layer_block_ops,
                                       per_layer_input_ops)
from lmcost.operators import rnn
from lmcost.operators.recurrent import RECURRENT_KINDS, recurrent_ops
from lmcost.operators.residual_scale import scaled_residual
from lmcost.operators.sinusoidal import sinusoidal_positions

KERNELS = ("flash", "naive")
MLA_MODES = ("absorbed", "naive")
LOGITS = ("all", "last")


@dataclass(frozen=True)
class Dims:
    """Every dimension a formula may use (names as in :mod:`lmcost.basics.notation`).

    Workload dims b, s, t may be ints, numpy arrays (broadcast together) or sympy Symbols; so may
    the model dims. Model dims a config does not use are 0.
    """

    b: Any
    s: Any
    t: Any
    d: Any
    h: Any
    h_kv: Any
    d_h: Any
    d_ff: Any
    V: Any
    L: Any
    w: Any = 0
    #: Chunk of a chunked attention layer (Llama 4's attention_chunk_size).
    C: Any = 0
    r: Any = 0
    P: Any = 0
    d_c: Any = 0
    d_q: Any = 0
    d_r: Any = 0
    d_nope: Any = 0
    d_v: Any = 0
    E: Any = 0
    k: Any = 0
    d_e: Any = 0
    d_sh: Any = 0
    B_w: Any = 2
    B_a: Any = 2
    B_kv: Any = 2
    #: Expert parallelism (:mod:`lmcost.operators.parallel`): routed experts are split over ``ep`` ranks; the tokens
    #: routed within the expert group are ``ep_tokens`` times this rank's (1: the tokens are replicated in
    #: the group, as under TP; ep: each rank brings its own, as under attention-DP); ``imbalance`` scales
    #: the token-expert pairs of the busiest rank over the mean. All 1 on one GPU.
    ep: Any = 1
    ep_tokens: Any = 1
    imbalance: Any = 1
    #: Context parallelism in a prefill: s is this rank's share of the sequence, s*cp the whole of it, and
    #: the rank computes 1/cp of its causal pairs (load-balanced chunks, :mod:`lmcost.operators.parallel`).
    cp: Any = 1

    @classmethod
    def of(cls, cfg, precision: Precision, b, s, t) -> "Dims":
        """The numeric dims of ``cfg`` at batch b, s new tokens, context t (ints or arrays)."""
        a, m, moe = cfg.attention, cfg.attention.mla, cfg.moe
        return cls(
            b=b, s=s, t=t, d=cfg.d_model, h=a.n_heads, h_kv=cfg.h_kv, d_h=cfg.d_h, d_ff=cfg.ffn.d_ff,
            V=cfg.vocab_size, L=cfg.n_layers, w=a.sliding_window or 0, C=a.chunk_size or 0, r=cfg.d_rot, P=cfg.max_positions or 0,
            d_c=m.kv_lora_rank if m else 0, d_q=(m.q_lora_rank or 0) if m else 0,
            d_r=m.qk_rope_head_dim if m else 0, d_nope=m.qk_nope_head_dim if m else 0,
            d_v=m.v_head_dim if m else (a.v_head_dim or 0),
            E=moe.n_experts if moe else 0, k=moe.top_k if moe else 0, d_e=moe.d_ff_expert if moe else 0,
            d_sh=moe.d_sh if moe else 0,
            B_w=precision.B_w, B_a=precision.B_a, B_kv=precision.B_kv)

    @classmethod
    def symbolic(cls, precision: Precision | None = None) -> "Dims":
        """Every dim a sympy Symbol; byte widths numeric from ``precision``, or Symbols B_w, B_a, B_kv."""
        names = [f.name for f in fields(cls)]
        syms = dict(zip(names, symbols(" ".join(names))))
        if precision is not None:
            syms.update(B_w=precision.B_w, B_a=precision.B_a, B_kv=precision.B_kv)
        syms.update(ep=1, ep_tokens=1, imbalance=1, cp=1)  # formulas are written for one GPU
        return cls(**syms)


def block_ops(cfg, x: Dims, kind: str, moe: bool, kernel: str = "flash", mla_mode: str = "absorbed",
              train: bool = False, ffn: str | None = None) -> list[OpCost]:
    """One transformer block from its input to its output residual stream [b,s,d].

    ``kind`` is the layer's token mixer, the first element of :meth:`ArchConfig.layer_kinds`
    (``global``/``local`` attention); ``moe`` whether its FFN is a mixture of experts.

    pre_norm: x + attn(norm(x)), then + ffn(norm(.)) (GPT-2, Llama). post_norm: norm(x + attn(x))
    (Vaswani et al. 2017) and OLMo-2's norm-on-the-output order: the same norms, elsewhere.
    sandwich: norms before and after each sublayer (Gemma-2). parallel: x + attn(norm(x)) + ffn(norm(x))
    (GPT-J, Falcon), with one shared norm or one per branch. In training with ``cfg.dropout``, each
    sublayer's output passes a dropout before its residual add (Vaswani et al. 2017, section 5.4).

    Hybrid stacks (``cfg.recurrent``): ``kind`` may name a constant-state mixer (``mamba2``, ``short_conv``,
    ``gated_deltanet``: :func:`lmcost.operators.recurrent.recurrent_ops`, with ``mixer_norm``/``mixer_residual``) or
    ``none`` (no mixer); ``ffn`` (``dense``/``moe``/``none``, overriding ``moe``) may be ``none`` (no FFN,
    no ffn_norm). Such blocks are pre-norm only (the config refuses other orders).
    """
    n = x.b * x.s
    if ffn is None:
        ffn = "moe" if moe else "dense"
    if kind in RECURRENT_KINDS or kind == "none" or ffn == "none":
        return _hybrid_block(cfg, x, kind, ffn, kernel, mla_mode, train)

    def nrm(name):
        return norm(name, cfg.norm, cfg.norm_bias, n, x.d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]",
                    weight=cfg.norm_weight)

    def residual(name, inputs=2):  # Doge: a learned scale on the skip
        return scaled_residual(cfg, x, add(name, n * x.d, x.B_a, inputs, shapes="x + f(x) [b,s,d]"))

    attn = layer_attention_ops(cfg, x, kind, kernel, mla_mode, train)  # DSA or dense, with Gemma's KV sharing
    ffn = moe_layer_ops(cfg, x) + normed_branch_ops(cfg, x) if moe else dense_ffn_ops(cfg, x, n, x.d_ff)
    if train and cfg.dropout:
        drop = lambda name: OpCost(name, OpClass.ELEMENTWISE, flops=n * x.d, act_read_bytes=n * x.d * (x.B_a + 1),
                                   act_write_bytes=n * x.d * x.B_a, shapes="y [b,s,d] * mask / (1 - p_drop)")
        attn, ffn = attn + [drop("attn.out_dropout")], ffn + [drop("ffn.out_dropout")]
    if cfg.block == "parallel":
        norms = [nrm("norm")] if cfg.parallel_shared_norm else [nrm("attn_norm"), nrm("ffn_norm")]
        return norms + attn + ffn + [residual("residual", 3)]
    if cfg.block == "pre_norm":
        return [nrm("attn_norm"), *attn, residual("attn_residual"), nrm("ffn_norm"), *ffn, residual("ffn_residual")]
    if cfg.block == "post_norm":
        return [*attn, residual("attn_residual"), nrm("attn_norm"), *ffn, residual("ffn_residual"), nrm("ffn_norm")]
    # sandwich
    return [nrm("attn_norm"), *attn, nrm("attn_post_norm"), residual("attn_residual"),
            nrm("ffn_norm"), *ffn, nrm("ffn_post_norm"), residual("ffn_residual")]


def _hybrid_block(cfg, x: Dims, kind: str, ffn: str, kernel: str, mla_mode: str, train: bool) -> list[OpCost]:
    """A pre-norm block of a hybrid stack: [norm, mixer, residual] (if it has a mixer), then
    [ffn_norm, ffn, ffn_residual] (if it has an FFN): x + f(norm(x)) per sublayer (Nemotron-H, LFM2)."""
    n = x.b * x.s

    def nrm(name):
        return norm(name, cfg.norm, cfg.norm_bias, n, x.d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]",
                    weight=cfg.norm_weight)

    def residual(name):
        return add(name, n * x.d, x.B_a, 2, shapes="x + f(x) [b,s,d]")

    ops = []
    if kind in RECURRENT_KINDS:
        ops += [nrm("mixer_norm"), *recurrent_ops(cfg, x, kind), residual("mixer_residual")]
    elif kind != "none":
        ops += [nrm("attn_norm"), *layer_attention_ops(cfg, x, kind, kernel, mla_mode, train), residual("attn_residual")]
    if ffn != "none":
        body = (rnn.rnn_ffn_ops(cfg, x, ffn) if ffn in rnn.FFN_KINDS  # RWKV's channel mixing (operators.rnn)
                else moe_layer_ops(cfg, x) if ffn == "moe" else dense_ffn_ops(cfg, x, n, x.d_ff))
        ops += [nrm("ffn_norm"), *body, residual("ffn_residual")]
    return ops


def forward_ops(cfg, x: Dims, kernel: str = "flash", mla_mode: str = "absorbed", logits: str = "all",
                train: bool = False) -> list[OpCost]:
    """Every operator of one forward pass over b sequences of s new tokens at context t.

    Layers come in groups of identical layers (local/global attention, dense/MoE FFN); a layer op's
    ``count`` is its group's size (the Symbol L when x is symbolic and all layers are alike), and its
    name is prefixed with its group: ``layers.``, or ``layers.local.``/``layers.moe.``... where layers differ.
    The lm_head runs on all b*s tokens (2*b*s*d*V FLOPs), as a forward that returns every logit does
    (``logits="all"``, as transformers does in prefill), or on the last token of each sequence only
    (``logits="last"``, as serving engines do).
    """
    if kernel not in KERNELS or mla_mode not in MLA_MODES or logits not in LOGITS:
        raise ValueError(f"kernel in {KERNELS}, mla_mode in {MLA_MODES}, logits in {LOGITS}")
    n = x.b * x.s
    ops = []
    if cfg.embeddings:
        ops.append(lookup("embed", n, x.d, x.V, x.B_w, x.B_a, shapes="table [V,d] gathered at [b,s] -> [b,s,d]"))
        ops += per_layer_input_ops(cfg, x) + altup_input_ops(cfg, x)
    if cfg.embedding_norm:  # BLOOM's word_embeddings_layernorm
        ops.append(norm("embed_norm", cfg.norm, cfg.norm_bias, n, x.d, x.B_w, x.B_a, weight=cfg.norm_weight))
    if cfg.positions == "sinusoidal":  # XGLM, CTRL: a fixed table, no parameters
        ops.append(sinusoidal_positions(x, n))
    if cfg.positions == "learned":
        ops.append(OpCost("pos_embed", OpClass.EMBEDDING, flops=n * x.d, weight_bytes=x.s * x.d * x.B_w,
                          act_read_bytes=n * x.d * x.B_a, act_write_bytes=n * x.d * x.B_a,
                          params=(x.P + cfg.position_offset) * x.d,
                          shapes="x [b,s,d] + table [P,d] rows [s,d]", kind="add"))
    groups = cfg.layer_groups()
    for attn_kind, ffn_kind, count in groups:
        group = group_name(cfg, attn_kind, ffn_kind)
        if len(groups) == 1 and not isinstance(x.L, int):
            count = x.L
        xg = layer_dims(cfg, x, attn_kind)  # Gemma 4's global layers, double-wide FFNs
        block = altup_block_ops if cfg.altup is not None else block_ops  # Gemma 3n's AltUp blocks
        for op in block(cfg, xg, attn_kind, ffn_kind == "moe", kernel, mla_mode, train, ffn=ffn_kind) \
                + per_layer_block_ops(cfg, xg):
            ops.append(op.in_layers(group, count))
    if not cfg.embeddings:
        return ops
    ops += altup_output_ops(cfg, x)
    if cfg.final_norm:
        ops.append(norm("final_norm", cfg.norm, cfg.norm_bias, n, x.d, x.B_w, x.B_a, weight=cfg.norm_weight))
    head = linear("lm_head", n if logits == "all" else x.b, x.d, x.V, x.B_w, x.B_a, cfg.lm_head_bias, op_class=OpClass.LM_HEAD,
                  shapes="x [b,s,d] @ W_out [d,V] -> logits [b,s,V]" if logits == "all"
                  else "x [b,d] (last token) @ W_out [d,V] -> logits [b,V]")
    if cfg.tie_embeddings:
        head = OpCost(**{**head.__dict__, "params": x.V if cfg.lm_head_bias else 0})  # the bias is its own
    ops.append(head)
    if cfg.final_logit_softcap is not None:
        # Gemma-2's final_logit_softcapping: logits = c * tanh(logits / c), 3 FLOPs per logit, one kernel
        rows = n if logits == "all" else x.b
        ops.append(elementwise("logit_softcap", rows * x.V, 1, FLOPS_PER_ELEMENT["softcap"], x.B_a,
                               shapes="c * tanh(logits / c) [b,s,V]"))
    if train:
        ops += loss_ops(cfg, x)
    return ops


def group_name(cfg, attn_kind: str, ffn_kind: str) -> str:
    """The name of the group of identical layers of ``cfg`` with this attention and FFN kind: ``layers``,
    with ``.local``/``.global`` where attention kinds differ and ``.dense``/``.moe`` where FFN kinds do."""
    groups = cfg.layer_groups()
    vary_attn = len({a for a, _, _ in groups}) > 1
    vary_ffn = len({f for _, f, _ in groups}) > 1
    return ".".join(["layers"] + ([attn_kind] if vary_attn else []) + ([ffn_kind] if vary_ffn else []))


#: What a user calls each layer's mixer and FFN in a table (:func:`group_label`); a mixer kind not listed is
#: shown as its schema name.
MIXER_NAMES = {"global": "attention", "local": "attention (sliding window)", "chunked": "attention (chunked)",
               "global_nope": "attention (no RoPE)", "local_nope": "attention (sliding window, no RoPE)",
               "chunked_nope": "attention (chunked, no RoPE)", "mamba2": "Mamba-2 mixer",
               "short_conv": "gated short conv", "gated_deltanet": "gated DeltaNet", "lightning": "lightning attention",
               "mamba": "Mamba mixer", "rg_lru": "RG-LRU block",
               "rwkv4": "RWKV time mixing", "mlstm": "mLSTM block"}
FFN_NAMES = {"dense": "MLP", "moe": "MoE", "rwkv4_channel": "RWKV channel mixing"}


def group_label(cfg, group: str) -> str:
    """A human name of the group of identical layers named ``group`` (:func:`group_name`): its mixer and FFN,
    e.g. ``Mamba-2 mixer``, ``MLP``, ``attention (sliding window) + MoE``; ``global`` reads ``attention (global)``
    where other layers attend in windows or chunks. A group ``cfg`` does not have is returned as it is."""
    kinds = {a for a, _, _ in cfg.layer_groups()}
    for attn_kind, ffn_kind, _ in cfg.layer_groups():
        if group_name(cfg, attn_kind, ffn_kind) == group:
            base = attn_kind.removesuffix("_shared")  # Gemma 3n/4's KV-sharing layers (lmcost.model.layer_sharing)
            mixer = MIXER_NAMES.get(base, base) if attn_kind != "none" else None
            if base == "global" and {k.removesuffix("_shared") for k in kinds} & {"local", "chunked", "local_nope",
                                                                                 "chunked_nope"}:
                mixer = "attention (global)"
            if base != attn_kind:
                mixer = mixer.replace("attention", "attention, K/V shared", 1) if "(" not in mixer \
                    else mixer.replace(")", ", K/V shared)", 1)
            parts = [mixer, FFN_NAMES.get(ffn_kind) if ffn_kind != "none" else None]
            return " + ".join(p for p in parts if p)
    return group


def layer_group_names(cfg) -> list[str]:
    """Per layer index, the group name its operators carry (:func:`group_name`)."""
    names = {(a, f): group_name(cfg, a, f) for a, f, _ in cfg.layer_groups()}  # each group named once, not per layer
    return [names[kind] for kind in cfg.layer_kinds()]


def loss_ops(cfg, x: Dims) -> list[OpCost]:
    """Training loss over the logits [b,s,V]: softmax cross-entropy (log-sum-exp, then the target's
    log-probability: 5 FLOPs per logit, as a softmax), and with ``cfg.z_loss`` the z-loss
    1e-4 * log(Z)^2, whose cost is a second log-sum-exp over the logits (PaLM, Chowdhery et al. 2022,
    section 5: max, subtract, exp, sum = 4 FLOPs per logit) plus a square per token."""
    n = x.b * x.s
    ops = [OpCost("loss.cross_entropy", OpClass.SOFTMAX, flops=FLOPS_PER_ELEMENT["softmax"] * n * x.V,
                  act_read_bytes=n * x.V * x.B_a, act_write_bytes=n * 4, shapes="logits [b,s,V] -> loss [b,s]")]
    if cfg.z_loss:
        ops.append(OpCost("loss.z_loss", OpClass.SOFTMAX, flops=4 * n * x.V + 2 * n, act_read_bytes=n * x.V * x.B_a,
                          act_write_bytes=n * 4, shapes="logsumexp(logits [b,s,V])^2 -> [b,s]"))
    return ops


def total(ops: list[OpCost], field: str):
    """Sum of ``field`` over ops, each times its count: the total of records whose fields are numbers,
    arrays, sympy expressions or traced dims (a compiled grid's totals are this sum, traced). The totals
    of an evaluated phase go through :func:`lmcost.cost.phases.totals`."""
    return sum(getattr(op, field) * op.count for op in ops)
