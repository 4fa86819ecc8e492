"""Writes tests/data/golden-estimates.json.gz: what `lmcost estimate --json` printed for every shipped
model on every shipped GPU, both time models, before the core was reshaped (issue 10).

Run once on the commit before a refactor; tests/test_golden.py then holds every later commit to it.
Errors (a GPU without the dtype, a context past learned positions) are recorded as their one line.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from lmcost import LmcostError, Precision, Settings, Workload, estimate, load_config, load_gpu
from lmcost.fusion import PRESETS
from lmcost.resources import names

OUT = Path(__file__).with_name("golden-estimates.json.gz")
WORKLOADS = [(8, 2048, 256), (1, 512, 256), (3, 100, 2)]


def cases():
    for model in names("models"):
        for gpu in names("hardware"):
            for time_model in ("roofline", "calibrated"):
                for b, p, g in WORKLOADS:
                    yield dict(model=model, gpu=gpu, model_time=time_model, batch=b, prompt=p, gen=g,
                               fuse="default", detail=False)
        # The per-operator rows (--detail --json), and the vllm fusions, on one GPU with efficiency figures.
        for time_model in ("roofline", "calibrated"):
            for fuse in ("default", "vllm", "none"):
                yield dict(model=model, gpu="h100", model_time=time_model, batch=8, prompt=2048, gen=256,
                           fuse=fuse, detail=True)


def run(case: dict) -> dict:
    try:
        est = estimate(load_config(case["model"]), load_gpu(case["gpu"]),
                       Workload(case["batch"], case["prompt"], case["gen"]), Precision(),
                       Settings(model=case["model_time"], fusion=PRESETS[case["fuse"]]))
    except LmcostError as e:
        return {"error": str(e)}
    data = est.to_dict()
    if case["detail"]:
        data["ops"] = est.ops.to_dict("records")
    return json.loads(json.dumps(data, default=lambda v: v.item()))


if __name__ == "__main__":
    out = [dict(case=c, result=run(c)) for c in cases()]
    OUT.write_bytes(gzip.compress(json.dumps(out, separators=(",", ":")).encode(), mtime=0))
    print(f"wrote {OUT} ({len(out)} cases)", file=sys.stderr)
