"""The one place that maps the library's field names onto the command line's flags.

The library's errors (:class:`lmcost.basics.errors.LmcostError`) name the API field a Python user passed
(``prompt``, ``virtual_stages``, ``tp``), and refer to other fields in their text in backticks
(```tp```). The CLI shows the same error with each field as the flag a user typed (``--prompt``,
``--virtual-stages``, ``--tp``): :func:`for_cli` rewrites the field and every backticked field name it
knows; anything else (a file path, a config key such as ``attention.n_kv_heads``) passes unchanged. A few
fields the CLI has always shown under their API name stay so (:data:`BARE`), and a backticked field with
no flag (one only the Python API takes) is shown without its backticks.
"""

from __future__ import annotations

import re

from lmcost.basics.errors import LmcostError

#: API field -> CLI flag, for every field whose error a command can raise, and every flag the CLI's own
#: errors name (so that :func:`for_cli` leaves those as they are). A field is the keyword or attribute a
#: Python caller passes (``Workload(prompt=...)``, ``TrainSetup(virtual_stages=...)``); where one name
#: would need two flags, or is shown bare as a field (:data:`BARE`) while another error of it shows a flag,
#: the field is qualified by the object or function that takes it (``settings.model``, ``workload.batch``,
#: ``attention.phase``). Several fields may share a flag (``gpus``, ``n_gpus`` and ``n_ranks`` are all
#: ``--gpus``); no field has two. A field missing here is shown as it is (``tests/test_layout.py``
#: checks that no library error names a flag itself).
FLAGS: dict[str, str] = {
    # Workload, Settings and the model (estimate, kv, roofline, report, plan)
    "batch": "--batch", "prompt": "--prompt", "gen": "--gen", "context": "--context", "contexts": "--context",
    "workload.batch": "--batch", "workload.prompt": "--prompt", "roofline_points.context": "--context",
    "prompt + gen": "--prompt + --gen", "isl + osl": "--isl + --osl", "prompt + 1": "--prompt + 1",
    "kernel": "--attention", "mla": "--mla", "logits": "--logits", "settings.model": "--model", "fusion": "--fuse",
    "quant": "--quant", "vision": "--vision", "labels": "--variants", "window": "--window",
    "local_global": "--local-global", "block_size": "--block-size", "layers": "--layers",
    "dtype": "--dtype", "weights": "--weight-dtype", "kv_cache": "--kv-dtype", "phase": "--phase",
    # hardware and clusters
    "gpu": "--gpu", "default_cluster.gpu": "--gpu", "cluster": "--cluster", "layout.cluster": "--cluster",
    "efficiency.kernel": "--kernel", "runtime": "--runtime", "nodes": "--nodes",
    # parallel layout
    "tp": "--tp", "pp": "--pp", "ep": "--ep", "dp": "--dp", "cp": "--cp", "sp": "--sp", "imbalance": "--ep-imbalance",
    # plan
    "n_gpus": "--gpus", "isl": "--isl", "osl": "--osl", "max_batch": "--max-batch", "ttft": "--ttft",
    "tpot": "--tpot", "top": "--top", "train": "--train", "roofline.context": "--context",
    # train (TrainSetup, its LoRA, the optimizer and activation models)
    "gpus": "--gpus", "seq": "--seq", "global_batch": "--global-batch", "micro_batch": "--micro-batch",
    "microbatches": "--global-batch", "virtual_stages": "--virtual-stages", "schedule": "--schedule",
    "recompute": "--recompute", "flops_convention": "--flops-convention", "attention": "--attention",
    "zero": "--zero", "precision": "--precision", "optimizer": "--optimizer", "lora.rank": "--lora-rank",
    "lora.targets": "--lora-targets", "lora.base_dtype": "--lora-base-dtype", "qlora": "--qlora",
    # op (lmcost.cost.kernels) and op collective (lmcost.cost.collectives)
    "m": "--m", "n": "--n", "k": "--k", "attention.phase": "--phase", "attention.batch": "--batch",
    "heads": "--heads", "kv_heads": "--kv-heads", "head_dim": "--head-dim", "kv_len": "--kv-len",
    "norm.tokens": "--tokens", "elementwise.tokens": "--tokens", "hidden": "--hidden", "width": "--width",
    "rows": "--rows", "cols": "--cols", "kind": "--kind", "n_ranks": "--gpus", "payload_bytes": "--bytes",
    # profile, validate, calibrate, fit, report
    "device": "--device", "threads": "--threads", "repeats": "--repeats", "trace": "--trace",
    "batches": "--batch", "layers/batch/prompt": "--layers/--batch/--prompt", "fit_dtype": "--fit-dtype",
    "dtypes": "--dtypes", "refresh": "--recalibrate", "table": "--table", "out": "--out", "output": "--output",
    "out_dir": "-o", "csv_out": "--csv-out", "report_dir": "--report-dir", "plot": "--plot",
    "json": "--json", "csv": "--csv", "batches/MODELS": "--batch/MODELS", "validate.gpu": "--gpu",
    # fields of the run setup and the request dataclasses the thin CLI calls (lmcost.apps.setup, lmcost.apps.fit)
    "weight_dtype": "--weight-dtype", "kv_dtype": "--kv-dtype", "targets": "--gpu", "traces": "--trace",
    "fit.out_dir": "--out", "ranks": "--gpus", "gpu_type": "--gpu", "lora_rank": "--lora-rank",
    "lora_targets": "--lora-targets", "attention_kernel": "--kernel", "time_model": "--model", "detail": "--detail",
    "breakdown.repeats": "--repeats", "run_dtype": "--run-dtype",
}

