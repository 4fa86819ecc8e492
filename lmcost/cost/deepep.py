"""DeepEP's dispatch and combine (github.com/deepseek-ai/DeepEP) as the all-to-all of EP over attention-DP:
bytes per rank exact from the routing, time from the kernels' published bandwidths and latencies.

Bytes one rank moves per MoE layer for ``T`` tokens routed top-``k`` over ``d`` channels (FP8 dispatch with one
fp32 scale per 128 channels, BF16 combine, as DeepEP's README tests and DeepSeek-V3/R1 serve):

    row_fp8  = d x 1 + ceil(d / 128) x 4          bytes (DeepSeek-V3's d = 7168: 7168 + 56 x 4 = 7392)
    dispatch = imbalance x k x T x row_fp8         (low-latency and intranode high-throughput kernels)
    combine  = imbalance x k x T x d x 2
    RDMA (high-throughput across nodes) = imbalance x T x D x row, D = the expected distinct nodes a token's
        k experts sit on, N (1 - C(E - E/N, k) / C(E, k)) for N nodes and E experts under uniform routing
        (DeepEP sends a token once per node and forwards it over NVLink inside it).

``imbalance`` is the busiest rank's rows over the mean (the collective ends when it does).

Kernels (``A2A_KERNELS``): ``nccl`` (lmcost's collective model, :func:`lmcost.operators.parallel.communication`,
unchanged); ``deepep-ht`` (normal kernels: NVLink inside a node, RDMA between, time = max(NVLink bytes / NVLink
rate, RDMA bytes / RDMA rate) + a fixed cost); ``deepep-ll`` (low-latency kernels, pure RDMA, one fixed cost per
call plus bytes at the measured rate: what DeepSeek and SGLang decode with).

Figures: DeepEP's README tables (H800, ~160 GB/s NVLink achievable (README's words), one ConnectX-7 400 Gb/s
NIC per GPU, ~50 GB/s), normal kernels at 4096 tokens, d 7168, top-8, FP8 dispatch / BF16 combine; low-latency
kernels at 128 tokens. The figures are those of the README's tables as this module's author recalls them (the
April 2025 revision for the normal kernels, the February 2025 release for the low-latency kernels); they could
not be re-read in this session (no network): treat them as the README's to within rounding. They check
themselves: the low-latency table's latency x bandwidth is the bytes above to 1-2% (tests/test_wide_ep.py).
Each becomes a fraction of the H800's link (NVLink: 153 of the datasheet's 200 GB/s a direction; RDMA: 43 of
50) applied to the cluster's own link (:mod:`lmcost.hardware.cluster`); between published EP sizes the nearer one below is
taken (at or above the largest, the largest). The fixed cost per call is a prior: DeepEP publishes one batch
size per EP size, which cannot separate a fixed cost from a rate, so it is one network hop of the cluster file
(``inter.latency_us``) and the rate is set so the published point is reproduced exactly.
"""

from __future__ import annotations

import math

import numpy as np

from lmcost.basics.errors import LmcostError

A2A_KERNELS = ("nccl", "deepep-ht", "deepep-ll")

#: The links DeepEP's figures were measured on, per direction, as cluster files hold them: the H800's NVLink at
#: its datasheet's 400 GB/s bidirectional, 200 GB/s a direction (the README calls ~160 GB/s its achievable
#: maximum); ConnectX-7 400 Gb/s, 50 GB/s (the README's "~50 GB/s maximum bandwidth").
H800_NVLINK, CX7_RDMA = 200e9, 50e9
#: Normal kernels, intranode (EP8): dispatch 153 GB/s, combine 158 GB/s (NVLink bottleneck bandwidth).
HT_INTRA = {8: (153e9, 158e9)}
#: Normal kernels, internode: EP -> (dispatch, combine) RDMA bottleneck bandwidth, B/s.
HT_INTER = {16: (43e9, 43e9), 32: (58e9, 57e9), 64: (51e9, 50e9)}
#: Low-latency kernels: EP -> (dispatch latency s, dispatch RDMA B/s, combine latency s, combine RDMA B/s).
LL = {8: (163e-6, 46e9, 318e-6, 46e9), 16: (173e-6, 43e9, 329e-6, 44e9), 32: (182e-6, 41e9, 350e-6, 41e9),
      64: (186e-6, 40e9, 353e-6, 41e9), 128: (192e-6, 39e9, 369e-6, 39e9), 256: (194e-6, 39e9, 360e-6, 40e9)}
#: The low-latency table's batch: 128 tokens per rank, top-8, d 7168.
LL_TOKENS, LL_K, LL_D = 128, 8, 7168
#: Channels per fp32 scale of DeepEP's FP8 dispatch (1x128 blocks, DeepSeek-V3's activation quantization).
SCALE_BLOCK = 128


