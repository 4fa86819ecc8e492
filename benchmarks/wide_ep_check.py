"""Wide EP against published per-node throughputs of DeepSeek-V3/R1 serving (reports/serve-wide-ep.md).

Each row is a pool (prefill or decode) of attention-DP x EP on H100s (lmcost holds no H800 file: the H800 is an
H100 with NVLink cut to 400 GB/s, which the RDMA-bound all-to-alls here do not use), FP8, SGLang's fitted engine
profile, costed as ``lmcost serve`` costs a step (:class:`lmcost.cost.engine_step.StepModel` plus the engine's
per-step and per-sequence overheads): a prefill pool's input tokens/s per node at a full step of whole prompts,
a decode pool's output tokens/s per node at a batch per GPU (with MTP where the source ran it: the batch whose
users get the published speed). Run: ``python benchmarks/wide_ep_check.py``.
"""

from __future__ import annotations

import statistics

from lmcost.apps.serve import ServeRequest, prepare
from lmcost.apps.serve_spec import per_token_s

#: MTP's mean accepted tokens per step: 1 + the second token's acceptance, 85-90% (DeepSeek-V3 technical
#: report, arXiv 2412.19437, section 5.4.3), at its midpoint.
MTP_ACCEPTED = 1.875

#: (name, published tokens/s per node, the source's words, request fields, phase, workload)
ROWS = [
    ("LMSYS prefill, 4 nodes (EP32)", 52.3e3, "LMSYS blog 2025-05-05: 52.3k input tokens/s per node, 2000-token inputs",
     dict(ep=32, dp=32, a2a="deepep-ht", tbo=True, redundant_experts=32, max_num_batched_tokens=16384),
     "prefill", dict(prompt=2000)),
    ("LMSYS decode, 9 nodes (EP72 as EP64)", 22.3e3, "LMSYS blog 2025-05-05: 22.3k output tokens/s per node, "
     "2000-token inputs", dict(ep=64, dp=64, a2a="deepep-ll", tbo=True), "decode", dict(context=2000, batch=256)),
    ("DeepSeek Day 6 prefill (EP32)", 73.7e3 * (1 - 0.563), "DeepSeek open-infra Day 6: ~73.7k input tokens/s per "
     "H800 node incl. 56.3% on-disk cache hits -> 32.2k computed", dict(ep=32, dp=32, a2a="deepep-ht", tbo=True,
                                                                          redundant_experts=32, max_num_batched_tokens=16384),
     "prefill", dict(prompt=4989)),
    ("DeepSeek Day 6 decode, MTP (EP144 as EP128)", 14.8e3, "DeepSeek open-infra Day 6: ~14.8k output tokens/s "
     "per node, 20-22 tokens/s per user, KV 4,989 per output token; MTP 1 token, 2nd token accepted 85-90% "
     "(DeepSeek-V3 technical report, arXiv 2412.19437, section 5.4.3): 1.875 tokens a step",
     dict(ep=128, dp=128, a2a="deepep-ll", tbo=True, spec="mtp", spec_tokens=1, acceptance=MTP_ACCEPTED),
     "decode", dict(context=4989, speed=21)),
]


def per_node(fields: dict, phase: str, w: dict, time_model: str = "engine") -> tuple:
    """(tokens/s per node, what the step was) of one pool under ``time_model``."""
    s = prepare(ServeRequest(model="deepseek-v3", gpu="h100", dtype="fp8", engine="sglang", time_model=time_model,
                             **fields), max_context=8192)
    k = s.knobs
    if phase == "prefill":
        n = k.max_num_batched_tokens // w["prompt"]
        t = s.step.step_s(0, 0.0, chunks=[(0, w["prompt"])] * n) + k.step_overhead_s + k.seq_overhead_s * n
        return 8 * n * w["prompt"] / t, f"{n} prompts of {w['prompt']} a step, {t * 1e3:.1f} ms"

    def per_gpu(b):  # (output tokens/s of one GPU, one user's tokens/s, seconds a step) at a batch b per GPU
        if hasattr(s.step, "target"):  # speculative decoding (MTP)
            pt = per_token_s(s, b, float(w["context"]))[0]  # a speculative step / (b x accepted per step)
            return 1 / pt, 1 / (b * pt), pt * b * s.step.tokens_per_step
        t = s.step.step_s(b, float(w["context"])) + k.step_overhead_s + k.seq_overhead_s * b
        return b / t, 1 / t, t
    if "batch" in w:
        b = w["batch"]
    else:  # the batch whose steps run at the published per-user speed
        b = max((b for b in range(1, k.max_num_seqs + 1) if per_gpu(b)[1] >= w["speed"]), default=1)
    rate, _, t = per_gpu(b)
    return 8 * rate, f"batch {b} per GPU at context {w['context']}, step {t * 1e3:.1f} ms"


def main() -> None:
    errs, roof, plain = [], [], []
    print("| pool | published /node | predicted /node (engine) | error | step | roofline /node | error "
          "| engine, TBO off | error | TBO gain |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, pub, src, fields, phase, w in ROWS:
        pred, how = per_node(fields, phase, w)
        low, _ = per_node(fields, phase, w, "roofline")
        off, _ = per_node({**fields, "tbo": False}, phase, w)
        errs.append(pred / pub - 1)
        roof.append(low / pub - 1)
        plain.append(off / pub - 1)
        print(f"| {name} | {pub:,.0f} | {pred:,.0f} | {pred / pub - 1:+.0%} | {how} | {low:,.0f} | {low / pub - 1:+.0%} "
              f"| {off:,.0f} | {off / pub - 1:+.0%} | {pred / off - 1:+.0%} |")
    print(f"\nmedian |error|: engine {statistics.median(abs(e) for e in errs):.0%}, "
          f"roofline {statistics.median(abs(e) for e in roof):.0%}, "
          f"engine with TBO off {statistics.median(abs(e) for e in plain):.0%}")
    print("\nsources:")
    for name, _, src, *_ in ROWS:
        print(f"- {name}: {src}")


if __name__ == "__main__":
    main()