#: Fields the CLI shows under their API name, as it always has (a GPU or model named as a positional
#: argument, the counts of a Workload, kv or roofline): :func:`flag` leaves them as they are, while a
#: backticked mention of one in an error's text is its flag (``pass `batch` in that range`` ->
#: ``pass --batch in that range``).
BARE = frozenset({"batch", "prompt", "gen", "context", "phase", "gpu", "cluster", "repeats"})

#: Every flag in :data:`FLAGS`: a field the CLI passes to a library check is already one, and stays.
FLAG_NAMES = frozenset(part for f in FLAGS.values() for part in f.replace(" + ", "/").split("/") if part.startswith("-"))


_FIELD = re.compile(r"[A-Za-z_][\w.]*")


def flag(field: str) -> str:
    """The flag of ``field`` (``virtual_stages`` -> ``--virtual-stages``), or ``field`` unchanged (a
    :data:`BARE` field, a flag, a file path, a config key).

    A compound field maps part by part when every part is a field (``tp/pp`` -> ``--tp/--pp``); a field
    of one word and a value maps its word (``labels gqa:3`` -> ``--variants gqa:3``)."""
    if field in BARE:
        return field
    if field in FLAGS:
        return FLAGS[field]
    parts = field.split("/")
    if len(parts) > 1 and all(p in FLAGS for p in parts):
        return "/".join(FLAGS[p] for p in parts)
    head, sep, rest = field.partition(" ")
    if sep and head in FLAGS and head not in BARE:
        return f"{FLAGS[head]} {rest}"
    return field


def _backticked(text: str) -> str:
    """``text`` with each ```field``` it names written as its flag, or as the bare name where it has none
    (a field only the Python API takes), and each ```--flag``` as the flag: backticks dropped. Anything
    else in backticks (```key: value```) stays as it is."""
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


def _quoted(text: str) -> str:
    """``text`` with each error it quotes in parentheses (``(tp: ...)``, as :mod:`lmcost.apps.plan` gives
    the reason a layout was skipped) showing its field as a flag."""
    return re.sub(r"\(([\w.]+): ", lambda m: f"({flag(m[1])}: ", text)


def said(line: str) -> str:
    """A line ``<field>: <what>; <fix>`` (``str`` of an error, as a plan keeps the reason each layout
    was skipped) as the CLI shows it."""
    field, sep, rest = line.partition(": ")
    if not sep or " " in field:
        return _quoted(_backticked(line))
    return f"{flag(field)}: {_quoted(_backticked(rest))}"


def text_for_cli(text: str) -> str:
    """A library note (``say``) as the CLI shows it: each backticked field it names, as its flag."""
    return _backticked(text)


def for_cli(err: LmcostError) -> LmcostError:
    """``err`` as the CLI shows it: its field, the fields its text names and the errors it quotes, as flags."""
    return LmcostError(flag(err.field), _quoted(_backticked(err.what)), _quoted(_backticked(err.fix)))
