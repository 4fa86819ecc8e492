"""The calibrated efficiency model: how far below the roofline real kernels run, and why.

A roofline is a lower bound. Real kernels reach only a fraction of peak FLOP/s and of memory
bandwidth, GEMMs lose throughput to tile and wave quantization, and every kernel costs a fixed time
however little it does. The expected time of one execution of an operator is

    t = kernels * overhead[class] + max(FLOPs / (peak * eff_compute), bytes / (bandwidth * eff_bw[class]))

- GEMMs (ops with ``mnk``): eff_compute = gemm.peak_fraction * tile(M, N) * wave(M, N) * K / (K + gemm.k_half).
  Tile quantization: the kernel computes whole tile_m x tile_n output tiles, so M and N round up to
  multiples of the tile; wave quantization: the tiles run in waves of sm_count, the last one partly
  empty (NVIDIA, "Matrix Multiplication Background User's Guide", sections "Tile Quantization" and
  "Wave Quantization"). With fewer tiles than SMs, libraries split K to fill the machine (cuBLAS,
  CUTLASS split-K), so no wave loss is charged there.
- Attention matmuls (flash kernels): eff_compute = attention_peak_fraction (Dao 2023, FlashAttention-2,
  and Shah et al. 2024, FlashAttention-3, report the fraction of peak their kernels reach); v2 prefill:
  peak_fraction * L / (L + l_half) * min(1, CTAs / SMs) (:func:`prefill_occupancy`).
- Everything else runs at the vector rate times ``vector_fraction``.
- ``overhead`` and ``eff_bw`` are per kernel kind: an op with a GEMM shape (the lm_head, a router)
  takes the gemm figures, every other op those of its class.
- ``overhead`` is a per-class fixed time per kernel (launch, ramp-up, tail; on a CPU the dispatch of
  an eager op), added, not maxed: a latency-plus-bandwidth (Hockney) model of one kernel.
- The result is never below the op's roofline time (a fraction of a roof cannot beat it). Work done
  inside another op's kernel (``kernels == 0``: a flash kernel's softmax) costs its roofline time.

An absent ``efficiency`` block in a hardware YAML means the pure roofline: the calibrated time is then
the roofline time. ``lmcost calibrate`` fits the fields on the local device (:mod:`lmcost.profiling.fit`).
"""

from __future__ import annotations

import numpy as np

from lmcost.hardware.efficiency import GemmEfficiency, MIN_SPLIT_K


def gemm_shape_efficiency(g: GemmEfficiency, m, n, k):
    """Fraction of ``peak_fraction`` a GEMM of M x N x K keeps (scalars or arrays).

    A skinny GEMM gets a shorter tile: t_m = min(tile_m, the power of two >= M, at least 16, the M of
    a tensor-core MMA), as libraries pick smaller tiles for small M.
    Model v2 (``tiles`` given): the best, over the menu's tiles and split-K factors s, of
        M*N*K / (waves * sm_count * t_m*t_n * ceil(K/s)) * reuse * K_s / (K_s + k_half),
    tiles = ceil(M/t_m)*ceil(N/t_n), waves = ceil(tiles*s / sm_count), K_s = ceil(K/s), reuse =
    min(1, t_m*t_n/(t_m+t_n) / reuse_full): tile and wave quantization (NVIDIA, "Matrix Multiplication
    Background User's Guide"), split-K (s > 1 only where tiles < sm_count and every
    slice keeps K/s >= MIN_SPLIT_K) filling idle SMs at the cost of a shorter K per tile (CUTLASS
    split-K and stream-K; cuBLAS's heuristics choose among such configurations), and the operand reuse of
    a tile (MACs per element loaded) bounding what a small tile feeds the tensor cores.
    Model v1 (no menu): tile = M*N / (ceil(M/t_m)*t_m * ceil(N/tile_n)*tile_n);
    wave = tiles / (ceil(tiles/sm_count)*sm_count) when tiles >= sm_count, else 1 (split-K);
    small-K = K / (K + k_half).
    """
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    pow2 = np.maximum(16.0, 2.0 ** np.ceil(np.log2(np.maximum(m, 1.0))))
    if not g.tiles:
        t_m = np.minimum(g.tile_m, pow2) if g.tile_m > 1 else 1.0
        tiles_m, tiles_n = np.ceil(m / t_m), np.ceil(n / g.tile_n)
        tile = (m * n) / (tiles_m * t_m * tiles_n * g.tile_n)
        tiles = tiles_m * tiles_n
        wave = np.where(tiles >= g.sm_count, tiles / (np.ceil(tiles / g.sm_count) * g.sm_count), 1.0)
        out = tile * wave * (k / (k + g.k_half))
        return out if out.ndim else float(out)
    best = np.zeros(np.broadcast_shapes(m.shape, n.shape, k.shape))
    sm = float(g.sm_count)
    for tile_m, tile_n in g.tiles:
        t_m = np.minimum(float(tile_m), pow2)
        reuse = 1.0 if not g.reuse_full else np.minimum(1.0, t_m * tile_n / (t_m + tile_n) / g.reuse_full)
        tiles = np.ceil(m / t_m) * np.ceil(n / tile_n)
        for s in g.split_k:
            k_s = np.ceil(k / s)
            waves = np.ceil(tiles * s / sm)
            eff = (m * n * k) / (waves * sm * t_m * tile_n * k_s) * reuse * k_s / (k_s + g.k_half)
            # Libraries split K to fill SMs a short grid leaves idle, not to even out many waves.
            best = np.maximum(best, eff if s == 1 else np.where((tiles < sm) & (k_s >= MIN_SPLIT_K), eff, 0.0))
    return best if best.ndim else float(best)


