#!/usr/bin/env python3
"""Time single kernels on one CUDA GPU, as a held-out test set for `lmcost op` (issue 25).

    python3 benchmarks/gpu_kernels.py OUT_DIR [--budget-s 330]   # on the GPU (torch, triton; no lmcost)
    python3 benchmarks/gpu_kernels.py /tmp/k --device cpu --smoke  # checks the script's logic on a CPU

Writes OUT_DIR/kernels.csv (one row per case, written as each case finishes), OUT_DIR/env.txt (GPU, driver,
clocks before and after, torch, CUDA, Triton versions) and OUT_DIR/log.txt. Imports torch and, for the fused
kernels, Triton; not lmcost, so it runs under any Python that has torch. `benchmarks/eval_gpu_kernels.py`
reads the CSV and compares `lmcost op`'s roofline and calibrated times with it.

What a time is: the sum of the durations of the GPU kernels one call launches, read from torch.profiler
(CUPTI), median over the calls; launch gaps are not in it (the profiler's kernel durations, as a serving
stack's kernel trace reads). Inputs rotate over several copies whose total exceeds the L2 cache several times
(at most 16 copies, at least 512 MB together where memory allows), so a weight or KV cache is read from HBM
as it is in a model whose layers each have their own; small activations may stay in L2, as they do in a model.
Every fused kernel written here is checked against its eager reference on fresh random inputs (`check`:
relative error, bf16 expected 1e-3..1e-2), and rows record the kernels that ran.

Cases (bf16 unless named):
- GEMM, `F.linear` (cuBLAS): m tokens by Llama-3-8B/70B projection shapes; FP8 e4m3 through
  `torch._scaled_mm` with per-tensor and per-row scales (bf16 out; activation quantisation not timed).
- Attention, FlashAttention-2 as PyTorch bundles it (`aten._flash_attention_forward`, (b, s, h, d) layout,
  GQA native): prefill with s_q = s_kv, chunked prefill (s_q new tokens over s_kv keys, causal mask bottom-right
  aligned), decode (one query over s_kv keys); and `F.scaled_dot_product_attention` with its default backend.
- RMSNorm: `F.rms_norm` (PyTorch's fused kernel), Hugging Face's eager LlamaRMSNorm (fp32 upcast; several
  kernels), a Triton RMSNorm (one program per row, Liger's launch settings) and a Triton fused residual add +
  RMSNorm (vLLM's `fused_add_rms_norm` semantics: residual += x written back, out = norm(residual) * w).
  LayerNorm: `F.layer_norm`.
- Elementwise: SiLU-and-mul eager (`F.silu(x[:, :d]) * x[:, d:]`) and in Triton (one kernel, vLLM's
  `silu_and_mul` layout); residual add; RoPE eager (Hugging Face's rotate_half, q and k) and in Triton (in place,
  NeoX layout, one program per token over all q and k heads, cos/sin [tokens, d_h]).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F

FIELDS = ["case", "op", "implementation", "dtype", "M", "N", "K", "batch", "seq_q", "seq_kv", "heads_q", "heads_kv",
          "head_dim", "causal", "tokens", "hidden", "width", "kind", "time_us", "time_us_mean", "time_us_p10",
          "time_us_p90", "event_us", "calls", "copies", "kernels_per_call", "kernels", "check", "status"]
ROTATE_BYTES = 512 * 2**20
MAX_COPIES = 16


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------- timing
def _kinetic(prof, want_cuda: bool):
    """[(start_ns, duration_ns, name)] of the device kernels (CPU ops on a CPU run) the profiler saw."""
    out = []
    for e in prof.profiler.kineto_results.events():
        dev = str(e.device_type())
        if want_cuda != ("CUDA" in dev):
            continue
        name = e.name()
        if want_cuda and name.startswith("Memcpy"):
            continue
        if not want_cuda and not name.startswith("aten::"):
            continue
        try:
            start, dur = e.start_ns(), e.duration_ns()
        except AttributeError:
            start, dur = e.start_us() * 1000, e.duration_us() * 1000
        out.append((start, dur, name))
    out.sort()
    return out


def measure(fns, cuda: bool, target_ms: float = 25.0, min_calls: int = 10, max_calls: int = 200):
    """Time zero-argument callables (one per input copy), cycling through them.

    Returns (per-call kernel times in us, event us per call, calls, kernels per call, kernel names).
    """
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for f in fns[: min(3, len(fns))]:
        f()
    sync()
    # a rough per-call time, for the number of calls
    n0 = max(len(fns), 3)
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(n0):
            fns[i % len(fns)]()
        b.record()
        sync()
        per_ms = a.elapsed_time(b) / n0
    else:
        t = time.perf_counter()
        for i in range(n0):
            fns[i % len(fns)]()
        per_ms = (time.perf_counter() - t) * 1e3 / n0
    calls = int(min(max_calls, max(min_calls, math.ceil(target_ms / max(per_ms, 1e-4)))))
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        for i in range(calls):
            fns[i % len(fns)]()
        sync()
    ks = _kinetic(prof, cuda)
    if not ks:
        raise RuntimeError("the profiler saw no kernels")
    if cuda:
        per_call = len(ks) // calls if len(ks) % calls == 0 else 0
    else:
        per_call = 0
    if per_call:
        times = [sum(d for _, d, _ in ks[i * per_call:(i + 1) * per_call]) / 1e3 for i in range(calls)]
        names = sorted({n for _, _, n in ks[:per_call]})
    else:  # kernels per call vary (or a CPU run): the mean only
        times = [sum(d for _, d, _ in ks) / 1e3 / calls]
        names = sorted({n for _, _, n in ks})[:8]
    return times, per_ms * 1e3, calls, per_call or round(len(ks) / calls, 2), names


def copies_for(one_copy_bytes: int) -> int:
    """Input copies to rotate over: enough to read ROTATE_BYTES from memory, at most MAX_COPIES."""
    return int(max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / max(one_copy_bytes, 1)))))


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------------- kernels
TRITON = None


def load_triton():
    """Define the Triton kernels; None when Triton is missing or the device is a CPU."""
    global TRITON
    import triton
    import triton.language as tl

    @triton.jit
    def rmsnorm_k(x_ptr, w_ptr, out_ptr, res_ptr, H, eps, BLOCK: tl.constexpr, HAS_RES: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < H
        x = tl.load(x_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RES:
            r = tl.load(res_ptr + row * H + offs, mask=mask, other=0.0).to(tl.float32)
            x = (x + r).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + row * H + offs, x, mask=mask)
            x = x.to(tl.float32)
        var = tl.sum(x * x, axis=0) / H
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def silu_mul_k(x_ptr, out_ptr, D, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = col < D
        g = tl.load(x_ptr + row * 2 * D + col, mask=m, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * 2 * D + D + col, mask=m, other=0.0).to(tl.float32)
        y = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + row * D + col, y.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def rope_k(q_ptr, k_ptr, cos_ptr, sin_ptr, H, HK, HP: tl.constexpr, HKP: tl.constexpr, D: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        j = tl.arange(0, D // 2)
        c = tl.load(cos_ptr + t * D + j).to(tl.float32)[None, :]
        s = tl.load(sin_ptr + t * D + j).to(tl.float32)[None, :]
        hq = tl.arange(0, HP)[:, None]
        mq = hq < H
        p = q_ptr + t * H * D + hq * D + j[None, :]
        x1 = tl.load(p, mask=mq, other=0.0).to(tl.float32)
        x2 = tl.load(p + D // 2, mask=mq, other=0.0).to(tl.float32)
        tl.store(p, (x1 * c - x2 * s).to(q_ptr.dtype.element_ty), mask=mq)
        tl.store(p + D // 2, (x2 * c + x1 * s).to(q_ptr.dtype.element_ty), mask=mq)
        hk = tl.arange(0, HKP)[:, None]
        mk = hk < HK
        p = k_ptr + t * HK * D + hk * D + j[None, :]
        x1 = tl.load(p, mask=mk, other=0.0).to(tl.float32)
        x2 = tl.load(p + D // 2, mask=mk, other=0.0).to(tl.float32)
        tl.store(p, (x1 * c - x2 * s).to(k_ptr.dtype.element_ty), mask=mk)
        tl.store(p + D // 2, (x2 * c + x1 * s).to(k_ptr.dtype.element_ty), mask=mk)

    def warps(block):  # Liger's calculate_settings
        return 4 if block < 2048 else 8 if block < 8192 else 16

    def rmsnorm(x, w, out, res=None, eps=1e-6):
        T, H = x.shape
        block = triton.next_power_of_2(H)
        rmsnorm_k[(T,)](x, w, out, res if res is not None else x, H, eps, BLOCK=block, HAS_RES=res is not None,
                        num_warps=warps(block))
        return out

    def silu_mul(x, out):
        T, D = out.shape
        silu_mul_k[(T, triton.cdiv(D, 1024))](x, out, D, BLOCK=1024, num_warps=4)
        return out

    def rope(q, k, cos, sin):
        T, H, D = q.shape
        HK = k.shape[1]
        rope_k[(T,)](q, k, cos, sin, H, HK, HP=triton.next_power_of_2(H), HKP=triton.next_power_of_2(HK), D=D,
                     num_warps=4)

    TRITON = dict(rmsnorm=rmsnorm, silu_mul=silu_mul, rope=rope, version=triton.__version__)
    return TRITON


ENGINE_CUDA = r'''
// Kernels of the design serving engines run for norms and pointwise ops, written after vLLM's csrc
// (layernorm_kernels.cu: rms_norm_kernel, fused_add_rms_norm_kernel's 8-wide vector path;
// activation_kernels.cu: act_and_mul_kernel; pos_encoding_kernels.cu: rotary_embedding_kernel, NeoX),
// as recalled, not copied: one thread block per token row, a loop of blockDim-strided loads.
// bf16 is handled as raw 16-bit words (no headers): the memory traffic is the engines'.
__device__ __forceinline__ float bf2f(unsigned short u) { return __uint_as_float(((unsigned int)u) << 16); }
__device__ __forceinline__ unsigned short f2bf(float f) {
  unsigned int x = __float_as_uint(f);
  x += 0x7FFFu + ((x >> 16) & 1u);
  return (unsigned short)(x >> 16);
}
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) part[wid] = v;
  __syncthreads();
  v = (lane < nw) ? part[lane] : 0.f;
  if (wid == 0)
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

extern "C" __global__ void rms_norm(unsigned short* out, const unsigned short* in, const unsigned short* w,
                                    float eps, int hidden) {
  __shared__ float s_var;
  const long long row = blockIdx.x;
  float v = 0.f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float x = bf2f(in[row * hidden + i]);
    v += x * x;
  }
  v = block_sum(v);
  if (threadIdx.x == 0) s_var = rsqrtf(v / hidden + eps);
  __syncthreads();
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const float x = bf2f(in[row * hidden + i]);
    out[row * hidden + i] = f2bf(round_bf(x * s_var) * bf2f(w[i]));
  }
}

struct __align__(16) vec8 { unsigned short v[8]; };

extern "C" __global__ void fused_add_rms_norm(unsigned short* in, unsigned short* res, const unsigned short* w,
                                              float eps, int hidden) {
  __shared__ float s_var;
  const int vh = hidden / 8;
  const long long row = blockIdx.x;
  vec8* in_v = reinterpret_cast<vec8*>(in + row * hidden);
  vec8* res_v = reinterpret_cast<vec8*>(res + row * hidden);
  const vec8* w_v = reinterpret_cast<const vec8*>(w);
  float v = 0.f;
  for (int i = threadIdx.x; i < vh; i += blockDim.x) {
    vec8 a = in_v[i], r = res_v[i];
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const float x = round_bf(bf2f(a.v[j]) + bf2f(r.v[j]));
      v += x * x;
      r.v[j] = f2bf(x);
    }
    res_v[i] = r;
  }
  v = block_sum(v);
  if (threadIdx.x == 0) s_var = rsqrtf(v / hidden + eps);
  __syncthreads();
  for (int i = threadIdx.x; i < vh; i += blockDim.x) {
    vec8 r = res_v[i], ww = w_v[i], o;
#pragma unroll
    for (int j = 0; j < 8; j++) o.v[j] = f2bf(round_bf(bf2f(r.v[j]) * s_var) * bf2f(ww.v[j]));
    in_v[i] = o;
  }
}

extern "C" __global__ void silu_and_mul(unsigned short* out, const unsigned short* in, int d) {
  const long long t = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float x = bf2f(in[t * 2 * d + i]);
    const float y = bf2f(in[t * 2 * d + d + i]);
    out[t * d + i] = f2bf(round_bf(x / (1.f + __expf(-x))) * y);
  }
}

__device__ __forceinline__ void rotate(unsigned short* arr, const unsigned short* cs, int off, int embed) {
  const float c = bf2f(cs[off]), s = bf2f(cs[embed + off]);
  const float x = bf2f(arr[off]), y = bf2f(arr[embed + off]);
  arr[off] = f2bf(x * c - y * s);
  arr[embed + off] = f2bf(y * c + x * s);
}

extern "C" __global__ void rotary_embedding(const long long* pos, unsigned short* q, unsigned short* k,
                                            const unsigned short* cache, int rot_dim, int heads, int kv_heads,
                                            int head_size) {
  const long long t = blockIdx.x;
  const unsigned short* cs = cache + pos[t] * rot_dim;
  const int embed = rot_dim / 2;
  for (int i = threadIdx.x; i < heads * embed; i += blockDim.x) {
    const int h = i / embed;
    rotate(q + (t * heads + h) * head_size, cs, i % embed, embed);
  }
  for (int i = threadIdx.x; i < kv_heads * embed; i += blockDim.x) {
    const int h = i / embed;
    rotate(k + (t * kv_heads + h) * head_size, cs, i % embed, embed);
  }
}
'''

CUDA = None


def load_cuda():
    """Compile ENGINE_CUDA with CuPy (NVRTC); its kernels run on the legacy default stream, as torch's do."""
    global CUDA
    import cupy as cp

    mod = cp.RawModule(code=ENGINE_CUDA, options=("--std=c++17",))
    CUDA = dict(cp=cp, version=cp.__version__,
                **{n: mod.get_function(n) for n in ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "rotary_embedding")})
    return CUDA


