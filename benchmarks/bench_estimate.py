"""Speed of the core (issue 10), with llm-analysis measured in the same run as the peer.

Prints medians over repeated rounds (the machine is noisy: no single timing is trusted):
- warm ``lmcost.estimate()``: estimates per second over 100 (batch, prompt) points of Llama-3-8B
  (batch 1..100, prompt 512..2492 step 20, 256 generated), in rounds interleaved with rounds of
  llm-analysis 0.2.2's ``inference()`` on
  the same points and model (its ModelConfig written from Llama-3-8B's config.json; d_ff 4d, which it
  requires), and their ratio.
  Goal: at least 5,000/s and ahead of the peer.
- cold ``lmcost estimate llama-3.1-70b --gpu h100`` (a new process each time), against
  ``python -c 'import llm_analysis.analysis'`` as a floor of the peer's cold start. Goal: under 0.5 s.
- ``grid`` of batch x context for decode and prefill at 256^2, 512^2 and 1024^2 points: points per second
  (goal: at least 5M/s in both phases, flat in the number of points) and peak RSS growth of the
  process (linear in points).

Run: .venv/bin/python benchmarks/bench_estimate.py. The peer lives in a venv of its own (llm-analysis
pins transformers 4.31, which would break the test oracle): python3 -m venv .venv-peer &&
.venv-peer/bin/pip install llm-analysis. Without it the peer's figures are skipped, and the line says so.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path


POINTS = [(b, 512 + 20 * (b - 1)) for b in range(1, 101)]
GEN = 256


def rates(python: str | None, n_rounds: int = 9) -> tuple[list[float], list[float], list[float] | None]:
    """Estimates per second on POINTS of lmcost's estimate() (the headline numbers: TTFT, TPOT, memory;
    the per-phase tables and the other time model are computed when first read), of estimate().to_dict()
    (every number `lmcost estimate --json` prints), and, if ``python`` has llm-analysis, of its
    inference(): rounds interleaved (ours, then the peer's in its own process), so a busy spell of the
    machine slows all alike."""
    import json

    from lmcost import Precision, Settings, Workload, estimate, load_config, load_gpu
    cfg, gpu, p, s = load_config("llama-3-8b"), load_gpu("h100"), Precision(), Settings()
    run = lambda: [estimate(cfg, gpu, Workload(b, prompt, GEN), p, s) for b, prompt in POINTS]
    run_json = lambda: [estimate(cfg, gpu, Workload(b, prompt, GEN), p, s).to_dict() for b, prompt in POINTS]
    run_json()  # warm: the phase graphs compile once per (config, phase, settings)
    peer = None
    if python is not None:
        peer = subprocess.Popen([python, "-c", PEER, json.dumps(POINTS), str(GEN)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert peer.stdout.readline().strip() == "ready"
    mine, whole, theirs = [], [], []
    for _ in range(n_rounds):
        for fn, out in ((run, mine), (run_json, whole)):
            t0 = time.perf_counter()
            fn()
            out.append(len(POINTS) / (time.perf_counter() - t0))
        if peer is not None:
            peer.stdin.write("round\n")
            peer.stdin.flush()
            theirs.append(float(peer.stdout.readline()))
    if peer is not None:
        peer.stdin.close()
        peer.wait()
    return mine, whole, (theirs if peer is not None else None)


PEER = """
import json, logging, sys, time
from llm_analysis.analysis import LLMAnalysis, get_gpu_config_by_name
from llm_analysis.config import ModelConfig
logging.disable(logging.CRITICAL)
# Llama-3-8B's config.json: 32 layers, 32 heads (8 KV), d 4096, V 128256. llm-analysis asserts that
# d_ff is a multiple of d, so its FFN is 4d = 16384 wide instead of 14336 (the same work per call).
mc = ModelConfig(name="llama-3-8b", num_layers=32, n_head=32, hidden_dim=4096, vocab_size=128256,
                 max_seq_len=8192, num_key_value_heads=8, ffn_embed_dim=16384, model_type="llama")
a = LLMAnalysis(mc, get_gpu_config_by_name("h100-sxm-80gb"))
points, gen = json.loads(sys.argv[1]), int(sys.argv[2])
run = lambda: [a.inference(batch_size_per_gpu=b, seq_len=p, num_tokens_to_generate=gen) for b, p in points]
run()
print("ready", flush=True)
for line in sys.stdin:  # one round per line asked, so the caller can interleave rounds with its own
    t0 = time.perf_counter(); run(); print(len(points) / (time.perf_counter() - t0), flush=True)
"""


def peer_python() -> str | None:
    """The interpreter that has llm-analysis: $LMCOST_PEER_PYTHON, else .venv-peer/bin/python (it pins
    transformers 4.31, so it lives in a venv of its own), else this one if it can import it."""
    import os

    for cand in (os.environ.get("LMCOST_PEER_PYTHON"), str(Path(__file__).resolve().parents[1] / ".venv-peer/bin/python"),
                 sys.executable):
        if cand and Path(cand).exists() and subprocess.run([cand, "-c", "import llm_analysis.analysis"],
                                                           capture_output=True).returncode == 0:
            return cand
    return None


def cold(cmd: list[str], runs: int = 7) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        out.append(time.perf_counter() - t0)
    return out


def grid_rates(n: int, phase: str) -> tuple[float, float]:
    """Median points/s of an n x n grid in a fresh process, and that process's peak RSS growth (MB)."""
    code = f"""
import resource, time, statistics, numpy as np
from lmcost import Precision, load_config, load_gpu
from lmcost.cost.phases import grid
cfg, gpu = load_config("llama-3.1-70b"), load_gpu("h100")
b, t = np.arange(1, {n} + 1), np.linspace(128, 131072, {n}).astype(int)
grid(cfg, gpu, Precision(), "{phase}", b[:4], t[:4], frame=False)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
ts = []
for _ in range(5):
    t0 = time.perf_counter(); grid(cfg, gpu, Precision(), "{phase}", b, t, frame=False); ts.append(time.perf_counter() - t0)
print({n} * {n} / statistics.median(ts), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
"""
    r = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    rate, rss = r.stdout.split()
    return float(rate), float(rss)


def main() -> None:
    python = peer_python()
    mine, whole, peer = rates(python)
    line = f"warm estimate(), llama-3-8b, {len(POINTS)} points: lmcost median {statistics.median(mine):,.0f}/s " \
           f"(min {min(mine):,.0f}, max {max(mine):,.0f}); goal >= 5,000/s; with .to_dict() (every number of " \
           f"--json) {statistics.median(whole):,.0f}/s"
    if peer is None:
        line += "; llm-analysis not found (python3 -m venv .venv-peer && .venv-peer/bin/pip install llm-analysis): no peer figure"
    else:
        line += f"; llm-analysis 0.2.2 median {statistics.median(peer):,.0f}/s; ratio {statistics.median(mine) / statistics.median(peer):.2f}x"
    print(line, flush=True)

    exe = Path(sys.executable).with_name("lmcost")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lmcost"]
    c = cold([*cmd, "estimate", "llama-3.1-70b", "--gpu", "h100", "--batch", "8", "--prompt", "2048", "--gen", "256"])
    line = f"cold `lmcost estimate llama-3.1-70b --gpu h100`: median {statistics.median(c) * 1e3:.0f} ms " \
           f"(min {min(c) * 1e3:.0f}, max {max(c) * 1e3:.0f}); goal < 500 ms"
    if peer is not None:
        p = cold([python, "-c", "import llm_analysis.analysis"])
        line += f"; `import llm_analysis.analysis` alone: median {statistics.median(p) * 1e3:.0f} ms"
    print(line, flush=True)

    for phase in ("decode", "prefill"):
        for n in (256, 512, 1024):
            rate, rss = grid_rates(n, phase)
            print(f"grid {phase} {n}x{n} ({n * n:,} points), llama-3.1-70b: median {rate / 1e6:.2f}M points/s; "
                  f"peak RSS growth {rss:.0f} MB; goal >= 5M/s", flush=True)


if __name__ == "__main__":
    main()
