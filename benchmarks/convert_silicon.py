"""Convert aiconfigurator-core 0.12.0's measured serving points into lmcost's fitting set for ``serve``.

Reads ``aiconfigurator_core/systems/silicon_sample.csv`` (extracted from the wheel; the package is never
imported) and writes ``lmcost/data/measurements/serving-silicon.csv``: the aggregated (mode agg), pp 1
rows on GPUs lmcost ships, of models it costs exactly, in lmcost's names and seconds, after ``#`` lines
citing the source. Prints the rows kept per engine, GPU and model, and those dropped with why.

Run: .venv/bin/python benchmarks/convert_silicon.py [--csv PATH] [--out PATH] [--wheel PATH]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL = Path("/tmp/aic/aiconfigurator_core-0.12.0-cp311-abi3-manylinux_2_28_x86_64.whl")
INNER = "aiconfigurator_core/systems/silicon_sample.csv"
CSV = Path("/tmp/aic/x") / INNER
OUT = ROOT / "lmcost" / "data" / "measurements" / "serving-silicon.csv"

GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200"}
MODELS = {  # model_path -> shipped lmcost model (same architecture; the checkpoint's precision is its own column)
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b", "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "Qwen/Qwen3-32B": "qwen3-32b", "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3", "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3", "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "moonshotai/Kimi-K2.5": "kimi-k2",
}
PRECISIONS = {"bf16", "fp8", "fp4", ""}  # "" is written bf16 (see HEADER); int4 (int4_wo, group 32) has no recipe
COLUMNS = ["id", "source", "engine", "engine_version", "model", "hf_model", "gpu", "precision", "gemm_quant",
           "moe_quant", "isl", "osl", "concurrency", "tp", "pp", "dp", "ep", "moe_tp", "ttft_s", "tpot_s"]

HEADER = """\
Measured serving points (TTFT, TPOT) of TensorRT-LLM, vLLM and SGLang: lmcost's fitting and evaluation set for serve.
Source: aiconfigurator-core {version} (NVIDIA, license Apache-2.0), file {inner} inside
  {wheel} (sha256 {wheel_sha}); the CSV's sha256 {csv_sha}.
Converted {date} by benchmarks/convert_silicon.py: {kept} of {total} rows kept.
Kept: mode agg, pp_size 1, system h100_sxm/h200_sxm/b200_sxm (lmcost h100-sxm/h200/b200), models lmcost ships:
  {models}.
Dropped: disaggregated rows, B300 and GB200 (not shipped), MiniMax-M2.5, Qwen3.5-397B-A17B and GLM-5
  (architectures lmcost does not model yet), Kimi-K2.5 int4 rows (int4_wo, group-32 weight-only: no lmcost recipe).
Columns: id and source as given (source = silicon_data_source); engine = backend; concurrency = batch_size (the
  benchmark's concurrency); dp = attention_dp_size, ep = moe_ep_size, moe_tp = moe_tp_size (0 or blank -> 1);
  ttft_s, tpot_s = silicon_ttft_ms, silicon_tpot_ms / 1000. precision bf16, fp8 or fp4 as given; blank in
  {blank} rows (bf16 checkpoints Llama-3.1-8B-Instruct and Qwen3-32B on H100): written bf16, quant columns left blank.
  engine_version blank where the source leaves it blank ({noversion} rows).
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "not available"


def one(v: str) -> int:
    """A parallel degree: 0 or blank (not used by the run) -> 1."""
    return int(v) if v not in ("", "0") else 1


def convert(rows: list[dict]) -> tuple[list[dict], Counter]:
    """The kept rows in lmcost's columns, and a count of the dropped ones by reason."""
    kept, dropped = [], Counter()
    for r in rows:
        why = ("disaggregated" if r["mode"] != "agg" else f"pp {r['pp_size']}" if r["pp_size"] != "1"
               else f"GPU {r['system']} not shipped" if r["system"] not in GPUS
               else f"model {r['model_path']} not modelled" if r["model_path"] not in MODELS
               else f"precision {r['precision']} not expressible" if r["precision"] not in PRECISIONS else None)
        if why:
            dropped[why] += 1
            continue
        kept.append(dict(
            id=r["id"], source=r["silicon_data_source"], engine=r["backend"], engine_version=r["backend_version"],
            model=MODELS[r["model_path"]], hf_model=r["model_path"], gpu=GPUS[r["system"]],
            precision=r["precision"] or "bf16", gemm_quant=r["gemm_quant_mode"], moe_quant=r["moe_quant_mode"],
            isl=int(r["isl"]), osl=int(r["osl"]), concurrency=int(r["batch_size"]), tp=int(r["tp_size"]),
            pp=1, dp=one(r["attention_dp_size"]), ep=one(r["moe_ep_size"]), moe_tp=one(r["moe_tp_size"]),
            ttft_s=float(r["silicon_ttft_ms"]) / 1e3, tpot_s=float(r["silicon_tpot_ms"]) / 1e3))
    return kept, dropped


def read_args(doc: str, out: Path) -> tuple[argparse.Namespace, list[dict]]:
    """The command line (``--csv``, ``--out`` defaulting to ``out``, ``--wheel``) and the source CSV's rows."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=CSV, help="silicon_sample.csv extracted from the wheel")
    ap.add_argument("--out", type=Path, default=out, help="the converted CSV")
    ap.add_argument("--wheel", type=Path, default=WHEEL, help="the wheel (its sha256 is cited)")
    a = ap.parse_args()
    with a.csv.open(newline="") as f:
        return a, list(csv.DictReader(f))


def write(out: Path, header: str, columns: list[str], kept: list[dict], dropped: Counter, total: int) -> None:
    """Write ``kept`` to ``out`` after ``header`` as ``#`` lines, and print what was kept and dropped."""
    with out.open("w", newline="") as f:
        f.write("".join(f"# {line}\n" for line in header.splitlines()))
        w = csv.DictWriter(f, columns, lineterminator="\n")
        w.writeheader()
        w.writerows(kept)
    print(f"{len(kept)} of {total} rows written to {out}")
    for key in ("engine", "gpu", "model"):
        print(f"by {key}: " + ", ".join(f"{k} {n}" for k, n in sorted(Counter(r[key] for r in kept).items())))
    print("dropped: " + "; ".join(f"{why} {n}" for why, n in dropped.most_common()))


def main() -> None:
    a, rows = read_args(__doc__, OUT)
    kept, dropped = convert(rows)
    header = HEADER.format(
        version="0.12.0", inner=INNER, wheel=a.wheel.name, wheel_sha=sha256(a.wheel), csv_sha=sha256(a.csv),
        date=datetime.date.today().isoformat(), kept=len(kept), total=len(rows),
        models=", ".join(f"{k} -> {v}" for k, v in MODELS.items()),
        blank=sum(1 for r in rows if r["precision"] == "" and r["id"] in {k["id"] for k in kept}),
        noversion=sum(1 for k in kept if not k["engine_version"]))
    write(a.out, header, COLUMNS, kept, dropped, len(rows))


if __name__ == "__main__":
    main()
