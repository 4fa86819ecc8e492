"""Engine profiles (issue 25): per GPU and serving engine (vLLM, SGLang, TensorRT-LLM), the efficiency model's
GEMM and attention figures fitted on that engine's measured per-operator rows (lmcost/data/measurements/
engine-kernels.csv, converted from aiconfigurator-core 0.12.0's tables), and the error they leave on rows they
were not fitted on.

Fitting set: the rows of the engine's default kernel (the table's ``default_kernel`` column) on the GPU: GEMMs
(bf16: the tile/split-K model's peak_fraction and k_half, the largest split-K factor (:data:`SPLIT_K_CAPS`), the
memory-bound bandwidth and the per-call floor; fp8 and fp4: one peak_fraction and per-call floor each, of that
dtype's peak, plus the activation-quantization pass of :func:`lmcost.cost.efficiency.activation_quant_time`, no
figure of its own), prefill attention (peak_fraction, l_half, per-call time and per-thread-block time, with the
occupancy term of :func:`lmcost.cost.efficiency.prefill_occupancy` and the block term of
:func:`lmcost.cost.efficiency.attention_cta_time`) and decode attention (bandwidth fraction, per-call time,
per-block time, and the keys per KV split that fits best of :data:`DECODE_SPLITS`).
The fitters are :mod:`lmcost.calibration.efficiency_fit`'s; each row is taken relative to its own GPU's peak
and bandwidth.

Errors, on rows not fitted on:
- leave one GPU out (LOGO): a GPU's rows of an engine predicted by that engine's profile fitted on the other
  GPUs' rows, pooled (each relative to its own GPU);
- leave one engine out (LOEO): an engine's rows on a GPU predicted by the profile fitted on the other engines'
  rows on that GPU, pooled.
Bands: per engine and class, the 5th-95th percentiles of the LOGO ratios measured / predicted; coverage: the
share of a GPU's rows inside the bands computed from the other GPUs' LOGO ratios.

GPUs with no block of the public table's fit (B200, B300, GB200, GB300, L40S, RTX PRO 6000) get a base block
fitted on every engine's default rows pooled (:func:`base_block`); memory-bound kinds there have no rows and take
the public table's pooled figures (a stated prior).
"""

from __future__ import annotations

import csv
import dataclasses
from collections import defaultdict
from pathlib import Path

import numpy as np

from lmcost.calibration.efficiency_fit import (BASE_DECODE, BASE_PREFILL, BW_GRID, OVERHEAD_GRID_US, PEAK_GRID, PRIOR_WEIGHT,
                                               REUSE_FULL,
                                               SPLIT_K, TILES, Arrays, _band, _fit_decode, _fit_gemm, _fit_prefill,
                                               _gemm_shape, _loss, _predict, _pull, _rows, _sm_count, fit_family, L_HALF_GRID,
                                               profile_dict, SM_COUNTS)
from lmcost.calibration.measurements import Measurement
from lmcost.cost.efficiency import (ACT_QUANT_BYTES, activation_quant_time, attention_rate_factor, decode_occupancy,
                                    gemm_shape_efficiency)
from lmcost.hardware.efficiency import DecodeFigures, EngineProfile, GemmEfficiency, PrefillFigures

#: The classes an engine profile has figures (and errors, bands) of.
ENGINE_CLASSES = ("gemm", "attention_prefill", "attention_decode")
#: Keys per KV split a decode kernel may use (0: no split): FlashAttention's split-KV over blocks of 128 keys
#: (flash_api.cpp num_splits_heuristic), FlashInfer's and TensorRT-LLM XQA's multi-block modes over chunks of
#: 256-1024 (recalled); the best fitting one is taken per engine and GPU.
DECODE_SPLITS = (0, 128, 256, 512, 1024)
#: GEMM operand dtypes with a fraction of their own (of that dtype's peak).
LOW_DTYPES = ("fp8", "fp4")


#: Largest head dimension fitted: the flash kernels' tiles (:data:`lmcost.cost.efficiency.PREFILL_BLOCK_M`) are
#: those of head dims up to 256; a 512-wide head runs another kernel (vLLM's FA4 rows on Hopper), left out.
MAX_HEAD_DIM = 256


