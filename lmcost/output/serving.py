"""``lmcost serve``'s human output: the setup line, throughput and latency tables of one run, one row per
rate of a sweep, and the lines that say goodput, preemptions and saturation. Reads
:class:`lmcost.apps.serve.ServeResult` (its setup, and :func:`lmcost.apps.serve.summarize`'s dicts);
units from :mod:`lmcost.output.render`.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from lmcost.output.render import count, pct, rate, si

#: The latency rows of a run: (label, summary key, what it is).
LATENCIES = (("TTFT", "ttft_s", "first token - arrival"), ("TPOT", "tpot_s", "per output token after the first"),
             ("ITL", "itl_s", "gap between tokens"), ("E2E", "e2e_s", "finish - arrival"),
             ("queue", "queue_s", "admission - arrival"))


def setup_line(setup, gpus: int) -> str:
    """The run's setup as rich markup: model, GPU x count and layout, engine and version, scheduler knobs,
    KV cache capacity (tokens and GB, one GPU) and precision. ``setup``: :class:`lmcost.apps.serve.Setup`."""
    k, lay, p = setup.knobs, setup.settings.layout, setup.precision
    where = escape(setup.gpu.name) if gpus == 1 else f"{gpus} x {escape(setup.gpu.name)} ({lay.describe()})"
    tokens = int(setup.kv_capacity_bytes // setup.kv_per_token_bytes) if setup.kv_per_token_bytes else None
    kv = f"{count(tokens)} tokens" if tokens is not None else "no per-token cache"
    return (f"[bold]{escape(setup.cfg.name)}[/bold] on [bold]{where}[/bold] with [bold]{escape(setup.engine.name)} "
            f"{escape(str(setup.engine.version))}[/bold]: max_num_seqs {k.max_num_seqs}, token budget "
            f"{count(k.max_num_batched_tokens)}, chunked prefill {'on' if k.chunked_prefill else 'off'}, "
            f"{'mixed' if k.mixed_batches else 'separate'} prefill/decode steps, blocks of {k.block_size}; KV cache "
            f"{kv} ({si(setup.kv_capacity_bytes, 'B')} per GPU); weights {p.weights}, KV {p.kv_cache}; "
            f"{_TIMES[setup.time_model].format(engine=escape(setup.engine.name))}")


#: What each serve time model is, as the setup line says it.
_TIMES = {"engine": "times: each operator's roofline x {engine}'s fitted factors, + its overheads",
          "roofline": "roofline times (a lower bound: no engine factor or overhead)",
          "calibrated": "calibrated kernel times + {engine}'s overheads"}


def throughput_table(run: dict) -> Table:
    """One run's throughput: requests, input and output tokens per second, output tokens per second per GPU."""
    t = Table(title="Throughput", title_justify="left", show_header=False)
    t.add_column("", style="bold")
    t.add_column("", justify="right")
    th = run["throughput"]
    if run.get("arrival_rate") is not None and run.get("rate") is not None:  # what the sample of arrivals offered
        t.add_row("arrived (requests/s)", rate(run["arrival_rate"]))
    for label, key in (("requests/s", "requests_per_s"), ("input tokens/s", "input_tokens_per_s"),
                       ("output tokens/s", "output_tokens_per_s"),
                       ("output tokens/s per GPU", "output_tokens_per_s_per_gpu")):
        t.add_row(label, rate(th[key]))
    return t


def latency_table(run: dict) -> Table:
    """One run's latency distributions: mean, p50, p90, p99 and max of TTFT, TPOT, ITL, E2E and queueing."""
    t = Table(title="Latency", title_justify="left")
    t.add_column("", style="bold")
    for c in ("mean", "p50", "p90", "p99", "max"):
        t.add_column(c, justify="right")
    t.add_column("", style="dim")
    for label, key, what in LATENCIES:
        d = run[key]
        t.add_row(label, *(si(d[c], "s") for c in ("mean", "p50", "p90", "p99", "max")), what)
    return t


def ascending(runs: list[dict]) -> list[dict]:
    """A sweep's runs by ascending rate: the one order of its table, its lines and its figure (the JSON keeps
    the order the rates were given in)."""
    return sorted(runs, key=lambda r: r["rate"])


