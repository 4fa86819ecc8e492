"""Clusters as data: a node (GPUs, intra-node fabric) and the network between nodes, read from YAML.

A file keeps its datasheet units in the key names (``bandwidth_gb_s`` in 10^9 B/s per GPU per direction,
``nic_gbit_s`` in 10^9 bit/s per NIC, ``latency_us``); the models expose base units (B/s, s).
Shipped files live in ``lmcost/data/clusters/`` (``lmcost/data/hardware/clusters`` in a wheel) and are
found by exact name or alias (``--cluster dgx-h100``). ``collectives`` holds the fitted figures of the
collective time model (:mod:`lmcost.cost.collectives`, written by ``lmcost fit --collectives``).

Placement: a group of n ranks sits on consecutive GPUs, so it spans ceil(n / gpus_per_node) nodes and
stays inside one node (the ``intra`` level) when n <= gpus_per_node; otherwise it spans the network
(``inter``). Two optional node features change the fabric a group inside one node sees
(:meth:`Cluster.for_group`): ``intra.mesh_link_gb_s``, a fully connected mesh of point-to-point links (AMD
xGMI), where a group of n ranks reaches only its n - 1 links; and ``island``, GPUs bridged inside a PCIe
node (NVLink bridges on pairs), where a group inside one island runs on the bridge.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmcost.basics import shipped as resources
from lmcost.basics.errors import LmcostError, from_validation_error
from lmcost.basics.files import read_mapping
from lmcost.hardware.gpu import gpu_names
from lmcost.hardware.gpu import load_gpu

#: Where shipped cluster files live, relative to the data root (``lmcost/data/clusters``).
KIND = "clusters"

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
Fraction = Annotated[float, Field(gt=0, le=1)]
Scale = Annotated[float, Field(gt=0, le=100)]


class IntraFabric(BaseModel):
    """The fabric inside a node. Bounds: 1 to 10,000 GB/s per GPU per direction (PCIe Gen3 x8 to far
    beyond NVLink5), 0.01 to 1,000 us per hop."""

    model_config = _STRICT
    name: str
    # fitted figures are per generation; the names are a closed list (a typo would silently take priors)
    generation: Literal["nvlink2", "nvlink3", "nvlink4", "nvlink5", "nvlink3-bridge", "nvlink4-bridge",
                        "pcie3", "pcie4", "pcie5", "xgmi"]
    bandwidth_gb_s: float = Field(ge=1, le=1e4)  # per GPU, per direction
    latency_us: float = Field(ge=0.01, le=1e3)  # one hop, the roofline's latency term
    nvls: bool = False  # NVLink SHARP (NVSwitch in-network reduction; NCCL's NVLS algorithm)
    # A fully connected mesh (AMD xGMI): GB/s of one GPU-to-GPU link per direction; None: a switched fabric
    mesh_link_gb_s: Optional[float] = Field(default=None, ge=1, le=1e4)

    @property
    def bandwidth(self) -> float:
        """Bytes/s per GPU per direction."""
        return self.bandwidth_gb_s * 1e9

    def for_ranks(self, n_ranks: int) -> "IntraFabric":
        """The fabric as a group of ``n_ranks`` GPUs of one node sees it. On a full mesh each GPU reaches the
        group over its n - 1 direct links, so min(bandwidth_gb_s, (n - 1) x mesh_link_gb_s) GB/s per
        direction (MI300X: 7 links of 64 GB/s per direction each; 2 ranks 64, 8 ranks 448); a switched
        fabric is the same for every group."""
        if self.mesh_link_gb_s is None or n_ranks < 2:
            return self
        bw = min(self.bandwidth_gb_s, (n_ranks - 1) * self.mesh_link_gb_s)
        return self if bw == self.bandwidth_gb_s else self.model_copy(update={"bandwidth_gb_s": bw})


class Network(BaseModel):
    """The network between nodes. Bounds: 1 to 128 NICs per node (72 on a GB200 NVL72 rack, one per GPU),
    1 to 10,000 Gb/s per NIC, 0.1 to 1,000 us."""

    model_config = _STRICT
    name: str
    # fitted figures are per kind (a closed list, as the generations are)
    kind: Literal["infiniband-hdr", "infiniband-ndr", "infiniband-xdr", "efa", "roce", "gpudirect-tcpx",
                  "gpudirect-tcpxo"]
    nics_per_node: int = Field(ge=1, le=128)
    nic_gbit_s: float = Field(ge=1, le=1e4)  # per NIC, per direction
    latency_us: float = Field(ge=0.1, le=1e3)  # one hop, the roofline's latency term

    @property
    def node_bandwidth(self) -> float:
        """Bytes/s per node per direction, all NICs together."""
        return self.nics_per_node * self.nic_gbit_s * 1e9 / 8


class IntraFigures(BaseModel):
    """Fitted figures of a node's fabric (one NVLink generation): efficiencies are fractions of the
    link bandwidth reached; latency scales multiply NCCL's latency model (:mod:`lmcost.cost.collectives`)."""

    model_config = _STRICT
    ring_latency_scale: Scale = 1.0
    nvls_latency_scale: Scale = 1.0
    ring: Fraction = 0.8
    nvls: Fraction = 0.6
    p2p: Fraction = 0.7
    ll: Fraction = 0.25  # LL protocol bandwidth as a fraction of Simple's
    fill_mb: float = Field(default=4.0, ge=0, le=1e4)  # MB over which the Simple pipeline fills
    p2p_latency_scale: Scale = 1.0  # on NCCL's point-to-point latency (send/recv)
    p2p_fill_mb: float = Field(default=0.5, ge=0, le=1e4)  # send/recv pipeline fill (NCCL_P2P_NVL_CHUNKSIZE 512 KiB)
    rows: str = ""