def kernel_time(flops, bytes_, kernels, rate, bandwidth, overhead_s):
    """The model's time of one execution (s): kernels * overhead + max(flops / rate, bytes / bandwidth).

    ``rate`` (FLOP/s) and ``bandwidth`` (B/s) are the achieved ones (roof times fraction); every
    argument may be an array, broadcast (the fit evaluates whole grids of fractions at once).
    """
    return kernels * overhead_s + np.maximum(np.asarray(flops, dtype=float) / rate,
                                             np.asarray(bytes_, dtype=float) / bandwidth)


def kernel_class(op) -> str:
    """The class whose figures an op takes: ``gemm`` for any GEMM-shaped op (the lm_head, a router
    run GEMM kernels, whatever class they are reported under), else its own class."""
    return "gemm" if is_gemm(op) else op.op_class.value


def is_gemm(op) -> bool:
    """Whether ``op`` runs a GEMM kernel: its ``mnk`` is a GEMM shape (a flash kernel's is its attention shape)."""
    return op.mnk is not None and op.kind != "sdpa"


def attention_rate_factor(l_half, m, n, k):
    """Prefill attention's efficiency ramp L / (L + l_half) at L = k / (m*n) mean keys per query (the
    flash record's shape, :func:`lmcost.operators.attention.attention_core`): a kernel's throughput rises with the
    keys each query block iterates over (FlashAttention-2 paper, fig. 4; FlashAttention-3, fig. 5)."""
    L = np.asarray(k, dtype=float) / np.maximum(np.asarray(m, dtype=float) * n, 1.0)
    return L / (L + l_half)


#: Query rows per thread block of a flash prefill kernel: FlashAttention-2's forward at head dim 128 on
#: Ampere and Hopper runs kBlockM = 128 (csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128),
#: FlashAttention-3's Hopper forward likewise (hopper/tile_size.h, tile_size_fwd_sm90: 128 x 128..176 at d = 128);
#: FlashInfer's prefill tiles the query (x GQA group) rows by 128 (CTA_TILE_Q, include/flashinfer/attention/prefill.cuh).
PREFILL_BLOCK_M = 128


def prefill_occupancy(sm_count, q_per_stream, m, n):
    """Fraction of the SMs a flash prefill kernel keeps busy: min(1, CTAs / SMs), CTAs = ceil(n / block_m) *
    m * q_per_stream, the FlashAttention forward grid (ceil(s_q / kBlockM), b, h) (flash_fwd_launch_template.h,
    run_flash_fwd: dim3 grid(num_m_block, b, h)) with m = b*h_kv streams and q_per_stream = h / h_kv query
    heads each, n = s_q queries, block_m :data:`PREFILL_BLOCK_M`. A chunk of 512 new tokens at batch 1 over 8
    heads (TP-sharded) is 4 * 8 = 32 blocks: a quarter of an H100's 132 SMs run, whatever the cache length.
    Arrays broadcast; sm_count 1 (no SM count known) gives 1."""
    ctas = np.ceil(np.asarray(n, dtype=float) / PREFILL_BLOCK_M) * np.asarray(m, dtype=float) * q_per_stream
    return np.minimum(1.0, ctas / sm_count)


def decode_occupancy(split_tokens, sm_count, m, n, k):
    """Fraction of the SMs a decode attention kernel keeps streaming: min(1, streams*splits / SMs),
    streams m = b*h_kv, splits = ceil(L / split_tokens) (1 where split_tokens is 0), L = k / (m*n)."""
    m = np.asarray(m, dtype=float)
    L = np.asarray(k, dtype=float) / np.maximum(m * n, 1.0)
    splits = np.where(split_tokens > 0, np.ceil(L / np.maximum(split_tokens, 1)), 1.0)
    return np.minimum(1.0, m * splits / sm_count)


