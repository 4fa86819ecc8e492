"""Clusters as data: a node (GPUs, intra-node fabric) and the network between nodes, read from YAML.

A file keeps its datasheet units in the key names (``bandwidth_gb_s`` in 10^9 B/s per GPU per direction,
``nic_gbit_s`` in 10^9 bit/s per NIC, ``latency_us``); the models expose base units (B/s, s).
Shipped files live in ``lmcost/data/clusters/`` (``lmcost/data/hardware/clusters`` in a wheel) and are
found by exact name or alias (``--cluster dgx-h100``). ``collectives`` holds the fitted figures of the
collective time model (:mod:`lmcost.cost.collectives`, written by ``lmcost fit --collectives``).

Placement: a group of n ranks sits on consecutive GPUs, so it spans ceil(n / gpus_per_node) nodes and
stays inside one node (the ``intra`` level) when n <= gpus_per_node; otherwise it spans the network
(``inter``).
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
                        "pcie3", "pcie4", "pcie5"]
    bandwidth_gb_s: float = Field(ge=1, le=1e4)  # per GPU, per direction
    latency_us: float = Field(ge=0.01, le=1e3)  # one hop, the roofline's latency term
    nvls: bool = False  # NVLink SHARP (NVSwitch in-network reduction; NCCL's NVLS algorithm)

    @property
    def bandwidth(self) -> float:
        """Bytes/s per GPU per direction."""
        return self.bandwidth_gb_s * 1e9


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


class Cluster(BaseModel):
    """A node type (and the network joining nodes of that type)."""

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
    sources: list[str] = []
    notes: str = ""

    def nodes_for(self, n_ranks: int) -> int:
        """Nodes a group of ``n_ranks`` on consecutive GPUs spans: ceil(n / gpus_per_node)."""
        return max(1, math.ceil(n_ranks / self.gpus_per_node))

    def level(self, n_ranks: int, nodes: int | None = None) -> Literal["intra", "inter"]:
        """The slowest level a group spans: ``intra`` inside one node, ``inter`` across the network."""
        return "intra" if (nodes or self.nodes_for(n_ranks)) == 1 else "inter"


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
    return c


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
DEFAULT_NODE = {"a100-80gb": "dgx-a100", "a100-40gb": "dgx-a100", "h100-sxm": "dgx-h100", "h200": "hgx-h200",
                "b200": "dgx-b200", "h100-pcie": "h100-pcie-pair", "gb200": "gb200-nvl72"}


def default_cluster(gpu: str) -> Cluster:
    """The node assumed for ``gpu`` (a shipped name, alias or GPU YAML path) when no cluster is given.

    Raises: LmcostError (one line) for a GPU with no shipped node: communication cannot be timed on it.
    """
    name = load_gpu(gpu).name
    if name not in DEFAULT_NODE:
        raise LmcostError("default_cluster.gpu", f"no shipped node of {name}, so its communication cannot be timed",
                          f"give `cluster` (a YAML, or one of: {', '.join(cluster_names())})")
    return load_cluster(DEFAULT_NODE[name])