class InterFigures(BaseModel):
    """Fitted figures of the network: fraction of the NICs' line rate reached, scale on NCCL's latencies."""

    model_config = _STRICT
    latency_scale: Scale = 1.0
    efficiency: Fraction = 0.92
    fill_mb: float = Field(default=0.0, ge=0, le=1e5)  # MB over which a Simple pipeline over the network fills
    rows: str = ""


def _band_pair(v: list) -> list:
    if len(v) != 2 or not (0 < v[0] <= 1 <= v[1] <= 100):
        raise ValueError("a band is [low, high] with 0 < low <= 1 <= high <= 100; e.g. [0.8, 1.5]")
    return v


class Band(BaseModel):
    """Held-out ratio measured / calibrated, 5th and 95th percentiles, per regime."""

    model_config = _STRICT
    latency: list[float] = [1.0, 1.0]
    bandwidth: list[float] = [1.0, 1.0]

    @field_validator("latency", "bandwidth")
    @classmethod
    def _pair(cls, v: list) -> list:
        return _band_pair(v)


class EngineAllReduce(BaseModel):
    """An engine's own all-reduce on this node's NVLink (:mod:`lmcost.cost.engine_allreduce`): one- and
    two-shot latencies (us), the fraction of the NVLink bandwidth reached, the size up to which the engine
    runs it (MiB; NCCL above), and the held-out band [low, high] of measured / predicted."""

    model_config = _STRICT
    one_shot_us: float = Field(gt=0, le=1e4)
    two_shot_us: float = Field(gt=0, le=1e4)
    efficiency: Fraction
    max_mb: float = Field(default=8.0, gt=0, le=1e5)
    band: list[float] = [1.0, 1.0]
    rows: str = ""

    @field_validator("band")
    @classmethod
    def _pair(cls, v: list) -> list:
        return _band_pair(v)


class CollectiveFigures(BaseModel):
    """The fitted block of a cluster file."""

    model_config = _STRICT
    intra: IntraFigures = IntraFigures()
    inter: InterFigures = InterFigures()
    engines: dict[Literal["vllm", "sglang", "trtllm"], EngineAllReduce] = {}
    band: Band = Band()
    sources: dict[str, str] = {}
    fit: dict = {}