def fitting_rows(path: str | Path) -> dict[int, str]:
    """Per 1-based data row of an engine table, "" if it is fitted on, else why not: not the engine's default
    kernel (``default_kernel`` false), an fp8 GEMM with block-scaled operands (DeepSeek-style 128x128 scales: lmcost's
    fp8 is per-tensor W8A8, and the block-scaled kernels carry their own activation quantization, 60-180 us per
    call in these tables), or attention with a head dim above :data:`MAX_HEAD_DIM`."""
    with Path(path).open(newline="", encoding="utf-8-sig") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for i, r in enumerate(rows, 1):
        why = ""
        if (r.get("default_kernel") or "true").strip().lower() not in ("true", "1", "yes"):
            why = "not the engine's default kernel"
        elif r.get("op") == "gemm" and r.get("dtype") == "fp8" and "block-scaled" in (r.get("implementation") or ""):
            why = "block-scaled fp8 (lmcost's fp8 is per-tensor W8A8)"
        elif (r.get("head_dim") or "").strip() and float(r["head_dim"]) > MAX_HEAD_DIM:
            why = f"head dim above {MAX_HEAD_DIM} (another kernel)"
        out[i] = why
    return out


def arrays(ms: list[Measurement]) -> Arrays:
    """:class:`Arrays` of the rows (SM counts from :func:`_sm_count`: a block's, else the cited table)."""
    return Arrays(list(ms))


#: Largest split-K factor searched per profile (the menu is SPLIT_K's factors up to it): engines' GEMM libraries
#: split K less than the model's 64 ways allow. TensorRT-LLM's CUTLASS heuristics try split factors up to a limit
#: of 7 (cpp/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp, SPLIT_K_LIMIT; recalled), cuBLASLt's
#: heuristics pick a splitK_num per algorithm; a skinny GEMM over a long K (M = 225, N = 32, K = 7168) then runs
#: its few tiles' K loops nearly serially: 5-6 us measured where a 64-way split predicts 2.5 us (issue 25, second round).
SPLIT_K_CAPS = (4, 8, 16, 64)


def _fit_gemm_capped(a: Arrays) -> tuple[float, float, float, float, list[int]]:
    """:func:`lmcost.calibration.efficiency_fit._fit_gemm` under each split-K menu of :data:`SPLIT_K_CAPS`,
    the menu whose fit leaves the least mean |log ratio| on ``a``: (peak_fraction, k_half, bandwidth fraction,
    per-call us, split-K menu)."""
    best = (np.inf, None)
    for cap in SPLIT_K_CAPS:
        menu = [s for s in SPLIT_K if s <= cap]
        p, kh, bw, ov = _fit_gemm(a, split_k=menu)
        loss = float(_loss(_predict(a, a.peak * _gemm_shape(a.mnk, a.sm, kh, menu) * p, a.bw * bw, ov * 1e-6), a.meas))
        if loss < best[0] - 1e-12:
            best = (loss, (p, kh, bw, ov, menu))
    return best[1]


def _quant_time(a: Arrays, dtype: str, bw: float):
    """Per row, seconds of the activation-quantization pass of ``dtype`` GEMMs (0 for bf16/fp16) at ``bw`` of
    each row's bandwidth (:func:`lmcost.cost.efficiency.activation_quant_time`)."""
    return activation_quant_time(ACT_QUANT_BYTES.get(dtype, 0.0), a.mnk[0], a.mnk[2], a.bw * bw)


