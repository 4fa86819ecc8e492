"""Convert aiconfigurator-core 0.12.0's measured disaggregated (P/D) serving points into lmcost's held-out set
for ``serve --pd``, as benchmarks/convert_silicon.py converts the aggregated ones (same source, GPUs, models
and precisions; the same citation header).

Reads ``aiconfigurator_core/systems/silicon_sample.csv`` (extracted from the wheel; the package is never
imported) and writes ``lmcost/data/measurements/serving-silicon-disagg.csv``: the rows of mode disagg with
pp 1 in both pools, on GPUs lmcost ships (as convert_silicon.py keeps them), of models it costs, in lmcost's
names and seconds. Prints the rows kept per engine, GPU and model, and those dropped with why.

Run: .venv/bin/python benchmarks/convert_silicon_disagg.py [--csv PATH] [--out PATH] [--wheel PATH]
"""

from __future__ import annotations

import datetime
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convert_silicon import GPUS, INNER, MODELS, PRECISIONS, ROOT, one, read_args, sha256, write  # noqa: E402

OUT = ROOT / "lmcost" / "data" / "measurements" / "serving-silicon-disagg.csv"
POOL = ("workers", "tp", "dp", "ep", "moe_tp", "batch")
COLUMNS = ["id", "source", "engine", "engine_version", "model", "hf_model", "gpu", "precision", "gemm_quant",
           "moe_quant", "isl", "osl", "concurrency", *(f"{p}_{k}" for p in ("prefill", "decode") for k in POOL),
           "ttft_s", "tpot_s"]

HEADER = """\
Measured disaggregated (prefill/decode) serving points (TTFT, TPOT) of TensorRT-LLM, SGLang and vLLM: lmcost's
held-out set for serve --pd (no engine figure is fitted on them).
Source: aiconfigurator-core {version} (NVIDIA, license Apache-2.0), file {inner} inside
  {wheel} (sha256 {wheel_sha}); the CSV's sha256 {csv_sha}.
Converted {date} by benchmarks/convert_silicon_disagg.py: {kept} of the {disagg} disagg rows kept ({total} rows in all).
Kept: mode disagg, prefill and decode pp_size 1, system h100_sxm/h200_sxm/b200_sxm (lmcost h100-sxm/h200/b200), the
  models and precisions benchmarks/convert_silicon.py keeps, a concurrency given.
Dropped: aggregated rows (serving-silicon.csv), B300, GB200 and GB300 (as convert_silicon.py), models lmcost does
  not model, rows whose source names no silicon_concurrency.
Columns: id and source as given; engine = backend; concurrency = the source's silicon_concurrency (batch_size is
  blank in these rows); per pool (prefill_, decode_): workers = *_num_workers (blank where the source leaves it
  blank: {noworkers} rows), tp = *_tp_size, dp = *_attention_dp_size, ep = *_moe_ep_size, moe_tp = *_moe_tp_size
  (0 or blank -> 1), batch = *_batch_size (blank where blank); ttft_s, tpot_s = silicon_ttft_ms, silicon_tpot_ms / 1000.
"""


def concurrency(source: str) -> int | None:
    m = re.search(r"silicon_concurrency=(\d+)", source)
    return int(m.group(1)) if m else None


def convert(rows: list[dict]) -> tuple[list[dict], Counter]:
    """The kept disagg rows in lmcost's columns, and a count of the dropped ones by reason."""
    kept, dropped = [], Counter()
    for r in rows:
        if r["mode"] != "disagg":
            continue
        c = concurrency(r["silicon_data_source"])
        why = (f"pp {r['prefill_pp_size']}/{r['decode_pp_size']}" if (r["prefill_pp_size"], r["decode_pp_size"]) != ("1", "1")
               else f"GPU {r['system']} not shipped" if r["system"] not in GPUS
               else f"model {r['model_path']} not modelled" if r["model_path"] not in MODELS
               else f"precision {r['precision']} not expressible" if r["precision"] not in PRECISIONS
               else "no concurrency" if c is None else None)
        if why:
            dropped[why] += 1
            continue
        row = dict(id=r["id"], source=r["silicon_data_source"], engine=r["backend"], engine_version=r["backend_version"],
                   model=MODELS[r["model_path"]], hf_model=r["model_path"], gpu=GPUS[r["system"]],
                   precision=r["precision"] or "bf16", gemm_quant=r["gemm_quant_mode"], moe_quant=r["moe_quant_mode"],
                   isl=int(r["isl"]), osl=int(r["osl"]), concurrency=c,
                   ttft_s=float(r["silicon_ttft_ms"]) / 1e3, tpot_s=float(r["silicon_tpot_ms"]) / 1e3)
        for p in ("prefill", "decode"):
            row[f"{p}_workers"] = r[f"{p}_num_workers"]
            row[f"{p}_batch"] = r[f"{p}_batch_size"]
            for k, src in (("tp", "tp_size"), ("dp", "attention_dp_size"), ("ep", "moe_ep_size"), ("moe_tp", "moe_tp_size")):
                row[f"{p}_{k}"] = one(r[f"{p}_{src}"])
        kept.append(row)
    return kept, dropped


def main() -> None:
    a, rows = read_args(__doc__, OUT)
    kept, dropped = convert(rows)
    header = HEADER.format(version="0.12.0", inner=INNER, wheel=a.wheel.name, wheel_sha=sha256(a.wheel),
                           csv_sha=sha256(a.csv), date=datetime.date.today().isoformat(), kept=len(kept),
                           disagg=sum(1 for r in rows if r["mode"] == "disagg"), total=len(rows),
                           noworkers=sum(1 for k in kept if not k["prefill_workers"]))
    write(a.out, header, COLUMNS, kept, dropped, len(rows))


if __name__ == "__main__":
    main()
