"""``lmcost kv``: attention variants compared by KV cache, what fits, and decode cost."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from lmcost.output import render
from lmcost.cli.app import emit, err, machine_output, out, user_errors
from lmcost.cli.options import BatchOpt, DtypeOpt, GpuOpt, Kernel, KernelOpt, KvDtypeOpt, ModelArg, QuantOpt, WDtypeOpt, parse_tokens
from lmcost.cli.shared import resolve_precision, resolve_quant, weights_label


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

    contexts = parse_tokens(context, "--context")
    cfg = with_window(load_config(model), window, local_global)
    hw = load_gpu(gpu)
    precision = resolve_precision(dtype, weight_dtype, kv_dtype, [hw])
    cfg, quant = resolve_quant(cfg, quant, weight_dtype)
    labels = parse_labels(variants, cfg)
    settings = Settings(kernel=attention.value, quant=quant)
    df = compare(cfg, hw, labels, contexts, batch, precision, settings, block_size)
    if plot is not None:
        from lmcost.cost.params import param_counts
        from lmcost.output.plots import kv_figure, write_html

        if quant or cfg.quant:
            from lmcost.graph.quant import weight_bytes

            free = hw.memory_bytes - weight_bytes(cfg, quant or cfg.quant)["total"]
        else:
            free = hw.memory_bytes - param_counts(cfg, precision)["total"] * precision.B_w
        fig = kv_figure(curves(cfg, hw, labels, max(contexts), batch, precision, settings), free,
                        f"{cfg.name} on {hw.name}: batch {batch}, KV {precision.kv_cache}")
        path = write_html(fig, plot)
        err.print(f"wrote {path}", markup=False, highlight=False)
    if emit(df.to_dict("records")):
        return
    out.print(f"[bold]{escape(cfg.name)}[/bold] on [bold]{escape(hw.name)}[/bold]: batch {batch}, KV {precision.kv_cache}, "
              f"weights {weights_label(precision, cfg, quant)}, paged blocks of {block_size} tokens")
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
