"""The one registry of Hugging Face families: ``model_type`` -> how to map it.

An entry is either a mapping, a function ``(reader, model_type) -> ArchConfig fields`` (a family with code
of its own, registered by :func:`family`; a table entry, :class:`lmcost.model.hf.llama_like.FamilySpec`, is
such a callable too, registered by :func:`register`), or a :class:`Wrapper`, a multimodal config whose
``text_config`` is the decoder. Each family group's file fills the registry as it is imported;
:mod:`lmcost.model.hf.families` imports them all and dispatches through it.

Adding a family that reuses known mechanisms is one ``FamilySpec`` in one file (tests/test_hf.py shows it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lmcost.model.hf.reader import Reader


class Mapper(Protocol):
    """How a family maps: the reader of one config (it records the keys read, so a key no mapping reads is
    refused) and the config's model_type -> the ArchConfig fields (a dict :class:`ArchConfig` validates)."""

    def __call__(self, r: Reader, mt: str) -> dict: ...


@dataclass(frozen=True, kw_only=True)
class Wrapper:
    """A multimodal wrapper whose ``text_config`` is the decoder; lmcost counts the decoder (and says that the
    vision or audio tower is not counted, or counts Gemma 3's SigLIP tower apart)."""

    #: The wrapper's own model_type.
    model_type: str
    #: The text config's model_type when it names none (the wrapper's config class fills it in).
    text_type: str
    #: True: the wrapper's own tie_word_embeddings decides the lm_head's tying (Gemma3ForConditionalGeneration,
    #: Mistral3); False: the text config's does (Llama 4's and Qwen3.5's causal-LM classes are the decoder alone).
    ties: bool
    #: Other text config model_types the wrapper's config class is published with (Mistral 3: ministral3).
    aliases: tuple[str, ...] = ()
    #: Top-level keys of the wrapper's own config class beyond the shared ones (WRAPPER_KEYS): read or no cost.
    own: tuple[str, ...] = ()


#: model_type -> its mapping or its wrapper. Filled by the family group files as they are imported.
FAMILIES: dict[str, Mapper | Wrapper] = {}


def register(entry, *model_types: str):
    """Add ``entry`` (a mapping or a Wrapper) under each of ``model_types`` (default: ``entry.model_type``).

    Returns: ``entry``, so a table can register as it defines.
    Raises: ValueError for a model_type already registered (two mappings of one type are a programming error).
    """
    for mt in model_types or (entry.model_type,):
        if mt in FAMILIES:
            raise ValueError(f"model_type {mt!r} is registered twice")
        FAMILIES[mt] = entry
    return entry


def family(*model_types: str) -> Callable[[Mapper], Mapper]:
    """Decorator: register a function ``(reader, model_type) -> ArchConfig fields`` for ``model_types`` (a family
    and its aliases, e.g. ``@family("gpt2", "gpt-sw3")``). Raises: ValueError as :func:`register`."""

    def add(fn: Mapper) -> Mapper:
        return register(fn, *model_types)

    return add


def mapped_in(module: str) -> list[str]:
    """The model types whose mapping function is defined in ``module`` (a family group file's ``__name__``), sorted.
    A FamilySpec reports the module of its class (:mod:`lmcost.model.hf.llama_like`), not of its table."""
    return sorted(mt for mt, entry in FAMILIES.items() if getattr(entry, "__module__", None) == module)
