"""The rich tables of the CLI's commands, one function each, from the API's records and DataFrames.

Units and formatting come from :mod:`lmcost.output.render` (the tables of ``estimate`` live there too);
a command builds no table of its own: it calls one of these and prints what it returns.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from lmcost.output.render import band, binary, class_tables, count, efficiency_rows, kv_table, pct, si


def _columns(t: Table, names, left=()) -> Table:
    """``t`` with a column per name, left-justified if in ``left``, else right."""
    for c in names:
        t.add_column(c, justify="left" if c in left else "right")
    return t


def kv_variants_table(df, batch: int) -> Table:
    """``lmcost kv``: one row per variant (and MLA mode): KV per token, state per sequence (hybrids),
    attention parameters, the longest context at ``batch``. ``df``: :func:`lmcost.apps.kv.compare`'s table."""
    first = df.drop_duplicates(["variant", "mla_mode"])
    hybrid = bool(first.state_bytes_per_seq.any())  # constant-size state layers: their state per sequence
    t = _columns(Table(title="Variants", title_justify="left"),
                 ("variant", "attention", "MLA mode", "KV per token", *(("state per sequence",) if hybrid else ()),
                  "attention params", f"longest context at b={batch}"), left=("variant", "attention", "MLA mode"))
    for r in first.itertuples():
        t.add_row(r.variant, r.attention, r.mla_mode or "-", binary(r.kv_bytes_per_token, 4),
                  *((binary(r.state_bytes_per_seq, 4),) if hybrid else ()),
                  count(r.attention_params), count(r.max_context) if r.max_context else "[red]none[/red]")
    return t


def kv_contexts_table(df) -> Table:
    """``lmcost kv``: one row per variant and context: KV cache exact and paged, fits, largest batch,
    decode step, tokens/s, attention intensity."""
    t = _columns(Table(title="Per context", title_justify="left"),
                 ("variant", "context", "KV cache", "KV paged", "fits", "largest batch", "decode step", "tokens/s",
                  "attention FLOPs/byte"), left=("variant",))
    for r in df.itertuples():
        name = f"{r.variant} ({r.mla_mode})" if r.mla_mode else r.variant
        t.add_row(name, count(r.context), binary(r.kv_bytes), binary(r.kv_bytes_paged),
                  "yes" if r.fits else "[red]no[/red]", count(r.max_batch), si(r.decode_time_s, "s"),
                  f"{r.tokens_per_s:,.0f}", f"{r.attention_intensity:.1f}")
    return t


def efficiency_fit_table(rows: list[dict], table: str, n_rows: int) -> Table:
    """``lmcost fit``: the held-out error of each operator class (:func:`lmcost.apps.fit.fit`'s rows)."""
    t = _columns(Table(title=f"efficiency fit on {table}: {n_rows} rows, leave-one-source-out"),
                 ("class", "rows", "sources", "median |error|", "named kernel", "band (5-95%)", "held-out in band"),
                 left=("class",))
    for r in rows:
        if not r["rows"]:
            t.add_row(r["op_class"], "0", "0", "unconstrained", "", "", "")
            continue
        cov = "" if r["band_coverage"] is None else f"{r['band_coverage']:.0%}"
        t.add_row(r["op_class"], str(r["rows"]), str(r["sources"]), f"{r['median_abs_error']:.0%}",
                  f"{r['median_abs_error_named']:.0%}", f"{r['band_low']:.2f}-{r['band_high']:.2f}", cov)
    return t


def engine_fit_table(rows: list[dict], table: str, n_rows: int) -> Table:
    """``lmcost fit --engines``: per engine and class, the leave-one-GPU-out and leave-one-engine-out median |error|,
    the band and its held-out coverage (:func:`lmcost.apps.engine_fit.fit_engines`'s rows)."""
    t = _columns(Table(title=f"engine profiles fitted on {table}: {n_rows} default-kernel rows, held out by GPU and by engine"),
                 ("engine", "class", "rows", "GPUs", "leave-one-GPU-out", "leave-one-engine-out", "band (5-95%)",
                  "held-out in band"), left=("engine", "class"))
    pct = lambda v: "" if v is None else f"{v:.0%}"  # noqa: E731
    for r in rows:
        band = "" if r["band_low"] is None else f"{r['band_low']:.2f}-{r['band_high']:.2f}"
        t.add_row(r["engine"], r["op_class"], str(r["rows"]), str(r["gpus"]), pct(r["logo_median_abs_error"]),
                  pct(r["loeo_median_abs_error"]), band, pct(r["band_coverage"]))
    return t