def _gemm_level(a: Arrays, k_half: float, bw: float, prior: float, prior_ov: float, dtype: str,
                split_k=tuple(SPLIT_K)) -> tuple[float, float]:
    """(peak_fraction, per-call us) of GEMM rows of one ``dtype`` with the shape (k_half, split-K menu) and
    bandwidth fixed, each row's activation-quantization pass (:func:`_quant_time`) added to its per-call time."""
    shape = _gemm_shape(a.mnk, a.sm, k_half, split_k)
    ovs = np.array(OVERHEAD_GRID_US)
    pred = _predict(a, a.peak * shape * PEAK_GRID[:, None, None], a.bw * bw,
                    ovs[None, :, None] * 1e-6 + _quant_time(a, dtype, bw))
    loss = (_loss(pred, a.meas) + PRIOR_WEIGHT * np.abs(np.log(PEAK_GRID / prior))[:, None]
            + PRIOR_WEIGHT * np.abs(np.log((ovs + 1.0) / (prior_ov + 1.0)))[None, :])
    i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return float(PEAK_GRID[i]), float(ovs[j])


#: Microseconds per thread block searched (:func:`lmcost.cost.efficiency.attention_cta_time`), pulled toward 0
#: (no term) as a per-call time is toward its prior: a block's fixed work is a few hundred ns to a few us (a
#: dependent chain of global loads at ~0.5-1 us DRAM latency each, CUDA C++ Best Practices Guide, "Device
#: Memory Spaces"), so 4 us per block bounds it. Seven values: each multiplies the prefill search's time.
CTA_GRID_US = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0)


def _fit_prefill_joint(a: Arrays, bw_fraction: float) -> PrefillFigures:
    """peak_fraction, l_half, per-call time and per-block time (:data:`CTA_GRID_US`) of prefill rows searched
    together (mean |log ratio|, pulled toward efficiency_fit's base prior, the block time toward 0).
    :func:`lmcost.calibration.efficiency_fit._fit_prefill` fits the ramp first with no per-call time, on the
    shape of each source's curve: right for the public table's large kernels, wrong here, where each (GPU,
    engine) table is one source down to 10-us kernels whose floor a steep ramp then imitates."""
    lh = np.array(L_HALF_GRID)[:, None, None, None]
    ovs = np.array(OVERHEAD_GRID_US)
    ramp = attention_rate_factor(lh, *a.mnk) * a.prefill_occupancy()
    ctas = a.ctas_per_sm() * 1e-6
    b = BASE_PREFILL
    prior = (_pull(L_HALF_GRID, b.l_half, 64.0)[:, None, None]
             + _pull(PEAK_GRID, b.peak_fraction)[None, :, None] + _pull(OVERHEAD_GRID_US, b.overhead_us, 1.0)[None, None, :])
    best = (np.inf, None)
    for c, pull in zip(CTA_GRID_US, _pull(CTA_GRID_US, 0.0, 1.0)):
        pred = _predict(a, a.peak * ramp * PEAK_GRID[None, :, None, None], a.bw * bw_fraction,
                        ovs[None, None, :, None] * 1e-6) + c * ctas
        loss = _loss(pred, a.meas) + prior + pull
        i = int(np.argmin(loss))
        if loss.flat[i] < best[0] - 1e-12:
            best = (float(loss.flat[i]), (*np.unravel_index(i, loss.shape), c))
    i, j, k, c = best[1]
    return PrefillFigures(peak_fraction=float(PEAK_GRID[j]), l_half=float(L_HALF_GRID[i]), overhead_us=float(ovs[k]),
                          cta_us=float(c), rows=_rows(a.ms))


def _fit_decode_cta(a: Arrays, split_tokens: int) -> DecodeFigures:
    """bandwidth fraction, per-call time and per-block time (:data:`CTA_GRID_US`, pulled toward 0) of decode
    rows at ``split_tokens`` keys per split: :func:`lmcost.calibration.efficiency_fit._fit_decode`'s search
    with :func:`lmcost.cost.efficiency.attention_cta_time` added."""
    occ = decode_occupancy(float(split_tokens), a.sm, *a.mnk)
    ctas = a.ctas_per_sm() * 1e-6
    ovs = np.array(OVERHEAD_GRID_US)
    b = BASE_DECODE
    prior = _pull(BW_GRID, b.bandwidth_fraction)[:, None] + _pull(OVERHEAD_GRID_US, b.overhead_us, 1.0)[None, :]
    best = (np.inf, None)
    for c, pull in zip(CTA_GRID_US, _pull(CTA_GRID_US, 0.0, 1.0)):
        pred = _predict(a, a.peak, BW_GRID[:, None, None] * a.bw * occ, ovs[None, :, None] * 1e-6) + c * ctas
        loss = _loss(pred, a.meas) + prior + pull
        i = int(np.argmin(loss))
        if loss.flat[i] < best[0] - 1e-12:
            best = (float(loss.flat[i]), (*np.unravel_index(i, loss.shape), c))
    i, j, c = best[1]
    return DecodeFigures(bandwidth_fraction=float(BW_GRID[i]), split_tokens=split_tokens, overhead_us=float(ovs[j]),
                         cta_us=float(c), rows=_rows(a.ms))


