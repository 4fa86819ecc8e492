"""The one error type users see: a field, what is wrong with it, and how to fix it."""

from __future__ import annotations


class LmcostError(Exception):
    """A problem with the user's input, rendered as ``<field>: <what>; <fix>``.

    The CLI prints it as ``error: <field>: <what>; <fix>`` and exits with code 2.
    Anything else that escapes is a bug and keeps its traceback.
    """

    def __init__(self, field: str, what: str, fix: str):
        self.field, self.what, self.fix = field, what, fix
        super().__init__(f"{field}: {what}; {fix}")


#: pydantic error types whose message names a Python class (``instance of GemmEfficiency``) or an internal
#: type: what each means to someone writing the file.
_MAPPING_FIX = "write it as a mapping (YAML key: value lines, or a JSON object)"
_PLAIN = {
    "model_type": ("must be a mapping of keys to values", _MAPPING_FIX),
    "model_attributes_type": ("must be a mapping of keys to values", _MAPPING_FIX),
    "dataclass_type": ("must be a mapping of keys to values", _MAPPING_FIX),
    "dict_type": ("must be a mapping of keys to values", _MAPPING_FIX),
    "is_instance_of": ("has the wrong kind of value", "see a shipped file for the expected form"),
    "finite_number": ("must be a finite number, not nan or inf", "give a number"),
}


def from_validation_error(err, source: str) -> LmcostError:
    """Turn the first problem of a ``pydantic.ValidationError`` into an :class:`LmcostError`.

    The field is the dotted path inside the file (``attention.n_kv_heads``), prefixed with the file; the
    message never names a pydantic class or Python type (:data:`_PLAIN`), only what the field expects.
    """
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    kind = first["type"]
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    # Model-level validators name the field they judge: "n_kv_heads: ...".
    head, sep, rest = msg.partition(": ")
    if sep and head.isidentifier():
        loc, msg = f"{loc}.{head}" if loc else head, rest
    if kind in _PLAIN:
        what, fix = _PLAIN[kind]
        what = f"{what}, got {first.get('input')!r:.40}"
    elif kind == "extra_forbidden":
        what, fix = "unknown key", "remove it or check its spelling"
    elif kind == "missing":
        what, fix = "missing", "add it"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        what = msg[0].lower() + msg[1:]
        fix = "use a positive number" if kind == "greater_than" and msg.endswith(" 0") else "use a value in that range"
    elif "; " in msg:
        what, fix = msg.split("; ", 1)
    else:
        what, fix = msg[0].lower() + msg[1:], "correct the value"
    field = f"{source}: {loc}" if loc else source
    return LmcostError(field, what, fix)


class LmcostNote(UserWarning):
    """A note the library has for the user about their input (a config read through its ``architectures``), raised
    with :func:`warnings.warn`: a program sees a warning; the CLI prints it on stderr as one ``note:`` line."""