def cview(t):
    """A CuPy view of a torch tensor's memory (bf16 as int16: CuPy has no bfloat16)."""
    return CUDA["cp"].from_dlpack(t.view(torch.int16) if t.dtype == torch.bfloat16 else t)


def hf_rmsnorm(x, w, eps=1e-6):
    """transformers' LlamaRMSNorm.forward."""
    xf = x.to(torch.float32)
    var = xf.pow(2).mean(-1, keepdim=True)
    xf = xf * torch.rsqrt(var + eps)
    return w * xf.to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def hf_rope(q, k, cos, sin):
    """transformers' apply_rotary_pos_emb, q (t, h, d), cos/sin (t, d) broadcast over heads."""
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


# ----------------------------------------------------------------------------------------------- cases
def cases(smoke: bool):
    """(case id, op, implementation, shape dict) in the order they run: norms, elementwise, attention, GEMMs."""
    out = []
    tokens = [1, 16, 128, 1024, 4096, 16384, 65536] if not smoke else [1, 8]
    hiddens = [2048, 4096, 8192] if not smoke else [64]
    for h in hiddens:
        for t in tokens:
            for impl in ("torch-fused", "hf-eager", "triton", "triton-fused-add"):
                out.append(("rmsnorm", impl, dict(tokens=t, hidden=h)))
            out.append(("layernorm", "torch-fused", dict(tokens=t, hidden=h)))
    tok2 = [1, 16, 128, 1024, 4096, 16384] if not smoke else [1, 8]
    for d in ([3584, 14336, 28672] if not smoke else [64]):
        for t in tok2:
            for impl in ("eager", "triton"):
                out.append(("silu_mul", impl, dict(tokens=t, width=d)))
    for h in ([4096, 8192] if not smoke else [64]):
        for t in tok2:
            out.append(("add", "eager", dict(tokens=t, width=h)))
    for t in tok2:
        for impl in ("hf-eager", "triton"):
            out.append(("rope", impl, dict(tokens=t, heads_q=32 if not smoke else 4, heads_kv=8 if not smoke else 2,
                                            head_dim=128 if not smoke else 16)))
    heads = [(32, 8, 128), (64, 8, 128)] if not smoke else [(4, 2, 16)]
    for hq, hk, d in heads:
        for b in ([1, 4] if not smoke else [1]):
            for s in ([512, 1024, 2048, 4096, 8192, 16384] if not smoke else [32]):
                out.append(("attention_prefill", "fa2", dict(batch=b, seq_q=s, seq_kv=s, heads_q=hq, heads_kv=hk,
                                                             head_dim=d, causal=True)))
    big = [(32, 8, 128)] if not smoke else [(4, 2, 16)]
    for hq, hk, d in big:
        for s in ([1024, 4096] if not smoke else [32]):
            out.append(("attention_prefill", "fa2", dict(batch=1, seq_q=s, seq_kv=s, heads_q=hq, heads_kv=hk,
                                                         head_dim=d, causal=False)))
        for sq in ([128, 512, 1024, 2048] if not smoke else [8]):
            for skv in ([4096, 16384, 65536] if not smoke else [64]):
                for b in ([1, 4] if sq == 512 else [1]):
                    out.append(("attention_prefill", "fa2", dict(batch=b, seq_q=sq, seq_kv=skv, heads_q=hq,
                                                                 heads_kv=hk, head_dim=d, causal=True)))
        for s in ([2048, 8192] if not smoke else [32]):
            out.append(("attention_prefill", "sdpa-default", dict(batch=1, seq_q=s, seq_kv=s, heads_q=hq, heads_kv=hk,
                                                                  head_dim=d, causal=True)))
    dec = [(32, 8, 128), (64, 8, 128), (32, 32, 128)] if not smoke else [(4, 2, 16)]
    for hq, hk, d in dec:
        for b in ([1, 4, 16, 64, 256] if not smoke else [1, 2]):
            for s in ([512, 2048, 8192, 32768] if not smoke else [64]):
                if b * s * hk * d * 4 > 8 * 2**30 or (hq, hk) != (32, 8) and b not in (1, 16, 64):
                    continue
                out.append(("attention_decode", "fa2", dict(batch=b, seq_q=1, seq_kv=s, heads_q=hq, heads_kv=hk,
                                                            head_dim=d, causal=False)))
                if (hq, hk) == (32, 8) and b in (1, 64):
                    out.append(("attention_decode", "sdpa-default", dict(batch=b, seq_q=1, seq_kv=s, heads_q=hq,
                                                                         heads_kv=hk, head_dim=d, causal=False)))
    ms = [1, 8, 32, 128, 512, 2048, 8192, 16384] if not smoke else [1, 16]
    nks = ([(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192), (57344, 8192),
            (8192, 28672), (128256, 4096)] if not smoke else [(32, 32)])
    for n, k in nks:
        for m in ms:
            out.append(("gemm", "cublas", dict(M=m, N=n, K=k)))
    for n, k in (nks[:1] + nks[2:4] + nks[5:8]) if not smoke else nks:
        for m in ms:
            if m % 16 == 0:
                out.append(("gemm_fp8", "scaled_mm-tensorwise", dict(M=m, N=n, K=k)))
                out.append(("gemm_fp8", "scaled_mm-rowwise", dict(M=m, N=n, K=k)))
    return out


