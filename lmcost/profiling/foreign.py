"""Someone else's trace against the prediction: ``validate --trace`` on a ``torch.profiler`` Chrome trace
that lmcost did not write (a Hugging Face model, another runtime).

Such a trace has no operator scopes, so its time is credited to predicted operator classes from what
the trace itself says, in this order of trust:

1. **Modules** (``with_stack=True`` writes a ``python_function`` event ``nn.Module: <Class>_<k>`` around
   every module call; torch 2.13's ``with_modules=True`` alone writes none on the CPU). Each op goes to
   the class of the innermost module with a known role: everything inside a ``*RMSNorm``/``LayerNorm``
   is norm (its pow, mean, rsqrt and muls too); a ``Linear`` is gemm, or lm_head outside every layer, or
   moe_routing inside a router; inside an attention module the score/value matmuls and the fused kernel
   are attention and the rest (RoPE's muls and cats, the KV-cache cat, layout copies) elementwise; a
   rotary-embedding module and activations are elementwise; an ``Embedding`` is embedding. A few Python
   scopes say what the module does not: Hugging Face's causal-mask builders (``masking_utils``) feed
   attention, ``apply_rotary_pos_emb`` is RoPE, ``slice_logits_to_keep`` is the lm_head's.
2. **Patterns**, without module events: each op by its name (:func:`lmcost.profiling.trace.classify`),
   except runs of top-level ops (or of kernels on one stream) that :func:`patterns` recognises: an
   ``rsqrt`` with a pow and a mean before it and muls after it (eager RMSNorm) is norm, and
   mul-neg-cat-mul-add (Hugging Face's RoPE) elementwise.

Ops with no enclosing module role and a name that predicts nothing (``arange``, ``copy``, ``alias``)
are reported as **unpredicted** time, in a row of their own. On a GPU trace the same is done for
kernels: a kernel goes to the class of the op that launched it (its correlation id), else by name.

The work is read from the recorded shapes (``record_shapes=True``): the token ids of the embedding
lookup over the model's vocabulary give the batch and the tokens of each forward (the prompt, then
one per decode step), and the distinct decoder-layer modules give the layers. A trace that holds other
work than ``--batch``/``--prompt``/``--layers`` state is refused; without shapes a note says so.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import pandas as pd

from lmcost.basics.errors import LmcostError
from lmcost.profiling import trace as traces

#: Module roles by the module's class name (``nn.Module: LlamaRMSNorm_0`` -> ``llamarmsnorm``), checked
#: in order: a rotary *embedding* before embedding, a vocabulary-parallel lm_head (vLLM's
#: ``ParallelLMHead``, an embedding subclass) before embedding, attention and MLP before MoE
#: (``Qwen2MoeAttention``, ``Qwen2MoeMLP``), a decoder layer before MoE (``Qwen2MoeDecoderLayer``), MoE
#: before a plain block (``MixtralSparseMoeBlock``). ``rope`` only as a word end (not ``property``).
MODULE_ROLES = [
    ("norm", r"norm"),
    ("rotary", r"rotary|rope(emb|$)"),
    ("lm_head", r"lmhead$"),
    ("embedding", r"embed"),
    ("activation", r"activation|andmul$|^(silu|gelu\w*|relu|tanh|sigmoid|mish)$"),
    ("linear", r"linear|^conv1d$"),
    ("router", r"router|topk"),
    ("attention", r"attention|attn"),
    ("mlp", r"mlp|ffn|feedforward"),
    ("experts", r"experts?$"),
    ("layer", r"layer$"),
    ("moe", r"moe|sparse"),
    ("layer", r"block$"),
]
#: Roles of Python functions (``with_stack`` scopes), by the function's name.
PYTHON_ROLES = [("mask", r"mask"), ("rotary", r"rotary|(^|_)rope(_|$)|rotate_half"), ("lm_head", r"logits")]
MODULE = "nn.Module: "
UNPREDICTED = "unpredicted"
#: Device-side events that take GPU time.
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
#: What each method is called in the notes.
METHODS = {"modules": "by the module that issued each op (nn.Module events of with_stack=True)",
           "patterns": "by op name, with RMSNorm found by its pow/mean/rsqrt/mul pattern (no nn.Module events: "
                       "profile with with_stack=True to attribute by module)"}


def module_role(name: str) -> str | None:
    """The role of a scope event's name: ``nn.Module: LlamaRMSNorm_0`` -> norm; a Python function
    ``transformers/masking_utils.py(892): create_causal_mask`` -> mask; None for anything else."""
    if name.startswith(MODULE):
        cls = re.sub(r"_\d+$", "", name[len(MODULE):]).lower()
        return next((role for role, pat in MODULE_ROLES if re.search(pat, cls)), None)
    if name.startswith("<built-in"):
        return None
    func = name.rsplit("): ", 1)[-1].lower()
    return next((role for role, pat in PYTHON_ROLES if re.search(pat, func)), None)


def _by_name(name_cls: str | None, classes: set[str]) -> str:
    """A name class as a predicted class: softmax is attention's where the prediction has no softmax
    (a flash kernel holds it); a class with no prediction (copy, communication, none) is unpredicted."""
    if name_cls == "softmax" and "softmax" not in classes:
        return "attention"
    return name_cls if name_cls in classes else UNPREDICTED


def _resolve(roles: list[str], name_cls: str | None, classes: set[str]) -> str:
    """The predicted class of an op from its enclosing roles (innermost first) and its name class.
    Communication stays itself (unpredicted unless predicted) whatever module issued it: a
    tensor-parallel all-reduce inside a Linear is no GEMM time."""
    if name_cls == "communication":
        return _by_name(name_cls, classes)
    for i, role in enumerate(roles):
        outer = roles[i + 1:]
        if role == "norm":
            return "norm"
        if role in ("rotary", "activation"):
            return "elementwise"
        if role == "embedding":
            return "embedding"
        if role == "lm_head":
            return "lm_head"
        if role == "mask":
            return "attention"
        if role == "router" or (role == "linear" and outer[:1] == ["moe"]):
            return "moe_routing"
        if role == "linear":
            inside = any(r in ("attention", "mlp", "experts", "layer", "moe") for r in outer)
            return "gemm" if inside else "lm_head"
        if role == "attention":
            if name_cls in ("attention", "softmax"):
                return _by_name(name_cls, classes)
            return "attention" if name_cls == "gemm" else "elementwise"
        if role == "moe":  # the block's own ops: top-k and softmax route; a fused expert matmul is gemm
            return {"gemm": "gemm", "softmax": "moe_routing", None: "moe_routing"}.get(name_cls, "elementwise")
        if role in ("mlp", "experts", "layer"):
            return "gemm" if name_cls == "gemm" else "elementwise"
    return _by_name(name_cls, classes)


#: Tokens of the patterns: what an aten op does, by its exact name (less a trailing ``_``)...
ATEN_TOKENS = {"rsqrt": "rsqrt", "pow": "pow", "mean": "mean", "sum": "mean", "mul": "mul", "add": "add", "neg": "neg",
               "cat": "cat", "slice": "slice", "narrow": "slice", "to": "cast", "_to_copy": "cast", "copy": "cast",
               "type_as": "cast"}
#: ... and what a kernel does, by the first word of these found in its name.
KERNEL_TOKENS = [("rsqrt", r"rsqrt"), ("pow", r"pow"), ("mean", r"mean|sum|reduce"), ("mul", r"mul"), ("add", r"add"),
                 ("neg", r"neg"), ("cat", r"(^|_)cat(_|$)"), ("slice", r"slice|narrow"), ("cast", r"copy")]


def _token(name: str) -> str | None:
    """What an op or kernel does, for :func:`patterns`; None for anything else."""
    low = name.lower()
    if low.startswith("aten::"):
        return ATEN_TOKENS.get(low[len("aten::"):].rstrip("_"))
    return next((tok for tok, pat in KERNEL_TOKENS if re.search(pat, low)), None)


def patterns(names: list[str]) -> dict[int, str]:
    """Classes of a sequence of top-level ops (or of kernels on one stream) found by pattern, by index:

    - norm: an eager RMSNorm, [cast] pow mean [add] rsqrt, then up to two muls with casts between;
    - elementwise: Hugging Face's RoPE, x * cos + rotate_half(x) * sin = mul [slice slice] neg cat mul add
      (the cat would otherwise be an unpredicted copy).
    """
    toks = [_token(n) for n in names]
    out: dict[int, str] = {}
    for i, t in enumerate(toks):
        if t == "rsqrt":
            j = i - 1
            if j >= 0 and toks[j] == "add":
                j -= 1
            if j < 1 or toks[j] != "mean" or toks[j - 1] != "pow":
                continue
            start = j - 2 if j >= 2 and toks[j - 2] == "cast" else j - 1
            k, muls = i + 1, 0
            while k < len(toks) and muls < 2 and toks[k] in ("mul", "cast"):
                muls += toks[k] == "mul"
                k += 1
            if muls:
                out.update({n: "norm" for n in range(start, k)})
        elif t == "neg" and toks[i + 1:i + 4] == ["cat", "mul", "add"]:
            start = i - 1
            while start >= 0 and toks[start] == "slice":
                start -= 1
            if start >= 0 and toks[start] == "mul":
                out.update({n: "elementwise" for n in range(start, i + 4)})
    return out


@dataclass
class Attribution:
    """Where a foreign trace's time went. ``times``: seconds per predicted class, and under
    ``unpredicted`` the rest; ``counts``: ops (a CPU trace) or kernels (a GPU trace) per class, the
    same attribution by identity, which no stall of the profiled machine moves (one preempted op can
    take most of a millisecond-long trace's time); ``unpredicted_ops``: seconds per op or kernel
    name of that rest; ``method``: modules or patterns (:data:`METHODS`)."""

    times: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unpredicted_ops: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    method: str = "patterns"

    def add(self, cls: str, seconds: float, name: str) -> None:
        self.times[cls] += seconds
        self.counts[cls] += 1
        if cls == UNPREDICTED:
            self.unpredicted_ops[name] += seconds


def _args(e: dict) -> dict:
    return e["args"] if isinstance(e.get("args"), dict) else {}


def _id(v):
    """A correlation or External id as a key (None for anything that is not one)."""
    return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None


def has_modules(trace: dict) -> bool:
    """True if the trace has nn.Module scopes (``with_stack=True``)."""
    return any(e.get("cat") == "python_function" and str(e.get("name", "")).startswith(MODULE) for e in trace["traceEvents"])


def attribute(trace: dict, classes: set[str]) -> Attribution:
    """Credit every op's self time (a CPU trace) or every kernel's time (a GPU trace) to one of the
    predicted ``classes`` or to ``unpredicted``, by module where the trace has nn.Module events, else by
    name and pattern (see the module docstring).

    Returns: an :class:`Attribution` (seconds).
    """
    ev = trace["traceEvents"]
    scopes = [e for e in ev if e.get("cat") == "python_function" and module_role(str(e.get("name", "")))]
    modules = has_modules(trace)
    out = Attribution(method="modules" if modules else "patterns")
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    launched: dict = {}  # correlation id or ("ext", External id) -> predicted class of the launching op
    host = [e for e in ev if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    is_op = lambda e: e.get("cat") == "cpu_op"
    for events in traces.by_thread(host + scopes).values():
        nested = traces.nest(events)
        found: dict[int, str] = {}  # top-level op -> class by pattern
        if not modules:
            top = [e for e, up, _ in nested if is_op(e) and not any(is_op(u) for u in up)]
            found = {id(top[i]): c for i, c in patterns([str(e.get("name", "")) for e in top]).items()}
        name_of: dict[int, str | None] = {}
        cls_of: dict[int, str] = {}
        for e, up, self_us in nested:
            ops_up = [u for u in up if is_op(u)]
            parent = ops_up[-1] if ops_up else None
            if not is_op(e):
                corr = _id(_args(e).get("correlation"))
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and parent is not None and corr is not None:
                    launched[corr] = cls_of[id(parent)]
                continue
            name = str(e.get("name", ""))
            name_cls = traces.classify(name) or (name_of[id(parent)] if parent is not None else None)
            name_of[id(e)] = name_cls
            top_op = ops_up[0] if ops_up else e
            if id(top_op) in found:
                cls = found[id(top_op)]
            else:
                roles = [r for u in reversed(up) if not is_op(u) and (r := module_role(str(u.get("name", ""))))]
                cls = _resolve(roles, name_cls, classes)
            cls_of[id(e)] = cls
            ext = _id(_args(e).get("External id"))
            if ext is not None:
                launched.setdefault(("ext", ext), cls)
            if not gpu:
                out.add(cls, self_us * 1e-6, name)
    if gpu:
        by_name = {}
        for stream in traces.by_thread(gpu).values():
            stream.sort(key=lambda e: e["ts"])
            found = patterns([str(e.get("name", "")) for e in stream])
            for i, e in enumerate(stream):
                by_name[id(e)] = found.get(i) or _by_name(traces.classify(str(e.get("name", ""))), classes)
        for e in gpu:  # the launching op's class; its own name where that op predicts nothing
            args = _args(e)
            cls = launched.get(_id(args.get("correlation"))) or launched.get(("ext", _id(args.get("External id"))))
            out.add(by_name[id(e)] if cls in (None, UNPREDICTED) else cls, e.get("dur", 0) * 1e-6, str(e.get("name", "")))
    return out


@dataclass(frozen=True)
class Work:
    """What a trace ran, read from its shapes. ``forwards``: (batch or None where the ids were
    flattened, new tokens) of each forward, in order; ``layers``: decoder layers (None if unknown);
    ``notes``: what could not be read."""

    forwards: tuple[tuple[int | None, int], ...]
    layers: int | None
    shapes: bool
    notes: tuple[str, ...] = ()


def _dims(e: dict):
    dims = _args(e).get("Input Dims")
    return dims if isinstance(dims, list) else None


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def infer_work(trace: dict, vocab: int) -> Work:
    """The forwards and layers a trace holds. Token ids are the second input of each ``aten::embedding``
    over a table of ``vocab`` rows ([b, s], or [n] flattened); layers are the distinct decoder-layer
    modules (``LlamaDecoderLayer_0``, ``_1``...), else the distinct attention modules, else the fused
    attention ops per forward.

    Returns: a :class:`Work`; ``shapes`` False when the trace records no shapes (``record_shapes``).
    """
    ev = trace["traceEvents"]
    ops = sorted((e for e in ev if e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    shapes = any(_dims(e) is not None for e in ops)
    forwards, notes = [], []
    for e in ops:
        d = _dims(e)
        if (e.get("name") != "aten::embedding" or not d or len(d) < 2 or not isinstance(d[0], list) or not d[0]
                or d[0][0] != vocab or not isinstance(d[1], list) or not all(_count(v) for v in d[1])):
            continue
        ids = d[1]
        if len(ids) == 2:
            forwards.append((int(ids[0]), int(ids[1])))
        elif len(ids) == 1:
            forwards.append((None, int(ids[0])))
    if shapes and not forwards:
        notes.append(f"no token-id lookup (aten::embedding over {vocab} rows) found: batch and prompt not checked")
    names = {str(e.get("name")) for e in ev if e.get("cat") == "python_function" and str(e.get("name", "")).startswith(MODULE)}
    layers = None
    for role in ("layer", "attention"):
        found = {n for n in names if module_role(n) == role}
        if found:
            layers = len(found)
            break
    if layers is None and forwards:
        fused = 0
        for events in traces.by_thread(ops).values():
            fused += sum(1 for e, up, _ in traces.nest(events) if not up and traces.classify(str(e.get("name", ""))) == "attention")
        layers = fused // len(forwards) if fused and fused % len(forwards) == 0 else None
    if layers is None:
        notes.append("no decoder-layer modules or fused attention ops found: --layers not checked")
    return Work(tuple(forwards), layers, shapes, tuple(notes))


def check_work(work: Work, run) -> tuple[int, int]:
    """How many prefills (forwards of ``run.prompt`` tokens) and decode steps (forwards of one token)
    the trace holds, checked against ``run``'s batch, prompt and layers.

    Returns: (prefills, decode steps); (1, 1) when the trace records no forwards (nothing to check).
    Raises: LmcostError, one line, when the trace holds another batch, another prompt, a forward of
    neither the prompt nor one token, or another number of layers, or records shapes but no forward
    of the model at all.
    """
    other = "or give the trace of the run these options describe"
    if work.shapes and not work.forwards:
        raise LmcostError("trace", f"it records shapes but no forward of {run.cfg.name} (no token-id lookup, "
                          f"aten::embedding over its {run.cfg.vocab_size} rows)",
                          "give a trace of this model's forward passes")
    if work.layers is not None and work.layers != run.cfg.n_layers:
        raise LmcostError("trace", f"it runs {work.layers} decoder layers, not `layers` {run.cfg.n_layers}",
                          f"give `layers` {work.layers} (0: all of the model's), {other}")
    prefills = decodes = 0
    for i, (b, s) in enumerate(work.forwards):
        ids = f"[{b}, {s}]" if b is not None else f"[{s}] (flattened)"
        if b is not None and b != run.batch:
            raise LmcostError("trace", f"it holds batch {b} (token ids {ids} into the embedding), not `batch` {run.batch}",
                              f"give `batch` {b}, {other}")
        tokens = s if b is not None else s / run.batch
        if i == 0 and tokens != run.prompt:
            raise LmcostError("trace", f"its first forward runs {tokens:g} tokens per sequence (token ids {ids}), "
                              f"not `prompt` {run.prompt}", f"give `prompt` {tokens:g}, {other}")
        if tokens == run.prompt:
            prefills += 1
        elif tokens == 1:
            decodes += 1
        else:
            raise LmcostError("trace", f"its forward {i + 1} runs {tokens:g} tokens per sequence (token ids {ids}): "
                              f"neither the prompt ({run.prompt}) nor one decode token",
                              "give a trace of prefills of the prompt and one-token decode steps")
    if not work.forwards:
        return 1, 1
    return prefills, decodes


@dataclass(frozen=True)
class Comparison:
    """A foreign trace against the prediction. ``table``: one row per predicted class and one
    ``unpredicted`` row, columns op_class, roofline_time_s, calibrated_time_s (NaN for unpredicted),
    measured_time_s, measured_share (of the trace's op time); ``share``: the fraction of the trace's
    op time attributed to predicted classes; ``total_s``: the trace's op time (seconds); ``notes``:
    lines for stderr (method, what was checked, the largest unpredicted ops)."""

    table: pd.DataFrame
    share: float
    total_s: float
    method: str
    notes: tuple[str, ...]


def compare(run, pred: pd.DataFrame, trace: dict) -> Comparison:
    """The classes of a foreign trace against ``run``'s predicted classes: prefill times the prefills
    the trace holds plus a decode step (at context prompt + 1) times its decode steps.

    ``pred``: one row per (phase, operator) with op_class and predicted seconds in columns named
    ``<model>_time_s`` (:func:`lmcost.profiling.validate.predicted`). Attributed by pattern, the
    lm_head and the router cannot be told from other GEMMs, so their predictions count as gemm.
    Raises: LmcostError (one line) for a trace that holds other work than ``run``
    (:func:`check_work`) or where nothing matches a predicted class.
    """
    work = infer_work(trace, run.cfg.vocab_size)
    prefills, decodes = check_work(work, run)
    cols = [c for c in pred.columns if c.endswith("_time_s")]
    pred = pred.copy()
    weight = pred["phase"].map({"prefill": prefills, "decode": decodes})
    pred[cols] = pred[cols].mul(weight, axis=0)
    if not has_modules(trace):
        pred["op_class"] = pred["op_class"].replace({"lm_head": "gemm", "moe_routing": "gemm"})
    pred = pred.groupby("op_class", sort=False)[cols].sum()
    att = attribute(trace, set(pred.index))
    total = sum(att.times.values())
    matched = total - att.times.get(UNPREDICTED, 0.0)
    if matched <= 0:
        raise LmcostError("trace", f"nothing in it matches a predicted operator class ({', '.join(pred.index)})",
                          "give a torch.profiler trace of this model's forward (record_shapes=True, with_stack=True)")
    rows = [dict(op_class=c, **{p: float(pred.loc[c, p]) for p in cols}, measured_time_s=att.times.get(c, 0.0))
            for c in pred.index]
    rows.append(dict(op_class=UNPREDICTED, **{p: float("nan") for p in cols}, measured_time_s=att.times.get(UNPREDICTED, 0.0)))
    table = pd.DataFrame(rows)
    table["measured_share"] = table.measured_time_s / total
    notes = [f"attributed {METHODS[att.method]}"]
    if not work.shapes:
        notes.append("the trace records no shapes (profile with record_shapes=True): its batch, prompt and layers "
                     "could not be checked; predicted: one prefill and one decode step")
    elif not work.forwards:
        notes += [*work.notes, "predicted: one prefill and one decode step"]
    else:
        notes += list(work.notes)
        notes.append(f"the trace holds {prefills} prefill(s) of {run.prompt} tokens and {decodes} decode step(s) at "
                     f"batch {run.batch}" + (f", {work.layers} layers" if work.layers is not None else "")
                     + ": predicted the same")
    top = sorted(att.unpredicted_ops.items(), key=lambda kv: -kv[1])[:3]
    if top:
        notes.append("unpredicted: " + ", ".join(f"{n} {t * 1e6:.3g} µs" for n, t in top))
    return Comparison(table, matched / total, total, att.method, tuple(notes))
