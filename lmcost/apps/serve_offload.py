"""KV offload tiers for ``lmcost serve --kv-offload``: CPU DRAM and local NVMe below the GPU's prefix cache,
sized and timed from the node file's ``host:`` block (:class:`lmcost.hardware.cluster.Host`) or by hand.

Forms (one tier, or ``cpu`` and ``disk`` joined by a comma, CPU first): ``cpu:SIZE[:GBPS]`` (the original form,
:func:`lmcost.apps.serve_prefix.parse_offload`, its numbers unchanged), ``cpu`` / ``cpu::GBPS`` (SIZE from the
node: :data:`HOST_MEMORY_FRACTION` of its system memory, split evenly over its GPUs), ``disk[:SIZE[:GBPS]]``
(SIZE from the node: :data:`NVME_FRACTION` of its NVMe data cache per GPU; GBPS from the node's NVMe read
bandwidth per GPU). A CPU tier's GBPS defaults to the node's host link per direction, else PCIe Gen5 x16
(:data:`lmcost.apps.serve_prefix.HOST_LINK_BYTES_S`). ``cpu,disk``: blocks evicted from the GPU go to the CPU
tier, blocks evicted from it spill to the disk tier (the blocks after the CPU tier's in the id's chain), LRU
in each, as LMCache's local CPU backend spills to its local disk backend and SGLang's HiCache keeps an L3
below its host L2. A hit in a tier costs its bytes / that tier's bandwidth (:class:`PrefixCache` loads them
before the request's first chunk); no measured load rate of either tier is modelled: the figures are the
datasheets' peaks or the ones given.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from lmcost.apps.serve_prefix import HOST_LINK_BYTES_S, parse_offload
from lmcost.basics.errors import LmcostError
from lmcost.hardware.cluster import Host

#: Share of a node's system memory the CPU tier takes when no SIZE is given, split evenly over its GPUs. A
#: choice, not a published default: no engine we know documents a share of the node (vLLM's
#: ``kv_offloading_size`` and LMCache's ``max_local_cpu_size`` are sizes given by hand); the other half is
#: left to the OS, the engine's processes, the weights' staging copies and pinned transfer buffers.
HOST_MEMORY_FRACTION = 0.5
#: Share of a node's NVMe data cache the disk tier takes when no SIZE is given: all of it (a choice; the
#: datasheets name these drives the node's data cache, the OS sits on separate M.2 drives).
NVME_FRACTION = 1.0
_FORMS = ("give cpu, cpu:SIZE[:GBPS], disk[:SIZE[:GBPS]] or cpu,disk (e.g. cpu:256G, cpu::50, disk:1T:6, cpu,disk; "
          "binary units; GB/s per direction)")


class Tiers(NamedTuple):
    """The tiers of ``--kv-offload`` per GPU: bytes and bytes/s of the CPU tier (0 bytes: none) and of the disk
    tier (0 bytes: none), the tiers given (``("cpu", "disk")``) and where each figure came from."""

    cpu_bytes: int
    cpu_bytes_s: float
    disk_bytes: int
    disk_bytes_s: float
    names: tuple
    sources: dict


def _tier(text: str, spec: str) -> tuple:
    """(name, bytes or None, bytes/s or None) of one tier's text."""
    m = re.fullmatch(r"(cpu|disk)(?::([0-9]+(?:\.[0-9]*)?)?([A-Za-z]*)(?::([0-9]+(?:\.[0-9]*)?))?)?", text,
                     flags=re.ASCII)
    if m is None or (m.group(2) is None and m.group(3)):
        raise LmcostError("kv_offload", f"{spec!r:.60}: {text!r:.30} is not a tier (cpu or disk, then :SIZE, :GBPS)",
                          _FORMS)
    name, num, unit, gbps = m.groups()
    size = None
    if num is not None:  # the same units and bounds as the original form
        size, _ = parse_offload(f"cpu:{num}{unit}")
    bw = None if gbps is None else parse_offload(f"cpu:1:{gbps}")[1]
    return name, size, bw


def _share(total: float | None, cluster, what: str, key: str, name: str) -> float:
    if total is None:
        node = f"the node file {cluster.name!r}" if cluster is not None else "this GPU has no node file: it"
        raise LmcostError("kv_offload", f"{node} gives no {what} ({key} under host:), so "
                          f"the {name} tier's figure cannot come from it",
                          f"give it by hand ({name}:SIZE:GBPS; an empty part keeps the node's, e.g. {name}::GBPS), or a "
                          f"cluster whose host: block gives {key}")
    return total / cluster.gpus_per_node