#: Bytes per activation element of an engine's quantization pass before a low-precision GEMM: a bf16 read and
#: the dtype's write; NVFP4 adds one fp8 scale per 16 elements (0.5 + 1/16). vLLM's per-tensor W8A8 path runs
#: ops.scaled_fp8_quant on the activations before cutlass_scaled_mm (vllm/_custom_ops.py, vllm/model_executor/
#: layers/quantization/utils/w8a8_utils.py), and its NVFP4 path scaled_fp4_quant (block 16, e4m3 scales);
#: TensorRT-LLM's fp8/nvfp4 linear layers quantize the input likewise (tensorrt_llm/_torch/modules/linear.py).
ACT_QUANT_BYTES = {"fp8": 2.0 + 1.0, "fp4": 2.0 + 0.5 + 1.0 / 16}


def activation_quant_time(bytes_per_element, m, k, bandwidth):
    """Seconds of the activation-quantization pass of an M x N x K GEMM whose operands an engine quantizes
    (:data:`ACT_QUANT_BYTES`; 0: none): bytes_per_element * M * K at ``bandwidth`` (B/s, the GEMM's achieved
    one), a memory-bound kernel of its own, added to the GEMM's time. An fp8 GEMM of 2817 x 5120 x 256 under
    TensorRT-LLM on H100 quantizes 721k activations: 3 * 721k B = 2.16 MB, 0.8 us at 2.7 TB/s. Arrays broadcast."""
    return np.asarray(bytes_per_element, dtype=float) * np.asarray(m, dtype=float) * np.asarray(k, dtype=float) / bandwidth


def attention_cta_time(cta_us, sm_count, q_per_stream, m, n):
    """Seconds a flash kernel's thread blocks add beyond its FLOPs and bytes: cta_us * 1e-6 * CTAs / SMs, each
    block's fixed work (load the query tile and the page table, the softmax rescale and the output write
    after its key loop) run over the SMs in parallel. CTAs: prefill (n > 1) ceil(n / block_m) * m * q_per_stream,
    FlashAttention's forward grid (ceil(s_q / kBlockM), b, h) (flash_fwd_launch_template.h, run_flash_fwd; block_m
    :data:`PREFILL_BLOCK_M`); decode (n = 1) m = b*h_kv streams, the grid of one block per sequence and KV head
    that FlashDecoding-style kernels run before any split (FlashAttention's split-KV only splits a grid short of
    the SMs, flash_api.cpp num_splits_heuristic; vLLM paged_attention_v1/v2 grid (heads, seqs, partitions);
    FlashInfer's decode plan (batch x kv heads x chunks)), so the split blocks of a short grid cost at most one
    wave, inside ``overhead_us``. Fitted per engine (:mod:`lmcost.calibration.engine_fit`): a decode batch of 1024
    sequences over 8 keys runs 2-4x its bytes' time without it (issue 25). Arrays broadcast; sm_count 1 (no
    count known) charges every block."""
    m = np.asarray(m, dtype=float)
    n = np.asarray(n, dtype=float)
    ctas = np.where(n > 1, np.ceil(n / PREFILL_BLOCK_M) * m * q_per_stream, m)
    return np.asarray(cta_us, dtype=float) * 1e-6 * ctas / sm_count


def expected_times(flops, bytes_, kernels, m, n, k, statics: "OpStatics", roofline_s):
    """Expected seconds of one execution of each op under the efficiency model, never less than its
    roofline time ``roofline_s``; ops inside another op's kernel (a flash kernel's softmax) cost their
    roofline time, the compute they really do (a fit of the kernel's figures predicts its measured time
    as both together, so nothing is counted twice: :mod:`lmcost.calibration.efficiency_fit`).

    Arguments broadcast together: arrays over ops (``statics`` from :func:`op_statics` of the same ops),
    or one op's values over a grid with that op's statics. ``m, n, k``: the GEMM shape, or a flash
    kernel's attention shape (any value for other ops). With no efficiency block the roofline time is
    returned.
    """
    if statics.eff is None:
        return roofline_s
    fixed, compute, memory, _ = expected_terms(flops, bytes_, kernels, m, n, k, statics)
    out = fixed + np.maximum(compute, memory)  # kernel_time's arithmetic
    # Never below the roofline: a fraction of a roof cannot beat the roof (the roofline's floor included).
    out = np.where(statics.inside, roofline_s, np.maximum(out, roofline_s))
    return out if np.ndim(out) else float(out)


