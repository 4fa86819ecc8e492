"""The GPUs people deploy on now (issue 25): each YAML's figures against the "Newer accelerators" table of
tests/data/gpu-specs.md (a copy of the developers' shared gpu-specs.md, whose sources are lettered [a]-[m]),
FP4 peaks exactly where a source gives one, ``gpus list`` carrying FP8/FP4 and which figures are fitted, and a
dtype without a peak refused in one line."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from conftest import DATA
from lmcost import load_gpu
from lmcost.basics.shipped import names
from lmcost.cli import app

SPECS = (DATA / "gpu-specs.md").read_text()
NEWER_TABLE = SPECS.split("## Newer accelerators")[1]
#: Shipped name -> its row of the "Newer accelerators" table.
NEWER = {"b300": "B300 (HGX B300)", "gb200": "GB200 (per GPU, NVL72)", "gb300": "GB300 (per GPU, NVL72)",
         "rtx-pro-6000": "RTX PRO 6000 Blackwell Server Edition", "h100-nvl": "H100 NVL",
         "a100-pcie-80gb": "A100 PCIe 80GB", "mi325x": "AMD MI325X", "mi355x": "AMD MI355X"}
#: Column of the table -> the peak keys it gives (BF16/FP16 is one column).
COLUMNS = {2: ("tf32",), 3: ("bf16", "fp16"), 4: ("fp8",), 5: ("int8",), 7: ("fp4",)}

runner = CliRunner()


def row(name: str) -> list[str]:
    for line in NEWER_TABLE.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == NEWER[name]:
            return cells
    raise AssertionError(f"no row {NEWER[name]!r}")


def number(cell: str) -> float | None:
    """The figure a cell gives ("~5000 (n/v, [l])" -> 5000.0); None for "?", "–" and words."""
    m = re.match(r"~?(\d[\d.]*)", cell)
    return float(m.group(1)) if m else None


def test_the_table_is_read():
    # Guard against a parse that reads nothing: a known cell of each kind.
    assert number(row("b300")[7]) == 14000 and number(row("mi355x")[4]) == 5000 and number(row("h100-nvl")[3]) is None


@pytest.mark.parametrize("name", sorted(NEWER))
def test_yaml_figures_equal_the_table(name):
    cells, g = row(name), load_gpu(name)
    assert g.name == name
    for col, keys in COLUMNS.items():
        for key in keys:
            if (name, key) in (("gb200", "tf32"), ("gb300", "tf32"), ("a100-pcie-80gb", "tf32")):
                continue  # "?" in the table: test_third_party_figures, test_derived_fp32
            assert g.peak_tflops.get(key) == number(cells[col]), (key, cells[col])
    # Memory: the GB (10^9 bytes) figure; GB200's cell has only nvidia-smi's "189471 MiB = 198.7 GB".
    gb = re.search(r"= ([\d.]+) GB", cells[8]) if name == "gb200" else None
    assert g.memory_gb == (float(gb.group(1)) if gb else number(cells[8]))
    assert g.bandwidth_tb_s == number(cells[9])
    # TDP: the figure, or the top of a configurable range ("350-400 W" for H100 NVL).
    assert g.tdp_w == max(float(x) for x in re.findall(r"\d+", cells[12].split("(")[0]))


def test_third_party_figures():
    # Not in the table's cells but named in its source notes: [c] "(third-party: TF32 1250, FP64 45, FP32 90
    # dense)" for GB200; [d] "adds TF32 1250 and FP32 80" for GB300.
    c = re.search(r"\(third-party: TF32 (\d+), FP64 \d+, FP32 (\d+) dense\)", SPECS)
    d = re.search(r"adds TF32 (\d+) and\s+FP32 (\d+)", SPECS)
    gb200, gb300 = load_gpu("gb200").peak_tflops, load_gpu("gb300").peak_tflops
    assert (gb200["tf32"], gb200["fp32"]) == (float(c.group(1)), float(c.group(2))) == (1250, 90)
    assert (gb300["tf32"], gb300["fp32"]) == (float(d.group(1)), float(d.group(2))) == (1250, 80)


def test_derived_fp32():
    # A100 PCIe 80GB: the A100 rows of the main table (the A100 datasheet prints one compute column for its
    # SKUs): FP32 19.5, TF32 156. MI325X: MI300X's vector rate, the same gfx942 die with 304 CUs ([j]) and
    # the same matrix rates ([i]: BF16 1307.4 = MI300X's), so the same clock.
    from test_hardware import table

    a100 = table()["A100 PCIe 40GB"]
    assert load_gpu("a100-pcie-80gb").peak_tflops["fp32"] == float(a100[1]) == 19.5
    assert load_gpu("a100-pcie-80gb").peak_tflops["tf32"] == float(a100[2]) == 156
    assert load_gpu("mi325x").peak_tflops["fp32"] == load_gpu("mi300x").peak_tflops["fp32"] == 163.4
    assert load_gpu("mi325x").peak_tflops["bf16"] == load_gpu("mi300x").peak_tflops["bf16"]


def test_fp32_only_where_a_source_gives_one():
    # No source read gives B300's, the RTX PRO 6000's, MI355X's or H100 NVL's fp32 (gpu-specs.md notes).
    for name in ("b300", "rtx-pro-6000", "mi355x", "h100-nvl"):
        assert "fp32" not in load_gpu(name).peak_tflops, name
    assert load_gpu("h100-nvl").peak_tflops == {}  # its compute cells are all "?" ([f] third-party only)


def test_fp4_exactly_where_a_source_gives_one():
    # Blackwell (NVFP4) and CDNA 4 (MXFP4) only. B200's 9000 is aiconfigurator-core 0.12.0's
    # systems/b200_sxm.yaml fp4_tc_flops ("9000TFLOPS"; the HGX B200 datasheet's 144 PFLOPS sparse per
    # 8 GPUs halved), not a row of gpu-specs.md; the newer parts' come from the table's FP4 column.
    have = {n for n in names("gpus") if "fp4" in load_gpu(n).peak_tflops}
    assert have == {"b200"} | {n for n in NEWER if number(row(n)[7]) is not None}
    assert have == {"b200", "b300", "gb200", "gb300", "rtx-pro-6000", "mi355x"}
    assert load_gpu("b200").peak_flops("fp4") == 9000e12
    # The rest of B200 is unchanged (the HGX B200 datasheet row of the main table).
    assert {k: v for k, v in load_gpu("b200").peak_tflops.items() if k != "fp4"} == {
        "fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "int8": 4500.0}


@pytest.mark.parametrize("alias, name", [("gb200", "gb200"), ("gb200-nvl72", "gb200"), ("b300", "b300"),
                                         ("hgx-b300", "b300"), ("gb300-nvl72", "gb300"), ("mi355x", "mi355x"),
                                         ("amd-mi325x", "mi325x"), ("rtx-pro-6000", "rtx-pro-6000"),
                                         ("rtx-pro-6000-server", "rtx-pro-6000"), ("a100-pcie-80gb", "a100-pcie-80gb"),
                                         ("h100-nvl", "h100-nvl"), ("H100-NVL", "h100-nvl")])
def test_aliases(alias, name):
    assert load_gpu(alias).name == name


def test_gpus_list_json_carries_fp8_fp4_and_fitted():
    r = runner.invoke(app, ["gpus", "list", "--json"])
    assert r.exit_code == 0, r.output
    rows = {g["name"]: g for g in json.loads(r.stdout)}
    assert set(NEWER) <= set(rows)
    # Existing keys kept; H100 SXM from its datasheet (FP8 1978.9 dense, no FP4) with a fitted block.
    h100 = rows["h100-sxm"]
    assert (h100["peak_flops_per_s"], h100["peak_dtype"], h100["fp8_flops_per_s"], h100["fp4_flops_per_s"],
            h100["fitted"].split(";")[0]) == (989.4e12, "bf16", 1978.9e12, None, "public")
    assert {"aliases", "description", "bandwidth_bytes_per_s", "memory_bytes", "ridge_flops_per_byte"} <= set(h100)
    # GB300: 15 PFLOPS dense NVFP4 [b][d], FP8 5000 [d]; fitted on the engines' kernels (issue 25): its base block
    # from the engines pooled, then one profile per engine. MI355X: nothing fitted.
    assert (rows["gb300"]["fp8_flops_per_s"], rows["gb300"]["fp4_flops_per_s"]) == (5000e12, 15000e12)
    assert rows["gb300"]["fitted"].startswith("engines pooled; ") and "vllm 0.24.0" in rows["gb300"]["fitted"]
    assert rows["mi355x"]["fitted"] == "-"
    # MI355X has no bf16/fp16 figure: its headline peak is fp8, its ridge 5000e12 / 8e12 = 625 FLOPs/byte.
    assert (rows["mi355x"]["peak_dtype"], rows["mi355x"]["ridge_flops_per_byte"]) == ("fp8", 625.0)
    # H100 NVL has no compute figure at all.
    assert (rows["h100-nvl"]["peak_flops_per_s"], rows["h100-nvl"]["ridge_flops_per_byte"]) == (None, None)
    # fitted: "public" for the public table's A100/H100/H200 blocks, "engines pooled" for the engine table's
    # GPUs (issue 25), "-" for a GPU without an efficiency block (calibrated times are its roofline).
    assert [n for n, g in rows.items() if g["fitted"].startswith("public")] == ["a100-40gb", "a100-80gb", "h100-pcie",
                                                                                "h100-sxm", "h200"]
    assert sorted(n for n, g in rows.items() if g["fitted"] != "-") == [
        "a100-40gb", "a100-80gb", "b200", "b300", "gb200", "gb300", "h100-pcie", "h100-sxm", "h200", "l40s",
        "rtx-pro-6000"]
    assert all((g["fitted"] == "-") == (load_gpu(n).efficiency is None) for n, g in rows.items())
    table = runner.invoke(app, ["gpus", "list"])
    assert table.exit_code == 0 and "FP4" in table.stdout and "fitted" in table.stdout


@pytest.mark.parametrize("args, line", [
    (["estimate", "llama-3-8b", "--gpu", "mi355x", "--dtype", "bf16"], "error: --dtype: mi355x has no bf16 peak; use --dtype fp8"),
    (["estimate", "llama-3-8b", "--gpu", "mi355x"], "error: --dtype: mi355x has no bf16, fp16 or fp32 peak in its sources; use --dtype fp8"),
    (["estimate", "llama-3-8b", "--gpu", "a100-pcie-80gb", "--dtype", "fp8"],
     "error: --dtype: a100-pcie-80gb has no fp8 peak; use --dtype fp32 or bf16 or fp16 or int8"),
    (["estimate", "llama-3-8b", "--gpu", "h100-nvl", "--dtype", "fp16"],
     "error: --dtype: h100-nvl has no fp16 peak; its sources give no compute peak: add peak_tflops to its YAML "
     "from a datasheet, or use another GPU"),
])
def test_a_dtype_without_a_peak_is_refused_in_one_line(args, line):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.stderr.strip() == line, r.output


def test_a_gpu_without_fp32_times_vector_kernels_on_bytes():
    # B300: no fp32 peak in any source. An RMSNorm over [4096, 4096] bf16 is bounded by its bytes alone:
    # memory_s = bytes / 7.75e12 B/s, compute_s 0; and the run says why.
    r = runner.invoke(app, ["op", "rmsnorm", "--gpu", "b300", "--tokens", "4096", "--hidden", "4096", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["compute_s"] == 0 and d["memory_s"] == d["bytes"] / 7.75e12 and d["time_s"]["roofline"] == d["memory_s"]
    # The table (not --json: stdout stays data) says why; an H100 SXM (fp32 67 TFLOP/s) says nothing of the kind.
    args = ["op", "rmsnorm", "--tokens", "4096", "--hidden", "4096", "--gpu"]
    assert "b300 has no fp32 (vector) peak" in runner.invoke(app, [*args, "b300"]).stderr
    assert "fp32 (vector)" not in runner.invoke(app, [*args, "h100"]).stderr


def test_calibrated_without_an_efficiency_block_is_the_roofline():
    # As for the shipped GPUs without a block (lmcost.apps.setup.say_uncalibrated): calibrated = roofline, said.
    # (GB200 has had a block since issue 25's engine fit: A100 PCIe 80GB has none.)
    args = ["op", "gemm", "--gpu", "a100-pcie-80gb", "--m", "4096", "--n", "4096", "--k", "4096"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    t = json.loads(r.stdout)["time_s"]
    # 2mnk FLOPs at A100 PCIe 80GB's dense bf16 312 TFLOP/s ([g]); its 3 x 4096^2 x 2 bytes take 52 us at 1.935 TB/s.
    assert t["calibrated"] == t["roofline"] == 2 * 4096 ** 3 / 312e12
    assert "a100-pcie-80gb has no efficiency block" in runner.invoke(app, args).stderr


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    # [c] (aiconfigurator-core systems/gb200.yaml): 72 GPUs per rack, NVLink 900 GB/s per GPU per direction
    # (GB200's 1800 GB/s bidirectional halved), CX8 XDR 800 Gb/s between racks, 100 GB/s per GPU per direction.
    from lmcost.hardware.cluster import default_cluster, load_cluster

    c = load_cluster("nvl72")
    assert (c.name, c.gpu, c.gpus_per_node) == ("gb200-nvl72", "gb200", 72) and default_cluster("gb200") == c
    assert c.intra.bandwidth == load_gpu("gb200").interconnect_gb_s / 2 * 1e9 == 900e9
    assert c.inter.node_bandwidth / c.gpus_per_node == 800e9 / 8 == 100e9
    assert (c.level(72), c.level(73)) == ("intra", "inter")


def test_gpus_show_prints_source_letters():
    # "[c]" is a source letter of gpu-specs.md, not rich markup: it was swallowed before escaping.
    r = runner.invoke(app, ["gpus", "show", "gb200"])
    assert r.exit_code == 0 and "[c] aiconfigurator-core" in r.stdout and "peak fp4 (dense)" in r.stdout