def memory_fit_table(rows: list[dict], table: str) -> Table:
    """``lmcost fit --memory-kernels``: per kernel design, its figures, the leave-one-width-out and in-sample median
    |error| and the held-out band (:func:`lmcost.apps.memory_fit.fit_memory`'s rows)."""
    t = _columns(Table(title=f"engine memory-bound kernel designs fitted on {table} (H200 kernel durations), held out by width"),
                 ("design", "rows", "bandwidth fraction", "overhead (us)", "per row element (ns)", "leave-one-width-out",
                  "in-sample", "band (5-95%)"), left=("design",))
    for r in rows:
        t.add_row(r["design"], str(r["rows"]), f"{r['bandwidth_fraction']:.2f}", f"{r['overhead_us']:.2f}",
                  f"{r['row_ns']:.2f}", f"{r['held_out']:.1%}", f"{r['in_sample']:.1%}",
                  f"{r['band'][0]:.2f}-{r['band'][1]:.2f}")
    return t


def stack_spread_table(rows: list[dict], table: str) -> Table:
    """``lmcost fit --memory-kernels``: per class, the spread of the single fused kernels around auto's prediction,
    the H200's band, auto's band (their union) and the coverage of each (:func:`lmcost.calibration.stack_spread.summary`)."""
    t = _columns(Table(title=f"auto's and torch's norm and elementwise bands on {table}: single fused kernels, measured / predicted; held out: leave one implementation out"),
                 ("around", "class", "rows", "implementations", "spread (5-95%)", "band without", "band with",
                  "coverage before", "coverage after", "left-out impl. before", "after"), left=("around", "class"))
    for r in rows:
        lh = lambda b: f"{b[0]:.2f}-{b[1]:.2f}"  # noqa: E731
        t.add_row(r.get("around", "torch"), r["cls"], str(r["rows"]), str(r["implementations"]), lh(r["spread"]), lh(r["shipped"]),
                  lh(r["band"]), f"{r['coverage_before']:.0%}", f"{r['coverage_after']:.0%}",
                  f"{r['loio_before']:.0%}", f"{r['loio_after']:.0%}")
    return t


def collective_fit_table(errors: list[dict], table: str, n_rows: int) -> Table:
    """``lmcost fit --collectives``: the held-out error per device and regime."""
    t = _columns(Table(title=f"collective fit on {table}: {n_rows} rows, leave-one-source-out"),
                 ("device", "regime", "rows", "sources", "median |error|", "worst |error| (row)"), left=("device", "regime"))
    for e in errors:
        t.add_row(e["device"], e["regime"], str(e["rows"]), str(e["sources"]), f"{e['median_abs_error']:.0%}",
                  f"{e['worst_abs_error']:.0%} ({e['worst_row']})")
    return t


def clusters_table(rows: list[dict]) -> Table:
    """``lmcost clusters list`` (:func:`lmcost.apps.catalog.cluster_rows`)."""
    t = Table(title="Clusters (bandwidth per direction)", title_justify="left")
    for col in ("name", "gpu", "GPUs/node", "node fabric (per GPU)", "NVLS", "library", "network (per node)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], r["gpu"], str(r["gpus_per_node"]), f"{escape(r['intra'])} {si(r['intra_bytes_per_s'], 'B/s')}",
                  "yes" if r["nvls"] else "no", r["library"],
                  f"{escape(r['inter'])} {si(r['inter_node_bytes_per_s'], 'B/s')}" if r["inter"] else "none")
    return t


