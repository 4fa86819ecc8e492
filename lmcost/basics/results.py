"""Typed results: the base of the frozen, keyword-only, slotted dataclasses the library returns where it
once returned bare dicts (totals, op statics, model states, activation bytes). ``to_dict()`` gives the
dict the JSON was always made of, keys in field order."""

from __future__ import annotations

from dataclasses import fields


class Result:
    """Mixed into a ``@dataclass(frozen=True, kw_only=True, slots=True)``: its fields as a dict."""

    __slots__ = ()

    def to_dict(self) -> dict:
        """{field: value}, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
