"""``lmcost kv``: attention variants compared by KV cache, what fits, and decode cost."""

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.output import tables
from lmcost.cli.app import emit, err, machine_output, out, say, status_line, user_errors
from lmcost.cli.options import BatchOpt, DtypeOpt, GpuOpt, Kernel, KernelOpt, KvDtypeOpt, ModelArg, QuantOpt, WDtypeOpt, parse_tokens
from lmcost.apps.setup import weights_label


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
    from lmcost.apps.kv_run import KvRequest, compare_variants

    request = KvRequest(model=model, gpu=gpu, variants=variants, contexts=tuple(parse_tokens(context, "--context")),
                        batch=batch, window=window, local_global=local_global, block_size=block_size, dtype=dtype,
                        weight_dtype=weight_dtype, quant=quant, kv_dtype=kv_dtype, attention=attention.value, plot=plot)
    with status_line(f"comparing the attention variants of {escape(str(model))} on {escape(str(gpu))}"):
        res = compare_variants(request, say)
    if res.figure is not None:
        err.print(f"wrote {res.figure}", markup=False, highlight=False)
    if emit(res.table.to_dict("records")):
        return
    out.print(f"[bold]{escape(res.cfg.name)}[/bold] on [bold]{escape(res.gpu.name)}[/bold]: batch {batch}, "
              f"KV {res.precision.kv_cache}, weights {weights_label(res.precision, res.cfg, res.quant)}, "
              f"paged blocks of {block_size} tokens")
    out.print(tables.kv_variants_table(res.table, batch))
    out.print(tables.kv_contexts_table(res.table))
