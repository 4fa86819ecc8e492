"""Activation memory of a training step: what each forward operator's backward needs kept, per layer and
microbatch, under activation recomputation, tensor/sequence parallelism and a pipeline schedule.

Notation: see :mod:`lmcost.basics.notation`; n = b*s tokens of one microbatch on one GPU. The operators are those
of :func:`lmcost.operators.forward.forward_ops` (``train=True``) at one GPU's dims (:func:`lmcost.operators.parallel.shard`).

Conventions (they bite in every figure below):
- A saved tensor has a name (key) within its layer. Operators that keep the same tensor name it once (the
  q/k/v projections keep their one shared input; the output projection keeps the attention kernel's
  output O): a layer's bytes are the sum over its distinct keys, never over operators.
- Bytes are of the activation dtype B_a unless a rule says otherwise: per-row statistics fp32 (4 bytes),
  indices int64 (8 bytes), dropout masks torch.bool (1 byte).
- Not counted: weights (a weight's gradient needs X and dY, not W's copy), gradients, optimizer state,
  model constants (RoPE's cos/sin tables [s, r], shared by every layer), the fixed attention masks.
- ``fused=False`` (the default) is eager PyTorch as the reference decoder runs it
  (:mod:`lmcost.profiling.decoder`, checked in tests/test_activations.py); ``fused=True`` is the fused
  kernels of Megatron-LM/Transformer Engine/Apex (RMSNorm keeping X and rstd; SwiGLU keeping gate and up).

Recomputation (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"):
``none`` keeps every saved tensor; ``selective`` (section 5) drops the attention core's score-sized tensors
(softmax output, attention-dropout mask and output) and recomputes them from Q, K, V in the backward;
with a flash kernel nothing score-sized is saved (it keeps the row log-sum-exp instead), so selective
equals none; ``full`` keeps only each layer's input [b,s,d] and recomputes the layer's forward at its
backward. What a recomputation rebuilds is held for one layer at a time: the peak adds it once
(``transient``).

Tensor parallelism shards what the sharded dims say (heads, d_ff, experts, V). Sequence parallelism
(Korthikanti et al. 2022, section 4.2.2) runs the block's norms, residuals and output dropouts on s/tp
tokens, and the column-parallel GEMMs after an all-gather keep the sequence-sharded input (re-gathered
in the backward), so those inputs count 1/tp too: the paper's sbh(34/t + 5as/(ht)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from lmcost.operators.attention import _keys_read
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.basics.results import Result
from lmcost.operators.forward import Dims, forward_ops, layer_group_names
from lmcost.operators.ops import OpClass, OpCost
from lmcost.operators.parallel import Layout, _sequence_sharded, shard
from lmcost.operators.pipeline_split import chunk_layers

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: Bytes per element of a per-row statistic (mean, rstd: fp32), an index (int64) and a dropout mask (bool).
STAT_BYTES, INDEX_BYTES, MASK_BYTES = 4, 8, 1
#: The attention core's score-sized tensors [b,h,s,t]: what selective recomputation drops.
SCORE_KEYS = ("attn.p", "attn.dropout_mask", "attn.p_dropped", "attn.softcap")

_ATTN_IN = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.q_a_proj", "attn.kv_a_proj")
_FFN_IN = ("ffn.gate", "ffn.up", "moe.router", "moe.shared.gate", "moe.shared.up", "moe.shared.gate_proj")
#: Inputs of the column-parallel GEMMs after SP's all-gather: kept sequence-sharded (1/tp).
_SP_KEYS = ("block.input", "attn.input", "ffn.input", "lm_head.input")


@dataclass(frozen=True, kw_only=True, slots=True)
class LayerActivations(Result):
    """Activation bytes one GPU keeps for one microbatch (:func:`layer_activation_bytes`). Bytes."""

    #: {layer group: bytes one layer of the group keeps from its forward to its backward}.
    per_layer: dict
    #: {layer group: layers of the group in the model}.
    layers: dict
    #: The embedding's, and the head's (final norm, lm_head, loss: never recomputed).
    embedding: float
    head: float
    #: What a recomputation rebuilds for one layer at its backward (the largest layer's score-sized
    #: tensors under selective, its whole saved set under full; 0 with none).
    transient: float
    #: {layer group: {tensor key: bytes}} with no recomputation.
    tensors: dict
    #: Every layer, the embedding and the head on this GPU's TP/SP shard (pipeline stages ignored),
    #: plus the transient.
    total: float


@dataclass(frozen=True, kw_only=True, slots=True)
class PeakActivations(Result):
    """Peak activation bytes on one GPU over a training step (:func:`peak_activation_bytes`)."""

    #: The busiest stage's peak (bytes), which stage it is (0-based), and its microbatches in flight
    #: (interleaved: microbatch-chunks).
    bytes: float
    stage: int
    in_flight: int
    #: Every stage's peak (bytes).
    per_stage: list


def _input_key(cfg, role: str, mla_mode: str) -> str:
    """The name of the tensor a GEMM reads: shared inputs get one name."""
    if role in _ATTN_IN:
        return "block.input" if cfg.block == "post_norm" else "attn.input"
    if role in _FFN_IN:
        return "attn.input" if cfg.block == "parallel" and cfg.parallel_shared_norm else "ffn.input"
    if role in ("moe.expert.gate", "moe.expert.up"):
        return "moe.expert.input"
    if role == "attn.out_absorb":
        return "attn.o"
    if role == "attn.o_proj" and not (cfg.attention.mla is not None and mla_mode == "absorbed"):
        return "attn.o"
    return f"{role}.input"


def _norm_input_key(cfg, role: str) -> str:
    """The block input x feeds the first norm (pre_norm, sandwich) or both norms (parallel)."""
    if (role in ("attn_norm", "norm") and cfg.block != "post_norm") or (role == "ffn_norm" and cfg.block == "parallel"):
        return "block.input"
    return f"{role}.input"


def _kv_saved(cfg, x: Dims, local: bool, mla_mode: str) -> tuple:
    """Bytes of K and V as the attention kernel takes them (training: activations, dtype B_a).

    GQA/MQA: [b,t_k,h_kv,d_h] each, never repeated per query head. MLA absorbed: the latent and the shared
    RoPE key [b,t_k,d_c+d_r], which also serve as values (0). MLA up-projected: per-head keys
    [b,t_k,h,d_nope+d_r] (the RoPE key expanded to every head, as the kernel is fed) and values [b,t_k,h,d_v].
    Context parallel (ring attention): a rank keeps its own chunk of s/cp tokens; the others' K/V pass the
    ring again in the backward.
    """
    m = cfg.attention.mla
    t_k = x.s if not (isinstance(x.cp, int) and x.cp == 1) else _keys_read(x, local)
    if m is None:
        kv = x.b * t_k * x.h_kv * x.d_h * x.B_a
        return kv, kv
    if mla_mode == "absorbed":
        return x.b * t_k * (x.d_c + x.d_r) * x.B_a, 0
    return x.b * t_k * x.h * (x.d_nope + x.d_r) * x.B_a, x.b * t_k * x.h * x.d_v * x.B_a


def _pairs(x: Dims):
    """Token-expert pairs this rank's experts run (as :func:`lmcost.operators.ffn.moe_ops` counts them)."""
    n = x.b * x.s
    if isinstance(x.ep, int) and x.ep == 1:
        return x.k * n
    return x.k * x.ep_tokens * n * x.imbalance / x.ep


