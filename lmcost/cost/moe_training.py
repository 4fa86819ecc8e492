"""What a MoE layer's training step runs beside its experts: the token permutations around the all-to-all.

The training graph (:func:`lmcost.operators.training.train_ops`) holds a MoE layer's router, top-k, expert GEMMs
(one per local expert, over its share of the pairs: :func:`lmcost.operators.ffn.moe_ops`), the EP all-to-alls
(:func:`lmcost.operators.parallel.communication`) and the weighted combine (which is the unpermute: a gather of
each token's k expert rows, weighted and summed). It does not hold the copies that put the rows in the order the
all-to-all and the grouped GEMM need. Megatron-Core's all-to-all token dispatcher
(``megatron/core/transformer/moe/token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``; ``moe_utils.permute``
and ``sort_chunks_by_idxs``) runs, per MoE layer and microbatch, forward:

- ``permute``: the k x n (token, expert) rows of d gathered in destination order before the dispatch
  (``index_select``): reads and writes k n d elements (n = b s tokens of this rank);
- under EP over several ranks with several local experts, ``sort_chunks_by_idxs`` after the dispatch (rows
  from each source rank regrouped by local expert) and its inverse before the combine all-to-all: each reads
  and writes the P rows of d this rank's experts run (P = k n_group / ep x imbalance);

and in the backward each again on the gradients (the gradient of a row gather is the row scatter of the same
rows). Memory-bound copies: 0 FLOPs, bytes = 2 x rows x d x B_a each, timed as the GPU's other memory-bound
kernels (:func:`lmcost.cost.phases.op_totals`). DeepEP (github.com/deepseek-ai/DeepEP) fuses the first permute
into its dispatch kernel; Megatron-Core's default (``moe_token_dispatcher_type: alltoall``) does not, and it is
the dispatcher of the Megatron-Bridge performance recipes the fitting set's MoE rows come from.
"""

from __future__ import annotations

from lmcost.operators.ops import OpClass, OpCost


def permute_ops(rec) -> list[tuple[int, OpCost]]:
    """The permutation copies of one microbatch's MoE layers (see the module docstring), each with the index of
    the op it runs beside: forward copies beside the group's ``moe.combine``, backward ones beside
    ``bwd.moe.combine`` (so stages, recompute and the pipeline carry them as they carry the combine).

    ``rec``: the training records of one GPU (:func:`lmcost.cost.phases.phase_records`, phase ``train``): roles
    from its templates, numbers from its columns at the workload. Rows and width from the group's first forward
    expert GEMM (m, k = rows per expert, d; ``kernels`` the experts it runs: P = m x kernels rows of d), the
    tokens from its ``moe.combine`` (writes n x d elements of B_a), k = the combine's inputs (reads / writes)
    less the shared expert's. Returns: [(index, OpCost with ``count`` the group's layers)]; [] for a dense
    model. Raises: nothing."""
    ops, c = rec.graph.templates, rec.cols
    out = []
    for g in sorted({op.group for op in ops if op.role == "moe.combine"}, key=str):
        idx = {op.role: i for i, op in enumerate(ops) if op.group == g}
        e = next((i for i, op in enumerate(ops) if op.group == g and op.role.startswith("moe.expert.")
                  and op.op_class is OpClass.GEMM), None)
        if e is None:
            continue
        j = idx["moe.combine"]
        pairs_d = float(c.m[e]) * float(c.kernels[e]) * float(c.k[e])  # P rows x d
        B_a = float(c.act_read_bytes[e]) / pairs_d
        n_d = float(c.act_write_bytes[j]) / B_a  # n tokens x d
        shared = any(op.group == g and op.role.startswith("moe.shared.") for op in ops)
        k = float(c.act_read_bytes[j]) / float(c.act_write_bytes[j]) - (1 if shared else 0)
        rows = [("moe.permute", k * n_d, "k*n rows [k*b*s, d] gathered in destination order")]
        if "ep.dispatch" in idx and float(c.kernels[e]) > 1:
            rows += [("moe.sort_chunks", pairs_d, "received rows [P, d] grouped by local expert"),
                     ("moe.unsort_chunks", pairs_d, "expert outputs [P, d] back in source-rank order")]
        for role, where in (("moe.combine", ""), ("bwd.moe.combine", "bwd.")):
            if role not in idx:
                continue
            for name, elements, shapes in rows:
                out.append((idx[role], OpCost(f"{g}.{where}{name}", OpClass.ELEMENTWISE, flops=0,
                                              act_read_bytes=elements * B_a, act_write_bytes=elements * B_a,
                                              shapes=shapes, kind="copy", count=float(c.count[j]), group=g)))
    return out


def permute_seconds(rec, gpu, precision, model: str) -> dict[int, float]:
    """Seconds over layers of :func:`permute_ops` (``rec``: one GPU's training records), summed per index of the
    op they run beside (one microbatch), timed as memory-bound kernels on ``gpu``
    (:func:`lmcost.cost.phases.op_totals`, ``model`` roofline or calibrated). Returns: {index: seconds}; {} for a
    dense model. Raises: nothing."""
    from lmcost.cost.phases import op_totals

    out: dict[int, float] = {}
    for i, op in permute_ops(rec):
        out[i] = out.get(i, 0.0) + float(op_totals([op], gpu, precision, model).time_s)
    return out
