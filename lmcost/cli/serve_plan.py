"""``lmcost serve-plan``: the serving planner on top of ``lmcost serve`` (layouts x engine knobs, each
candidate's highest rate meeting SLOs at a percentile), on every local core or a Ray cluster.

A command of its own rather than ``lmcost plan --serve``: plan's flags already mean other things there
(``--output`` is its figure's file, ``--model`` its calibrated/roofline choice, ``--isl``/``--osl`` fixed
lengths, ``--ttft``/``--tpot`` static-batch SLOs), where this one takes serve's (``--output`` a length spec,
``--model engine``, ``--slo-ttft``)."""

from typing import Annotated, Optional

import typer
from rich.markup import escape

from lmcost.cli.app import emit, machine_output, out, output_mode, say, status_line, user_errors
from lmcost.cli.options import (AttnKernelOpt, ClusterOpt, Count, DtypeOpt, GpuOpt, ImbalanceOpt, KvDtypeOpt,
                                ModelArg, QuantOpt, RuntimeOpt, WDtypeOpt, parse_duration, parse_ints)
from lmcost.cli.serve import ServeTimeModel, _opt
from lmcost.output import render


@user_errors
@machine_output
def serve_plan(
    model: ModelArg,
    gpu: GpuOpt = "h100",
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs each layout uses (tp x dp, ep within).")] = 8,
    engine: Annotated[str, typer.Option("--engine", help="Engine profile: vllm, sglang, trtllm, name-version or "
                                        "name@version, or a YAML path (as serve).")] = "vllm",
    dtype: DtypeOpt = "auto",
    weight_dtype: WDtypeOpt = None,
    quant: QuantOpt = None,
    kv_dtype: KvDtypeOpt = None,
    model_: Annotated[ServeTimeModel, typer.Option("--model", help="Step times: engine (the default), roofline or "
                      "calibrated (as serve).")] = ServeTimeModel.engine,
    kernel: AttnKernelOpt = "auto",
    runtime: RuntimeOpt = "auto",
    ep_imbalance: ImbalanceOpt = 1.0,
    cluster: ClusterOpt = None,
    requests: Annotated[Optional[int], Count("--requests", help="Requests per run (default 1000, at most 100k); "
                                             "10k = 10240.")] = None,
    prompt: _opt("--prompt", "Prompt tokens per request (default 1024), as serve's --prompt.") = None,
    output: _opt("--output", "Output tokens per request (default 256), as serve's --output.") = None,
    arrival: _opt("--arrival", "Arrival process: poisson (the default) or gamma:CV.") = None,
    seed: _opt("--seed", "Seed of the lengths and arrivals (default 0).", int) = None,
    slo_ttft: _opt("--slo-ttft", "TTFT SLO at --percentile, e.g. 500ms (ns, us or µs, ms, s).") = None,
    slo_tpot: _opt("--slo-tpot", "TPOT SLO at --percentile, e.g. 50ms (ns, us or µs, ms, s).") = None,
    percentile: Annotated[int, typer.Option("--percentile", help="The percentile the SLOs hold at: 50, 90 or 99.")] = 99,
    max_num_seqs: _opt("--max-num-seqs", "max_num_seqs values searched, comma-separated (default "
                       "64,128,256,512,1024).") = None,
    max_num_batched_tokens: _opt("--max-num-batched-tokens", "Token budgets searched, comma-separated (default "
                                 "2k,4k,8k,16k).") = None,
    chunked_prefill: Annotated[Optional[bool], typer.Option("--chunked-prefill/--no-chunked-prefill",
                                                            help="Chunked prefill (default: the engine's).",
                                                            show_default=False)] = None,
    memory_fraction: _opt("--memory-fraction", "Share of GPU memory the engine takes (default: the engine's).",
                          float) = None,
    block_size: _opt("--block-size", "Tokens per KV-cache block (default: the engine's).", int) = None,
    iterations: Annotated[int, typer.Option("--iterations", help="Bisection steps on the rate per candidate "
                                            "(8: to 2.2%).")] = 8,
    prune: Annotated[bool, typer.Option("--prune/--no-prune", help="Skip candidates whose static bound is below "
                                        "the best rate found.")] = True,
    jobs: _opt("--jobs", "Worker processes (default: every core; 1: in this process).", int) = None,
    ray: _opt("--ray", "Run the candidates on the Ray cluster at this address (auto, ray://host:10001, or local "
              "for a new local one); needs " + escape("pip install 'lmcost[ray]'.")) = None,
    top: Annotated[int, typer.Option("--top", help="Rows printed.")] = 15,
    pd: Annotated[bool, typer.Option("--pd", help="Prefill/decode disaggregation: search x prefill and y decode "
                                     "workers (xPyD) of --gpus GPUs in all, each pool's layout, ranked by goodput "
                                     "per GPU (as serve --pd runs them).")] = False,
    pd_ratios: _opt("--pd-ratios", "With --pd: the xPyD searched, comma-separated (e.g. 1P1D,1P2D; default: "
                    "every split of --gpus).") = None,
    kv_link: _opt("--kv-link", "With --pd: how the KV cache moves, as serve's --kv-link (auto, nvlink, rdma, "
                  "none).") = None,
):
    """Search layouts of --gpus GPUs x engine knobs (--max-num-seqs x --max-num-batched-tokens) for the best
    goodput per GPU: each candidate's highest arrival rate whose run meets the SLOs at --percentile without
    saturating (bisection under the static-batch bound, which also prunes), on every local core or --ray."""
    from lmcost.apps.plan import check_top
    from lmcost.apps.serve_plan import SEQS, TOKENS, ServePlanRequest, plan_serving

    check_top(top)
    request = ServePlanRequest(
        model=model, gpu=gpu, engine=engine, dtype=dtype, weight_dtype=weight_dtype, quant=quant, kv_dtype=kv_dtype,
        time_model=model_.value, attention_kernel=kernel, runtime=runtime, imbalance=ep_imbalance, cluster=cluster,
        gpus=gpus, requests=requests, prompt=prompt, output=output, arrival=arrival, seed=seed,
        slo_ttft_s=parse_duration(slo_ttft, "--slo-ttft") if slo_ttft is not None else None,
        slo_tpot_s=parse_duration(slo_tpot, "--slo-tpot") if slo_tpot is not None else None, percentile=percentile,
        max_num_seqs=SEQS if max_num_seqs is None else tuple(parse_ints(max_num_seqs, "--max-num-seqs")),
        max_num_batched_tokens=(TOKENS if max_num_batched_tokens is None
                                else tuple(parse_ints(max_num_batched_tokens, "--max-num-batched-tokens"))),
        chunked_prefill=chunked_prefill, memory_fraction=memory_fraction, block_size=block_size,
        iterations=iterations, prune=prune, jobs=jobs, ray=ray, pd=pd,
        pd_ratios=() if pd_ratios is None else tuple(pd_ratios.split(",")), kv_link=kv_link)
    text = f"planning {escape(str(model))} on {gpus} x {escape(str(gpu))}"
    with status_line(text) as status:
        def progress(done: int, n: int, runs: int) -> None:
            if status is not None:
                status.update(f"{text}: {done} of {n} candidates done, {runs:,} run{'s' * (runs != 1)} of "
                              f"{render.count(requests or 1000)} requests")

        if pd:  # prefill/decode pools (lmcost.apps.serve_plan_pd)
            from lmcost.apps.serve_plan_pd import plan_pd

            res = plan_pd(request, progress)
        else:
            res = plan_serving(request, progress)
    if output_mode() == "csv":
        emit([dict(render.flatten(r)) for r in res.rows] if pd else res.rows)
        return
    if emit(res.to_dict()):
        return
    slos = " and ".join(f"{n} {'p' + str(percentile)} <= {render.si(v, 's')}" for n, v in
                        (("TTFT", request.slo_ttft_s), ("TPOT", request.slo_tpot_s)) if v is not None) or "no SLO"
    title = (f"{escape(res.rows[0]['gpu'] if res.rows else str(gpu))} x {gpus}, {escape(engine)}: {res.candidates} "
             f"candidates, {res.pruned} pruned by the static bound; {slos}; mean output {res.mean_output:.4g} tokens; "
             f"{res.workers}")
    from lmcost.output.serve_plan import pd_plan_table, plan_table

    out.print((pd_plan_table if pd else plan_table)(title, res.rows, percentile, top))
    b = res.best
    if pd:  # each candidate's own serve --pd run
        for i, r in enumerate(res.rows[:top]):
            if r.get("check_command"):
                out.print(f"#{i + 1}: {r['check_command']}", markup=False, highlight=False, soft_wrap=True)
    if b is None:
        out.print("No candidate meets the SLOs at any rate searched (see the notes)", markup=False)
    else:
        out.print(f"best: {b['layout']}, max_num_seqs {b['max_num_seqs']}, token budget {b['max_num_batched_tokens']}: "
                  f"meets the SLOs offered {render.rate(b['offered_rate'])} requests/s; that run serves "
                  f"{render.rate(b['requests_per_s'])} requests/s, {render.rate(b['output_tokens_per_s_per_gpu'])} "
                  f"output tokens/s per GPU, goodput {render.rate(b['goodput_requests_per_s'])} requests/s "
                  f"({render.rate(b['goodput_requests_per_s_per_gpu'])} per GPU) (check it: "
                  f"{res.to_dict()['check_command']})",
                  markup=False, soft_wrap=True)
