"""The cost of one operator on its own, for people sizing a kernel rather than a model (``lmcost op``).

Each builder returns the operator's cost records from the same primitives the model graph uses
(:mod:`lmcost.operators.ops`, :mod:`lmcost.operators.attention`), so a GEMM here is costed exactly as a projection in
``estimate``. :func:`cost` evaluates them on a GPU under both time models.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.attention import attention_core, kv_elements, rope
from lmcost.basics.dtypes import bytes_per_element, canonical
from lmcost.basics.errors import LmcostError
from lmcost.cost.compile import Records
from lmcost.cost.phases import PhaseCost
from lmcost.operators.workload import MAX_COUNT, check_count
from lmcost.operators.forward import Dims
from lmcost.hardware.gpu import GPU
from lmcost.operators.ffn import activation
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, add, linear, norm as norm_op
from lmcost.cost.roofline import bound, intensity
from lmcost.basics.dtypes import Precision
from lmcost.model.quant import FORMATS, FP4_GEMMS
from lmcost.operators.quant import as_number

#: Elementwise kinds ``lmcost op elementwise`` knows: gated activations (act(gate) * up), plain
#: activations, the residual add, and RoPE.
ELEMENTWISE_KINDS = ("silu_mul", "gelu_mul", "relu_mul", "sigmoid_mul", "silu", "gelu", "relu", "relu2", "add", "rope")


def _dims(dtype: str, **kw) -> Dims:
    B = bytes_per_element(canonical(dtype, "dtype"))
    base = dict(b=1, s=1, t=1, d=0, h=0, h_kv=0, d_h=0, d_ff=0, V=0, L=1, B_w=B, B_a=B, B_kv=B)
    return Dims(**{**base, **kw})


def gemm(m: int, n: int, k: int, dtype: str = "bf16", fp4_format: str = "NVFP4") -> list[OpCost]:
    """C [m,n] = A [m,k] @ B [k,n]: 2*m*n*k FLOPs; reads A and B, writes C (dtype elements).

    ``dtype`` fp4: a W4A4 GEMM at the fp4 peak, A and B in ``fp4_format``, the block format of the GPU's FP4
    tensor cores (:attr:`lmcost.hardware.gpu.GPU.fp4_format`), C written in bf16 (2 B per element; the
    block-scaled fp4 GEMMs of cuBLASLt and CUTLASS as vLLM and TensorRT-LLM call them, and hipBLASLt's, write
    a 16-bit output, recalled). Bytes per A or B element (:data:`lmcost.model.quant.FORMATS`, exact):
    NVFP4 (NVIDIA Blackwell, as ModelOpt NVFP4 checkpoints run): 16 e2m1 values (8 B) and one e4m3 scale per
    16 elements along K, 9/16 B, plus one fp32 scale per tensor; MXFP4 (OCP MX v1.0, AMD CDNA 4): 32 e2m1
    values (16 B) and one e8m0 scale per 32, 17/32 B. The record's ``shapes`` names the format.
    Raises: LmcostError for a size out of [1, 2^31], an unknown dtype (listing fp4 beside the storage
    dtypes), or an ``fp4_format`` other than NVFP4 and MXFP4.
    """
    for name, v in (("m", m), ("n", n), ("k", k)):
        check_count(name, v)
    shapes = f"A [{m},{k}] @ B [{k},{n}] -> C [{m},{n}]"
    if str(dtype).lower() == "fp4":
        if fp4_format not in FP4_GEMMS:
            raise LmcostError("fp4_format", f"unknown FP4 format {fp4_format!r}", f"use one of {', '.join(FP4_GEMMS)}")
        fmt = FORMATS[fp4_format]
        op = linear("gemm", m, k, n, 2, 2, shapes=shapes + f" ({fp4_format} A and B, bf16 C)")
        return [replace(op, weight_bytes=as_number(fmt.nbytes(n, k)), act_read_bytes=as_number(fmt.nbytes(m, k)),
                        quant=FP4_GEMMS[fp4_format].name)]
    try:
        B = bytes_per_element(canonical(dtype, "dtype"))
    except LmcostError as e:  # the storage dtypes, and the rate-only fp4 only a GEMM takes
        raise LmcostError(e.field, e.what, e.fix + ", or fp4 (a W4A4 GEMM in the GPU's FP4 format)") from None
    return [linear("gemm", m, k, n, B, B, shapes=shapes)]


def attention(phase: str, batch: int, heads: int, kv_heads: int, head_dim: int, seq: int | None = None,
              kv_len: int | None = None, causal: bool = True, dtype: str = "bf16") -> list[OpCost]:
    """A fused (flash) attention kernel: softmax(Q K^T / sqrt(d_h)) V over GQA heads.

    Shapes: Q [b, h, s, d_h]; K, V [b, h_kv, t, d_h]; O [b, h, s, d_h]. Decode: s = 1 at t = kv_len.
    Prefill: s = seq new tokens over t = kv_len keys (default seq); with t > s the queries are the last
    s positions (bottom-right causal mask: a chunk of prefill over a cache). Causal pairs are
    s*t - s*(s-1)/2 (see :mod:`lmcost.operators.attention`); FLOPs 4*b*h*pairs*d_h plus 5 per pair for the softmax.
    Raises: LmcostError for heads that kv_heads does not divide, t < s, a decode with seq > 1, or a decode
    that is not causal (its one query is the last position: a causal mask hides no key from it, so the
    choice means nothing).
    """
    if phase not in ("prefill", "decode"):
        raise LmcostError("attention.phase", f"unknown phase {phase!r}", "use prefill or decode")
    for name, v in (("attention.batch", batch), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        check_count(name, v)
    if heads % kv_heads:
        raise LmcostError("kv_heads", f"{kv_heads} does not divide `heads` {heads}",
                          "use a divisor of `heads` (1: MQA, = `heads`: MHA)")
    if phase == "decode":
        if seq not in (None, 1):
            raise LmcostError("seq", f"a decode step has one new token, got {seq}", "drop `seq`, or use `attention.phase` prefill")
        if kv_len is None:
            raise LmcostError("kv_len", "missing", "give the context a decode step attends to")
        if not causal:
            raise LmcostError("attention.causal", "a decode step's one query is the last position: it sees every "
                              "key with or without a causal mask", "drop it (it changes nothing in decode)")
        s, t = 1, kv_len
    else:
        if seq is None:
            raise LmcostError("seq", "missing", "give the prefill length")
        s, t = seq, seq if kv_len is None else kv_len
    check_count("seq", s)
    check_count("kv_len", t, MAX_COUNT)
    if t < s:
        raise LmcostError("kv_len", f"{t} is shorter than `seq` {s}", "the keys include the new tokens: use `kv_len` >= `seq`")
    x = _dims(dtype, b=batch, s=s, t=t, h=heads, h_kv=kv_heads, d_h=head_dim)
    n = batch * s
    B = x.B_a
    k_el, v_el = kv_elements(x, mla=False)
    ops = attention_core(x, False, "flash", heads, head_dim, head_dim, q_bytes=n * heads * head_dim * B,
                         k_bytes=batch * t * k_el * B, v_bytes=batch * t * v_el * B, causal=causal)
    note = (f"Q [{batch},{heads},{s},{head_dim}], K/V [{batch},{kv_heads},{t},{head_dim}] -> O [{batch},{heads},{s},{head_dim}]"
            + (", causal" if causal else ""))
    return [replace(ops[0], shapes=note), *ops[1:]]


def norm(kind: str, tokens: int, hidden: int, dtype: str = "bf16", bias: bool = False,
         residual: bool = False) -> list[OpCost]:
    """RMSNorm or LayerNorm over [tokens, hidden] (weight [hidden], LayerNorm bias optional).

    ``residual``: the kernel serving engines run for every norm of a decoder but the first layer's input norm,
    the residual add fused into it (vLLM's fused_add_rms_norm, FlashInfer's fused_add_rmsnorm): r' = x + r,
    y = norm(r') * w. It reads x, r [tokens, hidden] and the weight, and writes y and r' (the new residual):
    4 * tokens * hidden activation elements and hidden weight elements, FLOPs those of the add and the norm.
    Built from the add and the norm by the graph's own ``add_norm`` fusion
    (:func:`lmcost.operators.fusion.apply_fusion`), so it is costed as that fusion is in ``estimate``.
    Raises: LmcostError for a size out of range.
    """
    check_count("norm.tokens", tokens)
    check_count("hidden", hidden)
    B = bytes_per_element(canonical(dtype, "dtype"))
    plain = norm_op(kind, kind, bias, tokens, hidden, B, B, shapes=f"[{tokens},{hidden}] -> [{tokens},{hidden}]")
    if not residual:
        return [plain]
    from lmcost.operators.fusion import apply_fusion

    pair = [add("residual", tokens * hidden, B, shapes=f"x [{tokens},{hidden}] + residual [{tokens},{hidden}]")
            .in_layers("op", 1), plain.in_layers("op", 1)]
    (fused,) = apply_fusion(pair, ("silu_mul", "add_norm"))
    return [replace(fused, name=f"fused_add_{kind}", group="", role=f"fused_add_{kind}",
                    shapes=f"x, residual [{tokens},{hidden}] -> out, residual [{tokens},{hidden}]")]


def elementwise(kind: str, tokens: int, width: int | None = None, heads: int | None = None,
                kv_heads: int | None = None, head_dim: int | None = None, dtype: str = "bf16") -> list[OpCost]:
    """A pointwise kernel over [tokens, width].

    ``<act>_mul``: act(gate) * up, reading gate and up [tokens, width], writing [tokens, width] (vLLM's
    silu_and_mul). ``<act>``: one input. ``add``: a residual add. ``rope``: RoPE on Q [tokens, heads,
    head_dim] and K [tokens, kv_heads, head_dim] in place, with cos/sin [tokens, head_dim] (Su et al. 2021).
    Raises: LmcostError for an unknown kind or a missing width/heads.
    """
    if kind not in ELEMENTWISE_KINDS:
        raise LmcostError("kind", f"unknown kind {kind!r}", f"use one of {', '.join(ELEMENTWISE_KINDS)}")
    check_count("elementwise.tokens", tokens)
    B = bytes_per_element(canonical(dtype, "dtype"))
    if kind == "rope":
        if width is not None:
            raise LmcostError("width", "rope has no width", "give `heads`, `kv_heads` and `head_dim` instead")
        for name, v in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if v is None:
                raise LmcostError(name, "missing", "rope needs `heads`, `kv_heads` and `head_dim`")
            check_count(name, v)
        if heads % kv_heads:
            raise LmcostError("kv_heads", f"{kv_heads} does not divide `heads` {heads}", "use a divisor of `heads`")
        if head_dim % 2:
            raise LmcostError("head_dim", f"RoPE rotates pairs of elements; {head_dim} is odd", "use an even width")
        x = _dims(dtype, s=tokens, t=tokens, r=head_dim)
        return [replace(rope(x, tokens, heads * head_dim, kv_heads * head_dim, B),
                        shapes=f"q [{tokens},{heads},{head_dim}], k [{tokens},{kv_heads},{head_dim}] by cos/sin [{tokens},{head_dim}]")]
    for name, v in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if v is not None:
            raise LmcostError(name, f"only rope takes it, not {kind}", f"drop `{name}`")
    if width is None:
        raise LmcostError("width", "missing", f"{kind} needs `width` (elements per token)")
    check_count("width", width)
    if kind == "add":
        return [add("add", tokens * width, B, shapes=f"[{tokens},{width}] + [{tokens},{width}]")]
    act, gated = kind.removesuffix("_mul"), kind.endswith("_mul")
    return [activation(kind, tokens * width, act, gated, B, shapes=f"{act}(gate [{tokens},{width}]) * up [{tokens},{width}]"
                       if gated else f"{act}([{tokens},{width}])", row_width=width)]


def softmax(rows: int, cols: int, dtype: str = "bf16") -> list[OpCost]:
    """A standalone softmax over the last dim of [rows, cols]: reads and writes rows*cols elements,
    5 FLOPs per element (max, subtract, exp, sum, divide: :data:`lmcost.operators.ops.FLOPS_PER_ELEMENT`).

    Raises: LmcostError for a size out of range.
    """
    check_count("rows", rows)
    check_count("cols", cols)
    B = bytes_per_element(canonical(dtype, "dtype"))
    n = rows * cols
    return [OpCost("softmax", OpClass.SOFTMAX, flops=FLOPS_PER_ELEMENT["softmax"] * n, act_read_bytes=n * B,
                   act_write_bytes=n * B, shapes=f"[{rows},{cols}] -> [{rows},{cols}]", kind="softmax")]


def op_dtype(dtype: str, gpu: GPU, op: str) -> str:
    """The canonical ``dtype`` (``bfloat16`` -> ``bf16``) of operator ``op`` on ``gpu``, checked before the operator
    is built so that a refusal names only the dtypes ``op`` runs in there: the storage dtypes the GPU has a peak for
    (:attr:`lmcost.hardware.gpu.GPU.compute_dtypes`: a memory-bound norm or pointwise kernel still takes the peak of
    its dtype for its compute term, :func:`cost`), int4 left out (no int4 activations are modelled,
    :class:`lmcost.basics.dtypes.Precision`), and, for ``op`` ``gemm`` on a GPU with an fp4 peak, fp4 (a GEMM's
    operand format: no norm, pointwise or attention kernel here reads fp4 elements). ``op`` names the operator in
    the message (gemm, attention, rmsnorm, layernorm, an elementwise kind); fp4 of a GEMM passes through, for
    :func:`cost` to check against the GPU's fp4 peak.

    Raises: LmcostError (dtype) for a name that is no dtype, or one ``op`` does not run in on ``gpu``; a GPU
    without compute peaks gets :meth:`lmcost.hardware.gpu.GPU.dtype_fix`'s fix.
    """
    key = str(dtype).strip().lower()
    if key == "fp4" and op == "gemm":
        return key
    takes = [d for d in gpu.compute_dtypes if d != "int4"]
    takes += [f"fp4 ({gpu.fp4_format} A and B)"] * (op == "gemm" and "fp4" in gpu.peak_tflops)
    fix = f"use `dtype` {' or '.join(takes)}" if takes else gpu.dtype_fix()
    try:
        key = canonical(key, "dtype")
    except LmcostError:
        if key != "fp4":
            raise LmcostError("dtype", f"unknown dtype {dtype!r}", fix) from None
        raise LmcostError("dtype", f"{op} takes no fp4: fp4 is the operand format of a GEMM on fp4 tensor cores "
                          "(op gemm)", fix) from None
    if key not in takes:
        raise LmcostError("dtype", f"{op} on {gpu.name} takes no {key}", fix)
    return key


def cost(ops: list[OpCost], gpu: GPU, dtype: str = "bf16") -> dict:
    """FLOPs, bytes, intensity, bound and time of one operator (the sum of its records) on ``gpu``.

    Returns: dict with flops (FLOPs), matmul_flops, bytes, arithmetic_intensity (FLOPs/byte),
    bound (of the roofline), compute_s and memory_s (roofline terms summed over the records: for
    attention, the matmuls at the tensor rate and the in-kernel softmax at the vector rate, so
    time_s.roofline is the sum of each record's max, not the max of these sums), time_s {roofline,
    calibrated, calibrated_low, calibrated_high} (seconds; calibrated equals roofline when the GPU has
    no efficiency block; low/high: the calibrated time's expected error band, from the efficiency
    block's ``bands``, equal to it where the block has none), efficiency (bool), kernel and runtime
    (the efficiency block's selection, None without a block).
    Raises: LmcostError if the GPU does not support ``dtype`` (for fp4: no fp4 peak, or a GEMM built in another FP4
    format than the GPU's, :attr:`lmcost.hardware.gpu.GPU.fp4_format`), or the operator's operands and result do not
    fit in the GPU's memory: each record reads its inputs and writes its output once (flash attention: Q,
    K, V and O), so ``bytes`` is what must be resident at once, and a kernel bigger than the device (a 2 TB
    GEMM on an 80 GB GPU) runs on no GPU of that kind: its time would mean nothing.
    """
    if str(dtype).lower() == "fp4":  # a GEMM of gemm(..., "fp4"): its op runs at the fp4 peak (OpCost.quant)
        if "fp4" not in gpu.peak_tflops:
            other = gpu.dtype_fix().removeprefix("use ")  # the GPU's dtypes, or (no peaks at all) what to do
            raise LmcostError("dtype", f"{gpu.name} has no fp4 peak", "fp4 GEMMs are costed on GPUs with fp4 tensor "
                              f"cores (B200, B300, GB200, GB300, MI355X, RTX PRO 6000); or {other}")
        built = sorted({f for f, r in FP4_GEMMS.items() for op in ops if op.quant == r.name} - {gpu.fp4_format})
        if built:  # gemm(..., "fp4") builds NVFP4 operands unless told the GPU's format
            raise LmcostError("fp4_format", f"the GEMM's operands are {built[0]}, and {gpu.name}'s FP4 tensor cores run "
                              f"{gpu.fp4_format}", f"build it with gemm(..., fp4_format={gpu.fp4_format!r})")
        dtype, p = "fp4", Precision("bf16", "bf16", "bf16")
    else:
        dtype = canonical(dtype, "dtype")
        if dtype not in gpu.peak_tflops:
            raise LmcostError("dtype", f"{gpu.name} has no {dtype} support", gpu.dtype_fix())
        p = Precision(dtype, dtype, dtype)
    tot = PhaseCost(Records.of_ops(list(ops)), gpu, p, "", "roofline").totals()
    flops, bytes_ = tot.flops, tot.bytes
    if bytes_ > gpu.memory_bytes:
        raise LmcostError("sizes", f"the operands and result ({bytes_ / 1e9:.4g} GB) do not fit in {gpu.name}'s "
                          f"{gpu.memory_gb:g} GB memory, so no kernel of these sizes runs on it",
                          "check the sizes, or cost a slice that fits")
    return dict(
        gpu=gpu.name, dtype=dtype, shapes=" ; ".join(op.shapes for op in ops if op.kernels),
        flops=int(flops) if float(flops).is_integer() else float(flops),
        matmul_flops=int(sum(op.flops for op in ops if op.matmul)),
        bytes=int(bytes_) if float(bytes_).is_integer() else float(bytes_),
        arithmetic_intensity=float(intensity(flops, bytes_)), bound=str(bound(tot.compute_s, tot.memory_s)),
        compute_s=float(tot.compute_s), memory_s=float(tot.memory_s),
        time_s=dict(roofline=float(tot.roofline_s), calibrated=float(tot.calibrated_s),
                    calibrated_low=float(min(tot.calibrated_s, max(tot.calibrated_low_s, tot.roofline_s))),
                    calibrated_high=float(tot.calibrated_high_s)),
        efficiency=gpu.efficiency is not None,
        kernel=gpu.efficiency.kernel if gpu.efficiency else None, runtime=gpu.efficiency.runtime if gpu.efficiency else None)
