"""Fit the efficiency model (:mod:`lmcost.cost.efficiency`) to microbenchmarks run on the local device.

The fitting set is a fixed list of single operators at shapes of its own (widths 320-2600; 320-1536
with ``quick``; every size x4 on CUDA; never a shipped model's), each built from the same cost
primitives as the model graph and run by the same torch calls as the reference decoder, plus the
reference decoder itself at four calibration models of its own sizes (CAL_MODELS), all timed the way
``validate`` times a model: inside a ``record_function`` scope under ``torch.profiler`` (CPU: the
scope's wall time; CUDA: its kernels). Validation runs other models (other widths), so the fit never
sees the data it is judged on.

Per kernel kind the parameters minimise the mean squared log error of
t = kernels * overhead + max(FLOPs / (peak * f_compute * shape), bytes / (bandwidth * f_bw))
by a grid search (a few parameters, a few dozen points: exact enough, and no optimiser to trust).
Each bench's time is its median over repeats in the fastest of a few separate rounds (a shared
machine's slow spells would otherwise skew a whole kind).
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from lmcost.basics.dtypes import BYTES_PER_ELEMENT
from lmcost.cost.efficiency import gemm_shape_efficiency, kernel_time
from lmcost.hardware.efficiency import GemmEfficiency
from lmcost.cost import kernels as K
from lmcost.operators.ffn import router_topk
from lmcost.operators.fusion import unfused_gated
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, lookup
from lmcost.profiling import trace as traces
from lmcost.profiling.control import sync as device_sync
from lmcost.profiling.decoder_kernels import _rotate
from lmcost.profiling.torch_dtypes import TORCH_DTYPES
from lmcost.profiling.quiet import without_profiler_lines

#: Bytes from which a microbenchmark streams its operands from beyond the private caches (the GEMVs).
STREAM_BYTES = 32 * 2**20
#: Output tile assumed for CUDA GEMMs (cuBLAS/CUTLASS's common 128 x 128 CTA tile); CPUs have none.
CUDA_TILE = 128


@dataclass(frozen=True)
class Bench:
    """One microbenchmark: its cost record, the kind it fits, and the call that runs it."""

    name: str
    kind: str
    op: OpCost
    fn: Callable[[], object]


def _benches(device: str, dtype: str, quick: bool) -> list[Bench]:
    """The microbenchmarks, each costed by the builders ``lmcost op`` uses (:mod:`lmcost.cost.kernels`) and
    by the model graph's own primitives, so a fitted figure means what it means in a model."""
    td = TORCH_DTYPES[dtype]
    B = BYTES_PER_ELEMENT[dtype]
    scale = 4 if device.startswith("cuda") else 1
    r = lambda *s: torch.randn(*s, device=device).to(td)
    out: list[Bench] = []

    def add(kind, op, fn):
        out.append(Bench(f"cal.{kind}.{len(out)}", kind, op, fn))

    ms = (1, 6, 48, 260) if quick else (1, 6, 48, 260, 900)
    nks = ((320, 320), (1200, 320), (320, 1200), (1536, 640))
    for m in ms:
        for n, k in nks:
            m_, n_, k_ = m * scale, n * scale, k * scale
            x, w = r(m_, k_), r(n_, k_)
            add("gemm", K.gemm(m_, n_, k_, dtype)[0], lambda x=x, w=w: F.linear(x, w))
    # Decode's weight streams: a few tokens against 32 and 64 MiB of fp32 weights (16x the elements on
    # CUDA), beyond the private caches, as an lm_head or a large model's projections run. The shapes
    # above all fit in a core's L2, so without these the fitted bandwidth is never that of a stream.
    big = 16 if device.startswith("cuda") else 1
    for m in (1, 4):
        for n, k in ((8192, 1024), (8192, 2048), (2048, 8192)):
            x, w = r(m, k * 4 if big > 1 else k), r(n * 4 if big > 1 else n, k * 4 if big > 1 else k)
            add("gemm", K.gemm(m, w.shape[0], w.shape[1], dtype)[0], lambda x=x, w=w: F.linear(x, w))
    for tokens in (1, 24, 300) if quick else (1, 24, 300, 1100):
        for width in (320, 1200) if quick else (320, 1200, 2600):
            t_, w_ = tokens * scale, width * scale
            x, g = r(t_, w_), r(w_)
            add("norm", K.norm("rmsnorm", t_, w_, dtype)[0], lambda x=x, g=g, w_=w_: F.rms_norm(x, (w_,), g, 1e-5))
            add("norm", K.norm("layernorm", t_, w_, dtype, bias=True)[0],
                lambda x=x, g=g, w_=w_: F.layer_norm(x, (w_,), g, g, 1e-5))
            y = r(t_, w_)
            add("elementwise", K.elementwise("add", t_, w_, dtype=dtype)[0], lambda x=x, y=y: x + y)
            # Eager SiLU then multiply, as the reference decoder runs it: the two-kernel form.
            add("elementwise", unfused_gated(K.elementwise("silu_mul", t_, w_, dtype=dtype)[0]),
                lambda x=x, y=y: F.silu(x) * y)
            add("softmax", elementwise("softmax", t_ * w_, 1, FLOPS_PER_ELEMENT["softmax"], B, OpClass.SOFTMAX),
                lambda x=x: torch.softmax(x, -1))
    rope = ((1, 6, 2, 48), (24, 6, 2, 48), (300, 6, 2, 48), (300, 10, 2, 64)) + (() if quick else ((1100, 10, 2, 64),))
    for tokens, heads, kv_heads, d_r in rope:
        t_ = tokens * scale
        q, k = r(1, t_, heads, d_r), r(1, t_, kv_heads, d_r)
        cos, sin = r(t_, d_r), r(t_, d_r)
        add("elementwise", K.elementwise("rope", t_, heads=heads, kv_heads=kv_heads, head_dim=d_r, dtype=dtype)[0],
            lambda q=q, k=k, cos=cos, sin=sin: (_rotate(q, cos, sin), _rotate(k, cos, sin)))
    attn = ((1, 40, 40, 6, 2, 48), (1, 200, 200, 6, 2, 48), (2, 160, 160, 8, 8, 64),
            (1, 1, 100, 6, 2, 48), (4, 1, 600, 6, 2, 48), (8, 1, 300, 8, 2, 64))
    if not quick:
        attn += ((1, 700, 700, 10, 2, 96), (6, 1, 3000, 10, 2, 96))
    for b, s, t, h, h_kv, d_h in attn:
        s_, t_ = (s * scale if s > 1 else 1), t * scale
        q, k, v = r(b, h, s_, d_h), r(b, h_kv, t_, d_h), r(b, h_kv, t_, d_h)
        sdpa = K.attention("prefill" if s_ > 1 else "decode", b, h, h_kv, d_h, s_ if s_ > 1 else None, t_, dtype=dtype)[0]
        add("attention", sdpa, lambda q=q, k=k, v=v, causal=s_ > 1, gqa=h != h_kv: F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=gqa))
    for tokens, V, d in ((1, 5000, 320), (300, 5000, 320), (60, 20000, 640)):
        t_ = tokens * scale
        table = r(V, d)
        ids = torch.randint(0, V, (t_,), device=device)
        add("embedding", lookup("embed", t_, d, V, B, B), lambda table=table, ids=ids: F.embedding(ids, table))
    for tokens, E, k in ((1, 16, 2), (48, 16, 2), (300, 64, 6)):
        t_ = tokens * scale
        logits = r(t_, E)
        add("moe_routing", router_topk("topk", t_, E, k, B),
            lambda logits=logits, k=k: torch.softmax(logits, -1).topk(k, -1))
    return out


