"""``lmcost op``: the cost of one operator (GEMM, attention, norm, pointwise, collective) on one GPU."""

from typing import Annotated, Optional

import typer

from lmcost.output import tables
from lmcost.cli.app import emit, err, machine_output, out, say, user_errors
from lmcost.cli.options import AttnKernelOpt, Count, EngineOpt, GpuOpOpt, OpDtype, Phase, RuntimeOpt, parse_bytes
from lmcost.cli.notes import warn_uncalibrated
from lmcost.apps.setup import resolve_precision


def _op(ops, gpu: str, dtype: str, title: str, kernel: str | None = None, runtime: str | None = None,
        engine: str | None = None, hw=None, choice=None) -> None:
    """Cost one operator on ``gpu`` under ``engine`` and print it (JSON or CSV in base units with --json/--csv);
    the JSON's ``settings`` records the engine (auto without one), where its figures came from and the kernel
    costed (``hw``, ``choice``: the GPU and engine already chosen, :func:`_engine`)."""
    from lmcost.apps.engine_choice import engine_record, say_figures
    from lmcost.cost.kernels import cost

    if hw is None:
        hw, choice = _engine(gpu, engine, kernel, runtime)
    e = hw.efficiency
    for op in ops:
        if e is not None and op.kernels and op.kind not in ("gemm", "sdpa") and e.runtime_lacks(op.kind, op.op_class.value):
            err.print(f"note: {hw.name} has no {e.runtime} figures for {op.kind}: auto's are used", markup=False,
                      highlight=False, soft_wrap=True)
    c = cost(ops, hw, dtype)
    c["settings"] = dict(**engine_record(hw, choice), kernel=ops[0].name if len(ops) == 1 else ops[0].kind)
    # auto named is auto: its figures are in the table's last row, as without the flag
    under = "" if choice is None or choice.name == "auto" else f", under {choice.label} ({choice.kernel_figures})"
    if emit(c):
        return
    warn_uncalibrated(hw, "calibrated")
    say_figures(hw, choice, say)
    out.print(tables.op_table(f"{title} on {hw.name} ({c['dtype']}){under}", c, bool(hw.efficiency and hw.efficiency.bands)))


def _engine(gpu: str, engine: str | None, kernel: str | None = None, runtime: str | None = None):
    """(GPU, EngineChoice or None) of an op command (:func:`lmcost.apps.engine_choice.choose_engine`)."""
    from lmcost.apps.engine_choice import choose_engine
    from lmcost.hardware.gpu import load_gpu

    return choose_engine(load_gpu(gpu), engine, kernel, runtime)


def _op_dtype(dtype: str, gpu: str, op: str) -> str:
    """``--dtype`` of op command ``op``, ``auto`` resolved by the one rule (:func:`resolve_precision`), checked
    against what ``op`` runs in on ``gpu`` (:func:`lmcost.cost.kernels.op_dtype`)."""
    from lmcost.cost.kernels import op_dtype
    from lmcost.hardware.gpu import load_gpu

    hw = load_gpu(gpu)
    if dtype.strip().lower() == "auto":
        dtype = resolve_precision("auto", gpus=[hw], say=say).activations
    return op_dtype(dtype, hw, op)


@user_errors
@machine_output
def op_gemm(
    m: Annotated[int, Count("--m", help="Rows of A and C (tokens); 8k = 8192.")],
    n: Annotated[int, Count("--n", help="Columns of B and C (output features); 4k = 4096.")],
    k: Annotated[int, Count("--k", help="The contraction (input features); 4k = 4096.")],
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", engine: EngineOpt = None,
):
    """C (m x n) = A (m x k) @ B (k x n): 2mnk FLOPs; A, B read and C written once."""
    dtype = _op_dtype(dtype, gpu, "gemm")
    from lmcost.cost.kernels import gemm

    if dtype.strip().lower() != "fp4":
        _op(gemm(m, n, k, dtype), gpu, dtype, f"GEMM {m}x{n}x{k}", engine=engine)
        return
    hw, choice = _engine(gpu, engine)  # fp4 operands are in the GPU's own FP4 format (NVFP4, MXFP4)
    _op(gemm(m, n, k, dtype, hw.fp4_format), gpu, dtype, f"GEMM {m}x{n}x{k}", hw=hw, choice=choice)


@user_errors
@machine_output
def op_attention(
    phase: Annotated[Phase, typer.Option(help="prefill (s new tokens) or decode (one new token).")],
    heads: Annotated[int, typer.Option("--heads", help="Query heads h.")],
    kv_heads: Annotated[int, typer.Option("--kv-heads", help="K/V heads h_kv (divides --heads).")],
    head_dim: Annotated[int, typer.Option("--head-dim", help="d_h.")],
    batch: Annotated[int, typer.Option("--batch", help="Sequences b.")] = 1,
    seq: Annotated[Optional[int], Count("--seq", help="New tokens per sequence (prefill); 4k = 4096.")] = None,
    kv_len: Annotated[Optional[int], Count("--kv-len", help="Keys per sequence, the new ones included (decode: the context; prefill: default --seq); 32k = 32768.")] = None,
    causal: Annotated[bool, typer.Option("--causal/--no-causal", help="Causal mask, bottom-right aligned when --kv-len > --seq.")] = True,
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", kernel: AttnKernelOpt = "auto", engine: EngineOpt = None,
):
    """A fused (flash) attention kernel over GQA heads: Q (b, h, s, d_h) against K, V (b, h_kv, t, d_h)."""
    dtype = _op_dtype(dtype, gpu, "attention")
    from lmcost.cost.kernels import attention

    ops = attention(phase.value, batch, heads, kv_heads, head_dim, seq, kv_len, causal, dtype)
    hw, choice = _engine(gpu, engine, kernel)
    if hw.efficiency is not None:
        hw.efficiency.phases_without(phase.value)
    _op(ops, gpu, dtype, f"{phase.value} attention", hw=hw, choice=choice)


