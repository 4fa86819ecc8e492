"""``lmcost serve``: an inference server under load (continuous batching, chunked prefill, paged KV,
arrivals), its throughput, latency percentiles and goodput; a sweep of rates; a figure."""

import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.basics.errors import LmcostError
from lmcost.cli.app import emit, err, machine_output, out, output_mode, require_extra, say, status_line, user_errors
from lmcost.cli.options import (AttnKernelOpt, ClusterOpt, Count, DpOpt, DtypeOpt, EpOpt, GpuOpt, ImbalanceOpt,
                                KvDtypeOpt, ModelArg, ModelOpt, NodesOpt, QuantOpt, RuntimeOpt, TimeModel, TpOpt,
                                WDtypeOpt, parse_duration)
from lmcost.output import render, serving

#: The generated workload's defaults (ServeRequest's), filled in here so that the CLI knows which were given.
REQUESTS, PROMPT, OUTPUT = 1000, "1024", "256"
#: Bounds of the scheduler knobs: past any engine's (vLLM caps max_num_seqs at 1,024 by default, blocks are
#: 16-256 tokens); the token budget as any token count (2^31).
MAX_SEQS, MAX_TOKENS, MAX_BLOCK = 2**20, 2**31, 2**16


def _opt(flag: str, help: str, kind=str, **kw):
    """An option that is None when not given."""
    return Annotated[Optional[kind], typer.Option(flag, help=help, **kw)]


def parse_rates(text: str, field: str) -> tuple[float, ...]:
    """``1,2,4.5`` -> (1.0, 2.0, 4.5): requests per second, each positive and finite, none repeated.
    Raises: LmcostError naming ``field`` otherwise."""
    rates = []
    for part in text.split(","):
        try:
            v = float(part)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and v > 0):
            raise LmcostError(field, f"{part.strip()!r:.40} is not a rate > 0", "write requests per second, e.g. 1,2,4,8")
        if v in rates:
            raise LmcostError(field, f"{v:g} given twice", "give each rate once")
        rates.append(v)
    return tuple(rates)


def _in_range(value, field: str, low, high, what: str) -> None:
    """Raises: LmcostError naming ``field`` if ``value`` (when given) is not within [low, high] (a NaN is not)."""
    if value is not None and not low <= value <= high:
        raise LmcostError(field, f"{value!r:.40} is outside {low:,} to {high:,}", f"give {what}")


def _refuse_with(given: dict, other: str, why: str) -> None:
    """Raises: LmcostError naming the first flag of ``given`` ({flag: value}) that was given, meaningless
    with ``other`` (``why``)."""
    for flag_, value in given.items():
        if value is not None:
            raise LmcostError(flag_, f"has no effect with {other} ({why})", f"drop {flag_} or {other}")