def measure(benches: list, device: str, repeats: int) -> dict[str, float]:
    """Median seconds of each bench (anything with a unique ``name`` and a ``fn`` to call) over
    ``repeats``, from a torch.profiler trace, read as validate reads one. Keys: the names."""
    sync = functools.partial(device_sync, device)
    with torch.inference_mode():
        for b in benches:  # warm-up outside the profiler
            b.fn()
            b.fn()
        sync()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with without_profiler_lines(), torch.profiler.profile(activities=activities) as prof:
            for rep in range(repeats):
                with torch.profiler.record_function(f"lmcost.prefill.{rep}"):
                    for b in benches:
                        with torch.profiler.record_function(b.name):
                            b.fn()
                            sync()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        df = traces.scope_times(traces.load(path), {b.name for b in benches})
    finally:
        os.unlink(path)
    return dict(zip(df["name"], df["measured_time_s"]))


def _grid_fit(flops, bytes_, kernels, meas, peak, bandwidth, shape=None, fit_compute=True, weights=None,
              bandwidth_fraction=None):
    """Best (compute fraction, bandwidth fraction, overhead s, k_half) by the weighted mean squared log
    error (``weights``: per point, default equal; ``bandwidth_fraction``: fixed, not searched).

    ``shape``: callable k_half -> per-bench shape efficiency (GEMMs), or None (1). The overhead per
    kernel is searched from 0 to the median measured time per kernel.
    """
    fracs = np.geomspace(0.01, 1.0, 48)
    cf = fracs if fit_compute else np.array([1.0])
    if bandwidth_fraction is not None:
        fracs = np.array([bandwidth_fraction])
    per_kernel = meas / np.maximum(kernels, 1)
    over = np.unique(np.concatenate([np.linspace(0.0, float(np.min(per_kernel)), 16),
                                     np.linspace(float(np.min(per_kernel)), float(np.median(per_kernel)), 12)]))
    w = np.ones_like(meas) if weights is None else np.asarray(weights, dtype=float)
    k_halves = (0.0, 16.0, 64.0, 256.0, 1024.0) if shape is not None else (0.0,)
    best = (np.inf, None)
    lm = np.log(meas)
    for kh in k_halves:
        se = shape(kh) if shape is not None else np.ones_like(meas)
        # Axes [compute fraction, bandwidth fraction, overhead, bench].
        pred = kernel_time(flops, bytes_, kernels, peak * se * cf[:, None, None, None],
                           bandwidth * fracs[None, :, None, None], over[None, None, :, None])
        loss = np.sum(w * (np.log(np.maximum(pred, 1e-12)) - lm) ** 2, axis=-1) / np.sum(w)
        i = np.unravel_index(np.argmin(loss), loss.shape)
        if loss[i] < best[0]:
            best = (loss[i], (float(cf[i[0]]), float(fracs[i[1]]), float(over[i[2]]), kh))
    return best[1]


