"""Convert aiconfigurator-core 0.12.0's measured per-operator tables into lmcost's engine kernel table.

Reads ``<data>/<gpu>/{gemm,attention}/<engine>/<version>/*.parquet`` (aiconfigurator_core/systems/data of
the unpacked wheel; the package is never imported) and writes ``lmcost/data/measurements/engine-kernels.csv``
(the columns of public-kernels.csv plus engine, engine_version, default_kernel) and prints the rows kept
per (gpu, engine, op, dtype) and the rows dropped with why. ``engine-kernels.md`` beside the CSV says what
was kept and how; the counts it quotes are this script's printout.

Per (gpu, engine, op) the newest version folder is read (packaging.version order). Kept: GEMMs in bf16,
fp8 (per-tensor W8A8), fp8_block (block-scaled 128x128, written fp8) and nvfp4 (written fp4); context
attention as attention_prefill (seq_q = seq_kv = isl, causal) and generation attention as
attention_decode (one new token over seq_kv = isl + step keys), bf16 activations and KV cache, no sliding
window, beam 1. Rows faster than 0.98x their lmcost roofline (what lmcost's loader refuses) are dropped.
Each (gpu, engine, op, dtype, implementation) keeps a seeded sample spread over log work (FLOPs; decode:
KV bytes) with its small and its largest shapes.

Run: /work/main/.venv/bin/python benchmarks/convert_aic_kernels.py [DATA] [--out CSV] [--per-default N] [--per-other N]
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lmcost.calibration import measurements as M  # noqa: E402
from lmcost.hardware.gpu import load_gpu  # noqa: E402

DATA = Path("/tmp/aic/x/aiconfigurator_core/systems/data")
OUT = ROOT / "lmcost" / "data" / "measurements" / "engine-kernels.csv"
PACKAGE = "aiconfigurator-core 0.12.0"

#: aic system folder -> (shipped lmcost GPU, the device string aic's rows must carry, SM version)
GPUS = {
    "a100_sxm": ("a100-80gb", "NVIDIA A100-SXM4-80GB", 80),
    "h100_sxm": ("h100-sxm", "NVIDIA H100 80GB HBM3", 90),
    "h200_sxm": ("h200", "NVIDIA H200", 90),
    "b200_sxm": ("b200", "NVIDIA B200", 100),
    "b300_sxm": ("b300", "NVIDIA B300 SXM6 AC", 103),
    "gb200": ("gb200", "NVIDIA GB200", 100),
    "gb300": ("gb300", "NVIDIA GB300", 103),
    "l40s": ("l40s", "NVIDIA L40S", 89),
    "rtx_pro_6000_server": ("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 120),
}
ENGINES = ("vllm", "sglang", "trtllm")
#: aic gemm_dtype -> (lmcost dtype, recipe written into implementation and notes); others are skipped
GEMM_DTYPES = {"bfloat16": ("bf16", ""), "fp8": ("fp8", "per-tensor W8A8"),
               "fp8_block": ("fp8", "block-scaled 128x128"), "nvfp4": ("fp4", "NVFP4")}
TABLES = (("gemm", "gemm", "gemm_perf"), ("attention_prefill", "attention", "context_attention_perf"),
          ("attention_decode", "attention", "generation_attention_perf"))
ATT_SHAPE = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim"]
COLUMNS = ["device", "dtype", "op", "implementation", "M", "N", "K", "batch", "seq_q", "seq_kv", "heads_q",
           "heads_kv", "head_dim", "causal", "tokens", "hidden", "page_size", "time_us", "published_figure",
           "time_derivation", "source", "notes", "engine", "engine_version", "default_kernel"]


def newest(folder: Path, file: str) -> Path | None:
    """The newest version folder under ``folder`` that holds ``file`` (packaging.version order)."""
    if not folder.is_dir():
        return None
    vs = [d for d in folder.iterdir() if d.is_dir() and (d / file).is_file()]
    return max(vs, key=lambda d: Version(d.name)) if vs else None


def lane_defaults(data: Path) -> dict:
    """aic's systems/attention_lane_defaults.yaml: engine -> version -> SM -> lane."""
    return yaml.safe_load((data.parent / "attention_lane_defaults.yaml").read_text()) or {}


