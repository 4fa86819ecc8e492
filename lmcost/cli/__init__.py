"""The ``lmcost`` command line: it parses, calls the library, and renders. No cost logic lives here."""


import errno
import functools
import inspect
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lmcost.cli import flags
from lmcost.output import render
from lmcost.basics.errors import LmcostError
from lmcost.cost.timing import TIME_MODELS
from lmcost.graph.forward import KERNELS, LOGITS, MLA_MODES

#: -h as well as --help, on every command.
HELP = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(no_args_is_help=True, add_completion=False, context_settings=HELP,
                  help="Analytic cost model and roofline calculator for transformer language models.")
gpus_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="The shipped GPUs (lmcost/data/gpus/*.yaml).")
models_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="The shipped model architectures (lmcost/data/models/*.yaml).")
app.add_typer(gpus_app, name="gpus")
app.add_typer(models_app, name="models")
clusters_app = typer.Typer(no_args_is_help=True, context_settings=HELP, help="The shipped clusters: nodes and networks (lmcost/data/clusters/*.yaml).")
app.add_typer(clusters_app, name="clusters")
op_app = typer.Typer(no_args_is_help=True, context_settings=HELP,
                     help="The cost of one operator on one GPU: FLOPs, bytes, bound, roofline and calibrated time.")
app.add_typer(op_app, name="op")

def _version(value: bool):
    if value:
        from lmcost import __version__
        print(f"lmcost {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print lmcost's version and exit.")] = False):
    """Analytic cost model and roofline calculator for transformer language models."""


# Piped output keeps whole rows (a terminal's own width applies otherwise).
out = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)


class Phase(str, Enum):
    """Phase of `explain`."""

    prefill = "prefill"
    decode = "decode"


def _choices(name: str, values, doc: str) -> type[Enum]:
    """A str Enum of ``values`` for typer, built from the core's own tuple (one list of allowed values)."""
    enum = Enum(name, {v: v for v in values}, type=str)
    enum.__doc__ = doc
    return enum


Kernel = _choices("Kernel", KERNELS, "Attention kernel: flash (causal pairs only) or naive.")
MLAMode = _choices("MLAMode", ("auto",) + MLA_MODES, "MLA execution: auto, absorbed or naive.")


class Device(str, Enum):
    """Where the reference decoder runs."""

    cpu = "cpu"
    cuda = "cuda"


class RunDtype(str, Enum):
    """dtype of a measured run."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


Logits = _choices("Logits", LOGITS, "Tokens the lm_head runs on.")
TimeModel = _choices("TimeModel", TIME_MODELS, "How an operator's time is predicted.")


ModelArg = Annotated[str, typer.Argument(help="A model YAML or HF config.json path, or a shipped name (lmcost models list).")]
GpuOpt = Annotated[str, typer.Option("--gpu", help="A shipped GPU name or alias (lmcost gpus list), or a YAML path.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON in base units (FLOPs, bytes, seconds).")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="Print CSV in base units.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="dtype of weights, activations and KV cache: fp32, bf16, fp16, fp8, int8; auto: bf16, or fp16 on a GPU without bf16 (said on stderr).")]
WDtypeOpt = Annotated[Optional[str], typer.Option("--weight-dtype", help="Weights dtype (overrides --dtype), e.g. int4, int8, fp8.")]
QuantOpt = Annotated[Optional[str], typer.Option("--quant", help="Quantization recipe, a format per tensor: bf16, fp16, fp32, int8, awq-g128, gptq-g128, q4_0, q8_0, q4_k_m, q5_k_m, q6_k, fp8-tensor, fp8-channel, fp8-block128, nvfp4, mxfp4 (overrides the model's quantization_config; not with --weight-dtype).")]
KvDtypeOpt = Annotated[Optional[str], typer.Option("--kv-dtype", help="KV-cache dtype (overrides --dtype), e.g. fp8, int8, int4.")]
KernelOpt = Annotated[Kernel, typer.Option("--attention", help="Attention kernel: flash (causal pairs only) or naive (full score matrix).")]
MLAOpt = Annotated[MLAMode, typer.Option("--mla", help="MLA attention: absorbed (over the latent), naive (up-project K, V), or auto (naive in prefill, absorbed in decode).")]
LogitsOpt = Annotated[Logits, typer.Option("--logits", help="Tokens the lm_head runs on: all (every prompt token, as transformers) or last (as serving engines).")]
AttnKernelOpt = Annotated[str, typer.Option("--kernel", help="Attention kernel family whose fitted figures the calibrated time uses: auto (fitted on every family measured on the GPU), fa2, fa3, cudnn, flex, triton, tlx, sdpa, paged-v1, paged-v2; the GPU's YAML lists those it has.")]
RuntimeOpt = Annotated[str, typer.Option("--runtime", help="Runtime of memory-bound kernels (norms, activations, RoPE, adds) for the calibrated time: auto (fitted on every runtime measured), triton (Liger; torch-compile and liger are its aliases), torch-eager; a GPU's YAML lists those it has figures for.")]
ModelOpt = Annotated[TimeModel, typer.Option("--model", help="roofline (lower bound) or calibrated (expected time under the GPU's efficiency model).")]
def parse_count(text: str) -> int:
    """A count as typed: ``4096``, or with a suffix as token counts are quoted, ``128k`` (x 1024) or
    ``1M`` (x 1024^2); the one suffix rule of every count option and list. The range is checked where
    the count is used. Raises: ValueError if it is not a whole number."""
    t = str(text).strip()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:].lower(), 1)
    digits = t[:-1] if mult > 1 else t
    if not digits.lstrip("-").isdigit():
        raise ValueError(f"{text!r} is not a whole number")
    return int(digits) * mult


def _count(text: str) -> int:
    """:func:`parse_count` as a typer parser (its error is a usage error)."""
    try:
        return parse_count(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a whole number (suffixes: 128k = 131072, 1M = 1048576)") from None


def Count(*names: str, help: str):  # noqa: N802 (an option factory, named like typer.Option)
    """A count option that takes k and M suffixes (:func:`_count`)."""
    return typer.Option(*names, help=help, parser=_count, metavar="INT")


BatchOpt = Annotated[int, typer.Option(help="Concurrent sequences (b).")]
RecomputeOpt = Annotated[str, typer.Option("--recompute", help="Activation recompute: none, selective (the attention core), full (every layer).")]
OptimizerOpt = Annotated[str, typer.Option("--optimizer", help="adamw, adam8bit, sgd (momentum), adafactor, muon.")]
TrainPrecisionOpt = Annotated[str, typer.Option("--precision", help="bf16-mixed (16 B/param with AdamW), bf16-mixed-fp32-grads (18), fp32, bf16.")]
TpOpt = Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs (Megatron sharding, all-reduce per layer).")]
PpOpt = Annotated[int, typer.Option("--pp", help="Pipeline stages (layers split evenly; activations sent between stages).")]
EpOpt = Annotated[int, typer.Option("--ep", help="Expert-parallel GPUs: dividing --tp (experts inside the TP group) or dividing --dp with --tp 1 (all-to-all).")]
DpOpt = Annotated[int, typer.Option("--dp", help="Data-parallel replicas (each serves batch/dp sequences).")]
ImbalanceOpt = Annotated[float, typer.Option("--ep-imbalance", help="Tokens of the busiest expert rank over the mean (1 = balanced).")]
ClusterOpt = Annotated[Optional[str], typer.Option("--cluster", help="A shipped node or cluster (lmcost clusters list), or a YAML path; default: the GPU's usual node.")]
NodesOpt = Annotated[Optional[int], typer.Option("--nodes", help="Nodes available; the layout must fit in them.")]


ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="torch intra-op threads (default: one per physical core available).", show_default=False)]
PromptOpt = Annotated[int, Count(help="Prompt tokens per sequence (prefill s); 128k = 131072.")]
GenOpt = Annotated[int, Count(help="Generated tokens per sequence; decode runs up to context prompt + gen; 1k = 1024.")]
StepsOpt = Annotated[int, Count("--gen", help="Decode steps per repeat (each at context prompt + 1).")]
FuseOpt = Annotated[str, typer.Option("--fuse", help="Fused operators: none, default (silu_mul), vllm/all, or a list of silu_mul,add_norm,rope_attention,qkv,gate_up,moe_grouped.")]


def _require(module: str, extra: str, what: str) -> None:
    """One-line error if an optional dependency is missing (torch for profiling, plotly for figures)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise LmcostError(module, f"not installed; {what} needs it", f"pip install 'lmcost[{extra}]'")


def _one_line(text: str) -> str:
    """``text`` with newlines and other control characters (from a path or a key in a file) escaped, so
    an error stays one line and cannot drive the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def user_errors(fn):
    """Render LmcostError as one line ``error: <field>: <what>; <fix>`` and exit 2. Other errors are bugs."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from pydantic import ValidationError

        from lmcost.basics.errors import from_validation_error

        try:
            return fn(*args, **kwargs)
        except LmcostError as e:
            err.print(_one_line(f"error: {flags.for_cli(e)}"), markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2)
        except ValidationError as e:  # a config the options derived (e.g. --window on a model) is invalid
            err.print(_one_line(f"error: {from_validation_error(e, 'options')}"), markup=False, highlight=False,
                      soft_wrap=True)
            raise typer.Exit(2)

    return wrapper


def _warn_uncalibrated(hw, model: str) -> None:
    """Say so when --model calibrated meets a GPU without an efficiency block (it is then the roofline)."""
    if model == "calibrated" and hw.efficiency is None:
        err.print(f"note: {hw.name} has no efficiency block: calibrated times equal the roofline "
                  "(no published kernel timings fitted for it; lmcost fit --table fits one from yours, lmcost calibrate "
                  "measures one for a local device)", markup=False, highlight=False, soft_wrap=True)


#: The machine format the running command was asked for (set by :func:`machine_output`): json, csv or None.
_FORMAT: dict = {"mode": None}


def machine_output(fn):
    """Give a command ``--json`` and ``--csv`` (declared here once for every command that prints
    machine output); the command asks :func:`_mode` and prints with :func:`_emit`.

    Raises (inside the command, so user_errors renders it): LmcostError if both are given.
    """
    sig = inspect.signature(fn)
    extra = [inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOpt),
             inspect.Parameter("as_csv", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=CsvOpt)]

    @functools.wraps(fn)
    def wrapper(*args, as_json: bool = False, as_csv: bool = False, **kwargs):
        if as_json and as_csv:
            raise LmcostError("--json/--csv", "both given", "pick one")
        _FORMAT["mode"] = "json" if as_json else "csv" if as_csv else None
        return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), *extra])
    wrapper.__annotations__ = {**fn.__annotations__, "as_json": JsonOpt, "as_csv": CsvOpt}
    return wrapper


def _mode() -> str | None:
    """json, csv, or None (rich tables) for the running command."""
    return _FORMAT["mode"]


def _emit(data) -> bool:
    """Print ``data`` as JSON or CSV if the command was asked for machine output; True if printed."""
    mode = _mode()
    if mode == "json":
        sys.stdout.write(render.to_json(data) + "\n")
    elif mode == "csv":
        import pandas as pd

        if isinstance(data, list):
            pd.DataFrame(data).to_csv(sys.stdout, index=False)
        else:
            pd.DataFrame(render.flatten(data), columns=["key", "value"]).to_csv(sys.stdout, index=False)
    return mode is not None


def _precision(dtype: str, weight_dtype: Optional[str], kv_dtype: Optional[str], gpus=()):
    """The run's precision. The one default rule, for every command: ``--dtype auto`` is bf16, or
    fp16 where a GPU of the command has no bf16 peak (a V100), or fp32 where it has neither; the
    choice is said on stderr when it is not bf16."""
    from lmcost.basics.dtypes import Precision, canonical

    if dtype == "auto":
        dtype = next(d for d in ("bf16", "fp16", "fp32") if all(d in g.peak_tflops for g in gpus))
        if dtype != "bf16":
            lacking = ", ".join(g.name for g in gpus if "bf16" not in g.peak_tflops)
            err.print(f"note: {lacking} has no bf16 peak: using {dtype} (--dtype to choose)",
                      markup=False, highlight=False, soft_wrap=True)
    canonical(dtype, "--dtype")
    # An option given empty is a mistake, not "the default": only an absent one falls back to --dtype.
    for value, flag in ((weight_dtype, "--weight-dtype"), (kv_dtype, "--kv-dtype")):
        if value is not None:
            canonical(value, flag)
    return Precision(weights=dtype if weight_dtype is None else weight_dtype, activations=dtype,
                     kv_cache=dtype if kv_dtype is None else kv_dtype)