#: The reference decoder at calibration sizes of its own (widths apart from every shipped model, the
#: CPU validation models included): in-context timings of every operator kind, as validate sees them.
CAL_MODELS = [
    dict(name="cal-gqa-320", d_model=320, n_layers=2, vocab_size=3000, attention=dict(n_heads=5, n_kv_heads=1),
         ffn=dict(activation="swiglu", d_ff=896)),
    dict(name="cal-gqa-640", d_model=640, n_layers=2, vocab_size=6000, attention=dict(n_heads=10, n_kv_heads=2),
         ffn=dict(activation="swiglu", d_ff=1792)),
    dict(name="cal-moe-320", d_model=320, n_layers=2, vocab_size=3000, attention=dict(n_heads=5, n_kv_heads=1),
         ffn=dict(activation="swiglu", d_ff=896), moe=dict(n_experts=4, top_k=2, d_ff_expert=448)),
    dict(name="cal-mla-320", d_model=320, n_layers=2, vocab_size=3000,
         attention=dict(n_heads=5, n_kv_heads=5, mla=dict(kv_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=16,
                                                           v_head_dim=32)),
         ffn=dict(activation="swiglu", d_ff=896)),
]


def _scaled(spec: dict, k: int) -> dict:
    """A calibration model with its widths (and heads, keeping head widths) times k."""
    out = {**spec, "d_model": spec["d_model"] * k, "vocab_size": spec["vocab_size"] * k,
           "ffn": {**spec["ffn"], "d_ff": spec["ffn"]["d_ff"] * k}}
    a = dict(spec["attention"])
    a["n_heads"], a["n_kv_heads"] = a["n_heads"] * k, a["n_kv_heads"] * k
    if "mla" in a:
        a["mla"] = {**a["mla"], "kv_lora_rank": a["mla"]["kv_lora_rank"] * k}
    out["attention"] = a
    if "moe" in spec:
        out["moe"] = {**spec["moe"], "d_ff_expert": spec["moe"]["d_ff_expert"] * k}
    return out