def parse_tiers(spec: str, cluster) -> tuple:
    """The tiers of ``spec`` on ``cluster`` (:class:`lmcost.hardware.cluster.Cluster`; None: a GPU with no
    node file, whose tiers are given by hand) for one GPU: a lone
    ``cpu:SIZE[:GBPS]`` as :func:`lmcost.apps.serve_prefix.parse_offload`'s (bytes, bytes/s), number for
    number; any other form as :class:`Tiers`. A node share is floor(node figure x fraction / gpus_per_node)
    bytes (DGX H100, 2 TB = 2,048 GiB and 8 GPUs: CPU 128 GiB, disk 30.72 TB / 8 = 3.84 TB per GPU).
    Raises: LmcostError naming ``kv_offload`` for a form not in the module docstring, a tier twice or disk
    before cpu, a figure the node file does not give (memory, NVMe capacity or read bandwidth) and no
    figure by hand, or a SIZE past the node's whole share per GPU (where the node gives it)."""
    text = str(spec).strip()
    parts = [t.strip() for t in text.split(",")]
    if re.fullmatch(r"cpu:[^,]*", text) and not text.startswith("cpu::"):
        legacy = parse_offload(text)
        if cluster is not None:
            _check_size("cpu", legacy[0], cluster.host.memory_gib and cluster.host.memory_gib * 2**30, cluster, spec)
        return legacy
    tiers = [_tier(t, text) for t in parts]
    names = tuple(t[0] for t in tiers)
    if names not in (("cpu",), ("disk",), ("cpu", "disk")):
        raise LmcostError("kv_offload", f"{spec!r:.60} names {', '.join(names)}: each tier once, cpu before disk",
                          _FORMS)
    h, out, src = cluster.host if cluster is not None else Host(), dict(cpu=(0, HOST_LINK_BYTES_S), disk=(0, HOST_LINK_BYTES_S)), {}
    for name, size, bw in tiers:
        if name == "cpu":
            node = h.memory_gib * 2**30 if h.memory_gib else None
            if size is None:
                size = math.floor(HOST_MEMORY_FRACTION * _share(node, cluster, "system memory", "memory_gib", name))
                src["cpu_bytes"] = f"{cluster.name} host.memory_gib x {HOST_MEMORY_FRACTION} / {cluster.gpus_per_node} GPUs"
            if bw is None:
                bw = h.link_gb_s * 1e9 if h.link_gb_s else HOST_LINK_BYTES_S
                src["cpu_bytes_s"] = (f"{cluster.name} host.link_gb_s" if h.link_gb_s else
                                      "PCIe Gen5 x16 per direction (the node file gives no host link)")
        else:
            node = h.nvme_tb * 1e12 if h.nvme_tb else None
            if size is None:
                size = math.floor(NVME_FRACTION * _share(node, cluster, "NVMe capacity", "nvme_tb", name))
                src["disk_bytes"] = f"{cluster.name} host.nvme_tb x {NVME_FRACTION} / {cluster.gpus_per_node} GPUs"
            if bw is None:
                read = h.nvme_read_gb_s * 1e9 if h.nvme_read_gb_s else None
                bw = _share(read, cluster, "NVMe read bandwidth", "nvme_read_gb_s", name)
                src["disk_bytes_s"] = f"{cluster.name} host.nvme_read_gb_s / {cluster.gpus_per_node} GPUs"
        if cluster is not None:
            _check_size(name, size, node, cluster, spec)
        out[name] = (size, bw)
    return Tiers(out["cpu"][0], out["cpu"][1], out["disk"][0], out["disk"][1], names, src)


def _check_size(name: str, size: int, node: float | None, cluster, spec: str) -> None:
    if node and size > node / cluster.gpus_per_node:
        raise LmcostError("kv_offload", f"{spec!r:.60}: the {name} tier's {size:,} B per GPU is more than the node's "
                          f"{node / cluster.gpus_per_node:,.0f} B per GPU ({cluster.name}, {cluster.gpus_per_node} GPUs)",
                          f"give a smaller SIZE, or {name} alone for the node's share")

