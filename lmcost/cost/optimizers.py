"""Model states of a training step: weights, gradients, master copy and optimizer states, per GPU.

Notation: P parameters (elements) on one GPU's pipeline stage; a parameter tensor of shape [r, c]
(torch's ``nn.Linear`` layout [d_out, d_in]; a stack of E experts [E, r, c]); dp data-parallel ranks.

Per parameter, under a precision recipe (:data:`PRECISIONS`) and an optimizer (:data:`OPTIMIZERS`):

    weights (B_w) + gradients (B_g) + fp32 master copy (B_m, mixed precision only) + optimizer states

summed, never the max of them (a mistake some public calculators make), and AdamW's two moments are
2 x 4 = 8 bytes per parameter in fp32, 12 with the master copy (not "4x the weights"). Mixed-precision
AdamW: 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter (Rajbhandari et al. 2020, ZeRO, section 3.1: "2Ψ +
2Ψ + KΨ" with K = 12); Megatron-LM keeps fp32 main gradients: 2 + 4 + 4 + 8 = 18 (Megatron-LM docs,
"Distributed Optimizer": bf16 params with fp32 grads take 18 bytes per parameter, 6 + 12/d with the
optimizer distributed over d ranks, i.e. ZeRO-1 here).

What torch allocates, per parameter tensor (``torch.optim`` 2.13, read from its source):

- AdamW: ``exp_avg`` and ``exp_avg_sq`` like the parameter, and ``step``, a 0-dim fp32 tensor on the
  CPU (on the device, still fp32, when ``fused`` or ``capturable``). ``step_bytes`` reports those
  4 bytes per tensor apart: the default (for-each) AdamW does not hold them in device memory.
- SGD with momentum: ``momentum_buffer`` like the gradient (a clone of the first one); no ``step``.
- Adafactor (``torch.optim.Adafactor``): no first moment (it has no beta1); for a tensor of 2 or
  more dims, the second moment factored over its last two dims: ``row_var`` [..., r, 1] and
  ``col_var`` [..., 1, c] (r + c values per matrix, E(r + c) for an expert stack); for a 1-D tensor
  the full ``variance``; plus a 0-dim fp32 ``step`` on the CPU. States take the gradient's dtype.
- Muon (``torch.optim.Muon``): accepts 2-D parameters only and keeps one ``momentum_buffer`` like the
  gradient, no ``step``. Real recipes (Jordan et al. 2024, Moonlight: Liu et al. 2025) run AdamW on the
  embeddings, norms, biases and lm_head; ``muon`` here is Muon on the 2-D matrices inside the layers
  (router included) and AdamW on every other tensor (3-D expert stacks too, which torch's Muon refuses).
- Adam 8-bit (bitsandbytes ``AdamW8bit``, not installed here: read from bitsandbytes 0.50.2,
  ``bitsandbytes/optim/optimizer.py``, ``Optimizer2State.init_state``): a tensor of at least
  ``min_8bit_size`` = 4096 elements keeps ``state1`` and ``state2`` in uint8 and one fp32 ``absmax``
  per block of 256 values for each (``blocksize = 256``; older releases used blocks of 2048),
  2 + 8/256 = 2.03125 bytes per parameter; a smaller one keeps both states in fp32 (8 bytes per
  element, whatever the precision recipe); ``step`` is a Python int (no tensor); the two 256-entry fp32
  quantisation maps (``qmap1``/``qmap2``, 2 KiB) are shared by every tensor of the optimizer.

ZeRO (Rajbhandari et al. 2020) over the dp ranks: stage 1 shards the optimizer states and the master
copy, stage 2 also the gradients, stage 3 also the weights (= FSDP FULL_SHARD); 0 is DDP. How a
framework cuts the shards (``sharding``):

- ``flat`` (DeepSpeed ZeRO, Megatron-LM's distributed optimizer): every component is one flat buffer
  padded to a multiple of dp: ceil(N/dp) elements per rank. The analytic form, for any model.
- ``fsdp2`` (``torch.distributed.fsdp.fully_shard``, ZeRO-3 only): each tensor is cut on dim 0 by
  ``torch.chunk`` into dp pieces of ceil(r/dp) rows (the last ones shorter or empty); a rank's
  parameter storage is padded to ceil(r/dp) x (rest) per tensor, so rank 0 holds the most (torch's cut,
  rank by rank, is written out as the oracle in tests/oracles.py).
- ``greedy`` (``torch.distributed.optim.ZeroRedundancyOptimizer``, ZeRO-1 only): whole tensors go to
  ranks, largest first, each to the rank with the fewest elements so far (:func:`zero1_partition`),
  so a rank's states are not exactly 1/dp of them; the busiest rank is counted.

The recipes count each component as a stored tensor. FSDP2 with a bf16 ``MixedPrecisionPolicy`` keeps
its sharded parameters in fp32 (they are the master copy) and casts them to bf16 only in the unsharded,
transient all-gather buffers: there ``bf16-mixed`` over-counts by the bf16 shard, 2 bytes per parameter
over dp (use ``fp32`` precision with bf16 compute for FSDP2's persistent states).

Under expert parallelism over DP (``layout.ep_mode == "dp"``), expert tensors are already split over
ep of the dp ranks; ZeRO shards them over the remaining dp/ep. Context-parallel ranks are counted as
replicas that ZeRO does not shard over (Megatron-LM shards over dp x cp: a figure per rank that is
at most this one).

LoRA (Hu et al. 2021): adapters A [r, d_in] and B [d_out, r] (PEFT's ``lora_A``/``lora_B`` weights;
x A^T B^T = x W_A W_B with W_A [d_in, r], W_B [r, d_out]) beside each targeted projection; only they are
trainable (gradients, master copy and optimizer states); the frozen base holds its weights only.
QLoRA (Dettmers et al. 2023, section 3): the base's matrices in 4-bit NF4, block 64, the block
absmax quantised to 8 bits in blocks of 256 with an fp32 absmax each ("double quantisation"):
4 + 8/64 + 32/(64 x 256) = 4.127 bits per parameter (:data:`QLORA_BITS_PER_PARAM`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from lmcost.basics.dtypes import Precision, bytes_per_element
from lmcost.basics.errors import LmcostError
from lmcost.basics.results import Result
from lmcost.operators.recurrent import conv_channels, state_elements
from lmcost.operators.forward import Dims, forward_ops, layer_group_names
from lmcost.cost.memory import _stage_statics
from lmcost.operators.parallel import Layout, shard, stage_layers

# ---------------------------------------------------------------------------------------------------
# Parameter tensors of one GPU


#: Roles of the tensors that are not hidden matrices (Muon leaves them to AdamW).
_OUTER = ("embed", "pos_embed", "lm_head")


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor as one GPU holds it: ``role`` (the owning op's role + ``.weight``/``.bias``,
    or ``.lora_A``/``.lora_B`` for an adapter), ``shape`` (elements, torch's layout), ``count`` (copies
    on the GPU: the layers of its group in the stage), ``trainable``, and ``quantised`` (a frozen matrix
    a QLoRA base keeps in NF4)."""

    role: str
    shape: tuple
    count: int = 1
    trainable: bool = True
    quantised: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def hidden_matrix(self) -> bool:
        """A 2-D weight inside the layers: what Muon optimises (not the embedding or lm_head)."""
        return len(self.shape) == 2 and self.role.rsplit(".", 1)[0] not in _OUTER