class Host(BaseModel):
    """A node's host side, as its datasheet gives it (a figure the datasheet lacks is left out: None).
    ``memory_gib``: system memory per node (GiB; DIMMs are binary, a datasheet's "2TB" is 2,048 GiB);
    ``link_generation`` and ``link_gb_s``: each GPU's host link (10^9 B/s per direction); ``nvme_tb``: local
    NVMe data-cache capacity per node (10^12 B, as drives are sold); ``nvme_read_gb_s``: its sequential read
    bandwidth per node (10^9 B/s). Read by ``lmcost serve --kv-offload`` (:mod:`lmcost.apps.serve_offload`)."""

    model_config = _STRICT
    memory_gib: Optional[float] = Field(default=None, gt=0, le=2**20)
    link_generation: Optional[Literal["pcie3", "pcie4", "pcie5", "pcie6", "nvlink-c2c"]] = None
    link_gb_s: Optional[float] = Field(default=None, ge=1, le=1e4)  # per GPU, per direction
    nvme_tb: Optional[float] = Field(default=None, gt=0, le=1e4)
    nvme_read_gb_s: Optional[float] = Field(default=None, gt=0, le=1e4)


class Island(BaseModel):
    """GPUs inside a node joined by a faster fabric than the node's (NVLink bridges on pairs of PCIe GPUs):
    ``gpus`` consecutive GPUs (aligned: GPUs 0-1, 2-3, ... for pairs) bridged together, whose fabric and
    fitted figures are those of the shipped cluster ``cluster`` (a node of exactly one island)."""

    model_config = _STRICT
    gpus: int = Field(ge=2, le=1024)
    cluster: str


class Cluster(BaseModel):
    """A node type (and the network joining nodes of that type). ``library``: the collective library its
    GPUs run (NCCL on NVIDIA, RCCL, AMD's fork of NCCL with the same algorithms, on AMD); ``island``: bridged
    GPUs inside the node, or None."""

    model_config = _STRICT
    name: str
    aliases: list[str] = []
    description: str = ""
    gpu: str  # a shipped GPU name (lmcost/data/gpus/*.yaml)
    gpus_per_node: int = Field(ge=1, le=1024)
    intra: IntraFabric
    inter: Optional[Network] = None
    collectives: CollectiveFigures = CollectiveFigures()
    host: Host = Host()  # system memory, host links, local NVMe (the KV offload tiers' figures)
    library: Literal["nccl", "rccl"] = "nccl"
    island: Optional[Island] = None
    sources: list[str] = []
    notes: str = ""

    def nodes_for(self, n_ranks: int) -> int:
        """Nodes a group of ``n_ranks`` on consecutive GPUs spans: ceil(n / gpus_per_node)."""
        return max(1, math.ceil(n_ranks / self.gpus_per_node))

    def level(self, n_ranks: int, nodes: int | None = None) -> Literal["intra", "inter"]:
        """The slowest level a group spans: ``intra`` inside one node, ``inter`` across the network."""
        return "intra" if (nodes or self.nodes_for(n_ranks)) == 1 else "inter"

    def for_group(self, n_ranks: int, nodes: int | None = None, stride: int = 1) -> "Cluster":
        """This cluster as a group of ``n_ranks`` ranks, ``stride`` GPUs apart, over ``nodes`` nodes (default
        ceil(n_ranks / gpus_per_node)) sees it, for :func:`lmcost.cost.collectives.collective`:

        - inside one island (the group spans (n - 1) x stride + 1 <= island.gpus GPUs): the island's cluster
          (an H100 NVL pair on its NVLink bridge, not the node's PCIe);
        - otherwise inside one node: the node with its fabric as n ranks see it (:meth:`IntraFabric.for_ranks`:
          on a full xGMI mesh, n - 1 links);
        - across nodes: the cluster unchanged (the network bounds it).

        Raises: LmcostError from loading the island's cluster (checked when this cluster was loaded)."""
        if (nodes or self.nodes_for(n_ranks)) != 1 or n_ranks < 2:
            return self
        if self.island is not None and (n_ranks - 1) * stride + 1 <= self.island.gpus:
            return load_cluster(self.island.cluster)
        fabric = self.intra.for_ranks(n_ranks)
        return self if fabric is self.intra else self.model_copy(update={"intra": fabric})


