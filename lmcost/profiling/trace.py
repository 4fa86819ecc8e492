"""Read measured time out of Chrome traces (``torch.profiler``'s ``export_chrome_trace``).

Two readings:
- Our own runs (``lmcost profile``): every analytic operator ran inside a ``record_function`` scope
  of the same name, inside a step scope ``lmcost.<phase>.<repeat>``. On CUDA an operator's time is
  the sum of the GPU kernels that ran inside its scope; on CPU, the scope's wall time. Per repeat the
  times of one name are summed (over layers and steps, divided by the steps), then the median over
  repeats is taken.
- Any other trace: kernels (or aten ops) are classified by name (:func:`classify`) into gemm,
  attention, softmax, norm, embedding, elementwise, copy and communication, and summed
  (:func:`kernel_class_times`); :func:`nest` gives what encloses each event on its thread, from which
  ``validate --trace`` credits ops to the module that issued them (:mod:`lmcost.profiling.foreign`).
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from pathlib import Path

import pandas as pd

from lmcost.basics.errors import LmcostError
from lmcost.basics.files import MAX_TRACE_BYTES, read_text, write_text

STEP = re.compile(r"^lmcost\.(prefill|decode)\.(\d+)$")

#: Kernel (GPU) or leaf aten op (CPU) name patterns, checked in order: the first match decides. Order
#: matters: FlashAttention kernels carry ``cutlass`` in their template arguments (attention before
#: gemm); a Triton kernel that fuses an ``rsqrt`` is an RMSNorm or LayerNorm, whatever else it fused
#: (``triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1``: norm before copy); cuBLAS's Hopper
#: kernels are ``nvjet_*`` and ``sm90_xmma_gemm_*``; Triton names a matmul ``_mm_`` (no word boundary).
KERNEL_CLASSES = [
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|c10d"),
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention|mha"),
    ("softmax", r"softmax"),
    ("norm", r"layer_?norm|rms_?norm|group_?norm|batch_?norm|triton_\w*rsqrt"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|\bmm\b|aten::mm|addmm|bmm|matmul|linear|sm\d\d_|wgmma|hgemm|sgemm"
             r"|triton_tem_|(^|_)mm(_|$)|fused_moe"),
    ("embedding", r"embedding|indexselect|index_select"),
    ("copy", r"memcpy|memset|copy|cat(\b|_)|clone|index|gather|scatter"),
    ("elementwise", r"elementwise|vectorized|unrolled|silu|gelu|relu|sigmoid|tanh|exp|add|mul|sub|div|rotary|rope|pow|neg|where"
                    r"|fill|reduce|sum|mean|rsqrt|::cos\b|::sin\b"),
]


def _number(v) -> bool:
    """A finite int or float (JSON's NaN and Infinity are not durations)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def load(path: str | Path) -> dict:
    """A Chrome trace as a dict, read through :func:`lmcost.basics.files.read_text` (a regular file of at
    most MAX_TRACE_BYTES). Raises: LmcostError if missing, not a regular file, too large or not trace JSON."""
    p = Path(path)
    text = read_text(p, MAX_TRACE_BYTES, "Chrome trace JSON file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise LmcostError(str(p), "not JSON", "give a Chrome trace (torch.profiler export_chrome_trace)") from None
    except RecursionError:
        raise LmcostError(str(p), "nested too deeply to be a trace", "give a Chrome trace (torch.profiler export_chrome_trace)") from None
    except ValueError:  # an integer of thousands of digits
        raise LmcostError(str(p), "holds a number no trace has", "give a Chrome trace (torch.profiler export_chrome_trace)") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise LmcostError(str(p), "no traceEvents list", "give a Chrome trace (torch.profiler export_chrome_trace)")
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and _number(e.get("ts"))
                and _number(e.get("dur", 0))]
    if not complete:
        raise LmcostError(str(p), "no timed events (ph 'X' with ts and dur)", "give a trace of a profiled run")
    bad = next((e for e in complete if e.get("dur", 0) < 0), None)
    if bad is not None:
        raise LmcostError(str(p), f"event {str(bad.get('name', '?'))[:60]!r} has a negative duration",
                          "give a trace as torch.profiler exports it")
    meta = data.get("lmcost") if isinstance(data, dict) else None
    if meta is not None and (not isinstance(meta, dict) or not meta):
        raise LmcostError(str(p), "its lmcost record (the run it was taken of) is malformed",
                          "give the trace as lmcost profile wrote it")
    return {"traceEvents": complete, "lmcost": meta}


def add_metadata(path: str | Path, meta: dict) -> None:
    """Record what an lmcost run was (config and workload) inside its trace, under the key ``lmcost``
    (Chrome and Perfetto ignore unknown top-level keys), so ``validate --trace`` re-reads the same run."""
    p = Path(path)
    data = json.loads(read_text(p, MAX_TRACE_BYTES, "Chrome trace JSON file"))
    data["lmcost"] = meta
    write_text(p, json.dumps(data))


def has_scopes(trace: dict) -> bool:
    """True if the trace comes from ``lmcost profile`` (it has lmcost step scopes)."""
    return any(STEP.match(str(e.get("name", ""))) for e in trace["traceEvents"])


def _inside(e, span) -> bool:
    return span["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= span["ts"] + span["dur"] + 1e-3


#: Trace categories of the host calls that launch GPU work (their ``args.correlation`` names the kernel).
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def gpu_annotations(ev: list) -> list:
    """``ev`` with a GPU-side span for each CPU ``user_annotation`` scope whose name has none.

    On CUDA an lmcost scope's time is the kernels inside its ``gpu_user_annotation`` span. torch 2.11 with CUDA
    13 on an H200 (this project's lent machine, 2026-12-04) exported such a span for the innermost scope only:
    a step scope ``lmcost.decode.0`` around an operator scope had none, so no step, and so no operator, was
    measured. A CPU scope of a name without GPU spans then gets one: from the first to the last kernel its
    launches started (a launch inside the scope on the same thread, tied to its kernel by ``args.correlation``),
    which on one stream holds that scope's kernels and no other's. A trace without kernels (a CPU run), or whose
    every scope name has GPU spans, is returned as it is."""
    if not any(e.get("cat") == "kernel" for e in ev):
        return ev
    have = {e.get("name") for e in ev if e.get("cat") == "gpu_user_annotation"}
    if all(e.get("name") in have for e in ev if e.get("cat") == "user_annotation"):
        return ev
    kernels = defaultdict(list)
    for e in ev:
        if e.get("cat") == "kernel" and (e.get("args") or {}).get("correlation") is not None:
            kernels[e["args"]["correlation"]].append(e)
    launches = defaultdict(list)  # (pid, tid) -> sorted [(ts, correlation)]
    for e in ev:
        c = (e.get("args") or {}).get("correlation")
        if e.get("cat") in LAUNCH_CATS and c in kernels:
            launches[(e.get("pid"), e.get("tid"))].append((e["ts"], c))
    for v in launches.values():
        v.sort()
    spans = [e for e in ev if e.get("cat") == "gpu_user_annotation"]
    out = list(ev)
    for e in ev:
        if e.get("cat") != "user_annotation" or e.get("name") in have:
            continue
        lst = launches.get((e.get("pid"), e.get("tid")), [])
        lo = bisect_left(lst, (e["ts"], -math.inf))
        hi = bisect_right(lst, (e["ts"] + e.get("dur", 0), math.inf))
        ks = [k for _, c in lst[lo:hi] for k in kernels[c]]
        if ks:
            start = min(k["ts"] for k in ks)
            end = max(k["ts"] + k.get("dur", 0) for k in ks)
            # an inner scope's own GPU span overlapping these kernels lies inside this scope: cover it whole
            inner = [s for s in spans if s["ts"] < end and s["ts"] + s.get("dur", 0) > start]
            start = min([start, *(s["ts"] for s in inner)])
            end = max([end, *(s["ts"] + s.get("dur", 0) for s in inner)])
            out.append(dict(name=e.get("name"), cat="gpu_user_annotation", ph="X", ts=start, dur=end - start,
                            pid=ks[0].get("pid"), tid=ks[0].get("tid")))
    return out


def _steps(ev: list, gpu: bool) -> list:
    return [e for e in ev if STEP.match(str(e.get("name", ""))) and e.get("cat") in ("user_annotation", "gpu_user_annotation")
            and (e.get("cat") == "gpu_user_annotation") == gpu]


def scope_repeats(trace: dict, names: set[str], steps_per_repeat: dict[str, int] | None = None) -> pd.DataFrame:
    """Per (phase, name, repeat): measured seconds per step of an lmcost trace, summed over the scopes of
    that name in the repeat (layers, and steps divided by ``steps_per_repeat[phase]``, 1 if not given).

    ``names``: the analytic operator names to look for. Columns: phase, name, repeat, time_s.
    """
    ev = gpu_annotations(trace["traceEvents"])
    gpu = any(e.get("cat") == "kernel" for e in ev)
    scopes = [e for e in ev if e.get("name") in names and e.get("cat") == ("gpu_user_annotation" if gpu else "user_annotation")]
    kernels = [e for e in ev if e.get("cat") == "kernel"] if gpu else []
    per = defaultdict(float)  # (phase, name, repeat) -> seconds
    for step in _steps(ev, gpu):
        phase, rep = STEP.match(step["name"]).groups()
        n = (steps_per_repeat or {}).get(phase, 1)
        for sc in scopes:
            if not _inside(sc, step):
                continue
            dur = sum(k["dur"] for k in kernels if _inside(k, sc)) if gpu else sc["dur"]
            per[(phase, sc["name"], int(rep))] += dur * 1e-6 / n
    return pd.DataFrame([dict(phase=p, name=nm, repeat=r, time_s=t) for (p, nm, r), t in per.items()],
                        columns=["phase", "name", "repeat", "time_s"])


def step_times(trace: dict, steps_per_repeat: dict[str, int] | None = None) -> dict[str, dict[int, float]]:
    """Per phase, per repeat: seconds per step of the step scope ``lmcost.<phase>.<repeat>`` itself
    (the profiler's clock; on CUDA the span of the GPU-side annotation)."""
    ev = gpu_annotations(trace["traceEvents"])
    gpu = any(e.get("cat") == "kernel" for e in ev)
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for step in _steps(ev, gpu):
        phase, rep = STEP.match(step["name"]).groups()
        if int(rep) >= 0:
            out[phase][int(rep)] = step["dur"] * 1e-6 / (steps_per_repeat or {}).get(phase, 1)
    return dict(out)


def scope_times(trace: dict, names: set[str], steps_per_repeat: dict[str, int] | None = None) -> pd.DataFrame:
    """Per (phase, name): measured seconds per step, median over repeats, for an lmcost trace
    (:func:`scope_repeats`). Columns: phase, name, measured_time_s, repeats.
    """
    rep = scope_repeats(trace, names, steps_per_repeat)
    df = rep.groupby(["phase", "name"], sort=False, as_index=False).agg(
        measured_time_s=("time_s", "median"), repeats=("time_s", "size"))
    return df[["phase", "name", "measured_time_s", "repeats"]]


def classify(name: str) -> str | None:
    """The class of a kernel or aten op by its name; None if nothing matches."""
    low = name.lower()
    for cls, pattern in KERNEL_CLASSES:
        if re.search(pattern, low):
            return cls
    return None


def nest(events: list[dict], counts=lambda e: e.get("cat") == "cpu_op") -> list[tuple[dict, tuple, float]]:
    """The events of one thread, each with what encloses it and its self time.

    Returns: in start order (on a tie the longer first, and a scope before an op of the same span, so
    what encloses comes first), (event, enclosing events outermost first, self_us): the event's
    duration (µs) less the durations of the events that ``counts`` (by default cpu ops) directly
    inside it: a module or Python scope between two ops holds no time of its own.
    """
    order = sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0), bool(counts(e))))
    out, stack = [], []  # stack frames: [event, children's µs]
    for e in order:
        while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0].get("dur", 0):
            stack.pop()
        if counts(e):
            parent = next((f for f in reversed(stack) if counts(f[0])), None)
            if parent is not None:
                parent[1] += e.get("dur", 0)
        frame = [e, 0.0]
        out.append((e, tuple(f[0] for f in stack), frame))
        stack.append(frame)
    return [(e, up, e.get("dur", 0) - frame[1]) for e, up, frame in out]


