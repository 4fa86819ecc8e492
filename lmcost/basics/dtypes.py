"""Data types and their size in memory, and the precision of one run (weights, activations, KV cache)."""

from __future__ import annotations

from dataclasses import dataclass

from lmcost.basics.errors import LmcostError

#: Group size of int4 quantisation: each group of INT4_GROUP weights shares one fp16 scale
#: (symmetric, no zero point), as in GPTQ/AWQ's common g128 setting.
INT4_GROUP = 128

#: Bytes per element. int4 counts its group scales: 0.5 + 2 / 128 = 0.515625 bytes per element.
BYTES_PER_ELEMENT: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5 + 2 / INT4_GROUP,
}

ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def canonical(name: str, field: str = "dtype") -> str:
    """The canonical dtype name for ``name`` (``bfloat16`` -> ``bf16``).

    Raises: LmcostError naming ``field`` if the dtype is unknown.
    """
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in BYTES_PER_ELEMENT:
        raise LmcostError(field, f"unknown dtype {name!r}", f"use one of {', '.join(BYTES_PER_ELEMENT)}")
    return key


def bytes_per_element(name: str) -> float:
    """Bytes one element of dtype ``name`` occupies (int4 includes its share of group scales)."""
    b = BYTES_PER_ELEMENT[canonical(name)]
    return int(b) if float(b).is_integer() else b


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run. Compute runs in the activation dtype (weight-only quantisation
    dequantises into it), so the activation dtype picks the peak FLOP/s.

    Raises: LmcostError if a dtype is unknown, or activations are int4 (no int4 compute is modelled).
    """

    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"

    def __post_init__(self):
        for name in ("weights", "activations", "kv_cache"):  # errors name the field (the CLI: its flag)
            object.__setattr__(self, name, canonical(getattr(self, name), name))
        if self.activations == "int4":
            raise LmcostError("activations", "int4 activations are not modelled",
                              "use int4 for `weights` or `kv_cache`, and bf16/fp16/fp8 for `activations`")

    @property
    def B_w(self) -> float:
        """Bytes per weight element."""
        return bytes_per_element(self.weights)

    @property
    def B_a(self) -> float:
        """Bytes per activation element."""
        return bytes_per_element(self.activations)

    @property
    def B_kv(self) -> float:
        """Bytes per KV-cache element."""
        return bytes_per_element(self.kv_cache)