def cluster_table(cluster) -> Table:
    """``lmcost clusters show``: every figure of one cluster, dotted keys, then its sources."""
    def shown(v) -> str:  # a list as its items, a dict as key value pairs, a pair as low-high: no Python reprs
        if isinstance(v, dict):
            return ", ".join(f"{k} {shown(x)}" for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return ", ".join(shown(x) for x in v)
        return "yes" if v is True else "no" if v is False else str(v)

    data = cluster.model_dump()
    rows = [(k, shown(v)) for k, v in data.items() if k not in ("sources", "intra", "inter", "collectives") and v not in (None, "", [])]
    rows += [(f"intra.{k}", shown(v)) for k, v in data["intra"].items() if v is not None]
    rows += [(f"inter.{k}", shown(v)) for k, v in (data["inter"] or {}).items()]
    for part in ("intra", "inter", "band", "fit"):
        rows += [(f"collectives.{part}.{k}", shown(v)) for k, v in data["collectives"][part].items()]
    rows += [(f"source {i + 1}", s) for i, s in enumerate(cluster.sources)]
    return kv_table(cluster.name, [(escape(a), escape(b)) for a, b in rows], justify="left")


def gpus_table(rows: list[dict]) -> Table:
    """``lmcost gpus list`` (:func:`lmcost.apps.catalog.gpu_rows`)."""
    t = Table(title="GPUs (dense peaks; fitted: the kernel figures of --model calibrated, public (the public kernel "
                    "table's fit) or engines pooled, then the --engine profiles; -: none, times are the roofline)",
              title_justify="left")
    for c in ("name", "aliases", "description", "peak (dtype)", "FP8", "FP4", "bandwidth", "memory",
              "ridge FLOPs/byte", "fitted"):
        t.add_column(c)

    def rate(v):
        return "–" if v is None else si(v, "FLOP/s")

    for r in rows:
        t.add_row(r["name"], r["aliases"], r["description"],
                  "–" if r["peak_dtype"] is None else f"{si(r['peak_flops_per_s'], 'FLOP/s')} ({r['peak_dtype']})",
                  rate(r["fp8_flops_per_s"]), rate(r["fp4_flops_per_s"]),
                  si(r["bandwidth_bytes_per_s"], "B/s"), si(r["memory_bytes"], "B"),
                  "–" if r["ridge_flops_per_byte"] is None else f"{r['ridge_flops_per_byte']:.0f}",
                  escape(r["fitted"]))
    return t


def gpu_table(gpu, fitted: str = "") -> Table:
    """``lmcost gpus show``: every figure of one GPU, its dense peaks, sources, which fitted figures it has
    (``fitted``: :func:`lmcost.apps.catalog.fitted_label`) and its efficiency block."""
    data = gpu.model_dump()
    # Escaped as cluster_table's: a source letter "[c]" is text, not rich markup.
    rows = [(k, escape(", ".join(v) if isinstance(v, list) else str(v))) for k, v in data.items()
            if k not in ("sources", "peak_tflops", "efficiency") and v not in (None, "", [])]
    rows += [(f"peak {k} (dense)", si(v * 1e12, "FLOP/s")) for k, v in gpu.peak_tflops.items()]
    rows += [(f"source {i + 1}", escape(s)) for i, s in enumerate(gpu.sources)]
    rows += [("fitted", escape(fitted))] if fitted else []
    rows += efficiency_rows(gpu.efficiency)
    return kv_table(gpu.name, rows, justify="left")


def models_table(rows: list[dict]) -> Table:
    """``lmcost models list`` (:func:`lmcost.apps.catalog.model_rows`)."""
    t = _columns(Table(title="Models", title_justify="left"),
                 ("name", "attention", "layers", "d_model", "params", "active per token"), left=("name", "attention"))
    for r in rows:
        t.add_row(r["name"], r["attention"], str(r["layers"]), str(r["d_model"]), count(r["params"]),
                  count(r["active_params"]))
    return t


def formulas_table(name: str, phase: str, rows: list[dict]) -> Table:
    """``lmcost explain``: each operator's FLOPs and bytes formula (rows of name, op_class, count, flops,
    bytes, shapes: strings)."""
    t = Table(title=f"{escape(name)}: {phase} formulas (per layer; count = layers)", title_justify="left")
    for c in ("op", "class", "count", "FLOPs", "bytes", "shapes"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["op_class"], r["count"], r["flops"], r["bytes"], escape(r["shapes"]))
    return t


def train_plan_table(name: str, gpus: int, global_batch: int, seq: int, model: str, rows: list[dict], searched: int,
                     top: int) -> Table:
    """``lmcost plan --train``: the ``top`` fastest training setups that fit, of ``searched``
    (:func:`lmcost.apps.plan.search_train`'s rows)."""
    t = _columns(Table(title=f"{escape(name)} training on {gpus} GPUs, {global_batch} x {seq} tokens per step: the fastest "
                             f"setups that fit ({len(rows)} of {searched}; {model} times)", title_justify="left"),
                 ("GPU", "layout", "micro-batch", "ZeRO", "recompute", "step", "tok/s/GPU", "MFU", "HFU", "mem/GPU"),
                 left=("GPU", "layout", "recompute"))
    for r in rows[:top]:
        t.add_row(escape(r["gpu"]), r["layout"], str(r["micro_batch"]), str(r["zero"]), r["recompute"],
                  si(r["step_s"], "s"), f"{r['tokens_per_s_per_gpu']:,.0f}", pct(r["mfu"]),
                  pct(r["hfu"]), si(r["memory_per_gpu_bytes"], "B"))
    return t


def pareto_table(title: str, front: list[dict], top: int) -> Table:
    """``lmcost plan``: the Pareto front of tokens/s per GPU against tokens/s per user; a front longer
    than ``top`` is sampled evenly, its ends kept (the trade-off, not its first rows)."""
    t = _columns(Table(title=title, title_justify="left"),
                 ("GPU", "layout", "batch", "TTFT", "TPOT", "tok/s/GPU", "tok/s/user", "mem/GPU", "decode bound", "SLO"),
                 left=("GPU", "layout"))
    shown = front if len(front) <= top else [front[round(i * (len(front) - 1) / (top - 1))] for i in range(top)] \
        if top > 1 else front[:1]
    if len(shown) < len(front):
        t.caption = f"{len(shown)} of the front's {len(front)} points, evenly spaced (--top; --json has all)"
    for r in shown:
        t.add_row(escape(r["gpu"]), r["layout"], str(r["batch"]), si(r["ttft_s"], "s"), si(r["tpot_s"], "s"),
                  f"{r['tokens_per_s_per_gpu']:,.1f}", f"{r['tokens_per_s_per_user']:,.1f}",
                  si(r["memory_per_gpu_bytes"], "B"), r["bound"], "yes" if r["meets_slo"] else "no")
    return t


def roofline_table(points) -> Table:
    """``lmcost roofline``: each GPU, phase, batch and operator class: intensity, attained FLOP/s, time share
    (:func:`lmcost.apps.roofline.roofline_points`)."""
    t = _columns(Table(title="Operator classes", title_justify="left"),
                 ("gpu", "phase", "batch", "class", "FLOPs/byte", "FLOP/s at roofline time", "time share"),
                 left=("gpu", "phase", "class"))
    for r in points.itertuples():
        t.add_row(r.gpu, r.phase, str(r.batch), r.op_class, f"{r.arithmetic_intensity:.3g}",
                  si(r.achieved_flops_per_s, "FLOP/s"), pct(r.time_share))
    return t


def op_table(title: str, c: dict, bands: bool) -> Table:
    """``lmcost op``: one operator's cost (:func:`lmcost.cost.kernels.cost`'s record): shapes, FLOPs,
    bytes, intensity, bound, roofline and calibrated time (with its band when ``bands``)."""
    cal, roof = c["time_s"]["calibrated"], c["time_s"]["roofline"]
    return kv_table(title, [
        ("shapes", escape(c["shapes"])), ("FLOPs", si(c["flops"], "FLOP")), ("bytes", si(c["bytes"], "B")),
        ("arithmetic intensity", f"{c['arithmetic_intensity']:.2f} FLOPs/byte"), ("roofline bound", c["bound"]),
        ("time, roofline (lower bound)", si(roof, "s")),
        ("time, calibrated (expected)", si(cal, "s")
         + band((c["time_s"]["calibrated_low"], c["time_s"]["calibrated_high"]) if bands else None)
         + (f"  ({_speed(roof / cal)} of roofline speed)" if cal > 0 else "")),
    ] + ([("efficiency figures", f"kernel {c['kernel']}, runtime {c['runtime']}" + _auto_figures(c))]
         if c["efficiency"] else []))


def _speed(share: float) -> str:
    """A share of the roofline's speed as a percentage; below 0.5%, ``<1%`` (a tiny op's per-call floor), not 0%."""
    return f"{share:.0%}" if share >= 0.005 else "<1%"


def _auto_figures(c: dict) -> str:
    """Under auto, ``; norms, activations, RoPE: vllm's kernel designs`` where its ``kernel_figures`` (settings) says
    so (the JSON has the whole record; an engine's figures are in the title), else ""."""
    s = c.get("settings") or {}
    if (s.get("engine") or {}).get("name") != "auto":
        return ""
    extra = str(s.get("kernel_figures", "")).split("; ", 1)[1:]
    return "".join(f"; {escape(e.split(' (')[0])}" for e in extra)


def collective_table(data: dict, link: str) -> Table:
    """``lmcost op collective``: one collective's group, fabric, algorithm, times and bandwidths
    (:func:`lmcost.apps.collective.collective_cost`)."""
    n, t = data["bytes"], data["time_s"]
    return kv_table(f"{data['kind']} on {data['gpus']} x {data['gpu']} ({data['cluster']})", [
        ("group", f"{data['gpus']} rank{'s' if data['gpus'] != 1 else ''} on {data['nodes']} node{'s' if data['nodes'] != 1 else ''}"
                  + (", each sending to the next at once (time: one pair's)" if data["kind"] == "send_recv" else "")),
        ("level spanned", f"{data['level']}: {escape(link)}"), ("algorithm", data["algorithm"]),
        ("payload", f"{n:,} B ({binary(n)})"),
        ("time, roofline (lower bound)", si(t["roofline"], "s")),
        ("time, calibrated (expected)", si(t["calibrated"], "s") + band((t["calibrated_low"], t["calibrated_high"]))),
        ("algbw", si(data["algbw_b_s"], "B/s")), (f"busbw (x {data['bus_factor']:.3g})", si(data["busbw_b_s"], "B/s")),
        ("bound", data["bound"]),
    ])


def train_tables(res, setup, peak_flops: float) -> list[Table]:
    """``lmcost train``: memory per GPU, step time by part, throughput and MFU, and the operator classes
    of one microbatch (:class:`lmcost.apps.train.TrainStep` of :class:`~lmcost.apps.train.TrainSetup`);
    ``peak_flops``: the GPU's dense peak in the step's compute dtype (FLOP/s). A step that does not fit
    titles its time and throughput "if it fit"."""
    mem = res.memory
    labels = dict(weights_bytes="weights", grads_bytes="gradients", master_bytes="master copy (fp32)",
                  optimizer_bytes=f"optimizer states ({setup.optimizer})", step_bytes="step counters (host)",
                  model_states_bytes="model states", activations_bytes=f"activations ({mem.get('microbatches_in_flight')} "
                  f"{'model chunks' if setup.schedule == 'interleaved' else 'microbatches'} in flight)")
    rows = [(labels[k], si(mem[k], "B")) for k in labels if k in mem]
    rows += [(label, si(mem[k], "B")) for k, label in (("fp8_weight_copy_bytes", "fp8 weight copies (+ transposes)"),
                                                       ("redundant_experts_bytes", "redundant experts")) if mem.get(k)]
    rows += [("total per GPU", si(mem["total_bytes"], "B"))]
    held = dict(loss_fp32_bytes="loss in fp32 (last stage)", gathered_params_bytes="gathered parameters (ZeRO-3/FSDP)",
                gathered_grads_bytes="unsharded gradients (ZeRO-3/FSDP)", grad_buckets_bytes="gradient buckets",
                workspace_bytes="workspaces (cuBLAS, TE)", allocated_bytes="allocated (tensors at the peak)",
                fragmentation_bytes="allocator rounding and fragmentation", reserved_bytes="reserved (allocator)",
                cuda_context_bytes="CUDA context", nccl_bytes="NCCL buffers", nvidia_smi_bytes="device (nvidia-smi)")
    rows += [(label, si(mem[k], "B")) for k, label in held.items() if k in mem and (mem[k] or k in ("allocated_bytes", "reserved_bytes"))]
    rows += [("capacity per GPU", si(mem["capacity_bytes"], "B"))]
    if "margin_bytes" in mem:
        rows += [("usable (binary GB)", si(mem["usable_bytes"], "B")), ("margin", si(mem["margin_bytes"], "B"))]
    rows.append(("fits (each GPU)", "yes" if res.fits else "[red]NO[/red]"))
    def named(d):
        return [(k.removesuffix("_s").replace("_", " "), si(v, "s")) for k, v in d.items()]

    cond = "" if res.fits else " if it fit"  # a step that does not fit still has the figures it would reach
    steps = kv_table("Step time by part (per GPU)" if res.fits else "Step time if it fit (per GPU)",
                     named(res.step_parts_s) + [("step", si(res.step_s, "s"))])
    steps.caption = "These parts add up to the step (step_parts_s)."
    details = kv_table("Details inside the pipeline and the DP schedule (not added again)", named(res.parts_s))
    details.caption = ("Inside the pipeline: forward, backward, recompute, bubble, clock, step efficiency, kernel "
                       "launches, the model-parallel communication, less what the overlap schemes hide, plus their SM "
                       "contention, and the fp8 quantize kernels; dp comm and the DP part of sm contention run under "
                       "compute; fp8 quantize includes the fp8 weight casts.")
    out = [kv_table("Memory per GPU (busiest stage)", rows), steps, details,
           kv_table(f"Throughput{cond}", [
               ("tokens/s", f"{res.tokens_per_s:,.0f}"), ("tokens/s per GPU", f"{res.tokens_per_s_per_gpu:,.1f}"),
               ("MFU (causal: the pairs the mask keeps)", pct(res.mfu_causal)),
               ("MFU (palm: 6N + 12LHQT, every pair)", pct(res.mfu_palm)),
               ("HFU (every FLOP that runs)", pct(res.hfu)),
               ("against the dense peak of", si(peak_flops, "FLOP/s") + f" ({res.compute_dtype})")])]
    # Both conventions under the figures (lmcost.apps.train.CONVENTION_NOTES), so that palm's MFU above HFU
    # at long sequences does not read as a contradiction.
    out[-1].caption = ("MFU: model FLOPs (6N, lm_head in, embedding lookup out, + attention pairs: causal keeps "
                       "the mask's, palm every pair), no recompute. HFU: hardware FLOPs, every operator that runs "
                       "(flash backward and activation recompute in, causal pairs only). HFU takes each FLOP at its own "
                       "dtype's peak (fp8 GEMMs at the fp8 peak) and the mean EP rank's FLOPs.")
    for t in class_tables(res.class_rows):
        t.title = "one microbatch, forward + backward, on one GPU's path through the stages: by operator class"
        out.append(t)
    return out


def breakdown_table(title: str, df, measured: str | None) -> Table:
    """``lmcost breakdown``: each operator class's share of FLOPs and of roofline time, and with
    ``measured`` (the column's label) its measured time and share."""
    import pandas as pd

    cols = ["class", "FLOPs", "FLOPs share", "roofline time", "time share"]
    if measured is not None:
        cols += [measured, "measured share"]
    t = _columns(Table(title=title, title_justify="left"), cols, left=("class",))
    for r in df.itertuples():
        row = [r.op_class] + (["-"] * 4 if pd.isna(r.flops) else
                              [si(r.flops, "FLOP"), pct(r.flops_share), si(r.time_s, "s"), pct(r.time_share)])
        if measured is not None:
            row += [si(r.measured_time_s, "s"), pct(r.measured_share)]
        t.add_row(*row)
    return t


def _error(predicted: float, measured: float) -> str:
    """Signed relative error of a prediction, ``+12.3%``; ``-`` where nothing was measured."""
    return f"{100 * (predicted - measured) / measured:+.1f}%" if measured > 0 and predicted == predicted else "-"


def measured_ops_table(title: str, ops, steps, spread) -> Table:
    """``lmcost profile``: each operator's measured time per step and spread, then the phases' wall times
    (``ops``: the run's per-operator table; ``steps``: its step timings; ``spread``: the spread of a list
    of times, a fraction)."""
    t = Table(title=title, title_justify="left")
    for c in ("phase", "operator", "class", "time per step", "spread"):
        t.add_column(c, justify="right" if c in ("time per step", "spread") else "left")
    for r in ops.itertuples():
        t.add_row(r.phase, r.name, str(r.op_class), si(r.measured_time_s, "s"), f"{r.spread_pct:.0f}%")
    for phase, label in (("prefill", "prefill (wall, end to end)"), ("decode", "decode step (wall, end to end)")):
        t.add_row(phase, label, "", si(steps.wall_s(phase), "s"), f"{100 * spread(steps.wall[phase]):.0f}%")
    return t


def foreign_trace_table(title: str, rows: list[dict]) -> Table:
    """``lmcost validate --trace`` of another runtime's trace: op time by predicted class, roofline and
    calibrated against measured."""
    t = Table(title=title, title_justify="left")
    for c in ("class", "roofline", "calibrated", "measured", "share of trace", "roofline error", "calibrated error"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["op_class"], si(r["roofline_time_s"], "s"), si(r["calibrated_time_s"], "s"),
                  si(r["measured_time_s"], "s"), f"{r['measured_share']:.1%}",
                  _error(r["roofline_time_s"], r["measured_time_s"]), _error(r["calibrated_time_s"], r["measured_time_s"]))
    return t


def validation_table(title: str, results: list[dict], models) -> Table:
    """``lmcost validate``: predicted (each time model of ``models``) against measured time per model,
    batch, phase and operator class (:func:`lmcost.profiling.validate.validate_runs`'s rows)."""
    t = _columns(Table(title=title, title_justify="left"),
                 ("model", "batch", "phase", "class", "roofline", "calibrated", "measured", "roofline error",
                  "calibrated error"), left=("model", "phase", "class"))
    for r in results:
        bad = r["measured_time_s"] != r["measured_time_s"]  # NaN: nothing measured
        t.add_row(escape(r["model"]), str(r["batch"]), r["phase"], r["op_class"], si(r["roofline_time_s"], "s"),
                  si(r["calibrated_time_s"], "s"),
                  "[red]not measured[/red]" if bad else si(r["measured_time_s"], "s"),
                  *["-" if bad else f"{r[f'{m}_error_pct']:+.1f}%" for m in models])
    return t


def sharded_table(r: dict, prompt: int, gen: int) -> Table:
    """``lmcost validate --tp/--pp/--ep/--dp``: a sharded run's collectives against lmcost's communication
    operators, and its logits against one process's (:func:`lmcost.profiling.distributed.compare`)."""
    t = _columns(Table(title=f"{escape(r['model'])}, {r['layout']}, batch {r['batch']}, prompt {prompt}, {gen} decode steps: "
                             f"logits max |diff| {r['max_abs_diff']:.2e} ({'ok' if r['logits_ok'] else 'DIFFER'})",
                       title_justify="left"),
                 ("phase", "kind", "group", "calls (run)", "calls (lmcost)", "payload (run)", "payload (lmcost)", "match"),
                 left=("phase", "kind", "group"))
    for row in r["rows"]:
        t.add_row(row["phase"], row["kind"], row["group"], str(row["calls_run"]), str(row["calls_lmcost"]),
                  f"{row['bytes_run']:,} B", f"{row['bytes_lmcost']:,} B", "yes" if row["match"] else "[red]NO[/red]")
    t.caption = "calls and payloads summed over ranks and decode steps (nccl-tests' size, fp32)"
    return t
