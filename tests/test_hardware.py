"""The shipped GPU YAMLs against the figures collected from vendor datasheets in tests/data/gpu-specs.md
(a copy of the developers' shared gpu-specs.md)."""

from __future__ import annotations

import re

import pytest

from conftest import DATA
from lmcost import load_gpu
from lmcost.basics.shipped import names

SPECS = DATA / "gpu-specs.md"
ROWS = {"v100": "V100 SXM2 32GB", "a100-80gb": "A100 SXM4 80GB", "a100-40gb": "A100 PCIe 40GB",
        "h100-sxm": "H100 SXM5 80GB", "h100-pcie": "H100 PCIe 80GB", "h200": "H200 SXM 141GB",
        "b200": "B200 (HGX, 1000 W)", "l40s": "L40S", "l4": "L4", "a10": "A10", "rtx-4090": "RTX 4090",
        "mi300x": "AMD MI300X"}
COLS = ["fp32", "tf32", "bf16", "fp16", "fp8", "int8"]


def table() -> dict[str, list[str]]:
    rows = {}
    # The main table only: the "Newer accelerators" section (test_new_gpus) repeats L40S and MI300X
    # with other columns.
    for line in SPECS.read_text().split("## Newer accelerators")[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 8 and cells[0] in ROWS.values():
            rows[cells[0]] = cells
    return rows


def number(cell: str) -> float | None:
    m = re.match(r"[\d.]+", cell)
    return float(m.group()) if m else None


def test_every_shipped_gpu_has_a_row():
    # Rows of the main table here; the newer parts have rows of the "Newer accelerators" table (test_new_gpus).
    from test_new_gpus import NEWER

    assert set(names("gpus")) == set(ROWS) | set(NEWER)


@pytest.mark.parametrize("name", sorted(ROWS))
def test_yaml_figures_equal_the_datasheet_table(name):
    row, g = table()[ROWS[name]], load_gpu(name)
    for col, cell in zip(COLS, row[1:7]):
        # Dense peaks; "–" means the GPU has no such rate. The RTX 4090's bf16/fp16 cell gives the
        # FP32-accumulate rate first (165.2), which the YAML uses.
        assert g.peak_tflops.get(col) == number(cell), (col, cell)
    assert g.memory_gb == number(row[7])
    assert g.bandwidth_tb_s == number(row[8])
