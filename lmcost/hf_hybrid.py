"""Hugging Face mappings of hybrid families whose layers mix attention with constant-size state layers
(Mamba-2, gated DeltaNet, short convolutions).

Each entry of ``FAMILIES`` maps a ``model_type`` to a function (reader, model_type) -> ArchConfig
fields, called by :func:`lmcost.hf.from_hf_config`; the reader (:class:`lmcost.hf._Reader`) records the
keys used, so a key no mapping reads is still refused.
"""

from __future__ import annotations

FAMILIES: dict = {}