def saved_tensors(op: OpCost, x: Dims, cfg, mla_mode: str = "naive", fused: bool = False) -> dict:
    """The tensors the backward of forward operator ``op`` needs kept: {key: bytes}.

    Rules (Korthikanti et al. 2022, section 4.1, where the paper has the op; torch's autograd formulas,
    tools/autograd/derivatives.yaml, for what the reference decoder keeps):
    - GEMM / linear (projections, lm_head, router, experts): its input X [rows, d_in] (dW = Xᵀ dY); the
      q/k/v (MLA: q, kv_a) projections share one input, gate and up another. MLA's kv_b_proj keeps the
      normalised latent [b,t,d_c].
    - Flash attention: Q, K, V, O and the log-sum-exp of each query row (fp32, [b,h,s]); the backward
      recomputes the scores from them (Dao et al. 2022, section 3.1); dropout is regenerated from the RNG
      state, not stored. Naive attention: QKᵀ keeps Q and K; the softmax its output P [b,h,s,t]; dropout its
      mask (1 byte per score); the value matmul its P input (the dropout output, a second [b,h,s,t]) and V.
    - Norms: input X plus per-row statistics (fp32: RMSNorm rstd, LayerNorm mean and rstd), as torch's
      native_layer_norm and fused RMSNorm kernels keep. Eager RMSNorm (``fused=False``; torch's composite
      F.rms_norm, which the CPU runs) upcasts X to fp32 and also keeps x̂ = X*rstd (fp32), the input of the
      weight multiply: 2 fp32 tensors [rows, width] and rstd.
    - Activation (SiLU, GELU, ReLU, sigmoid): its input. Gated (act(g) * u): both inputs of the multiply and
      the activation's input: g, act(g), u (eager); g and u (``fused``: act(g) recomputed in the backward);
      gpt-oss's clamped SwiGLU, eager: g, u, min(g, l), its sigmoid, their product, clamp(u) + 1.
    - Sinks: nothing more (their gradient reads P or the LSE). ALiBi (scores + a constant bias): nothing.
      Soft-capping (c*tanh(x/c)): the tanh output, [b,h,s,t] on the scores of the naive kernel (a score
      tensor: selective recompute drops it), [b,s,V] on the logits. Temperature tuning (q * scale): the scale [s]. QKV clipping (clamp_): a copy of q, k, v.
    - RoPE: nothing (cos/sin are constants; q, k rotate in place). Residual adds: nothing. Dropout: its
      mask (torch.bool, 1 byte per element). Token embedding: the token ids (int64); learned positions: nothing.
    - MoE router: the input (shared with the FFN's), the softmax output [n,E], the top-k indices [n,k] (int64)
      and the routing permutation of the k*n pairs (int64: their order by expert and each pair's token, as the
      reference decoder's gather/scatter backward needs). Experts: as a dense FFN over their pairs. Combine:
      the expert outputs [k*n,d] and the pair weights [k*n] (d weight = <dY, y>); a gated shared expert
      also its output and its sigmoid gate. Eager torch also keeps the weighted outputs [k*n,d]: the
      scatter back to tokens (index_add_) saves its source, whose autograd formula reads only its shape.
    - Loss: torch's cross_entropy keeps the log-softmax [b,s,V] (activation dtype) and the targets (int64);
      the z-loss's log-sum-exp keeps the logits [b,s,V] and its result [b,s].
    Units: bytes (floats under division). ``x``: the dims the op was built at; ``mla_mode`` as in forward_ops.
    """
    role, B_a, n = op.role, x.B_a, x.b * x.s
    local = "local" in op.group.split(".")
    if op.op_class is OpClass.COMMUNICATION or op.role.endswith("residual") or role in ("attn.rope", "pos_embed"):
        return {}
    if role == "embed":
        return {"tokens": n * INDEX_BYTES}
    if role == "loss.cross_entropy":
        return {"loss.log_probs": n * x.V * B_a, "loss.targets": n * INDEX_BYTES}
    if role == "loss.z_loss":
        return {"loss.z_logits": n * x.V * B_a, "loss.z_lse": n * B_a}
    if role == "attn.sdpa":
        k, v = _kv_saved(cfg, x, local, mla_mode)
        absorbed = cfg.attention.mla is not None and mla_mode == "absorbed"
        return {"attn.q": op.act_read_bytes, "attn.k": k, "attn.v": v,
                "attn.o_latent" if absorbed else "attn.o": op.act_write_bytes, "attn.lse": x.b * x.h * x.s * STAT_BYTES}
    if role == "attn.score":
        return {"attn.q": op.act_read_bytes, "attn.k": _kv_saved(cfg, x, local, mla_mode)[0]}
    if role == "attn.softmax":
        return {"attn.p": op.act_write_bytes} if op.act_write_bytes else {}  # flash: inside attn.sdpa
    if role == "attn.sinks":  # the sink's gradient reads the probabilities (or the flash LSE) already kept
        return {}
    if role == "attn.softcap":  # tanh's backward reads its output [b,h,s,t]; flash: inside attn.sdpa
        return {"attn.softcap": op.act_write_bytes} if op.act_write_bytes else {}
    if role == "attn.alibi":  # scores - m_h*(i - j): a constant bias add, whose backward passes dY through
        return {}  # (the softmax keeps its own output); flash: inside attn.sdpa
    if role == "attn.q_scale":  # q * scale: the per-position scale [s] (activation dtype), for dq
        return {"attn.q_scale": x.s * B_a}
    if role == "attn.clip_qkv":  # an in-place clamp keeps a copy of its input, q, k and v unclipped (its mask)
        return {"attn.qkv_unclipped": op.act_read_bytes + op.kv_read_bytes}
    if role == "logit_softcap":  # tanh's backward reads its output [b,s,V]
        return {"logit_softcap.output": op.act_write_bytes}
    if role == "attn.dropout":
        return {"attn.dropout_mask": op.act_write_bytes / B_a * MASK_BYTES}
    if role == "attn.value":
        p = "attn.p_dropped" if cfg.dropout else "attn.p"
        return {p: op.act_read_bytes, "attn.v": _kv_saved(cfg, x, local, mla_mode)[1]}
    if role == "attn.out_absorb":
        return {"attn.o_latent": op.act_read_bytes}
    if role == "attn.kv_b_proj":
        return {"attn.latent": x.b * _keys_read(x, local) * x.d_c * B_a}
    if role == "moe.topk":
        return {"moe.probs": n * x.E * B_a, "moe.topk_idx": n * x.k * INDEX_BYTES,
                "moe.permutation": 2 * x.k * n * INDEX_BYTES}
    if role == "moe.combine":
        out = {"moe.expert.output": _pairs(x) * x.d * B_a, "moe.pair_weight": _pairs(x) * B_a}
        if not fused:  # eager index_add_ keeps its source, the weighted outputs (its formula reads their shape)
            out["moe.weighted_output"] = _pairs(x) * x.d * B_a
        if cfg.moe.d_sh and cfg.moe.shared_expert_gate:
            out.update({"moe.shared.output": n * x.d * B_a, "moe.shared.gate": n * B_a})
        return out
    if op.matmul:
        return {_input_key(cfg, role, mla_mode): op.act_read_bytes}
    if op.op_class is OpClass.NORM:
        elements = op.act_read_bytes / B_a
        rows = n
        if role in ("attn.q_norm", "attn.k_norm") and cfg.attention.qk_norm in ("head", "l2"):
            rows = n * (x.h if role == "attn.q_norm" else x.h_kv)
        stats = rows * STAT_BYTES * (2 if op.kind == "layernorm" else 1)
        key = _norm_input_key(cfg, role)
        if op.kind == "rmsnorm" and not fused:
            return {key: elements * 4, f"{role}.xhat": elements * 4, f"{role}.stats": stats}
        return {key: elements * B_a, f"{role}.stats": stats}
    if role.endswith("dropout"):  # attn.out_dropout, ffn.out_dropout
        return {f"{role}.mask": op.act_write_bytes / B_a * MASK_BYTES}
    if op.op_class is OpClass.ELEMENTWISE and role.endswith(".act"):
        prefix = role[: -len("act")]
        out = op.act_write_bytes  # [rows, d_ff] of the activation dtype
        if op.kind.endswith("_mul"):
            saved = {f"{prefix}gate.output": out, f"{prefix}up.output": out}
            if cfg.ffn.swiglu_limit is not None and not fused:
                # gpt-oss's clamped SwiGLU, eager: min(g, l), sigmoid(alpha*min(g, l)), their product and
                # clamp(u) + 1 are kept too (the clamps keep their inputs g, u for their masks)
                return {**saved, **{f"{prefix}{k}": out for k in ("gate.clamped", "gate.sigmoid", "glu", "up.plus1")}}
            return saved if fused else {**saved, f"{prefix}act(gate)": out}
        return {f"{prefix}up.output": out}
    raise ValueError(f"no saved-tensor rule for operator {op.name} (role {role}, class {op.op_class.value})")


