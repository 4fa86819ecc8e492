"""Tracing a cost formula once, then running it as straight-line Python at any workload.

The operator graph of a model (:mod:`lmcost.operators.forward`) is plain arithmetic over dims. Built with
:class:`Traced` placeholders for the workload dims (batch ``b`` and tokens ``n``), every operation that
touches them is recorded in order, and :func:`compile_outputs` turns the record into one Python
function of (b, n). That function performs exactly the operations the graph builder would have
performed on ints or arrays, in the same order (so results are bit-identical: exact ints for ints,
the same floats for floats), but without rebuilding a single record. Identical sub-expressions are
computed once.

Model dims are ordinary numbers while tracing: arithmetic between them folds as usual. A formula that
branches on a workload dim (``if n > 0``) cannot be traced: comparisons and truth tests of a
:class:`Traced` raise TypeError, so such a formula fails loudly instead of freezing one branch.
"""

from __future__ import annotations

from typing import Any, Callable

#: Binary operators a trace records: Python method suffix -> source operator.
_BINARY = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "pow": "**", "mod": "%"}


def _literal(v) -> str:
    """Python source for a constant: ints and floats exactly (repr round-trips a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        import numpy as np

        if isinstance(v, (np.integer, np.floating)):
            return _literal(v.item())
        raise TypeError(f"cannot trace a constant of type {type(v).__name__}: {v!r}")
    text = repr(v)
    return f"float({text!r})" if text in ("inf", "-inf", "nan") else text


class Tracer:
    """The record of one trace: source lines, and a memo so each distinct expression is computed once."""

    def __init__(self):
        self.lines: list[tuple[str, str, tuple]] = []  # (name, expression, names it reads)
        self._memo: dict[str, "Traced"] = {}
        self.calls: dict[str, Callable] = {}

    def var(self, name: str) -> "Traced":
        """A workload dim: an argument of the compiled function."""
        t = Traced(self, name, frozenset([name]))
        t.op = "var"
        return t

    def ref(self, v) -> str:
        return v.name if isinstance(v, Traced) else _literal(v)

    def emit(self, expr: str, *args, op: str = "") -> "Traced":
        """The value of ``expr`` (Python source over ``args``), computed once; ``op`` says what made it
        (a binary operator, a call's name, or ``lin`` for a linear form) for :func:`affine_in`."""
        if expr in self._memo:
            return self._memo[expr]
        t = Traced(self, f"v{len(self.lines)}", frozenset().union(*(a.deps for a in args if isinstance(a, Traced))))
        self.lines.append((t.name, expr, tuple(a.name for a in args if isinstance(a, Traced))))
        t.op, t.args = op, args
        self._memo[expr] = t
        return t

    def call(self, fn: Callable, *args) -> "Traced":
        """Record ``fn(*args)``: fn runs at evaluation time on the real values (``minimum``, ``half``)."""
        name = f"_{fn.__name__}"
        self.calls[name] = fn
        return self.emit(f"{name}({', '.join(self.ref(a) for a in args)})", *args, op=name)


class Traced:
    """A value that depends on the workload dims: arithmetic on it is recorded, not computed."""

    __slots__ = ("tracer", "name", "deps", "terms", "const", "op", "args")

    def __init__(self, tracer: Tracer, name: str, deps: frozenset = frozenset()):
        self.tracer, self.name, self.deps = tracer, name, deps
        self.op, self.args = "", ()
        # This value is sum(atom * c for atom, c in terms) + const, c and const ints; an atom (a dim,
        # or the result of any other operation) is its own single term.
        self.terms: tuple = ((self, 1),)
        self.const = 0

    def _linear(self, terms: dict, const: int):
        """The value sum(atom * c) + const over ``terms`` {atom name: (atom, c)}, emitted in one line
        straight from its atoms (ints c and const)."""
        terms = {k: v for k, v in terms.items() if v[1] != 0}
        if not terms:
            return const
        items = list(terms.values())
        if len(items) == 1 and items[0][1] == 1 and const == 0:
            return items[0][0]
        expr = " + ".join(a.name if c == 1 else f"{a.name} * {_literal(c)}" for a, c in items)
        if const:
            expr += f" + {_literal(const)}"
        t = self.tracer.emit(expr, *(a for a, _ in items), op="lin")
        t.terms, t.const = tuple(items), const
        return t

    def _bin(self, sym: str, other, reverse: bool) -> "Traced":
        if not isinstance(other, (Traced, int, float)) and not hasattr(other, "item"):
            return NotImplemented
        # Linear folding, exact for every int: sums of int multiples of the same atoms stay one sum over
        # those atoms, so a chain such as 2 * (b*s) * d * d_ff is one multiply and a total over many
        # projections of one input is one expression. Grids (float arrays) evaluate the folded form:
        # identical below 2^53.
        mine = {a.name: (a, c) for a, c in self.terms}
        if type(other) is int and sym in "+-*":
            if sym == "*":
                return self._linear({k: (a, c * other) for k, (a, c) in mine.items()}, self.const * other)
            if sym == "+":
                return self._linear(mine, self.const + other)
            if reverse:
                return self._linear({k: (a, -c) for k, (a, c) in mine.items()}, other - self.const)
            return self._linear(mine, self.const - other)
        if isinstance(other, Traced) and sym in "+-":
            sign = -1 if sym == "-" else 1
            a_terms, b_terms = (other, self) if reverse else (self, other)
            out = {a.name: (a, c) for a, c in a_terms.terms}
            for a, c in b_terms.terms:
                out[a.name] = (a, out.get(a.name, (a, 0))[1] + sign * c)
            return self._linear(out, a_terms.const + sign * b_terms.const)
        a, b = (other, self) if reverse else (self, other)
        return self.tracer.emit(f"{self.tracer.ref(a)} {sym} {self.tracer.ref(b)}", a, b, op=sym)

    def __neg__(self):
        return self._linear({a.name: (a, -c) for a, c in self.terms}, -self.const)

    def __pos__(self):
        return self

    def __bool__(self):
        raise TypeError("a traced workload dim cannot decide a branch; write the formula without one")

    def _refuse(self, other):
        raise TypeError("a traced workload dim cannot be compared; use lmcost.basics.notation.minimum")

    __lt__ = __le__ = __gt__ = __ge__ = __eq__ = __ne__ = _refuse
    __hash__ = object.__hash__


def _make(op: str, sym: str):
    setattr(Traced, f"__{op}__", lambda self, other: self._bin(sym, other, False))
    setattr(Traced, f"__r{op}__", lambda self, other: self._bin(sym, other, True))


for _op, _sym in _BINARY.items():
    _make(_op, _sym)


def affine_in(v, name: str) -> bool:
    """Whether a traced value (or constant) is, with every other dim fixed, an affine function of the dim
    ``name``: built from it by sums, products with values free of it, and division by values free of
    it. A ``minimum``, a ``half``, a floor division or a power of it is not (it may have a kink or round).
    """
    if not depends_on(v, name):
        return True
    if v.op == "var":
        return True
    if v.op == "lin":
        return all(affine_in(a, name) for a, _ in v.terms)
    a, b = (v.args + (None, None))[:2]
    if v.op in ("+", "-"):
        return affine_in(a, name) and affine_in(b, name)
    if v.op == "*":
        return (not depends_on(a, name) and affine_in(b, name)) or (not depends_on(b, name) and affine_in(a, name))
    if v.op == "/":
        return affine_in(a, name) and not depends_on(b, name)
    return False


def depends_on(v, name: str) -> bool:
    """Whether a traced value (or constant) depends on the workload dim ``name``."""
    return isinstance(v, Traced) and name in v.deps


def compile_outputs(tracer: Tracer, args: tuple[str, ...], outputs: list[list[Any]], name: str) -> Callable:
    """One Python function of ``args`` returning, for each list in ``outputs``, a tuple of its values
    (Traced values computed, constants as literals, None as None).

    Returns: f(*args) -> tuple of tuples, shaped like ``outputs``.
    """
    def src(v):
        return "None" if v is None else tracer.ref(v)

    # Only the lines the outputs need (a function over some of the traced outputs skips the rest).
    need = {v.name for row in outputs for v in row if isinstance(v, Traced)}
    for var, _, reads in reversed(tracer.lines):
        if var in need:
            need.update(reads)
    body = "\n".join(f"    {var} = {expr}" for var, expr, _ in tracer.lines if var in need) or "    pass"
    rows = ", ".join("(" + "".join(f"{src(v)}, " for v in row) + ")" for row in outputs)
    code = f"def _compiled({', '.join(args)}):\n{body}\n    return ({rows},)\n"
    ns: dict[str, Any] = dict(tracer.calls)
    exec(compile(code, f"<lmcost: {name}>", "exec"), ns)
    fn = ns["_compiled"]
    fn.source = code
    return fn
