"""The one place that maps the library's field names onto the command line's flags.

The library's errors (:class:`lmcost.basics.errors.LmcostError`) name the API field a Python user passed
(``prompt``, ``virtual_stages``, ``tp``), and refer to other fields in their text in backticks
(```tp```). The CLI shows the same error with each field as the flag a user typed (``--prompt``,
``--virtual-stages``, ``--tp``): :func:`for_cli` rewrites the field and every backticked field name it
knows; anything else (a file path, a config key such as ``attention.n_kv_heads``) passes unchanged. A
field is shown as a flag only where the running command has that flag (:func:`command_options`): ``gpu``
is ``--gpu`` in ``estimate`` and stays ``gpu`` in ``gpus show NAME``, and ``phase`` stays a field in
``estimate``, which has no ``--phase``. A backticked field is its flag (a fix may name another command's);
one with no flag at all (a field only the Python API takes) is shown without its backticks.
"""

from __future__ import annotations

import re

from lmcost.basics.errors import LmcostError

#: API field -> CLI flag, for every field whose error a command can raise, and every flag the CLI's own
#: errors name (so that :func:`for_cli` leaves those as they are). A field is the keyword or attribute a
#: Python caller passes (``Workload(prompt=...)``, ``TrainSetup(virtual_stages=...)``); where one name
#: would need two flags, or is a flag in one command and a bare field in another,
#: the field is qualified by the object or function that takes it (``settings.model``, ``workload.batch``,
#: ``attention.phase``). Several fields may share a flag (``gpus``, ``n_gpus`` and ``n_ranks`` are all
#: ``--gpus``); no field has two. A field missing here is shown as it is (``tests/test_layout.py``
#: checks that no library error names a flag itself; ``tests/test_cli.py`` that every flag here is a
#: real option: a field no command takes, such as ``fit_dtype``, stays out).
FLAGS: dict[str, str] = {
    # Workload, Settings and the model (estimate, kv, roofline, report, plan)
    "batch": "--batch", "prompt": "--prompt", "gen": "--gen", "context": "--context", "contexts": "--context",
    "workload.batch": "--batch", "workload.prompt": "--prompt", "roofline_points.context": "--context",
    "prompt + gen": "--prompt + --gen", "isl + osl": "--isl + --osl", "prompt + 1": "--prompt + 1",
    "kernel": "--attention", "mla": "--mla", "logits": "--logits", "settings.model": "--model", "fusion": "--fuse",
    "quant": "--quant", "vision": "--vision", "labels": "--variants", "window": "--window",
    "local_global": "--local-global", "block_size": "--block-size", "layers": "--layers",
    "dtype": "--dtype", "activations": "--dtype", "weights": "--weight-dtype", "kv_cache": "--kv-dtype", "phase": "--phase",
    # hardware and clusters
    "gpu": "--gpu", "default_cluster.gpu": "--gpu", "cluster": "--cluster", "layout.cluster": "--cluster",
    "efficiency.kernel": "--kernel", "runtime": "--runtime", "nodes": "--nodes",
    # parallel layout
    "tp": "--tp", "pp": "--pp", "ep": "--ep", "dp": "--dp", "cp": "--cp", "sp": "--sp", "imbalance": "--ep-imbalance",
    # plan
    "n_gpus": "--gpus", "isl": "--isl", "osl": "--osl", "max_batch": "--max-batch", "ttft": "--ttft",
    "tpot": "--tpot", "top": "--top", "train": "--train", "roofline.context": "--context",
    # serve (ServeRequest and its workload: lmcost.apps.serve, lmcost.apps.serve_workload, lmcost.hardware.engines)
    "engine": "--engine", "workload.n": "--requests", "workload.output": "--output", "workload.rate": "--rate",
    "workload.arrival": "--arrival", "workload.concurrency": "--concurrency", "workload.seed": "--seed",
    "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
    "chunked_prefill": "--chunked-prefill", "memory_fraction": "--memory-fraction", "slo_ttft_s": "--slo-ttft",
    "slo_tpot_s": "--slo-tpot", "rates": "--rates", "workload_file": "--workload", "requests": "--requests",
    "rate": "--rate", "arrival": "--arrival", "concurrency": "--concurrency", "seed": "--seed",
    # serve's speculative decoding (lmcost.apps.serve_spec)
    "spec": "--spec", "spec_tokens": "--spec-tokens", "draft_model": "--draft-model", "acceptance": "--acceptance",
    # serve --pd (prefill/decode disaggregation: lmcost.apps.serve_pd)
    "pd": "--pd", "prefill_workers": "--prefill-workers", "prefill_tp": "--prefill-tp", "prefill_ep": "--prefill-ep",
    "prefill_dp": "--prefill-dp", "prefill_max_num_batched_tokens": "--prefill-max-num-batched-tokens",
    "decode_workers": "--decode-workers", "kv_link": "--kv-link",
    # serve's prefix caching (lmcost.apps.serve_prefix)
    "prefix": "--prefix", "workload.prefix": "--prefix", "prefix_caching": "--prefix-caching",
    "kv_offload": "--kv-offload",
    "usd_per_gpu_hour": "--usd-per-gpu-hour",  # serve's energy and cost (power_limit: train's, below)
    "prefill_max_num_seqs": "--prefill-max-num-seqs",  # serve --pd's prefill batch
    # serve-plan (ServePlanRequest: lmcost.apps.serve_plan)
    "percentile": "--percentile", "iterations": "--iterations", "jobs": "--jobs", "ray": "--ray",
    "pd_ratios": "--pd-ratios",
    # train (TrainSetup, its LoRA, the optimizer and activation models)
    "gpus": "--gpus", "seq": "--seq", "global_batch": "--global-batch", "micro_batch": "--micro-batch",
    "microbatches": "--global-batch", "virtual_stages": "--virtual-stages", "schedule": "--schedule",
    "recompute": "--recompute", "flops_convention": "--flops-convention", "attention": "--attention",
    "zero": "--zero", "precision": "--precision", "optimizer": "--optimizer", "lora.rank": "--lora-rank",
    "lora.targets": "--lora-targets", "qlora": "--qlora", "stage_layers": "--stage-layers",
    "first_stage_layers": "--first-stage-layers", "last_stage_layers": "--last-stage-layers",
    "recompute_layers": "--recompute-layers",
    "framework": "--framework", "power_limit": "--power-limit", "overlap": "--overlap", "shard_group": "--shard-group",
    "redundant_experts": "--redundant-experts",
    # serve's wide EP (lmcost.apps.serve_wide_ep)
    "a2a": "--a2a", "expert_load": "--expert-load", "tbo": "--tbo",
    # op (lmcost.cost.kernels) and op collective (lmcost.cost.collectives)
    "m": "--m", "n": "--n", "k": "--k", "attention.phase": "--phase", "attention.batch": "--batch",
    "heads": "--heads", "kv_heads": "--kv-heads", "head_dim": "--head-dim", "kv_len": "--kv-len",
    "norm.tokens": "--tokens", "elementwise.tokens": "--tokens", "hidden": "--hidden", "width": "--width",
    "kind": "--kind", "n_ranks": "--gpus", "attention.causal": "--no-causal", "payload_bytes": "--bytes",
    # profile, validate, calibrate, fit, report
    "device": "--device", "threads": "--threads", "repeats": "--repeats", "trace": "--trace",
    "batches": "--batch", "layers/batch/prompt": "--layers/--batch/--prompt", "dtypes": "--dtypes", "refresh": "--recalibrate", "table": "--table", "out": "--out", "output": "--output",
    "out_dir": "-o", "csv_out": "--csv-out", "report_dir": "--report-dir", "plot": "--plot",
    "json": "--json", "csv": "--csv", "batches/MODELS": "--batch/MODELS", "validate.gpu": "--gpu",
    # fields of the run setup and the request dataclasses the thin CLI calls (lmcost.apps.setup, lmcost.apps.fit)
    "weight_dtype": "--weight-dtype", "kv_dtype": "--kv-dtype", "targets": "--gpu", "traces": "--trace",
    "fit.out_dir": "--out", "ranks": "--gpus", "gpu_type": "--gpu", "lora_rank": "--lora-rank",
    "lora_targets": "--lora-targets", "attention_kernel": "--kernel", "time_model": "--model", "detail": "--detail",
    "breakdown.repeats": "--repeats", "run_dtype": "--run-dtype", "rows": "--rows", "sources": "--source", "training": "--training", "collectives": "--collectives",
}