def check_kernel(kernel: str) -> str:
    """Raises: LmcostError (a2a) for a name not in :data:`A2A_KERNELS`. Returns: the name."""
    if kernel not in A2A_KERNELS:
        raise LmcostError("a2a", f"unknown all-to-all kernel {kernel!r}", f"use one of {', '.join(A2A_KERNELS)}")
    return kernel


def row_bytes(d: int, fp8: bool) -> float:
    """Bytes of one routed row of ``d`` channels: FP8 with its fp32 scale per 128 channels, or BF16."""
    return d + math.ceil(d / SCALE_BLOCK) * 4 if fp8 else 2.0 * d


def distinct_nodes(n_experts: int, k: int, nodes: int) -> float:
    """Expected distinct nodes among a token's ``k`` experts, drawn without replacement from ``n_experts``
    spread evenly over ``nodes``: N (1 - C(E - E/N, k) / C(E, k)) (inclusion of each node; uniform routing,
    no node limit such as DeepSeek-V3's 4 nodes per token, which this overstates past 4 nodes)."""
    if nodes <= 1:
        return 1.0
    per = n_experts // nodes
    miss = math.comb(n_experts - per, k) / math.comb(n_experts, k)
    return nodes * (1.0 - miss)


def _below(table: dict, ep: int):
    keys = sorted(table)
    ok = [e for e in keys if e <= ep]
    return table[ok[-1] if ok else keys[0]]


def step_bytes(tokens, *, d: int, k: int, n_experts: int, ep: int, gpus_per_node: int, imbalance: float = 1.0,
               kernel: str = "deepep-ht") -> dict:
    """Bytes one rank moves per MoE layer for ``tokens`` tokens (a number or array): ``dispatch`` and ``combine``
    (every routed row, to itself included), and under ``deepep-ht`` across nodes ``dispatch_rdma`` and
    ``combine_rdma`` (once per destination node). Module docstring for the formulas. Raises: nothing."""
    t = np.asarray(tokens, dtype=float) * imbalance
    out = dict(dispatch=t * k * row_bytes(d, True), combine=t * k * row_bytes(d, False))
    nodes = math.ceil(ep / gpus_per_node)
    if kernel == "deepep-ht" and nodes > 1:
        dn = distinct_nodes(n_experts, k, nodes)
        out.update(dispatch_rdma=t * dn * row_bytes(d, True), combine_rdma=t * dn * row_bytes(d, False))
    return out


def layer_seconds(tokens, *, d: int, k: int, n_experts: int, ep: int, cluster, imbalance: float = 1.0,
                  kernel: str = "deepep-ht") -> tuple:
    """(dispatch s, combine s) of one MoE layer on one rank (arrays as ``tokens``; 0 where tokens is 0) for a
    DeepEP ``kernel`` on ``cluster`` (:class:`lmcost.hardware.cluster.Cluster`). Module docstring for the model
    and its figures. Raises: LmcostError (a2a) for ``nccl`` (not DeepEP's) or an unknown kernel."""
    check_kernel(kernel)
    if kernel == "nccl":
        raise LmcostError("a2a", "nccl is lmcost's collective model, not a DeepEP kernel", "use deepep-ht or deepep-ll")
    g = cluster.gpus_per_node
    b = step_bytes(tokens, d=d, k=k, n_experts=n_experts, ep=ep, gpus_per_node=g, imbalance=imbalance, kernel=kernel)
    t0 = cluster.inter.latency_us * 1e-6 if cluster.inter is not None else 0.0
    rdma = (cluster.inter.node_bandwidth / g) if cluster.inter is not None else CX7_RDMA
    busy = np.asarray(tokens, dtype=float) > 0
    if kernel == "deepep-ll":
        lat_d, _, lat_c, _ = _below(LL, ep)
        pub_d = LL_TOKENS * LL_K * row_bytes(LL_D, True)
        pub_c = LL_TOKENS * LL_K * row_bytes(LL_D, False)
        rate_d = pub_d / (lat_d - t0) * rdma / CX7_RDMA
        rate_c = pub_c / (lat_c - t0) * rdma / CX7_RDMA
        return (np.where(busy, t0 + b["dispatch"] / rate_d, 0.0), np.where(busy, t0 + b["combine"] / rate_c, 0.0))
    nvl = cluster.intra.bandwidth
    f_d, f_c = (v / H800_NVLINK for v in HT_INTRA[8])
    disp, comb = b["dispatch"] / (f_d * nvl), b["combine"] / (f_c * nvl)
    if "dispatch_rdma" in b:
        r_d, r_c = (v / CX7_RDMA * rdma for v in _below(HT_INTER, ep))
        disp = np.maximum(disp, b["dispatch_rdma"] / r_d)
        comb = np.maximum(comb, b["combine_rdma"] / r_c)
    return np.where(busy, t0 + disp, 0.0), np.where(busy, t0 + comb, 0.0)
