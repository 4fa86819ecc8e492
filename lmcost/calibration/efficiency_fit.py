"""Fit the efficiency model (v2, :mod:`lmcost.cost.efficiency`) on a table of measured kernel times, and say
what error it leaves on measurements it was not fitted on.

For each architecture family (Ampere, Hopper; :data:`lmcost.calibration.measurements.FAMILIES`) the rows of every
device of the family are pooled, each relative to its own device's peak and bandwidth, and fitted by
grid search minimising the mean |log(predicted / measured)| (an L1 loss on ratios: robust to the odd
inconsistent published figure, and symmetric in over- and under-prediction):

- GEMMs: peak_fraction and k_half of the tile/split-K menu model, and the bandwidth fraction and
  per-call time of memory-bound (decode) GEMMs;
- prefill attention, per kernel family and ``auto`` (all families): peak_fraction, l_half, per-call time;
- decode attention, per kernel family and ``auto``: bandwidth fraction and per-call time (the split-KV
  behaviour of each family is fixed from its source code: :data:`SPLIT_TOKENS`);
- memory-bound kernels, per runtime and ``auto``, per kind and per class (the fallback for kinds without
  rows): bandwidth fraction and per-call time; ``default`` pools every memory-bound row.

Error: leave-one-source-out. Each source's rows are predicted by the model fitted on every other
source (with the default selection, ``--kernel auto --runtime auto``, as a user who does not name their
kernel gets), and the ratios measured / predicted give the median |error| per class and the bands
(5th and 95th percentiles). The bands are checked the same way: for each source, bands computed
without it, and the share of its rows inside them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.cost.efficiency import (attention_cta_time, attention_rate_factor, decode_occupancy, gemm_shape_efficiency, kernel_time,
                                    prefill_occupancy)
from lmcost.hardware.efficiency import DecodeFigures, Efficiency, GemmEfficiency, KindFigures, PrefillFigures
from lmcost.cost.roofline import op_time
from lmcost.calibration.measurements import CLASSES, FAMILIES, Measurement, class_of
from lmcost.cost.timing import expected_time

#: The GEMM tile menu (CUTLASS's and cuBLAS's common threadblock tiles on Ampere and Hopper: 256x128,
#: 128x256, 128x128, 128x64, 64x128, 64x64) and split-K factors the model chooses among (a skinny GEMM
#: with a long K splits it up to 64 ways; each slice keeps at least MIN_SPLIT_K of K).
TILES = [[256, 128], [128, 256], [128, 128], [128, 64], [64, 128], [64, 64]]
SPLIT_K = [1, 2, 4, 8, 16, 32, 64]
#: Operand reuse of a 128x128 tile (128*128/256 = 64 MACs per element loaded): CUTLASS's default tile
#: on Ampere and Hopper, taken to feed the tensor cores at full rate; smaller tiles run at reuse/64.
REUSE_FULL = 64.0

#: Keys per KV split of each decode kernel family (0: the kernel does not split the keys):
#: FlashAttention-2/3 split-KV (flash_api.cpp, num_splits_heuristic over blocks of 128 keys at head dim
#: 128); vLLM PagedAttention V2 partitions of 512 tokens (csrc/attention, PARTITION_SIZE); V1 does not split.
SPLIT_TOKENS = {"paged-v1": 0, "paged-v2": 512}
#: Decode kernels that read each KV head once per query head (vLLM's PagedAttention V1/V2 run one thread
#: block per query head, so a GQA group of g heads reads its KV up to g times, partly from L2): lmcost's
#: decode model (KV bytes once per KV head) does not describe them, so their own figures absorb it and
#: ``auto`` is fitted on the kernels it does describe (FlashAttention's split-KV, which packs a group).
REREAD_KV = ("paged-v1", "paged-v2")
SPLIT_DEFAULT = 128

#: Grids searched (fractions of peak or bandwidth; keys; microseconds per call).
PEAK_GRID = np.round(np.arange(0.10, 1.0001, 0.01), 2)
#: Bandwidth fractions stop at 0.95: no kernel streams at the datasheet rate (gpu-specs.md: streaming
#: reads reach roughly 75-90%; the best published GEMV on H100 reaches about 0.92-0.94).
BW_GRID = np.round(np.arange(0.10, 0.9501, 0.01), 2)
K_HALF_GRID = (0.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
L_HALF_GRID = (0.0, 32.0, 64.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0, 1536.0, 2048.0, 3072.0, 4096.0)
OVERHEAD_GRID_US = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0)

#: Weight of the pull toward the prior (the fit pooled over every family) per parameter, in the loss's
#: units (mean |log ratio|) per unit |log(value / prior)|: it decides directions the rows leave flat
#: (an overhead no small kernel constrains) and barely moves a constrained one.
PRIOR_WEIGHT = 0.03

#: The base prior, pulled toward when nothing better is known (the pooled fit itself, or a direction no
#: row constrains). Source: tests/data/gpu-specs.md's notes on measured reality: "large GEMMs reach
#: roughly 70-95% of dense peak, streaming reads roughly 75-90% of bandwidth, and every kernel costs at
#: least a few microseconds"; flash attention forward: 50-73% of A100's peak (Dao 2023, FlashAttention-2,
#: abstract), 0.6 taken, rising with the keys per query from about a quarter of peak at s = 512 to over
#: half at 16k (FlashAttention-2's A100 benchmarks, as issue 12 quotes them): 0.6 * 512 / (512 + l_half)
#: = 0.25 gives l_half = 768. Midpoints: 0.8 of peak, 0.8 of bandwidth, 3 us per call.
BASE_KIND = KindFigures(bandwidth_fraction=0.8, overhead_us=3.0)
BASE_GEMM = (0.8, 0.0, 0.8, 3.0)
BASE_PREFILL = PrefillFigures(peak_fraction=0.6, l_half=768.0, overhead_us=3.0)
BASE_DECODE = DecodeFigures(bandwidth_fraction=0.8, split_tokens=SPLIT_DEFAULT, overhead_us=3.0)

#: Band percentiles (of measured / predicted). Residuals cluster by source (a source's clock, harness
#: and variant move all its rows together), so a band must hold for a source it has not seen: the 10th-90th
#: percentiles held 33-79% of held-out sources' rows per class, the 5th-95th 42-87% (80% in GEMMs,
#: prefill attention), which is the width kept.
BAND_PCT = (5, 95)


@dataclass
class Arrays:
    """What the loss needs of a set of rows, as arrays [rows]."""

    ms: list
    flops: np.ndarray = field(init=False)
    bytes_: np.ndarray = field(init=False)
    peak: np.ndarray = field(init=False)
    bw: np.ndarray = field(init=False)
    meas: np.ndarray = field(init=False)
    roof: np.ndarray = field(init=False)
    mnk: np.ndarray = field(init=False)
    sm: np.ndarray = field(init=False)
    q: np.ndarray = field(init=False)
    inside: np.ndarray = field(init=False)

    def __post_init__(self):
        ms = self.ms
        main = [m.main for m in ms]
        self.flops = np.array([float(op.flops) for op in main])
        self.bytes_ = np.array([float(sum(o.bytes for o in m.ops)) for m in ms])
        self.peak = np.array([m.gpu.peak_flops(m.dtype) if op.matmul else m.gpu.vector_flops for m, op in zip(ms, main)])
        self.bw = np.array([m.gpu.bandwidth for m in ms])
        self.meas = np.array([m.time_s for m in ms])
        # The roofline of the whole kernel (its in-kernel softmax at the vector rate included), and of
        # the in-kernel part alone (added to the kernel's own time, as the model does).
        self.roof = np.array([m.roofline_s for m in ms])
        self.inside = np.array([sum(float(op_time(o, m.gpu, Precision(m.dtype, m.dtype, m.dtype)).time_s)
                                    for o in m.ops if not o.kernels) for m in ms])
        self.mnk = np.array([[float(v) for v in (op.mnk or (1, 1, 1))] for op in main]).T if ms else np.zeros((3, 0))
        self.sm = np.array([float(_sm_count(m.gpu)) for m in ms])
        self.q = np.array([float(getattr(op, "q_per_stream", 1) or 1) for op in main])

    def ctas_per_sm(self):
        """Per row, a flash kernel's thread blocks per SM (:func:`attention_cta_time` at 1 us per block, in us)."""
        return attention_cta_time(1e6, self.sm, self.q, self.mnk[0], self.mnk[1])

    def prefill_occupancy(self):
        """Per row, the share of SMs a flash prefill kernel keeps busy (:func:`prefill_occupancy`)."""
        return prefill_occupancy(self.sm, self.q, self.mnk[0], self.mnk[1])