def saved_bytes(op: OpCost, x: Dims, cfg, mla_mode: str = "naive", fused: bool = False):
    """Bytes the backward of ``op`` needs kept, by the rules of :func:`saved_tensors` (a tensor another op
    of the layer also keeps is counted here too: sum layers with :func:`layer_activation_bytes`)."""
    return sum(saved_tensors(op, x, cfg, mla_mode, fused).values())


def _check(recompute: str, layout: Layout, cfg) -> None:
    if recompute not in RECOMPUTE:
        raise LmcostError("recompute", f"unknown policy {recompute!r}", f"use one of {', '.join(RECOMPUTE)}")
    layout.check(cfg)


def layer_activation_bytes(cfg, precision: Precision, layout: Layout, micro_batch: int, seq: int,
                           recompute: str = "none", *, kernel: str = "flash", mla_mode: str = "naive",
                           fused: bool = False) -> LayerActivations:
    """Activation bytes one GPU keeps for one microbatch of ``micro_batch`` sequences of ``seq`` tokens.

    Returns: :class:`LayerActivations`: bytes per layer of each group and the layers of each group, the
    embedding's and the head's, a recomputation's transient, the saved tensors by key, and the total.
    Raises: LmcostError for an unknown policy or a layout that cannot split ``cfg``.
    Source: Korthikanti et al. 2022, sections 4-5 and Table 2 (their closed forms: tests/oracles.py).
    """
    _check(recompute, layout, cfg)
    x = shard(cfg, Dims.of(cfg, precision, micro_batch, seq, seq), layout, "prefill")
    sp = layout.tp if layout.sp else 1
    tensors: dict = {}
    layers: dict = {}
    embedding, head = {}, {}
    for op in forward_ops(cfg, x, kernel, mla_mode, "all", train=True):
        saved = saved_tensors(op, x, cfg, mla_mode, fused)
        if sp > 1:
            sharded = _sequence_sharded(op)
            saved = {k: v / sp if sharded or k in _SP_KEYS else v for k, v in saved.items()}
        if op.group:
            target = tensors.setdefault(op.group, {})
            layers[op.group] = op.count
        else:
            target = embedding if op.role in ("embed", "pos_embed", "embed_norm") else head
        for k, v in saved.items():
            target.setdefault(k, v)
    none = {g: sum(t.values()) for g, t in tensors.items()}
    if recompute == "none":
        per_layer, transient = none, 0
    elif recompute == "selective":
        scores = {g: sum(v for k, v in t.items() if k in SCORE_KEYS) for g, t in tensors.items()}
        per_layer, transient = {g: none[g] - scores[g] for g in none}, max(scores.values())
    else:
        per_layer, transient = {g: x.b * x.s * x.d * x.B_a / sp for g in none}, max(none.values())
    emb, hd = sum(embedding.values()), sum(head.values())
    total = sum(per_layer[g] * layers[g] for g in per_layer) + emb + hd + transient
    return LayerActivations(per_layer=per_layer, layers=layers, embedding=emb, head=hd, transient=transient,
                            tensors=tensors, total=total)