def _quant(cfg, quant: Optional[str], weight_dtype: Optional[str]):
    """(config, recipe) of a run: ``--quant`` is checked and refused with ``--weight-dtype``; an explicit
    ``--weight-dtype`` replaces the config's own recipe (the run asks for one dtype for every weight)."""
    from lmcost.model.quant import recipe

    if quant is not None:
        if weight_dtype is not None:
            raise LmcostError("--quant", "cannot be given with --weight-dtype",
                              "give one: a recipe per tensor (--quant) or one dtype for every weight (--weight-dtype)")
        name = recipe(quant).name
        if name == "mxfp4" and cfg.moe is None:
            raise LmcostError("--quant", f"mxfp4 stores routed experts only (as gpt-oss), and {cfg.name} has none",
                              "use nvfp4 for 4-bit weights everywhere")
        return cfg, name
    if weight_dtype is not None and cfg.quant:
        err.print(f"note: --weight-dtype {weight_dtype} replaces {cfg.name}'s own recipe {cfg.quant}",
                  markup=False, highlight=False, soft_wrap=True)
        return cfg.model_copy(update={"quant": None}), None
    return cfg, None


def _weights_label(precision, cfg, quant: Optional[str]) -> str:
    """What the weights are stored in, for a header line."""
    from lmcost.model.quant import effective

    q = effective(cfg, quant)
    return f"{q} recipe" if q else precision.weights


@app.command()
@user_errors
@machine_output
def estimate(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    batch: BatchOpt = 1,
    prompt: PromptOpt = 512,
    gen: GenOpt = 256,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.auto,
    logits: LogitsOpt = Logits.all,
    model_: ModelOpt = TimeModel.roofline,
    fuse: FuseOpt = "default",
    detail: Annotated[bool, typer.Option("--detail", help="One row per operator of one layer, with its FLOPs formula (with --json/--csv: every operator row).")] = False,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    ep_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism with TP: reduce-scatter + all-gather, norms on s/tp tokens.")] = False,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel GPUs per sequence (ring attention in prefill, split KV cache in decode).")] = 1,
    vision: Annotated[bool, typer.Option("--vision", help="A multimodal model's vision tower and projector in memory too (their weights, in the weight dtype).")] = False,
):
    """Parameters, KV cache, memory, prefill and decode FLOPs, bytes and times (roofline or calibrated);
    with --tp/--pp/--ep/--dp, one GPU's share of a parallel layout and its communication."""
    from lmcost.model.loading import load_config
    from lmcost.graph.workload import Settings, Workload
    from lmcost.apps.estimate import estimate as run
    from lmcost.graph.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu

    cfg, hw = load_config(model), _selected(load_gpu(gpu), kernel, runtime)
    layout = _layout(hw, tp, pp, ep, dp, ep_imbalance, cluster, nodes, sp, cp)  # refused before any note
    precision = _precision(dtype, weight_dtype, kv_dtype, [hw])
    cfg, quant = _quant(cfg, quant, weight_dtype)
    settings = Settings(kernel=attention.value, mla=mla.value, logits=logits.value, model=model_.value,
                        fusion=parse_fusion(fuse), layout=layout, quant=quant, vision=vision)
    if vision and not cfg.vision_params:
        raise LmcostError("--vision", f"{cfg.name} has no vision tower lmcost counts",
                          "drop --vision (a Gemma 3 config.json with its vision_config has one)")
    if "tower" in cfg.source and not vision:  # a multimodal wrapper: say what the numbers cover
        err.print(f"note: {cfg.name} is costed as its decoder ({cfg.source.split('(', 1)[-1].rstrip(')')})"
                  + ("; --vision adds the tower's weights to memory" if cfg.vision_params else ""),
                  markup=False, highlight=False, soft_wrap=True)
    if model_.value == "roofline" and (kernel != "auto" or runtime != "auto"):
        err.print("note: --kernel and --runtime choose efficiency figures: they change calibrated times only "
                  "(add --model calibrated)", markup=False, highlight=False, soft_wrap=True)
    for p in (hw.efficiency.phases_without() if hw.efficiency is not None else []):
        err.print(f"note: {hw.name} has no {p} figures for {kernel}: {p} attention takes auto's", markup=False,
                  highlight=False, soft_wrap=True)
    if attention.value == "naive" and hw.efficiency is not None and hw.efficiency.kernel != "auto":
        err.print("note: --kernel names a flash kernel family; --attention naive runs no flash kernel, so it is unused",
                  markup=False, highlight=False, soft_wrap=True)
    est = run(cfg, hw, Workload(batch, prompt, gen), precision, settings)
    _warn_uncalibrated(hw, model_.value)
    _warn_context(cfg, prompt + gen)
    data = est.to_dict()
    if detail and _mode():
        data["ops"] = est.rows
        if _mode() == "csv":
            _emit(data["ops"])
            return
    if _mode() == "csv":
        data["op_classes"] = {f"{r['phase']}.{r['op_class']}": {k: v for k, v in r.items() if k not in ("phase", "op_class")}
                              for r in data["op_classes"]}
    if _emit(data):
        return
    wl = est.workload
    lay = settings.layout
    where = escape(hw.name) if lay.single else f"{lay.gpus} x {escape(hw.name)}, {lay.describe()} on {escape(est.cluster)}"
    out.print(f"[bold]{escape(cfg.name)}[/bold] ({cfg.attention_kind.upper()}, {cfg.n_layers} layers) on "
              f"[bold]{where}[/bold]: batch {wl.batch}, prompt {wl.prompt}, gen {wl.gen}; weights "
              f"{_weights_label(precision, cfg, quant)}, activations {precision.activations}, KV {precision.kv_cache}; "
              f"{attention.value} attention; lm_head on {logits.value} tokens; fused: "
              f"{', '.join(settings.fusion) or 'nothing'}")
    for table in (render.params_table(est.params), render.memory_table(est.kv_cache, est.memory),
                  render.phases_table(est), *render.class_tables(est.class_rows)):
        out.print(table)
    if not lay.single:
        err.print(f"note: per GPU, along one microbatch's path through {lay.pp} stage(s) of batch "
                  f"{lay.microbatch(wl.batch)}; communication is not overlapped with compute (its time adds)",
                  markup=False, highlight=False, soft_wrap=True)
    if detail:
        from lmcost.cost.formulas import show, symbolic_ops

        for phase in ("prefill", "decode"):
            rows = [r for r in est.rows if r["phase"] == phase]
            sym = {op.name: op for op in symbolic_ops(cfg, phase, precision, attention.value, settings.mla_for(phase),
                                                      logits.value, settings.fusion)}
            out.print(render.detail_table(phase, rows, [show(sym[r["name"]].flops) for r in rows]))


@app.command()
@user_errors
@machine_output
def explain(
    model: ModelArg,
    phase: Annotated[Phase, typer.Option(help="prefill (t = s) or decode (s = 1).")] = Phase.decode,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.auto,
    logits: LogitsOpt = Logits.all,
):
    """The FLOPs and bytes formula of every operator, in the field's notation."""
    from lmcost.model.loading import load_config
    from lmcost.cost.formulas import CONVENTIONS, show, symbolic_ops
    from lmcost.basics.notation import __doc__ as legend
    from lmcost.graph.workload import require_decoder

    from lmcost.graph.workload import Settings

    cfg = load_config(model)
    precision = _precision(dtype, weight_dtype, kv_dtype)
    settings = Settings(kernel=attention.value, mla=mla.value, logits=logits.value)
    if phase is Phase.decode:
        require_decoder(cfg)
    ops = symbolic_ops(cfg, phase.value, precision, attention.value, settings.mla_for(phase.value), logits.value)
    rows = [dict(name=op.name, op_class=op.op_class.value, count=str(op.count), flops=show(op.flops),
                 bytes=show(op.bytes), shapes=op.shapes) for op in ops]
    if _emit(rows):
        return
    t = Table(title=f"{escape(cfg.name)}: {phase.value} formulas (per layer; count = layers)", title_justify="left")
    for c in ("op", "class", "count", "FLOPs", "bytes", "shapes"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["op_class"], r["count"], r["flops"], r["bytes"], escape(r["shapes"]))
    out.print(t)
    out.print("Notation" + legend.split("Legend", 1)[1].split(":", 1)[1].rstrip(), highlight=False, markup=False)
    out.print("Conventions\n" + CONVENTIONS, highlight=False, markup=False)


def _tokens(text: str, field: str) -> list[int]:
    """``4k,32k,128k`` -> [4096, 32768, 131072]: k and m are 1024 and 1024², as context lengths are quoted."""
    out = []
    for part in text.split(","):
        try:
            out.append(parse_count(part))
        except ValueError:
            raise LmcostError(field, f"{part.strip()!r} is not a token count", "write e.g. 4k,32k,128k or 4096") from None
    return out


@app.command()
@user_errors
@machine_output
def kv(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    variants: Annotated[Optional[str], typer.Option(help="Comma-separated: base, mha, mqa, gqa:K, mla:D[:R]. Default: base,mha,gqa:8,mqa,mla:512.")] = None,
    context: Annotated[str, typer.Option(help="Contexts t, comma-separated; k = 1024 (4k,32k,128k).")] = "4k,32k,128k",
    batch: BatchOpt = 1,
    window: Annotated[Optional[int], typer.Option(help="Sliding window w (tokens) for local layers, on every variant.")] = None,
    local_global: Annotated[Optional[str], typer.Option("--local-global", help="Layer pattern L:G, e.g. 3:1 (three local, one global).")] = None,
    block_size: Annotated[int, typer.Option(help="Paged-cache block (tokens per block), vLLM-style.")] = 16,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    plot: Annotated[Optional[Path], typer.Option(help="Write a plotly HTML figure: KV GB and decode time against context.")] = None,
):
    """Compare attention variants (MHA, GQA, MQA, MLA, sliding window): KV cache, what fits, decode cost."""
    from lmcost.model.loading import load_config
    from lmcost.graph.workload import Settings
    from lmcost.hardware.gpu import load_gpu
    from lmcost.apps.kv import compare, curves
    from lmcost.model.variants import parse_labels, with_window

    contexts = _tokens(context, "--context")
    cfg = with_window(load_config(model), window, local_global)
    hw = load_gpu(gpu)
    precision = _precision(dtype, weight_dtype, kv_dtype, [hw])
    cfg, quant = _quant(cfg, quant, weight_dtype)
    labels = parse_labels(variants, cfg)
    settings = Settings(kernel=attention.value, quant=quant)
    df = compare(cfg, hw, labels, contexts, batch, precision, settings, block_size)
    if plot is not None:
        from lmcost.cost.memory import weight_memory
        from lmcost.model.quant import effective
        from lmcost.output.plots import kv_figure, write_html

        free = hw.memory_bytes - weight_memory(cfg, precision, effective(cfg, quant))
        fig = kv_figure(curves(cfg, hw, labels, max(contexts), batch, precision, settings), free,
                        f"{cfg.name} on {hw.name}: batch {batch}, KV {precision.kv_cache}")
        path = write_html(fig, plot)
        err.print(f"wrote {path}", markup=False, highlight=False)
    if _emit(df.to_dict("records")):
        return
    out.print(f"[bold]{escape(cfg.name)}[/bold] on [bold]{escape(hw.name)}[/bold]: batch {batch}, KV {precision.kv_cache}, "
              f"weights {_weights_label(precision, cfg, quant)}, paged blocks of {block_size} tokens")
    first = df.drop_duplicates(["variant", "mla_mode"])
    t = Table(title="Variants", title_justify="left")
    hybrid = bool(first.state_bytes_per_seq.any())  # constant-size state layers: their state per sequence
    for c in ("variant", "attention", "MLA mode", "KV per token", *(("state per sequence",) if hybrid else ()),
              "attention params", f"longest context at b={batch}"):
        t.add_column(c, justify="left" if c in ("variant", "attention", "MLA mode") else "right")
    for r in first.itertuples():
        t.add_row(r.variant, r.attention, r.mla_mode or "-", render.binary(r.kv_bytes_per_token, 4),
                  *((render.binary(r.state_bytes_per_seq, 4),) if hybrid else ()),
                  render.count(r.attention_params), render.count(r.max_context) if r.max_context else "[red]none[/red]")
    out.print(t)
    t = Table(title="Per context", title_justify="left")
    for c in ("variant", "context", "KV cache", "KV paged", "fits", "largest batch", "decode step", "tokens/s", "attention FLOPs/byte"):
        t.add_column(c, justify="left" if c == "variant" else "right")
    for r in df.itertuples():
        name = f"{r.variant} ({r.mla_mode})" if r.mla_mode else r.variant
        t.add_row(name, render.count(r.context), render.binary(r.kv_bytes), render.binary(r.kv_bytes_paged),
                  "yes" if r.fits else "[red]no[/red]", render.count(r.max_batch), render.si(r.decode_time_s, "s"),
                  f"{r.tokens_per_s:,.0f}", f"{r.attention_intensity:.1f}")
    out.print(t)