#: Streaming multiprocessors of GPUs that may have no efficiency block yet (a block's gemm.sm_count wins), with
#: where each is from: the thread blocks that run at once, for wave quantization and occupancy.
SM_COUNTS = {
    "b200": (148, "NVIDIA Blackwell architecture technical brief: B200 148 SMs"),
    "gb200": (148, "the B200 die of GB200 (148 SMs as B200, NVIDIA Blackwell technical brief); not stated per GB200 SKU"),
    "b300": (160, "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (160 SMs, full die); SMs enabled per B300 "
                  "SKU not read, so an upper bound"),
    "gb300": (160, "NVIDIA technical blog 'Inside NVIDIA Blackwell Ultra' (160 SMs, full die); SMs enabled per GB300 "
                   "SKU not read, so an upper bound"),
    "l40s": (142, "NVIDIA L40S datasheet / Ada Lovelace architecture whitepaper: 142 SMs"),
    "rtx-pro-6000": (188, "NVIDIA RTX Blackwell GPU architecture whitepaper: RTX PRO 6000 188 SMs (tests/data/gpu-specs.md [k])"),
}


def _sm_count(gpu) -> int:
    if gpu.efficiency is not None:
        return gpu.efficiency.gemm.sm_count
    return SM_COUNTS.get(gpu.name, (1, ""))[0]


