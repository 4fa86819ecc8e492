"""Loading a model: an lmcost YAML, a Hugging Face ``config.json``, or a shipped model by name.

The schema is :mod:`lmcost.model.config`; the Hugging Face mapping is :mod:`lmcost.model.hf.families`; this module picks
between them (it imports both, neither imports it).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from lmcost.basics import shipped as resources
from lmcost.model.config import ArchConfig
from lmcost.basics.errors import LmcostError, from_validation_error
from lmcost.basics.files import no_file, present, read_mapping, shown
from lmcost.model.hf.families import from_hf_config


def config_from_dict(data: dict, source: str = "<dict>") -> ArchConfig:
    """Validate a mapping in lmcost's schema, or a Hugging Face config (it has ``model_type``).

    Raises: LmcostError naming the dotted field, what is wrong, and the fix.
    """
    if "model_type" in data:
        return from_hf_config(data, source)
    try:
        return ArchConfig.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, source) from None


def load_config(name_or_path: str | Path) -> ArchConfig:
    """Load a model from a YAML/JSON path, or a shipped model by exact name (``llama-3-8b``).

    Raises: LmcostError if the file is missing, malformed or invalid, or the name is unknown
    (the message lists the shipped names).
    """
    path = Path(name_or_path)
    if not present(path):  # a FIFO or device too: read_mapping refuses it by name
        found = resources.find("models", str(name_or_path))
        if found is None:
            if resources.meant_as_path(name_or_path, (".yaml", ".yml", ".json")):
                raise no_file(path, "check the path, or give a shipped model name")
            raise LmcostError("model", f"unknown model {shown(name_or_path)!r}",
                              f"use a path or one of: {', '.join(resources.names('models'))}")
        path = found
    data = read_mapping(path)
    if path.suffix == ".json" and "model_type" not in data:
        raise LmcostError(f"{path}: model_type", "missing", "a Hugging Face config.json names its model_type; "
                          "add it, or write the model as an lmcost YAML")
    if "model_type" not in data:
        data.setdefault("name", path.stem)
    return config_from_dict(data, str(path))