def in_flight(schedule: str, p: int, m: int, stage: int, virtual_stages: int = 1) -> int:
    """Microbatches (interleaved: microbatch-chunks) whose activations pipeline stage ``stage`` (0-based)
    holds at its peak, of p stages and m microbatches.

    GPipe (Huang et al. 2019): every forward runs before any backward: m.
    1F1B (PipeDream-Flush; Narayanan et al. 2021, section 2.2.1): stage i runs p - i - 1 warm-up forwards,
    then alternates one forward, one backward: min(p - i, m).
    Interleaved (Narayanan et al. 2021, section 2.2.2; Megatron-LM's schedules.py,
    ``forward_backward_pipelining_with_interleaving``): with v chunks of L/(p*v) layers per device, device i
    runs 2*(p - i - 1) + (v - 1)*p warm-up chunk-forwards, then one more before its first backward:
    min(2*(p - i - 1) + (v - 1)*p + 1, m*v) chunks. With m >= p, stage 0 thus holds v*p + p - 1 chunks of
    L/(p*v) layers, L*(1 + (p - 1)/(p*v)) layer-microbatches against 1F1B's p * L/p = L: the factor of
    Korthikanti et al. 2022, section 4.2.3.
    """
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(p - stage, m)
    return min(2 * (p - stage - 1) + (virtual_stages - 1) * p + 1, m * virtual_stages)