def _op_tensors(cfg, op) -> list[tuple[str, tuple]]:
    """(role, shape) of every tensor an operator owns, in the reference decoder's layout.

    Shapes: a GEMM of mnk (m, n, k) owns W [n, k] (+ bias [n]); a routed-expert GEMM owns E_owned
    stacked [E_owned, n, k]; a norm owns weight [w] (+ bias [w] for a LayerNorm with bias); an embedding
    [V, d]. Raises: AssertionError for an op whose parameters fit none of these (a new op kind).
    """
    p = int(op.params)
    if op.role in ("embed", "pos_embed"):
        return [(f"{op.role}.weight", (p // cfg.d_model, cfg.d_model))]
    if op.mnk is not None:
        _, n, k = (int(v) for v in op.mnk)
        if op.role.startswith("moe.expert."):
            if cfg.moe is not None and cfg.moe.expert_bias:  # gpt-oss: a bias [E_owned, n] beside the stack
                if p % (n * k + n):
                    raise AssertionError(f"{op.name}: {p} params are not a stack of [{n}, {k}] matrices + biases")
                e = p // (n * k + n)
                return [(f"{op.role}.weight", (e, n, k)), (f"{op.role}.bias", (e, n))]
            if p % (n * k):
                raise AssertionError(f"{op.name}: {p} params are not a stack of [{n}, {k}] matrices")
            return [(f"{op.role}.weight", (p // (n * k), n, k))]
        if p == n * k:
            return [(f"{op.role}.weight", (n, k))]
        if p in (n * k + n, n):  # with its bias; a tied lm_head's bias alone (CTRL: the weight is the embedding)
            return ([(f"{op.role}.weight", (n, k))] if p > n else []) + [(f"{op.role}.bias", (n,))]
        raise AssertionError(f"{op.name}: {p} params do not fit W [{n}, {k}] (+ bias)")
    if op.role == "mixer.conv":  # a depthwise conv (lmcost.operators.recurrent): W [C, K] (+ bias [C])

        for kind in {k for k, _ in cfg.layer_kinds() if k in ("mamba2", "short_conv", "gated_deltanet")}:
            C, K = conv_channels(cfg, kind), state_elements(cfg, kind)[1]
            if p in (C * K, C * K + C):
                return [(f"{op.role}.weight", (C, K))] + ([(f"{op.role}.bias", (C,))] if p > C * K else [])
    vectors = {"mixer.ssm_state": ("A_log", "dt_bias", "D"), "mixer.delta_state": ("A_log", "dt_bias"),  # per head
               "ffn.act": ("alpha_p", "alpha_n"), "attn.diff": ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}
    if op.role in vectors:  # xIELU's two scalars (Apertus), DiffLlama's four lambdas [d_h]
        return [(f"{op.role}.{n}", (p // len(vectors[op.role]),)) for n in vectors[op.role]]
    if op.role == "attn.sinks":  # gpt-oss: one logit per head [h]
        return [(f"{op.role}.weight", (p,))]
    if op.op_class.value == "norm" or op.kind in ("rmsnorm", "layernorm"):
        if op.kind == "layernorm" and (cfg.norm_bias or op.role in ("attn.q_norm", "attn.k_norm")):  # Persimmon's
            return [(f"{op.role}.weight", (p // 2,)), (f"{op.role}.bias", (p // 2,))]
        return [(f"{op.role}.weight", (p,))]
    raise AssertionError(f"{op.name}: {p} params of an op kind lmcost cannot shape")


def param_tensors(cfg, layout=None) -> list[list[ParamTensor]]:
    """The parameter tensors one GPU of each pipeline stage holds under ``layout``
    (:class:`lmcost.operators.parallel.Layout`; None: one GPU), TP/EP-sharded as :func:`lmcost.operators.parallel.shard`
    cuts the dims: stage 0 has the embedding, the last the final norm and lm_head (a tied table as a
    copy when pp > 1). Read off the operator graph (naive MLA: one W_UKV [h*(d_nope+d_v), d_c]).

    Returns: one list per stage. Their element counts equal :func:`lmcost.cost.memory._stage_statics`'s.
    Raises: AssertionError if they do not (a graph op this module cannot shape).
    """

    layout = layout or Layout()
    x = shard(cfg, Dims.of(cfg, Precision(), 1, 1, 1), layout)
    ops = forward_ops(cfg, x, mla_mode="naive")
    per_group: dict = {}
    top: dict = {"first": [], "last": []}
    for op in ops:
        if not op.params:
            continue
        tensors = _op_tensors(cfg, op)
        if op.group:
            per_group.setdefault(op.group, []).extend(tensors)
        else:
            top["first" if op.role in ("embed", "pos_embed", "embed_norm") else "last"].extend(tensors)
    if cfg.tie_embeddings and layout.pp > 1 and cfg.embeddings:
        top["last"] += [(r, s) for r, s in top["first"] if r == "embed.weight"]  # the last stage's copy
    groups = layer_group_names(cfg)
    stages = stage_layers(cfg, layout.pp, layout.stage_split)
    out = []
    for i, layers in enumerate(stages):
        counts: dict = {}
        for j in layers:
            counts[groups[j]] = counts.get(groups[j], 0) + 1
        stage = [ParamTensor(role, shape, c) for g, c in counts.items() for role, shape in per_group.get(g, [])]
        if i == 0:
            stage = [ParamTensor(r, s) for r, s in top["first"]] + stage
        if i == len(stages) - 1:
            stage += [ParamTensor(r, s) for r, s in top["last"]]
        out.append(stage)
    statics = _stage_statics(cfg, Precision(), layout)
    for i, (stage, st) in enumerate(zip(out, statics)):
        if sum(t.numel * t.count for t in stage) != st[0]:
            raise AssertionError(f"stage {i}: tensors hold {sum(t.numel * t.count for t in stage)} params, "
                                 f"the graph {st[0]}")
    return out


# ---------------------------------------------------------------------------------------------------
# Precision recipes


@dataclass(frozen=True)
class TrainPrecision:
    """Dtypes of the model states: working ``weights``, ``grads``, the ``master`` copy (None: the
    weights are the master) and the optimizer ``states``; ``source`` says where the recipe is from."""

    name: str
    weights: str
    grads: str
    master: str | None
    states: str
    source: str

    @property
    def B_w(self):
        return bytes_per_element(self.weights)

    @property
    def B_g(self):
        return bytes_per_element(self.grads)

    @property
    def B_m(self):
        return bytes_per_element(self.master) if self.master else 0

    @property
    def B_s(self):
        return bytes_per_element(self.states)


PRECISIONS: dict[str, TrainPrecision] = {p.name: p for p in (
    TrainPrecision("bf16-mixed", "bf16", "bf16", "fp32", "fp32",
                   "Rajbhandari et al. 2020 (ZeRO), section 3.1: 2 + 2 + 12 = 16 B/param with Adam"),
    TrainPrecision("bf16-mixed-fp32-grads", "bf16", "fp32", "fp32", "fp32",
                   "Megatron-LM distributed optimizer docs: bf16 params, fp32 main grads, 18 B/param with Adam"),
    TrainPrecision("fp16-mixed", "fp16", "fp16", "fp32", "fp32",
                   "Micikevicius et al. 2018 (mixed precision with loss scaling): as bf16-mixed, 16 B/param with Adam"),
    TrainPrecision("fp32", "fp32", "fp32", None, "fp32", "plain fp32 training: 4 + 4 + 8 = 16 B/param with Adam"),
    TrainPrecision("bf16", "bf16", "bf16", None, "bf16",
                   "pure bf16 (weights, grads and optimizer states, no master copy): 2 + 2 + 4 = 8 B/param with Adam"),
)}


def train_precision(name: str) -> TrainPrecision:
    """Raises: LmcostError (``precision``) for an unknown recipe, listing the known ones."""
    if name not in PRECISIONS:
        raise LmcostError("precision", f"unknown recipe {name!r}", f"use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


# ---------------------------------------------------------------------------------------------------
# Optimizers: bytes torch allocates per parameter tensor

#: torch's ``step`` tensors: 0-dim fp32 (``_get_scalar_dtype``; fp64 only under a float64 default dtype).
STEP_BYTES = 4
#: bitsandbytes 8-bit optimizers (0.50.2, ``Optimizer2State.init_state``): tensors below this many
#: elements keep fp32 states; 8-bit ones one fp32 absmax per block of this many values per state.
BNB_MIN_8BIT_SIZE = 4096
BNB_BLOCK = 256
#: The two 256-entry fp32 quantisation maps an 8-bit optimizer shares between its tensors.
BNB_QMAP_BYTES = 2 * 256 * 4


def _adamw(t: ParamTensor, shape: tuple, B_s) -> tuple:
    return 2 * math.prod(shape) * B_s, STEP_BYTES


def _sgd(t: ParamTensor, shape: tuple, B_s) -> tuple:
    return math.prod(shape) * B_s, 0


def _adafactor(t: ParamTensor, shape: tuple, B_s) -> tuple:
    if len(shape) >= 2:
        # row_var [..., r, 1] + col_var [..., 1, c]
        lead = math.prod(shape[:-2])
        return lead * (shape[-2] + shape[-1]) * B_s, STEP_BYTES
    return math.prod(shape) * B_s, STEP_BYTES


def _muon(t: ParamTensor, shape: tuple, B_s) -> tuple:
    if t.hidden_matrix:
        return math.prod(shape) * B_s, 0
    return _adamw(t, shape, B_s)


def _adam8bit(t: ParamTensor, shape: tuple, B_s) -> tuple:
    n = math.prod(shape)
    if n < BNB_MIN_8BIT_SIZE:
        return 2 * n * 4, 0
    return 2 * n + 2 * 4 * -(-n // BNB_BLOCK), 0


@dataclass(frozen=True)
class Optimizer:
    """An optimizer by what it stores: ``per_tensor(tensor, shape, B_s)`` -> (bytes of its state tensors
    in device memory, bytes of its 0-dim ``step`` tensors) for one copy of a parameter tensor of
    ``shape`` with states of B_s bytes per element; ``shared_bytes`` once per optimizer (8-bit maps)."""

    name: str
    stores: str
    per_tensor: Callable
    shared_bytes: int = 0


OPTIMIZERS: dict[str, Optimizer] = {o.name: o for o in (
    Optimizer("adamw", "exp_avg, exp_avg_sq like the parameter; step (0-dim fp32, CPU)", _adamw),
    Optimizer("adam8bit", "state1, state2 uint8 + fp32 absmax per 256 values each (fp32 below 4096 elements); "
              "2 shared 256-entry fp32 maps", _adam8bit, BNB_QMAP_BYTES),
    Optimizer("sgd", "momentum_buffer like the gradient", _sgd),
    Optimizer("adafactor", "row_var [..,r,1] + col_var [..,1,c] for >= 2-D, variance for 1-D; step; no first moment",
              _adafactor),
    Optimizer("muon", "Muon momentum_buffer for 2-D hidden matrices; AdamW states for the rest", _muon),
)}


def optimizer(name: str) -> Optimizer:
    """Raises: LmcostError (``optimizer``) for an unknown optimizer, listing the known ones."""
    if name not in OPTIMIZERS:
        raise LmcostError("optimizer", f"unknown optimizer {name!r}", f"use one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]


# ---------------------------------------------------------------------------------------------------
# Greedy ZeRO-1 sharding as torch's ZeroRedundancyOptimizer does it


def zero1_partition(param_sizes: list[int], dp: int) -> list[list[int]]:
    """Indices of the parameters each of ``dp`` ranks owns under torch's ZeroRedundancyOptimizer
    (one parameter group): sorted by size, largest first (a stable sort: ties keep their order), each to
    the rank with the fewest elements so far (the lowest such rank on a tie).
    Source: torch/distributed/optim/zero_redundancy_optimizer.py, ``_partition_parameters``."""
    ranks: list[list[int]] = [[] for _ in range(dp)]
    sizes = [0] * dp
    for i in sorted(range(len(param_sizes)), key=lambda j: param_sizes[j], reverse=True):
        r = sizes.index(min(sizes))
        ranks[r].append(i)
        sizes[r] += param_sizes[i]
    return ranks


# ---------------------------------------------------------------------------------------------------
# LoRA


#: Short LoRA target names -> the op roles they adapt (PEFT's q_proj/k_proj/... in Llama-style models).
LORA_TARGETS = {
    "q": ("attn.q_proj",), "k": ("attn.k_proj",), "v": ("attn.v_proj",), "o": ("attn.o_proj",),
    "gate": ("ffn.gate", "moe.shared.gate"), "up": ("ffn.up", "moe.shared.up"), "down": ("ffn.down", "moe.shared.down"),
}
#: Bits per parameter of a QLoRA base matrix: NF4 (4) + uint8 absmax per block of 64 (8/64) + fp32 absmax
#: of those per block of 256 (32/(64*256)). Dettmers et al. 2023 (QLoRA), section 3, "Double Quantization".
QLORA_BITS_PER_PARAM = 4 + 8 / 64 + 32 / (64 * 256)
#: Per 4-bit tensor, besides: the absmax offset (fp32), the nested quantiser's 256-entry fp32 code map
#: (copied per tensor) and the 16-entry fp32 NF4 code (bitsandbytes 0.50.2 ``quantize_4bit``).
NF4_TENSOR_BYTES = 4 + 256 * 4 + 16 * 4


def nf4_bytes(numel: int) -> int:
    """Bytes of one tensor of ``numel`` elements in bitsandbytes' NF4 with double quantisation: packed
    4-bit codes ceil(n/2), uint8 absmax per block of 64, fp32 absmax per 256 of those, and
    NF4_TENSOR_BYTES."""
    blocks = -(-numel // 64)
    return -(-numel // 2) + blocks + 4 * -(-blocks // 256) + NF4_TENSOR_BYTES


@dataclass(frozen=True)
class LoRA:
    """LoRA adapters of rank ``rank`` on the projections named in ``targets`` (short names of
    LORA_TARGETS, or op roles such as ``attn.kv_a_proj`` or ``moe.expert.up``); the frozen base in
    ``base_dtype`` (``int4``/``nf4``: QLoRA's NF4 for the base's matrices inside the layers; embeddings,
    norms, biases and lm_head stay bf16, as bitsandbytes leaves them).

    Raises: LmcostError for a rank below 1, an empty or unknown target, or an unknown base dtype.
    """

    rank: int
    targets: tuple = ("q", "k", "v", "o")
    base_dtype: str = "bf16"

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 1 <= self.rank <= 1 << 16:
            raise LmcostError("lora.rank", f"must be a whole number from 1 to 65536, got {self.rank!r}",
                              "give the adapters' rank, e.g. 16")
        object.__setattr__(self, "targets", tuple(self.targets))
        if not self.targets:
            raise LmcostError("lora.targets", "no projection named", "name some, e.g. q,k,v,o")
        for t in self.targets:
            if t not in LORA_TARGETS and "." not in t:
                raise LmcostError("lora.targets", f"unknown target {t!r}",
                                  f"use {', '.join(LORA_TARGETS)} or an op role such as attn.q_proj")
        base = "int4" if self.base_dtype == "nf4" else self.base_dtype
        if base not in ("bf16", "fp16", "fp32", "int4"):
            raise LmcostError("lora.base_dtype", f"unknown base dtype {self.base_dtype!r}", "use bf16, fp16, fp32 or int4")
        object.__setattr__(self, "base_dtype", base)

    @property
    def roles(self) -> set:
        return {r for t in self.targets for r in LORA_TARGETS.get(t, (t,))}

    def check_rank(self, tensors: list[ParamTensor], model: str) -> None:
        """Refuse a rank above min(d_out, d_in) of a targeted weight [d_out, d_in] (unsharded): B A then
        has rank at most min(d_out, d_in), so a larger r adds parameters and memory but no rank (Hu et al.
        2021, section 4.1: r << min(d, k)). Raises: LmcostError (lora.rank) naming the smallest bound."""
        dims = [(min(t.shape[-2:]), t.role.rsplit(".", 1)[0], t.shape[-2:]) for t in tensors
                if t.role.endswith(".weight") and t.role.rsplit(".", 1)[0] in self.roles and len(t.shape) >= 2]
        if dims and self.rank > min(dims)[0]:
            top, role, (n, k) = min(dims)
            raise LmcostError("lora.rank", f"{self.rank} exceeds min(d_out, d_in) = {top} of {role} [{n}, {k}] in "
                              f"{model}: B A has rank at most {top}", f"use a rank of at most {top} (16 to 64 is usual)")

    def apply(self, tensors: list[ParamTensor]) -> list[ParamTensor]:
        """The stage's tensors with the base frozen (its inner matrices quantised under QLoRA) and
        adapters A [r, k] and B [n, r] (stacked per expert) after each targeted weight [n, k]."""
        out = []
        for t in tensors:
            role, part = t.role.rsplit(".", 1)
            quant = self.base_dtype == "int4" and len(t.shape) >= 2 and role not in _OUTER
            out.append(ParamTensor(t.role, t.shape, t.count, trainable=False, quantised=quant))
            if part == "weight" and role in self.roles and len(t.shape) >= 2:
                *lead, n, k = t.shape
                out += [ParamTensor(f"{role}.lora_A", (*lead, self.rank, k), t.count),
                        ParamTensor(f"{role}.lora_B", (*lead, n, self.rank), t.count)]
        return out


# ---------------------------------------------------------------------------------------------------
# Model states


SHARDINGS = ("flat", "fsdp2", "greedy")


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelStates(Result):
    """The model states one GPU holds in a training step, for its busiest pipeline stage (bytes)."""

    #: Working weights (a frozen base included), gradients, the fp32 master copy (0 without mixed
    #: precision) and the optimizer's state tensors in device memory.
    weights_bytes: int
    grads_bytes: int
    master_bytes: int
    optimizer_bytes: int
    #: torch's 0-dim ``step`` tensors, CPU-resident by default: not in ``total_bytes``.
    step_bytes: int
    #: The stage's weights and trainable gradients before ZeRO (the DP collectives' payloads).
    weights_unsharded_bytes: int
    grads_unsharded_bytes: int
    #: The working weights of the ``updated_params`` this GPU's optimizer updates (elements).
    weights_shard_bytes: int
    updated_params: int
    #: Trainable and frozen elements on the stage, before ZeRO.
    trainable_params: int
    frozen_params: int
    #: weights + grads + master + optimizer.
    total_bytes: int
    #: The pipeline stage counted (0-based): the one whose total is the largest.
    stage: int


def _ceil(a, b):
    return -(-a // b)


def _stage_states(tensors: list[ParamTensor], opt: Optimizer, prec: TrainPrecision, base_B, zero: int,
                  sharding: str, dp_of: Callable, stage: int) -> ModelStates:
    """Bytes of one stage's model states on its busiest GPU (see :func:`model_states`)."""
    B_s = prec.B_s
    # Unsharded amounts per ZeRO pool (a shard degree: dp, or dp/ep for experts under EP over DP).
    pools: dict = {}
    for t in tensors:
        pool = pools.setdefault(dp_of(t), dict(w_train=0, w_frozen=0, p_train=0, states=0, steps=0, tensors=[]))
        if t.trainable:
            pool["p_train"] += t.numel * t.count
            pool["w_train"] += t.numel * t.count * prec.B_w
            s, st = opt.per_tensor(t, t.shape, B_s)
            pool["states"] += s * t.count
            pool["steps"] += st * t.count
        else:
            pool["w_frozen"] += t.count * (nf4_bytes(t.numel) if t.quantised else t.numel * base_B)
        pool["tensors"].append(t)
    out = dict(weights_bytes=0, grads_bytes=0, master_bytes=0, optimizer_bytes=0, step_bytes=0,
               weights_unsharded_bytes=0, grads_unsharded_bytes=0, weights_shard_bytes=0, updated_params=0,
               trainable_params=0, frozen_params=0)
    for n, pool in pools.items():
        p = pool["p_train"]
        out["trainable_params"] += p
        out["frozen_params"] += sum(t.numel * t.count for t in pool["tensors"] if not t.trainable)
        w_all = pool["w_train"] + pool["w_frozen"]
        out["weights_unsharded_bytes"] += w_all
        out["grads_unsharded_bytes"] += p * prec.B_g
        if sharding == "flat" or n == 1:
            def sh(amount, stage, n=n):
                return _ceil(amount, n) if zero >= stage else amount

            # elements ceil-divided, then times their width: one padded flat buffer per component
            out["weights_bytes"] += (_ceil(p, n) * prec.B_w if zero >= 3 else pool["w_train"]) + sh(pool["w_frozen"], 3)
            out["grads_bytes"] += (_ceil(p, n) if zero >= 2 else p) * prec.B_g
            out["master_bytes"] += (_ceil(p, n) if zero >= 1 else p) * prec.B_m
            out["optimizer_bytes"] += sh(pool["states"], 1)
            out["step_bytes"] += sh(pool["steps"], 1)
            upd = _ceil(p, n) if zero >= 1 else p
        elif sharding == "fsdp2":
            # rank 0: ceil(dim0/n) rows of every tensor (the padded shard; the largest one)
            w = g = m = s = st = upd = 0
            for t in pool["tensors"]:
                local = (_ceil(t.shape[0], n), *t.shape[1:])
                k = math.prod(local) * t.count
                if not t.trainable:
                    w += t.count * (nf4_bytes(math.prod(local)) if t.quantised else math.prod(local) * base_B)
                    continue
                w += k * prec.B_w
                g += k * prec.B_g
                m += k * prec.B_m
                s_, st_ = opt.per_tensor(t, local, B_s)
                s, st, upd = s + s_ * t.count, st + st_ * t.count, upd + k
            out["weights_bytes"] += w
            out["grads_bytes"] += g
            out["master_bytes"] += m
            out["optimizer_bytes"] += s
            out["step_bytes"] += st
        else:  # greedy: whole tensors to ranks; the rank with the most state bytes
            flat = [(t, i) for t in pool["tensors"] if t.trainable for i in range(t.count)]
            owners = zero1_partition([t.numel for t, _ in flat], n)
            per_rank = []
            for idx in owners:
                s = st = m = k = 0
                for i in idx:
                    t = flat[i][0]
                    s_, st_ = opt.per_tensor(t, t.shape, B_s)
                    s, st, m, k = s + s_, st + st_, m + t.numel * prec.B_m, k + t.numel
                per_rank.append((s + m, s, st, m, k))
            _, s, st, m, upd = max(per_rank)
            out["weights_bytes"] += w_all
            out["grads_bytes"] += p * prec.B_g
            out["master_bytes"] += m
            out["optimizer_bytes"] += s
            out["step_bytes"] += st
        out["updated_params"] += upd
        out["weights_shard_bytes"] += upd * prec.B_w
    if opt.shared_bytes and any(t.trainable and t.numel >= BNB_MIN_8BIT_SIZE for t in tensors):
        out["optimizer_bytes"] += opt.shared_bytes
    out["total_bytes"] = out["weights_bytes"] + out["grads_bytes"] + out["master_bytes"] + out["optimizer_bytes"]
    return ModelStates(**out, stage=stage)


def model_states(cfg, layout=None, *, optimizer: str = "adamw", precision: str = "bf16-mixed", zero: int = 0,
                 lora: LoRA | None = None, sharding: str = "flat") -> ModelStates:
    """Bytes of the model states one GPU holds in a training step, for the busiest pipeline stage.

    ``layout``: :class:`lmcost.operators.parallel.Layout` (None: one GPU); TP/PP/EP cut the parameters as
    :func:`param_tensors` does, ZeRO stage ``zero`` (0-3) shards them over dp as ``sharding`` says
    (module docstring). ``lora``: train adapters only (:class:`LoRA`).

    Returns: :class:`ModelStates` (its fields name each amount and its unit).
    Raises: LmcostError for an unknown optimizer, precision or sharding, a zero stage outside 0-3, a
    sharding that does not model that stage, LoRA targets the model does not have, or a LoRA rank above a
    targeted projection's (:meth:`LoRA.check_rank`).
    """
    layout = layout or Layout()
    opt, prec = globals()["optimizer"](optimizer), train_precision(precision)
    if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
        raise LmcostError("zero", f"must be 0, 1, 2 or 3, got {zero!r}", "0: DDP; 1-3: ZeRO stages (3 = FSDP)")
    if sharding not in SHARDINGS:
        raise LmcostError("sharding", f"unknown sharding {sharding!r}", f"use one of {', '.join(SHARDINGS)}")
    if (sharding == "fsdp2" and zero != 3) or (sharding == "greedy" and zero != 1):
        raise LmcostError("sharding", f"{sharding} models ZeRO-{3 if sharding == 'fsdp2' else 1} only, got zero={zero}",
                          "use sharding flat for the other stages")
    stages = param_tensors(cfg, layout)
    base_B = prec.B_w
    if lora is not None:
        present = {t.role.rsplit(".", 1)[0] for st in stages for t in st}
        if not lora.roles & present:
            raise LmcostError("lora.targets", f"none of {', '.join(lora.targets)} is a projection of {cfg.name}",
                              f"use some of {', '.join(sorted(r for r in present if r not in _OUTER))}")
        lora.check_rank([t for st in (param_tensors(cfg) if layout.tp * layout.ep > 1 else stages) for t in st],
                        cfg.name)
        stages = [lora.apply(st) for st in stages]
        base_B = 2 if lora.base_dtype == "int4" else bytes_per_element(lora.base_dtype)
    dp, ep = layout.dp, layout.ep
    expert_dp = dp // ep if layout.ep_mode == "dp" else dp

    def dp_of(t):
        return expert_dp if t.role.startswith("moe.expert.") else dp

    best = None
    for i, st in enumerate(stages):
        s = _stage_states(st, opt, prec, base_B, zero, sharding, dp_of, i)
        if best is None or s.total_bytes > best.total_bytes:
            best = s
    return best
