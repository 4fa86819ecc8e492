"""Compiling a phase into operator records: the graph of a phase traced once, evaluated at any workload.

A phase (prefill, one decode step, a training step) of one config, precision and settings is an
operator graph whose shape never changes with the workload: only batch ``b`` and tokens ``n`` (the prompt
in prefill, the context in decode, the sequence in training) do. :class:`PhaseGraph` builds that graph
once with traced workload dims (:mod:`lmcost.basics.tracing`) and compiles it into one function; evaluating a
workload is then one call, giving every operator's FLOPs and bytes in named columns (:class:`Records`,
:class:`Columns`): exact Python ints for int workloads, numpy arrays for grids. Timing and totalling the
records is :mod:`lmcost.cost.phases`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.results import Result
from lmcost.basics.tracing import Traced, Tracer, affine_in, compile_outputs, depends_on
from lmcost.cost.timing import OpStatics, op_statics
from lmcost.operators.assembly import build_ops, phase_dims
from lmcost.operators.forward import total
from lmcost.operators.ops import OpCost
from lmcost.operators.workload import Settings
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig

#: The fields of an operator record that may depend on the workload, in the order records keep them.
FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
          "params", "active_params", "count", "kernels", "comm_bytes")


@dataclass(frozen=True, kw_only=True, slots=True)
class Columns(Result):
    """Every operator's values at one workload, one tuple over ops per field: op i's FLOPs are
    ``flops[i]``. Per execution of one layer (``count`` says how many layers run it). Values are ints
    (or floats: fractional bytes) for an int workload, arrays for a grid."""

    #: :data:`FIELDS`, as :class:`lmcost.operators.ops.OpCost` defines them (FLOPs, bytes, parameters, counts).
    flops: tuple
    weight_bytes: tuple
    act_read_bytes: tuple
    act_write_bytes: tuple
    kv_read_bytes: tuple
    kv_write_bytes: tuple
    params: tuple
    active_params: tuple
    count: tuple
    kernels: tuple
    comm_bytes: tuple
    #: The GEMM shape (m, n, k), or a flash kernel's attention shape; 1 for an op with none (``mnk`` None).
    m: tuple
    n: tuple
    k: tuple
    #: All bytes each op moves (the sum of its five byte fields).
    bytes: tuple

    @classmethod
    def of(cls, values) -> "Columns":
        """Columns from their values in field order (:data:`FIELDS`, m, n, k, bytes)."""
        return cls(**dict(zip(_COLUMNS, values)))

    def __iter__(self):
        return (getattr(self, name) for name in _COLUMNS)


_COLUMNS = tuple(f.name for f in fields(Columns))
assert _COLUMNS[:len(FIELDS)] == FIELDS


def _columns_of(ops) -> list:
    """The column values of OpCost records, or of their traced templates, in field order."""
    out = [[getattr(op, f) for op in ops] for f in FIELDS]
    out += [[1 if op.mnk is None else op.mnk[i] for op in ops] for i in range(3)]
    out.append([op.bytes for op in ops])
    return out


class _OpsView:
    """What a set of operators needs to be costed on a GPU: its templates, names and classes, and the
    per-op time-model constants of each (GPU, precision) it meets, made once (:meth:`_make_statics`)
    and kept, by identity, for the last 16 pairs."""

    def statics(self, gpu: GPU, precision: Precision) -> OpStatics:
        """Per-op time-model constants on ``gpu`` (:func:`lmcost.cost.timing.op_statics`), cached."""
        cache = self.__dict__.setdefault("_statics", OrderedDict())
        key = (id(gpu), id(precision))
        hit = cache.get(key)
        if hit is None or hit[0] is not gpu or hit[1] is not precision:
            hit = cache[key] = (gpu, precision, self._make_statics(gpu, precision))
            if len(cache) > 16:
                cache.popitem(last=False)
        return hit[2]

    def _make_statics(self, gpu: GPU, precision: Precision) -> OpStatics:
        return op_statics(self.templates, gpu, precision, layout=getattr(self, "layout", None))


class PhaseGraph(_OpsView):
    """The operators of one phase of one config, precision and settings, traced once and compiled.

    ``templates``: the OpCost records with traced workload fields (names, classes, kinds, shapes and
    every other static field are final). :meth:`at` evaluates a workload.
    """

    def __init__(self, cfg: ArchConfig, precision: Precision, phase: str, settings: Settings):
        tracer = Tracer()
        self.phase, self.layout = phase, settings.layout
        self.templates = build_ops(cfg, phase_dims(cfg, precision, phase, tracer.var("b"), tracer.var("n")),
                                   phase, settings)
        t = self.templates
        outputs = _columns_of(t)
        self._fn = compile_outputs(tracer, ("b", "n"), outputs, f"{cfg.name} {phase}")
        self._tracer, self._label = tracer, f"{cfg.name} {phase}"
        self._grid_fn = None
        self.names = tuple(op.name for op in t)
        self.classes = tuple(op.op_class.value for op in t)
        #: Indices of the ops whose cost changes with the tokens (in decode: attention over the context).
        self.with_tokens = tuple(i for i, op in enumerate(t) if any(
            depends_on(v, "n") for v in [getattr(op, f) for f in FIELDS] + list(op.mnk or ())))
        self.fixed = tuple(i for i in range(len(t)) if i not in set(self.with_tokens))
        #: Of those, the ones whose FLOPs and bytes are affine in the tokens (decode attention over a global
        #: context): their roofline time summed over consecutive steps has a closed form.
        self.affine = tuple(i for i in self.with_tokens
                            if affine_in(t[i].flops, "n") and affine_in(t[i].bytes, "n"))
        # The same function restricted to the ops that change with the tokens (for sweeps over them).
        self._fn_tokens = compile_outputs(tracer, ("b", "n"), [[row[i] for i in self.with_tokens] for row in outputs],
                                          f"{cfg.name} {phase}, ops that change with the tokens")
        self._subsets: dict = {}

    def subset(self, idx: tuple) -> "_Subset":
        """A view of the ops at indices ``idx`` (its statics sliced from this graph's)."""
        if idx not in self._subsets:
            self._subsets[idx] = _Subset(self, idx)
        return self._subsets[idx]

    def at(self, b, tokens) -> "Records":
        """Every operator's fields at batch ``b`` and ``tokens`` (ints: exact; arrays: broadcast)."""
        shape = None if np.ndim(b) == 0 and np.ndim(tokens) == 0 else np.broadcast_shapes(np.shape(b), np.shape(tokens))
        return Records(self, Columns.of(self._fn(b, tokens)), shape)

    def at_tokens_only(self, b, tokens) -> "Records":
        """:meth:`at` for the ops in ``with_tokens`` only (the others do not change with the tokens)."""
        shape = None if np.ndim(b) == 0 and np.ndim(tokens) == 0 else np.broadcast_shapes(np.shape(b), np.shape(tokens))
        return Records(self.subset(self.with_tokens), Columns.of(self._fn_tokens(b, tokens)), shape)

    def grid_forms(self):
        """The compiled pieces a roofline grid is timed from (:func:`lmcost.cost.phases.roofline_grid`),
        built once: ``(fn, forms, names)``.

        Every traced value is some base times an int plus an int (:mod:`lmcost.basics.tracing` folds it so),
        so ``fn(b, n)`` returns only the distinct bases the ops' FLOPs and bytes are made of, and the exact
        totals named in ``names`` (flops, bytes, flops_matmul: summed while tracing, a handful of terms).
        ``forms``: per op, its FLOPs, bytes and communication payload each as ([(base index, coefficient)],
        constant).
        """
        if self._grid_fn is None:
            t = self.templates
            tot = {"flops": total(t, "flops"), "bytes": total(t, "bytes"),
                   "flops_matmul": total([op for op in t if op.matmul], "flops")}
            forms, atoms = [], {}
            for op in t:
                pair = []
                for v in (op.flops, op.bytes, op.comm_bytes):
                    if isinstance(v, Traced):
                        pair.append(([(atoms.setdefault(a.name, (len(atoms), a))[0], c) for a, c in v.terms], v.const))
                    else:
                        pair.append(([], v))
                forms.append(pair)
            fn = compile_outputs(self._tracer, ("b", "n"), [[a for _, a in atoms.values()], list(tot.values())],
                                 f"{self._label} grid")
            self._grid_fn = (fn, forms, list(tot))
        return self._grid_fn


#: Compiled graphs kept: (config identity, precision, phase, settings) -> (config, graph). The config is
#: held so its id is not reused while the entry lives.
_GRAPHS: OrderedDict = OrderedDict()
_GRAPHS_KEPT = 64


#: The same, keyed by the identity of the precision and settings objects too (no hashing of their
#: fields on the hot path); entries hold the objects so their ids stay theirs.
_BY_ID: dict = {}


def phase_graph(cfg: ArchConfig, precision: Precision, phase: str, settings: Settings = Settings()) -> PhaseGraph:
    """The compiled graph of a phase, built once per (config, precision, phase, settings) and reused."""
    fast = (id(cfg), id(precision), phase, id(settings))
    hit = _BY_ID.get(fast)
    if hit is not None and hit[0] is cfg and hit[1] is precision and hit[2] is settings:
        return hit[3]
    key = (id(cfg), precision, phase, settings)
    found = _GRAPHS.get(key)
    if found is not None and found[0] is cfg:
        _GRAPHS.move_to_end(key)
        graph = found[1]
    else:
        graph = PhaseGraph(cfg, precision, phase, settings)
        _GRAPHS[key] = (cfg, graph)
        if len(_GRAPHS) > _GRAPHS_KEPT:
            _GRAPHS.popitem(last=False)
    if len(_BY_ID) > 4 * _GRAPHS_KEPT:
        _BY_ID.clear()
    _BY_ID[fast] = (cfg, precision, settings, graph)
    return graph


@dataclass(frozen=True)
class Records:
    """The operators of a phase at one workload, in columns: ``cols.flops[i]`` is op i's FLOPs
    (:class:`Columns`). Per execution of one layer; ``cols.count`` says how many layers run it.
    ``graph``: the compiled graph (or view of one) whose templates, names and classes the columns follow."""

    graph: Any
    cols: Columns
    shape: Any = None  # the workload's broadcast shape; None for a scalar workload

    def then(self, other: "Records") -> "Records":
        """These records followed by ``other``'s (scalar workloads), to cost both in one pass."""
        joined = self.graph.__dict__.setdefault("_joined", {})
        hit = joined.get(id(other.graph))
        if hit is None or hit[0] is not other.graph:
            hit = joined[id(other.graph)] = (other.graph, _Joined(self.graph, other.graph))
        return Records(hit[1], Columns.of(a + b for a, b in zip(self.cols, other.cols)), None)

    def col(self, field: str) -> tuple:
        """One column over ops, by name (a field of :class:`Columns`)."""
        return getattr(self.cols, field)

    @property
    def n_ops(self) -> int:
        return len(self.cols.flops)

    def ops(self) -> list[OpCost]:
        """The records as OpCost objects (the graph's templates with these values)."""
        out = []
        c = self.cols
        columns = [getattr(c, f) for f in FIELDS]
        for i, op in enumerate(self.graph.templates):
            vals = {f: col[i] for f, col in zip(FIELDS, columns)}
            out.append(replace(op, **vals, mnk=None if op.mnk is None else (c.m[i], c.n[i], c.k[i])))
        return out

    @classmethod
    def of_ops(cls, ops: list[OpCost]) -> "Records":
        """Records of a list of OpCost (``lmcost op``'s operators, a hand-built list)."""
        graph = _OpList(ops)
        cols = Columns.of(tuple(col) for col in _columns_of(ops))
        shapes = [np.shape(v) for col in cols for v in col if isinstance(v, np.ndarray)]
        return cls(graph, cols, np.broadcast_shapes(*shapes) if shapes else None)


class _Subset(_OpsView):
    """Some ops of a graph: templates, names and classes at ``idx``; statics sliced from the graph's."""

    def __init__(self, graph: PhaseGraph, idx: tuple):
        self.graph, self.idx, self.phase = graph, np.array(idx, dtype=int), graph.phase
        self.templates = [graph.templates[i] for i in idx]
        self.names = tuple(graph.names[i] for i in idx)
        self.classes = tuple(graph.classes[i] for i in idx)
        self.counts = np.array([op.count for op in self.templates], dtype=float)

    def _make_statics(self, gpu, precision):
        return self.graph.statics(gpu, precision).map(lambda v: v[self.idx])


class _Joined(_OpsView):
    """The ops of two graphs one after the other (two phases costed in one vectorised pass)."""

    def __init__(self, first, second):
        self.parts, self.phase = (first, second), ""
        self.templates = list(first.templates) + list(second.templates)
        self.names, self.classes = first.names + second.names, first.classes + second.classes

    def _make_statics(self, gpu, precision):
        a, b = (p.statics(gpu, precision) for p in self.parts)
        return a.then(b)


class _OpList(_OpsView):
    """A fixed list of ops standing in for a compiled graph (no workload to evaluate)."""

    def __init__(self, ops):
        self.templates, self.phase = ops, ""
        self.names = tuple(op.name for op in ops)
        self.classes = tuple(op.op_class.value for op in ops)


def phase_records(cfg: ArchConfig, precision: Precision, phase: str, b, tokens,
                  settings: Settings = Settings()) -> Records:
    """The operators of one phase at batch ``b`` and ``tokens`` (the prompt in prefill, the context in
    decode, the sequence in training), in columns."""
    return phase_graph(cfg, precision, phase, settings).at(b, tokens)


def phase_ops(cfg: ArchConfig, precision: Precision, phase: str, b, tokens, settings: Settings = Settings()) -> list[OpCost]:
    """The operators of one phase as OpCost records; ``tokens`` is the prompt (prefill), the context
    (decode) or the sequence length (train: forward and backward, :mod:`lmcost.operators.training`)."""
    return phase_records(cfg, precision, phase, b, tokens, settings).ops()
