"""Speed of a long generation's TPOT (issue 24): ``estimate`` of Llama-3-8B on an H100, batch 1, prompt 512,
16M generated tokens (``lmcost estimate llama-3-8b --gpu h100 --model calibrated --gen 16M``), under the
calibrated model (TPOT and its band: three sums over 16M decode steps) and under the roofline, warm
(the phase graphs compiled once before), each the median of repeated rounds interleaved so a busy spell
of the machine slows both alike; and their ratio. Goal: the calibrated estimate under 2 s (it took 65-143 s
when it evaluated every step; lmcost.cost.steps sums all but the first 65,536 in closed form).

Run: .venv/bin/python benchmarks/bench_tpot.py [rounds] [models...]  (default: llama-3-8b, and mistral-7b for
a sliding window: past its window an op is affine again, summed in closed form on each half of the run)
"""

from __future__ import annotations

import statistics
import sys
import time


def main(rounds: int = 5, model: str = "llama-3-8b") -> None:
    from lmcost import Precision, Settings, Workload, estimate, load_config, load_gpu

    cfg, gpu, wl = load_config(model), load_gpu("h100"), Workload(1, 512, 16 * 2**20)
    runs = {m: (lambda s=Settings(model=m): estimate(cfg, gpu, wl, Precision(), s).to_dict()) for m in ("roofline", "calibrated")}
    for fn in runs.values():
        fn()  # warm: compile the phase graphs
    times: dict = {m: [] for m in runs}
    for _ in range(rounds):
        for m, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[m].append(time.perf_counter() - t0)
    med = {m: statistics.median(t) for m, t in times.items()}
    print(f"estimate {model} h100, gen 16M, median of {rounds}: roofline {med['roofline']:.3f} s, "
          f"calibrated {med['calibrated']:.3f} s ({med['calibrated'] / med['roofline']:.1f}x the roofline; goal < 2 s)")


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    for name in sys.argv[2:] or ["llama-3-8b", "mistral-7b"]:  # mistral: a 4,096-token sliding window
        main(n, name)