class PhaseSel(str, Enum):
    """Phases drawn by `roofline`."""

    both = "both"
    prefill = "prefill"
    decode = "decode"


def _ints(text: str, field: str) -> list[int]:
    """``1,8,64`` -> [1, 8, 64] (k = 1024 allowed, as for contexts)."""
    try:
        return _tokens(text, field)
    except LmcostError:
        raise LmcostError(field, f"{text!r} is not a list of whole numbers", "write e.g. 1,8,64") from None


def _plan_train(cfg, hws, gpus, seq, global_batch, optimizer, precision, model, cluster, top) -> None:
    """plan --train: the fastest training steps that fit (see lmcost.apps.plan.search_train)."""
    from lmcost.apps.plan import search_train

    if not 1 <= top <= 10000:
        raise LmcostError("--top", f"must be from 1 to 10,000, got {top}", "give the rows to print")
    with _status(f"planning the training of {cfg.name} on {gpus} GPUs") as status:
        fits, skipped = search_train(cfg, hws, gpus, seq, global_batch, optimizer=optimizer, precision=precision,
                                     model=model, cluster=cluster, progress=getattr(status, "update", None))
    rows = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()} for r in fits.to_dict("records")]
    if _emit(dict(model=cfg.name, gpus=gpus, seq=seq, global_batch=global_batch, time_model=model, fits=rows,
                  skipped=[dict(setup=a, reason=flags.said(b)) for a, b in skipped])):
        return
    t = Table(title=f"{escape(cfg.name)} training on {gpus} GPUs, {global_batch} x {seq} tokens per step: the fastest "
                    f"setups that fit ({len(rows)} of {len(rows) + len(skipped)}; {model} times)", title_justify="left")
    for c in ("GPU", "layout", "micro-batch", "ZeRO", "recompute", "step", "tok/s/GPU", "MFU", "HFU", "mem/GPU"):
        t.add_column(c, justify="left" if c in ("GPU", "layout", "recompute") else "right")
    for r in rows[:top]:
        t.add_row(escape(r["gpu"]), r["layout"], str(r["micro_batch"]), str(r["zero"]), r["recompute"],
                  render.si(r["step_s"], "s"), f"{r['tokens_per_s_per_gpu']:,.0f}", render.pct(r["mfu"]),
                  render.pct(r["hfu"]), render.si(r["memory_per_gpu_bytes"], "B"))
    out.print(t)
    if not rows:
        out.print(f"Nothing fits in memory on {gpus} GPUs at this batch and sequence", markup=False)
    else:
        b = rows[0]
        out.print(f"fastest that fits: {b['gpu']} {b['layout']}, micro-batch {b['micro_batch']}, ZeRO-{b['zero']}, "
                  f"recompute {b['recompute']}: step {render.si(b['step_s'], 's')}, MFU {render.pct(b['mfu'])} (check it: "
                  f"lmcost train {cfg.name} --gpu {b['gpu']} --gpus {gpus} --seq {seq} --global-batch {global_batch} "
                  f"--tp {b['tp']} --pp {b['pp']} --ep {b['ep']}{' --sp' if b['sp'] else ''} --micro-batch {b['micro_batch']} "
                  f"--zero {b['zero']} --recompute {b['recompute']})", markup=False, soft_wrap=True)


def parse_duration(text: str, field: str) -> float:
    """'500ms', '0.5s', '250us' -> seconds. Raises: LmcostError without a unit or for a value <= 0."""
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(us|ms|s)\s*", text.lower())
    if not m:
        raise LmcostError(field, f"{text!r} is not a duration", "give a number with a unit: 500ms, 0.2s, 800us")
    value = float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    if not 0 < value <= 3600:
        raise LmcostError(field, f"{text!r} is out of range", "give a duration above 0 and at most an hour")
    return value


@app.command()
@user_errors
@machine_output
def plan(
    model: ModelArg,
    gpu: Annotated[list[str], typer.Option("--gpu", help="GPU type(s) to search (repeat for several).")] = ["h100"],  # noqa: B006
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs of each type to spread the model over.")] = 8,
    isl: Annotated[str, typer.Option("--isl", help="Input (prompt) tokens per request; suffixes k, M.")] = "2048",
    osl: Annotated[str, typer.Option("--osl", help="Output (generated) tokens per request; suffixes k, M.")] = "256",
    ttft: Annotated[Optional[str], typer.Option("--ttft", help="TTFT SLO, e.g. 500ms.")] = None,
    tpot: Annotated[Optional[str], typer.Option("--tpot", help="TPOT SLO, e.g. 50ms.")] = None,
    max_batch: Annotated[int, typer.Option("--max-batch", help="Largest global batch searched.")] = 4096,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: Annotated[Optional[TimeModel], typer.Option("--model", help="roofline (lower bound; the serving default) or calibrated (expected time; the --train default).")] = None,
    fuse: FuseOpt = "default",
    cluster: ClusterOpt = None,
    top: Annotated[int, typer.Option("--top", help="Rows of the Pareto front printed.")] = 15,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the plotly figure as offline HTML here.")] = None,
    train_: Annotated[bool, typer.Option("--train", help="Search training layouts instead: the fastest step that fits.")] = False,
    seq: Annotated[str, typer.Option("--seq", help="With --train: tokens per sequence; suffixes k, M.")] = "4096",
    global_batch: Annotated[int, typer.Option("--global-batch", help="With --train: sequences per step.")] = 64,
    optimizer: OptimizerOpt = "adamw",
    precision_: TrainPrecisionOpt = "bf16-mixed",
):
    """Search parallel layouts x batch sizes on --gpus GPUs: the Pareto front of tokens/s per GPU against
    tokens/s per user, each point's layout, memory per GPU and bound, and the best layout under the SLOs."""
    from lmcost.graph.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.apps.plan import search
    from lmcost.graph.workload import Settings

    cfg = load_config(model)
    hws = list({h.name: h for h in (load_gpu(g) for g in gpu)}.values())  # a GPU named twice is searched once
    if train_:
        if ttft or tpot:
            raise LmcostError("--ttft/--tpot", "are serving SLOs; a training plan minimises the step time",
                              "drop them with --train")
        _plan_train(cfg, hws, gpus, parse_count(seq), global_batch, optimizer, precision_,
                    (model_ or TimeModel.calibrated).value, cluster, top)
        return
    model_ = model_ or TimeModel.roofline
    precision = _precision(dtype, weight_dtype, kv_dtype, hws)
    n_isl, n_osl = parse_count(isl), parse_count(osl)
    slo_ttft = parse_duration(ttft, "--ttft") if ttft else None
    slo_tpot = parse_duration(tpot, "--tpot") if tpot else None
    if not 1 <= top <= 10000:
        raise LmcostError("--top", f"must be from 1 to 10,000, got {top}", "give the rows to print")
    # Serving engines run the lm_head on each sequence's last token only (the planner's setting).
    settings = Settings(kernel="flash", mla="auto", logits="last", model=model_.value, fusion=parse_fusion(fuse))
    with _status(f"planning {cfg.name} on {gpus} GPUs"):
        result = search(cfg, hws, gpus, n_isl, n_osl, precision, settings, slo_ttft, slo_tpot, max_batch, cluster)
    keep = ["gpu", "layout", "tp", "pp", "dp", "ep", "batch", "ttft_s", "tpot_s", "tokens_per_s_per_gpu",
            "tokens_per_s_per_user", "memory_per_gpu_bytes", "bound", "meets_slo"]
    front = [{k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()}
             for r in result.front[keep].to_dict("records")]
    best = None if result.best is None else {k: (v.item() if hasattr(v, "item") else v)
                                              for k, v in result.best.items() if k in keep}
    if output is not None:
        from lmcost.output.plots import plan_figure, write_html

        fig = plan_figure(result.points, result.front, f"{cfg.name} on {gpus} GPUs, ISL {n_isl}, OSL {n_osl}",
                          slo_ttft, slo_tpot)
        err.print(f"wrote {write_html(fig, output)}", markup=False, highlight=False)
    if _mode() == "csv":
        _emit(front)
        return
    if _emit(dict(model=cfg.name, gpus=gpus, isl=n_isl, osl=n_osl, ttft_slo_s=slo_ttft, tpot_slo_s=slo_tpot,
                  time_model=model_.value, layouts=result.layouts, points=result.searched,
                  fitting_points=len(result.points), front=front, best=best,
                  skipped=[dict(layout=a, reason=flags.said(b)) for a, b in result.skipped])):
        return
    t = Table(title=f"{escape(cfg.name)} on {gpus} GPUs: Pareto front ({result.searched:,} points, "
                    f"{result.layouts} layouts, {len(result.points):,} fit; {model_.value} times; ISL {n_isl}, OSL {n_osl})",
              title_justify="left")
    for c in ("GPU", "layout", "batch", "TTFT", "TPOT", "tok/s/GPU", "tok/s/user", "mem/GPU", "decode bound", "SLO"):
        t.add_column(c, justify="left" if c in ("GPU", "layout") else "right")
    # A long front is sampled evenly (its ends kept): the trade-off, not its first rows.
    shown = front if len(front) <= top else [front[round(i * (len(front) - 1) / (top - 1))] for i in range(top)] \
        if top > 1 else front[:1]
    if len(shown) < len(front):
        t.caption = f"{len(shown)} of the front's {len(front)} points, evenly spaced (--top; --json has all)"
    for r in shown:
        t.add_row(escape(r["gpu"]), r["layout"], str(r["batch"]), render.si(r["ttft_s"], "s"), render.si(r["tpot_s"], "s"),
                  f"{r['tokens_per_s_per_gpu']:,.1f}", f"{r['tokens_per_s_per_user']:,.1f}",
                  render.si(r["memory_per_gpu_bytes"], "B"), r["bound"], "yes" if r["meets_slo"] else "no")
    out.print(t)
    if best is None:
        out.print("No point meets the SLOs and fits in memory" if (slo_ttft or slo_tpot) and len(result.points)
                  else f"No layout of {gpus} GPUs fits {cfg.name} in memory at any batch searched", markup=False)
    else:
        label = "best under the SLOs" if (slo_ttft or slo_tpot) else "most tokens/s per GPU that fits (no SLO given)"
        out.print(f"{label}: {best['gpu']} {best['layout']}, batch {best['batch']}: "
                  f"{best['tokens_per_s_per_gpu']:,.1f} tokens/s per GPU, {best['tokens_per_s_per_user']:,.1f} per user, "
                  f"TTFT {render.si(best['ttft_s'], 's')}, TPOT {render.si(best['tpot_s'], 's')}, "
                  f"{render.si(best['memory_per_gpu_bytes'], 'B')} per GPU (the same point: lmcost estimate {cfg.name} "
                  f"--gpu {best['gpu']} --tp {best['tp']} --pp {best['pp']} --dp {best['dp']} --ep {best['ep']} "
                  f"--batch {best['batch']} --prompt {n_isl} --gen {n_osl} --logits last)", markup=False, soft_wrap=True)


@app.command()
@user_errors
@machine_output
def roofline(
    model: ModelArg,
    gpu: Annotated[list[str], typer.Option("--gpu", help="GPU name, alias or YAML; repeat for several roofs.")] = ["h100"],
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated (decode points move right as b grows).")] = "1,8,64",
    context: Annotated[str, typer.Option(help="Prompt length of prefill and context of the decode step.")] = "2048",
    phase: Annotated[PhaseSel, typer.Option(help="Which phases to draw.")] = PhaseSel.both,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the figure as offline HTML here.")] = None,
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
):
    """Roofline of every operator class: intensity against attainable FLOP/s, and the critical batch."""
    from rich.progress import track

    from lmcost.model.loading import load_config
    from lmcost.graph.workload import Settings
    from lmcost.hardware.gpu import load_gpu
    from lmcost.apps.roofline import critical_batch, roofline_points

    cfg = load_config(model)
    gpus = [load_gpu(g) for g in gpu]
    precision = _precision(dtype, weight_dtype, kv_dtype, gpus)
    batches, contexts = _ints(batch, "--batch"), _tokens(context, "--context")
    if len(contexts) != 1:
        raise LmcostError("--context", f"one context per figure, got {len(contexts)}", "give one, e.g. --context 4k")
    (t,) = contexts
    settings = Settings(kernel=attention.value)
    phases = ("prefill", "decode") if phase is PhaseSel.both else (phase.value,)
    pairs = len(gpus) * len(batches)
    progress = (lambda it: track(it, description="estimating", console=err, transient=True)) if pairs > 4 else None
    points = roofline_points(cfg, gpus, batches, t, precision, settings, phases, progress)
    crit = {g.name: critical_batch(cfg, g, precision, t, settings) for g in gpus}
    if output is not None:
        from lmcost.output.plots import roofline_figure, write_html
        from lmcost.apps.report import class_formulas

        fig = roofline_figure(points, gpus, precision.activations,
                              f"{cfg.name}: roofline at context {t} ({precision.activations})",
                              class_formulas(cfg, precision, settings))
        err.print(f"wrote {write_html(fig, output)}", markup=False, highlight=False)
    data = dict(critical_batch=crit, ridge_flops_per_byte={g.name: g.ridge_point(precision.activations) for g in gpus},
                points=points.to_dict("records"))
    if _emit(data["points"] if _mode() == "csv" else data):
        return
    for g in gpus:
        c = crit[g.name]
        out.print(f"{escape(g.name)}: ridge point {g.ridge_point(precision.activations):.1f} FLOPs/byte; decode GEMMs at "
                  f"context {t} turn compute-bound at batch {c if c else 'never (up to 2^20)'}")
    t_ = Table(title="Operator classes", title_justify="left")
    for c in ("gpu", "phase", "batch", "class", "FLOPs/byte", "FLOP/s at roofline time", "time share"):
        t_.add_column(c, justify="left" if c in ("gpu", "phase", "class") else "right")
    for r in points.itertuples():
        t_.add_row(r.gpu, r.phase, str(r.batch), r.op_class, f"{r.arithmetic_intensity:.3g}",
                   render.si(r.achieved_flops_per_s, "FLOP/s"), render.pct(r.time_share))
    out.print(t_)