#: Every flag in :data:`FLAGS`: a field the CLI passes to a library check is already one, and stays.
FLAG_NAMES = frozenset(part for f in FLAGS.values() for part in f.replace(" + ", "/").split("/") if part.startswith("-"))


_FIELD = re.compile(r"[A-Za-z_][\w.]*")
_FLAG = re.compile(r"(?<![\w-])--?[a-z][\w-]*")


def command_options() -> frozenset[str] | None:
    """Every option name (``--gpu``, ``-o``, ``--no-causal``) of the command now running under click, or None
    outside one (a Python caller of :func:`for_cli`: every field of :data:`FLAGS` is then its flag)."""
    try:  # typer >= 0.26 vendors click; older releases use click itself
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover
        from click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    return frozenset(o for p in ctx.command.params if p.param_type_name == "option"
                     for o in (*p.opts, *p.secondary_opts))


def _on_command(mapped: str, field: str, options: frozenset[str] | None) -> str:
    """``mapped`` (a field's flags) where the running command has every flag it names, else ``field``."""
    if options is None or all(f in options for f in _FLAG.findall(mapped)):
        return mapped
    return field


def flag(field: str, options: frozenset[str] | None = None) -> str:
    """The flag of ``field`` (``virtual_stages`` -> ``--virtual-stages``), or ``field`` unchanged (a flag, a
    file path, a config key, or a field whose flag ``options``, the running command's, lacks).

    A compound field maps part by part when every part is a field (``tp/pp`` -> ``--tp/--pp``); a field
    of one word and a value maps its word (``labels gqa:3`` -> ``--variants gqa:3``)."""
    if field in FLAGS:
        return _on_command(FLAGS[field], field, options)
    parts = field.split("/")
    if len(parts) > 1 and all(p in FLAGS for p in parts):
        return _on_command("/".join(FLAGS[p] for p in parts), field, options)
    head, sep, rest = field.partition(" ")
    if sep and head in FLAGS:
        return _on_command(f"{FLAGS[head]} {rest}", field, options)
    return field