def fit_profile(ms: list[Measurement], sm_count: int, version: str) -> EngineProfile | None:
    """The profile fitted on one engine's default-kernel rows ``ms`` (one GPU, or several pooled) for a device
    of ``sm_count`` SMs; None without bf16 GEMM rows. A class without rows takes efficiency_fit's base prior."""
    by = defaultdict(list)
    for m in ms:
        by[m.op].append(m)
    g16 = [m for m in by["gemm"] if m.dtype in ("bf16", "fp16")]
    if not g16:
        return None
    p, kh, bw, ov, menu = _fit_gemm_capped(arrays(g16))
    low = {d: _gemm_level(arrays(rs), kh, bw, p, ov, d, menu)
           for d in LOW_DTYPES if (rs := [m for m in by["gemm"] if m.dtype == d])}
    dec_rows = by["attention_decode"]
    if dec_rows:
        a = arrays(dec_rows)
        fits = [_fit_decode_cta(a, s) for s in DECODE_SPLITS]
        losses = [float(_loss(_decode_times(a, f), a.meas)) for f in fits]
        dec = fits[int(np.argmin(losses))]
    else:
        dec = BASE_DECODE.model_copy(update={"rows": "no rows: efficiency_fit's base prior"})
    pre_rows = by["attention_prefill"]
    pre = _fit_prefill_joint(arrays(pre_rows), dec.bandwidth_fraction) if pre_rows else None
    if pre is None:
        pre = BASE_PREFILL.model_copy(update={"rows": "no rows: efficiency_fit's base prior"})
    gemm = GemmEfficiency(peak_fraction=p, sm_count=sm_count, k_half=kh, tiles=[list(t) for t in TILES],
                          split_k=list(menu), reuse_full=REUSE_FULL)
    return EngineProfile(version=version, gemm=gemm, gemm_dtype_fraction={d: v[0] for d, v in low.items()},
                         gemm_dtype_overhead_us={d: v[1] for d, v in low.items()}, gemm_quantize_dtypes=sorted(low),
                         gemm_bandwidth_fraction=bw,
                         attention_prefill=pre, attention_decode=dec, overhead_us=ov)


def _decode_times(a: Arrays, f: DecodeFigures):
    occ = decode_occupancy(float(f.split_tokens), a.sm, *a.mnk)
    return _predict(a, a.peak, a.bw * f.bandwidth_fraction * occ, f.overhead_us * 1e-6) + f.cta_us * 1e-6 * a.ctas_per_sm()


