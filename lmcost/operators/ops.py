"""The cost record of one operator, and the primitives every bigger operator is a sum of.

Conventions (they bite in every formula below):
- 2 FLOPs per multiply-accumulate.
- Each operator is one kernel: it reads its inputs from and writes its outputs to device memory.
  Nothing is assumed to stay in cache between operators (no fusion across the ops listed).
- Bytes are split by what they are: weights read, activations read/written, KV cache read/written
  (the split of LLM-Viewer's ``model_analyzer``). ``bytes`` is their sum.
- Quantities are whatever the dims are: ints give exact numbers, numpy arrays give grids,
  sympy Symbols give formulas (see :mod:`lmcost.basics.notation`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from lmcost.basics.opclasses import KINDS, OpClass  # noqa: F401 (re-exported: every op record carries its class)



#: How many FLOPs the elementwise work of one element costs. Counting conventions, not measurements:
#: RMSNorm x^2, sum, scale by rsqrt, times weight = 4; LayerNorm mean, subtract, square, sum, scale,
#: times weight = 6 (+1 with bias); softmax max, subtract, exp, sum, divide = 5; SiLU x*sigmoid(x) = 4
#: (negate, exp, add, divide... counted as 4 as in torch's pointwise cost tables); GELU (tanh form) = 8;
#: ReLU = 1; RoPE x*cos + rot(x)*sin = 3; a residual add or gating multiply = 1; a weightless L2 norm
#: (Llama 4) x^2, sum, scale = 3; soft-capping c*tanh(x/c) = 3; an ALiBi bias m*(i-j) added to a score = 2;
#: gpt-oss's clamped SwiGLU (with its gating multiply) min, clamp (2), alpha*g, sigmoid (4), g*sig, up + 1,
#: multiply = 11.
FLOPS_PER_ELEMENT = {
    "rmsnorm": 4, "layernorm": 6, "layernorm_bias": 7, "softmax": 5,
    "relu": 1, "relu2": 2, "gelu": 8, "silu": 4, "sigmoid": 4, "rope": 3, "add": 1, "mul": 1,
    "l2norm": 3, "softcap": 3, "alibi": 2, "swiglu_clamped": 11,
}




#: Ivanov et al. 2021's operator classes (Table 1), from ours. Softmax counts as normalization.
IVANOV_CLASSES = {"gemm": "tensor contraction", "attention": "tensor contraction", "embedding": "tensor contraction", "lm_head": "tensor contraction",
                  "moe_routing": "tensor contraction", "norm": "normalization", "softmax": "normalization",
                  "elementwise": "element-wise",
                  # constant-state mixers (lmcost.operators.recurrent): conv, gates, state updates; their scan matmuls
                  # (``mixer.ssm``, in RECURRENT_CONTRACTIONS) are tensor contractions
                  "recurrent": "element-wise"}
#: Roles of recurrent-class ops that are matmuls (the SSD einsums / the state-times-C product).
RECURRENT_CONTRACTIONS = ("mixer.ssm",)

@dataclass(frozen=True)
class OpCost:
    """FLOPs and bytes of one operator in one layer (or of the whole model, for count=1 ops).

    Units: ``flops`` in FLOPs; ``*_bytes`` in bytes; ``params`` in elements (weights this op owns,
    all experts included, whether or not they are read); ``count`` is how many layers run it.
    ``active_params`` is the share of ``params`` one token uses (routed experts: k of E); None means all.
    ``matmul`` marks tensor-core work (GEMMs, attention matmuls); the rest runs at the vector rate.
    ``shapes`` keeps a shape note such as ``x [b,s,d] @ W_q [d,h*d_h]``.
    ``mnk``: for a GEMM, (M, N, K) of one kernel: M rows (tokens), N outputs, K the contraction
    (the calibrated efficiency model reads tile and wave quantization off it); None otherwise.
    ``kind``: the kernel it runs (``gemm``, ``rmsnorm``, ``layernorm``, ``add``, ``silu_mul``, ``rope``...,
    see KINDS): the efficiency model may hold figures per kind, finer than per class.
    ``kernels``: kernel launches one execution takes (each pays the per-kernel overhead of the
    calibrated model); 0 for work done inside another op's kernel (the softmax of a flash kernel).
    ``role``: what the op is within its layer, whatever group it sits in (``attn.q_proj``, ``ffn.gate``,
    ``moe.expert.up``, ``attn_residual``, ``embed``, ``lm_head``, ``loss.cross_entropy``; a backward op
    ``bwd.<role>``); it defaults to the name given at construction, and code that asks what an op is
    (fusion, training, parameter counts) reads it rather than parsing names.
    ``comm_bytes``, ``collective``, ``comm_group``, ``ranks``: a communication op's payload (bytes,
    nccl-tests' size), its kind (``all_reduce``...), the group it runs over (``tp``, ``ep``, ``pp``) and
    that group's size (:mod:`lmcost.operators.parallel`); 0 and empty for every other op.
    ``q_per_stream``: a flash kernel's query heads per KV stream of its ``mnk`` (h / h_kv under GQA; 1 else):
    its thread blocks run per query head (:func:`lmcost.cost.efficiency.prefill_occupancy`).
    ``row_width``: for a norm or pointwise kernel, the elements of one token's row (a norm's width, a gated
    activation's d_ff, RoPE's rotated q and k elements per token): a kernel that runs one thread block per row
    walks it serially, which the per-row latency of an engine's kernel figures scales with
    (:class:`lmcost.hardware.engine_memory.RowKindFigures`); 0 where no such figure applies.
    ``quant``: for a GEMM over a weight a quantization recipe stores in its low-precision format, that
    recipe's name (:mod:`lmcost.model.quant`): its compute dtype on a GPU is
    :func:`lmcost.cost.roofline.gemm_dtype`; empty for every other op (they run at the run's dtypes).
    """

    name: str
    op_class: OpClass
    flops: Any = 0
    weight_bytes: Any = 0
    act_read_bytes: Any = 0
    act_write_bytes: Any = 0
    kv_read_bytes: Any = 0
    kv_write_bytes: Any = 0
    params: Any = 0
    count: Any = 1
    shapes: str = ""
    matmul: bool = False
    active_params: Any = None
    group: str = ""
    mnk: Any = None
    kernels: Any = 1
    kind: str = ""
    role: str = ""
    comm_bytes: Any = 0
    collective: str = ""
    comm_group: str = ""
    ranks: int = 1
    q_per_stream: Any = 1
    quant: str = ""
    row_width: Any = 0

    def __post_init__(self):
        if not self.role:
            object.__setattr__(self, "role", self.name)

    @property
    def bytes(self):
        """All bytes moved to and from device memory by one execution (bytes)."""
        return (self.weight_bytes + self.act_read_bytes + self.act_write_bytes
                + self.kv_read_bytes + self.kv_write_bytes)

    def in_layers(self, group: str, count) -> "OpCost":
        """This op as part of ``count`` identical layers named ``group`` (``layers``, ``layers.moe``)."""
        return replace(self, name=f"{group}.{self.name}", count=count, group=group)


def linear(name: str, n_tok, d_in, d_out, B_w, B_a, bias: bool = False, op_class=OpClass.GEMM,
           out_bytes=None, shapes: str = "") -> OpCost:
    """A dense projection y = x W (+ bias).

    Shapes: x [n_tok, d_in] @ W [d_in, d_out] -> y [n_tok, d_out]; n_tok = b*s tokens.
    Returns: flops = 2*n_tok*d_in*d_out; the bias add is not counted, as torch.utils.flop_counter
    counts addmm (its bias is read: weight bytes (d_in*d_out (+d_out))*B_w); reads x, writes y
    (``out_bytes`` per element if y goes into the KV cache: then it is a KV write).
    Source: 2 FLOPs per MAC (Kaplan et al. 2020, section 2.1).
    """
    params = d_in * d_out + (d_out if bias else 0)
    return OpCost(name, op_class, flops=2 * n_tok * d_in * d_out, weight_bytes=params * B_w,
                  act_read_bytes=n_tok * d_in * B_a,
                  act_write_bytes=n_tok * d_out * (B_a if out_bytes is None else 0),
                  kv_write_bytes=0 if out_bytes is None else n_tok * d_out * out_bytes,
                  params=params, shapes=shapes, matmul=True, mnk=(n_tok, d_out, d_in), kind="gemm")


def norm(name: str, kind: str, bias: bool, n_tok, width, B_w, B_a, shapes: str = "", weight: bool = True) -> OpCost:
    """LayerNorm or RMSNorm over the last dim.

    Shapes: x [n_tok, width] -> y [n_tok, width]; weight [width] (+ bias [width]).
    Returns: flops = FLOPS_PER_ELEMENT[kind] * n_tok * width; reads x and the weight, writes y.
    ``weight=False``: a norm without learned weight or bias (OLMo-1's LayerNorm): no params, no weight
    read, one FLOP per element fewer (no scaling by the weight).
    Source: Ba et al. 2016 (LayerNorm); Zhang & Sennrich 2019 (RMSNorm).
    """
    key = "layernorm_bias" if kind == "layernorm" and bias and weight else kind
    params = width * (2 if (kind == "layernorm" and bias) else 1) if weight else 0
    return OpCost(name, OpClass.NORM, flops=(FLOPS_PER_ELEMENT[key] - (0 if weight else 1)) * n_tok * width,
                  weight_bytes=params * B_w, act_read_bytes=n_tok * width * B_a,
                  act_write_bytes=n_tok * width * B_a, params=params, shapes=shapes, kind=kind, row_width=width)


def lookup(name: str, n_tok, width, rows, B_w, B_a, shapes: str = "") -> OpCost:
    """An embedding lookup: n_tok rows of a [rows, width] table gathered into [n_tok, width].

    Returns: no FLOPs; reads the n_tok*width table elements it gathers (weights), writes the output.
    """
    return OpCost(name, OpClass.EMBEDDING, weight_bytes=n_tok * width * B_w, act_write_bytes=n_tok * width * B_a,
                  params=rows * width, shapes=shapes, kind="lookup")


def add(name: str, n_elements, B_a, inputs: int = 2, shapes: str = "") -> OpCost:
    """A sum of ``inputs`` tensors of ``n_elements`` (a residual add): inputs - 1 FLOPs per element."""
    return elementwise(name, n_elements, inputs, (inputs - 1) * FLOPS_PER_ELEMENT["add"], B_a, shapes=shapes, kind="add")


def elementwise(name: str, n_elements, n_inputs: int, flops_per_element, B_a,
                op_class=OpClass.ELEMENTWISE, shapes: str = "", kind: str = "", row_width=0) -> OpCost:
    """A pointwise kernel over ``n_elements`` outputs reading ``n_inputs`` tensors of the same size.

    Returns: flops = flops_per_element * n_elements; reads n_inputs*n_elements, writes n_elements
    elements of the activation dtype.
    """
    return OpCost(name, op_class, flops=flops_per_element * n_elements,
                  act_read_bytes=n_inputs * n_elements * B_a, act_write_bytes=n_elements * B_a,
                  shapes=shapes, kind=kind, row_width=row_width)