@app.command()
@user_errors
def report(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    batch: BatchOpt = 1,
    prompt: PromptOpt = 512,
    gen: GenOpt = 256,
    output: Annotated[Path, typer.Option("-o", "--output", help="Report folder (replaced as a whole).")] = Path("report"),
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    attention: KernelOpt = Kernel.flash,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
    cluster: ClusterOpt = None,
):
    """Write a report folder: index.html (figures and tables, opens offline), summary.json, ops.csv.
    With --tp/--pp/--ep/--dp: one GPU's share of the layout, its communication in every table and figure."""
    _require("plotly", "plot", "report")
    from lmcost.model.loading import load_config
    from lmcost.graph.workload import Settings, Workload
    from lmcost.hardware.gpu import load_gpu
    from lmcost.apps.report import write_report

    cfg, hw = load_config(model), _selected(load_gpu(gpu), kernel, runtime)
    layout = _layout(hw, tp, pp, ep, dp, 1.0, cluster, None)
    layout.check(cfg, batch)
    precision = _precision(dtype, weight_dtype, kv_dtype, [hw])
    with _status(f"writing the report of {cfg.name} on {hw.name}"):
        path = write_report(cfg, hw, Workload(batch, prompt, gen), output, precision,
                            Settings(kernel=attention.value, layout=layout))
    err.print(f"wrote {path}/: index.html, summary.json, ops.csv, roofline_points.csv", markup=False, highlight=False)


class BreakdownPhase(str, Enum):
    """Phase of `breakdown`."""

    train = "train"
    prefill = "prefill"
    decode = "decode"


def _train_setup(gpus, seq, global_batch, micro_batch, tp, pp, cp, ep, sp, zero, recompute, optimizer, precision,
                 schedule, virtual_stages, flops_convention, lora_rank, lora_targets, qlora, cluster):
    """The TrainSetup of the flags (LoRA when --lora-rank is given)."""
    from lmcost.graph.parallel import Layout
    from lmcost.apps.train import TrainSetup

    lora = None
    if lora_targets is not None and lora_rank is None:
        raise LmcostError("--lora-targets", "names the projections of LoRA adapters, and no rank is given",
                          "add --lora-rank, e.g. 16")
    if lora_rank is not None or qlora:
        from lmcost.cost.optimizers import LoRA

        if lora_rank is None:
            raise LmcostError("--qlora", "needs the adapters' rank", "add --lora-rank, e.g. 16")
        lora_targets = lora_targets or "q,k,v,o"
        lora = LoRA(rank=lora_rank, targets=tuple(t.strip() for t in lora_targets.split(",") if t.strip()),
                    base_dtype="int4" if qlora else "bf16")
    layout = Layout(tp=tp, pp=pp, cp=cp, ep=ep, sp=sp, cluster=cluster)  # dp: the GPUs left (TrainSetup)
    return TrainSetup(gpus=gpus, seq=seq, global_batch=global_batch, micro_batch=micro_batch, layout=layout, zero=zero,
                      recompute=recompute, optimizer=optimizer, precision=precision, schedule=schedule,
                      virtual_stages=virtual_stages, flops_convention=flops_convention, lora=lora)


@app.command()
@user_errors
@machine_output
def train(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs in all.")] = 8,
    seq: Annotated[int, Count("--seq", help="Tokens per sequence; 8k = 8192.")] = 4096,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step, over all replicas.")] = 64,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per microbatch on one GPU.")] = 1,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel GPUs per sequence.")] = 1,
    ep: EpOpt = 1,
    sp: Annotated[bool, typer.Option("--sp", help="Sequence parallelism with TP.")] = False,
    zero: Annotated[int, typer.Option("--zero", help="0 (DDP), 1, 2 or 3 (ZeRO stage; 3 = FSDP).")] = 1,
    recompute: RecomputeOpt = "none",
    optimizer: OptimizerOpt = "adamw",
    precision: TrainPrecisionOpt = "bf16-mixed",
    schedule: Annotated[str, typer.Option("--schedule", help="Pipeline schedule: 1f1b, gpipe, interleaved.")] = "1f1b",
    virtual_stages: Annotated[int, typer.Option("--virtual-stages", help="Model chunks per GPU (interleaved schedule).")] = 1,
    flops_convention: Annotated[str, typer.Option("--flops-convention", help="Headline MFU: palm (6N + 12LHQT, causal not halved) or causal (attention pairs halved).")] = "palm",
    lora_rank: Annotated[Optional[int], typer.Option("--lora-rank", help="Train LoRA adapters of this rank on a frozen base.")] = None,
    lora_targets: Annotated[Optional[str], typer.Option("--lora-targets", help="Projections that get adapters, comma-separated (default q,k,v,o).")] = None,
    qlora: Annotated[bool, typer.Option("--qlora", help="Keep the frozen base in 4-bit NF4 (QLoRA).")] = False,
    cluster: ClusterOpt = None,
    model_: Annotated[TimeModel, typer.Option("--model", help="calibrated (expected time, the default) or roofline (lower bound).")] = TimeModel.calibrated,
    attention: KernelOpt = Kernel.flash,
):
    """One training step: memory per GPU (weights, gradients, master copy, optimizer states, activations),
    step time by part (pipeline with its bubble, recompute, exposed data-parallel communication, optimizer),
    tokens/s, MFU (both FLOPs conventions) and HFU."""
    from dataclasses import replace

    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.apps.train import train_step

    cfg, hw = load_config(model), load_gpu(gpu)
    setup = replace(_train_setup(gpus, seq, global_batch, micro_batch, tp, pp, cp, ep, sp, zero, recompute, optimizer,
                                 precision, schedule, virtual_stages, flops_convention, lora_rank, lora_targets, qlora,
                                 cluster), attention=attention.value)
    with _status(f"costing a training step of {cfg.name} on {gpus} x {hw.name}"):
        res = train_step(cfg, hw, setup, model_.value)
    _warn_uncalibrated(hw, model_.value)
    if _emit(res.to_dict()):
        return
    lay = setup.full_layout
    out.print(f"[bold]{escape(cfg.name)}[/bold] training on [bold]{gpus} x {escape(hw.name)}[/bold] "
              f"({lay.describe()}): {setup.global_batch} x {setup.seq} tokens per step, micro-batch "
              f"{setup.micro_batch}, {setup.microbatches} microbatches per replica; {setup.precision}, "
              f"{setup.optimizer}, ZeRO-{setup.zero}, recompute {setup.recompute}, {setup.schedule}; "
              f"{model_.value} times", soft_wrap=True)
    mem = res.memory
    labels = dict(weights_bytes="weights", grads_bytes="gradients", master_bytes="master copy (fp32)",
                  optimizer_bytes=f"optimizer states ({setup.optimizer})", step_bytes="step counters (host)",
                  model_states_bytes="model states", activations_bytes=f"activations ({mem.get('microbatches_in_flight')} "
                  f"{'model chunks' if setup.schedule == 'interleaved' else 'microbatches'} in flight)")
    rows = [(labels[k], render.si(mem[k], "B")) for k in labels if k in mem]
    rows += [("total per GPU", render.si(mem["total_bytes"], "B")), ("capacity per GPU", render.si(mem["capacity_bytes"], "B")),
             ("fits (each GPU)", "yes" if res.fits else "[red]NO[/red]")]
    out.print(render.kv_table("Memory per GPU (busiest stage)", rows))
    parts = [(k.removesuffix("_s").replace("_", " "), render.si(v, "s")) for k, v in res.parts_s.items()]
    out.print(render.kv_table("Step time by part (per GPU)", parts + [("step", render.si(res.step_s, "s"))]))
    out.print(render.kv_table("Throughput", [
        ("tokens/s", f"{res.tokens_per_s:,.0f}"), ("tokens/s per GPU", f"{res.tokens_per_s_per_gpu:,.1f}"),
        ("MFU (palm: 6N + 12LHQT)", render.pct(res.mfu_palm)), ("MFU (causal pairs)", render.pct(res.mfu_causal)),
        ("HFU (every FLOP that runs)", render.pct(res.hfu)),
        ("against the dense peak of", render.si(hw.peak_flops(res.compute_dtype), "FLOP/s") + f" ({res.compute_dtype})")]))
    for t in render.class_tables(res.class_rows):
        t.title = "one microbatch, forward + backward, on one GPU's path through the stages: by operator class"
        out.print(t)


@app.command()
@user_errors
@machine_output
def breakdown(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    phase: Annotated[BreakdownPhase, typer.Option(help="train (forward + backward), prefill, or one decode step.")] = BreakdownPhase.train,
    batch: BatchOpt = 8,
    seq: Annotated[int, Count(help="Tokens per sequence (train, prefill) or context (decode); 4k = 4096.")] = 512,
    dtype: DtypeOpt = "auto",
    attention: KernelOpt = Kernel.naive,
    device: Annotated[Optional[Device], typer.Option(help="Also measure the shares on this device (reference decoder).")] = None,
    run_dtype: Annotated[RunDtype, typer.Option("--run-dtype", help="dtype of the measured run (CPUs lack fast fp16).")] = RunDtype.fp32,
    repeats: Annotated[int, typer.Option(help="Measured repeats.")] = 3,
    layers: Annotated[int, typer.Option(help="Keep this many blocks of the model (0: all), predicted and measured.")] = 0,
):
    """Share of FLOPs against share of time by operator class: tensor contraction, normalization, element-wise."""
    from lmcost.model.loading import load_config
    from lmcost.graph.workload import Settings, check_count, check_positions
    from lmcost.hardware.gpu import load_gpu
    import pandas as pd

    from lmcost.apps.roofline import breakdown as shares

    from lmcost.model.config import truncate

    cfg, hw = load_config(model), load_gpu(gpu)
    precision = _precision(dtype, None, None, [hw])
    check_count("--repeats", repeats)
    _note_layers(cfg, layers)
    cfg = truncate(cfg, layers) if layers else cfg

    check_positions(cfg, seq, "--seq")
    check_count("--seq", seq)
    df = shares(cfg, hw, precision, phase.value, batch, seq, Settings(kernel=attention.value))
    if device is not None:
        _require("torch", "profile", "breakdown --device")
        from lmcost.profiling.breakdown import measured_shares

        with _status(f"measuring {cfg.name} on {device.value}"):
            measured = measured_shares(cfg, phase.value, batch, seq, device.value, run_dtype.value, attention.value, repeats)
        order = {"tensor contraction": 0, "normalization": 1, "element-wise": 2, "other": 3}
        df = df.merge(measured, on="op_class", how="outer").sort_values("op_class", key=lambda c: c.map(order))
    if _emit(df.to_dict("records")):
        return
    t = Table(title=f"{escape(cfg.name)}: {phase.value}, b={batch}, s={seq}, {precision.activations} on {escape(hw.name)} "
              f"({attention.value} attention)", title_justify="left")
    cols = ["class", "FLOPs", "FLOPs share", "roofline time", "time share"]
    if device is not None:
        cols += [f"measured ({device.value}, {run_dtype.value})", "measured share"]
    for c in cols:
        t.add_column(c, justify="left" if c == "class" else "right")
    for r in df.itertuples():
        row = [r.op_class] + (["-"] * 4 if pd.isna(r.flops) else
                              [render.si(r.flops, "FLOP"), render.pct(r.flops_share), render.si(r.time_s, "s"),
                               render.pct(r.time_share)])
        if device is not None:
            row += [render.si(r.measured_time_s, "s"), render.pct(r.measured_share)]
        t.add_row(*row)
    out.print(t)