@user_errors
@machine_output
def op_rmsnorm(
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    hidden: Annotated[int, Count("--hidden", help="Width normalised over; 8k = 8192.")],
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto", engine: EngineOpt = None,
    residual: Annotated[Optional[bool], typer.Option(
        "--residual/--no-residual", show_default=False,
        help="The residual add fused into the norm (vLLM's fused_add_rms_norm: reads x, the residual and the weight, "
             "writes the output and the new residual), as serving engines run every norm of a layer but the "
             "first layer's; default: on under --engine vllm, sglang or trtllm, else off (--no-residual: the "
             "plain norm the first layer runs).")] = None,
):
    """RMSNorm over (tokens x hidden), with a weight of hidden elements; under a serving engine, the fused
    residual add + RMSNorm it runs."""
    dtype = _op_dtype(dtype, gpu, "rmsnorm")
    from lmcost.cost.kernels import norm

    hw, choice = _engine(gpu, engine, runtime=runtime)
    if residual is None:
        residual = choice is not None and choice.kernels is not None and choice.kernels.rmsnorm == "fused_add_rmsnorm"
    title = f"{'fused add + ' if residual else ''}rmsnorm {tokens}x{hidden}" + (" (fused_add_rmsnorm)" if residual else "")
    _op(norm("rmsnorm", tokens, hidden, dtype, residual=residual), gpu, dtype, title, hw=hw, choice=choice)


@user_errors
@machine_output
def op_layernorm(
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    hidden: Annotated[int, Count("--hidden", help="Width normalised over; 8k = 8192.")],
    bias: Annotated[bool, typer.Option("--bias/--no-bias", help="A bias beside the weight (torch's LayerNorm default).")] = True,
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto", engine: EngineOpt = None,
):
    """LayerNorm over (tokens x hidden), with a weight (and bias) of hidden elements."""
    dtype = _op_dtype(dtype, gpu, "layernorm")
    from lmcost.cost.kernels import norm

    _op(norm("layernorm", tokens, hidden, dtype, bias), gpu, dtype, f"layernorm {tokens}x{hidden}", runtime=runtime,
        engine=engine)


@user_errors
@machine_output
def op_elementwise(
    kind: Annotated[str, typer.Option("--kind", help="silu_mul (gelu_mul, ...), silu/gelu/relu, add, or rope.")],
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    width: Annotated[Optional[int], typer.Option("--width", help="Elements per token of each input (silu_mul: d_ff, the width of gate and of up each; not for rope).")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="rope: query heads.")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", help="rope: key heads.")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", help="rope: rotated width per head (d_h, or its rotary part).")] = None,
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto", engine: EngineOpt = None,
):
    """A pointwise kernel: gated activation, activation, residual add, or RoPE."""
    dtype = _op_dtype(dtype, gpu, "elementwise")
    from lmcost.cost.kernels import elementwise

    ops = elementwise(kind, tokens, width, heads, kv_heads, head_dim, dtype)
    hw, choice = _engine(gpu, engine, runtime=runtime)
    if kind == "rope" and choice is not None and choice.kernels is not None and "rope_attention" in choice.kernels.fusions:
        say(f"note: {choice.name} applies RoPE inside its attention kernel (no kernel of its own there): this is the "
            "standalone kernel's cost")
    _op(ops, gpu, dtype, f"{kind} x {tokens} tokens", hw=hw, choice=choice)


@user_errors
@machine_output
def op_collective(
    kind: Annotated[str, typer.Option("--kind", help="all_reduce, all_gather, reduce_scatter, all_to_all, send_recv or broadcast.")],
    size: Annotated[str, typer.Option("--bytes", help="Payload as nccl-tests counts it (all_reduce/broadcast: the buffer; all_gather: the output; reduce_scatter: the input; all_to_all and send_recv: what one rank sends); K, M, G are binary, as are KiB, MiB, GiB: 64M = 64MiB = 67108864; KB, MB, GB are refused (SI would make MB 10^6).")],
    gpus: Annotated[int, typer.Option("--gpus", help="Ranks in the group (2 or more), on consecutive GPUs (a group larger than a node spans ceil(n / GPUs per node) nodes). send_recv: every rank sends to the next at once (nccl-tests' sendrecv_perf), so its time is one pair's, the same for any --gpus inside a node.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU (its default node: h100 -> dgx-h100, a100 -> dgx-a100, h200 -> hgx-h200, b200 -> dgx-b200).", show_default=False)] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", help="A shipped cluster (lmcost clusters list) or a cluster YAML.", show_default=False)] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes the group is spread over (default: as few as hold it).", show_default=False)] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", help="vllm, sglang or trtllm (also as name@version or name-version: the figures pool every version; a version no shipped profile of the engine has, such as vllm@9.9, is refused): an all_reduce as the engine runs it (its own custom all-reduce up to 8 MiB on 2/4/6/8 GPUs of one NVLink node, NCCL above; fitted on aiconfigurator's tables). The engines' own kernel is the all-reduce alone: other kinds are NCCL's, said in a note. Default, auto or torch: NCCL.", show_default=False)] = None,
):
    """One collective on a group of GPUs: roofline and calibrated time (NCCL's algorithms, fitted on nccl-tests), algbw, busbw, bound."""
    from lmcost.apps.collective import collective_cost

    res = collective_cost(kind=kind, size=parse_bytes(size), ranks=gpus, gpu_type=gpu, cluster=cluster, nodes=nodes,
                          engine=engine)
    for line in res.notes:
        say(line)
    if emit(res.record):
        return
    out.print(tables.collective_table(res.record, res.link))
