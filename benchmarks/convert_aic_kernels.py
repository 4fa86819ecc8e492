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


#: Overrides of aic's lane map where the engine's own source says otherwise: (engine, version, SM) ->
#: (lane, citation). aic's attention_lane_defaults.yaml gives SGLang 0.5.14 on SM100/103 triton, citing a
#: Qwen3.5-MoE case file (a hybrid GDN model, for which SGLang does pick triton) and marked "FIXME(lane-map):
#: verify"; for the dense MHA decoders lmcost costs, SGLang's own dispatch picks trtllm_mha.
LANE_OVERRIDES = {
    ("sglang", "0.5.14", sm): ("trtllm_mha", "sglang 0.5.14 wheel (PyPI sglang==0.5.14), sglang/srt/server_args.py "
                               "ServerArgs._get_default_attn_backend (lines 4407-4450): an MHA model (Llama, Qwen) "
                               "gets fa3 on Hopper, trtllm_mha where is_sm100_supported() (compute capability 10.x: "
                               "SM100, SM103; sglang/srt/utils/common.py line 282) without speculative topk > 1, "
                               "else flashinfer, else triton; triton on SM100 only for Qwen3Next / Qwen3.5 hybrid "
                               "GDN architectures and MiniCPM-V 4.6 (server_args.py lines 4180-4218)")
    for sm in (100, 103)
}


def lane_defaults(data: Path) -> dict:
    """aic's systems/attention_lane_defaults.yaml (engine -> version -> SM -> lane), without LANE_OVERRIDES."""
    return yaml.safe_load((data.parent / "attention_lane_defaults.yaml").read_text()) or {}