def _calibrated(device: str, refresh: bool = False, threads: int | None = None):
    """The cached calibration of this machine's ``device`` at ``threads`` (:func:`lmcost.profiling.cache.cached_calibration`)."""
    from lmcost.profiling.cache import cached_calibration

    return cached_calibration(device, refresh, say=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True),
                              threads=threads)


@app.command()
@user_errors
def calibrate(
    device: Annotated[Device, typer.Option(help="Device to measure.")] = Device.cpu,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the hardware YAML here (else print it).")] = None,
    dtypes: Annotated[str, typer.Option(help="GEMM dtypes to measure, comma-separated (fp32 always: it is also the vector rate).")] = "fp32,bf16",
    quick: Annotated[bool, typer.Option("--quick", help="Small sizes: seconds, rougher figures.")] = False,
    threads: ThreadsOpt = None,
):
    """Measure GEMM FLOP/s per dtype, memory bandwidth and the kernel floor; write a hardware YAML."""
    _require("torch", "profile", "calibrate")
    import yaml

    from lmcost.profiling.calibrate import calibrate as measure
    from lmcost.profiling.device import check_device

    check_device(device.value)
    parts = [d.strip() for d in dtypes.split(",")]
    if any(parts) and not all(parts):
        raise LmcostError("--dtypes", f"{dtypes!r} has an empty item", "separate the dtypes with single commas")
    names = [d for d in parts if d]
    if not names:
        raise LmcostError("--dtypes", "empty", "give e.g. fp32,bf16")
    for d in names:
        if d not in RunDtype.__members__:
            raise LmcostError("--dtypes", f"{d!r} cannot be measured", "use fp32, bf16, fp16")
    names = list(dict.fromkeys(["fp32", *names]))
    from lmcost.basics.files import check_folder, write_text

    if output is not None:
        if output.is_dir():
            raise LmcostError("--output", f"{output} is a folder", "give a file path")
        check_folder(output.parent, "--output", "give a file path inside a writable folder")
    with _status(f"calibrating {device.value}") as status:
        measured = measure(device.value, names, quick, threads=threads,
                           stage=lambda what: status.update(f"calibrating {device.value}: {what}") if status else None)
    text = yaml.safe_dump(measured, sort_keys=False)
    if output is None:
        sys.stdout.write(text)
    else:
        write_text(output, text)
        err.print(f"wrote {output} (use it as --gpu {output})", markup=False, highlight=False)
    _calibration_summary(measured)


@app.command()
@user_errors
@machine_output
def fit(
    table: Annotated[Optional[str], typer.Option("--table", help="CSV of measured kernel times (default: the shipped public table, lmcost/data/measurements/public-kernels.csv).")] = None,
    gpus: Annotated[Optional[list[str]], typer.Option("--gpu", help="GPU whose efficiency block to fit (repeatable; default: every A100, H100 and H200 file whose family has rows in the table).")] = None,
    trace_paths: Annotated[Optional[list[str]], typer.Option("--trace", help="An lmcost profile trace to fit on (repeatable; each trace is one source; needs torch and --gpu, the YAML of the device it ran on). Without --table, the traces alone are the fitting set.")] = None,
    out_dir: Annotated[Optional[str], typer.Option("--out", help="Write <gpu>.yaml (the shipped file with the fitted block), fit-report.json and, for a --table of your own, a copy of it (fitting-set.csv) here.")] = None,
    collectives: Annotated[bool, typer.Option("--collectives", help="Fit the collective-communication model instead, on lmcost/data/measurements/collective-measurements.csv (or --table); --out writes every cluster YAML with its fitted block.")] = False,
):
    """Fit the efficiency model on measured kernel times; report its leave-one-source-out error and bands."""
    if collectives:
        return _fit_collectives(table, out_dir)

    from lmcost.basics.files import check_folder, write_texts
    from lmcost.calibration.efficiency_fit import block_dict, block_for, edge_figures, fit as run_fit, replace_block, report_rows, source_rows, table_digest
    from lmcost.hardware.gpu import gpu_from_text, load_gpu
    from lmcost.calibration.measurements import FAMILIES, FITTED, load_table, public_table

    if table is not None and not table.strip():
        raise LmcostError("--table", "empty", "give a CSV of kernel timings, or drop --table for the shipped one")
    if out_dir is not None and not out_dir.strip():
        raise LmcostError("--out", "empty", "give a folder, e.g. --out fitted/")
    path = Path(table) if table is not None else public_table()
    out_dir = Path(out_dir) if out_dir is not None else None
    ms, skipped = load_table(path) if table is not None or not trace_paths else ([], [])
    if trace_paths:
        _require("torch", "profile", "fit --trace")
        if not gpus or len(gpus) != 1:
            raise LmcostError("--gpu", "a trace needs the one GPU it ran on",
                              "give --gpu once: the shipped name or the YAML (lmcost calibrate writes one for a local device)")
        from lmcost.profiling.measured import trace_measurements

        ran_on, other = load_gpu(gpus[0]), 0
        for t in trace_paths:
            rows_, n = trace_measurements(t, ran_on)
            ms += rows_
            other += n
        if other:
            skipped.append((0, f"{other} trace operator row(s) of kinds the model does not fit (lookups, routers)"))
        path = Path(trace_paths[0]) if table is None else path
    if not ms:
        raise LmcostError(str(path), "no row can be fitted on", "give rows of the ops lmcost models (see lmcost/data/measurements/)")
    families = {m.family for m in ms}
    fittable = [n for n in FITTED if FAMILIES[n] in families]
    if gpus:
        hws = list({hw.name: hw for hw in (load_gpu(g) for g in gpus)}.values())  # aliases of one GPU once
        sources_of = {load_gpu(g).name: _gpu_file(g) for g in gpus}
    elif fittable:
        hws = [load_gpu(n) for n in fittable]
        sources_of = {n: _gpu_file(n) for n in fittable}
    else:
        raise LmcostError("--table", f"no row is of a GPU family lmcost fits blocks for ({', '.join(sorted(set(FAMILIES[n] for n in FITTED)))})",
                          "add rows measured on an A100, H100 or H200, or give --gpu a GPU whose rows the table has")
    for hw in hws:
        if hw.efficiency is None:
            raise LmcostError("--gpu", f"{hw.name} has no efficiency block to take its SM count from",
                              "add efficiency.gemm.sm_count (with its source) to its YAML, then fit")
        if FAMILIES.get(hw.name, hw.name) not in families:
            have = ", ".join(fittable) or "none (its rows are of no fitted family)"
            raise LmcostError("--gpu", f"the table has no rows of {hw.name}'s family", f"use one of: {have}")
    outputs = []
    if out_dir is not None:
        if out_dir.exists() and not out_dir.is_dir():
            raise LmcostError("--out", f"{out_dir} is a file", "give a folder")
        check_folder(out_dir.parent if not out_dir.exists() else out_dir, "--out", "give a folder inside a writable one")
        outputs = [f"{hw.name}.yaml" for hw in hws] + ["fit-report.json"]
        if table is not None and out_dir.resolve() != path.parent.resolve():
            outputs.append("fitting-set.csv")
        for name in outputs:  # nothing is half-written: every target checked before the first write
            if (out_dir / name).is_dir():
                raise LmcostError("--out", f"{out_dir / name} is a folder", "remove it or give another --out")
    with _status("fitting") as status:
        def progress(done, total):
            if status:
                status.update(f"fitting: leave-one-source-out {done}/{total}")
        report = run_fit(ms, skipped, progress)
        blocks = {hw.name: block_for(report, hw) for hw in hws}
    rows = report_rows(report)
    digest = table_digest(path)
    if out_dir is not None:
        texts = {}
        for hw in hws:
            src = sources_of[hw.name]
            texts[f"{hw.name}.yaml"] = replace_block(src.read_text(), block_dict(blocks[hw.name], hw, path.name, digest, report))
            gpu_from_text(texts[f"{hw.name}.yaml"], src.name)
        texts["fit-report.json"] = render.to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(ms), rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            classes=rows, by_source=source_rows(report))) + "\n"
        if len(outputs) > len(texts):
            texts[outputs[-1]] = path.read_text(encoding="utf-8-sig")
        write_texts(out_dir, {name: texts[name] for name in outputs}, "--out")
    if _emit(rows):
        return
    t = Table(title=f"efficiency fit on {path.name}: {len(ms)} rows, leave-one-source-out")
    for c in ("class", "rows", "sources", "median |error|", "named kernel", "band (5-95%)", "held-out in band"):
        t.add_column(c, justify="left" if c == "class" else "right")
    for r in rows:
        if not r["rows"]:
            t.add_row(r["op_class"], "0", "0", "unconstrained", "", "", "")
            continue
        cov = "" if r["band_coverage"] is None else f"{r['band_coverage']:.0%}"
        t.add_row(r["op_class"], str(r["rows"]), str(r["sources"]), f"{r['median_abs_error']:.0%}",
                  f"{r['median_abs_error_named']:.0%}", f"{r['band_low']:.2f}-{r['band_high']:.2f}", cov)
    out.print(t)
    if skipped:
        err.print(f"left out {len(skipped)} row{'s' if len(skipped) != 1 else ''}: " + "; ".join(sorted({w for _, w in skipped})), markup=False,
                  highlight=False, soft_wrap=True)
    edges = sorted({f for b in blocks.values() if b is not None for f in edge_figures(b)})
    if edges:
        err.print(f"note: {len(edges)} fitted figure(s) sit on an edge of the searched range ({', '.join(edges[:6])}"
                  f"{', ...' if len(edges) > 6 else ''}): check that the rows' device, shapes and times are right",
                  markup=False, highlight=False, soft_wrap=True)
    if len({m.source for m in ms}) == 1:
        err.print("note: the table has one source: leaving it out leaves nothing to fit on, so its error above is "
                  "that of the roofline; add rows of other sources to measure the fit's", markup=False, highlight=False,
                  soft_wrap=True)
    if out_dir is not None:
        err.print(f"wrote {', '.join(outputs)} to {out_dir}", markup=False, highlight=False, soft_wrap=True)


def _gpu_file(name: str) -> Path:
    """The YAML of a GPU, shipped or a path (its text is kept when a fitted block replaces its efficiency)."""
    from lmcost.basics import shipped as resources
    if Path(name).suffix in (".yaml", ".yml") and Path(name).is_file():
        return Path(name)
    found = resources.find("gpus", name)
    if found is None:
        raise LmcostError("--gpu", f"{name} is not a shipped GPU", "fit a shipped GPU (lmcost gpus) or a GPU YAML")
    return found


def _status(text: str):
    """A rich status line on stderr while something slow runs; nothing under --json/--csv or when
    stderr is not a terminal (a pipe, a log, CI)."""
    import contextlib

    if _mode() is not None or not err.is_terminal:
        return contextlib.nullcontext(None)
    return err.status(text)


def _warn_context(cfg, tokens: int) -> None:
    """Say so when a context runs past what a RoPE model was trained for (:func:`lmcost.graph.workload.past_trained_context`)."""
    from lmcost.graph.workload import past_trained_context

    note = past_trained_context(cfg, tokens)
    if note:
        err.print(note, markup=False, highlight=False, soft_wrap=True)


def _calibration_summary(measured: dict) -> None:
    """What calibrate measured, on stderr: peaks, bandwidth, kernel floor, and the fit's error per kind."""
    eff = measured.get("efficiency") or {}
    errors = (eff.get("conditions") or {}).get("fit_median_abs_error_pct") or {}
    lines = ["measured: " + ", ".join(f"{k} {v:.4g} TFLOP/s" for k, v in measured["peak_tflops"].items())
             + f"; bandwidth {measured['bandwidth_tb_s'] * 1e3:.4g} GB/s; smallest kernel "
             f"{measured.get('kernel_floor_us') or 0:.3g} us"]
    if errors:
        lines.append("fit, median |error| per kind: " + ", ".join(f"{k} {v:.1f}%" for k, v in errors.items()))
    cond = eff.get("conditions") or {}
    if "reference_drift_pct" in cond:
        lines.append(f"{cond.get('threads')} thread(s); reference kernel drift {cond['reference_drift_pct']:.1f}%")
        from lmcost.hardware.gpu import GPU
        from lmcost.profiling.cache import quality_problems

        problems = quality_problems(GPU.model_validate(measured))
        if problems:
            lines.append("warning: this calibration fails the quality gate validate applies to a cached one: "
                         + "; ".join(problems) + " (the machine was busy?)")
    for line in lines:
        err.print(line, markup=False, highlight=False, soft_wrap=True)


def _note_threads(threads: int | None) -> None:
    """Say so when --threads asks for more intra-op threads than this process has physical cores."""
    from lmcost.profiling.control import physical_cores

    cores = physical_cores()
    if threads is not None and threads > cores:
        err.print(f"note: --threads {threads} is more than the {cores} physical core(s) here: threads will share cores "
                  "and times will vary", markup=False, highlight=False, soft_wrap=True)