def sweep_table(runs: list[dict], slos: bool) -> Table:
    """A sweep of rates, one row each by ascending rate (:func:`ascending`): served rate, output tokens/s (and
    per GPU), TTFT and TPOT p50/p99, E2E p50, goodput (with ``slos``), preemptions, and what saturates (if the
    queue grows)."""
    t = Table(title="Rate sweep", title_justify="left")
    heads = ("rate (req/s)", "served req/s", "out tok/s", "out tok/s/GPU", "TTFT p50", "TTFT p99", "TPOT p50",
             "TPOT p99", "E2E p50", *(("goodput req/s", "meet SLOs") if slos else ()), "preempted", "saturated")
    for h in heads:
        t.add_column(h, justify="left" if h == "saturated" else "right")
    for r in ascending(runs):
        th, sat = r["throughput"], r["saturated"]
        t.add_row(f"{r['rate']:g}" if r["rate"] is not None else "-", rate(th["requests_per_s"]),
                  rate(th["output_tokens_per_s"]), rate(th["output_tokens_per_s_per_gpu"]),
                  si(r["ttft_s"]["p50"], "s"), si(r["ttft_s"]["p99"], "s"), si(r["tpot_s"]["p50"], "s"),
                  si(r["tpot_s"]["p99"], "s"), si(r["e2e_s"]["p50"], "s"),
                  *((rate(r["goodput"]["requests_per_s"]), pct(r["goodput"]["fraction"])) if slos else ()),
                  count(r["preemptions"]), f"[red]{escape(sat['limit'])}[/red]" if sat else "no")
    return t


def slo_text(goodput: dict) -> str:
    """``TTFT <= 200 ms and TPOT <= 50 ms``: the SLOs a run's goodput was judged on."""
    parts = [f"{name} <= {si(goodput[key], 's')}" for name, key in (("TTFT", "slo_ttft_s"), ("TPOT", "slo_tpot_s"))
             if goodput[key] is not None]
    return " and ".join(parts)


def run_lines(run: dict) -> list[str]:
    """The lines under one run's tables (rich markup): goodput under the SLOs given, KV cache use,
    preemptions and steps, and a loud line when the queue grows (what limits it)."""
    g, kv = run["goodput"], run["kv_use"]
    lines = []
    if g["slo_ttft_s"] is not None or g["slo_tpot_s"] is not None:
        lines.append(f"goodput: {rate(g['requests_per_s'])} requests/s ({pct(g['fraction'])} of requests meet "
                     f"{slo_text(g)})")
    lines.append(f"KV cache: peak {pct(kv['peak_fraction'])}, mean {pct(kv['mean_fraction'])} of capacity; "
                 f"preemptions {count(run['preemptions'])}; {count(run['steps'])} engine steps over "
                 f"{si(run['span_s'], 's')}, busy {pct(run['busy_fraction'])}")
    pc = run.get("prefix_cache")
    if pc is not None:
        lines.append(f"prefix cache: {'on' if pc['enabled'] else 'off'}, hit rate {pct(pc['hit_rate'])} "
                     f"({count(pc['hit_tokens'])} prompt tokens from cache, {si(pc['saved_prefill_flops'], 'FLOP')} "
                     f"of prefill saved); evicted {count(pc['evictions'])} blocks; peak "
                     f"{si(pc['peak_cached_bytes'], 'B')} cached per GPU")
        off = pc.get("offload")
        if off is not None:
            lines.append(f"KV offload ({off['tier']}, {si(off['capacity_bytes'], 'B')} per GPU at "
                         f"{si(off['bandwidth_bytes_per_s'], 'B/s')}): {count(off['hit_tokens'])} prompt tokens loaded "
                         f"({si(off['bytes_loaded'], 'B')} in {si(off['load_s'], 's')}), {si(off['bytes_offloaded'], 'B')}"
                         f" offloaded, peak {si(off['peak_bytes'], 'B')}")
    if run["saturated"]:
        lines.append(f"[bold red]saturated: {escape(run['saturated']['note'])}[/bold red]")
    return lines
