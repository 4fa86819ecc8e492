"""Time of one collective (all-reduce, all-gather, reduce-scatter, all-to-all, send/recv, broadcast) on a
group of GPUs placed on consecutive GPUs of a cluster (:mod:`lmcost.hardware.cluster`).

Payload (``size``, bytes) follows nccl-tests: all_reduce and broadcast the buffer; all_gather the total
output; reduce_scatter the total input; all_to_all the bytes one rank sends, to itself included;
send_recv the bytes one rank sends. algbw = size / time; busbw = algbw x :func:`bus_factor`
(nccl-tests doc/PERFORMANCE.md): all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
send_recv, broadcast 1.

The model is NCCL's own (src/graph/tuning.cc), with figures fitted on published nccl-tests runs:
each (algorithm, protocol) NCCL has on the hardware is a candidate

    t = latency_scale x (base[alg][proto] + steps x hop[link][alg][proto])
        + size x traffic(alg) / (bandwidth(level) x efficiency(alg) x protocol_fraction)

and the collective takes the fastest candidate, as NCCL's tuner picks one. Algorithms: ring (LL,
LL128, Simple), tree across nodes (double binary tree, all-reduce), NVLS (NVLink SHARP in the
NVSwitch, all-reduce inside an NVLS node) and NVLS-tree across such nodes; send/recv and all-to-all
are point-to-point (Simple). traffic(alg) is the bytes per byte of payload each rank moves over its
slowest link: ring = the bus factor; NVLS all-reduce = 1 (the switch reduces); tree across N nodes =
2(N-1)/N of the node's NICs. A ring that crosses nodes runs one ring per NIC, so its bus bandwidth is
min(the GPU's link, the node's NICs together).

The roofline is the lower bound: one hop of the slowest level's link latency plus size x traffic over
the raw link bandwidth, for the best algorithm. The calibrated time is never below it; its band is
the held-out (leave-one-source-out) spread of measured / calibrated of ``lmcost fit --collectives``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lmcost.hardware.cluster import Cluster
from lmcost.basics.errors import LmcostError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast")
PROTOCOLS = ("LL", "LL128", "Simple")

#: NCCL's latency model, microseconds (src/graph/tuning.cc, NCCL 2.18-2.27): baseLat per algorithm and
#: protocol (LL, LL128, Simple), and hwLat per hop on NVLink, PCIe and the network.
BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4), "nvls": (0, 0, 0), "nvls_tree": (0, 0, 0),
           "p2p": (6.6, 6.6, 8.4)}
HOP_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0), "nvls": (0, 0, 25.0), "nvls_tree": (0, 0, 25.0),
               "p2p": (0.6, 0.6, 3.4)},
    "pci": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0), "p2p": (1.0, 1.0, 5.7)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0), "nvls": (0, 0, 18.0), "nvls_tree": (0, 0, 14.0),
            "p2p": (2.7, 2.7, 14.0)},
}
#: LL128 moves 120 useful bytes per 128-byte line (tuning.cc: busBw x 0.92); LL's fraction is fitted.
LL128_FRACTION = 120 / 128
#: NCCL's send/recv switches to LL at or below 16 KiB (NCCL_P2P_LL_THRESHOLD default 16384).
P2P_LL_THRESHOLD = 16384


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw of nccl-tests (doc/PERFORMANCE.md) for ``kind`` on ``n`` ranks."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _check(kind: str, n_ranks, cluster: Cluster, nodes) -> int:
    if kind not in KINDS:
        raise LmcostError("kind", f"unknown collective {kind!r}", f"use one of: {', '.join(KINDS)}")
    if isinstance(n_ranks, bool) or not isinstance(n_ranks, (int, np.integer)) or n_ranks < 1:
        raise LmcostError("n_ranks", f"{n_ranks!r} is not a positive whole number of ranks", "give 1 or more")
    least = math.ceil(n_ranks / cluster.gpus_per_node)
    if nodes is None:
        nodes = least
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or not least <= nodes <= n_ranks:
        raise LmcostError("nodes", f"{n_ranks} ranks of {cluster.gpus_per_node}-GPU nodes cannot span {nodes!r} nodes",
                          f"give {least} to {n_ranks} nodes")
    if nodes > 1 and cluster.inter is None:
        raise LmcostError("layout.cluster", f"{cluster.name} has no network between nodes",
                          f"keep the group within {cluster.gpus_per_node} GPUs, or use a cluster with one")
    return int(nodes)


@dataclass(frozen=True)
class Candidate:
    """One (algorithm, protocol) on a placement, before the fitted figures are applied (:func:`evaluate`).

    ``latency_us``: NCCL's latency over the node's links (x the fitted latency scale of ``scale_key``);
    ``latency_net_us``: its network part (x the network's scale). ``traffic``: bytes over the bottleneck
    per payload byte; ``link_bw`` / ``net_bw``: B/s of the node link / network share on the path (None:
    not on it), reached at the fitted ``eff_key`` efficiency / the network's efficiency.
    """

    algorithm: str
    protocol: str
    latency_us: float
    latency_net_us: float
    scale_key: str  # ring | nvls | p2p
    eff_key: str  # ring | nvls | p2p
    traffic: float
    link_bw: float | None
    net_bw: float | None
    raw_latency_s: float

    @property
    def raw_bandwidth(self) -> float:
        """B/s of the path at line rate (the roofline's)."""
        return min(b for b in (self.link_bw, self.net_bw) if b is not None)


def figures(cluster: Cluster) -> dict:
    """The fitted figures of ``cluster`` as the flat mapping :func:`evaluate` reads."""
    fi, fn = cluster.collectives.intra, cluster.collectives.inter
    return dict(ring=fi.ring, nvls=fi.nvls, p2p=fi.p2p, ll=fi.ll, fill_mb=fi.fill_mb, ring_latency_scale=fi.ring_latency_scale,
                nvls_latency_scale=fi.nvls_latency_scale, p2p_latency_scale=fi.p2p_latency_scale, p2p_fill_mb=fi.p2p_fill_mb,
                net_latency_scale=fn.latency_scale, net_efficiency=fn.efficiency, net_fill_mb=fn.fill_mb)


def evaluate(c: Candidate, f: dict, size):
    """(latency term, bandwidth term), seconds, of candidate ``c`` for ``size`` bytes under figures ``f``;
    a figure may be a numpy array (the fit evaluates a grid of values at once).

    A pipeline fills over its first C MB: its bandwidth term is
    (size + size*C/(size+C)) / bandwidth, half the bus bandwidth well below C and the full one well above
    (NCCL splits a buffer into chunks per channel and step, and runs fewer channels on smaller buffers).
    C is ``fill_mb`` for Simple inside a node (LL and LL128 send no pipelined chunks: 0), ``net_fill_mb`` for
    every protocol on a path over the network (the larger of the two), and ``p2p_fill_mb`` for Simple
    send/recv, inside a node or across (NCCL's p2p pipeline runs chunks of NCCL_P2P_NVL_CHUNKSIZE, 512 KiB).
    Point-to-point latency, its network hop included, is NCCL's own x ``p2p_latency_scale`` (send/recv has
    no ring steps to scale, and no multi-node send/recv row to fit the network's figures on).
    """
    # send/recv over the network is one NCCL p2p hop: its latency and pipeline are p2p's, not the fitted
    # collective network figures (fitted on all-reduce rows only; no multi-node send/recv row to fit on)
    p2p = c.algorithm == "p2p"
    lat = (c.latency_us * f[f"{c.scale_key}_latency_scale"]
           + c.latency_net_us * f["p2p_latency_scale" if p2p else "net_latency_scale"]) * 1e-6
    bw = np.inf
    if c.link_bw is not None:
        bw = c.link_bw * f[c.eff_key]
    if c.net_bw is not None:
        bw = np.minimum(bw, c.net_bw * f["net_efficiency"])
    frac = {"LL": f["ll"], "LL128": LL128_FRACTION, "Simple": 1.0}[c.protocol]
    moved = size
    if c.algorithm == "p2p" and c.protocol == "LL":  # NCCL sends with LL only up to its threshold
        lat = lat + np.where(np.asarray(size) > P2P_LL_THRESHOLD, np.inf, 0.0)
    fill = 0.0
    if c.protocol == "Simple":
        fill = f["p2p_fill_mb"] if c.algorithm == "p2p" else f["fill_mb"]
    if c.net_bw is not None and not p2p:  # every protocol's pipeline over the network
        fill = np.maximum(fill, f["net_fill_mb"])
    fill = np.asarray(fill) * 1e6
    moved = size + np.where(fill > 0, size * fill / (size + fill + (fill == 0)), 0.0)
    return lat, moved * c.traffic / (bw * frac)


@dataclass(frozen=True)
class Collective:
    """One collective on a group of ``n_ranks`` consecutive GPUs of ``cluster`` (``nodes`` nodes).

    ``level`` is the slowest level spanned ('intra' or 'inter'); ``algorithm`` the one of the bandwidth
    regime (the largest payloads); :meth:`choice` names the (algorithm, protocol) per payload.
    """

    kind: str
    n_ranks: int
    nodes: int
    level: str
    algorithm: str
    cluster: Cluster
    candidates: tuple[Candidate, ...]

    def bus_factor(self) -> float:
        """busbw / algbw (nccl-tests)."""
        return bus_factor(self.kind, self.n_ranks)

    def _terms(self, size):
        """Per candidate (latency s, bandwidth term s), each shaped (candidates, *size.shape)."""
        f = figures(self.cluster)
        terms = [evaluate(c, f, size) for c in self.candidates]
        return (np.stack([np.broadcast_to(t[0], size.shape) for t in terms]),
                np.stack([np.broadcast_to(t[1], size.shape) for t in terms]))

    def _pick(self, size):
        lat, bw = self._terms(size)
        best = np.argmin(lat + bw, axis=0)[None]
        return np.take_along_axis(lat, best, 0)[0], np.take_along_axis(bw, best, 0)[0], best[0]

    def times(self, payload_bytes) -> dict:
        """Roofline, calibrated, and the calibrated band (seconds) for payloads in bytes.

        Returns: dict with roofline_s, calibrated_s, calibrated_low_s, calibrated_high_s, each an array
        shaped like ``payload_bytes`` (a float for a scalar). A group of one rank takes 0 s.
        Raises: LmcostError for a negative or non-finite payload.
        """
        size, scalar = _sizes(payload_bytes)
        if self.n_ranks == 1:
            z = np.zeros_like(size)
            out = dict(roofline_s=z, calibrated_s=z, calibrated_low_s=z, calibrated_high_s=z)
        else:
            roof = np.min(np.stack([c.raw_latency_s + size * c.traffic / c.raw_bandwidth for c in self.candidates]), axis=0)
            lat, bw, _ = self._pick(size)
            cal = np.maximum(lat + bw, roof)
            band = self.cluster.collectives.band
            lo = np.where(lat >= bw, band.latency[0], band.bandwidth[0])
            hi = np.where(lat >= bw, band.latency[1], band.bandwidth[1])
            out = dict(roofline_s=roof, calibrated_s=cal, calibrated_low_s=np.maximum(cal * lo, roof),
                       calibrated_high_s=cal * hi)
        return {k: float(v) for k, v in out.items()} if scalar else out

    def bound(self, payload_bytes):
        """'latency' or 'bandwidth': the larger term of the calibrated time (an array of str for an array)."""
        size, scalar = _sizes(payload_bytes)
        if self.n_ranks == 1:
            r = np.full(size.shape, "latency", dtype=object)
        else:
            lat, bw, _ = self._pick(size)
            r = np.where(lat >= bw, "latency", "bandwidth").astype(object)
        return str(r) if scalar else r

    def choice(self, payload_bytes):
        """'algorithm/protocol' of the fastest candidate per payload (str for a scalar)."""
        size, scalar = _sizes(payload_bytes)
        if self.n_ranks == 1:
            r = np.full(size.shape, "none", dtype=object)
        else:
            names = np.array([f"{c.algorithm}/{c.protocol}" for c in self.candidates], dtype=object)
            r = names[self._pick(size)[2]]
        return str(r) if scalar else r


def _sizes(payload_bytes):
    scalar = np.ndim(payload_bytes) == 0
    try:
        size = np.asarray(payload_bytes, dtype=float)
    except (TypeError, ValueError):
        raise LmcostError("payload_bytes", f"{payload_bytes!r} is not a number of bytes", "give e.g. 64M") from None
    if not np.all(np.isfinite(size)) or np.any(size < 0):
        raise LmcostError("payload_bytes", "negative or not finite", "give 0 or more bytes, e.g. 64M")
    return size, scalar


def collective(kind: str, n_ranks: int, cluster: Cluster, nodes: int | None = None) -> Collective:
    """The collective ``kind`` on ``n_ranks`` consecutive GPUs of ``cluster`` (over ``nodes`` nodes; default
    ceil(n_ranks / gpus_per_node)).

    Raises: LmcostError (one line) for an unknown kind, a rank count below 1, or nodes that cannot hold
    the group.
    """
    nodes = _check(kind, n_ranks, cluster, nodes)
    level = "intra" if nodes == 1 else "inter"
    cands = tuple(candidates(kind, int(n_ranks), nodes, cluster))
    if cands:
        f = figures(cluster)
        big = min(cands, key=lambda c: float(evaluate(c, f, 1e12)[1])).algorithm
    else:
        big = "none"
    return Collective(kind, int(n_ranks), nodes, level, big, cluster, cands)


def _link(cluster: Cluster) -> str:
    return "pci" if cluster.intra.generation.lower().startswith("pcie") else "nvlink"


def candidates(kind: str, n: int, nodes: int, cluster: Cluster) -> list[Candidate]:
    """Every (algorithm, protocol) NCCL can run ``kind`` with on this placement (n ranks over ``nodes``
    nodes). Empty for a single rank."""
    if n == 1:
        return []
    intra_bw = cluster.intra.bandwidth
    g = math.ceil(n / nodes)  # ranks per node
    hop = HOP_US[_link(cluster)]
    raw_lat = cluster.intra.latency_us * 1e-6
    if nodes > 1:
        nic_per_gpu = cluster.inter.node_bandwidth / cluster.gpus_per_node
        # A group with g of a node's GPUs uses g GPUs' share of its NICs (rail-optimised nodes give each GPU
        # its own NIC, and in a layout the node's other GPUs run their own groups at the same time: the
        # data-parallel groups of every TP rank); a group of whole nodes, as nccl-tests runs, uses them all.
        node_bw = nic_per_gpu * min(g, cluster.gpus_per_node)
        raw_lat = max(raw_lat, cluster.inter.latency_us * 1e-6)
    out = []

    def add(alg, protos, steps_intra, steps_inter, traffic, link_bw, net_bw, scale_key, eff_key):
        for p in protos:
            i = PROTOCOLS.index(p)
            out.append(Candidate(alg, p, BASE_US[alg][i] + steps_intra * hop[alg][i], steps_inter * HOP_US["net"][alg][i],
                                 scale_key, eff_key, traffic, link_bw, net_bw, raw_lat))

    f = bus_factor(kind, n)
    if kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        # Ring: every rank's link carries f x size; across nodes one ring per NIC, so the bus runs at
        # min(GPU link, the node's NICs together).
        steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
        inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if kind == "all_reduce" else nodes - 1)
        add("ring", PROTOCOLS, steps - inter_steps, inter_steps, f, intra_bw, node_bw if nodes > 1 else None, "ring", "ring")
    if kind == "all_reduce":
        nvls = cluster.intra.nvls
        if nodes == 1 and nvls:
            # NVLS: each rank sends and receives the buffer once; the NVSwitch reduces.
            add("nvls", ("Simple",), 1, 0, 1.0, intra_bw, None, "nvls", "nvls")
        if nodes > 1:
            # Double binary tree across nodes (or NVLS inside each node, then the tree): the node's NICs
            # carry 2(N-1)/N of the buffer; inside the node a chain carries it twice each way (reduce up,
            # broadcast down), the NVSwitch once.
            tree = 2 * (nodes - 1) / nodes
            up = 2 * max(1, int(math.log2(nodes)))
            add("tree", PROTOCOLS, 2 * (g - 1), up, 1.0, intra_bw / 2, node_bw / tree, "ring", "ring")
            if nvls:
                add("nvls_tree", ("Simple",), 1, up, 1.0, intra_bw, node_bw / tree, "nvls", "nvls")
    if kind in ("send_recv", "all_to_all"):
        # Point-to-point, Simple (and LL, which NCCL uses up to 16 KiB).
        if nodes == 1:
            add("p2p", ("LL", "Simple"), 1, 0, 1.0 if kind == "send_recv" else f, intra_bw, None, "p2p", "p2p")
        elif kind == "send_recv":  # the pairs that cross a node boundary go through one GPU's share of the NICs
            add("p2p", ("LL", "Simple"), 0, 1, 1.0, intra_bw, nic_per_gpu, "p2p", "p2p")
        else:  # each rank sends (n-g)/n of its bytes off the node, through its share of the NICs
            add("p2p", ("LL", "Simple"), 0, 1, (n - g) / n, None, nic_per_gpu, "p2p", "p2p")
    return out
