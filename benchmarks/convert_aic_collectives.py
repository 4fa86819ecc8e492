"""Convert aiconfigurator-core 0.12.0's measured collective tables into
lmcost/data/measurements/engine-collectives.csv (what and how: engine-collectives.md).

Reads, under an unpacked wheel (``--root``, default /tmp/aic/x/aiconfigurator_core):
- ``systems/data/<gpu>/comm/nccl/<ver>/nccl_perf.parquet``: nccl-tests all_reduce on one node (2/4/8 GPUs);
  only ``op_name == all_reduce`` with ``nccl_dtype == half`` is kept (see the .md for why);
- ``systems/data/<gpu>/comm/<engine>/<ver>/custom_allreduce_perf.parquet`` (engine: vllm, sglang, trtllm):
  the engine's own all-reduce; for vLLM and SGLang only the CUDA-graph rows (kernel_source ending ``_graph``),
  as engines run decode under CUDA graphs; TRT-LLM has one kernel_source (``TRTLLM``).

Units: ``latency`` is milliseconds; ``message_size`` is a count of elements (aiconfigurator builds the op
from ``num_elements_per_token`` x tokens; the bytes are elements x 2 for half / bfloat16: checked in the .md
against nccl-tests busbw on the same GPU). Duplicate (size, ranks) rows of one file are reduced to their
median. Needs pandas + pyarrow (not package dependencies): run with /work/main/.venv/bin/python.

    python benchmarks/convert_aic_collectives.py [--root DIR] [--out lmcost/data/measurements/engine-collectives.csv]
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import sys

import pandas as pd

WHEEL = "aiconfigurator-core 0.12.0"
DEVICE = {"a100_sxm": "NVIDIA A100-SXM4-80GB", "h100_sxm": "NVIDIA H100 80GB HBM3 (SXM)", "h200_sxm": "NVIDIA H200 (SXM)",
          "b200_sxm": "NVIDIA B200", "b300_sxm": "NVIDIA B300 SXM6 AC", "gb200": "NVIDIA GB200",
          "gb300": "NVIDIA GB300", "l40s": "NVIDIA L40S", "rtx_pro_6000_server": "NVIDIA RTX PRO 6000 Blackwell Server",
          "a100_pcie": "NVIDIA A100 PCIe", "h100_pcie": "NVIDIA H100 PCIe", "l4": "NVIDIA L4", "a30": "NVIDIA A30"}
COLUMNS = ["collective", "n_gpus", "n_nodes", "gpus_per_node", "device", "interconnect", "dtype", "message_bytes", "time_us",
           "algbw_gb_s", "busbw_gb_s", "nccl_version", "source", "notes", "engine", "engine_version", "kernel"]
BYTES = {"half": 2, "bfloat16": 2, "float16": 2}


def _node(root: str, gpu: str) -> tuple[int, str]:
    """GPUs per node and the intra-node link text of aiconfigurator's system file of ``gpu``."""
    text = open(os.path.join(root, "systems", f"{gpu}.yaml")).read()
    per_node = int(re.search(r"num_gpus_per_node:\s*(\d+)", text).group(1))
    bw = float(re.search(r"intra_node_bw:\s*([0-9.e+]+)", text).group(1))
    link = "PCIe" if bw < 1e11 else "NVLink"
    return per_node, f"{link} ({bw / 1e9:g} GB/s per GPU per direction, aiconfigurator systems/{gpu}.yaml)"


def _rows(root: str, path: str, engine: str, version: str, kernel_filter) -> list[dict]:
    gpu = path.split("/systems/data/")[1].split("/")[0]
    per_node, link = _node(root, gpu)
    d = pd.read_parquet(path)
    d = d[d["op_name"] == "all_reduce"]
    d = kernel_filter(d)
    rel = "aiconfigurator_core/" + path.split("/aiconfigurator_core/")[1]
    out = []
    dt_col = "nccl_dtype" if "nccl_dtype" in d.columns else "allreduce_dtype"
    for (kernel, dtype, n, elems), g in d.groupby(["kernel_source", dt_col, "num_gpus", "message_size"]):
        if dtype not in BYTES or n > per_node:
            continue
        size = int(elems) * BYTES[dtype]
        t_us = float(g["latency"].median()) * 1e3
        algbw = size / (t_us * 1e-6) / 1e9
        out.append(dict(
            collective="all_reduce", n_gpus=int(n), n_nodes=1, gpus_per_node=per_node, device=DEVICE.get(gpu, gpu),
            interconnect=link, dtype=dtype, message_bytes=size, time_us=f"{t_us:.4g}", algbw_gb_s=f"{algbw:.4g}",
            busbw_gb_s=f"{algbw * 2 * (n - 1) / n:.4g}", nccl_version=version if engine == "nccl" else "not stated",
            source=f"{WHEEL}: {rel}",
            notes=f"{int(elems)} el x {BYTES[dtype]} B{f'; median of {len(g)}' if len(g) > 1 else ''}",
            engine=engine, engine_version=version, kernel=kernel))
    return out


def convert(root: str) -> list[dict]:
    """Every row kept, nccl tables first, then engine custom all-reduce; sorted within each file."""
    rows = []
    for p in sorted(glob.glob(os.path.join(root, "systems/data/*/comm/nccl/*/nccl_perf.parquet"))):
        rows += _rows(root, p, "nccl", p.split("/")[-2], lambda d: d)
    for eng in ("vllm", "sglang", "trtllm"):
        for p in sorted(glob.glob(os.path.join(root, f"systems/data/*/comm/{eng}/*/custom_allreduce_perf.parquet"))):
            graph_only = (lambda d: d[d["kernel_source"].str.endswith("_graph")]) if eng != "trtllm" else (lambda d: d)
            rows += _rows(root, p, eng, p.split("/")[-2], graph_only)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/aic/x/aiconfigurator_core")
    ap.add_argument("--out", default="lmcost/data/measurements/engine-collectives.csv")
    a = ap.parse_args(argv)
    rows = convert(a.root)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {len(rows)} rows to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
