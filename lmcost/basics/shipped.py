"""The one locator of shipped data: ``lmcost/data/<kind>/`` (``gpus``, ``clusters``, ``models``,
``measurements``, ``engines``, ``workloads``, ``frameworks``), found through :mod:`importlib.resources`, the same from a checkout, an editable
install or a wheel; files by name or alias.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import yaml
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import MAX_MAPPING_BYTES, SAFE_LOADER, no_file, present, read_text, shown

#: The kinds of shipped data, one folder each under ``lmcost/data``.
KINDS = ("gpus", "clusters", "models", "measurements", "engines", "workloads", "frameworks")


def folder(kind: str) -> Path:
    """The folder holding shipped ``kind`` files (one of :data:`KINDS`).

    Raises: ValueError for a kind not in :data:`KINDS` (a programming error, not a user's).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown kind of shipped data {kind!r}; one of {KINDS}")
    return Path(str(resources.files("lmcost") / "data" / kind))


def files(kind: str) -> list[Path]:
    """The shipped YAML files of ``kind``, sorted."""
    return sorted(folder(kind).glob("*.yaml"))


def names(kind: str) -> list[str]:
    """The shipped names of ``kind`` (file stems)."""
    return [p.stem for p in files(kind)]


def find(kind: str, name: str) -> Path | None:
    """The shipped file whose stem or ``aliases`` equal ``name`` exactly (case-insensitive); else None."""
    key = name.lower()
    for p in files(kind):
        if p.stem.lower() == key:
            return p
    for p in files(kind):
        head = yaml.load(read_text(p, MAX_MAPPING_BYTES, "YAML file"), Loader=SAFE_LOADER) or {}
        if key in [str(a).lower() for a in head.get("aliases", [])]:
            return p
    return None


def meant_as_path(name_or_path, suffixes=(".yaml", ".yml")) -> bool:
    """Whether a name no shipped file has was meant as a path: it has a file suffix of ``suffixes`` or a
    ``/``, or something is there (a folder, a broken link or a loop of links: :func:`present` is False
    for each), so the error says what is there (:func:`lmcost.basics.files.no_file`), not "unknown"."""
    return Path(name_or_path).suffix in suffixes or "/" in str(name_or_path) or os.path.lexists(name_or_path)


def locate(kind: str, name_or_path, field: str, noun: str, known: list[str]) -> Path:
    """A YAML file given by path, or the shipped ``kind`` file of that name or alias (:func:`find`).

    Raises: LmcostError naming ``field`` for an unknown name (listing ``known``), or the path for one
    meant as a path (:func:`meant_as_path`) where no file is: missing, a folder, a loop of links.
    """
    path = Path(name_or_path)
    if present(path):  # a FIFO or device too: the reader refuses it by name
        return path
    found = find(kind, str(name_or_path))
    if found is not None:
        return found
    if meant_as_path(name_or_path):
        raise no_file(path, f"check the path, or give a shipped {noun} name")
    raise LmcostError(field, f"unknown {noun} {shown(name_or_path)!r}", f"use a YAML path or one of: {', '.join(known)}")