def peak_activation_bytes(cfg, precision: Precision, layout: Layout, micro_batch: int, seq: int, microbatches: int,
                          recompute: str = "none", schedule: str = "1f1b", virtual_stages: int = 1, *,
                          kernel: str = "flash", mla_mode: str = "naive", fused: bool = False,
                          recompute_layers: int | None = None) -> PeakActivations:
    """Peak activation bytes on one GPU of the busiest pipeline stage over a training step of
    ``microbatches`` microbatches (``layout.pp`` stages, layers split by :func:`lmcost.operators.parallel.stage_layers`,
    or ``layout.stage_split``; model chunks by :func:`lmcost.operators.pipeline_split.chunk_layers`).

    A stage holds, at its peak, :func:`in_flight` microbatches' activations of its layers (the embedding's
    on stage 0), plus the head's (final norm, lm_head, loss) for one microbatch on the last stage (m under
    GPipe: the last stage runs each backward right after its forward otherwise), plus one ``transient``
    recomputation working set. Interleaved: a device's chunks count as the mean chunk of the device
    (its layers' bytes / v) times the chunks in flight.
    ``recompute_layers`` (with ``recompute`` full; None: every layer): the first N layers of each model
    chunk (a stage when v = 1) keep only their input and are recomputed, the others keep every saved tensor
    (Megatron-LM's ``--recompute-method block --recompute-num-layers N``); the transient is one recomputed
    layer's, and none when N is 0.
    Returns: :class:`PeakActivations`: the busiest stage's peak bytes, that stage (0-based), its microbatches
    (interleaved: microbatch-chunks) in flight, and every stage's bytes.
    Raises: LmcostError for an unknown schedule or policy, fewer than one microbatch, virtual stages with a
    schedule other than interleaved, or more pipeline chunks than layers.
    """
    _check(recompute, layout, cfg)
    if schedule not in SCHEDULES:
        raise LmcostError("schedule", f"unknown pipeline schedule {schedule!r}", f"use one of {', '.join(SCHEDULES)}")
    if microbatches < 1 or virtual_stages < 1:
        raise LmcostError("microbatches", "microbatches and virtual_stages must be >= 1", "pass positive counts")
    if virtual_stages > 1 and schedule != "interleaved":
        raise LmcostError("virtual_stages", f"{virtual_stages} chunks per device need the interleaved schedule",
                          "pass schedule='interleaved', or virtual_stages=1")
    p, m, v = layout.pp, microbatches, virtual_stages
    if p * v > cfg.n_layers:
        raise LmcostError("virtual_stages", f"{p} stages x {v} chunks exceed the {cfg.n_layers} layers",
                          f"use pp * virtual_stages <= {cfg.n_layers}")
    acts = layer_activation_bytes(cfg, precision, layout, micro_batch, seq, recompute, kernel=kernel,
                                  mla_mode=mla_mode, fused=fused)
    group_of = layer_group_names(cfg)
    chunks = chunk_layers(cfg, p, v, layout.stage_split)
    kept, transient = acts.per_layer, acts.transient
    if recompute_layers is not None:
        if recompute != "full":
            raise LmcostError("recompute_layers", f"selects the layers full recomputation re-runs, and recompute is "
                              f"{recompute}", "add `recompute` full, or drop `recompute_layers`")
        kept = layer_activation_bytes(cfg, precision, layout, micro_batch, seq, "none", kernel=kernel,
                                      mla_mode=mla_mode, fused=fused).per_layer
        transient = transient if recompute_layers else 0
    per_stage, flights = [], []
    for i in range(p):
        layer_bytes = sum(acts.per_layer[group_of[j]] if recompute_layers is None or n < recompute_layers
                          else kept[group_of[j]] for c in range(i, p * v, p) for n, j in enumerate(chunks[c]))
        k = in_flight(schedule, p, m, i, v)
        held = k * layer_bytes / v + transient
        if i == 0:
            held += min(math.ceil(k / v), m) * acts.embedding
        if i == p - 1:
            held += (m if schedule == "gpipe" else 1) * acts.head
        per_stage.append(held)
        flights.append(k)
    busiest = max(range(p), key=lambda i: per_stage[i])
    return PeakActivations(bytes=per_stage[busiest], stage=busiest, in_flight=flights[busiest], per_stage=per_stage)