def _note_layers(cfg, layers: int | None) -> None:
    """Say so when --layers asks for more blocks than the model has (all of them are kept)."""
    if layers and layers > cfg.n_layers:
        err.print(f"note: --layers {layers} exceeds {cfg.name}'s {cfg.n_layers} layers: all {cfg.n_layers} are used",
                  markup=False, highlight=False, soft_wrap=True)


def _profile_run(model, device, dtype, layers, batch, prompt, gen, repeats, attention, mla, trace, threads=None, retries=0,
                 gpu=None):
    """Profile one batch size with a progress bar (:func:`lmcost.profiling.validate.profile_model`)."""
    from rich.progress import track

    from lmcost.model.loading import load_config
    from lmcost.profiling.validate import profile_model
    from lmcost.graph.workload import Settings

    cfg = load_config(model) if isinstance(model, str) else model
    _note_layers(cfg, layers)
    progress = lambda it: track(it, description=f"profiling b={batch}", console=err, transient=True)
    return profile_model(cfg, device=device.value,
                         dtype=dtype.value, layers=layers, batch=batch, prompt=prompt, steps=gen, repeats=repeats,
                         settings=Settings(kernel=attention.value, mla=mla.value), trace_path=trace, progress=progress,
                         threads=threads, retries=retries, gpu=gpu,
                         say=lambda line: err.print(line, markup=False, highlight=False, soft_wrap=True))


LayersOpt = Annotated[int, typer.Option(help="Keep this many blocks of the model (0: all).")]
RepeatsOpt = Annotated[int, typer.Option(help="Repeats (unprofiled for wall times, then profiled); the faster half of the steps is reported, with the spread.")]


@app.command()
@user_errors
def profile(
    model: ModelArg,
    device: Annotated[Device, typer.Option(help="Where the reference decoder runs.")] = Device.cpu,
    dtype: Annotated[RunDtype, typer.Option(help="Weights, activations and KV cache dtype.")] = RunDtype.fp32,
    layers: LayersOpt = 2,
    batch: BatchOpt = 1,
    prompt: PromptOpt = 128,
    gen: StepsOpt = 8,
    repeats: RepeatsOpt = 10,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.absorbed,
    trace: Annotated[Path, typer.Option(help="Chrome trace to write (opens in Perfetto).")] = Path("trace.json"),
    csv_out: Annotated[Path, typer.Option("--csv-out", help="Per-operator measured times (CSV) to write.")] = Path("ops_measured.csv"),
    threads: ThreadsOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
):
    """Run the reference decoder under torch.profiler: a Chrome trace and per-operator measured times.
    With --tp/--pp/--ep/--dp (CPU): the sharded run over gloo processes and its collectives, as validate does."""
    _require("torch", "profile", "profile")
    if (tp, pp, ep, dp) != (1, 1, 1, 1):
        _validate_sharded([model], device.value, dtype.value, layers, str(batch), prompt, gen, tp, pp, ep, dp, None)
        return
    from lmcost.basics.files import check_folder

    if trace.resolve() == csv_out.resolve():
        raise LmcostError("--csv-out", f"{csv_out} is also the --trace path", "give the two files different names")
    for path, flag in ((trace, "--trace"), (csv_out, "--csv-out")):
        if path.is_dir():
            raise LmcostError(flag, f"{path} is a folder", "give a file path")
        check_folder(path.parent, flag, "give a file path inside a folder")
    _note_threads(threads)
    run, measured, path = _profile_run(model, device, dtype, layers or None, batch, prompt, gen, repeats,
                                       attention, mla, trace, threads)
    from lmcost.basics.files import write_text
    from lmcost.profiling.control import spread
    from lmcost.profiling.validate import gap_line, stability_line

    write_text(csv_out, measured.ops.to_csv(index=False))
    err.print(f"wrote {path} and {csv_out}", markup=False, highlight=False)
    t = Table(title=f"{escape(run.cfg.name)}: measured on {device.value} ({dtype.value}, SDPA backend "
                    f"{escape(run.sdpa_backend or '?')})", title_justify="left")
    for c in ("phase", "operator", "class", "time per step", "spread"):
        t.add_column(c, justify="right" if c in ("time per step", "spread") else "left")
    for r in measured.ops.itertuples():
        t.add_row(r.phase, r.name, str(r.op_class), render.si(r.measured_time_s, "s"), f"{r.spread_pct:.0f}%")
    st = measured.steps
    for phase, label in (("prefill", "prefill (wall, end to end)"), ("decode", "decode step (wall, end to end)")):
        t.add_row(phase, label, "", render.si(st.wall_s(phase), "s"), f"{100 * spread(st.wall[phase]):.0f}%")
    out.print(t)
    for line in (stability_line(measured), gap_line(measured)):
        if line:
            err.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command()
@user_errors
@machine_output
def validate(
    models: Annotated[list[str], typer.Argument(help="One or more models (YAML, HF config.json, or shipped names): the evaluation set.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="Predict with this GPU YAML; default: calibrate the local device.")] = None,
    device: Annotated[Device, typer.Option(help="Where the reference decoder runs.")] = Device.cpu,
    dtype: Annotated[RunDtype, typer.Option(help="Weights, activations and KV cache dtype.")] = RunDtype.fp32,
    layers: LayersOpt = 2,
    batch: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1",
    prompt: PromptOpt = 128,
    gen: StepsOpt = 8,
    repeats: RepeatsOpt = 10,
    attention: KernelOpt = Kernel.flash,
    mla: MLAOpt = MLAMode.absorbed,
    trace: Annotated[Optional[Path], typer.Option(help="Compare with this Chrome trace instead of running.")] = None,
    fuse: Annotated[str, typer.Option("--fuse", help="With a foreign --trace: what its runtime fuses (see estimate --fuse). lmcost traces record their own.")] = "none",
    report_dir: Annotated[Path, typer.Option("--report-dir", help="Folder for the markdown report and CSVs.")] = Path("reports"),
    recalibrate: Annotated[bool, typer.Option("--recalibrate", help="Measure the local device again instead of reusing the cached calibration.")] = False,
    threads: ThreadsOpt = None,
    retries: Annotated[int, typer.Option("--retries", min=0, max=20, help="Measure a run again, up to this many times, while the machine looks busy or unlike its calibration.")] = 2,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    ep: EpOpt = 1,
    dp: DpOpt = 1,
):
    """Predicted (roofline and calibrated) against measured time per operator class and phase, end to end (TTFT, TPOT against wall time), with a markdown report.
    With --tp/--pp/--ep/--dp (CPU): the decoder sharded over gloo processes, its logits against one
    process's and its collectives against lmcost's communication operators (count, kind, payload)."""
    _require("torch", "profile", "validate")
    if (tp, pp, ep, dp) != (1, 1, 1, 1):
        _validate_sharded(models, device.value, dtype.value, layers, batch, prompt, gen, tp, pp, ep, dp, trace)
        return
    from lmcost.basics.files import check_folder
    from lmcost.graph.fusion import parse_fusion
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.profiling import trace as traces
    from lmcost.profiling.profile import measured_from_trace
    from lmcost.profiling.validate import (MODELS, foreign_trace, median_class_error, preflight, resolve_trace,
                                     trace_path, validate_runs)
    from lmcost.graph.workload import Settings

    batches = _ints(batch, "--batch")
    fusion = parse_fusion(fuse)
    cfgs = [load_config(m) for m in models]
    if trace is not None:  # a profiled run says so itself
        _note_layers(cfgs[0], layers)
    settings = Settings(kernel=attention.value, mla=mla.value)
    if trace is None:  # refuse before running anything: every model and batch must be valid and fit
        preflight(cfgs, batches, device=device.value, dtype=dtype.value, layers=layers or None, prompt=prompt,
                  steps=gen, repeats=repeats, settings=Settings(kernel=attention.value, mla="absorbed"))
    elif len(batches) != 1 or len(cfgs) != 1:
        raise LmcostError("--batch/MODELS", "a trace holds one run", "give the one model and batch size it was taken at")
    if trace is None:
        from lmcost.profiling.control import set_threads

        threads = set_threads(threads)  # the calibration and every run use the same count
        _note_threads(threads)
    hw = load_gpu(gpu) if gpu is not None else (None if trace is not None else _calibrated(device.value, recalibrate, threads))
    if trace is None:
        check_folder(report_dir, "--report-dir")
    if trace is None and gpu is not None:
        from lmcost.profiling.validate import calibration_notes

        for line in calibration_notes(hw, device.value, dtype.value, threads):
            err.print(line, markup=False, highlight=False, soft_wrap=True)
    if trace is None and device.value == "cpu" and hw.vendor != "measured":
        err.print(f"note: predicting a CPU run with {hw.name}'s datasheet figures; omit --gpu to calibrate this CPU",
                  markup=False, highlight=False, soft_wrap=True)
    if trace is not None:
        if hw is None:
            raise LmcostError("--gpu", "missing", "name the GPU (or calibrated YAML) the trace was taken on")
        run, data, note = resolve_trace(trace, cfgs[0], device=device.value, dtype=dtype.value, layers=layers or None,
                                        batch=batches[0], prompt=prompt, steps=gen, repeats=repeats,
                                        settings=settings, fusion=fusion)
        if note:
            err.print(note, markup=False, highlight=False)
        if not traces.has_scopes(data):
            res = foreign_trace(run, hw, data)
            for line in res.notes:
                err.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)
            rows = res.table.to_dict("records")
            if _emit(rows):
                return
            t = Table(title=f"{escape(str(trace))}: op time by predicted class", title_justify="left")
            for c in ("class", "roofline", "calibrated", "measured", "share of trace", "roofline error", "calibrated error"):
                t.add_column(c)
            pct = lambda p, m: f"{100 * (p - m) / m:+.1f}%" if m > 0 and p == p else "-"
            for r in rows:
                t.add_row(r["op_class"], render.si(r["roofline_time_s"], "s"), render.si(r["calibrated_time_s"], "s"),
                          render.si(r["measured_time_s"], "s"), f"{r['measured_share']:.1%}",
                          pct(r["roofline_time_s"], r["measured_time_s"]), pct(r["calibrated_time_s"], r["measured_time_s"]))
            out.print(t)
            out.print(f"{res.share:.1%} of the trace's op time ({render.si(res.total_s, 's')}) attributed to predicted "
                      f"operator classes, by {res.method}")
            return
        runs = [(run, measured_from_trace(run, data))]
        check_folder(report_dir, "--report-dir")
    else:
        runs = [_profile_run(cfg, device, dtype, layers or None, b, prompt, gen, repeats, attention, mla,
                             trace_path(report_dir, cfg, b), threads, retries, hw)[:2] for cfg in cfgs for b in batches]
    results, tables, md = validate_runs(runs, hw, report_dir, "+".join(c.name for c in cfgs), write_ops=trace is None)
    err.print(f"wrote {md}", markup=False, highlight=False)
    if _emit(results):
        return
    first = runs[0][0]
    t = Table(title=f"predicted ({escape(hw.name)}) vs measured ({first.device}, {first.dtype})", title_justify="left")
    for c in ("model", "batch", "phase", "class", "roofline", "calibrated", "measured", "roofline error", "calibrated error"):
        t.add_column(c, justify="left" if c in ("model", "phase", "class") else "right")
    for r in results:
        bad = r["measured_time_s"] != r["measured_time_s"]  # NaN: nothing measured
        t.add_row(escape(r["model"]), str(r["batch"]), r["phase"], r["op_class"], render.si(r["roofline_time_s"], "s"),
                  render.si(r["calibrated_time_s"], "s"),
                  "[red]not measured[/red]" if bad else render.si(r["measured_time_s"], "s"),
                  *["-" if bad else f"{r[f'{m}_error_pct']:+.1f}%" for m in MODELS])
    out.print(t)
    from lmcost.profiling.validate import END_TO_END, stability_line

    for run, cls, measured in tables:
        e2e = cls[cls.op_class == END_TO_END].set_index("phase")
        line = (f"{escape(run.cfg.name)} b={run.batch}: median |error| over classes: "
                + ", ".join(f"{m} {median_class_error(cls, m):.1f}%" for m in MODELS))
        if not e2e.empty:
            line += "; end to end (calibrated): " + ", ".join(
                f"{label} {e2e.calibrated_error_pct.get(ph, float('nan')):+.1f}%" for ph, label in (("prefill", "TTFT"), ("decode", "TPOT")))
        out.print(line)
        out.print(f"  {escape(stability_line(measured))}")


def _layout(hw, tp, pp, ep, dp, imbalance, cluster, nodes, sp=False, cp=1):
    """The parallel layout of the flags, checked against the cluster (GPUs per node x --nodes)."""
    from lmcost.graph.parallel import Layout, cluster_for

    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp, cp=cp, imbalance=imbalance, cluster=cluster, sp=sp)
    if nodes is not None:
        if not 1 <= nodes <= 65536:
            raise LmcostError("--nodes", f"must be from 1 to 65,536, got {nodes}", "give the nodes available")
        node = cluster_for(layout, hw)
        if layout.gpus > nodes * node.gpus_per_node:
            raise LmcostError("--nodes", f"{layout.describe()} needs {layout.gpus} GPUs, {nodes} x {node.name} has "
                              f"{nodes * node.gpus_per_node}", "raise --nodes or shrink the layout")
    elif cluster is not None or not layout.single:
        cluster_for(layout, hw)  # an unknown cluster, or a GPU without a node, is said before any costing
    return layout