def predict_rows(ms: list[Measurement], prof: EngineProfile) -> np.ndarray:
    """Seconds ``prof`` predicts for each row (its own GPU's peak, bandwidth and SM count): the efficiency model
    of :func:`lmcost.cost.efficiency.expected_times` under :meth:`Efficiency.with_engine`, evaluated on arrays
    (tests/test_engine_fit.py checks it against :func:`lmcost.calibration.efficiency_fit.predict`)."""
    out = np.empty(len(ms))
    idx = defaultdict(list)
    for i, m in enumerate(ms):
        idx[m.op].append(i)
    for op, ix in idx.items():
        a = arrays([ms[i] for i in ix])
        if op == "gemm":
            frac = np.array([prof.gemm_dtype_fraction.get(ms[i].dtype, prof.gemm.peak_fraction) for i in ix])
            shape = np.empty(len(ix))
            for sm in np.unique(a.sm):  # the profile's own tile menu, at each row's SM count
                sel = a.sm == sm
                shape[sel] = gemm_shape_efficiency(prof.gemm.model_copy(update={"sm_count": int(sm)}), *a.mnk[:, sel])
            bw = prof.gemm_bandwidth_fraction or 1.0
            ov = np.array([prof.gemm_dtype_overhead_us.get(ms[i].dtype, prof.overhead_us) for i in ix]) * 1e-6
            qb = np.array([ACT_QUANT_BYTES[ms[i].dtype] if ms[i].dtype in prof.gemm_quantize_dtypes else 0.0 for i in ix])
            ov = ov + activation_quant_time(qb, a.mnk[0], a.mnk[2], a.bw * bw)
            t = _predict(a, a.peak * shape * frac, a.bw * bw, ov)
        elif op == "attention_prefill":
            f = prof.attention_prefill
            rate = a.peak * f.peak_fraction * attention_rate_factor(f.l_half, *a.mnk) * a.prefill_occupancy()
            t = (_predict(a, rate, a.bw * prof.attention_decode.bandwidth_fraction, f.overhead_us * 1e-6)
                 + f.cta_us * 1e-6 * a.ctas_per_sm())
        elif op == "attention_decode":
            t = _decode_times(a, prof.attention_decode)
        else:
            raise ValueError(f"engine profiles have no {op} figures")
        out[ix] = t
    return out


@dataclasses.dataclass
class EngineFit:
    """What :func:`fit_engines` found. ``profiles``: (gpu, engine) -> EngineProfile (fitted on all its rows);
    ``logo`` / ``loeo``: (gpu, engine, class) -> list of ratios measured / predicted on held-out rows;
    ``bands``: (engine, class) -> [low, high]; ``coverage``: (engine, class) -> share of held-out rows inside
    bands computed without their GPU; ``rows``: (gpu, engine, class) -> rows fitted; ``versions``: engine ->
    version per GPU."""

    profiles: dict
    logo: dict
    loeo: dict
    bands: dict
    coverage: dict
    rows: dict
    gpus: dict


def _by(ms, *keys):
    out = defaultdict(list)
    for m in ms:
        out[tuple(k(m) for k in keys)].append(m)
    return out


def _cls(m):
    return m.cls


def fit_engines(ms: list[Measurement], progress=None) -> EngineFit:
    """Fit every (GPU, engine) profile of the default-kernel rows ``ms`` and evaluate it leaving one GPU out and
    leaving one engine out (module doc). ``progress(done, total)`` follows the held-out fits."""
    ms = [m for m in ms if m.cls in ENGINE_CLASSES and m.engine]
    groups = _by(ms, lambda m: m.gpu.name, lambda m: m.engine)
    gpus = {m.gpu.name: m.gpu for m in ms}
    engines = sorted({m.engine for m in ms})
    profiles, logo, loeo, rows = {}, defaultdict(list), defaultdict(list), {}
    tasks = []  # (what, gpu, engine, rows to fit, SMs, version): the profile itself, then held out by GPU and by engine
    for (g, e), rs in sorted(groups.items()):
        sm, v = _sm_count(gpus[g]), _version(rs)
        for c in ENGINE_CLASSES:
            rows[(g, e, c)] = sum(1 for m in rs if m.cls == c)
        tasks.append(("fit", g, e, rs, sm, v))
        tasks.append(("logo", g, e, [m for (g2, e2), r2 in groups.items() if e2 == e and g2 != g for m in r2], sm, v))
        tasks.append(("loeo", g, e, [m for (g2, e2), r2 in groups.items() if g2 == g and e2 != e for m in r2], sm, v))
    for j, ((what, g, e, _, _, _), prof) in enumerate(zip(tasks, _map_fits(tasks))):
        if what == "fit":
            if prof is not None:
                profiles[(g, e)] = prof
        else:
            _held_out(groups[(g, e)], prof, logo if what == "logo" else loeo, g, e)
        if progress:
            progress(j + 1, len(tasks))
    bands, coverage = {}, {}
    for e in engines:
        for c in ENGINE_CLASSES:
            ratios = [r for (g, e2, c2), rr in logo.items() if e2 == e and c2 == c for r in rr]
            if len(ratios) < 2:
                continue
            bands[(e, c)] = _band(ratios)
            inside = []
            for g in {g for (g, e2, c2) in logo if e2 == e and c2 == c}:
                rest = [r for (g2, e2, c2), rr in logo.items() if e2 == e and c2 == c and g2 != g for r in rr]
                if len(rest) >= 2:
                    lo, hi = _band(rest)
                    inside += [lo <= r <= hi for r in logo[(g, e, c)]]
            coverage[(e, c)] = float(np.mean(inside)) if inside else float("nan")
    profiles = {k: p.model_copy(update={"bands": {c: list(bands[(k[1], c)]) for c in ENGINE_CLASSES
                                                  if (k[1], c) in bands}}) for k, p in profiles.items()}
    return EngineFit(profiles=profiles, logo=dict(logo), loeo=dict(loeo), bands=bands, coverage=coverage,
                     rows=rows, gpus=gpus)


