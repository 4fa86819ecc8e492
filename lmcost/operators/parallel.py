"""Parallel layouts: what one GPU of a tensor-, pipeline-, expert- and data-parallel deployment computes,
holds and communicates.

A :class:`Layout` is a setting of every phase (``Settings.layout``). The phase graph is then the work of
one GPU along the path of one token through the pipeline: every layer's operators sharded as below,
the communication operators (class ``communication``) where a real run issues its collectives, and the
point-to-point sends between pipeline stages. Its time is the latency of one forward of one microbatch
through all stages.

The scheme (Megatron-LM, Shoeybi et al. 2019, section 3; Narayanan et al. 2021 for PP; the expert
parallelism of vLLM and DeepEP for EP), checked exactly against a real ``torch.distributed`` run of the
reference decoder (:mod:`lmcost.profiling.distributed`, ``tests/test_distributed.py``):

- **TP** (``tp`` ranks, tokens replicated): the embedding is vocab-parallel (V/tp rows) and all-reduced
  [n, d]; Q/K/V are column-parallel by heads (h/tp query heads; h_kv/tp KV heads, or one KV head,
  replicated tp/h_kv times, when tp > h_kv); the output projection is row-parallel and all-reduced
  [n, d]; a dense FFN's gate/up are column-parallel (d_ff/tp), its down projection row-parallel and
  all-reduced [n, d]; a parallel block (GPT-J) all-reduces the sum of both branches once. MLA shards its
  heads (q_b, W_UK, W_UV, o) and replicates the latent (kv_a and the cache). Norms and residual adds
  are replicated. The lm_head is vocab-parallel and its logits all-gathered [n_logits, V].
- **EP inside TP** (ep divides tp, dp = 1): experts are split into ep groups of E/ep, each expert's
  d_e sharded over the tp/ep ranks sharing its group; the routed and shared outputs are summed and
  all-reduced [n, d] once per MoE layer, as under TP alone.
- **EP over attention-DP** (tp = 1, ep dividing dp): each rank runs attention on its own batch/dp sequences;
  an MoE layer all-to-alls its pair counts per destination rank and local expert ([ep, E/ep] int64: a
  receiver must know which of its experts each row is for), dispatches the k*n (token,
  expert) rows of d it routes (all-to-all), runs E/ep whole experts on the rows it receives, and sends
  them back (all-to-all combine: k*n rows per rank in expectation, exactly so summed over the group; the
  busiest rank sends imbalance times that).
  Shared experts run locally on replicated weights.
- **PP** (``pp`` stages): layers split as numpy.array_split (the first stages take the extra layer);
  the embedding on stage 0, the final norm and lm_head on the last (a tied lm_head keeps a copy there);
  each boundary sends the activations [n, d] to the next stage.
- **DP** (``dp`` replicas): each replica serves batch/dp sequences; no collective in inference.
- **CP** (``cp`` ranks share each sequence; Liu et al. 2023 ring attention, Megatron-LM's context
  parallelism): in a prefill each rank runs s/cp tokens (load-balanced chunks: 1/cp of the causal
  pairs) and passes its K/V chunk around the ring cp - 1 times per layer; in a decode step each rank
  holds t/cp of the cache, attends over it, and the partial outputs with their log-sum-exp (fp32) are
  all-gathered. Not modelled with sliding windows or with EP (refused).

Payloads are nccl-tests' "size" (:mod:`lmcost.cost.collectives`): the buffer of an all-reduce, the whole
output of an all-gather, what a rank sends in an all-to-all or a send. n = b*s tokens on the rank.
Communication is not overlapped with compute (an assumption stated in every table: the time of a
communication operator adds to the path).

Ranks are placed TP innermost, then CP, then DP (and EP), then PP: a TP group of up to gpus_per_node
ranks stays in one node, as every deployment guide places it. The gloo oracle covers TP, EP and PP;
SP and CP are checked against figures worked by hand (tests/test_parallel.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lmcost.operators.recurrent import RECURRENT_KINDS
from lmcost.basics.errors import LmcostError
from lmcost.operators.ops import OpClass, OpCost
from lmcost.hardware.cluster import default_cluster, load_cluster
from lmcost.hardware.cluster import DEFAULT_NODE
from lmcost.operators.attention import kv_width
from lmcost.operators.forward import Dims, forward_ops, layer_group_names

#: Groups a collective runs over.
GROUPS = ("tp", "cp", "ep", "pp")
#: Largest degree accepted per dimension (a typo guard; the largest published runs use thousands of GPUs).
MAX_DEGREE = 65536


@dataclass(frozen=True)
class Layout:
    """A parallel layout: ``tp`` x ``pp`` x ``dp`` GPUs, ``ep`` of them sharing the experts.

    ``imbalance``: tokens of the busiest expert-parallel rank over the mean (1: perfectly balanced;
    routing statistics of real models run 1.1-1.5 without a balancing loss term, DeepSeek-V3's report
    gives no figure: the factor is the user's to state). ``cluster``: a cluster or node name or YAML path
    (:mod:`lmcost.hardware.cluster`; None: the node lmcost assumes for the GPU).

    Raises: LmcostError for a degree below 1 or above MAX_DEGREE, or an imbalance below 1.
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    cp: int = 1
    imbalance: float = 1.0
    cluster: str | None = None
    #: Sequence parallelism (Korthikanti et al. 2022, section 4.2.2), in a prefill: with tp > 1, each all-reduce becomes a
    #: reduce-scatter and an all-gather of the same payload, and the norms, residual adds and dropouts
    #: between them run on n/tp tokens.
    sp: bool = False
    #: Layers of each pipeline stage, first to last (``pp`` counts adding up to the model's layers;
    #: :func:`uneven_stages`), or None: :func:`stage_layers`' even split.
    stage_split: tuple | None = None

    def __post_init__(self):
        if self.stage_split is not None:
            split = self.stage_split
            if not isinstance(split, tuple) or len(split) != self.pp or any(
                    isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in split):
                raise LmcostError("stage_layers", f"{split!r} is not {self.pp} layer counts of 1 or more, one per stage",
                                  f"give {self.pp} whole numbers, first stage to last")
        if not isinstance(self.sp, bool):
            raise LmcostError("sp", f"must be true or false, got {self.sp!r}", "pass `sp` or leave it out")
        for name in ("tp", "pp", "ep", "dp", "cp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_DEGREE:
                raise LmcostError(name, f"must be a whole number from 1 to {MAX_DEGREE:,}, got {v!r}",
                                  f"pass `{name}` in that range")
        if not (isinstance(self.imbalance, (int, float)) and 1.0 <= self.imbalance <= 64.0):
            raise LmcostError("imbalance", f"must be from 1 to 64, got {self.imbalance!r}",
                              "give the busiest expert rank's tokens over the mean, e.g. 1.2")
        if self.imbalance != 1.0 and self.ep == 1:
            raise LmcostError("imbalance", "applies to expert parallelism, and ep is 1", "add `ep`, or drop it")
        if self.sp and self.tp == 1:
            raise LmcostError("sp", "sequence parallelism splits TP's all-reduces, and tp is 1", "add `tp`, or drop `sp`")

    @property
    def gpus(self) -> int:
        """GPUs the layout occupies: tp * cp * pp * dp."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def single(self) -> bool:
        """True for one GPU (every degree 1)."""
        return self.gpus == 1 and self.ep == 1

    @property
    def ep_mode(self) -> str:
        """'none' (ep = 1), 'tp' (experts split inside the TP group) or 'dp' (over ep of the attention-DP
        ranks, ep dividing dp, with tp = 1: Megatron-LM carves its expert-parallel groups from DP)."""
        if self.ep == 1:
            return "none"
        return "dp" if self.tp == 1 and self.dp % self.ep == 0 and self.dp > 1 else "tp"

    def describe(self) -> str:
        """'TP4 x PP2 (8 GPUs)'-style label."""
        parts = [f"{k.upper()}{v}" for k, v in (("tp", self.tp), ("cp", self.cp), ("pp", self.pp), ("dp", self.dp),
                                                 ("ep", self.ep))
                 if v > 1]
        sp = "+SP" if self.sp and self.tp > 1 else ""
        return (" x ".join(parts) or "one GPU") + sp + (f" ({self.gpus} GPUs)" if self.gpus > 1 else "")

    def check(self, cfg, batch: int | None = None) -> None:
        """Raises: LmcostError (one line, naming the field) if ``cfg`` cannot be split this way, or
        ``batch`` sequences cannot be spread over the dp replicas and pp microbatches."""
        h, h_kv = cfg.attention.n_heads, cfg.h_kv
        tp = self.tp
        if any(k in RECURRENT_KINDS for k, _ in cfg.layer_kinds()) and (tp > 1 or self.cp > 1):
            field = "tp" if tp > 1 else "cp"
            raise LmcostError(field, f"{cfg.name} has constant-state layers (Mamba-2, gated DeltaNet, short conv), "
                              f"whose split over {field} is not modelled", f"drop `{field}` (use `pp`, `dp` or `ep`)")
        if h % tp:
            raise LmcostError("tp", f"{cfg.name} has {h} query heads, not a multiple of tp={tp}",
                              f"use a tp that divides {h}")
        if h_kv % tp and tp % h_kv:
            raise LmcostError("tp", f"{cfg.name} has {h_kv} KV heads: tp={tp} neither divides them nor is a multiple",
                              f"use a tp that divides {h_kv} or is a multiple of it")
        if tp > 1 and (cfg.sub_norms or cfg.attention.differential):
            raise LmcostError("tp", f"{cfg.name} normalises the attention output and the FFN's inner activation "
                              "(sub_norms), or pairs heads h/2 apart (differential attention), which TP would need "
                              "communication across ranks for; it is not modelled", "use `tp` 1 with `pp`/`dp` for this model")
        if tp > 1 and cfg.attention.qk_norm not in ("none", "head", "head_layernorm"):
            raise LmcostError("tp", f"{cfg.name} normalises queries and keys over all heads (qk_norm: "
                              f"{cfg.attention.qk_norm}), which TP would need a reduction across ranks for; "
                              "it is not modelled", "use `tp` 1 with `pp`/`dp` for this model")
        if cfg.ffn.d_ff % tp:
            raise LmcostError("tp", f"d_ff={cfg.ffn.d_ff} of {cfg.name} is not a multiple of tp={tp}",
                              "use a tp that divides the FFN width")
        if cfg.vocab_size % tp:
            raise LmcostError("tp", f"vocab {cfg.vocab_size} of {cfg.name} is not a multiple of tp={tp} "
                              "(the embedding and lm_head are vocab-parallel)", "use a tp that divides the vocabulary")
        if self.pp > cfg.n_layers:
            raise LmcostError("pp", f"{cfg.name} has {cfg.n_layers} layers, fewer than pp={self.pp} stages",
                              f"use `pp` <= {cfg.n_layers}")
        if self.stage_split is not None and sum(self.stage_split) != cfg.n_layers:
            raise LmcostError("stage_layers", f"{'+'.join(map(str, self.stage_split))} = {sum(self.stage_split)} "
                              f"layers, and {cfg.name} has {cfg.n_layers}", f"give counts adding up to {cfg.n_layers}")
        if self.cp > 1:
            if any(kind.removesuffix("_nope") in ("local", "chunked") for kind, _ in cfg.layer_kinds()):
                raise LmcostError("cp", f"{cfg.name} has windowed attention layers, which context parallelism "
                                  "here does not split", "drop `cp` (or use `tp`/`pp`)")
            if self.ep > 1:
                raise LmcostError("cp", "context parallelism with expert parallelism is not modelled",
                                  "drop `cp` or `ep`")
        m = cfg.moe
        if self.ep > 1:
            if m is None:
                raise LmcostError("ep", f"{cfg.name} has no experts", "drop `ep` (or use a MoE model)")
            if self.ep_mode == "tp" and tp % self.ep:
                raise LmcostError("ep", f"ep={self.ep} must divide tp={tp}, or divide dp={self.dp} with tp=1",
                                  "use `ep` dividing `tp` (experts inside the TP group), or `tp` 1 with `ep` dividing `dp`")
            if m.n_experts % self.ep:
                raise LmcostError("ep", f"{m.n_experts} experts are not a multiple of ep={self.ep}",
                                  "use an ep that divides the number of experts")
        if m is not None:
            etp = tp // self.ep if self.ep_mode == "tp" else (1 if self.ep_mode == "dp" else tp)
            if m.d_ff_expert % etp:
                raise LmcostError("tp", f"expert width {m.d_ff_expert} is not a multiple of {etp} (tp/ep)",
                                  "use a tp that divides the expert width")
            shared_tp = 1 if self.ep_mode == "dp" else tp
            if m.d_sh % shared_tp:
                raise LmcostError("tp", f"shared-expert width {m.d_sh} is not a multiple of tp={tp}",
                                  "use a tp that divides it")
        if batch is not None and batch % (self.dp * self.pp):
            raise LmcostError("workload.batch", f"{batch} sequences do not split into dp={self.dp} replicas x "
                              f"pp={self.pp} microbatches", f"use a batch that is a multiple of {self.dp * self.pp}")

    def microbatch(self, batch: int) -> int:
        """Sequences one GPU processes per pass: batch / (dp * pp) (pp microbatches keep every stage busy)."""
        return batch // (self.dp * self.pp)


def shard(cfg, x, layout: Layout, phase: str = "decode"):
    """The dims one GPU of ``layout`` computes with (:class:`lmcost.operators.forward.Dims`): heads, FFN widths and
    vocabulary divided by tp, KV heads by tp (at least one), experts by ep; under cp, a prefill's tokens
    (s/cp per rank, 1/cp of the causal pairs) or a decode step's cached context (t/cp per rank)."""
    if layout.single:
        return x
    if layout.cp > 1:
        x = replace(x, s=x.s / layout.cp, cp=layout.cp) if phase != "decode" else replace(x, t=x.t / layout.cp)
    tp = layout.tp
    m = cfg.moe
    if layout.ep_mode == "dp":
        etp, shared_tp, ep_tokens = 1, 1, layout.ep
    else:
        etp, shared_tp, ep_tokens = tp // layout.ep, tp, 1
    return replace(x, h=x.h // tp, h_kv=max(x.h_kv // tp, 1), d_ff=x.d_ff // tp, V=x.V // tp,
                   d_e=(x.d_e // etp) if m else x.d_e, d_sh=(x.d_sh // shared_tp) if m else x.d_sh,
                   ep=layout.ep, ep_tokens=ep_tokens, imbalance=layout.imbalance)


def comm(name: str, kind: str, group: str, ranks: int, payload, shapes: str) -> OpCost:
    """A collective on ``ranks`` GPUs of ``group`` moving ``payload`` bytes (nccl-tests' size): no FLOPs,
    no device-memory bytes counted (its time is the collective's, :mod:`lmcost.cost.collectives`)."""
    return OpCost(name, OpClass.COMMUNICATION, comm_bytes=payload, collective=kind, comm_group=group,
                  ranks=ranks, shapes=shapes, kind="collective")


def communication(cfg, ops: list[OpCost], x, layout: Layout, logits: str, phase: str = "decode") -> list[OpCost]:
    """``ops`` (one GPU's, built at the sharded dims ``x``) with the layout's communication operators
    inserted where the collectives run (see the module docstring)."""
    if layout.single:
        return ops
    n, tp, act = x.b * x.s, layout.tp, x.B_a
    row = n * x.d * act

    sp = layout.sp and tp > 1 and phase != "decode"  # a decode step's b tokens are often fewer than tp

    def tp_reduce(name, after: OpCost):
        if sp:
            return [comm(name.replace("all_reduce", "reduce_scatter"), "reduce_scatter", "tp", tp, row,
                         "partial sums [b,s,d] summed, scattered by sequence [b,s/tp,d]").in_layers(after.group, after.count),
                    comm(name.replace("all_reduce", "all_gather"), "all_gather", "tp", tp, row,
                         "[b,s/tp,d] gathered for the next column-parallel GEMMs").in_layers(after.group, after.count)]
        return [comm(name, "all_reduce", "tp", tp, row, "partial sums [b,s,d] summed over TP").in_layers(
            after.group, after.count)]

    moe_roles = [i for i, op in enumerate(ops) if op.role.startswith("moe.expert.")]
    first_expert = {ops[i].group: i for i in reversed(moe_roles)}
    last_expert = {ops[i].group: i for i in moe_roles}
    out = []
    for i, op in enumerate(ops):
        if sp and _sequence_sharded(op):
            op = replace(op, flops=op.flops / tp, act_read_bytes=op.act_read_bytes / tp,
                         act_write_bytes=op.act_write_bytes / tp, shapes=op.shapes + " (s/tp tokens: SP)")
        if layout.ep_mode == "dp" and first_expert.get(op.group) == i:
            pairs = x.k * n
            out += [comm("ep.counts", "all_to_all", "ep", layout.ep, x.E * 8,
                         "pairs per destination rank and its local expert [ep, E/ep] int64").in_layers(op.group, op.count),
                    comm("ep.dispatch", "all_to_all", "ep", layout.ep, pairs * x.d * act,
                         "routed rows [k*b*s, d] to their experts' ranks").in_layers(op.group, op.count)]
        out.append(op)
        if layout.ep_mode == "dp" and last_expert.get(op.group) == i:
            out.append(comm("ep.combine", "all_to_all", "ep", layout.ep, x.k * n * x.d * act * x.imbalance,
                            "expert outputs [k*b*s, d] (x imbalance on the busiest rank) back to their tokens' ranks"
                            ).in_layers(op.group, op.count))
        if tp == 1:
            continue
        role = op.role
        if role == "embed":
            if sp:
                out.append(comm("tp.embed_reduce_scatter", "reduce_scatter", "tp", tp, row,
                                "vocab-parallel lookups [b,s,d] summed, scattered by sequence"))
            else:
                out.append(comm("tp.embed_all_reduce", "all_reduce", "tp", tp, row, "vocab-parallel lookups [b,s,d]"))
        elif role == "attn.o_proj" and cfg.block != "parallel":
            out += tp_reduce("tp.attn_all_reduce", op)
        elif role in ("ffn.down", "moe.combine"):
            out += tp_reduce("tp.ffn_all_reduce" if role == "ffn.down" else "tp.moe_all_reduce", op)
        elif role == "lm_head":
            if sp:
                out.append(comm("tp.final_all_gather", "all_gather", "tp", tp, row,
                                "final norm's [b,s/tp,d] gathered for the lm_head"))
            if phase == "train":
                # Vocab-parallel cross-entropy (Megatron-LM): no logits gathered; the max, the sum of exps
                # and the target's logit of each token are all-reduced (fp32 [b*s] each).
                out.append(replace(comm("tp.ce_all_reduce", "all_reduce", "tp", tp, n * 4,
                                        "max, sum of exps and target logit [b*s] fp32 over the vocab shards"), count=3))
            else:
                n_logits = n if logits == "all" else x.b
                out.append(comm("tp.logits_all_gather", "all_gather", "tp", tp, n_logits * x.V * tp * act,
                                "vocab-parallel logits [b,s,V/tp] gathered to [b,s,V]"))
    if layout.cp > 1:
        out = _context_parallel(cfg, out, x, layout, phase)
    if layout.pp > 1:
        # Inserted after the last layer op: the path of one microbatch crosses pp - 1 stage boundaries.
        last_layer = max(i for i, op in enumerate(out) if op.group)
        out.insert(last_layer + 1, replace(comm("pp.send", "send_recv", "pp", 2, row,
                                                "activations [b,s,d] to the next stage"), count=layout.pp - 1))
    return out


def cluster_for(layout: Layout | None, gpu):
    """The cluster a layout runs on: its ``cluster`` (name or path), or the node lmcost assumes for ``gpu``.

    Raises: LmcostError if the named cluster is unknown, holds another GPU, or ``gpu`` has no node.
    """
    key = (layout.cluster if layout is not None else None, gpu.name)
    hit = _CLUSTERS.get(key)
    if hit is None:
        hit = _CLUSTERS[key] = _cluster_for(layout, gpu)
    return hit


#: Clusters resolved per (cluster name or path, GPU name): a YAML read once per process, not per estimate.
_CLUSTERS: dict = {}


def _cluster_for(layout: Layout | None, gpu):
    if layout is not None and layout.cluster:
        c = load_cluster(layout.cluster)
        if c.gpu != gpu.name and c.name != _default_name(gpu):
            raise LmcostError("layout.cluster", f"{c.name} holds {c.gpu} GPUs, not {gpu.name}",
                              f"pass `gpu` {c.gpu}, or a cluster of {gpu.name} (lmcost clusters list)")
        return c
    return default_cluster(gpu.name)


def _default_name(gpu) -> str | None:
    """The name of the node assumed for ``gpu`` (an A100-40GB sits in the DGX A100 too), or None."""
    return DEFAULT_NODE.get(gpu.name)


def staged(rec) -> list:
    """Payloads of a phase's collectives that need a buffer of their own (records of one GPU's phase):
    every kind but the all-reduce, which NCCL runs in place on the activations it reduces."""
    return [p for p, op in zip(rec.col("comm_bytes"), rec.graph.templates)
            if op.collective and op.collective != "all_reduce"]


def backward_comm(op: OpCost) -> OpCost | None:
    """The collective a forward communication op's backward issues (Megatron-LM's conjugate operators,
    Shoeybi et al. 2019, figure 3): a row-parallel output's all-reduce is the identity backward, but the
    column-parallel input it feeds needs its gradient all-reduced, so each layer's collectives recur with
    the same payload (SP: reduce-scatter and all-gather swap, the same payloads); pipeline sends return
    gradients of the same size; EP's dispatch and combine swap; CP's ring passes K/V and their gradients
    (twice the bytes). The embedding's all-reduce, the loss's and the MoE counts have none."""
    if op.role in ("tp.embed_all_reduce", "tp.embed_reduce_scatter", "tp.ce_all_reduce", "ep.counts"):
        return None
    name, role = f"bwd.{op.name}", f"bwd.{op.role}"
    if op.role == "cp.kv_ring":
        return replace(op, name=name, role=role, comm_bytes=2 * op.comm_bytes)
    return replace(op, name=name, role=role)


def _context_parallel(cfg, ops: list[OpCost], x, layout: Layout, phase: str) -> list[OpCost]:
    """Context parallelism's exchanges, after each layer's attention kernel (Liu et al. 2023, ring
    attention; Megatron-LM's CP): in a prefill, cp - 1 sends of this rank's K/V chunk [b, s/cp, K+V]
    (KV dtype) around the ring; in a decode step, each rank attends over its t/cp cached tokens and the
    partial outputs [b, h, d_v] with their log-sum-exp [b, h] (fp32) are all-gathered and merged.
    In a training step the flash kernel runs as ring attention does, one launch per K/V block: cp launches
    of s/cp queries against one block of s/cp keys (1/cp of the pairs each), so its ``mnk`` keeps 1/cp of
    the keys per query that the efficiency model's ramp reads (the whole sequence's in a prefill)."""
    cp, out = layout.cp, []
    mla = cfg.attention.mla is not None
    for op in ops:
        if phase == "train" and op.role == "attn.sdpa" and op.mnk is not None:
            m_, n_, k_ = op.mnk
            op = replace(op, mnk=(m_, n_, k_ / cp), kernels=cp,
                         shapes=op.shapes + f" (ring: {cp} blocks of s/cp keys)")
        out.append(op)
        if op.role != "attn.sdpa" and op.role != "attn.value":
            continue
        if phase == "decode":
            d_v = x.d_c if mla else x.d_h
            c = comm("cp.partial_all_gather", "all_gather", "cp", cp, cp * x.b * x.h * (d_v + 1) * 4,
                     "partial attention outputs [b,h,d_v] + log-sum-exp [b,h], fp32, from every rank")
            out.append(c.in_layers(op.group, op.count))
        else:
            c = comm("cp.kv_ring", "send_recv", "cp", 2, x.b * x.s * kv_width(cfg, x) * x.B_kv,
                     "this rank's K/V chunk [b,s/cp,K+V] to the next rank, cp - 1 times")
            out.append(replace(c.in_layers(op.group, op.count), count=op.count * (cp - 1)))
    return out


def _sequence_sharded(op: OpCost) -> bool:
    """Whether an op runs between a reduce-scatter and an all-gather under SP: the block's norms,
    residual adds and output dropouts (not the norms inside attention, which see the gathered tokens)."""
    role = op.role
    return (op.op_class is OpClass.NORM and not role.startswith(("attn.", "moe."))) or role.endswith("residual") \
        or role.endswith("out_dropout")


def stage_layers(cfg, pp: int, split: tuple | None = None) -> list[list[int]]:
    """Layer indices of each pipeline stage: ``split`` (layers per stage, first to last: an uneven split,
    :attr:`Layout.stage_split`), or by default numpy.array_split of range(L) into pp parts (the first
    L mod pp stages take one layer more)."""
    if split is None:
        base, extra = divmod(cfg.n_layers, pp)
        split = [base + (1 if i < extra else 0) for i in range(pp)]
    return _consecutive(split)


def _consecutive(sizes) -> list[list[int]]:
    """Consecutive layer indices in runs of ``sizes``."""
    out, start = [], 0
    for size in sizes:
        out.append(list(range(start, start + size)))
        start += size
    return out


def group_stride(layout: Layout, group: str) -> int:
    """GPUs between neighbouring ranks of one collective of ``group``, ranks placed TP innermost, then
    CP, DP/EP, then PP (as :func:`group_nodes`): tp 1; cp and ep tp; dp tp * cp; pp tp * cp * dp."""
    return {"tp": 1, "cp": layout.tp, "ep": layout.tp, "dp": layout.tp * layout.cp}.get(
        group, layout.tp * layout.cp * layout.dp)


def group_nodes(layout: Layout, group: str, gpus_per_node: int) -> int:
    """Nodes one collective of ``group`` spans, ranks placed TP innermost, then DP/EP, then PP."""
    if group == "tp":
        return math.ceil(layout.tp / gpus_per_node)
    if group == "cp":
        return math.ceil(layout.tp * layout.cp / gpus_per_node)
    if group == "ep":
        return math.ceil(layout.tp * layout.ep / gpus_per_node)
    if group == "dp":  # a training step's gradient reduction: dp ranks tp * cp apart
        return math.ceil(layout.tp * layout.cp * layout.dp / gpus_per_node)
    # pp: a send between stage i and i + 1, tp * dp ranks apart; in one node only if the stages are.
    return 1 if layout.gpus <= gpus_per_node else 2


def expected_collectives(cfg, layout: Layout, *, phase: str, batch: int, tokens: int, precision,
                         logits: str = "all") -> list[dict]:
    """Every collective each rank issues in one pass (``prefill`` over ``tokens`` new tokens, or one
    ``decode`` step), as records dict(rank, phase, kind, group, group_size, payload_bytes): the
    communication operators of :func:`communication` expanded over ranks, stages and layers, in the
    form :mod:`lmcost.profiling.distributed` records a real run. ``batch`` is the global batch (split
    over dp replicas; one microbatch: pp is the path of the whole batch here).

    Raises: LmcostError if the layout cannot split ``cfg`` (:meth:`Layout.check`).
    """
    layout.check(cfg)
    if batch % layout.dp:
        raise LmcostError("batch", f"{batch} sequences do not split over dp={layout.dp}", "use a multiple of dp")
    s = tokens if phase == "prefill" else 1
    t = tokens if phase == "prefill" else tokens
    x = shard(cfg, Dims.of(cfg, precision, batch // layout.dp, s, t), layout, phase)
    ops = communication(cfg, forward_ops(cfg, x, logits=logits), x, layout, logits, phase)
    stages = stage_layers(cfg, layout.pp, layout.stage_split)
    names = layer_group_names(cfg)
    records = []
    for stage, layers in enumerate(stages):
        first, last = stage == 0, stage == layout.pp - 1
        for r in range(layout.tp * layout.cp * layout.dp):
            rank = stage * layout.tp * layout.cp * layout.dp + r
            for op in ops:
                if op.op_class is not OpClass.COMMUNICATION:
                    continue
                if op.role == "pp.send":
                    reps = 0 if last else 1
                elif op.group:  # per layer: this stage's layers of the op's group
                    reps = sum(1 for i in layers if names[i] == op.group)
                elif op.role == "tp.embed_all_reduce":
                    reps = 1 if first else 0
                else:  # the lm_head's gather
                    reps = 1 if last else 0
                for _ in range(reps):
                    records.append(dict(rank=rank, phase=phase, kind=op.collective, group=op.comm_group,
                                        group_size=op.ranks, payload_bytes=op.comm_bytes))
    return records
