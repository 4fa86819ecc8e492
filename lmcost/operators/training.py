"""A training step: the forward pass (with dropout and the loss), then the backward of every operator.

Backward conventions (the cost of each forward operator's backward, stated once here):
- Matmuls with weights (GEMM, lm_head, router): dX = dY Wᵀ and dW = Xᵀ dY, twice the forward FLOPs
  (Kaplan et al. 2020, section 2.1: backward ≈ 2 x forward); reads dY twice, X and W; writes dX, dW.
- Attention matmuls of a naive kernel: the same rule (dQ, dK from dS; dP, dV from dO). A flash
  kernel's backward recomputes the scores: 2.5 x its forward matmul FLOPs (Dao 2023, FlashAttention-2,
  section 3.1: 5 matmuls against 2), reading Q, K, V, O, dO and writing dQ, dK, dV.
- Softmax: dX = Y * (dY - sum(dY * Y)), 4 FLOPs per element (multiply, sum, subtract, multiply);
  reads Y and dY, writes dX. The loss's backward is softmax - onehot: 2 FLOPs per logit.
- Norms: twice the forward FLOPs (the mean and variance terms of the input gradient, plus dγ, dβ);
  reads dY, X and the weight, writes dX and the weight's gradient.
- Elementwise (activation, gating, residual, RoPE, dropout): as many FLOPs as the forward (the
  derivative costs about what the function does, times the incoming gradient); reads dY and the
  inputs, writes dX.
- Embedding lookup: a scatter-add of dY into the table rows: 1 FLOP per element.
No optimizer step and no activation recomputation are counted.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.forward import Dims, forward_ops
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost
from lmcost.operators.parallel import backward_comm, communication

#: Backward FLOPs as a multiple of forward FLOPs, by operator kind.
BACKWARD_FLOPS = {"matmul": 2.0, "flash": 2.5, "softmax": 4 / FLOPS_PER_ELEMENT["softmax"], "norm": 2.0,
                  "elementwise": 1.0}


def backward(op: OpCost) -> OpCost:
    """The backward of one forward operator, under the conventions of this module."""
    inp = op.act_read_bytes + op.kv_read_bytes
    out = op.act_write_bytes + op.kv_write_bytes
    name, role = f"bwd.{op.name}", f"bwd.{op.role}"
    if op.role.startswith("loss."):
        return replace(op, name=name, role=role, flops=op.flops * 2 / FLOPS_PER_ELEMENT["softmax"], act_read_bytes=inp,
                       act_write_bytes=inp, kv_read_bytes=0, kv_write_bytes=0, params=0, active_params=None)
    if op.role in ("embed", "pos_embed"):
        return replace(op, name=name, role=role, flops=out / 2 if op.kind == "lookup" else op.flops, act_read_bytes=out,
                       act_write_bytes=0, weight_bytes=op.weight_bytes, params=0, active_params=None)
    if op.matmul:
        if op.role == "attn.sdpa":  # flash: recompute scores, read q k v o dO, write dq dk dv
            return replace(op, name=name, role=role, flops=op.flops * BACKWARD_FLOPS["flash"], act_read_bytes=inp + 2 * out,
                           act_write_bytes=inp, kv_read_bytes=0, kv_write_bytes=0, params=0, active_params=None)
        return replace(op, name=name, role=role, flops=op.flops * BACKWARD_FLOPS["matmul"], weight_bytes=2 * op.weight_bytes,
                       act_read_bytes=2 * out + inp, act_write_bytes=inp, kv_read_bytes=0, kv_write_bytes=0,
                       params=0, active_params=None)
    kind = {OpClass.SOFTMAX: "softmax", OpClass.NORM: "norm"}.get(op.op_class, "elementwise")
    return replace(op, name=name, role=role, flops=op.flops * BACKWARD_FLOPS[kind], weight_bytes=2 * op.weight_bytes,
                   act_read_bytes=out + inp, act_write_bytes=inp, kv_read_bytes=0, kv_write_bytes=0,
                   params=0, active_params=None)


def train_ops(cfg, x: Dims, kernel: str = "flash", mla_mode: str = "naive", layout=None) -> list[OpCost]:
    """Every operator of one training step over b sequences of s tokens (t = s): the forward with
    dropout and loss, then each operator's backward (named ``bwd.<forward name>``).

    Under a parallel ``layout`` (:class:`lmcost.operators.parallel.Layout`; ``x`` already one GPU's dims): the
    forward's communication (:func:`lmcost.operators.parallel.communication`) and each collective's backward
    (:func:`lmcost.operators.parallel.backward_comm`) on the path of one microbatch."""
    fwd = forward_ops(cfg, x, kernel, mla_mode, logits="all", train=True)
    if layout is not None and not layout.single:
        fwd = communication(cfg, fwd, x, layout, "all", "train")
    bwd = []
    for op in reversed(fwd):
        b = backward_comm(op) if op.op_class is OpClass.COMMUNICATION else backward(op)
        if b is not None:
            bwd.append(b)
    return fwd + bwd