def expected_terms(flops, bytes_, kernels, m, n, k, statics: "OpStatics"):
    """The terms of :func:`expected_times` before their max with the roofline, arrays broadcast as its
    arguments: (fixed, compute, memory, bandwidth) = kernels * overhead (s), FLOPs at the achieved rate
    (s), bytes at the achieved bandwidth (s), and that bandwidth (B/s: a decode attention kernel's
    changes with its occupancy, in steps of its split; every other op's is one figure). The time is
    fixed + max(compute, memory) (:func:`kernel_time`). Needs ``statics.eff`` (an efficiency block).
    """
    eff = statics.eff
    gemm, sdpa = statics.gemm, statics.sdpa
    shape = _where_selected(gemm, lambda m, n, k: gemm_shape_efficiency(eff.gemm, m, n, k), (m, n, k))
    ramp = _where_selected(sdpa, attention_rate_factor, (m, n, k), (statics.l_half,))
    # Prefill (n > 1) runs a thread block per query block and head: few of them leave SMs idle. Decode's
    # occupancy is in its bandwidth (below).
    occ_pre = _where_selected(sdpa, lambda q, m, n: np.where(n > 1, prefill_occupancy(statics.sm_count, q, m, n), 1.0),
                              (m, n), (statics.q_per_stream,))
    ramp = ramp * occ_pre
    rate = statics.peak * statics.frac * np.where(gemm, shape, np.where(sdpa, ramp, 1.0))
    decode = sdpa & statics.has_decode & (np.asarray(n) == 1)
    occ = _where_selected(decode, lambda split, m, n, k: decode_occupancy(split, statics.sm_count, m, n, k),
                          (m, n, k), (statics.split_tokens,))
    bandwidth = np.where(decode, statics.dec_bandwidth * occ, statics.bandwidth)
    overhead = np.where(decode, statics.dec_overhead_s, statics.overhead_s)
    if statics.pre_cta_us is not None and (np.any(statics.pre_cta_us) or np.any(statics.dec_cta_us)):
        cta_us = np.where(decode, statics.dec_cta_us, np.where(sdpa & (np.asarray(n) > 1), statics.pre_cta_us, 0.0))
        cta = _where_selected(sdpa, lambda c, q, m, n: attention_cta_time(c, statics.sm_count, q, m, n),
                              (m, n), (cta_us, statics.q_per_stream))
        overhead = overhead + np.where(sdpa, cta, 0.0)
    if statics.quant_bytes is not None and np.any(statics.quant_bytes):
        overhead = overhead + np.where(gemm, activation_quant_time(statics.quant_bytes, m, k, statics.bandwidth), 0.0)
    return (kernels * overhead, np.asarray(flops, dtype=float) / rate, np.asarray(bytes_, dtype=float) / bandwidth,
            bandwidth)


def _where_selected(mask, fn, args, per_op=()):
    """``fn(*per_op, *(np.where(mask, a, 1.0) for a in args))``: the same values where ``mask`` holds,
    evaluated only on the ops (first axis) where it holds somewhere; elsewhere 1.0, which the caller's
    ``np.where(mask, ...)`` never reads. ``mask`` and ``per_op`` are statics over ops ([ops], or lifted
    to [ops, 1, ...]), ``args`` the workload's values broadcast with them. A decode step over 16M
    contexts has no GEMM among the ops that change with the context: the tile menu's loops over them
    were 90% of its time (issue 24)."""
    mask = np.asarray(mask)
    if mask.ndim == 0 or mask.all():
        return fn(*per_op, *(np.where(mask, a, 1.0) for a in args))
    full = np.broadcast_shapes(mask.shape, *(np.shape(a) for a in args))
    rows = np.flatnonzero(mask.reshape(len(mask), -1).any(axis=1))
    out = np.ones(full)
    if len(rows):
        picked = np.broadcast_to(mask, full)[rows]
        out[rows] = fn(*(np.asarray(v)[rows] if np.ndim(v) else v for v in per_op),
                       *(np.where(picked, np.broadcast_to(np.asarray(a, dtype=float), full)[rows], 1.0) for a in args))
    return out


def band_factors(statics: "OpStatics", n):
    """(low, high) multipliers of each op's calibrated time: its class's band (:meth:`Efficiency.band`),
    a flash kernel's by phase (n = 1: decode). Arrays broadcast like :func:`expected_times`'s."""
    if statics.eff is None:
        return 1.0, 1.0
    decode = statics.sdpa & (np.asarray(n) == 1)
    return (np.where(decode, statics.dec_band_low, statics.band_low),
            np.where(decode, statics.dec_band_high, statics.band_high))
