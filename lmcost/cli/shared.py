"""What several commands set up alike: precision, quantization, layout and GPU selection, and the notes they print."""

from typing import Optional

from lmcost.basics.errors import LmcostError
from lmcost.cli.app import err


def warn_uncalibrated(hw, model: str) -> None:
    """Say so when --model calibrated meets a GPU without an efficiency block (it is then the roofline)."""
    if model == "calibrated" and hw.efficiency is None:
        err.print(f"note: {hw.name} has no efficiency block: calibrated times equal the roofline "
                  "(no published kernel timings fitted for it; lmcost fit --table fits one from yours, lmcost calibrate "
                  "measures one for a local device)", markup=False, highlight=False, soft_wrap=True)


def resolve_precision(dtype: str, weight_dtype: Optional[str], kv_dtype: Optional[str], gpus=()):
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


def resolve_quant(cfg, quant: Optional[str], weight_dtype: Optional[str]):
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


def weights_label(precision, cfg, quant: Optional[str]) -> str:
    """What the weights are stored in, for a header line."""
    q = quant or cfg.quant
    return f"{q} recipe" if q else precision.weights


def checked_layout(hw, tp, pp, ep, dp, imbalance, cluster, nodes, sp=False, cp=1):
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


def selected(hw, kernel: str | None = None, runtime: str | None = None):
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


def warn_context(cfg, tokens: int) -> None:
    """Say so when a context runs past what a RoPE model was trained for (:func:`lmcost.graph.workload.past_trained_context`)."""
    from lmcost.graph.workload import past_trained_context

    note = past_trained_context(cfg, tokens)
    if note:
        err.print(note, markup=False, highlight=False, soft_wrap=True)


def note_layers(cfg, layers: int | None) -> None:
    """Say so when --layers asks for more blocks than the model has (all of them are kept)."""
    if layers and layers > cfg.n_layers:
        err.print(f"note: --layers {layers} exceeds {cfg.name}'s {cfg.n_layers} layers: all {cfg.n_layers} are used",
                  markup=False, highlight=False, soft_wrap=True)
