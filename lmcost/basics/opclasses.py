"""The names every layer shares for operators: their classes (the rows of per-class tables, and keys of a
GPU's efficiency block) and the kernel kinds a fitted figure may be keyed by."""

from __future__ import annotations

from enum import Enum


class OpClass(str, Enum):
    """Operator classes, the rows of the per-class tables."""

    GEMM = "gemm"                # tensor contraction with a weight matrix
    ATTENTION = "attention"      # score (QK^T) and value (PV) matmuls, fused or not
    SOFTMAX = "softmax"          # softmax over attention scores (naive kernel only)
    NORM = "norm"                # LayerNorm / RMSNorm
    ELEMENTWISE = "elementwise"  # activation, gating multiply, residual add, RoPE
    EMBEDDING = "embedding"      # token/position lookup
    LM_HEAD = "lm_head"          # the output projection to logits (a GEMM, reported on its own)
    MOE_ROUTING = "moe_routing"  # router logits and top-k
    RECURRENT = "recurrent"      # constant-state mixers: short conv, SSM scan, delta rule (lmcost.operators.recurrent)
    COMMUNICATION = "communication"  # a collective or send between GPUs (lmcost.operators.parallel)


#: Kernel kinds the efficiency model may key figures by (beside the classes): a gated activation is
#: ``<act>_mul`` (``silu_mul``: SiLU-and-mul), a plain one its nonlinearity's name.
KINDS = ("gemm", "sdpa", "rmsnorm", "layernorm", "fused_add_rmsnorm", "fused_add_layernorm", "add", "rope", "combine",
         "topk", "lookup",
         "relu", "relu2", "gelu", "silu", "sigmoid", "relu_mul", "gelu_mul", "silu_mul", "sigmoid_mul")
