"""An engine's own all-reduce (vLLM, SGLang, TensorRT-LLM custom all-reduce over NVLink) as a candidate beside
NCCL's (:mod:`lmcost.cost.collectives`).

The kernels (vLLM csrc/custom_all_reduce.cuh, copied by SGLang's sgl-kernel) read peers' buffers over NVLink
through CUDA IPC:
- one-shot: every rank reads the n-1 other buffers whole and reduces: (n-1) x size bytes into each GPU;
- two-shot: reduce-scatter then all-gather through the peers' buffers: 2(n-1)/n x size into each GPU.
vLLM picks one-shot at 2 ranks, and on a full NVLink node below 512 KiB at <= 4 ranks or below 256 KiB at
<= 8 ranks (custom_all_reduce.cuh ``allreduce``), two-shot otherwise; it runs its custom all-reduce only up to
``max_size`` = 8 MiB (custom_all_reduce.py) on 2, 4, 6 or 8 ranks inside one NVLink node, NCCL above.
SGLang uses the same kernel and limits. TensorRT-LLM's AUTO strategy is taken to switch the same way (an
assumption: its thresholds are tuned per GPU and not documented as a fixed size).

    t = latency(one- or two-shot) + size x traffic / (NVLink bandwidth per direction x efficiency)

The latencies and efficiency are fitted per engine and NVLink generation on aiconfigurator's CUDA-graph rows
(``lmcost.calibration.engine_allreduce_fit``) and live in the cluster file's ``collectives.engines`` block.
"""

from __future__ import annotations

ENGINES = ("vllm", "sglang", "trtllm")
#: vLLM CustomAllreduce(max_size=8192 * 1024) (vllm/distributed/device_communicators/custom_all_reduce.py).
MAX_BYTES = 8 * 2**20
RANKS = (2, 4, 6, 8)


def one_shot(n: int, size: float) -> bool:
    """Whether vLLM's kernel runs one-shot for ``size`` bytes on ``n`` ranks (custom_all_reduce.cuh)."""
    return n == 2 or (n <= 4 and size < 512 * 1024) or (n <= 8 and size < 256 * 1024)


def traffic(n: int, size: float) -> float:
    """Bytes into each GPU per payload byte: n-1 one-shot, 2(n-1)/n two-shot."""
    return (n - 1) if one_shot(n, size) else 2 * (n - 1) / n


def runs_custom(n: int, nodes: int, nvlink: bool, size: float, max_bytes: float = MAX_BYTES) -> bool:
    """Whether the engine runs its own all-reduce (not NCCL): 2/4/6/8 ranks in one NVLink node, at most
    ``max_bytes``."""
    return nodes == 1 and nvlink and n in RANKS and size <= max_bytes


def custom_time(n: int, size: float, link_bw: float, one_shot_us: float, two_shot_us: float, efficiency: float) -> float:
    """Seconds of one custom all-reduce of ``size`` bytes on ``n`` ranks over links of ``link_bw`` B/s
    per direction (formula: module docstring)."""
    lat = one_shot_us if one_shot(n, size) else two_shot_us
    return lat * 1e-6 + size * traffic(n, size) / (link_bw * efficiency)