def load_cluster(name_or_path: str | Path) -> Cluster:
    """A cluster by shipped name or alias (``dgx-h100``), or from a YAML path.

    Raises: LmcostError for an unknown name (listing the known ones), a missing or invalid file, or a
    ``gpu:`` that names no shipped GPU.
    """
    path = resources.locate(KIND, name_or_path, "cluster", "cluster", cluster_names())
    data = read_mapping(path)
    try:
        c = Cluster.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, str(path)) from None
    if resources.find("gpus", c.gpu) is None:
        raise LmcostError(f"{path}: gpu", f"{c.gpu!r} is not a shipped GPU", f"use one of: {', '.join(gpu_names())}")
    if c.island is not None:
        _check_island(c, path)
    return c


def _check_island(c: Cluster, path) -> None:
    """An island fits in the node whole times, two or more of them, and names a shipped cluster of the same
    GPU, one island wide, itself without an island."""
    isl = c.island
    if isl.gpus >= c.gpus_per_node or c.gpus_per_node % isl.gpus:
        raise LmcostError(f"{path}: island.gpus", f"{isl.gpus} does not divide the node's {c.gpus_per_node} GPUs into "
                          "two or more islands", f"give a divisor of {c.gpus_per_node} below it")
    if resources.find(KIND, isl.cluster) is None:
        raise LmcostError(f"{path}: island.cluster", f"{isl.cluster!r} is not a shipped cluster",
                          f"use one of: {', '.join(cluster_names())}")
    inner = load_cluster(isl.cluster)
    if inner.island is not None or load_gpu(inner.gpu).name != load_gpu(c.gpu).name or inner.gpus_per_node != isl.gpus:
        raise LmcostError(f"{path}: island.cluster", f"{inner.name} is not one island of {isl.gpus} {c.gpu} GPUs",
                          f"name a cluster of {isl.gpus} {c.gpu} GPUs with no island of its own")


def cluster_from_text(text: str, where: str) -> Cluster:
    """A cluster from the text of a YAML not yet written (a fit): nothing half-valid gets written.
    Raises: LmcostError naming ``where`` and the field."""
    import yaml

    try:
        return Cluster.model_validate(yaml.safe_load(text))
    except ValidationError as e:
        raise from_validation_error(e, where) from None


def cluster_names() -> list[str]:
    """Names of the shipped clusters."""
    return resources.names(KIND)


def list_clusters() -> list[Cluster]:
    """Every shipped cluster, by name."""
    return [load_cluster(n) for n in cluster_names()]


#: The node lmcost assumes for a GPU given alone (``--gpu h100``): NVIDIA's own reference node of it.
#: The PCIe GPUs and AMD's have no NVIDIA reference node: the common 8-GPU server of each (its file says which).
DEFAULT_NODE = {"a100-80gb": "dgx-a100", "a100-40gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "hgx-h200",
                "b200": "dgx-b200", "h100-pcie": "h100-pcie-pair", "gb200": "gb200-nvl72",
                "a100-pcie-80gb": "a100-pcie-8gpu-nobridge", "h100-nvl": "h100-nvl-8gpu", "mi300x": "mi300x-8gpu",
                "mi355x": "mi355x-8gpu"}


def default_cluster(gpu: str) -> Cluster:
    """The node assumed for ``gpu`` (a shipped name, alias or GPU YAML path) when no cluster is given.

    Raises: LmcostError (one line) for a GPU with no shipped node: communication cannot be timed on it.
    """
    name = load_gpu(gpu).name
    if name not in DEFAULT_NODE:
        raise LmcostError("default_cluster.gpu", f"no shipped node of {name}, so its communication cannot be timed",
                          f"give `cluster` (a YAML, or one of: {', '.join(cluster_names())})")
    return load_cluster(DEFAULT_NODE[name])
