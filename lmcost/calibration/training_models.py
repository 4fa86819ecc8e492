"""The models of the training-runs fitting set as lmcost architectures: one entry per ``model`` string of
training-runs.csv (the developers' collection of published training runs), in
``lmcost/data/measurements/training-models.yaml``.

An entry is ``shipped: <name>`` (a model of ``lmcost/data/models/``), an inline architecture (the keys of a model
YAML, validated by :func:`lmcost.model.loading.config_from_dict`), or ``skip: <reason>`` (an encoder-decoder, or a
model no source gives the shape of). Each says in ``source`` where its widths come from; the file's comments say
what was chosen where a source leaves a width open. tests/test_training_models.py checks every entry's total
parameters against the CSV's params_b and, where a Hugging Face config.json is held, against lmcost's reading of it.
"""

from __future__ import annotations

from functools import lru_cache

from lmcost.basics import shipped
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import read_mapping
from lmcost.model.config import ArchConfig
from lmcost.model.loading import config_from_dict, load_config

#: The file of entries, under lmcost/data/measurements/.
FILE = "training-models.yaml"


@lru_cache(maxsize=1)
def _entries() -> dict[str, dict]:
    """The file's entries by model string. Raises: LmcostError if the file is unreadable or an entry is not a
    mapping with exactly one of shipped/skip or an inline architecture."""
    path = shipped.folder("measurements") / FILE
    data = read_mapping(path)
    for name, entry in data.items():
        if not isinstance(entry, dict) or len({"shipped", "skip"} & set(entry)) + ("d_model" in entry) != 1:
            raise LmcostError(f"{path}: {name}", "an entry is one of shipped: <model>, skip: <reason> or an "
                              "inline architecture", "give exactly one")
    return data


def training_model_names() -> dict[str, str]:
    """Every model string of the fitting set -> ``"shipped"``, ``"inline"`` or ``"skip: <reason>"``, in the
    file's order. Raises: LmcostError as :func:`_entries`."""
    out = {}
    for name, entry in _entries().items():
        out[name] = "shipped" if "shipped" in entry else f"skip: {entry['skip']}" if "skip" in entry else "inline"
    return out


@lru_cache(maxsize=None)
def training_model(name: str) -> ArchConfig:
    """The architecture of the fitting set's model ``name`` (the ``model`` cell of training-runs.csv, exactly).

    Raises: LmcostError("model", ...) for a name not in the file (naming the file), or one marked skip (the
    reason in the message); LmcostError from the loaders for an entry that does not validate.
    """
    entries = _entries()
    if name not in entries:
        raise LmcostError("model", f"{name!r} is not a model of the training-runs set",
                          f"use one of the {len(entries)} names of lmcost/data/measurements/{FILE}")
    entry = entries[name]
    if "skip" in entry:
        raise LmcostError("model", f"{name!r} is not modelled: {entry['skip']}",
                          "use a row of another model, or add its architecture to the file")
    if "shipped" in entry:
        return load_config(entry["shipped"])
    return config_from_dict(entry, f"{FILE}: {name}")
