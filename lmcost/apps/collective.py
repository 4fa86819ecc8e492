"""``lmcost op collective`` as one call: one collective on a group of GPUs, on a named cluster or the node
assumed for a GPU, as a record in base units (:func:`collective_cost`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from lmcost.basics.errors import LmcostError
from lmcost.cost.collectives import collective
from lmcost.cost.engine_allreduce import ENGINES, custom_time, one_shot, runs_custom
from lmcost.hardware.engine_kernels import parse_engine
from lmcost.hardware.cluster import Cluster, default_cluster, load_cluster
from lmcost.hardware.gpu import load_gpu


def cluster_of(cluster: str | None, gpu_type: str | None) -> Cluster:
    """The cluster named, or the node assumed for ``gpu_type`` (h100 without either).

    Raises: LmcostError (gpu_type) if the cluster holds another GPU; the loaders' errors."""
    if cluster is None:
        return default_cluster(gpu_type or "h100")
    c = load_cluster(cluster)
    if gpu_type is not None and load_gpu(gpu_type).name != load_gpu(c.gpu).name:
        raise LmcostError("gpu_type", f"{cluster} holds {c.gpu}, not {load_gpu(gpu_type).name}",
                          "drop `gpu_type` or pick a cluster of that GPU")
    return c


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveCost:
    """A collective's cost: ``record`` (kind, gpus (ranks), nodes, cluster, gpu, level (intra/inter),
    algorithm, bytes, bus_factor, time_s (roofline, calibrated and its band; s), algbw_b_s = bytes /
    calibrated time, busbw_b_s = algbw x bus factor (B/s; nccl-tests' PERFORMANCE.md), bound),
    ``link``, the fabric it spans (the node's, or the network with its NICs), and ``notes``: lines for the
    user (stderr), not part of the record (an engine's all-reduce costed as the library's: why)."""

    record: dict
    link: str
    notes: tuple[str, ...] = ()


def _engine(text: str | None) -> tuple[str | None, str | None]:
    """(engine, version) of a collective's ``engine``: ``vllm``, ``vllm@0.24.0`` (estimate's and op's spelling) or
    ``vllm-0.11`` (serve's), any case; auto and torch (estimate's kernel choices: PyTorch's collectives are NCCL's)
    and None give (None, None), NCCL alone.

    Raises: LmcostError (engine) as :func:`lmcost.hardware.engine_kernels.parse_engine`: empty, an unknown engine,
    an empty version; a version after auto or torch; a version no shipped profile has (:func:`_shipped_version`)."""
    if text is None:
        return None, None
    name, dash, version = text.strip().rpartition("-")
    if "@" not in text and dash and name.strip().lower() in ENGINES:  # serve's name-version
        if not version.strip():
            raise LmcostError("engine", f"{text!r:.60} has an empty version", f"give {name.strip()} alone, or "
                              f"{name.strip()}-VERSION")
        text = f"{name}@{version}"
    name, version = parse_engine(text)
    if version is not None and name not in ("auto", "torch"):
        _shipped_version(name, version)
    return (None, None) if name in ("auto", "torch") else (name, version)


def _shipped_version(name: str, version: str) -> None:
    """Refuse ``version`` of engine ``name`` where no shipped profile has it: neither a GPU's kernel profile
    (``efficiency.engines.<name>.version``, what estimate, op gemm and train take) nor a scheduler profile
    (``lmcost/data/engines/<name>-<version>.yaml``, what serve takes); trailing ``.0`` parts are dropped
    (``0.11.0`` is ``0.11``), as serve reads them.

    Raises: LmcostError (engine) listing the versions there are."""
    from lmcost.hardware.engines import engine_names
    from lmcost.hardware.gpu import gpu_names

    def short(v: str) -> str:
        return re.sub(r"(\.0)+$", "", v.strip().lower())

    have = {n.rsplit("-", 1)[1] for n in engine_names() if n.rsplit("-", 1)[0].lower() == name}
    for g in map(load_gpu, gpu_names()):
        profile = g.efficiency.engines.get(name) if g.efficiency is not None else None
        have |= {profile.version} if profile is not None else set()
    if short(version) not in {short(v) for v in have}:
        listed = ", ".join(f"{name}@{v}" for v in sorted(have))
        raise LmcostError("engine", f"no shipped {name} profile is of {name} {version}",
                          f"use {listed}, or {name} alone")


