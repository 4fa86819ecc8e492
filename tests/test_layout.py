"""The package's layout rules (issues 10 and 23), read from the source with ast (every import, at module level
or inside a function): lmcost is built in layers, each folder importing only the folders below it; no import
cycles; torch only in lmcost/profiling/; no module over 600 lines unless it is a table; shipped data only
inside the package."""

from __future__ import annotations

import ast
import re

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


#: The layers from the ground up (README, "Layout"). A module may import its own folder and those below it;
#: ``profiling`` stands beside ``apps`` (neither imports the other); the package root (the API facade) and
#: ``__main__`` may import anything.
LAYERS = ["basics", "hardware", "model", "operators", "cost", "calibration", "output", ("apps", "profiling"), "cli"]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in (layer if isinstance(layer, tuple) else (layer,))}
#: Modules over the size limit that are tables, not ideas (each entry says why).
TABLES = {
    "lmcost.model.hf.verdicts": "a verdict per Hugging Face model type",
}
MAX_LINES = 600


def _folder(module: str) -> str | None:
    """The layer folder of ``lmcost.<folder>...``; None for the package root and ``__main__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANK else None


def _upward(edges) -> list[str]:
    out = []
    for m, targets in edges.items():
        here = _folder(m)
        if here is None:
            if len(m.split(".")) > 1 and m.split(".")[1] != "__main__":
                out.append(f"{m} sits outside every layer folder")
            continue
        for t in targets:
            there = _folder(t)
            if there is None:
                if t != "lmcost" or here != "cli":  # cli may read __version__ from the package root
                    out.append(f"{m} -> {t}")
            elif there != here and RANK[there] >= RANK[here]:
                out.append(f"{m} -> {t}")
    return sorted(out)


def test_every_module_sits_in_a_layer():
    mods = _modules()
    assert {m.split(".")[1] for m in mods if len(m.split(".")) > 1} == set(RANK) | {"__main__"}


def test_layers_import_only_downward():
    assert _upward(_edges(_modules())) == []


def test_the_layer_check_catches_an_upward_import():
    # The check itself can fail: a graph module importing the cost layer, and a cost module importing an
    # application, are both reported; a sideways import between apps and profiling too.
    edges = {"lmcost.operators.ops": {"lmcost.cost.phases"}, "lmcost.cost.phases": {"lmcost.apps.plan"},
             "lmcost.apps.plan": {"lmcost.profiling.profile"}, "lmcost.cost.memory": {"lmcost.operators.ops"}}
    assert _upward(edges) == ["lmcost.apps.plan -> lmcost.profiling.profile", "lmcost.cost.phases -> lmcost.apps.plan",
                              "lmcost.operators.ops -> lmcost.cost.phases"]


def test_the_cycle_check_catches_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_rooms_are_small():
    big = {m: n for m, (path, _) in _modules().items()
           if (n := len(path.read_text().splitlines())) > MAX_LINES and m not in TABLES}
    assert big == {}


def test_shipped_data_lives_in_the_package():
    # One copy of each shipped file, inside lmcost/data (read through importlib.resources).
    from lmcost.basics import shipped

    for kind in shipped.KINDS:
        assert shipped.folder(kind).is_dir() and shipped.folder(kind).is_relative_to(PKG), kind
    assert not (ROOT / "hardware").exists() and not (ROOT / "models").exists()
    assert len(shipped.names("gpus")) >= 12 and "llama-3-8b" in shipped.names("models")


def test_the_walk_sees_the_package():
    # Guard against a check that reads nothing: the modules and a known edge are there.
    mods = _modules()
    assert {"lmcost.cost.compile", "lmcost.basics.tracing", "lmcost.cli", "lmcost.profiling.validate"} <= set(mods)
    assert "lmcost.basics.tracing" in _edges(mods)["lmcost.cost.compile"]


def test_no_import_cycles():
    # The package itself imports its API (lmcost/__init__.py), which every `from . import x` would
    # otherwise loop through: an edge to the package counts only where no submodule is named.
    assert _cycles({m: e - {"lmcost"} for m, e in _edges(_modules()).items()}) == []


def test_torch_only_in_profiling():
    for m, (_, tree) in _modules().items():
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert "torch" not in imported or m.startswith("lmcost.profiling"), m


#: Calls whose string arguments become an error's field or text: LmcostError itself and the library's checks
#: that are handed a field to name (lmcost.operators.workload.check_count, lmcost.basics.dtypes.canonical, ...).
ERROR_CALLS = {"LmcostError", "check_count", "check_positions", "canonical", "locate", "check_folder", "make_folder",
               "from_validation_error"}
FLAG = re.compile(r"(?<![\w-])--[A-Za-z]")


def _flags_in_errors(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of each string constant in the arguments of an error call that names a CLI flag."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in ERROR_CALLS:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    out += [(c.lineno, c.value) for c in ast.walk(arg)
                            if isinstance(c, ast.Constant) and isinstance(c.value, str) and FLAG.search(c.value)]
    return out


def test_library_errors_name_fields_not_flags():
    # A Python caller of lmcost.estimate or train_step passed fields, not flags: the library's errors name
    # the field (`tp`, `virtual_stages`) and lmcost/cli/flags.py shows each as its flag on the command
    # line. Docstrings and comments may still describe the CLI; an error may not.
    found = [f"{m}:{line}: {text!r}" for m, (path, tree) in _modules().items() if not m.startswith("lmcost.cli")
             for line, text in _flags_in_errors(tree)]
    assert found == []


def test_the_flag_scan_catches_a_planted_flag():
    # The scan can fail: a flag as the field, in an f-string's text and through a check handed a field
    # are all found; fields, backticked fields and a negative number are not.
    planted = ast.parse('raise LmcostError("--tp", f"{x} heads", f"use --pp {n}")\ncheck_count("--seq", s)\n'
                        'raise LmcostError("tp", "x", "use `pp` or -1")')
    assert [text for _, text in _flags_in_errors(planted)] == ["--tp", "use --pp ", "--seq"]


def test_the_cli_shows_its_own_errors_as_they_are():
    # The CLI's own errors (and the fields it hands to library checks) already name flags: every one is a
    # flag of lmcost/cli/flags.py's map, so its rewrite leaves them unchanged; the map gives each field
    # one flag, and no flag is also a field.
    from lmcost.basics.errors import LmcostError
    from lmcost.cli.flags import FLAG_NAMES, FLAGS, for_cli

    named = {part for m, (path, tree) in _modules().items() if m.startswith("lmcost.cli")
             for _, text in _flags_in_errors(tree) if FLAG.match(text)
             for part in text.split("/") if part.startswith("--")}
    assert "--virtual-stages" not in named and "--bytes" in named
    assert named - FLAG_NAMES == set()
    for f in named:
        e = LmcostError(f, f"not `{f}` x", f"use `{f}` 2")
        assert str(for_cli(e)) == f"{f}: not {f} x; use {f} 2"
    assert not set(FLAGS) & FLAG_NAMES


#: The only functions of lmcost/cli that may build an LmcostError of their own: parsing a flag's text into a
#: value (counts with k/M, lists, durations, byte sizes), --json with --csv, a missing optional dependency,
#: and flags.for_cli (which shows a library error, it raises none). Every other check is the library's.
CLI_ERROR_MAKERS = {"parse_tokens", "parse_ints", "parse_duration", "parse_bytes", "parse_count", "parse_count_of",
                    "parse_real", "parse_reals", "machine_output",
                    "require_extra", "for_cli"}


def _cli_errors(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level function or '<module>') of each LmcostError(...) built in ``tree``."""
    out = []

    def visit(node, owner):
        for child in ast.iter_child_nodes(node):
            inner = owner
            if owner == "<module>" and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = child.name
            if isinstance(child, ast.Call):
                f = child.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == "LmcostError":
                    out.append((child.lineno, inner))
            visit(child, inner)

    visit(tree, "<module>")
    return out