def _predict(a: Arrays, rate, bandwidth, overhead_s):
    """The model's time of each row, broadcast over grids of achieved ``rate`` (FLOP/s), ``bandwidth``
    (B/s) and ``overhead_s``: :func:`lmcost.cost.efficiency.kernel_time` of the kernel, never below its
    roofline, plus its in-kernel softmax at its roofline (as :func:`lmcost.cost.efficiency.expected_times`)."""
    return np.maximum(kernel_time(a.flops, a.bytes_, 1.0, rate, bandwidth, overhead_s), a.roof - a.inside) + a.inside


def _loss(pred, meas):
    """Mean |log(pred / meas)| over the last axis."""
    return np.mean(np.abs(np.log(pred / meas)), axis=-1)


def _best(loss: np.ndarray, *grids):
    i = np.unravel_index(int(np.argmin(loss)), loss.shape)
    return tuple(float(g[j]) for g, j in zip(grids, i))


def _pull(grid, prior, shift: float = 0.0):
    """PRIOR_WEIGHT * |log((grid + shift) / (prior + shift))| (0 without a prior); shift keeps 0 us finite."""
    if prior is None:
        return np.zeros(len(grid))
    return PRIOR_WEIGHT * np.abs(np.log((np.asarray(grid, dtype=float) + shift) / (prior + shift)))


def _fit_memory(a: Arrays, prior: KindFigures | None = None) -> KindFigures:
    """bandwidth_fraction and overhead of t = ov + bytes / (f * BW) (never below the roofline)."""
    bw = BW_GRID[:, None, None]
    ov = np.array(OVERHEAD_GRID_US)[None, :, None] * 1e-6
    pred = _predict(a, a.peak, bw * a.bw, ov)
    loss = _loss(pred, a.meas)
    prior = prior or BASE_KIND
    loss = loss + _pull(BW_GRID, prior.bandwidth_fraction)[:, None] + _pull(OVERHEAD_GRID_US, prior.overhead_us, 1.0)[None, :]
    f, o = _best(loss, BW_GRID, OVERHEAD_GRID_US)
    return KindFigures(bandwidth_fraction=f, overhead_us=o, rows=_rows(a.ms))


def _gemm_shape(mnk, sm, k_half, split_k=tuple(SPLIT_K)):
    out = np.empty(mnk.shape[1])
    for s in np.unique(sm):
        sel = sm == s
        g = GemmEfficiency(peak_fraction=1.0, sm_count=int(s), k_half=k_half, tiles=TILES, split_k=list(split_k),
                           reuse_full=REUSE_FULL)
        out[sel] = gemm_shape_efficiency(g, *mnk[:, sel])
    return out


