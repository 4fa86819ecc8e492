"""The one place that maps the library's field names onto the command line's flags.

The library's errors (:class:`lmcost.basics.errors.LmcostError`) name the API field a Python user passed
(``prompt``, ``virtual_stages``, ``tp``), and refer to other fields in their text in backticks
(```tp```). The CLI shows the same error with each field as the flag a user typed (``--prompt``,
``--virtual-stages``, ``--tp``): :func:`for_cli` rewrites the field and every backticked field name it
knows; anything else (a file path, a config key such as ``attention.n_kv_heads``) passes unchanged.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError

#: API field -> CLI flag, for every field whose error a command can raise. A field missing here is shown
#: as it is (``tests/test_layout.py`` checks that no library error names a flag itself).
FLAGS: dict[str, str] = {
    # -- fields of the run setup and the request dataclasses the thin CLI calls (lmcost.apps.setup,
    # lmcost.apps.fit, lmcost.profiling.evaluate); kept apart from the entries above.
    "dtype": "--dtype", "weight_dtype": "--weight-dtype", "kv_dtype": "--kv-dtype", "quant": "--quant",
    "nodes": "--nodes", "kernel": "--kernel", "runtime": "--runtime",
    "table": "--table", "targets": "--gpu", "traces": "--trace", "out_dir": "--out", "ranks": "--gpus",
    "gpu_type": "--gpu", "vision": "--vision", "lora_rank": "--lora-rank", "lora_targets": "--lora-targets",
    "qlora": "--qlora",
}


def flag(field: str) -> str:
    """The flag of ``field`` (``virtual_stages`` -> ``--virtual-stages``), or ``field`` unchanged.
    A compound field (``tp/pp``) maps part by part."""
    if "/" in field:
        return "/".join(flag(part) for part in field.split("/"))
    return FLAGS.get(field, field)


def _backticked(text: str) -> str:
    """``text`` with each ```field``` it names that has a flag written as that flag (backticks dropped)."""
    parts = text.split("`")
    if len(parts) < 3:
        return text
    out = [parts[0]]
    for i in range(1, len(parts), 2):
        name = parts[i]
        closed = i + 1 < len(parts)
        if closed and name in FLAGS:
            out.append(FLAGS[name])
        else:
            out.append(f"`{name}`" if closed else f"`{name}")
        if closed:
            out.append(parts[i + 1])
    return "".join(out)


def text_for_cli(text: str) -> str:
    """A library note (``say``) as the CLI shows it: each backticked field it names, as its flag."""
    return _backticked(text)


def for_cli(err: LmcostError) -> LmcostError:
    """``err`` as the CLI shows it: its field and the fields its text names, as flags."""
    return LmcostError(flag(err.field), _backticked(err.what), _backticked(err.fix))
