"""Speed of the planner (issue 15): a 10,000-point search, against estimate() point by point as the peer.

Prints medians over rounds (the machine is noisy):
- ``lmcost.apps.plan.search`` of Llama-3.1-70B on 8 GPUs of two types (H100, H200), 20 layouts x about 270
  batch sizes each (``density=400`` per factor of 16 up to a batch of 8192), ISL 2048, OSL 256: points
  searched and seconds, warm (the layouts' graphs compiled by a first round) and cold (a new process,
  imports included). Goal: under 2 s for 10,000 points.
- the peer, in the same run: ``lmcost.apps.estimate.estimate`` on 200 of the same points one at a time (the
  way a planner without a vectorised core would search), its per-point time scaled to the search's
  points, and the ratio.

Run: .venv/bin/python benchmarks/bench_plan.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

SEARCH = """
from lmcost import load_config, load_gpu, Precision
from lmcost.apps.plan import search
from lmcost.operators.workload import Settings
cfg = load_config("llama-3.1-70b")
gpus = [load_gpu("h100"), load_gpu("h200")]
p = search(cfg, gpus, 8, 2048, 256, Precision(), Settings(logits="last"), max_batch=8192, density=400)
"""


def main() -> None:
    from lmcost import Precision, Workload, load_config, load_gpu
    from lmcost.apps.estimate import estimate
    from lmcost.operators.parallel import Layout
    from lmcost.operators.workload import Settings

    ns: dict = {}
    exec(SEARCH, ns)  # compiles every layout's graphs
    points = ns["p"].searched
    warm = []
    for _ in range(5):
        t = time.perf_counter()
        exec(SEARCH, {})
        warm.append(time.perf_counter() - t)
    cold = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", SEARCH], check=True)
        cold.append(time.perf_counter() - t)
    cfg, h100 = load_config("llama-3.1-70b"), load_gpu("h100")
    sample = [(Layout(tp=tp, pp=pp, dp=8 // (tp * pp)), b) for tp, pp in ((8, 1), (4, 2), (2, 4)) for b in range(8, 8 * 67, 8)][:200]
    per = []
    for _ in range(3):
        t = time.perf_counter()
        for lay, b in sample:
            estimate(cfg, h100, Workload(b, 2048, 256), Precision(), Settings(logits="last", layout=lay))
        per.append((time.perf_counter() - t) / len(sample))
    w, c, p = statistics.median(warm), statistics.median(cold), statistics.median(per)
    print(f"plan search: {points:,} points, warm {w:.2f} s (median of {len(warm)}), cold {c:.2f} s "
          f"(new process, median of {len(cold)}); goal under 2 s")
    print(f"peer, estimate() per point: {p * 1e3:.2f} ms -> {p * points:.1f} s for {points:,} points; "
          f"search is {p * points / w:.0f}x faster warm, {p * points / c:.0f}x cold")


if __name__ == "__main__":
    main()