def _fit_gemm(a: Arrays, prior: tuple | None = None, split_k=tuple(SPLIT_K)) -> tuple[float, float, float, float]:
    """(peak_fraction, k_half, bandwidth_fraction, overhead_us) of the GEMM rows (tile menu TILES, split-K
    factors ``split_k``)."""
    best = (math.inf, None)
    pf = PEAK_GRID[:, None, None, None]
    bw = BW_GRID[None, :, None, None]
    ov = np.array(OVERHEAD_GRID_US)[None, None, :, None] * 1e-6
    prior = prior or BASE_GEMM
    for kh in K_HALF_GRID:
        shape = _gemm_shape(a.mnk, a.sm, kh, split_k)
        pred = _predict(a, a.peak * shape * pf, a.bw * bw, ov)
        loss = (_loss(pred, a.meas) + _pull(PEAK_GRID, prior[0])[:, None, None] + _pull([kh], prior[1], 16.0)[0]
                + _pull(BW_GRID, prior[2])[None, :, None] + _pull(OVERHEAD_GRID_US, prior[3], 1.0)[None, None, :])
        i = int(np.argmin(loss))
        if loss.flat[i] < best[0] - 1e-12:
            p, b, o = _best(loss, PEAK_GRID, BW_GRID, OVERHEAD_GRID_US)
            best = (float(loss.flat[i]), (p, kh, b, o))
    return best[1]


def _source_index(ms: list) -> np.ndarray:
    """Row -> index of its source."""
    keys = {src: i for i, src in enumerate(sorted({m.source for m in ms}))}
    return np.array([keys[m.source] for m in ms])