def read(path: Path, op: str, drops: Counter, key: tuple) -> pd.DataFrame:
    """One aic table as lmcost rows (before the roofline check), with ``work`` and ``small`` for sampling."""
    d = pd.read_parquet(path)
    d["row"] = np.arange(len(d))
    n0 = len(d)
    if op == "gemm":
        keep = d.gemm_dtype.isin(list(GEMM_DTYPES))
        drops[key + ("weight-only / smooth-quant gemm_dtype (int8_wo, int4_wo, sq, ...)",)] += int((~keep).sum())
        d = d[keep].copy()
        d["dtype"] = d.gemm_dtype.map(lambda g: GEMM_DTYPES[g][0])
        d["recipe"] = d.gemm_dtype.map(lambda g: GEMM_DTYPES[g][1])
        d["M"], d["N"], d["K"] = d.m, d.n, d.k
        d["work"] = 2.0 * d.m * d.n * d.k
        d["small"] = d.m <= 16
        d["shapekey"] = list(zip(d.gemm_dtype, d.m, d.n, d.k))
        d["detail"] = "gemm_dtype " + d.gemm_dtype
        return d
    window = d.window_size if "window_size" in d else 0
    beam = d.beam_width if "beam_width" in d else 1
    keep = (d.attn_dtype == "bfloat16") & (d.kv_cache_dtype == "bfloat16") & (window == 0) & (beam == 1)
    drops[key + ("fp8 attention or KV cache, sliding window or beam > 1",)] += int((~keep).sum())
    d = d[keep]
    if op == "attention_prefill":
        ok = d.step == 0
        drops[key + ("context row over a cached prefix (step > 0)",)] += int((~ok).sum())
        d = d[ok].copy()
        d["seq_q"], d["seq_kv"] = d.isl, d.isl
        s = d.isl.astype(float)
        d["work"] = 4.0 * d.batch_size * d.num_heads * d.head_dim * (s * s - s * (s - 1) / 2)
        d["small"] = d.isl <= 128
    else:
        d = d.copy()
        d["seq_q"], d["seq_kv"] = 1, d.isl + d.step  # s = isl + step: see engine-kernels.md
        d["work"] = 2.0 * 2 * d.batch_size * d.seq_kv * d.num_key_value_heads * d.head_dim  # K and V bytes, bf16
        d["small"] = d.seq_kv <= 128
    ok = d.num_heads % d.num_key_value_heads == 0
    drops[key + ("num_key_value_heads does not divide num_heads",)] += int((~ok).sum())
    d = d[ok].copy()
    d["dtype"], d["recipe"] = "bf16", ""
    d["shapekey"] = list(zip(*(d[c] for c in ATT_SHAPE)))
    d["detail"] = ("isl " + d.isl.astype(str) + ", step " + d.step.astype(str) + ", beam 1, window 0, "
                   "attn_dtype bfloat16, kv_cache_dtype bfloat16")
    return d


def as_rows(d: pd.DataFrame, op: str) -> list[dict]:
    """The table columns lmcost's loader reads of each row (strings, as in the CSV)."""
    out = []
    for r in d.itertuples():
        if op == "gemm":
            out.append(dict(M=str(r.M), N=str(r.N), K=str(r.K)))
        else:
            out.append(dict(batch=str(r.batch_size), seq_q=str(r.seq_q), seq_kv=str(r.seq_kv), heads_q=str(r.num_heads),
                            heads_kv=str(r.num_key_value_heads), head_dim=str(r.head_dim), causal="True"))
    return out


def rooflines(d: pd.DataFrame, op: str, gpu_name: str, cache: dict) -> np.ndarray:
    """lmcost's roofline (s) of each row, through the loader's own kernel records (M._ops, Measurement)."""
    gpu = load_gpu(gpu_name)
    out = np.empty(len(d))
    for i, (row, dtype) in enumerate(zip(as_rows(d, op), d.dtype)):
        k = (gpu_name, op, dtype, tuple(row.values()))
        if k not in cache:
            ops = tuple(M._ops(op, row, dtype, "row"))
            cache[k] = M.Measurement(0, gpu_name, gpu, "", dtype, op, "x", "", ops, 1.0, "x").roofline_s
        out[i] = cache[k]
    return out


