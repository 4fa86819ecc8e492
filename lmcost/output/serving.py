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


def setup_line(setup, gpus: int, pd: dict | None = None) -> str:
    """The run's setup as rich markup: model, GPU x count and layout, engine and version, scheduler knobs,
    KV cache capacity (tokens and GB, one GPU) and precision. ``setup``: :class:`lmcost.apps.serve.Setup`.
    ``pd``: a P/D run's ``pd`` block: ``gpus`` is then both pools', the line names each pool's workers x
    layout, and the knobs and KV cache that follow are the decode worker's (``setup``)."""
    k, lay, p = setup.knobs, setup.settings.layout, setup.precision
    where = escape(setup.gpu.name) if gpus == 1 else f"{gpus} x {escape(setup.gpu.name)} ({lay.describe()})"
    whose = ""
    if pd is not None:
        whose = "the decode worker: "
        where = (f"{gpus} x {escape(setup.gpu.name)} in two pools (prefill {pd['prefill']['workers']} x "
                 f"{_layout(pd['prefill'])}, decode {pd['decode']['workers']} x {_layout(pd['decode'])})")
    tokens = int(setup.kv_capacity_bytes // setup.kv_per_token_bytes) if setup.kv_per_token_bytes else None
    kv = f"{count(tokens)} tokens" if tokens is not None else "no per-token cache"
    return (f"[bold]{escape(setup.cfg.name)}[/bold] on [bold]{where}[/bold] with [bold]{escape(setup.engine.name)} "
            f"{escape(str(setup.engine.version))}[/bold]: {whose}max_num_seqs {k.max_num_seqs}, token budget "
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
        none = "; the TPOT SLO judged none: every output is one token, no TPOT" if g.get("tpot_judged") == 0 else ""
        lines.append(f"goodput: {rate(g['requests_per_s'])} requests/s ({pct(g['fraction'])} of requests meet "
                     f"{slo_text(g)}{none})")
    lines.append(f"KV cache: peak {pct(kv['peak_fraction'])}, mean {pct(kv['mean_fraction'])} of capacity; "
                 f"preemptions {count(run['preemptions'])}; {count(run['steps'])} engine steps over "
                 f"{si(run['span_s'], 's')}, busy {pct(run['busy_fraction'])}")
    if run.get("wide_ep"):
        lines.append(wide_ep_line(run["wide_ep"]))
    if run.get("spec"):  # speculative decoding
        lines.append(spec_line(run["spec"]))
    pc = run.get("prefix_cache")
    if pc is not None:
        where = f" ({pc['pool']} pool)" if "pool" in pc else ""  # P/D: the pool that keeps it
        lines.append(f"prefix cache{where}: {'on' if pc['enabled'] else 'off'}, hit rate {pct(pc['hit_rate'])} "
                     f"({count(pc['hit_tokens'])} prompt tokens from cache, {si(pc['saved_prefill_flops'], 'FLOP')} "
                     f"of prefill saved); evicted {count(pc['evictions'])} blocks; peak "
                     f"{si(pc['peak_cached_bytes'], 'B')} cached per GPU")
        off = pc.get("offload")
        if off is not None:
            lines.append(f"KV offload ({off['tier']}, {si(off['capacity_bytes'], 'B')} per GPU at "
                         f"{si(off['bandwidth_bytes_per_s'], 'B/s')}): {count(off['hit_tokens'])} prompt tokens loaded "
                         f"({si(off['bytes_loaded'], 'B')} in {si(off['load_s'], 's')}), {si(off['bytes_offloaded'], 'B')}"
                         f" offloaded, peak {si(off['peak_bytes'], 'B')}")
            for name, t in off.get("tiers", {}).items():  # the tiers of the node file (cpu, disk)
                lines.append(f"  {name} tier: {si(t['capacity_bytes'], 'B')} per GPU ({count(t['capacity_tokens'])} "
                             f"tokens beyond the GPU cache) at {si(t['bandwidth_bytes_per_s'], 'B/s')}: "
                             f"{count(t['hit_tokens'])} tokens loaded in {si(t['load_s'], 's')}, "
                             f"{count(t['evictions'])} blocks evicted")
    lines.extend(energy_lines(run))
    if run["saturated"]:
        lines.append(f"[bold red]saturated: {escape(run['saturated']['note'])}[/bold red]")
    return lines


def wide_ep_line(w: dict) -> str:
    """One line of a run's wide EP (:func:`lmcost.apps.serve_wide_ep.summary`): kernel, TBO, imbalance and its
    source, replicas and their memory, and the all-to-all of a step of the run's mean tokens."""
    st = w["step"]
    rep = (f"; {w['redundant_experts']} redundant experts, {si(w['redundant_bytes_per_gpu'], 'B')} per GPU"
           if w["redundant_experts"] else "")
    saved = st["overlap_saved_s"]
    tbo = ((f"; TBO saves {si(saved, 's')} per step" if saved >= 0 else f"; TBO costs {si(-saved, 's')} per step "
            "(its split GEMMs outweigh the overlap)") if w["tbo"] else "")
    return (f"wide EP{w['ep']}: {w['a2a']}, imbalance {w['imbalance']:.3g} ({escape(w['imbalance_source'])}){rep}; "
            f"a step of {st['tokens_per_step']:.3g} tokens: dispatch {si(st['dispatch_bytes'], 'B')} in "
            f"{si(st['dispatch_s'], 's')}, combine {si(st['combine_bytes'], 'B')} in {si(st['combine_s'], 's')}{tbo}")


def spec_line(s: dict) -> str:
    """The run's speculative decoding (:func:`lmcost.apps.serve_spec.spec_summary`): method, k, tokens per
    step, the draft's and verification's time and the speedup per token at the mean batch, the crossover."""
    stop = (f"stops paying from batch {count(s['crossover_batch'])}" if s["crossover_batch"] is not None
            else "pays at every batch up to max_num_seqs")
    draft = f" ({escape(s['draft'])})" if s["draft"] else ""
    return (f"speculative decoding: {escape(s['method'])}{draft}, k {s['tokens']}, {s['accepted_per_step']:.3g} "
            f"tokens per step; at the mean batch {s['mean_batch']:.3g}: draft {si(s['draft_s_per_step'], 's')}, "
            f"verification {si(s['verify_s_per_step'], 's')} per step, {s['speedup_per_token']:.3g}x plain "
            f"decoding per token; {stop}")


def pd_pools_line(pd: dict) -> str:
    """Under ``--pd``: the two pools (workers x layout, GPUs) and the KV link; the setup line above is one
    decode worker's."""
    def pool(name, q):
        return f"{name} pool {q['workers']} x {_layout(q)} ({count(q['gpus'])} GPU{'' if q['gpus'] == 1 else 's'})"
    return (f"P/D {pd['ratio']}: {pool('prefill', pd['prefill'])}, token budget "
            f"{count(pd['prefill']['max_num_batched_tokens'])}; {pool('decode', pd['decode'])}; KV over "
            f"{pd['kv_transfer']['link']}")


def _layout(q: dict) -> str:
    """One P/D pool's worker layout (a ``pd`` block's pool): "TP2 x DP4", or "one GPU"."""
    return " x ".join(f"{k.upper()}{q[k]}" for k in ("tp", "ep", "dp") if q[k] > 1) or "one GPU"


def pd_lines(pd: dict) -> list[str]:
    """Under ``--pd``: each pool's busy fraction and steps, the KV moved per request and its time, and goodput
    per GPU over both pools."""
    kv = pd["kv_transfer"]
    t = kv["time_s"]
    return [f"P/D {pd['ratio']}: prefill pool busy {pct(pd['prefill']['busy_fraction'])} "
            f"({count(pd['prefill']['steps'])} steps), decode pool busy {pct(pd['decode']['busy_fraction'])} "
            f"({count(pd['decode']['steps'])} steps); goodput {rate(pd['goodput_requests_per_s_per_gpu'])} "
            f"requests/s per GPU over {pd['gpus']} GPUs",
            f"KV transfer over {kv['link']}: {si(kv['bytes_per_request'], 'B')} per request "
            f"({si(kv['bytes_total'], 'B')} in all), time mean {si(t['mean'], 's')}, p99 {si(t['p99'], 's')}"]


def energy_lines(run: dict) -> list[str]:
    """The run's energy (J per output token, its prefill and decode split, per request, mean power per GPU)
    and, with a price, its cost ($ per million input and output tokens, per request, GPU-hours)."""
    e = run.get("energy")
    if e is None:
        return []
    cap = f" under a {e['power_limit_w']:g} W cap" if e.get("power_limit_w") is not None else ""
    lines = [f"energy: {e['j_per_token']:.3g} J per output token ({e['j_per_input_token']:.3g} J per input token "
             f"in prefill, {e['j_per_output_token']:.3g} J per output token in decode), {si(e['j_per_request'], 'J')} "
             f"per request; mean power {e['mean_power_w']:.0f} W per GPU{cap}"]
    c = run.get("cost")
    if c is not None:
        lines.append(f"cost at ${c['usd_per_gpu_hour']:g} per GPU-hour: ${c['usd_per_mtok_input']:.3g} per million "
                     f"input tokens, ${c['usd_per_mtok_output']:.3g} per million output tokens "
                     f"(${c['usd_per_mtok']:.3g} blended), ${c['usd_per_request']:.3g} per request; "
                     f"{c['gpu_hours']:.3g} GPU-hours")
    return lines