def cases_v2():
    """The second sweep: the engines' kernel design (one block per token row, ENGINE_CUDA) beside PyTorch's and
    Triton's, over widths and token counts the first sweep did not run (its held-out set)."""
    out = []
    tokens = [1, 2, 8, 32, 64, 256, 512, 2048, 8192, 32768]
    for h in (1024, 2048, 3072, 4096, 5120, 7168, 8192, 12288, 16384):
        for t in tokens:
            for impl in ("engine-cuda", "engine-cuda-fused-add", "torch-fused", "triton"):
                out.append(("rmsnorm", impl, dict(tokens=t, hidden=h)))
            out.append(("layernorm", "torch-fused", dict(tokens=t, hidden=h)))
    for d in (1408, 2048, 3584, 7168, 14336, 18944, 28672):
        for t in tokens:
            for impl in ("engine-cuda", "triton"):
                out.append(("silu_mul", impl, dict(tokens=t, width=d)))
    for hq, hk in ((8, 1), (16, 4), (32, 8), (64, 8)):
        for t in tokens:
            for impl in ("engine-cuda", "triton"):
                out.append(("rope", impl, dict(tokens=t, heads_q=hq, heads_kv=hk, head_dim=128)))
    return out


def build(op, impl, sh, dev, dtype):
    """(list of callables over rotated inputs, relative error of one call against its reference or '')."""
    g = torch.Generator(device=dev).manual_seed(1234)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device=dev, dtype=torch.float32, generator=g).mul_(scale).to(dtype)

    esize = torch.finfo(dtype).bits // 8
    tri = TRITON
    if op in ("rmsnorm", "layernorm"):
        t, h = sh["tokens"], sh["hidden"]
        nb = copies_for(t * h * esize * (4 if "add" in impl else 2))
        xs = [rnd(t, h) for _ in range(nb)]
        w, bias = rnd(h, scale=0.1).add_(1), rnd(h, scale=0.1)
        outs = [torch.empty_like(x) for x in xs]
        if op == "layernorm":
            ref = F.layer_norm(xs[0].float(), (h,), w.float(), bias.float())
            err = rel_err(F.layer_norm(xs[0], (h,), w, bias), ref)
            return [lambda x=x: F.layer_norm(x, (h,), w, bias) for x in xs], err
        ref = hf_rmsnorm(xs[0].float(), w.float())
        if impl == "torch-fused":
            err = rel_err(F.rms_norm(xs[0], (h,), w, 1e-6), ref)
            return [lambda x=x: F.rms_norm(x, (h,), w, 1e-6) for x in xs], err
        if impl == "hf-eager":
            return [lambda x=x: hf_rmsnorm(x, w) for x in xs], rel_err(hf_rmsnorm(xs[0], w), ref)
        if impl.startswith("engine-cuda"):
            if CUDA is None:
                raise RuntimeError("no CuPy")
            cp = CUDA["cp"]
            wv = cview(w)
            if impl == "engine-cuda":
                block = min(h, 1024)
                f = CUDA["rms_norm"]
                calls = []
                for x, o in zip(xs, outs):
                    xv, ov = cview(x), cview(o)
                    calls.append(lambda xv=xv, ov=ov: f((t,), (block,), (ov, xv, wv, cp.float32(1e-6), cp.int32(h))))
                calls[0]()
                return calls, rel_err(outs[0], ref)
            block = min(h, 1024 if t < 256 else 256)  # vLLM's max_block_size for fused_add_rms_norm
            f = CUDA["fused_add_rms_norm"]
            res = [rnd(t, h) for _ in range(nb)]
            x0, r0 = xs[0].clone(), res[0].clone()
            want_res = (x0.float() + r0.float()).to(dtype)
            f((t,), (block,), (cview(x0), cview(r0), wv, cp.float32(1e-6), cp.int32(h)))
            torch.cuda.synchronize()
            err = max(rel_err(x0, hf_rmsnorm(want_res.float(), w.float())), rel_err(r0, want_res))
            calls = []
            for x, r in zip(xs, res):
                xv, rv = cview(x), cview(r)
                calls.append(lambda xv=xv, rv=rv: f((t,), (block,), (xv, rv, wv, cp.float32(1e-6), cp.int32(h))))
            return calls, err
        if tri is None:
            raise RuntimeError("no Triton")
        if impl == "triton":
            err = rel_err(tri["rmsnorm"](xs[0], w, outs[0]), ref)
            return [lambda x=x, o=o: tri["rmsnorm"](x, w, o) for x, o in zip(xs, outs)], err
        res = [rnd(t, h) for _ in range(nb)]
        r0 = res[0].clone()
        want_res = (xs[0].float() + r0.float()).to(dtype)
        got = tri["rmsnorm"](xs[0], w, outs[0], res=r0)
        err = max(rel_err(got, hf_rmsnorm(want_res.float(), w.float())), rel_err(r0, want_res))
        return [lambda x=x, o=o, r=r: tri["rmsnorm"](x, w, o, res=r) for x, o, r in zip(xs, outs, res)], err
    if op == "silu_mul":
        t, d = sh["tokens"], sh["width"]
        nb = copies_for(t * d * esize * 3)
        xs = [rnd(t, 2 * d) for _ in range(nb)]
        ref = F.silu(xs[0][:, :d].float()) * xs[0][:, d:].float()
        if impl == "eager":
            return [lambda x=x: F.silu(x[:, :d]) * x[:, d:] for x in xs], rel_err(F.silu(xs[0][:, :d]) * xs[0][:, d:], ref)
        if impl == "engine-cuda":
            if CUDA is None:
                raise RuntimeError("no CuPy")
            cp, f = CUDA["cp"], CUDA["silu_and_mul"]
            outs = [torch.empty(t, d, device=dev, dtype=dtype) for _ in xs]
            calls = [lambda xv=cview(x), ov=cview(o): f((t,), (min(d, 1024),), (ov, xv, cp.int32(d)))
                     for x, o in zip(xs, outs)]
            calls[0]()
            return calls, rel_err(outs[0], ref)
        if tri is None:
            raise RuntimeError("no Triton")
        outs = [torch.empty(t, d, device=dev, dtype=dtype) for _ in xs]
        err = rel_err(tri["silu_mul"](xs[0], outs[0]), ref)
        return [lambda x=x, o=o: tri["silu_mul"](x, o) for x, o in zip(xs, outs)], err
    if op == "add":
        t, h = sh["tokens"], sh["width"]
        nb = copies_for(t * h * esize * 3)
        xs, ys = [rnd(t, h) for _ in range(nb)], [rnd(t, h) for _ in range(nb)]
        outs = [torch.empty_like(x) for x in xs]
        err = rel_err(torch.add(xs[0], ys[0], out=outs[0]), xs[0].float() + ys[0].float())
        return [lambda x=x, y=y, o=o: torch.add(x, y, out=o) for x, y, o in zip(xs, ys, outs)], err
    if op == "rope":
        t, hq, hk, d = sh["tokens"], sh["heads_q"], sh["heads_kv"], sh["head_dim"]
        nb = copies_for(t * (hq + hk) * d * esize * 2)
        qs, ks = [rnd(t, hq, d) for _ in range(nb)], [rnd(t, hk, d) for _ in range(nb)]
        pos = torch.arange(t, device=dev, dtype=torch.float32)
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
        ang = torch.outer(pos, inv)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        rq, rk = hf_rope(qs[0].float(), ks[0].float(), cos.float(), sin.float())
        if impl == "hf-eager":
            oq, ok = hf_rope(qs[0], ks[0], cos, sin)
            err = max(rel_err(oq, rq), rel_err(ok, rk))
            return [lambda q=q, k=k: hf_rope(q, k, cos, sin) for q, k in zip(qs, ks)], err
        if impl == "engine-cuda":
            if CUDA is None:
                raise RuntimeError("no CuPy")
            cp, f = CUDA["cp"], CUDA["rotary_embedding"]
            cache = torch.cat((ang.cos(), ang.sin()), dim=-1).to(dtype).contiguous()  # [positions, rot_dim]
            pos_i = torch.arange(t, device=dev, dtype=torch.int64)
            args = lambda q, k: (cview(pos_i), cview(q), cview(k), cview(cache), cp.int32(d), cp.int32(hq),  # noqa: E731
                                 cp.int32(hk), cp.int32(d))
            block = min(hq * d // 2, 512)
            q0, k0 = qs[0].clone(), ks[0].clone()
            f((t,), (block,), args(q0, k0))
            torch.cuda.synchronize()
            err = max(rel_err(q0, rq), rel_err(k0, rk))
            return [lambda a=args(q, k): f((t,), (block,), a) for q, k in zip(qs, ks)], err
        if tri is None:
            raise RuntimeError("no Triton")
        q0, k0 = qs[0].clone(), ks[0].clone()
        tri["rope"](q0, k0, cos, sin)
        err = max(rel_err(q0, rq), rel_err(k0, rk))
        return [lambda q=q, k=k: tri["rope"](q, k, cos, sin) for q, k in zip(qs, ks)], err
    if op.startswith("attention"):
        b, sq, skv = sh["batch"], sh["seq_q"], sh["seq_kv"]
        hq, hk, d, causal = sh["heads_q"], sh["heads_kv"], sh["head_dim"], sh["causal"]
        nb = copies_for(b * skv * hk * d * esize * 2 + b * sq * hq * d * esize * 2)
        qs = [rnd(b, sq, hq, d) for _ in range(nb)]
        kvs = [(rnd(b, skv, hk, d), rnd(b, skv, hk, d)) for _ in range(nb)]
        if impl == "fa2":
            def call(q, k, v):
                return torch.ops.aten._flash_attention_forward(q, k, v, None, None, sq, skv, 0.0, causal, False)[0]
        else:
            def call(q, k, v):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal and sq == skv, enable_gqa=True).transpose(1, 2)
        err = ""
        if b * sq * skv * hq <= 2**31:  # check against the math on the first copy (bottom-right causal mask)
            q, (k, v) = qs[0][:1, :, :, :], (kvs[0][0][:1], kvs[0][1][:1])
            rep = hq // hk
            qf = q.float().transpose(1, 2)
            kf = k.float().repeat_interleave(rep, dim=2).transpose(1, 2)
            vf = v.float().repeat_interleave(rep, dim=2).transpose(1, 2)
            att = qf @ kf.transpose(-1, -2) / math.sqrt(d)
            if causal:
                i = torch.arange(sq, device=dev)[:, None] + (skv - sq)
                j = torch.arange(skv, device=dev)[None, :]
                att = att.masked_fill(j > i, float("-inf"))
            ref = (att.softmax(-1) @ vf).transpose(1, 2)
            err = rel_err(call(q, k, v), ref)
            del att, ref, qf, kf, vf
        return [lambda q=q, kv=kv: call(q, kv[0], kv[1]) for q, kv in zip(qs, kvs)], err
    if op == "gemm":
        m, n, k = sh["M"], sh["N"], sh["K"]
        nb = copies_for((n * k + m * k + m * n) * esize)
        xs = [rnd(m, k) for _ in range(nb)]
        ws = [rnd(n, k, scale=k ** -0.5) for _ in range(nb)]
        err = rel_err(F.linear(xs[0], ws[0]), xs[0].float() @ ws[0].float().t()) if m * n * k <= 2**34 else ""
        return [lambda x=x, w=w: F.linear(x, w) for x, w in zip(xs, ws)], err
    if op == "gemm_fp8":
        m, n, k = sh["M"], sh["N"], sh["K"]
        f8 = torch.float8_e4m3fn
        nb = copies_for(n * k + m * k + m * n * 2)
        xs = [rnd(m, k).to(f8) for _ in range(nb)]
        ws = [rnd(n, k).to(f8) for _ in range(nb)]
        if impl.endswith("tensorwise"):
            sa = torch.tensor(1.0, device=dev)
            sb = torch.tensor(k ** -0.5, device=dev)
        else:
            sa = torch.ones(m, 1, device=dev)
            sb = torch.full((1, n), k ** -0.5, device=dev)

        def call(x, w):
            return torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
        err = ""
        if m * n * k <= 2**34:
            err = rel_err(call(xs[0], ws[0]), xs[0].float() @ ws[0].float().t() * (k ** -0.5))
        return [lambda x=x, w=w: call(x, w) for x, w in zip(xs, ws)], err
    raise ValueError(op)