def gemm_rooflines(d: pd.DataFrame, gpu_name: str) -> np.ndarray:
    """The GEMM rooflines, vectorised: max(2MNK / peak, (MK + KN + MN) B / bandwidth) (lmcost.operators.ops.linear;
    B = 2 bf16, 1 fp8, M.FP4_BYTES fp4). Checked against :func:`rooflines` on every kept row."""
    gpu = load_gpu(gpu_name)
    B = d.dtype.map({"bf16": 2.0, "fp8": 1.0, "fp4": M.FP4_BYTES}).to_numpy()
    peak = d.dtype.map(gpu.peak_flops).to_numpy()
    m, n, k = (d[c].to_numpy(dtype=float) for c in ("M", "N", "K"))
    t = np.maximum(2 * m * n * k / peak, (m * k + k * n + m * n) * B / gpu.bandwidth)
    return np.maximum(t, (gpu.kernel_floor_us or 0.0) * 1e-6)


def pick(d: pd.DataFrame, n: int, rng: np.random.Generator) -> list:
    """Up to ``n`` row labels of ``d``: about a sixth from the small shapes, the largest, the rest one per
    equal-width bin of log work (a random row of each bin), topped up at random."""
    if len(d) <= n:
        return list(d.index)
    chosen: list = []
    small = d.index[d.small.to_numpy()]
    if len(small):
        chosen += list(rng.choice(small, min(max(n // 6, 1), len(small)), replace=False))
    big = d.work.idxmax()
    if big not in chosen:
        chosen.append(big)
    rest = n - len(chosen)
    lw = np.log(d.work.to_numpy())
    edges = np.linspace(lw.min(), lw.max(), rest + 1)
    bins = np.clip(np.digitize(lw, edges[1:-1]), 0, rest - 1)
    taken = set(chosen)
    for b in range(rest):
        cand = [x for x in d.index[bins == b] if x not in taken]
        if cand:
            x = cand[int(rng.integers(len(cand)))]
            chosen.append(x)
            taken.add(x)
    left = [x for x in d.index if x not in taken]
    if len(chosen) < n and left:
        chosen += list(rng.choice(left, min(n - len(chosen), len(left)), replace=False))
    return chosen


def defaults(d: pd.DataFrame, engine: str, version: str, sm: int, lanes: dict) -> tuple[np.ndarray, str]:
    """default_kernel of each row, and how it was decided.

    A table whose every shape carries one kernel_source records the kernel the engine dispatched for that
    shape (the split follows the shape: head_dim 512 to FA4 / triton / FlashInfer, block-FP8 GEMMs to DeepGEMM
    where it takes the shape): every row is the default. A table where some shapes carry several kernels is
    a sweep of attention backends: the default is the lane aic's attention_lane_defaults.yaml names for the
    engine, version and SM; with no such entry no row is marked default."""
    n = d.groupby("shapekey").kernel_source.transform("nunique")
    if (n <= 1).all():
        return np.ones(len(d), bool), "one kernel per shape: the engine's own dispatch"
    lane = (lanes.get(engine, {}).get(version, {}) or {}).get(sm)
    if lane is None:
        return np.zeros(len(d), bool), f"several kernels per shape; no lane default for {engine} {version} SM{sm}"
    return (d.kernel_source == lane).to_numpy(), f"several kernels per shape: lane {lane!r} from attention_lane_defaults.yaml"


def convert(data: Path, per_default: int, per_other: int) -> tuple[pd.DataFrame, Counter, Counter, list, list]:
    """All kept rows (COLUMNS), drops by (gpu, engine, op, why), the sampled-from pool sizes, the
    default-kernel decisions and the first few rows faster than their roofline (for the record)."""
    lanes = lane_defaults(data)
    drops, pool, decisions, fast, parts, cache = Counter(), Counter(), [], [], [], {}
    for folder, (gpu_name, device, sm) in GPUS.items():
        for engine in ENGINES:
            for op, sub, stem in TABLES:
                vdir = newest(data / folder / sub / engine, stem + ".parquet")
                if vdir is None:
                    continue
                key = (gpu_name, engine, op)
                d = read(vdir / (stem + ".parquet"), op, drops, key)
                devs = set(d.device)
                if devs != {device}:
                    raise SystemExit(f"error: {vdir}: device {sorted(devs)} is not {device!r}; check the GPU map")
                d["default_kernel"], how = defaults(d, engine, vdir.name, sm, lanes)
                decisions.append((gpu_name, engine, op, vdir.name, how))
                roof = gemm_rooflines(d, gpu_name) if op == "gemm" else rooflines(d, op, gpu_name, cache)
                t = d.latency.to_numpy() * 1e-3
                bad = t < 0.98 * roof
                drops[key + ("faster than 0.98x its lmcost roofline",)] += int(bad.sum())
                for i in np.flatnonzero(bad)[:3]:
                    fast.append((gpu_name, engine, op, int(d.row.iloc[i]), str(d.shapekey.iloc[i]), t[i] * 1e6, roof[i] * 1e6))
                d = d[~bad]
                rel = vdir.relative_to(data).as_posix()
                for (dt, rec, ks), g in d.groupby(["dtype", "recipe", "kernel_source"], sort=True):
                    is_default = g.default_kernel.to_numpy()
                    rng = np.random.default_rng(zlib.crc32(f"{gpu_name}/{engine}/{op}/{dt}/{rec}/{ks}".encode()))
                    idx = pick(g[is_default], per_default, rng) + pick(g[~is_default], per_other, rng)
                    pool[key + (dt, ks + (f" ({rec})" if rec else ""))] += len(g)
                    s = g.loc[sorted(idx, key=lambda x: g.row[x])].copy()
                    s["device"], s["op"], s["engine"], s["engine_version"] = gpu_name, op, engine, vdir.name
                    s["implementation"] = ks + (f" ({rec})" if rec else "")
                    s["source"] = f"{PACKAGE}: systems/data/{rel}/{stem}.parquet"
                    s["notes"] = ("parquet row " + s.row.astype(str) + "; kernel_source " + ks + "; " + s.detail
                                  + (f" ({rec})" if rec else ""))
                    parts.append(s)
    out = pd.concat(parts, ignore_index=True)
    out["time_us"] = (out.latency * 1000).round(4)
    out["published_figure"] = out.latency.map(lambda x: f"{x:.6g} ms")
    out["time_derivation"] = "aic latency (ms) x 1000"
    out["batch"] = out.get("batch_size")
    out["heads_q"], out["heads_kv"] = out.get("num_heads"), out.get("num_key_value_heads")
    att = out.op != "gemm"
    out.loc[att, "causal"] = "True"
    for c in COLUMNS:
        if c not in out:
            out[c] = ""
    out = out[COLUMNS].copy()
    for c in ("M", "N", "K", "batch", "seq_q", "seq_kv", "heads_q", "heads_kv", "head_dim"):
        out[c] = out[c].map(lambda v: "" if pd.isna(v) or v == "" else str(int(v)))
    return out, drops, pool, decisions, fast


def check(out: pd.DataFrame) -> None:
    """Every kept row loads through lmcost's loader (the vectorised GEMM roofline included)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "t.csv"
        out.to_csv(p, index=False)
        ms, skipped = M.load_table(p)
    assert len(ms) == len(out) and not skipped, (len(ms), len(out), skipped[:3])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data", nargs="?", type=Path, default=DATA, help=f"aic systems/data folder (default {DATA})")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--per-default", type=int, default=40, help="rows kept per default-kernel group (default 40)")
    ap.add_argument("--per-other", type=int, default=12, help="rows kept per non-default group (default 12)")
    a = ap.parse_args(argv)
    if not a.data.is_dir():
        print(f"error: data: {a.data} is not a folder; give aiconfigurator_core/systems/data of the unpacked wheel")
        return 2
    out, drops, pool, decisions, fast = convert(a.data, a.per_default, a.per_other)
    check(out)
    out.to_csv(a.out, index=False)
    print(f"wrote {a.out}: {len(out)} rows, {a.out.stat().st_size / 1e6:.2f} MB")
    print("\nkept rows per (gpu, engine, op, dtype) [of the rows sampled from]:")
    cnt = out.groupby(["device", "engine", "op", "dtype"]).size()
    pooled = Counter()
    for (g, e, o, dt, _), n in pool.items():
        pooled[(g, e, o, dt)] += n
    for k, n in cnt.items():
        print(f"  {' '.join(k)}: {n} [{pooled[k]}]")
    print("\ndropped rows per (gpu, engine, op, why):")
    for k, n in sorted(drops.items()):
        if n:
            print(f"  {' '.join(k[:3])}: {n} {k[3]}")
    print("\ndefault_kernel decisions:")
    for g, e, o, v, how in decisions:
        print(f"  {g} {e} {v} {o}: {how}")
    print("\nfirst rows faster than their roofline (gpu engine op parquet-row shape measured_us roofline_us):")
    for f in fast:
        print("  " + " ".join(str(x) for x in f[:5]) + f" {f[5]:.3f} {f[6]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