def collective_cost(*, kind: str, size: int, ranks: int, gpu_type: str | None = None, cluster: str | None = None,
                    nodes: int | None = None, engine: str | None = None) -> CollectiveCost:
    """One collective of ``size`` bytes (nccl-tests' count) on ``ranks`` consecutive GPUs of
    ``cluster``, or of the node assumed for ``gpu_type``, on the fabric such a group sees
    (:meth:`lmcost.hardware.cluster.Cluster.for_group`: a bridged pair inside a PCIe node runs on its NVLink
    bridge; a group on an xGMI mesh on its n - 1 links). send_recv on n ranks is nccl-tests'
    sendrecv_perf: every rank sends ``size`` to the next and receives from the previous at once; its time
    is one pair's, the same for any n inside one node; a group over nodes has pairs that cross the network.

    ``engine`` (vllm, sglang, trtllm; None: NCCL alone): an all_reduce as that engine runs it: its own
    custom all-reduce (:mod:`lmcost.cost.engine_allreduce`, figures fitted per NVLink generation in the
    cluster file) up to its switch-over size on 2/4/6/8 ranks of one NVLink node, NCCL otherwise; the record
    then carries ``engine``. Other kinds run on NCCL (RCCL on an AMD node) under any engine: vLLM's
    custom_all_reduce, and SGLang's and TRT-LLM's one-shot/two-shot kernels, are all-reduces; ``notes`` says so
    once. An all_reduce on a cluster whose
    file has no figures for that engine's custom all-reduce (they are fitted on NVSwitch nodes only: not an
    xGMI mesh, a PCIe node or an NVLink-bridged pair) is costed as the node's library's (NCCL, RCCL), and ``notes`` says so.

    Raises: LmcostError (engine) as :func:`_engine` (which spellings it takes); (ranks) for fewer than two ranks; (payload_bytes) for a size below one byte or
    more than one GPU of the cluster holds: nccl-tests' count is what each rank holds (all_reduce and
    broadcast: the buffer; all_gather: its output; reduce_scatter: its input; all_to_all, send_recv: what
    one rank sends), so a payload past one GPU's memory (64 TB on 80 GB GPUs) runs on no group of any
    size; the errors of :func:`cluster_of` and :func:`lmcost.cost.collectives.collective`.
    """
    if ranks < 2:  # one rank has no one to send to: NCCL's collective on one rank is a local copy
        raise LmcostError("ranks", f"{ranks} rank{'s' * (ranks != 1)}: a collective over fewer than 2 GPUs moves "
                          "nothing between GPUs", "give 2 or more")
    c = cluster_of(cluster, gpu_type)
    hw = load_gpu(c.gpu)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise LmcostError("payload_bytes", f"must be a whole number of bytes >= 1, got {size!r}", "give the payload")
    if size > hw.memory_bytes:
        raise LmcostError("payload_bytes", f"{size / 1e9:.4g} GB is more than one {hw.name} holds ({hw.memory_gb:g} GB), "
                          "and nccl-tests' count is what each rank holds", f"give at most {int(hw.memory_bytes // 2**30)}G")
    eng, version = _engine(engine)
    # the fabric a group of consecutive GPUs sees: a bridged pair's NVLink, n - 1 links of an xGMI mesh
    col = collective(kind.strip().lower(), ranks, c.for_group(ranks, nodes), nodes)
    seen = col.cluster
    t = col.times(float(size))
    algorithm = col.choice(float(size))
    bound = col.bound(float(size))
    fig = c.collectives.engines.get(eng) if eng is not None and col.kind == "all_reduce" else None
    notes = ()
    if version is not None and col.kind == "all_reduce":
        notes = (f"note: {eng}'s custom all-reduce figures are fitted on every {eng} version of aiconfigurator's tables "
                 f"pooled, not on {version} alone",)
    if eng is not None and col.kind != "all_reduce":  # the engines' own collective is the all-reduce alone
        lib = c.library.upper()
        notes += (f"note: {eng}'s own collective kernel is an all-reduce (its custom all-reduce); its {col.kind} "
                  f"runs on {lib}: the time is {lib}'s",)
    if eng is not None and col.kind == "all_reduce" and fig is None:
        notes += (f"note: {c.name} has no {eng} custom all-reduce figures for its fabric ({seen.intra.name}; they are "
                 f"fitted on NVSwitch nodes): {c.library.upper()}'s all_reduce is costed",)
    if fig is not None and runs_custom(col.n_ranks, col.nodes, seen.intra.generation.startswith("nvlink"), size, fig.max_mb * 2**20):
        cal = custom_time(col.n_ranks, float(size), seen.intra.bandwidth, fig.one_shot_us, fig.two_shot_us, fig.efficiency)
        cal = max(cal, t["roofline_s"])
        t = dict(roofline_s=t["roofline_s"], calibrated_s=cal, calibrated_low_s=max(cal * fig.band[0], t["roofline_s"]),
                 calibrated_high_s=cal * fig.band[1])
        algorithm = f"{eng} custom/{'one-shot' if one_shot(col.n_ranks, size) else 'two-shot'}"
        lat = (fig.one_shot_us if one_shot(col.n_ranks, size) else fig.two_shot_us) * 1e-6
        bound = "latency" if lat >= cal - lat else "bandwidth"
    cal = t["calibrated_s"]
    algbw = size / cal if cal > 0 else 0.0
    link = seen.intra.name if col.level == "intra" else \
        f"{c.inter.name} ({c.inter.nics_per_node} x {c.inter.nic_gbit_s:g} Gb/s per node)"
    record = dict(kind=col.kind, gpus=col.n_ranks, nodes=col.nodes, cluster=c.name, gpu=c.gpu, level=col.level,
                  algorithm=algorithm, bytes=size, bus_factor=col.bus_factor(),
                  time_s=dict(roofline=t["roofline_s"], calibrated=cal, calibrated_low=t["calibrated_low_s"],
                              calibrated_high=t["calibrated_high_s"]),
                  algbw_b_s=algbw, busbw_b_s=algbw * col.bus_factor(), bound=bound)
    if eng is not None:
        record["engine"] = eng
    return CollectiveCost(link=link, record=record, notes=notes)

