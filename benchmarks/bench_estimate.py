"""Speed of the main job and of the vectorised core. Prints medians over repeated runs.

Goals (issue 2): `lmcost estimate` of Llama-3-70B from a cold process under 1 s; a 256 x 256 grid of
(batch, context) for one model under 100 ms. Run: python benchmarks/bench_estimate.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def cold_cli(runs: int = 7) -> list[float]:
    # The installed console script next to this interpreter, else the module (same code, same imports).
    exe = Path(sys.executable).with_name("lmcost")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lmcost.cli"]
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([*cmd, "estimate", "llama-3-70b", "--gpu", "h100", "--batch", "8", "--prompt", "2048",
                        "--gen", "256"], check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def grid_times(runs: int = 15) -> tuple[list[float], int]:
    from lmcost import Precision, grid, load_config, load_gpu

    cfg, gpu = load_config("llama-3-70b"), load_gpu("h100")
    batch, context = np.arange(1, 257), np.linspace(128, 131072, 256).astype(int)
    grid(cfg, gpu, Precision(), "decode", batch, context)  # warm-up (imports, caches)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        df = grid(cfg, gpu, Precision(), "decode", batch, context)
        times.append(time.perf_counter() - t0)
    return times, len(df)


if __name__ == "__main__":
    cli = cold_cli()
    print(f"lmcost estimate llama-3-70b (cold process): median {statistics.median(cli) * 1e3:.0f} ms "
          f"over {len(cli)} runs (min {min(cli) * 1e3:.0f}, max {max(cli) * 1e3:.0f}); goal < 1000 ms")
    g, rows = grid_times()
    print(f"grid of 256 x 256 (batch, context), decode, llama-3-70b: median {statistics.median(g) * 1e3:.1f} ms "
          f"for {rows} points over {len(g)} runs (min {min(g) * 1e3:.1f}); goal < 100 ms")