def model_points(device: str, dtype: str, quick: bool = False, state: dict | None = None) -> tuple[list, str, list[float]]:
    """(op, seconds per execution) of every operator of the calibration models, prefill and decode,
    profiled as ``validate`` profiles (:func:`lmcost.profiling.profile.profile`); a description; and per
    run and phase, the dispatch per kernel: (median wall time of the step - the sum of its operator
    scopes) / kernels of the step, in seconds."""
    from lmcost.model.config import ArchConfig
    from lmcost.operators.workload import Settings
    from lmcost.profiling.profile import profile

    cuda = device.startswith("cuda")
    specs = [_scaled(s, 4 if cuda else 1) for s in (CAL_MODELS[:1] if quick else CAL_MODELS)]
    batches, prompt = ((1, 8) if cuda else (1, 3)), (512 if cuda else 96)
    points, dispatch = [], []
    for spec in specs:
        cfg = ArchConfig.model_validate(spec)
        for b in batches[:1] if quick else batches:
            run, measured, path = profile(cfg, device=device, dtype=dtype, layers=None, batch=b, prompt=prompt,
                                          steps=2 if quick else 4, repeats=3, settings=Settings(kernel="flash", mla="absorbed"),
                                          threads=torch.get_num_threads(),  # the calibration's own count
                                          baseline=state, settle_s=2.0 if quick else 10.0)
            os.unlink(path)
            ops = measured.ops
            t = {(r.phase, r.name): r.measured_time_s for r in ops.itertuples()}
            for phase in ("prefill", "decode"):
                for op in run.ops(phase):
                    m = t.get((phase, op.name), 0.0)
                    if m > 0 and not (isinstance(op.kernels, int) and op.kernels == 0):
                        points.append((op, m / float(op.count)))
                scopes = float(ops[ops.phase == phase].measured_time_s.sum())
                dispatch.append((measured.steps.wall_s(phase) - scopes) / run.kernels(phase))
    text = (f"the reference decoder at {len(specs)} calibration model{'s' if len(specs) != 1 else ''} ({', '.join(s['name'] for s in specs)}; "
            f"batch {', '.join(map(str, batches[:1] if quick else batches))}, prompt {prompt}): {len(points)} operator timings")
    return points, text, dispatch