#: Processes the (GPU, engine) fits run in: the held-out fits are independent, and each is seconds of numpy.
WORKERS = 2


def _fit_task(task):
    _, _, _, rs, sm, v = task
    return fit_profile(rs, sm, v)


def _map_fits(tasks):
    """The profiles of ``tasks`` in order, fitted in :data:`WORKERS` processes (in this one for a few)."""
    if len(tasks) <= 6 or WORKERS <= 1:
        return [_fit_task(t) for t in tasks]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(_fit_task, tasks, chunksize=1))


def _version(rs) -> str:
    vs = sorted({m.engine_version for m in rs if m.engine_version})
    return "/".join(vs) if vs else "unstated"


def _held_out(rs, prof, out, g, e):
    if prof is None:
        return
    t = predict_rows(rs, prof)
    for m, p in zip(rs, t):
        out[(g, e, m.cls)].append(m.time_s / p)


def median_error(ratios) -> float:
    """Median |predicted / measured - 1| of ratios measured / predicted."""
    return float(np.median([abs(1 / r - 1) for r in ratios])) if len(ratios) else float("nan")


def summary_rows(f: EngineFit) -> list[dict]:
    """Per engine and class (and ``all`` engines): rows, GPUs, the LOGO and LOEO median |error|, band, coverage."""
    out = []
    for e in [*sorted({k[1] for k in f.logo}), "all"]:
        for c in ENGINE_CLASSES:
            sel = lambda d: [r for (g, e2, c2), rr in d.items() if (e == "all" or e2 == e) and c2 == c for r in rr]  # noqa: E731
            lg, lo = sel(f.logo), sel(f.loeo)
            n = sum(v for (g, e2, c2), v in f.rows.items() if (e == "all" or e2 == e) and c2 == c)
            band = f.bands.get((e, c))
            cov = [f.coverage[(e2, c)] for e2 in {k[1] for k in f.logo} if (e == "all" or e2 == e) and (e2, c) in f.coverage]
            out.append(dict(engine=e, op_class=c, rows=n,
                            gpus=len({g for (g, e2, c2), v in f.rows.items() if (e == "all" or e2 == e) and c2 == c and v}),
                            logo_median_abs_error=None if not lg else round(median_error(lg), 4),
                            loeo_median_abs_error=None if not lo else round(median_error(lo), 4),
                            band_low=band[0] if band else None, band_high=band[1] if band else None,
                            band_coverage=_coverage(f, e, c)))
    return out


def _coverage(f: EngineFit, e: str, c: str):
    """Share of held-out rows inside bands computed without their GPU (all engines: rows weighted)."""
    if e != "all":
        v = f.coverage.get((e, c))
        return None if v is None or v != v else round(v, 3)
    num = den = 0
    for (e2, c2), v in f.coverage.items():
        if c2 == c and v == v:
            n = sum(len(rr) for (g, e3, c3), rr in f.logo.items() if e3 == e2 and c3 == c)
            num, den = num + v * n, den + n
    return round(num / den, 3) if den else None


