"""Hugging Face mappings of families whose attention needs more than a table entry of :mod:`lmcost.hf`
(attention sinks, chunked local attention, NoPE layers).

Each entry of ``FAMILIES`` maps a ``model_type`` to a function (reader, model_type) -> ArchConfig
fields, called by :func:`lmcost.hf.from_hf_config`; the reader (:class:`lmcost.hf._Reader`) records the
keys used, so a key no mapping reads is still refused.
"""

from __future__ import annotations

FAMILIES: dict = {}