def default_lane(lanes: dict, engine: str, version: str, sm: int) -> tuple[str | None, str]:
    """The default attention lane of (engine, version, SM) and where it came from: LANE_OVERRIDES (the
    engine's source) before aic's map ``lanes``; (None, reason) where neither names one."""
    if (engine, version, sm) in LANE_OVERRIDES:
        lane = LANE_OVERRIDES[(engine, version, sm)][0]
        aic = (lanes.get(engine, {}).get(version, {}) or {}).get(sm)
        return lane, f"lane {lane!r} from the engine's source (LANE_OVERRIDES), overriding aic's {aic!r}"
    lane = (lanes.get(engine, {}).get(version, {}) or {}).get(sm)
    if lane is None:
        return None, f"no lane default for {engine} {version} SM{sm}"
    return lane, f"lane {lane!r} from attention_lane_defaults.yaml"


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
    a sweep of attention backends: the default is the lane :func:`default_lane` names for the engine,
    version and SM (LANE_OVERRIDES, then aic's attention_lane_defaults.yaml); with none no row is default."""
    n = d.groupby("shapekey").kernel_source.transform("nunique")
    if (n <= 1).all():
        return np.ones(len(d), bool), "one kernel per shape: the engine's own dispatch"
    lane, how = default_lane(lanes, engine, version, sm)
    if lane is None:
        return np.zeros(len(d), bool), f"several kernels per shape; {how}"
    return (d.kernel_source == lane).to_numpy(), f"several kernels per shape: {how}"


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


MD_HEAD = """\
# Engine kernel timings (vLLM, SGLang, TensorRT-LLM) from aiconfigurator-core 0.12.0

File: `engine-kernels.csv` ({rows:,} rows), written by `benchmarks/convert_aic_kernels.py` (this file too):

    /work/main/.venv/bin/python benchmarks/convert_aic_kernels.py /tmp/aic/x/aiconfigurator_core/systems/data \\
        --per-default {per_default} --per-other {per_other}

**Source.** aiconfigurator-core 0.12.0 (NVIDIA, licence Apache-2.0; the wheel unpacked, never imported):
the per-operator latency tables `aiconfigurator_core/systems/data/<gpu>/<op>/<engine>/<version>/*.parquet`
(`latency` in ms), measured by NVIDIA's collectors inside each engine. Each row's `source` names its file and
`notes` its 0-based row in that file (`parquet row N`), its `kernel_source` and the table's other coordinates.

**Kept.** GPUs (aic folder -> lmcost GPU; every row's `device` string was checked): a100_sxm -> a100-80gb
(`NVIDIA A100-SXM4-80GB`), h100_sxm -> h100-sxm, h200_sxm -> h200, b200_sxm -> b200, b300_sxm -> b300,
gb200 -> gb200, gb300 -> gb300, l40s -> l40s, rtx_pro_6000_server -> rtx-pro-6000 (b60, a30, l4 and the
PCIe parts are not read). Engines vllm, sglang, trtllm; per (gpu, engine, op) the newest version folder
holding the table (packaging.version order; `engine_version`). Ops:
- `gemm` from `gemm_perf`: C[M,N] = A[M,K] B[K,N] with aic's m, n, k; gemm_dtype bfloat16 -> bf16,
  fp8 -> fp8 (per-tensor W8A8), fp8_block -> fp8 (block-scaled 128x128; the recipe is in `implementation`
  and `notes`), nvfp4 -> fp4 (NVFP4). Weight-only and SmoothQuant rows (int8_wo, int4_wo, sq) are not kept.
- `attention_prefill` from `context_attention_perf`: batch = batch_size, seq_q = seq_kv = isl, causal True,
  heads_q = num_heads, heads_kv = num_key_value_heads, head_dim; rows with step 0 (no cached prefix) only.
- `attention_decode` from `generation_attention_perf`: one new token per sequence, seq_q 1,
  **seq_kv = isl + step**. Every generation row has isl 1 and step 1, 3, 7, ..., 131071, so seq_kv runs
  2, 4, 8, ..., 131072: the grid is laid out in powers of two of isl + step. aic keys these tables by
  s = isl + step: its collection notes say so in words ("loader key s = isl + step",
  `systems/data/h100_sxm/msa/vllm/0.24.0/collection_meta.yaml` lines 7-12, and the same note in every
  msa/*/collection_meta.yaml; the note also records that the msa collector once cached kv-1 tokens and
  re-keyed those rows, which touches msa only, not these attention tables), and its decode query counts the
  current token: `sdk/rust_engine_step.py` line 659 ("one step ... at `s = isl + osl//2 + 1`"), and the
  compiled module's docstring of `predict_decode_latency` ("osl=2 (one decode step at `s = isl + 1`)").
  So a row with (isl, step) attended to isl + step keys, the new token's own included.
- attention rows in bf16 only (attn_dtype and kv_cache_dtype bfloat16), window_size 0 (or no such column),
  beam_width 1, and num_key_value_heads dividing num_heads.

**Sampling.** Each (gpu, engine, op, dtype, implementation) keeps up to {per_default} of its default-kernel
rows and up to {per_other} of its other rows, drawn with a numpy Generator seeded by the CRC32 of the group's
name: about a sixth from its small shapes (GEMM m <= 16, prefill isl <= 128, decode seq_kv <= 128: the
per-call floor), its largest shape, then one row at random from each of the remaining equal-width bins of
log work (GEMM 2MNK FLOPs; prefill 4 b h d (s^2 - s(s-1)/2) FLOPs; decode K and V bytes 4 b seq_kv h_kv d),
topped up at random where bins are empty. Rows are written in parquet row order within a group.

**Columns.** Those of `public-kernels.csv` plus three. `device`: the lmcost GPU. `dtype`: bf16, fp8 or fp4.
`implementation`: aic's `kernel_source` (with the GEMM recipe in brackets where not bf16). Shape columns as
above; `tokens`, `hidden`, `page_size` empty (aic does not give the page size). `time_us` = latency (ms) x
1000, rounded to 1e-4 us; `published_figure` the ms value; `time_derivation` says so. `engine`: vllm,
sglang or trtllm. `engine_version`: the version folder. `default_kernel`: True where the row's kernel is
the one the engine runs by default for that op, dtype and shape on that GPU (below).

**default_kernel, how decided.** In every table but SGLang's Blackwell attention tables each shape carries
exactly one kernel_source: the collector ran the engine's own dispatch and recorded which kernel served the shape (the
split follows the shape: vLLM runs FA4 / SGLang triton / TensorRT-LLM FlashInfer for head_dim 512, vLLM's
block-FP8 GEMMs go to DeepGEMM, CUTLASS or FlashInfer by shape, vLLM on B200 serves isl 1 context rows with
its TRT-LLM decode kernel); all such rows are default_kernel True. Where some shapes carry several kernels
(SGLang 0.5.14 attention on B200, B300, GB200, GB300: trtllm_mha, triton and flashinfer measured side by
side; its prefill on RTX PRO 6000: flashinfer and triton) the table is a sweep of attention backends, and the
default is the backend SGLang's own dispatch picks for a dense MHA decoder (Llama, Qwen, Mistral: the models
lmcost costs). The sglang 0.5.14 wheel (PyPI `sglang==0.5.14`), `sglang/srt/server_args.py`,
`ServerArgs._get_default_attn_backend` (lines 4407-4450): an MHA model gets fa3 on Hopper (CUDA >= 12.3),
**trtllm_mha where `is_sm100_supported()`** (compute capability 10.x, so SM100 and SM103: B200, GB200, B300,
GB300; `sglang/srt/utils/common.py` line 282) unless speculative decoding runs with topk > 1, else
flashinfer if available (SM120: trtllm_mha does not run there), else triton. So trtllm_mha is default on
B200, B300, GB200 and GB300 (triton and flashinfer not), flashinfer on RTX PRO 6000. This overrides, for
SM100 and SM103 only, aic's `systems/attention_lane_defaults.yaml` (lines 8-16: SGLang 0.5.14 by SM 90 fa3,
100 and 103 **triton**, 120 flashinfer), which stays the converter's reading for SM90 and SM120, where the
source agrees; the override is the small cited table `LANE_OVERRIDES` in the converter. aic's entry is
model-specific: it cites `collector/cases/models/Qwen3_5MoeForConditionalGeneration_cases.yaml`, a Qwen3.5-MoE
hybrid (Gated DeltaNet) model, for which SGLang does pick triton on SM100 (`server_args.py` lines 4180-4218:
the Qwen3Next, Qwen3.5 and InternS2 hybrids get triton unless trtllm_mha's page-size needs are met, MiniCPM-V
4.6 triton), and carries "FIXME(lane-map): verify against sglang 0.5.14 attention-backend default dispatch".
Before this override (lmcost up to the `sgdef` branch) triton was flagged default on those four GPUs. fp8 carries two recipes
(per-tensor and block-scaled) in each engine: both are default_kernel True, each for its own recipe. The
one-kernel-per-shape rule takes the collector's dispatch as the engine's default; where an engine's
default depends on a flag the collector did not vary (vLLM's VLLM_USE_DEEP_GEMM, for one), the row is the
dispatch under the collector's environment. Decisions per table:

{decisions}

**Rows faster than their roofline.** lmcost's loader refuses a row faster than 0.98x its roofline on the
lmcost GPU (the datasheet's peak and bandwidth); such rows were dropped (the counts below) after looking at
the first ones. They are of two kinds. (1) Working sets that fit in L2: the collectors repeat a kernel on
the same buffers, so operands can stay in L2. On L40S and RTX PRO 6000 most drops are of this kind (e.g.
l40s vllm decode, batch 32, seq_kv 8192, 1 KV head, head_dim 64: 67 MB of K and V in 42.8 us, 1.6 TB/s
against 0.864 TB/s of DRAM; the largest L40S decode working set dropped is 101 MB, none larger: a cache's
size, not a misread shape; neither card's L2 size is verified in lmcost's GPU files). Every dropped GEMM on
those two cards is memory-bound (none beats the compute peak); those below 0.9x their roofline have working
sets of at most 80-141 MB (per engine), and beyond 150 MB no row is under 0.947x: within a few percent of
the DRAM bandwidth, as a partly warm cache gives. On H100, H200 and
the Blackwell parts they are memory-bound GEMMs with M = 8k-32k and N <= 128 (e.g. h100 vllm bf16
32768x64x512: 38 MB, under H100's 50 MB of L2, in 8.8 us vs 11.3 us at 3.35 TB/s). Those are real times of a warm cache, not of a served model's cold
weights, and have no place in a DRAM roofline fit. (2) The A100 TensorRT-LLM 1.0.0 decode table (provenance
"legacy"), whose times run from 0.59x to thousands of times the roofline with no pattern of L2 size (e.g.
batch 32, 64 heads, head_dim 128, seq_kv 256: 268 MB of K and V in 121.7 us, 2.2 TB/s against 2.04 TB/s,
while seq_kv 512 takes 320 us): its rows are kept where they pass the check, but treat that table with care.
Apart from that A100 table no dropped row points to a misread shape: aic's num_heads is the heads of the one
GPU measured (its tables sweep heads 1-128 with no TP column), and the faster-than-roofline rows sit at the
small working sets a cache holds, not at one head count or head_dim.

## Rows kept per (gpu, engine, op, dtype) [rows sampled from, after the filters]

{kept}

## Rows dropped per (gpu, engine, op)

{dropped}

## First rows faster than their roofline (gpu engine op parquet-row shape measured_us roofline_us)

{fast}
"""


def write_md(path: Path, out: pd.DataFrame, drops: Counter, pool: Counter, decisions: list, fast: list, a) -> None:
    """``engine-kernels.md``: MD_HEAD with this run's counts."""
    pooled = Counter()
    for (g, e, o, dt, _), n in pool.items():
        pooled[(g, e, o, dt)] += n
    cnt = out.groupby(["device", "engine", "op", "dtype"]).size()
    kept = "\n".join(["| gpu | engine | op | dtype | kept | of |", "|---|---|---|---|---|---|"]
                     + [f"| {' | '.join(k)} | {n} | {pooled[k]} |" for k, n in cnt.items()])
    dropped = "\n".join(["| gpu | engine | op | rows | why |", "|---|---|---|---|---|"]
                        + [f"| {' | '.join(k[:3])} | {n} | {k[3]} |" for k, n in sorted(drops.items()) if n])
    dec = "\n".join(f"- {g} {e} {v} {o}: {how}" for g, e, o, v, how in decisions)
    fst = "\n".join("- " + " ".join(str(x) for x in f[:5]) + f" {f[5]:.3f} {f[6]:.3f}" for f in fast)
    path.write_text(MD_HEAD.format(rows=len(out), per_default=a.per_default, per_other=a.per_other,
                                   decisions=dec, kept=kept, dropped=dropped, fast=fst))


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
    write_md(a.out.with_suffix(".md"), out, drops, pool, decisions, fast, a)
    print(f"wrote {a.out} and its .md: {len(out)} rows, {a.out.stat().st_size / 1e6:.2f} MB")
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