def gpu_rows(f: EngineFit) -> list[dict]:
    """Per GPU, engine and class: rows, LOGO and LOEO median |error| (the report's finest table)."""
    out = []
    for (g, e, c), n in sorted(f.rows.items()):
        if not n:
            continue
        out.append(dict(gpu=g, engine=e, op_class=c, rows=n,
                        logo_median_abs_error=round(median_error(f.logo.get((g, e, c), [])), 4),
                        loeo_median_abs_error=round(median_error(f.loeo.get((g, e, c), [])), 4)))
    return out


def base_block(ms: list[Measurement], gpu, prior, bands: dict):
    """The efficiency block of a GPU the public table's fit has no block for: the profile fitted on every
    engine's default rows on it pooled (:func:`fit_profile`: GEMMs per dtype, prefill, decode) over
    :func:`fit_family` of no rows, which gives the memory-bound kinds ``prior``'s figures (the public table's
    pooled fit: no engine rows of them), each saying so. ``bands``: per class [low, high]."""
    rows = [m for m in ms if m.gpu.name == gpu.name and m.cls in ENGINE_CLASSES]
    sm = _sm_count(gpu)
    eff = fit_family([], sm, bands, prior=prior)
    prof = fit_profile(rows, sm, "pooled")
    bw, ov = dict(eff.bandwidth_fraction), dict(eff.kernel_overhead_us)
    bw["gemm"], ov["gemm"] = prof.gemm_bandwidth_fraction, prof.overhead_us
    bw["attention"], ov["attention"] = prof.attention_decode.bandwidth_fraction, prof.attention_decode.overhead_us
    return eff.model_copy(update=dict(gemm=prof.gemm, gemm_dtype_fraction=dict(prof.gemm_dtype_fraction),
                                      gemm_dtype_overhead_us=dict(prof.gemm_dtype_overhead_us),
                                      gemm_quantize_dtypes=list(prof.gemm_quantize_dtypes),
                                      bandwidth_fraction=bw, kernel_overhead_us=ov,
                                      attention_prefill={"auto": prof.attention_prefill},
                                      attention_decode={"auto": prof.attention_decode}))


def base_block_dict(eff, gpu, table: str, digest: str, n_rows: int, band_donor: str) -> dict:
    """A base block (:func:`base_block`) as the mapping a hardware YAML holds, ``sources`` naming every figure
    and ``fit`` saying it came from the engines pooled."""
    d = eff.model_dump(mode="json")
    out = dict(gemm={k: d["gemm"][k] for k in ("peak_fraction", "sm_count", "k_half", "tiles", "split_k", "reuse_full")})
    for k in ("gemm_dtype_fraction", "gemm_dtype_overhead_us", "gemm_quantize_dtypes", "bandwidth_fraction", "kernel_overhead_us",
              "attention_prefill", "attention_decode", "kinds"):
        out[k] = d[k]
    out["bands"] = {k: list(v) for k, v in d["bands"].items()}
    sm_source = SM_COUNTS.get(gpu.name, (0, f"{gpu.name}: streaming multiprocessors"))[1]
    out["sources"] = {
        "gemm.sm_count": sm_source,
        "gemm.tiles, gemm.split_k, gemm.reuse_full": "lmcost.calibration.efficiency_fit: CUTLASS/cuBLAS threadblock "
                                                      "tiles and split-K factors; full rate from a 128x128 tile's operand reuse",
        "kinds, bandwidth_fraction (default)": "no engine rows of memory-bound kernels: the public-kernels.csv fit pooled "
                                               "over every family (a stated prior)",
        "*": f"lmcost fit --engines on {table} (sha256 {digest}), {gpu.name}'s default-kernel rows of every engine "
             f"pooled; bands of gemm/attention: leave-one-GPU-out, of norm/elementwise/softmax: {band_donor}'s public fit",
    }
    out["fit"] = dict(table=f"{table}, engines pooled", sha256=digest, rows=n_rows)
    return out