def _backticked(text: str) -> str:
    """``text`` with each ```field``` it names written as its flag, or as the bare name where it has none
    (a field only the Python API takes), and each ```--flag``` as the flag: backticks dropped. Anything
    else in backticks (```key: value```) stays as it is. (A text may name another command's flag:
    ``use breakdown with `phase` prefill``.)"""
    parts = text.split("`")
    if len(parts) < 3:
        return text
    out = [parts[0]]
    for i in range(1, len(parts), 2):
        name = parts[i]
        closed = i + 1 < len(parts)
        if closed and name in FLAGS:
            out.append(FLAGS[name])
        elif closed and (name in FLAG_NAMES or _FIELD.fullmatch(name)):
            out.append(name)
        else:
            out.append(f"`{name}`" if closed else f"`{name}")
        if closed:
            out.append(parts[i + 1])
    return "".join(out)


def _quoted(text: str, options: frozenset[str] | None = None) -> str:
    """``text`` with each error it quotes in parentheses (``(tp: ...)``, as :mod:`lmcost.apps.plan` gives
    the reason a layout was skipped) showing its field as a flag."""
    return re.sub(r"\(([\w.]+): ", lambda m: f"({flag(m[1], options)}: ", text)


def said(line: str) -> str:
    """A line ``<field>: <what>; <fix>`` (``str`` of an error, as a plan keeps the reason each layout
    was skipped) as the CLI shows it: every field as its flag, of whichever command takes it (a training
    layout's reason names ``lmcost train``'s ``--zero``)."""
    field, sep, rest = line.partition(": ")
    if not sep or " " in field:
        return _quoted(_backticked(line))
    return f"{flag(field)}: {_quoted(_backticked(rest))}"


def text_for_cli(text: str) -> str:
    """A library note (``say``) as the CLI shows it: each backticked field it names, as its flag."""
    return _backticked(text)


def for_cli(err: LmcostError) -> LmcostError:
    """``err`` as the CLI shows it: its field, the fields its text names and the errors it quotes, as the
    flags of the running command (:func:`command_options`)."""
    options = command_options()
    return LmcostError(flag(err.field, options), _quoted(_backticked(err.what), options),
                       _quoted(_backticked(err.fix), options))