def _validate_sharded(models, device, dtype, layers, batch, prompt, gen, tp, pp, ep, dp, trace) -> None:
    """validate's distributed check (see validate): one table per model and batch; exit 1 on a mismatch."""
    from lmcost.model.config import truncate
    from lmcost.model.loading import load_config
    from lmcost.graph.parallel import Layout
    from lmcost.profiling.distributed import compare

    if device != "cpu" or dtype != "fp32" or trace is not None:
        raise LmcostError("--tp/--pp/--ep/--dp", "the sharded check runs on CPU in fp32 with gloo (no NCCL run here)",
                          "use --device cpu --dtype fp32 and no --trace")
    layout = Layout(tp=tp, pp=pp, ep=ep, dp=dp)
    results, ok = [], True
    for m in models:
        cfg = load_config(m)
        cfg = truncate(cfg, layers) if layers else cfg
        for b in _ints(batch, "--batch"):
            with _status(f"{cfg.name}: {layout.describe()}, batch {b}, gloo"):
                res = compare(cfg, layout, batch=b, prompt=prompt, gen=gen)
            ok &= res["match"] and res["logits_ok"]
            results.append(dict(model=cfg.name, batch=b, layout=layout.describe(), **res))
    if not _emit(results):
        for r in results:
            t = Table(title=f"{escape(r['model'])}, {r['layout']}, batch {r['batch']}, prompt {prompt}, {gen} decode steps: "
                            f"logits max |diff| {r['max_abs_diff']:.2e} ({'ok' if r['logits_ok'] else 'DIFFER'})",
                      title_justify="left")
            for c in ("phase", "kind", "group", "calls (run)", "calls (lmcost)", "payload (run)", "payload (lmcost)", "match"):
                t.add_column(c, justify="left" if c in ("phase", "kind", "group") else "right")
            for row in r["rows"]:
                t.add_row(row["phase"], row["kind"], row["group"], str(row["calls_run"]), str(row["calls_lmcost"]),
                          f"{row['bytes_run']:,} B", f"{row['bytes_lmcost']:,} B", "yes" if row["match"] else "[red]NO[/red]")
            t.caption = "calls and payloads summed over ranks and decode steps (nccl-tests' size, fp32)"
            out.print(t)
    if not ok:
        raise typer.Exit(1)


def _selected(hw, kernel: str | None = None, runtime: str | None = None):
    """``hw`` with its efficiency block's attention kernel family and runtime chosen.

    Raises: LmcostError for a family or runtime the GPU has no figures of (listing those it has), or
    for a choice other than auto on a GPU without an efficiency block.
    """
    if hw.efficiency is None:
        for opt, v in (("--kernel", kernel), ("--runtime", runtime)):
            if v not in (None, "auto"):
                raise LmcostError(opt, f"{hw.name} has no efficiency block, so no figures for {v!r}",
                                  "drop it (times are the roofline), or use a GPU with one (lmcost fit)")
        return hw
    return hw.model_copy(update={"efficiency": hw.efficiency.select(kernel, runtime)})


def _op(ops, gpu: str, dtype: str, title: str, kernel: str | None = None, runtime: str | None = None) -> None:
    """Cost one operator on ``gpu`` and print it (JSON or CSV in base units with --json/--csv)."""
    from lmcost.hardware.gpu import load_gpu
    from lmcost.cost.kernels import cost

    hw = _selected(load_gpu(gpu), kernel, runtime)
    e = hw.efficiency
    for op in ops:
        if e is not None and op.kernels and op.kind not in ("gemm", "sdpa") and e.runtime_lacks(op.kind, op.op_class.value):
            err.print(f"note: {hw.name} has no {e.runtime} figures for {op.kind}: auto's are used", markup=False,
                      highlight=False, soft_wrap=True)
    c = cost(ops, hw, dtype)
    if _emit(c):
        return
    _warn_uncalibrated(hw, "calibrated")
    cal, roof = c["time_s"]["calibrated"], c["time_s"]["roofline"]
    out.print(render.kv_table(f"{title} on {hw.name} ({c['dtype']})", [
        ("shapes", escape(c["shapes"])), ("FLOPs", render.si(c["flops"], "FLOP")), ("bytes", render.si(c["bytes"], "B")),
        ("arithmetic intensity", f"{c['arithmetic_intensity']:.2f} FLOPs/byte"), ("roofline bound", c["bound"]),
        ("time, roofline (lower bound)", render.si(roof, "s")),
        ("time, calibrated (expected)", render.si(cal, "s")
         + render.band((c["time_s"]["calibrated_low"], c["time_s"]["calibrated_high"]) if hw.efficiency and hw.efficiency.bands else None)
         + (f"  ({roof / cal:.0%} of roofline speed)" if cal > 0 else "")),
    ] + ([("efficiency figures", f"kernel {c['kernel']}, runtime {c['runtime']}")] if c["efficiency"] else [])))


GpuOpOpt = Annotated[str, typer.Option("--gpu", help="A shipped GPU name or alias, or a YAML path.")]
OpDtype = Annotated[str, typer.Option("--dtype", help="Element dtype of inputs and outputs; auto: bf16, or fp16 on a GPU without bf16 (as estimate).")]


def _op_dtype(dtype: str, gpu: str) -> str:
    """``--dtype`` of an op command, ``auto`` resolved by the one rule (:func:`_precision`)."""
    if dtype.strip().lower() != "auto":
        return dtype
    from lmcost.hardware.gpu import load_gpu

    return _precision("auto", None, None, [load_gpu(gpu)]).activations


@op_app.command("gemm")
@user_errors
@machine_output
def op_gemm(
    m: Annotated[int, Count("--m", help="Rows of A and C (tokens); 8k = 8192.")],
    n: Annotated[int, Count("--n", help="Columns of B and C (output features); 4k = 4096.")],
    k: Annotated[int, Count("--k", help="The contraction (input features); 4k = 4096.")],
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100",
):
    """C (m x n) = A (m x k) @ B (k x n): 2mnk FLOPs; A, B read and C written once."""
    dtype = _op_dtype(dtype, gpu)
    from lmcost.cost.kernels import gemm

    _op(gemm(m, n, k, dtype), gpu, dtype, f"GEMM {m}x{n}x{k}")


@op_app.command("attention")
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
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", kernel: AttnKernelOpt = "auto",
):
    """A fused (flash) attention kernel over GQA heads: Q (b, h, s, d_h) against K, V (b, h_kv, t, d_h)."""
    dtype = _op_dtype(dtype, gpu)
    from lmcost.cost.kernels import attention

    from lmcost.hardware.gpu import load_gpu

    ops = attention(phase.value, batch, heads, kv_heads, head_dim, seq, kv_len, causal, dtype)
    hw = _selected(load_gpu(gpu), kernel)
    if hw.efficiency is not None:
        hw.efficiency.phases_without(phase.value)
    _op(ops, gpu, dtype, f"{phase.value} attention", kernel=kernel)


@op_app.command("rmsnorm")
@user_errors
@machine_output
def op_rmsnorm(
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    hidden: Annotated[int, Count("--hidden", help="Width normalised over; 8k = 8192.")],
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto",
):
    """RMSNorm over (tokens x hidden), with a weight of hidden elements."""
    dtype = _op_dtype(dtype, gpu)
    from lmcost.cost.kernels import norm

    _op(norm("rmsnorm", tokens, hidden, dtype), gpu, dtype, f"rmsnorm {tokens}x{hidden}", runtime=runtime)


@op_app.command("layernorm")
@user_errors
@machine_output
def op_layernorm(
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    hidden: Annotated[int, Count("--hidden", help="Width normalised over; 8k = 8192.")],
    bias: Annotated[bool, typer.Option("--bias/--no-bias", help="A bias beside the weight (torch's LayerNorm default).")] = True,
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto",
):
    """LayerNorm over (tokens x hidden), with a weight (and bias) of hidden elements."""
    dtype = _op_dtype(dtype, gpu)
    from lmcost.cost.kernels import norm

    _op(norm("layernorm", tokens, hidden, dtype, bias), gpu, dtype, f"layernorm {tokens}x{hidden}", runtime=runtime)


@op_app.command("elementwise")
@user_errors
@machine_output
def op_elementwise(
    kind: Annotated[str, typer.Option("--kind", help="silu_mul (gelu_mul, ...), silu/gelu/relu, add, or rope.")],
    tokens: Annotated[int, Count("--tokens", help="Rows (tokens); 8k = 8192.")],
    width: Annotated[Optional[int], typer.Option("--width", help="Elements per token of each input (silu_mul: d_ff, the width of gate and of up each; not for rope).")] = None,
    heads: Annotated[Optional[int], typer.Option("--heads", help="rope: query heads.")] = None,
    kv_heads: Annotated[Optional[int], typer.Option("--kv-heads", help="rope: key heads.")] = None,
    head_dim: Annotated[Optional[int], typer.Option("--head-dim", help="rope: rotated width per head (d_h, or its rotary part).")] = None,
    dtype: OpDtype = "auto", gpu: GpuOpOpt = "h100", runtime: RuntimeOpt = "auto",
):
    """A pointwise kernel: gated activation, activation, residual add, or RoPE."""
    dtype = _op_dtype(dtype, gpu)
    from lmcost.cost.kernels import elementwise

    _op(elementwise(kind, tokens, width, heads, kv_heads, head_dim, dtype), gpu, dtype, f"{kind} x {tokens} tokens",
        runtime=runtime)