def _within_source_loss(log_ratio: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Mean |r - median of r over the row's source| over the last axis: the error left once each source
    may sit at its own level (a source's clock, harness and variant scale all its rows alike), so only
    the shape of each source's curve is judged."""
    out = np.zeros(log_ratio.shape[:-1])
    for g in np.unique(src):
        r = log_ratio[..., src == g]
        out += np.sum(np.abs(r - np.median(r, axis=-1, keepdims=True)), axis=-1)
    return out / log_ratio.shape[-1]


def _fit_prefill(a: Arrays, bw_fraction: float, prior: PrefillFigures | None = None) -> PrefillFigures:
    """Two steps. The ramp (l_half) is fitted to the shape of each source's curve over the keys per query
    (:func:`_within_source_loss`): sources disagree on the level of the same kernel at the same shape by
    up to 2x and agree on how it rises with L. Then the level (peak_fraction) and the per-call time are
    fitted on all rows pooled, with that ramp."""
    prior = prior or BASE_PREFILL
    src = _source_index(a.ms)
    bw = a.bw * bw_fraction
    lh_grid = np.array(L_HALF_GRID)
    occ = a.prefill_occupancy()
    pred = _predict(a, a.peak * attention_rate_factor(lh_grid[:, None], *a.mnk) * occ * prior.peak_fraction, bw, 0.0)
    shape_loss = _within_source_loss(np.log(pred / a.meas), src) + _pull(lh_grid, prior.l_half, 64.0)
    lh = float(lh_grid[int(np.argmin(shape_loss))])
    pf = PEAK_GRID[:, None, None]
    ov = np.array(OVERHEAD_GRID_US)[None, :, None] * 1e-6
    pred = _predict(a, a.peak * attention_rate_factor(lh, *a.mnk) * occ * pf, bw, ov)
    loss = (_loss(pred, a.meas) + _pull(PEAK_GRID, prior.peak_fraction)[:, None]
            + _pull(OVERHEAD_GRID_US, prior.overhead_us, 1.0)[None, :])
    p, o = _best(loss, PEAK_GRID, OVERHEAD_GRID_US)
    return PrefillFigures(peak_fraction=p, l_half=lh, overhead_us=o, rows=_rows(a.ms))


def _fit_decode(a: Arrays, split_tokens: int, prior: DecodeFigures | None = None) -> DecodeFigures:
    bw = BW_GRID[:, None, None]
    ov = np.array(OVERHEAD_GRID_US)[None, :, None] * 1e-6
    occ = decode_occupancy(float(split_tokens), a.sm, *a.mnk)
    pred = _predict(a, a.peak, bw * a.bw * occ, ov)
    loss = _loss(pred, a.meas)
    prior = prior or BASE_DECODE
    loss = loss + _pull(BW_GRID, prior.bandwidth_fraction)[:, None] + _pull(OVERHEAD_GRID_US, prior.overhead_us, 1.0)[None, :]
    f, o = _best(loss, BW_GRID, OVERHEAD_GRID_US)
    return DecodeFigures(bandwidth_fraction=f, split_tokens=split_tokens, overhead_us=o, rows=_rows(a.ms))


def _rows(ms: list) -> str:
    """Provenance of a figure: the table rows it was fitted on, by source."""
    by = defaultdict(list)
    for m in ms:
        by[m.source].append(m.index)
    return "; ".join(f"{src} (rows {_ranges(ix)})" for src, ix in sorted(by.items()))


def _ranges(ix: list[int]) -> str:
    ix, out, start = sorted(ix), [], None
    for j, v in enumerate(ix):
        if start is None:
            start = v
        if j + 1 == len(ix) or ix[j + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ",".join(out)


def fit_family(ms: list[Measurement], sm_count: int, bands: dict | None = None,
               prior: Efficiency | None = None) -> Efficiency | None:
    """The efficiency block fitted on the rows ``ms`` (one architecture family), for a device with
    ``sm_count`` SMs; None when there are no rows and no prior. ``bands``: per class (low, high).

    ``prior``: the block fitted on every family pooled. Each parameter is pulled toward the prior's
    (:data:`PRIOR_WEIGHT`), and a class this family has no rows of takes the prior's figures (relative
    to this device's own peak and bandwidth), their ``rows`` saying so.
    """
    if not ms and prior is None:
        return None
    by_op = defaultdict(list)
    for m in ms:
        by_op[m.op].append(m)
    memory_ops = [m for m in ms if m.op not in ("gemm", "attention_prefill", "attention_decode")]
    p_kinds = (prior.kinds.get("auto", {}) if prior else {})
    default = _fit_memory(Arrays(memory_ops), p_kinds.get("default")) if memory_ops else p_kinds.get("default")
    bandwidth, overhead = {}, {}
    if default is not None:
        bandwidth["default"], overhead["default"] = default.bandwidth_fraction, default.overhead_us
    gemm = GemmEfficiency(peak_fraction=1.0, sm_count=sm_count, tiles=TILES, split_k=SPLIT_K, reuse_full=REUSE_FULL)
    p_gemm = None
    if prior is not None and "gemm" in prior.bandwidth_fraction:
        p_gemm = (prior.gemm.peak_fraction, prior.gemm.k_half, prior.bandwidth_fraction["gemm"], prior.kernel_overhead_us["gemm"])
    if p_gemm is not None and memory_ops:
        # A memory-bound GEMM streams its weights as any streaming kernel of the same device does: the
        # family's own pooled memory-bound fraction is the better prior for it than other devices' GEMMs.
        p_gemm = (p_gemm[0], p_gemm[1], default.bandwidth_fraction, p_gemm[3])
    fitted = _fit_gemm(Arrays(by_op["gemm"]), p_gemm) if by_op["gemm"] else p_gemm
    if fitted is not None:
        p, kh, b, o = fitted
        gemm = gemm.model_copy(update=dict(peak_fraction=p, k_half=kh))
        bandwidth["gemm"], overhead["gemm"] = b, o
    decode = {}
    dec_rows = by_op["attention_decode"]
    p_dec = prior.attention_decode.get("auto") if prior else None
    if p_dec is not None and memory_ops:  # the KV cache streams as the family's memory-bound kernels do
        p_dec = p_dec.model_copy(update={"bandwidth_fraction": default.bandwidth_fraction})
    auto_rows = [m for m in dec_rows if m.impl_family not in REREAD_KV]
    if auto_rows:
        decode["auto"] = _fit_decode(Arrays(auto_rows), SPLIT_DEFAULT, p_dec)
    elif p_dec is not None:
        decode["auto"] = p_dec.model_copy(update={"rows": "no rows on this family: " + p_dec.rows})
    if dec_rows:
        for fam in sorted({m.impl_family for m in dec_rows}):
            decode[fam] = _fit_decode(Arrays([m for m in dec_rows if m.impl_family == fam]),
                                      SPLIT_TOKENS.get(fam, SPLIT_DEFAULT), decode.get("auto"))
    if "auto" in decode:
        bandwidth["attention"], overhead["attention"] = decode["auto"].bandwidth_fraction, decode["auto"].overhead_us
    prefill = {}
    pre_rows = by_op["attention_prefill"]
    p_pre = prior.attention_prefill.get("auto") if prior else None
    if pre_rows:
        bw_att = bandwidth.get("attention", bandwidth.get("default", 1.0))
        prefill["auto"] = _fit_prefill(Arrays(pre_rows), bw_att, p_pre)
        for fam in sorted({m.impl_family for m in pre_rows}):
            prefill[fam] = _fit_prefill(Arrays([m for m in pre_rows if m.impl_family == fam]), bw_att, prefill["auto"])
    elif p_pre is not None:
        prefill["auto"] = p_pre.model_copy(update={"rows": "no rows on this family: " + p_pre.rows})
    kinds: dict = defaultdict(dict)
    own = {m.op for m in memory_ops} | {class_of(m.op) for m in memory_ops}
    for key, f in p_kinds.items():  # kinds and classes this family has no rows of: the pooled figures
        if key != "default" and key not in own and class_of(key) not in own:
            kinds["auto"][key] = f.model_copy(update={"rows": "no rows on this family: " + f.rows})
    if default is not None:
        kinds["auto"]["default"] = default
    for runtime in ["auto", *sorted({m.impl_family for m in memory_ops})]:
        rows = [m for m in memory_ops if runtime == "auto" or m.impl_family == runtime]
        for key in sorted({m.op for m in rows} | {class_of(m.op) for m in rows}):
            sel = [m for m in rows if m.op == key or class_of(m.op) == key]
            pk = p_kinds.get(key) if runtime == "auto" else kinds["auto"].get(key)
            kinds[runtime][key] = _fit_memory(Arrays(sel), pk)
    return Efficiency(gemm=gemm, bandwidth_fraction=bandwidth, kernel_overhead_us=overhead,
                      attention_prefill=prefill, attention_decode=decode, kinds=dict(kinds), bands=bands or {})


def fit_pooled(ms: list[Measurement]) -> Efficiency | None:
    """The prior: one block fitted on every row of every family (each relative to its own device)."""
    return fit_family(ms, 1)


def predict(m: Measurement, eff: Efficiency | None, kernel: str = "auto", runtime: str = "auto") -> float:
    """Seconds the model predicts for measurement ``m`` under ``eff`` (the row's device, its own
    bandwidth) with the given selection (a family or runtime the block lacks falls back to ``auto``)."""
    if eff is not None:
        eff = eff.model_copy(update={"gemm": eff.gemm.model_copy(update={"sm_count": _sm_count(m.gpu)})})
        eff = eff.select(kernel if kernel in eff.families() else "auto", runtime if runtime in eff.runtimes() else "auto")
    gpu = m.gpu.model_copy(update={"efficiency": eff})
    p = Precision(m.dtype, m.dtype, m.dtype)
    return float(sum(expected_time(op, gpu, p) for op in m.ops))


def families_of(ms: list[Measurement]) -> dict[str, list[Measurement]]:
    out = defaultdict(list)
    for m in ms:
        out[m.family].append(m)
    return dict(out)


@dataclass
class FitReport:
    """A fit's rows per architecture family and its leave-one-source-out evaluation.

    ``loso``: per row, (measurement, predicted auto, predicted with the row's own family/runtime).
    ``errors``: per class, dict(rows, sources, median_auto, median_named) (|error| as fractions).
    ``bands``: per class (low, high). ``coverage``: per class, share of held-out rows inside bands
    computed without their source.
    """

    rows_by_family: dict
    loso: list
    errors: dict
    bands: dict
    coverage: dict
    skipped: list


def _band(ratios) -> tuple[float, float]:
    lo, hi = np.percentile(np.asarray(ratios), BAND_PCT)
    return [min(1.0, max(0.01, round(float(lo), 3))), max(1.0, min(99.0, round(float(hi), 3)))]


def fit(ms: list[Measurement], skipped: list | None = None, progress=None) -> FitReport:
    """Fit every family of ``ms`` and evaluate it leaving one source out at a time (see module doc).

    ``progress``: called with (done, total) after each held-out source.
    """
    fams = families_of(ms)
    sources = sorted({m.source for m in ms})
    loso = []
    for j, src in enumerate(sources):
        held = [m for m in ms if m.source == src]
        prior = fit_pooled([m for m in ms if m.source != src])
        for fam in {m.family for m in held}:
            train = [m for m in fams[fam] if m.source != src]
            sm = _sm_count(held[0].gpu)
            eff = fit_family(train, sm, prior=prior)
            for m in (x for x in held if x.family == fam):
                loso.append((m, predict(m, eff), predict(m, eff, m.impl_family or "auto", m.impl_family or "auto")))
        if progress:
            progress(j + 1, len(sources))
    errors, bands, coverage = {}, {}, {}
    for c in CLASSES:
        rows = [(m, pa, pn) for m, pa, pn in loso if m.cls == c]
        if not rows:
            continue
        ra = [m.time_s / pa for m, pa, _ in rows]
        errors[c] = dict(rows=len(rows), sources=len({m.source for m, _, _ in rows}),
                         median_auto=float(np.median([abs(1 / r - 1) for r in ra])),
                         median_named=float(np.median([abs(pn / m.time_s - 1) for m, _, pn in rows])))
        bands[c] = _band(ra)
        inside = []
        for src in {m.source for m, _, _ in rows}:
            rest = [m.time_s / pa for m, pa, _ in rows if m.source != src]
            if not rest:
                continue
            lo, hi = _band(rest)
            inside += [lo <= m.time_s / pa <= hi for m, pa, _ in rows if m.source == src]
        coverage[c] = float(np.mean(inside)) if inside else float("nan")
    return FitReport(rows_by_family=dict(fams), loso=loso, errors=errors, bands=bands, coverage=coverage, skipped=skipped or [])


def block_for(report: FitReport, gpu) -> Efficiency | None:
    """The efficiency block of ``gpu`` from a fit: its family's rows, its SM count, the fit's bands."""
    fam = FAMILIES.get(gpu.name, gpu.name)
    rows = report.rows_by_family.get(fam)
    if not rows:
        return None
    all_rows = [m for rs in report.rows_by_family.values() for m in rs]
    return fit_family(rows, _sm_count(gpu), report.bands, prior=fit_pooled(all_rows))


def table_digest(path) -> str:
    """sha256 of a table's (or trace's) bytes (first 12 hex digits): which fitting set a block came from.
    Raises: LmcostError as :func:`lmcost.basics.files.read_bytes`."""
    import hashlib

    from lmcost.basics.files import MAX_TRACE_BYTES, read_bytes

    return hashlib.sha256(read_bytes(path, MAX_TRACE_BYTES, "table")).hexdigest()[:12]


def block_dict(eff: Efficiency, gpu, table_name: str, digest: str, report: FitReport) -> dict:
    """The efficiency block as the mapping a hardware YAML holds: the fitted figures (each with the rows
    it came from), the bands, ``sources`` naming every figure, and ``fit`` (the table and the errors)."""
    old = gpu.efficiency
    sm_source = old.source_of("gemm.sm_count") if old is not None else None
    d = eff.model_dump(mode="json", exclude_defaults=False)
    d.pop("tile_m", None)
    out = dict(gemm={k: d["gemm"][k] for k in ("peak_fraction", "sm_count", "k_half", "tiles", "split_k", "reuse_full")})
    out["gemm"]["tiles"] = [list(t) for t in out["gemm"]["tiles"]]
    for k in ("bandwidth_fraction", "kernel_overhead_us", "attention_prefill", "attention_decode", "kinds"):
        out[k] = d[k]
    out["bands"] = {k: list(v) for k, v in d["bands"].items()}
    fam = FAMILIES.get(gpu.name, gpu.name)
    engines = {k: profile_dict(p, p.fit) for k, p in old.engines.items()} if old is not None else {}
    out["sources"] = {
        "gemm.sm_count": sm_source or f"{gpu.name}: streaming multiprocessors",
        "gemm.tiles, gemm.split_k, gemm.reuse_full": "lmcost.calibration.efficiency_fit: CUTLASS/cuBLAS threadblock tiles and split-K "
                                                      "factors; full rate from a 128x128 tile's operand reuse",
        "*": f"lmcost fit on {table_name} (sha256 {digest}), {fam} rows; each figure's rows name them, fit: the errors",
    }
    out["fit"] = dict(
        table=table_name, sha256=digest, family=fam,
        rows=len(report.rows_by_family.get(fam, [])),
        loso_median_abs_error_pct={c: round(e["median_auto"] * 100, 1) for c, e in report.errors.items()},
        loso_median_abs_error_named_pct={c: round(e["median_named"] * 100, 1) for c, e in report.errors.items()},
        band_coverage_held_out={c: round(v, 2) for c, v in report.coverage.items() if v == v},
        unconstrained=[c for c in CLASSES if c not in report.errors or report.errors[c]["sources"] < 2],
    )
    if engines:  # lmcost fit --engines writes them; this fit keeps them
        out["engines"] = engines
    return out


def profile_dict(prof, fit: dict) -> dict:
    """An :class:`EngineProfile` as the mapping a hardware YAML holds under ``efficiency.engines``."""
    d = prof.model_dump(mode="json")
    d["gemm"] = {k: d["gemm"][k] for k in ("peak_fraction", "sm_count", "k_half", "tiles", "split_k", "reuse_full")}
    d["fit"] = fit
    return d


def replace_block(text: str, block: dict) -> str:
    """A hardware YAML's text with its ``efficiency`` block replaced by ``block`` (added if absent);
    every other line, comments included, kept as it was."""
    import yaml

    dumped = yaml.safe_dump({"efficiency": block}, sort_keys=False, width=1000, allow_unicode=True,
                            default_flow_style=None)
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("efficiency:")), None)
    if start is None:
        at = next((i for i, ln in enumerate(lines) if ln.startswith("sources:")), len(lines))
        return "".join(lines[:at]) + dumped + "".join(lines[at:])
    end = next((i for i in range(start + 1, len(lines)) if lines[i][:1] not in (" ", "\n", "#", "")), len(lines))
    return "".join(lines[:start]) + dumped + "".join(lines[end:])


def report_rows(report: FitReport) -> list[dict]:
    """Per class: rows, sources, median |error| leaving one source out (auto selection, and the row's own
    kernel family / runtime named), the band and its coverage on held-out sources."""
    out = []
    for c in CLASSES:
        e = report.errors.get(c)
        if e is None:
            out.append(dict(op_class=c, rows=0, sources=0, median_abs_error=None, median_abs_error_named=None,
                            band_low=None, band_high=None, band_coverage=None))
            continue
        cov = report.coverage.get(c)
        out.append(dict(op_class=c, rows=e["rows"], sources=e["sources"], median_abs_error=e["median_auto"],
                        median_abs_error_named=e["median_named"], band_low=report.bands[c][0],
                        band_high=report.bands[c][1], band_coverage=None if cov is None or cov != cov else cov))
    return out


def source_rows(report: FitReport) -> list[dict]:
    """Per (family, class, source): rows, and the median and range of measured / predicted time when the
    source was left out of the fit (auto selection): where the sources disagree, and by how much."""
    groups = defaultdict(list)
    for m, pa, _ in report.loso:
        groups[(m.family, m.cls, m.source)].append(m.time_s / pa)
    return [dict(family=f, op_class=c, source=s, rows=len(r), median_ratio=round(float(np.median(r)), 3),
                 min_ratio=round(float(min(r)), 3), max_ratio=round(float(max(r)), 3))
            for (f, c, s), r in sorted(groups.items())]


def edge_figures(eff: Efficiency) -> list[str]:
    """Figures of a fitted block that sit on an edge of the searched grid (a fraction of 0.1, an overhead of
    the largest tried, the largest l_half): the rows asked for more than the model allows, as rows of
    another device, a slow harness or a wrong shape would."""
    out = []
    lo, ov_hi, lh_hi = float(PEAK_GRID[0]), OVERHEAD_GRID_US[-1], L_HALF_GRID[-1]
    if eff.gemm.peak_fraction <= lo:
        out.append("gemm.peak_fraction")
    out += [f"bandwidth_fraction.{k}" for k, v in eff.bandwidth_fraction.items() if v <= lo]
    out += [f"kernel_overhead_us.{k}" for k, v in eff.kernel_overhead_us.items() if v >= ov_hi]
    for name, table in (("attention_prefill", eff.attention_prefill), ("attention_decode", eff.attention_decode)):
        for k, f in table.items():
            if getattr(f, "peak_fraction", 1.0) <= lo or getattr(f, "bandwidth_fraction", 1.0) <= lo \
                    or f.overhead_us >= ov_hi or getattr(f, "l_half", 0.0) >= lh_hi:
                out.append(f"{name}.{k}")
    for rt, kinds in eff.kinds.items():
        out += [f"kinds.{rt}.{k}" for k, f in kinds.items() if f.bandwidth_fraction <= lo or f.overhead_us >= ov_hi]
    return out