@user_errors
@machine_output
def serve(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    engine: Annotated[str, typer.Option("--engine", help="Engine profile (lmcost/data/engines): vllm, sglang, trtllm "
                                        "(the newest shipped version), name-version (vllm-0.11), or a YAML path.")] = "vllm",
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: ModelOpt = TimeModel.calibrated,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    tp: TpOpt = 1,
    ep: EpOpt = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel replicas (requests shared round robin).")] = 1,
    ep_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    requests: Annotated[Optional[int], Count("--requests", help=f"Requests to generate (default {REQUESTS}); 10k = 10240.")] = None,
    prompt: _opt("--prompt", f"Prompt tokens per request (default {PROMPT}): N, uniform:LO:HI, normal:MEAN:SD, "
                 "lognormal:MEDIAN:SIGMA, or a dataset's shape (sharegpt).") = None,
    output: _opt("--output", f"Output tokens per request (default {OUTPUT}), as --prompt.") = None,
    rate: _opt("--rate", "Requests per second arriving (default: none, offline: all at once).", float) = None,
    arrival: _opt("--arrival", "Arrival process at --rate: poisson (the default) or gamma:CV (burstier for CV > 1).") = None,
    concurrency: _opt("--concurrency", "A closed loop of this many users: a request enters when one finishes.", int) = None,
    workload: _opt("--workload", "Replay a JSONL file of requests, one {\"arrival_s\", \"prompt_tokens\", "
                   "\"output_tokens\"} per line.", Path) = None,
    seed: _opt("--seed", "Seed of the generated lengths and arrivals (default 0).", int) = None,
    max_num_seqs: _opt("--max-num-seqs", "Sequences running at once (default: the engine's).", int) = None,
    max_num_batched_tokens: Annotated[Optional[int], Count("--max-num-batched-tokens",
                                                           help="Tokens per step (default: the engine's); 8k = 8192.")] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option("--chunked-prefill/--no-chunked-prefill",
                                                            help="Split long prompts over steps (default: the engine's).",
                                                            show_default=False)] = None,
    memory_fraction: _opt("--memory-fraction", "Share of GPU memory the engine takes, in (0, 1] (default: the "
                          "engine's, as vLLM's gpu_memory_utilization).", float) = None,
    block_size: _opt("--block-size", "Tokens per KV-cache block (default: the engine's).", int) = None,
    slo_ttft: _opt("--slo-ttft", "TTFT SLO per request for goodput, e.g. 500ms (ns, us or µs, ms, s).") = None,
    slo_tpot: _opt("--slo-tpot", "TPOT SLO per request for goodput, e.g. 50ms (ns, us or µs, ms, s).") = None,
    rates: _opt("--rates", "A sweep: requests per second, comma-separated (e.g. 1,2,4,8), one run each.") = None,
    plot: _opt("--plot", "Write a plotly HTML figure: latency against rate (a sweep), or KV-cache use and "
               "requests over time (one run).", Path) = None,
):
    """Serve requests through an engine's scheduler (continuous batching, chunked prefill, paged KV cache,
    preemption), every step costed by the same operators as estimate: throughput, TTFT, TPOT, ITL and
    end-to-end latency percentiles, queueing, goodput under SLOs; a sweep of rates shows the knee."""
    from lmcost.apps.serve import ServeRequest, run_serve

    if workload is not None:
        _refuse_with({"--prompt": prompt, "--output": output, "--requests": requests, "--rate": rate,
                      "--rates": rates, "--arrival": arrival, "--concurrency": concurrency, "--seed": seed},
                     "--workload", "the file gives each request's arrival and lengths")
    if rates is not None:
        _refuse_with({"--rate": rate, "--concurrency": concurrency}, "--rates", "each run of the sweep has its rate")
    sweep = parse_rates(rates, "--rates") if rates is not None else ()
    _in_range(max_num_seqs, "--max-num-seqs", 1, MAX_SEQS, "sequences running at once")
    _in_range(max_num_batched_tokens, "--max-num-batched-tokens", 1, MAX_TOKENS, "tokens per step, e.g. 8k")
    _in_range(block_size, "--block-size", 1, MAX_BLOCK, "tokens per block, e.g. 16")
    if memory_fraction is not None and not 0 < memory_fraction <= 1:
        raise LmcostError("--memory-fraction", f"{memory_fraction!r} is outside (0, 1]", "give a share, e.g. 0.9")
    offline = rate is None and not sweep and concurrency is None and workload is None
    if arrival is not None and rate is None and not sweep:  # offline, or a closed loop: no arrival process
        raise LmcostError("--arrival", "has no effect without --rate or --rates (requests arrive all at once, or as "
                          "others finish with --concurrency)", "give a rate, or drop --arrival")
    request = ServeRequest(
        model=model, gpu=gpu, engine=engine, dtype=dtype, weight_dtype=weight_dtype, quant=quant, kv_dtype=kv_dtype,
        time_model=model_.value, attention_kernel=kernel, runtime=runtime, tp=tp, ep=ep, dp=dp, imbalance=ep_imbalance,
        cluster=cluster, nodes=nodes, requests=REQUESTS if requests is None else requests,
        prompt=PROMPT if prompt is None else prompt, output=OUTPUT if output is None else output,
        rate=rate, arrival="offline" if offline else (arrival or "poisson"), concurrency=concurrency,
        workload_file=None if workload is None else str(workload), seed=0 if seed is None else seed,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked_prefill,
        memory_fraction=memory_fraction, block_size=block_size,
        slo_ttft_s=parse_duration(slo_ttft, "--slo-ttft") if slo_ttft is not None else None,
        slo_tpot_s=parse_duration(slo_tpot, "--slo-tpot") if slo_tpot is not None else None, rates=sweep)
    if plot is not None:
        require_extra("plotly", "plot", "--plot")
    text = f"serving {escape(str(model))} on {escape(str(gpu))}"
    with status_line(text) as status:
        runs = {"k": 0, "last": -1}

        def progress(done: int, n: int) -> None:
            if done < runs["last"]:  # the next rate of a sweep
                runs["k"] += 1
            runs["last"] = done
            at = f" (rate {sweep[runs['k']]:g}/s, {runs['k'] + 1} of {len(sweep)})" if sweep else ""
            if status is not None:
                status.update(f"{text}: {done:,} of {n:,} requests{at}")

        res = run_serve(request, say, progress)
    if plot is not None:
        _write_plot(res, plot, bool(sweep))
    data = res.to_dict()
    if output_mode() == "csv":  # a sweep: one row per rate; a run: dotted key/value pairs
        emit([dict(render.flatten(r)) for r in res.runs] if sweep else data)
        return
    if emit(data):
        return
    s = res.setup
    out.print(serving.setup_line(s, s.settings.layout.gpus))
    if sweep:
        out.print(serving.sweep_table(res.runs, request.slo_ttft_s is not None or request.slo_tpot_s is not None))
        for r in res.runs:
            if r["saturated"]:
                out.print(f"[bold red]saturated from {r['rate']:g} requests/s: {escape(r['saturated']['note'])}"
                          "[/bold red]")
                break
        return
    run = res.summary
    how = (f"a closed loop of {run['concurrency']} users" if run.get("concurrency") is not None
           else f"{request.arrival} arrivals at {rate:g} requests/s" if rate is not None
           else f"replayed from {escape(str(workload))}" if workload is not None else "offline (all at once)")
    out.print(f"{render.count(run['requests'])} requests, {how}", highlight=False)
    out.print(serving.throughput_table(run))
    out.print(serving.latency_table(run))
    for line in serving.run_lines(run):
        out.print(line, highlight=False)


def _write_plot(res, path: Path, sweep: bool) -> None:
    """Write ``res``'s figure to ``path``: latency against rate for a sweep, KV use over time for a run."""
    from lmcost.output.plots import serve_sweep_figure, serve_timeline_figure, write_html

    s = res.setup
    title = f"{s.cfg.name} on {s.settings.layout.gpus} x {s.gpu.name}, {s.engine.name} {s.engine.version}"
    if sweep:
        g = res.summary["goodput"]
        fig = serve_sweep_figure(res.runs, title, g["slo_ttft_s"], g["slo_tpot_s"])
    else:
        fig = serve_timeline_figure(res.trace.kv_timeline, title)
    err.print(f"wrote {write_html(fig, path)}", markup=False, highlight=False)