def by_thread(events) -> dict[tuple, list[dict]]:
    """Events grouped by (pid, tid): what nests in what is only meaningful on one thread."""
    out = defaultdict(list)
    for e in events:
        out[(repr(e.get("pid")), repr(e.get("tid")))].append(e)
    return out


def kernel_class_times(trace: dict) -> pd.DataFrame:
    """Per kernel class: total seconds of a foreign trace, by name alone.

    With GPU kernels in the trace, each kernel by its name. Otherwise (a CPU trace) each aten op's
    self time (its duration less its children's) goes to the class of its name or, for helpers that
    name nothing (``aten::view``, ``aten::empty``), to the nearest enclosing op that does: so an
    ``aten::mm`` that allocates its output is still all GEMM, and nothing is counted twice.
    Columns: op_class, measured_time_s, kernels. Unclassified time goes to 'other'.
    (``validate --trace`` reads a foreign trace by module instead: :mod:`lmcost.profiling.foreign`.)
    """
    ev = trace["traceEvents"]
    acc = defaultdict(lambda: [0.0, 0])
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    if kernels:
        for e in kernels:
            cls = classify(str(e.get("name", ""))) or "other"
            acc[cls][0] += e.get("dur", 0) * 1e-6
            acc[cls][1] += 1
    else:
        for ops in by_thread(e for e in ev if e.get("cat") == "cpu_op").values():
            cls_of: dict[int, str | None] = {}
            for e, up, self_us in nest(ops):
                cls = classify(str(e.get("name", ""))) or (cls_of[id(up[-1])] if up else None)
                cls_of[id(e)] = cls
                acc[cls or "other"][0] += self_us * 1e-6
                acc[cls or "other"][1] += 1
    return pd.DataFrame([dict(op_class=k, measured_time_s=v[0], kernels=v[1]) for k, v in acc.items()],
                        columns=["op_class", "measured_time_s", "kernels"])