def fit_efficiency(device: str, dtype: str, peak_flops: float, vector_flops: float, bandwidth: float,
                   quick: bool = False, wait=lambda: None, state: dict | None = None) -> dict:
    """Run the microbenchmarks and the calibration models, and fit the ``efficiency`` block (a mapping
    for the hardware YAML).

    ``peak_flops``/``vector_flops`` (FLOP/s) and ``bandwidth`` (B/s) are the roofs the fractions are of.
    ``wait``: called before each round of microbenchmarks (waits for the machine state the calibration
    measures in); ``state``: that state's reference kernels, which each calibration model's run waits
    for (:func:`lmcost.profiling.control.settle`).
    """
    from lmcost.cost.efficiency import kernel_class

    benches = _benches(device, dtype, quick)
    # Each bench's median in each of a few separate rounds, then the fastest round: a shared machine
    # has slow spells of seconds, and one falling on the fit would skew every figure of a kind.
    rounds = []
    for _ in range(2 if quick else 3):
        wait()
        rounds.append(measure(benches, device, 3 if quick else 5))
    times = {b.name: min(r.get(b.name, float("inf")) for r in rounds) for b in benches}
    points = [(b.op, times[b.name]) for b in benches if 0 < times[b.name] < float("inf")]
    in_model, model_text, dispatch = model_points(device, dtype, quick, state)
    in_context = {id(op) for op, _ in in_model}
    points += in_model
    cuda = device.startswith("cuda")
    sm = torch.cuda.get_device_properties(device).multi_processor_count if cuda else 1
    tile = CUDA_TILE if cuda else 1
    frac, over, errors, fit_set = {}, {}, {}, {}
    gemm = attention_pf = None
    # Fit each class (the fallback for kinds it has no figure of), then each kind with points of its own.
    classes = ("gemm", "attention", "norm", "elementwise", "softmax", "embedding", "moe_routing")
    groups = [(c, [p for p in points if kernel_class(p[0]) == c]) for c in classes]
    kinds = sorted({op.kind for op, _ in points} - {"", "gemm", "sdpa"})
    groups += [(k, [p for p in points if p[0].kind == k and p[0].mnk is None]) for k in kinds]
    for key, ps in groups:
        if not ps:
            continue
        flops = np.array([float(op.flops) for op, _ in ps])
        bytes_ = np.array([float(op.bytes) for op, _ in ps])
        kernels = np.array([float(op.kernels) for op, _ in ps])
        meas = np.array([t for _, t in ps])
        shape = None
        if key == "gemm":
            mnk = np.array([[float(v) for v in op.mnk] for op, _ in ps]).T
            shape = lambda kh: np.asarray(gemm_shape_efficiency(
                GemmEfficiency(peak_fraction=1.0, tile_m=tile, tile_n=tile, sm_count=sm, k_half=kh), *mnk))
        matmul = key in ("gemm", "attention")
        peak = peak_flops if matmul else vector_flops
        # The microbenchmarks and the calibration models weigh the same in each fit: an operator inside a
        # model runs with caches its neighbours evicted (a 1-token RMSNorm took 2x its loop time on this
        # CPU), which a loop of one op never shows, while the loops cover the shapes.
        model = np.array([id(op) in in_context for op, _ in ps])
        weights = np.where(model, 1.0 / max(1, model.sum()), 1.0 / max(1, (~model).sum())) if model.any() and (~model).any() else None
        fixed = None
        stream = bytes_ >= STREAM_BYTES
        if key == "gemm" and stream.any():
            # A weight stream is what a GEMM's bandwidth means: the best rate of the streaming GEMVs
            # (bytes / time) over the roof, which the same kind of stream set; not traded against the
            # cache-resident shapes, whose time is overhead and compute. One fraction cannot hold every
            # size: on this VM a 32 MiB stream, inside the 300 MiB shared L3, ran at the roof and a
            # 64 MiB one at about 0.6 of it; the best is what a decode step's weights, once cached, get.
            fixed = min(1.0, float(np.max(bytes_[stream] / meas[stream])) / bandwidth)
        cf, bf, o, kh = _grid_fit(flops, bytes_, kernels, meas, peak, bandwidth, shape, fit_compute=matmul, weights=weights,
                                  bandwidth_fraction=fixed)
        se = shape(kh) if shape is not None else 1.0
        pred = kernel_time(flops, bytes_, kernels, peak * cf * se, bandwidth * bf, o)
        errors[key] = round(float(np.median(np.abs(pred / meas - 1))) * 100, 1)
        frac[key], over[key] = round(bf, 4), round(o * 1e6, 3)
        fit_set[key] = len(ps)
        if key == "gemm":
            gemm = dict(peak_fraction=round(cf, 4), tile_m=tile, tile_n=tile, sm_count=sm, k_half=kh)
        elif key == "attention":
            attention_pf = round(cf, 4)
    driver = None
    if cuda:
        try:
            v = torch._C._cuda_getDriverVersion()
            driver = f"CUDA driver API {v // 1000}.{v % 1000 // 10}"
        except Exception:  # noqa: BLE001 - the driver version is a courtesy, not a measurement
            driver = None
    from lmcost.profiling.device import device_name

    return dict(
        gemm=gemm, attention_peak_fraction=attention_pf or 1.0, vector_fraction=1.0,
        bandwidth_fraction=frac, kernel_overhead_us=over,
        dispatch_us=round(float(np.median(dispatch)) * 1e6, 3),
        conditions=dict(device=device, device_name=device_name(device), driver=driver, torch=str(torch.__version__),
                        cuda=torch.version.cuda, threads=torch.get_num_threads(), dtype=dtype,
                        date=time.strftime("%Y-%m-%d"),
                        fitting_set=f"lmcost calibrate microbenchmarks ({len(benches)} single ops) and {model_text}; "
                                    "points per class: " + ", ".join(f"{k} {fit_set[k]}" for k in classes if k in fit_set),
                        fit_median_abs_error_pct=errors,
                        dispatch_us_per_run_phase=[round(d * 1e6, 3) for d in dispatch]),
        sources={"*": "fitted by lmcost calibrate on this device (see conditions)"})
