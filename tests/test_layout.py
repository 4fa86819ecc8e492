"""The package's layout rules (issue 10): no import cycles between lmcost's modules, and torch only in
lmcost/profiling/. Read from the source with ast (every import, at module level or inside a function)."""

from __future__ import annotations

import ast

from conftest import ROOT

PKG = ROOT / "lmcost"


def _modules() -> dict[str, ast.Module]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = (p, ast.parse(p.read_text()))
    return out


def _edges(mods) -> dict[str, set[str]]:
    """module -> the lmcost modules it imports (a `from . import x` of a submodule is an edge to x,
    not to the package)."""
    edges = {m: set() for m in mods}
    for m, (path, tree) in mods.items():
        package = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                subs = {f"{base}.{a.name}" for a in node.names} & set(mods)
                edges[m] |= subs or ({base} & set(mods))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                edges[m] |= {n for n in names if n in mods}
    return edges


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_the_package():
    # Guard against a check that reads nothing: the modules and a known edge are there.
    mods = _modules()
    assert {"lmcost.phases", "lmcost.tracing", "lmcost.cli", "lmcost.profiling.validate"} <= set(mods)
    assert "lmcost.tracing" in _edges(mods)["lmcost.phases"]


def test_no_import_cycles():
    # The package itself imports its API (lmcost/__init__.py), which every `from . import x` would
    # otherwise loop through: an edge to the package counts only where no submodule is named.
    assert _cycles({m: e - {"lmcost"} for m, e in _edges(_modules()).items()}) == []


def test_torch_only_in_profiling():
    for m, (_, tree) in _modules().items():
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert "torch" not in imported or m.startswith("lmcost.profiling"), m
