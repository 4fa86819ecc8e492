"""How close `lmcost op` comes to real kernels: measure single operators on this machine and compare.

    python benchmarks/op_accuracy.py --gpu h100 --device cuda --out reports/op-accuracy-h100.md
    python benchmarks/op_accuracy.py --gpu local-cpu.yaml --device cpu        # shapes shrunk for a CPU

The cases are issue 6's: GEMMs of prefill and decode shapes (Llama-3-8B/70B projections), prefill
and decode attention (torch SDPA, GQA), RMSNorm, SiLU-and-mul, residual add and RoPE. Each runs inside a
profiler scope and is timed as `lmcost validate` times a model (CUDA: the kernels in the scope; CPU:
the scope's wall time; median of repeats). On CUDA, SiLU-and-mul and RoPE are compiled into one fused
kernel each with torch.compile where it works (as vLLM ships them fused); otherwise they run eager and
are predicted unfused (two kernels, the intermediate written and read).

Prints one row per case and, per operator class, the median absolute error of the roofline and of the
calibrated model. The GPU YAML should describe the device the kernels run on (a shipped name on that
GPU, or `lmcost calibrate` output). Fitting is not done here: the YAML's efficiency figures are fixed
before this runs, so these cases are held out.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from pathlib import Path

from lmcost import LmcostError
from lmcost.cost import kernels as K
from lmcost import load_gpu
from lmcost.apps.estimate import check_count
from lmcost.basics.files import check_folder
from lmcost.operators.fusion import unfused_gated
from lmcost.profiling.device import check_device
from lmcost.profiling.decoder_kernels import _rotate
from lmcost.profiling.fit import measure
from lmcost.profiling.torch_dtypes import TORCH_DTYPES

# (what the shape is, builder, kwargs) at GPU size; shrink() scales them for a CPU.
CASES = [
    ("prefill q/o", "gemm", dict(m=4096, n=4096, k=4096)),
    ("prefill gate/up", "gemm", dict(m=4096, n=14336, k=4096)),
    ("prefill down", "gemm", dict(m=4096, n=4096, k=14336)),
    ("prefill 70B qkv", "gemm", dict(m=2048, n=10240, k=8192)),
    ("decode q/o", "gemm", dict(m=1, n=4096, k=4096)),
    ("decode gate/up", "gemm", dict(m=16, n=14336, k=4096)),
    ("decode down", "gemm", dict(m=64, n=4096, k=14336)),
    ("decode 70B", "gemm", dict(m=128, n=8192, k=8192)),
    ("prefill", "attention", dict(phase="prefill", batch=1, seq=4096, heads=32, kv_heads=8, head_dim=128)),
    ("prefill", "attention", dict(phase="prefill", batch=8, seq=2048, heads=32, kv_heads=8, head_dim=128)),
    ("decode", "attention", dict(phase="decode", batch=16, kv_len=32768, heads=32, kv_heads=8, head_dim=128)),
    ("decode", "attention", dict(phase="decode", batch=64, kv_len=2048, heads=32, kv_heads=8, head_dim=128)),
    ("", "norm", dict(kind="rmsnorm", tokens=4096, hidden=8192)),
    ("", "norm", dict(kind="rmsnorm", tokens=512, hidden=4096)),
    ("", "norm", dict(kind="rmsnorm", tokens=16, hidden=4096)),
    ("", "elementwise", dict(kind="silu_mul", tokens=512, width=28672)),
    ("", "elementwise", dict(kind="silu_mul", tokens=4096, width=14336)),
    ("", "elementwise", dict(kind="add", tokens=512, width=4096)),
    ("", "elementwise", dict(kind="add", tokens=4096, width=8192)),
    ("", "elementwise", dict(kind="rope", tokens=512, heads=32, kv_heads=8, head_dim=128)),
    ("", "elementwise", dict(kind="rope", tokens=4096, heads=32, kv_heads=8, head_dim=128)),
]


def label(what: str, builder: str, kw: dict) -> str:
    """The case as it runs: ``prefill q/o 4096x4096x4096``, ``decode b=16 t=32768 h=32/8 d=128``."""
    if builder == "gemm":
        return f"{what} {kw['m']}x{kw['n']}x{kw['k']}"
    if builder == "attention":
        t = f"s={kw['seq']}" if kw["phase"] == "prefill" else f"t={kw['kv_len']}"
        return f"{what} b={kw['batch']} {t} h={kw['heads']}/{kw['kv_heads']} d={kw['head_dim']}"
    if builder == "norm":
        return f"{kw['kind']} {kw['tokens']}x{kw['hidden']}"
    if kw["kind"] == "rope":
        return f"rope {kw['tokens']} tokens h={kw['heads']}/{kw['kv_heads']} d={kw['head_dim']}"
    return f"{kw['kind']} {kw['tokens']}x{kw['width']}"

@dataclass(frozen=True)
class Case:
    """One measured case: its name, class, cost records (as `lmcost op` builds them) and the call."""

    name: str
    kind: str
    ops: list
    fn: Callable[[], object]


TOKENS = ("m", "seq", "kv_len", "tokens")
WIDTHS = ("n", "k", "hidden", "width")


def shrink(kw: dict) -> dict:
    """CPU size: token counts / 8, widths / 4 (heads and head_dim kept)."""
    return {k: (max(1, v // 8) if k in TOKENS else max(1, v // 4) if k in WIDTHS else v) for k, v in kw.items()}


def _fused(fn, device, *args):
    """``fn`` compiled into one kernel by torch.compile on CUDA, or None (run eager, predict unfused).

    torch.compile is lazy: Dynamo, Inductor and Triton run at the first call, so the compiled function
    is called once here on ``args`` (copies: ``fn`` may write its inputs), and any error then (no
    compiler, no Triton, a graph break under fullgraph) counts as no fusion, said on stderr.
    """
    if not device.startswith("cuda"):
        return None
    try:
        compiled = torch.compile(fn, fullgraph=True, dynamic=False)
        compiled(*(a.clone() for a in args))
        torch.cuda.synchronize()
        return compiled
    except Exception as e:  # noqa: BLE001 - no working compiler here: run eager and predict unfused
        print(f"torch.compile failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              "running eager", file=sys.stderr)
        return None


def bench(name, builder, kw, device, dtype) -> Case:
    """The measured call and its cost records for one case."""
    td = TORCH_DTYPES[dtype]
    r = lambda *s: torch.randn(*s, device=device).to(td)
    if builder == "gemm":
        a, b = r(kw["m"], kw["k"]), r(kw["k"], kw["n"])
        return Case(name, "gemm", K.gemm(dtype=dtype, **kw), lambda: a @ b)
    if builder == "attention":
        s = 1 if kw["phase"] == "decode" else kw["seq"]
        t = kw.get("kv_len") or s
        q, k_, v = r(kw["batch"], kw["heads"], s, kw["head_dim"]), r(kw["batch"], kw["kv_heads"], t, kw["head_dim"]), \
            r(kw["batch"], kw["kv_heads"], t, kw["head_dim"])
        gqa = kw["heads"] != kw["kv_heads"]
        return Case(name, "attention", K.attention(dtype=dtype, **kw),
                     lambda: F.scaled_dot_product_attention(q, k_, v, is_causal=s > 1, enable_gqa=gqa))
    if builder == "norm":
        x, w = r(kw["tokens"], kw["hidden"]), r(kw["hidden"])
        return Case(name, "norm", K.norm(dtype=dtype, **kw), lambda: F.rms_norm(x, (kw["hidden"],), w, 1e-6))
    ops = K.elementwise(dtype=dtype, **kw)
    kind = kw["kind"]
    if kind == "add":
        x, y = r(kw["tokens"], kw["width"]), r(kw["tokens"], kw["width"])
        return Case(name, "elementwise", ops, lambda: x + y)
    if kind == "silu_mul":
        g, u = r(kw["tokens"], kw["width"]), r(kw["tokens"], kw["width"])
        fused = _fused(lambda g, u: F.silu(g) * u, device, g, u)
        if fused is not None:
            return Case(name, "elementwise", ops, lambda: fused(g, u))
        return Case(name + " (eager, 2 kernels)", "elementwise", [unfused_gated(ops[0])], lambda: F.silu(g) * u)
    q, k_ = r(kw["tokens"], kw["heads"], kw["head_dim"]), r(kw["tokens"], kw["kv_heads"], kw["head_dim"])
    cos, sin = r(kw["tokens"], kw["head_dim"]), r(kw["tokens"], kw["head_dim"])
    both = lambda q, k_, cos, sin: (_rotate(q, cos, sin), _rotate(k_, cos, sin))
    fused = _fused(both, device, q, k_, cos, sin)
    return Case(name if fused else name + " (eager)", "elementwise", ops,
                 (lambda: fused(q, k_, cos, sin)) if fused else (lambda: both(q, k_, cos, sin)))


def main(argv=None) -> int:
    try:
        return run(argv)
    except LmcostError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", required=True, help="GPU YAML or shipped name describing this device")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (the median is kept), at least 1")
    ap.add_argument("--out", default=None, help="also write a markdown report here")
    a = ap.parse_args(argv)
    dtype = a.dtype or ("bf16" if a.device.startswith("cuda") else "fp32")
    check_device(a.device)
    check_count("--repeats", a.repeats)
    if dtype not in TORCH_DTYPES:
        raise LmcostError("--dtype", f"{dtype} cannot run here", f"use one of {', '.join(TORCH_DTYPES)}")
    gpu = load_gpu(a.gpu)
    if a.out:
        check_folder(Path(a.out).parent, "--out", "give a file path inside a writable folder")
    cpu = not a.device.startswith("cuda")
    cases = [(what, b, shrink(kw) if cpu else kw) for what, b, kw in CASES]
    for _, b, kw in cases:  # every prediction is possible before anything is measured
        K.cost(getattr(K, b)(dtype=dtype, **kw), gpu, dtype)
    benches = [bench(label(what, b, kw), b, kw, a.device, dtype) for what, b, kw in cases]
    times = measure([replace(b, name=f"case.{i}") for i, b in enumerate(benches)], a.device, a.repeats)
    rows = []
    for i, b in enumerate(benches):
        c = K.cost(b.ops, gpu, dtype)
        meas = times.get(f"case.{i}", float("nan"))
        rows.append(dict(cls=b.kind, case=b.name, measured_s=meas, roofline_s=c["time_s"]["roofline"],
                         calibrated_s=c["time_s"]["calibrated"]))
    err = lambda p, m: 100 * (p - m) / m
    lines = [f"# lmcost op against measured kernels: {gpu.name} YAML, {a.device} ({dtype}), torch {torch.__version__}", "",
             *(["Shapes shrunk for a CPU (token counts / 8, widths / 4): the labels give the shapes that ran.", ""]
               if cpu else []),
             "| class | case | measured (us) | roofline (us) | calibrated (us) | roofline error % | calibrated error % |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['cls']} | {r['case']} | {r['measured_s'] * 1e6:.1f} | {r['roofline_s'] * 1e6:.1f} | "
                     f"{r['calibrated_s'] * 1e6:.1f} | {err(r['roofline_s'], r['measured_s']):+.1f} | "
                     f"{err(r['calibrated_s'], r['measured_s']):+.1f} |")
    lines += ["", "| class | cases | roofline median abs error % | calibrated median abs error % |", "|---|---:|---:|---:|"]
    for cls in dict.fromkeys(r["cls"] for r in rows):
        sel = [r for r in rows if r["cls"] == cls]
        med = {m: statistics.median(abs(err(r[f"{m}_s"], r["measured_s"])) for r in sel) for m in ("roofline", "calibrated")}
        lines.append(f"| {cls} | {len(sel)} | {med['roofline']:.1f} | {med['calibrated']:.1f} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if a.out:
        from lmcost.basics.files import write_text

        write_text(a.out, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
