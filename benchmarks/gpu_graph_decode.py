#!/usr/bin/env python3
"""Time whole decode steps of a Llama-3-8B-shaped decoder on one CUDA GPU, replayed as a CUDA graph (what a
serving engine runs) and eager, as a held-out end-to-end check of `lmcost estimate`'s TPOT (issue 25).

    python3 benchmarks/gpu_graph_decode.py OUT_DIR [--budget-s 240]      # on the GPU (torch, Triton, CuPy)
    python3 benchmarks/gpu_graph_decode.py /tmp/g --device cpu --smoke    # checks the script's logic on a CPU

Imports torch, Triton and CuPy (through benchmarks/gpu_kernels.py's kernels), not lmcost. Writes
OUT_DIR/steps.csv (one row per variant, batch and context: graph replay time, eager time, the sum of the kernel
durations in one replay and that sum per operator class), OUT_DIR/kernels.csv (per case and kernel name:
calls and total duration in one replay), OUT_DIR/env.txt and OUT_DIR/log.txt.

The model: Llama-3-8B's shapes (d 4096, 32 query and 8 KV heads of 128, d_ff 14336, vocabulary 128,256, 32 layers),
bf16, random weights, a preallocated KV cache of `context` positions per sequence; one decode step = one new
token per sequence attending to all `context` positions (the new K/V written at the last one).
Two kernel sets, each the operator list of one `lmcost estimate` setting:
- `torch` (estimate's default fusion, silu_mul only; compare with `--engine torch` / auto): `F.rms_norm`
  (PyTorch's fused kernel), separate q/k/v and gate/up GEMMs (`F.linear`, cuBLAS), RoPE in Triton (one kernel for
  q and k), FlashAttention-2 as PyTorch bundles it (`aten._flash_attention_forward`, GQA native), residual adds
  in PyTorch, SiLU-and-mul in Triton;
- `vllm` (vLLM's fusion: qkv and gate_up GEMMs, fused add+RMSNorm; compare with `--engine vllm --kernel fa2`):
  the engine kernel designs of gpu_kernels.py (rms_norm, fused_add_rms_norm, silu_and_mul, rotary_embedding;
  CUDA compiled by NVRTC through CuPy, launched on torch's stream), the same GEMMs and FA2 kernel.
What a time is: `graph_us`, the median over replays of one step's CUDA-graph replay, CUDA events around it
(launch gaps inside the graph included, CPU not); `eager_us`, the same step run op by op (CPU launch included);
`kernel_us`, the sum of the kernel durations (torch.profiler, CUPTI) in one replay.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections import defaultdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_kernels as gk  # noqa: E402

D, H, HKV, DH, DFF, VOCAB, LAYERS = 4096, 32, 8, 128, 14336, 128256, 32
CASES = [(1, 2048), (1, 8192), (8, 2048), (8, 8192), (32, 2048), (32, 8192), (64, 4096), (128, 2048)]
SMOKE = dict(D=256, H=4, HKV=2, DH=64, DFF=512, VOCAB=1000, LAYERS=2, CASES=[(1, 64), (2, 128)])


def log(*a):
    gk.log(*a)


def kernel_class(name: str) -> str:
    """The lmcost operator class of a CUDA kernel name: copies are the KV-cache writes (lmcost has no op for them),
    indexSelect the embedding gather, flash the attention, cuBLAS/CUTLASS names (nvjet, gemm, split-K reduce) GEMMs."""
    n = name.lower()
    if "indexselect" in n:
        return "embedding"
    if "memcpy" in n or "copy" in n:
        return "cache_write"
    if "flash" in n or "fmha" in n:
        return "attention"
    if "gemm" in n or "nvjet" in n or "splitk" in n or "cutlass" in n or "xmma" in n:
        return "gemm"
    if "norm" in n:
        return "norm"
    if "memset" in n:
        return "other"
    return "elementwise"


class Model:
    """Weights, KV cache and the step's buffers; `step()` is one decode step, all shapes static."""

    def __init__(self, dims: dict, variant: str, batch: int, context: int, weights: dict, cache: torch.Tensor,
                 dev: str):
        self.dims, self.variant, self.b, self.t, self.w, self.dev = dims, variant, batch, context, weights, dev
        d, h, hk, dh = dims["D"], dims["H"], dims["HKV"], dims["DH"]
        n = batch * context * hk * dh
        # one cache slab per layer: [2][batch, context, h_kv, d_h], a view of the preallocated storage
        self.kv = [cache[i, : 2 * n].view(2, batch, context, hk, dh) for i in range(dims["LAYERS"])]
        bf = torch.bfloat16
        self.ids = (torch.arange(batch, device=dev) * 7919 + 11) % dims["VOCAB"]  # fixed tokens: variants comparable
        self.pos = torch.full((batch,), context - 1, dtype=torch.int64, device=dev)
        ang = (context - 1) / (500000.0 ** (torch.arange(0, dh // 2, device=dev).float() * 2 / dh))
        self.cos = torch.cat([ang.cos(), ang.cos()]).to(bf).expand(batch, dh).contiguous()
        self.sin = torch.cat([ang.sin(), ang.sin()]).to(bf).expand(batch, dh).contiguous()
        self.cos_sin_cache = torch.zeros(context, dh, dtype=bf, device=dev)  # vLLM's [pos][cos | sin] layout
        self.cos_sin_cache[context - 1] = torch.cat([ang.cos(), ang.sin()]).to(bf)
        self.cuda = dev == "cuda"

    # ---- kernels (GPU: Triton / CuPy; CPU smoke: their eager references)
    def norm(self, x, w):
        """RMSNorm of x [b, d] into a new tensor: vLLM's rms_norm design, or PyTorch's fused kernel."""
        if self.variant == "vllm" and self.cuda:
            out = torch.empty_like(x)
            c = gk.CUDA
            c["rms_norm"]((x.shape[0],), (min(x.shape[1], 1024),),
                          (gk.cview(out), gk.cview(x), gk.cview(w), c["cp"].float32(1e-5), c["cp"].int32(x.shape[1])))
            return out
        return F.rms_norm(x, (x.shape[1],), w, 1e-5)

    def add_norm(self, x, res, w):
        """vLLM's fused_add_rms_norm, in place: res += x; x = norm(res) * w."""
        if self.cuda:
            c = gk.CUDA
            c["fused_add_rms_norm"]((x.shape[0],), (min(x.shape[1] // 8, 1024),),
                                    (gk.cview(x), gk.cview(res), gk.cview(w), c["cp"].float32(1e-5),
                                     c["cp"].int32(x.shape[1])))
            return x
        res.add_(x)
        x.copy_(F.rms_norm(res, (res.shape[1],), w, 1e-5))
        return x

    def rope(self, q, k):
        """RoPE in place on q [b, h, d_h] and k [b, h_kv, d_h] (token rows may be strided, as vLLM's qkv split)."""
        b, dh = q.shape[0], q.shape[-1]
        if self.cuda and self.variant == "vllm":
            c = GRAPH_CUDA
            c["rotary"]((b,), (min(q.shape[1] * dh // 2, 512),),
                        (gk.cview(self.pos), gk.cview(q), gk.cview(k), gk.cview(self.cos_sin_cache),
                         c["cp"].int32(dh), c["cp"].int32(q.shape[1]), c["cp"].int32(k.shape[1]), c["cp"].int32(dh),
                         c["cp"].int64(q.stride(0)), c["cp"].int64(k.stride(0))))
        elif self.cuda:
            gk.TRITON["rope"](q, k, self.cos, self.sin)
        else:
            cos, sin = self.cos[:, None], self.sin[:, None]
            q.copy_(q * cos + gk.rotate_half(q) * sin)
            k.copy_(k * cos + gk.rotate_half(k) * sin)

    def silu_mul(self, g, u):
        """SiLU(g) * u, one kernel: vLLM's act_and_mul design over [g | u] rows (g is then the fused buffer), or Triton."""
        if self.cuda and self.variant == "vllm":
            out = torch.empty(g.shape[0], g.shape[1] // 2, dtype=g.dtype, device=g.device)
            c = gk.CUDA
            c["silu_and_mul"]((g.shape[0],), (min(out.shape[1], 1024),),
                              (gk.cview(out), gk.cview(g), c["cp"].int32(out.shape[1])))
            return out
        if self.cuda:
            return GRAPH_TRITON["silu_mul2"](g, u)
        if u is None:
            g, u = g.chunk(2, dim=1)
        return F.silu(g) * u

    def attention(self, q, k, v, i):
        """Write the new K/V at the last position, then FA2 over the whole cache: q [b, 1, h, d_h]."""
        cache = self.kv[i]
        cache[0, :, self.t - 1].copy_(k)
        cache[1, :, self.t - 1].copy_(v)
        if self.cuda:
            return torch.ops.aten._flash_attention_forward(q, cache[0], cache[1], None, None, 1, self.t, 0.0, False,
                                                           False)[0]
        rep = q.shape[2] // cache.shape[3]
        kk = cache[0].repeat_interleave(rep, dim=2).transpose(1, 2).float()
        vv = cache[1].repeat_interleave(rep, dim=2).transpose(1, 2).float()
        return F.scaled_dot_product_attention(q.transpose(1, 2).float(), kk, vv).transpose(1, 2).to(q.dtype)

    def step(self):
        dm, w, b = self.dims, self.w, self.b
        h, hk, dh = dm["H"], dm["HKV"], dm["DH"]
        x = F.embedding(self.ids, w["embed"])
        if self.variant == "vllm":  # vLLM's Llama: qkv and gate_up GEMMs, the residual add fused into the norms
            res = x
            x = self.norm(res, w["norm"][0])
            for i in range(dm["LAYERS"]):
                if i > 0:
                    self.add_norm(x, res, w["norm"][2 * i])
                qkv = F.linear(x, w["qkv"][i])
                q = qkv[:, : h * dh].view(b, h, dh)
                k = qkv[:, h * dh: (h + hk) * dh].view(b, hk, dh)
                v = qkv[:, (h + hk) * dh:].view(b, hk, dh)
                self.rope(q, k)
                o = F.linear(self.attention(q.view(b, 1, h, dh), k, v, i).reshape(b, h * dh), w["o"][i])
                x = self.add_norm(o, res, w["norm"][2 * i + 1])
                x = F.linear(self.silu_mul(F.linear(x, w["gate_up"][i]), None), w["down"][i])
            x = self.add_norm(x, res, w["norm"][-1])
            return F.linear(x, w["lm_head"])
        res = x.clone()  # estimate's default op list: separate GEMMs, norms and residual adds
        for i in range(dm["LAYERS"]):
            hn = self.norm(res, w["norm"][2 * i])
            q = F.linear(hn, w["q"][i]).view(b, h, dh)
            k = F.linear(hn, w["k"][i]).view(b, hk, dh)
            v = F.linear(hn, w["v"][i]).view(b, hk, dh)
            self.rope(q, k)
            res.add_(F.linear(self.attention(q.view(b, 1, h, dh), k, v, i).reshape(b, h * dh), w["o"][i]))
            hn = self.norm(res, w["norm"][2 * i + 1])
            res.add_(F.linear(self.silu_mul(F.linear(hn, w["gate"][i]), F.linear(hn, w["up"][i])), w["down"][i]))
        return F.linear(self.norm(res, w["norm"][-1]), w["lm_head"])


GRAPH_CUDA: dict = {}
GRAPH_TRITON: dict = {}

ROPE_STRIDED = r'''
// vLLM's rotary_embedding (NeoX) with token strides for q and k (vLLM passes query_stride / key_stride: q and k
// are views of the fused qkv output); otherwise gpu_kernels.py's rotary_embedding, whose helpers it uses (compiled
// after gpu_kernels.ENGINE_CUDA, in one module).
extern "C" __global__ void rotary(const long long* pos, unsigned short* q, unsigned short* k,
                                  const unsigned short* cache, int rot_dim, int heads, int kv_heads, int head_size,
                                  long long q_stride, long long k_stride) {
  const long long t = blockIdx.x;
  const unsigned short* cs = cache + pos[t] * rot_dim;
  const int embed = rot_dim / 2;
  for (int i = threadIdx.x; i < heads * embed; i += blockDim.x) {
    const int h = i / embed;
    rotate(q + t * q_stride + h * head_size, cs, i % embed, embed);
  }
  for (int i = threadIdx.x; i < kv_heads * embed; i += blockDim.x) {
    const int h = i / embed;
    rotate(k + t * k_stride + h * head_size, cs, i % embed, embed);
  }
}
'''


def load_graph_kernels():
    """The strided RoPE (CuPy/NVRTC) and a Triton SiLU-and-mul over separate gate and up tensors."""
    import cupy as cp
    import triton
    import triton.language as tl

    mod = cp.RawModule(code=gk.ENGINE_CUDA + ROPE_STRIDED, options=("--std=c++17",))
    GRAPH_CUDA.update(cp=cp, rotary=mod.get_function("rotary"))

    @triton.jit
    def silu_mul2_k(g_ptr, u_ptr, out_ptr, D, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = col < D
        g = tl.load(g_ptr + row * D + col, mask=m, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * D + col, mask=m, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * D + col, (g / (1.0 + tl.exp(-g)) * u).to(out_ptr.dtype.element_ty), mask=m)

    def silu_mul2(g, u):
        out = torch.empty_like(g)
        T, D_ = g.shape
        silu_mul2_k[(T, triton.cdiv(D_, 1024))](g, u, out, D_, BLOCK=1024, num_warps=4)
        return out

    GRAPH_TRITON.update(silu_mul2=silu_mul2)


def weights(dims: dict, dev: str) -> dict:
    """Random bf16 weights of both variants (fused qkv / gate_up are views of one storage with the separate ones)."""
    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16

    def rnd(*s):
        return (torch.randn(*s, generator=g, device=dev, dtype=torch.float32) * 0.02).to(bf)

    d, h, hk, dh, dff, L = dims["D"], dims["H"], dims["HKV"], dims["DH"], dims["DFF"], dims["LAYERS"]
    w = dict(embed=rnd(dims["VOCAB"], d), lm_head=rnd(dims["VOCAB"], d),
             norm=[(1 + rnd(d)).contiguous() for _ in range(2 * L + 1)], qkv=[], o=[], gate_up=[], down=[],
             q=[], k=[], v=[], gate=[], up=[])
    for _ in range(L):
        qkv = rnd((h + 2 * hk) * dh, d)
        w["qkv"].append(qkv)
        w["q"].append(qkv[: h * dh])
        w["k"].append(qkv[h * dh: (h + hk) * dh])
        w["v"].append(qkv[(h + hk) * dh:])
        w["o"].append(rnd(d, h * dh))
        gu = rnd(2 * dff, d)
        w["gate_up"].append(gu)
        w["gate"].append(gu[:dff])
        w["up"].append(gu[dff:])
        w["down"].append(rnd(d, dff))
    return w


def time_case(m: Model, replays: int):
    """(graph_us, eager_us, kernel_us, per-class us, per-kernel {name: [calls, us]}) of one step."""
    from torch.profiler import ProfilerActivity, profile

    if m.dev != "cuda":
        t0 = time.perf_counter()
        for _ in range(3):
            m.step()
        e = (time.perf_counter() - t0) / 3 * 1e6
        return e, e, 0.0, {}, {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with gk.CUDA["cp"].cuda.ExternalStream(s.cuda_stream) if gk.CUDA else _null():
            for _ in range(3):
                m.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cs = torch.cuda.current_stream()
        with gk.CUDA["cp"].cuda.ExternalStream(cs.cuda_stream) if gk.CUDA else _null():
            m.step()
    torch.cuda.synchronize()

    def events(fn, n):
        out = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b) * 1e3)
        return statistics.median(out)

    for _ in range(3):
        graph.replay()
    graph_us = events(graph.replay, replays)
    cs = torch.cuda.current_stream()

    def eager():
        with gk.CUDA["cp"].cuda.ExternalStream(cs.cuda_stream) if gk.CUDA else _null():
            m.step()

    eager()
    eager_us = events(eager, max(3, replays // 4))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    ks = gk._kinetic(prof, True)
    per_kernel: dict = defaultdict(lambda: [0, 0.0])
    per_class: dict = defaultdict(float)
    for _, dur, name in ks:
        per_kernel[name][0] += 1
        per_kernel[name][1] += dur / 1e3
        per_class[kernel_class(name)] += dur / 1e3
    del graph
    return graph_us, eager_us, sum(per_class.values()), dict(per_class), dict(per_kernel)


def check_variants(dims: dict, w: dict, cache: torch.Tensor, dev: str, b: int, t: int) -> str:
    """Relative error of each variant's logits against the eager reference (PyTorch ops, fp32 attention)."""
    def logits(variant: str, kernels: bool) -> torch.Tensor:
        m = Model(dims, variant, b, t, w, cache, dev)
        m.cuda = kernels and dev == "cuda"
        with (gk.CUDA["cp"].cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
              if m.cuda and gk.CUDA else _null()):
            out = m.step().float()
        return out

    ref = logits("torch", False)
    errs = {v: gk.rel_err(logits(v, True), ref) for v in ("torch", "vllm")}
    return f"check (b={b}, t={t}): logits' relative error against the eager reference: " + \
        ", ".join(f"{v} {e:.2e}" for v, e in errs.items())


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--replays", type=int, default=40)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    dims = dict(D=D, H=H, HKV=HKV, DH=DH, DFF=DFF, VOCAB=VOCAB, LAYERS=LAYERS)
    cases = CASES
    if a.smoke:
        dims.update({k: v for k, v in SMOKE.items() if k != "CASES"})
        cases = SMOKE["CASES"]
    dev = a.device
    t_start = time.time()
    env = gk.env_lines(dev == "cuda")
    if dev == "cuda":
        gk.load_triton()
        gk.load_cuda()
        load_graph_kernels()
    with open(os.path.join(a.out, "env.txt"), "w") as f:
        f.write("\n".join(env) + "\n")
    torch.manual_seed(0)
    w = weights(dims, dev)
    most = max(b * t for b, t in cases)
    cache = torch.zeros(dims["LAYERS"], 2 * most * dims["HKV"] * dims["DH"], dtype=torch.bfloat16, device=dev)
    cache.normal_()  # a cache of random keys and values (attention reads them all; the last position is rewritten)
    check = check_variants(dims, w, cache, dev, *cases[min(2, len(cases) - 1)])
    log(check)
    with open(os.path.join(a.out, "env.txt"), "a") as f:
        f.write(check + "\n")
    fields = ["variant", "batch", "context", "graph_us", "eager_us", "kernel_us", "gemm_us", "attention_us", "norm_us",
              "elementwise_us", "cache_write_us", "kernels", "status"]
    rows, krows = [], []
    for variant in ("torch", "vllm"):
        for b, t in cases:
            if time.time() - t_start > a.budget_s:
                log(f"budget spent: {variant} b={b} t={t} skipped")
                rows.append(dict(variant=variant, batch=b, context=t, status="skipped (budget)"))
                continue
            try:
                m = Model(dims, variant, b, t, w, cache, dev)
                g, e, k, pc, pk = time_case(m, a.replays)
                rows.append(dict(variant=variant, batch=b, context=t, graph_us=round(g, 2), eager_us=round(e, 2),
                                 kernel_us=round(k, 2), **{f"{c}_us": round(pc.get(c, 0.0), 2) for c in
                                                           ("gemm", "attention", "norm", "elementwise", "cache_write")},
                                 kernels=sum(v[0] for v in pk.values()), status="ok"))
                krows += [dict(variant=variant, batch=b, context=t, kernel=n, calls=c, total_us=round(u, 3),
                               op_class=kernel_class(n)) for n, (c, u) in sorted(pk.items())]
                log(f"{variant} b={b} t={t}: graph {g:.1f} us, eager {e:.1f} us, kernels {k:.1f} us "
                    f"({', '.join(f'{c} {u:.0f}' for c, u in sorted(pc.items()))})")
            except Exception as ex:  # noqa: BLE001  (a failed case is recorded, the run goes on)
                log(f"{variant} b={b} t={t}: FAILED {type(ex).__name__}: {ex}")
                traceback.print_exc()
                rows.append(dict(variant=variant, batch=b, context=t, status=f"failed: {type(ex).__name__}: {ex}"[:200]))
            if dev == "cuda":
                torch.cuda.empty_cache()
    with open(os.path.join(a.out, "steps.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(rows)
    with open(os.path.join(a.out, "kernels.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=["variant", "batch", "context", "kernel", "op_class", "calls", "total_us"])
        wr.writeheader()
        wr.writerows(krows)
    if dev == "cuda":
        env2 = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv"], capture_output=True, text=True).stdout
        with open(os.path.join(a.out, "env.txt"), "a") as f:
            f.write("after:\n" + env2)
    log(f"done in {time.time() - t_start:.0f} s")
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