def parse_bytes(text: str) -> int:
    """A payload as nccl-tests prints it: ``65536``, ``64K``, ``64M``, ``1G`` (binary: K = 1024), B/KB/KiB
    spellings accepted. Raises: LmcostError (--bytes) if it is not a whole, non-negative size."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}.get(t[-1:], 1)
    digits = t[:-1] if mult > 1 else t
    if not digits.isdigit() or int(digits) == 0:
        raise LmcostError("--bytes", f"{text!r} is not a size of at least one byte",
                          "give a whole number with K, M or G (binary), e.g. 64M")
    return int(digits) * mult


def _cluster_for(cluster: Optional[str], gpu: Optional[str]):
    """The cluster named, or the node assumed for ``gpu``. Raises: LmcostError if they disagree."""
    from lmcost.hardware.cluster import default_cluster, load_cluster

    if cluster is None:
        return default_cluster(gpu or "h100")
    c = load_cluster(cluster)
    if gpu is not None:
        from lmcost.hardware.gpu import load_gpu

        if load_gpu(gpu).name != load_gpu(c.gpu).name:
            raise LmcostError("--gpu", f"{cluster} holds {c.gpu}, not {load_gpu(gpu).name}", "drop --gpu or pick a cluster of that GPU")
    return c


@op_app.command("collective")
@user_errors
@machine_output
def op_collective(
    kind: Annotated[str, typer.Option("--kind", help="all_reduce, all_gather, reduce_scatter, all_to_all, send_recv or broadcast.")],
    size: Annotated[str, typer.Option("--bytes", help="Payload as nccl-tests counts it (all_reduce/broadcast: the buffer; all_gather: the output; reduce_scatter: the input; all_to_all and send_recv: what one rank sends); K, M, G are binary: 64M = 67108864.")],
    gpus: Annotated[int, typer.Option("--gpus", help="Ranks in the group, on consecutive GPUs (a group larger than a node spans ceil(n / GPUs per node) nodes).")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU (its default node: h100 -> dgx-h100, a100 -> dgx-a100, h200 -> hgx-h200, b200 -> dgx-b200).", show_default=False)] = None,
    cluster: Annotated[Optional[str], typer.Option("--cluster", help="A shipped cluster (lmcost clusters list) or a cluster YAML.", show_default=False)] = None,
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes the group is spread over (default: as few as hold it).", show_default=False)] = None,
):
    """One collective on a group of GPUs: roofline and calibrated time (NCCL's algorithms, fitted on nccl-tests), algbw, busbw, bound."""
    from lmcost.cost.collectives import collective

    n_bytes = parse_bytes(size)
    if gpus < 1:
        raise LmcostError("--gpus", f"{gpus} ranks", "give 1 or more")
    c = _cluster_for(cluster, gpu)
    col = collective(kind.strip().lower(), gpus, c, nodes)
    t = col.times(float(n_bytes))
    cal = t["calibrated_s"]
    algbw = n_bytes / cal if cal > 0 else 0.0
    data = dict(kind=col.kind, gpus=col.n_ranks, nodes=col.nodes, cluster=c.name, gpu=c.gpu, level=col.level,
                algorithm=col.choice(float(n_bytes)), bytes=n_bytes, bus_factor=col.bus_factor(),
                time_s=dict(roofline=t["roofline_s"], calibrated=cal, calibrated_low=t["calibrated_low_s"],
                            calibrated_high=t["calibrated_high_s"]),
                algbw_b_s=algbw, busbw_b_s=algbw * col.bus_factor(), bound=col.bound(float(n_bytes)))
    if _emit(data):
        return
    link = c.intra.name if col.level == "intra" else f"{c.inter.name} ({c.inter.nics_per_node} x {c.inter.nic_gbit_s:g} Gb/s per node)"
    out.print(render.kv_table(f"{col.kind} on {col.n_ranks} x {c.gpu} ({c.name})", [
        ("group", f"{col.n_ranks} rank{'s' if col.n_ranks != 1 else ''} on {col.nodes} node{'s' if col.nodes != 1 else ''}"),
        ("level spanned", f"{col.level}: {escape(link)}"), ("algorithm", data["algorithm"]),
        ("payload", f"{n_bytes:,} B ({render.binary(n_bytes)})"),
        ("time, roofline (lower bound)", render.si(t["roofline_s"], "s")),
        ("time, calibrated (expected)", render.si(cal, "s") + render.band((t["calibrated_low_s"], t["calibrated_high_s"]))),
        ("algbw", render.si(algbw, "B/s")), (f"busbw (x {col.bus_factor():.3g})", render.si(data["busbw_b_s"], "B/s")),
        ("bound", data["bound"]),
    ]))


@clusters_app.command("list")
@user_errors
@machine_output
def clusters_list():
    """Shipped clusters: GPU, GPUs per node, node fabric and network."""
    from lmcost.hardware.cluster import list_clusters

    rows = [dict(name=c.name, aliases=",".join(c.aliases), gpu=c.gpu, gpus_per_node=c.gpus_per_node,
                 intra=c.intra.name, intra_bytes_per_s=c.intra.bandwidth, nvls=c.intra.nvls,
                 inter=c.inter.name if c.inter else "", inter_node_bytes_per_s=c.inter.node_bandwidth if c.inter else 0.0)
            for c in list_clusters()]
    if _emit(rows):
        return
    t = Table(title="Clusters (bandwidth per direction)", title_justify="left")
    for col in ("name", "gpu", "GPUs/node", "node fabric (per GPU)", "NVLS", "network (per node)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpu"], str(r["gpus_per_node"]), f"{escape(r['intra'])} {render.si(r['intra_bytes_per_s'], 'B/s')}",
                  "yes" if r["nvls"] else "no",
                  f"{escape(r['inter'])} {render.si(r['inter_node_bytes_per_s'], 'B/s')}" if r["inter"] else "none")
    out.print(t)


@clusters_app.command("show")
@user_errors
@machine_output
def clusters_show(name: Annotated[str, typer.Argument(help="Cluster name, alias or YAML path.")]):
    """All figures of one cluster, fitted collective figures included, with their sources."""
    from lmcost.hardware.cluster import load_cluster

    c = load_cluster(name)
    data = c.model_dump()
    if _emit(data):
        return
    rows = [(k, str(v)) for k, v in data.items() if k not in ("sources", "intra", "inter", "collectives") and v not in (None, "", [])]
    rows += [(f"intra.{k}", str(v)) for k, v in data["intra"].items()]
    rows += [(f"inter.{k}", str(v)) for k, v in (data["inter"] or {}).items()]
    for part in ("intra", "inter", "band", "fit"):
        rows += [(f"collectives.{part}.{k}", str(v)) for k, v in data["collectives"][part].items()]
    rows += [(f"source {i + 1}", s) for i, s in enumerate(c.sources)]
    out.print(render.kv_table(c.name, [(escape(a), escape(b)) for a, b in rows], justify="left"))


def _fit_collectives(table: Optional[str], out_dir: Optional[str]) -> None:
    """``lmcost fit --collectives``: fit the collective model, print its leave-one-source-out error, and
    with --out write every shipped cluster's YAML with its fitted block and collective-fit-report.json."""
    from lmcost.hardware.cluster import cluster_from_text, list_clusters
    from lmcost.calibration.collective_fit import block_for, cluster_file, load_rows, public_table, replace_block, run
    from lmcost.basics.files import check_folder, write_texts
    from lmcost.calibration.efficiency_fit import table_digest

    if table is not None and not table.strip():
        raise LmcostError("--table", "empty", "give a CSV of collective timings, or drop --table for the shipped one")
    path = Path(table) if table is not None else public_table()
    if not path.is_file():
        raise LmcostError("--table", f"{path} is not a file", "give a CSV of collective timings")
    rows, skipped = load_rows(path)
    if not rows:
        raise LmcostError(str(path), "no row can be fitted on", "give rows in the columns of lmcost/data/measurements/collective-measurements.csv")
    with _status("fitting collectives"):
        report = run(rows, skipped)
    digest = table_digest(path)
    errs = report.errors()
    if out_dir is not None:
        if not out_dir.strip():
            raise LmcostError("--out", "empty", "give a folder, e.g. --out fitted/")
        folder = Path(out_dir)
        if folder.exists() and not folder.is_dir():
            raise LmcostError("--out", f"{folder} is a file", "give a folder")
        check_folder(folder.parent if not folder.exists() else folder, "--out", "give a folder inside a writable one")
        texts = {}
        for c in list_clusters():
            text = replace_block(cluster_file(c.name).read_text(), block_for(c, report, path.name, digest), path.name, digest)
            cluster_from_text(text, f"{c.name}.yaml")
            texts[f"{c.name}.yaml"] = text
        texts["collective-fit-report.json"] = render.to_json(dict(
            table=path.name, sha256=digest, rows_fitted=len(rows), rows_left_out=[dict(row=i, why=w) for i, w in skipped],
            errors=errs, by_source=report.by_source(),
            bands=dict(latency=report.band("latency"), bandwidth=report.band("bandwidth")))) + "\n"
        write_texts(folder, texts, "--out")
    if _emit(errs):
        return
    t = Table(title=f"collective fit on {path.name}: {len(rows)} rows, leave-one-source-out")
    for col in ("device", "regime", "rows", "sources", "median |error|", "worst |error| (row)"):
        t.add_column(col, justify="left" if col in ("device", "regime") else "right")
    for e in errs:
        t.add_row(e["device"], e["regime"], str(e["rows"]), str(e["sources"]), f"{e['median_abs_error']:.0%}",
                  f"{e['worst_abs_error']:.0%} ({e['worst_row']})")
    out.print(t)
    if skipped:
        err.print(f"left out {len(skipped)} row(s): " + "; ".join(sorted({w for _, w in skipped})), markup=False,
                  highlight=False, soft_wrap=True)
    if out_dir is not None:
        err.print(f"wrote the cluster YAMLs and collective-fit-report.json to {out_dir}", markup=False, highlight=False, soft_wrap=True)


@gpus_app.command("list")
@user_errors
@machine_output
def gpus_list():
    """Shipped GPUs with their dense peaks, bandwidth, memory and bf16 ridge point."""
    from lmcost.hardware.gpu import gpu_names, load_gpu

    rows = []
    for name in gpu_names():
        g = load_gpu(name)
        dt = "bf16" if "bf16" in g.peak_tflops else "fp16"
        rows.append(dict(name=g.name, aliases=",".join(g.aliases), description=g.description,
                         peak_flops_per_s=g.peak_flops(dt), peak_dtype=dt, bandwidth_bytes_per_s=g.bandwidth,
                         memory_bytes=g.memory_bytes, ridge_flops_per_byte=g.ridge_point(dt)))
    if _emit(rows):
        return
    t = Table(title="GPUs (dense peaks)", title_justify="left")
    for c in ("name", "aliases", "description", "peak (dtype)", "bandwidth", "memory", "ridge FLOPs/byte"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["aliases"], r["description"],
                  f"{render.si(r['peak_flops_per_s'], 'FLOP/s')} ({r['peak_dtype']})",
                  render.si(r["bandwidth_bytes_per_s"], "B/s"), render.si(r["memory_bytes"], "B"),
                  f"{r['ridge_flops_per_byte']:.0f}")
    out.print(t)


@gpus_app.command("show")
@user_errors
@machine_output
def gpus_show(name: Annotated[str, typer.Argument(help="GPU name, alias or YAML path.")]):
    """All figures of one GPU, with their sources."""
    from lmcost.hardware.gpu import load_gpu

    g = load_gpu(name)
    data = g.model_dump()
    if _emit(data):
        return
    rows = [(k, ", ".join(v) if isinstance(v, list) else str(v)) for k, v in data.items()
            if k not in ("sources", "peak_tflops", "efficiency") and v not in (None, "", [])]
    rows += [(f"peak {k} (dense)", render.si(v * 1e12, "FLOP/s")) for k, v in g.peak_tflops.items()]
    rows += [(f"source {i + 1}", s) for i, s in enumerate(g.sources)]
    rows += render.efficiency_rows(g.efficiency)
    out.print(render.kv_table(g.name, rows, justify="left"))


@models_app.command("list")
@user_errors
@machine_output
def models_list():
    """Shipped model architectures with their parameter counts."""
    from lmcost.model.loading import load_config
    from lmcost.cost.params import param_counts
    from lmcost.basics.shipped import names

    rows = []
    for name in names("models"):
        cfg = load_config(name)
        p = param_counts(cfg)
        rows.append(dict(name=name, attention=cfg.attention_kind, layers=cfg.n_layers, d_model=cfg.d_model,
                         params=p["total"], active_params=p["active_per_token"], moe=cfg.moe is not None))
    if _emit(rows):
        return
    t = Table(title="Models", title_justify="left")
    for c in ("name", "attention", "layers", "d_model", "params", "active per token"):
        t.add_column(c, justify="left" if c in ("name", "attention") else "right")
    for r in rows:
        t.add_row(r["name"], r["attention"], str(r["layers"]), str(r["d_model"]), render.count(r["params"]),
                  render.count(r["active_params"]))
    out.print(t)


@models_app.command("show")
@user_errors
@machine_output
def models_show(name: ModelArg):
    """One architecture as lmcost reads it (after HF mapping), with derived dims."""
    import yaml

    from lmcost.model.loading import load_config

    cfg = load_config(name)
    data = cfg.model_dump(exclude_defaults=True)
    if _emit(data):
        return
    out.print(yaml.safe_dump(data, sort_keys=False).rstrip(), highlight=False, markup=False)
    heads = (f"latent d_c {cfg.attention.mla.kv_lora_rank} + RoPE key d_r {cfg.d_rot}" if cfg.attention.mla
             else f"h_kv {cfg.h_kv}, d_h {cfg.d_h}, rotary width {cfg.d_rot}")
    out.print(f"# derived: attention {cfg.attention_kind}, {heads}; unset fields take their defaults "
              "(see lmcost/data/models/llama.yaml)", highlight=False, markup=False)


def _usage_error_line(e) -> str:
    """One line for a click usage error (bad option value, unknown option, missing argument)."""
    param = getattr(e, "param", None)
    if param is not None:
        field = "/".join(param.opts) if getattr(param, "opts", None) and param.param_type_name == "option" else param.name.upper()
    else:
        field = getattr(e, "option_name", None) or "command line"
    what = e.format_message().replace("\n", " ").replace("Value error, ", "").rstrip(".")
    if param is not None and what.startswith("Invalid value for"):
        what = what.split(": ", 1)[-1]
    cmd = e.ctx.command_path if e.ctx is not None else "lmcost"
    return f"error: {field}: {what}; see `{cmd} --help`"


def main():
    """Console-script entry point: usage errors as one line, exit 2, like LmcostError."""
    try:  # typer >= 0.26 vendors click; older releases use click itself
        from typer._click.exceptions import UsageError
    except ImportError:
        from click import UsageError

    try:
        code = app(standalone_mode=False)
    except UsageError as e:
        if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
            print(e.ctx.get_help())  # a bare `lmcost` or `lmcost gpus`: show what there is
        else:
            err.print(_one_line(_usage_error_line(e)), markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        sys.exit(130)
    except BrokenPipeError:  # `lmcost ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        sys.exit(0)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EIO):
            raise
        err.print(f"error: stdout: cannot write ({e.strerror}); free space or redirect elsewhere", markup=False)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