# ------------------------------------------------------------------------------------------------ main
def env_lines(cuda: bool) -> list[str]:
    lines = [f"python {sys.version.split()[0]}; torch {torch.__version__}; CUDA {torch.version.cuda}; "
             f"cuDNN {torch.backends.cudnn.version()}; triton {TRITON['version'] if TRITON else 'none'}; "
             f"cupy {CUDA['version'] if CUDA else 'none'}"]
    if cuda:
        p = torch.cuda.get_device_properties(0)
        lines.append(f"GPU {p.name}: capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                     f"{p.total_memory / 2**30:.1f} GiB, L2 {getattr(p, 'L2_cache_size', 0) / 2**20:.0f} MiB")
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,pstate,clocks.sm,clocks.max.sm,"
                                "clocks.mem,power.draw,power.limit,temperature.gpu", "--format=csv"],
                               capture_output=True, text=True, timeout=20)
            lines.append(r.stdout.strip())
        except (OSError, subprocess.TimeoutExpired) as e:
            lines.append(f"nvidia-smi not run: {e}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a CPU check of the logic)")
    ap.add_argument("--budget-s", type=float, default=330.0, help="stop starting cases after this many seconds")
    ap.add_argument("--only", default="", help="run only ops whose name starts with this")
    ap.add_argument("--impl", default="", help="run only implementations starting with this (!x: all but those)")
    ap.add_argument("--set", default="v1", choices=("v1", "v2"), help="v1: the first sweep; v2: cases_v2()")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    cuda = a.device.startswith("cuda")
    dev = torch.device(a.device)
    dtype = torch.bfloat16
    if cuda:
        try:
            load_triton()
        except Exception as e:  # noqa: BLE001 - Triton is optional: its cases are recorded as failed
            log(f"Triton not loaded: {type(e).__name__}: {e}")
        if a.set == "v2":
            try:
                load_cuda()
            except Exception as e:  # noqa: BLE001 - CuPy is optional: its cases are recorded as failed
                log(f"CuPy kernels not compiled: {type(e).__name__}: {e}")
    env = env_lines(cuda)
    log("\n".join(env))
    todo = [c for c in (cases_v2() if a.set == "v2" else cases(a.smoke)) if c[0].startswith(a.only)]
    if a.impl:
        neg = a.impl.startswith("!")
        todo = [c for c in todo if c[1].startswith(a.impl.lstrip("!")) != neg]
    path = os.path.join(a.out, "kernels.csv")
    done = failed = 0
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for i, (op, impl, sh) in enumerate(todo):
            if time.time() - t0 > a.budget_s:
                log(f"budget spent after {done} cases; {len(todo) - i} not run")
                break
            row = dict(case=i, op=op, implementation=impl, dtype="fp8_e4m3" if op == "gemm_fp8" else "bf16", **sh)
            try:
                fns, err = build(op, impl, sh, dev, dtype)
                times, ev_us, calls, kpc, names = measure(fns, cuda)
                times.sort()
                q = lambda p: times[min(len(times) - 1, int(p * len(times)))]  # noqa: E731
                row.update(time_us=f"{statistics.median(times):.3f}", time_us_mean=f"{statistics.fmean(times):.3f}",
                           time_us_p10=f"{q(0.1):.3f}", time_us_p90=f"{q(0.9):.3f}", event_us=f"{ev_us:.3f}",
                           calls=calls, copies=len(fns), kernels_per_call=kpc, kernels=" | ".join(names)[:400],
                           check=f"{err:.2e}" if err != "" else "", status="ok")
                done += 1
            except Exception as e:  # noqa: BLE001 - one failed case is recorded, the others still run
                row.update(status=f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                failed += 1
                if failed <= 3:
                    traceback.print_exc()
            finally:
                fns = None
                if cuda:
                    torch.cuda.empty_cache()
            w.writerow(row)
            fh.flush()
            if i % 20 == 0:
                log(f"[{time.time() - t0:6.1f}s] {i + 1}/{len(todo)} {op} {impl} {sh} -> {row.get('time_us', row['status'])}")
    env += env_lines(cuda)[1:] if cuda else []
    env.append(f"cases: {done} ok, {failed} failed, of {len(todo)}; {time.time() - t0:.0f} s")
    with open(os.path.join(a.out, "env.txt"), "w") as fh:
        fh.write("\n".join(env) + "\n")
    log(env[-1])
    return 0 if done else 1


if __name__ == "__main__":
    sys.exit(main())