def test_the_cli_raises_only_parsing_errors():
    # Issue 23: the CLI parses flags, makes one library call and renders; a check of what the values mean
    # (a range, two flags that cannot go together, a path) is the library's, naming API fields.
    found = [(m, line, owner) for m, (path, tree) in _modules().items() if m.startswith("lmcost.cli")
             for line, owner in _cli_errors(tree)]
    assert {owner for _, _, owner in found} >= {"parse_bytes", "machine_output", "require_extra"}  # the scan sees them
    assert [f"{m}:{line} in {owner}" for m, line, owner in found if owner not in CLI_ERROR_MAKERS] == []


def test_the_cli_error_scan_catches_a_planted_check():
    # The scan can fail: a range check in a command body (as plan's --top once was), one in a nested helper
    # of a command, and one at module level are found; one inside a parser is not.
    planted = ast.parse("def plan(top):\n    if top < 1:\n        raise LmcostError('--top', 'x', 'y')\n"
                        "def roofline(c):\n    def check():\n        raise errors.LmcostError('--context', 'x', 'y')\n"
                        "E = LmcostError('a', 'b', 'c')\n"
                        "def parse_bytes(t):\n    raise LmcostError('--bytes', 'x', 'y')\n")
    assert _cli_errors(planted) == [(3, "plan"), (6, "roofline"), (7, "<module>"), (9, "parse_bytes")]
    assert [o for _, o in _cli_errors(planted) if o not in CLI_ERROR_MAKERS] == ["plan", "roofline", "<module>"]
