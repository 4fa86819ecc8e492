"""``lmcost serve``: an inference server under load (continuous batching, chunked prefill, paged KV,
arrivals), its throughput, latency percentiles and goodput; a sweep of rates; a figure."""

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.cli.app import emit, err, machine_output, out, output_mode, require_extra, say, status_line, user_errors
from lmcost.cli.options import (AttnKernelOpt, ClusterOpt, Count, DtypeOpt, EpOpt, GpuOpt, ImbalanceOpt,
                                KvDtypeOpt, ModelArg, NodesOpt, QuantOpt, RuntimeOpt, TpOpt,
                                WDtypeOpt, parse_duration, parse_real, parse_reals)
from lmcost.output import render, serving


class ServeTimeModel(str, Enum):
    """How serve predicts a step's time (:data:`lmcost.apps.serve.TIME_MODELS`)."""

    engine = "engine"
    roofline = "roofline"
    calibrated = "calibrated"


def _opt(flag: str, help: str, kind=str, **kw):
    """An option that is None when not given (the library fills in its default, or refuses it where it means
    nothing: :func:`lmcost.apps.serve_inputs.check_request`)."""
    return Annotated[Optional[kind], typer.Option(flag, help=help, **kw)]


@user_errors
@machine_output
def serve(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    engine: Annotated[str, typer.Option("--engine", help="Engine profile (lmcost/data/engines): vllm, sglang, trtllm "
                                        "(the newest shipped version), name-version or name@version (vllm-0.11, vllm@0.11), or a YAML path.")] = "vllm",
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: Annotated[ServeTimeModel, typer.Option("--model", help="engine: each operator's roofline times the engine's "
                      "factor fitted on measured serving points, plus its overheads (reports/serve-fit.md); roofline: "
                      "the lower bound; calibrated: the GPU's kernel model plus the engine's overheads.")] = ServeTimeModel.engine,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    tp: TpOpt = 1,
    ep: EpOpt = 1,
    dp: Annotated[int, typer.Option("--dp", help="Data-parallel replicas (requests shared round robin).")] = 1,
    ep_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    nodes: NodesOpt = None,
    requests: Annotated[Optional[int], Count("--requests", help="Requests to generate (default 1000); 10k = 10240.")] = None,
    prompt: _opt("--prompt", "Prompt tokens per request (default 1024): N (8k = 8192), uniform:LO:HI, normal:MEAN:SD, "
                 "lognormal:MEDIAN:SIGMA, or a dataset's shape (sharegpt).") = None,
    output: _opt("--output", "Output tokens per request (default 256), as --prompt.") = None,
    rate: _opt("--rate", "Requests per second arriving, 1e-6 to 1e9 (default: none, offline: all at once).") = None,
    arrival: _opt("--arrival", "Arrival process at --rate: poisson (the default) or gamma:CV (burstier for CV > 1).") = None,
    concurrency: Annotated[Optional[int], Count("--concurrency", help="A closed loop of this many users: a request "
                                                "enters when one finishes.")] = None,
    workload: _opt("--workload", "Replay a JSONL file of requests, one {\"arrival_s\", \"prompt_tokens\", "
                   "\"output_tokens\"} per line.", Path) = None,
    seed: Annotated[Optional[int], Count("--seed", help="Seed of the generated lengths and arrivals (default 0).")] = None,
    max_num_seqs: Annotated[Optional[int], Count("--max-num-seqs", help="Sequences running at once (default: the "
                                                 "engine's); 1k = 1024.")] = None,
    max_num_batched_tokens: Annotated[Optional[int], Count("--max-num-batched-tokens",
                                                           help="Tokens per step (default: the engine's); 8k = 8192.")] = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option("--chunked-prefill/--no-chunked-prefill",
                                                            help="Split long prompts over steps (default: the engine's).",
                                                            show_default=False)] = None,
    memory_fraction: _opt("--memory-fraction", "Share of GPU memory the engine takes, in (0, 1] (default: the "
                          "engine's, as vLLM's gpu_memory_utilization).") = None,
    block_size: Annotated[Optional[int], Count("--block-size", help="Tokens per KV-cache block (default: the "
                                               "engine's).")] = None,
    slo_ttft: _opt("--slo-ttft", "TTFT SLO per request for goodput, e.g. 500ms (ns, us or µs, ms, s).") = None,
    slo_tpot: _opt("--slo-tpot", "TPOT SLO per request for goodput, e.g. 50ms (ns, us or µs, ms, s).") = None,
    rates: Annotated[Optional[str], typer.Option("--rates", metavar="R1,R2,...",
                                                 help="A sweep: requests per second, comma-separated (e.g. 1,2,4,8), "
                                                 "one run each; tables and figures list them ascending.")] = None,
    plot: _opt("--plot", "Write a plotly HTML figure: latency against rate (a sweep), or KV-cache use and "
               "requests over time (one run).", Path) = None,

    a2a: Annotated[str, typer.Option("--a2a", help="EP all-to-all kernel under --ep over --dp (tp 1): nccl (lmcost's "
                   "collective model), deepep-ht (DeepEP normal: NVLink + RDMA, FP8 dispatch) or deepep-ll (DeepEP "
                   "low-latency, RDMA). With --pd, the wide-EP options are the decode pool's.")] = "nccl",
    expert_load: _opt("--expert-load", "Expert load model for the EP imbalance: uniform, zipf:S, hot:F (hottest "
                      "expert's load over the mean) or a measured max/mean rank load (e.g. 1.3).") = None,
    redundant_experts: Annotated[int, Count("--redundant-experts", help="Redundant expert replicas per EP "
                                 "group (EPLB placement): weight memory per GPU, balance under --expert-load.")] = 0,
    tbo: Annotated[bool, typer.Option("--tbo", help="Two-batch overlap: each step as two micro-batches, one's "
                   "dispatch/combine under the other's compute (SGLang).")] = False,
    spec: _opt("--spec", "Speculative decoding: none (the default), draft (--draft-model), eagle, eagle3, mtp or "
               "ngram (prompt lookup). With --pd: both pools (the prefill pool prefills the draft too).") = None,
    spec_tokens: Annotated[Optional[int], Count("--spec-tokens", help="Draft tokens per step k "
                                                "(num_speculative_tokens), 1-32; with --spec.")] = None,
    draft_model: _opt("--draft-model", "The draft model of --spec draft: a shipped name or a YAML/config.json "
                      "path (the target's vocabulary).") = None,
    acceptance: _opt("--acceptance", "With --spec: the mean accepted length per step, bonus token included, in "
                     "[1, k+1] (e.g. 2.3), or k per-position acceptance rates p1,...,pk (e.g. 0.8,0.6). One value "
                     "below 1 is a rate (k = 1: 0.99 is ~2 tokens per step), from 1 up a mean (1: 1 token).") = None,
    pd: Annotated[bool, typer.Option("--pd", help="Prefill/decode disaggregation: a prefill pool and a decode pool, "
                                     "the KV cache moved between them; --tp/--ep/--dp and --max-num-seqs/"
                                     "--max-num-batched-tokens are the decode pool's (the prefill pool takes the token "
                                     "budget too, its max_num_seqs capped at it).")] = False,
    prefill_workers: Annotated[Optional[int], Count("--prefill-workers", help="With --pd: prefill workers (default 1)."
                                                    )] = None,
    prefill_tp: Annotated[Optional[int], Count("--prefill-tp", help="With --pd: a prefill worker's TP (default --tp)."
                                               )] = None,
    prefill_ep: Annotated[Optional[int], Count("--prefill-ep", help="With --pd: a prefill worker's EP (default --ep)."
                                               )] = None,
    prefill_dp: Annotated[Optional[int], Count("--prefill-dp", help="With --pd: a prefill worker's data-parallel "
                                               "(attention-DP) replicas (default --dp).")] = None,
    prefill_max_num_batched_tokens: Annotated[Optional[int], Count("--prefill-max-num-batched-tokens", help="With "
                                              "--pd: the prefill pool's tokens per step (default "
                                              "--max-num-batched-tokens, else the engine's).")] = None,
    decode_workers: Annotated[Optional[int], Count("--decode-workers", help="With --pd: decode workers, each of "
                                                   "--tp/--ep/--dp (default 1).")] = None,
    kv_link: _opt("--kv-link", "With --pd: how the KV cache moves: auto (NVLink when both pools fit one node or "
                  "NVLink domain, else RDMA; the default), nvlink, rdma, or none (free: a bound).") = None,
    prefix: _opt("--prefix", "Shared prefixes of the generated requests: shared:N (one N-token system prompt before "
                 "each --prompt), groups:G:N (G of them, one drawn per request), sessions:TURNS (multi-turn chat: "
                 "each turn re-sends the last turn's prompt and output). With --pd, the prefill pool caches them.") = None,
    prefix_caching: Annotated[Optional[bool], typer.Option("--prefix-caching/--no-prefix-caching",
                                                           help="Reuse cached KV blocks of shared prefixes "
                                                           "(default: the engine's; on in vLLM, SGLang, TensorRT-LLM).",
                                                           show_default=False)] = None,
    kv_offload: _opt("--kv-offload", "A host-memory tier for evicted prefix blocks: cpu:SIZE[:GBPS] per GPU (binary "
                     "units, e.g. cpu:256G or cpu:1.5G; GB/s per direction, default PCIe Gen5 x16's 64); cpu alone: "
                     "half the node's system memory per GPU; disk[:SIZE[:GBPS]]: the node's NVMe share per GPU; "
                     "cpu,disk: both, CPU blocks spilling to disk.") = None,
    power_limit: _opt("--power-limit", "GPU power cap in W (e.g. 500): compute-bound time scales with the clock it "
                      "allows, memory-bound time is kept; default: the GPU's own limit (its TDP).") = None,
    usd_per_gpu_hour: _opt("--usd-per-gpu-hour", "Price of one GPU-hour in $ (no default): adds the run's cost, $ "
                           "per million input and output tokens and per request.") = None,
    prefill_max_num_seqs: Annotated[Optional[int], Count("--prefill-max-num-seqs", help="With --pd: requests per "
                                    "prefill step in each prefill replica (default the engine's max_num_seqs, capped at "
                                    "the prefill pool's token budget; 1: one prompt per step).")] = None,
):
    """Serve requests through an engine's scheduler (continuous batching, chunked prefill, paged KV cache,
    preemption), every step costed by the same operators as estimate: throughput, TTFT, TPOT, ITL and
    end-to-end latency percentiles, queueing, goodput under SLOs; a sweep of rates shows the knee."""
    from lmcost.apps.serve import ServeRequest, run_serve
    from lmcost.apps.serve_spec import parse_acceptance

    rate = parse_real(rate, "--rate", "give requests per second, e.g. 2.5") if rate is not None else None
    memory_fraction = (parse_real(memory_fraction, "--memory-fraction", "give a share of GPU memory, e.g. 0.9")
                       if memory_fraction is not None else None)
    request = ServeRequest(
        model=model, gpu=gpu, engine=engine, dtype=dtype, weight_dtype=weight_dtype, quant=quant, kv_dtype=kv_dtype,
        time_model=model_.value, attention_kernel=kernel, runtime=runtime, tp=tp, ep=ep, dp=dp, imbalance=ep_imbalance,
        cluster=cluster, nodes=nodes, requests=requests, prompt=prompt, output=output, rate=rate, arrival=arrival,
        concurrency=concurrency, workload_file=None if workload is None else str(workload), seed=seed,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, chunked_prefill=chunked_prefill,
        memory_fraction=memory_fraction, block_size=block_size,
        slo_ttft_s=parse_duration(slo_ttft, "--slo-ttft") if slo_ttft is not None else None,
        slo_tpot_s=parse_duration(slo_tpot, "--slo-tpot") if slo_tpot is not None else None,
        a2a=a2a, expert_load=expert_load, redundant_experts=redundant_experts, tbo=tbo,
        rates=tuple(parse_reals(rates, "--rates", "write requests per second, e.g. 1,2,4,8")) if rates is not None else (),
        spec=spec, spec_tokens=spec_tokens, draft_model=draft_model,
        acceptance=parse_acceptance(acceptance) if acceptance is not None else None,
        pd=pd, prefill_workers=prefill_workers, prefill_tp=prefill_tp, prefill_ep=prefill_ep, prefill_dp=prefill_dp,
        prefill_max_num_batched_tokens=prefill_max_num_batched_tokens, decode_workers=decode_workers, kv_link=kv_link,
        prefix=prefix, prefix_caching=prefix_caching, kv_offload=kv_offload,
        power_limit=parse_real(power_limit, "power_limit", "give the cap in watts, e.g. 500") if power_limit is not None
        else None,
        usd_per_gpu_hour=(parse_real(usd_per_gpu_hour, "usd_per_gpu_hour", "give a price per GPU-hour, e.g. 2.5")
                          if usd_per_gpu_hour is not None else None),
        prefill_max_num_seqs=prefill_max_num_seqs)
    sweep = request.rates
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

        if request.pd:  # prefill/decode disaggregation: two pools
            from lmcost.apps.serve_pd import run_pd

            res = run_pd(request, say, progress)
        else:
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
    out.print(serving.setup_line(s, data["settings"]["gpus"], res.runs[0]["pd"] if request.pd else None))
    if request.pd:
        out.print(serving.pd_pools_line(res.runs[0]["pd"]), highlight=False)
    if sweep:
        out.print(serving.sweep_table(res.runs, request.slo_ttft_s is not None or request.slo_tpot_s is not None))
        if data.get("best_rate"):
            best = data["best_rate"]["rate"]
            out.print(f"[bold]highest rate meeting the SLOs at p99: {best:g} requests/s[/bold]" if best is not None
                      else "[bold red]no rate of the sweep meets the SLOs at p99[/bold red]")
        for r in serving.ascending(res.runs):
            if r["saturated"]:
                out.print(f"[bold red]saturated from {r['rate']:g} requests/s: {escape(r['saturated']['note'])}"
                          "[/bold red]")
                break
        return
    run = res.summary
    how = (f"a closed loop of {run['concurrency']} users" if run.get("concurrency") is not None
           else f"{request.arrival or 'poisson'} arrivals at {rate:g} requests/s" if rate is not None
           else f"replayed from {escape(str(workload))}" if workload is not None else "offline (all at once)")
    out.print(f"{render.count(run['requests'])} requests, {how}", highlight=False)
    out.print(serving.throughput_table(run))
    out.print(serving.latency_table(run))
    for line in serving.run_lines(run):
        out.print(line, highlight=False)
    if "pd" in run:
        for line in serving.pd_lines(run["pd"]):
            out.print(line, highlight=False)


def _write_plot(res, path: Path, sweep: bool) -> None:
    """Write ``res``'s figure to ``path``: latency against rate for a sweep, KV use over time for a run."""
    from lmcost.output.plots import serve_sweep_figure, serve_timeline_figure, write_html

    s = res.setup
    title = f"{s.cfg.name} on {res.gpus or s.settings.layout.gpus} x {s.gpu.name}, {s.engine.name} {s.engine.version}"
    if sweep:
        g = res.summary["goodput"]
        fig = serve_sweep_figure(res.runs, title, g["slo_ttft_s"], g["slo_tpot_s"])
    else:
        fig = serve_timeline_figure(res.trace.kv_timeline, title)
    err.print(f"wrote {write_html(fig, path)}", markup=False, highlight=False)
