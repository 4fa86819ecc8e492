"""The test tiers (tests/conftest.py, markers in pyproject.toml): read from the tests' own source, every test
that imports torch or transformers, starts gloo process groups or drives Chromium carries the marker that
says so, and a module that imports one at its top carries it in its ``pytestmark`` (a test's own marker
cannot stop the import at collection).

What counts as needing a tier, in a test, the helpers and fixtures it uses (of its module or conftest),
transitively:
- torch: ``import torch...``, ``pytest.importorskip("torch")``, or ``lmcost.profiling`` (the package's one
  torch-importing room, tests/test_layout.py);
- transformers: ``import transformers...`` or ``pytest.importorskip("transformers")``;
- distributed: ``torch.distributed``, ``lmcost.profiling.distributed`` or the string ``"gloo"``;
- browser: the string ``"chromium"`` (the executable looked up).
A test that reaches torch another way (a CLI command that profiles) is caught when it runs:
conftest.pytest_runtest_call fails an unmarked test that imports torch.

The ``slow`` tier is chosen, not needed: tests that cost seconds each, or a long stratified remainder
(test_golden's), which the README's ``python -m pytest`` deselects (pyproject's addopts ``-m "not slow"``)
to stay under 5 minutes on 2 cores, and ``.ci/run`` runs after it (``python -m pytest -m slow``). Checked
here by pytest itself: the commands .ci/run runs, on a module with a test for every set of markers,
collect each test exactly once.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import tomllib
from itertools import combinations
from pathlib import Path

import pytest

from conftest import module_marks

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
TIERS = ("torch", "transformers", "distributed", "browser")


def _imported(name: str) -> set[str]:
    """The tiers an import of the dotted module ``name`` needs."""
    need = {t for t in ("torch", "transformers") if name == t or name.startswith(t + ".")}
    if name.startswith("lmcost.profiling"):
        need.add("torch")
    if name.startswith(("torch.distributed", "lmcost.profiling.distributed")):
        need.add("distributed")
    return need


def _direct(nodes) -> set[str]:
    """Tiers the statements ``nodes`` need by what they import, importorskip or name as a string."""
    need: set[str] = set()
    for n in (m for node in nodes for m in ast.walk(node)):
        if isinstance(n, ast.Import):
            for a in n.names:
                need |= _imported(a.name)
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                need |= _imported(n.module) | _imported(f"{n.module}.{a.name}")
        elif isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", None)) == "importorskip" \
                and n.args and isinstance(n.args[0], ast.Constant):
            need |= _imported(n.args[0].value)
        elif isinstance(n, ast.Constant) and n.value == "gloo":
            need |= {"torch", "distributed"}
        elif isinstance(n, ast.Constant) and n.value == "chromium":
            need.add("browser")
    return need


def _marks(decorators) -> set[str]:
    """Marker names of ``@pytest.mark.x`` / ``@pytest.mark.x(...)`` decorators."""
    out = set()
    for d in decorators:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Attribute) and d.value.attr == "mark":
            out.add(d.attr)
    return out


def _needs(tree: ast.Module, outside: dict[str, set[str]]) -> tuple[set[str], dict[str, set[str]]]:
    """(what importing the module needs, {module-level function or name: what calling or using it needs}),
    the second through the functions, fixtures and names it uses, to a fixed point. ``outside``: the
    needs of names the module takes from conftest."""
    top = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    # what runs at import: imports and importorskip calls (a string kept in a name counts where it is used)
    module = _direct([s for s in top if not isinstance(s, ast.Assign)])
    module |= set().union(*(_direct([n]) for s in top if isinstance(s, ast.Assign) for n in ast.walk(s.value)
                            if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "importorskip"))
    defs = {s.name: s for s in tree.body if isinstance(s, ast.FunctionDef)}
    names = {t.id: s.value for s in top if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    need = {**outside, **{k: _direct([v]) for k, v in names.items()}, **{k: _direct(f.body) for k, f in defs.items()}}
    uses = {k: {n.id for n in ast.walk(f) if isinstance(n, ast.Name)} | {a.arg for a in f.args.args}
            for k, f in defs.items()}
    uses |= {k: {n.id for n in ast.walk(v) if isinstance(n, ast.Name)} for k, v in names.items()}
    changed = True
    while changed:
        changed = False
        for k, used in uses.items():
            more = set().union(*(need[u] for u in used if u in need and u != k)) - need[k]
            if more:
                need[k] |= more
                changed = True
    return module, need


def _conftest_needs() -> dict[str, set[str]]:
    return _needs(ast.parse((TESTS / "conftest.py").read_text()), {})[1]


def violations(source: str, name: str = "test_x.py", conftest: dict | None = None) -> list[str]:
    """What a test module's markers miss: one line per module or test."""
    tree = ast.parse(source)
    conftest = _conftest_needs() if conftest is None else conftest
    taken = {a.asname or a.name for s in tree.body if isinstance(s, ast.ImportFrom) and s.module == "conftest"
             for a in s.names}
    module, need = _needs(tree, {k: v for k, v in conftest.items() if k in taken})
    marks = module_marks(tree)
    out = []
    if module - marks:
        out.append(f"{name}: imports {', '.join(sorted(module - marks))} at its top; its pytestmark must say so")
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name.startswith("test"):
            missing = (need[f.name] | module) - marks - _marks(f.decorator_list)
            if missing:
                out.append(f"{name}::{f.name} needs the marker(s) {', '.join(sorted(missing))}")
    return out


def _modules():
    # this file names the tiers' strings as data: it is the check, not a test that needs them
    return sorted(p for p in TESTS.glob("test_*.py") if p.name != Path(__file__).name)


def test_every_test_carries_the_tiers_it_needs():
    found = [v for p in _modules() for v in violations(p.read_text(), p.name)]
    assert found == []


def test_the_walk_reads_the_tests():
    # Guard against a check that reads nothing: the modules are there and the known tiers are seen.
    mods = {p.name: ast.parse(p.read_text()) for p in _modules()}
    assert {"test_decoder.py", "test_hf.py", "test_distributed.py", "test_roofline_report.py"} <= set(mods)
    conftest = _conftest_needs()
    assert conftest["hf_param_count"] == {"torch", "transformers"}
    assert _needs(mods["test_decoder.py"], {})[0] >= {"torch"}
    assert _needs(mods["test_distributed.py"], {})[0] >= {"torch", "distributed"}
    assert "browser" in _needs(mods["test_roofline_report.py"], {})[1]["test_report_renders_offline_in_chromium"]
    carried = {t for p in mods.values() for t in module_marks(p)}
    carried |= {t for p in mods.values() for f in p.body if isinstance(f, ast.FunctionDef) for t in _marks(f.decorator_list)}
    assert carried >= set(TIERS)


@pytest.mark.parametrize("source, missing", [
    # a module-level importorskip without pytestmark
    ('import pytest\ntorch = pytest.importorskip("torch")\ndef test_a():\n    pass\n',
     ["test_x.py: imports torch at its top; its pytestmark must say so", "test_x.py::test_a needs the marker(s) torch"]),
    # a test's own marker does not cover a module-level import
    ('import pytest\nimport transformers\n@pytest.mark.transformers\ndef test_a():\n    pass\n',
     ["test_x.py: imports transformers at its top; its pytestmark must say so"]),
    # a function-level import, through a helper and a fixture
    ('import pytest\ndef _model():\n    from lmcost.profiling.decoder import build_decoder\n'
     '@pytest.fixture\ndef model():\n    return _model()\ndef test_a(model):\n    pass\n',
     ["test_x.py::test_a needs the marker(s) torch"]),
    # a conftest helper that builds a transformers model
    ('from conftest import hf_param_count\ndef test_a():\n    hf_param_count({})\n',
     ["test_x.py::test_a needs the marker(s) torch, transformers"]),
    # torch marked, but gloo processes and Chromium not
    ('import pytest\npytestmark = pytest.mark.torch\nimport torch\nB = "chromium"\n'
     'def test_a():\n    import torch.distributed as dist\ndef test_b():\n    run(B)\n',
     ["test_x.py::test_a needs the marker(s) distributed", "test_x.py::test_b needs the marker(s) browser"]),
    # and each of them covered
    ('import pytest\npytestmark = [pytest.mark.torch, pytest.mark.transformers]\nimport torch\n'
     'transformers = pytest.importorskip("transformers")\n@pytest.mark.distributed\n'
     'def test_a():\n    import torch.distributed as dist\n', []),
])
def test_the_check_finds_a_missing_marker(source, missing):
    assert violations(source) == missing


def _ci_pytest_runs() -> list[list[str]]:
    """The pytest arguments of each ``.venv/bin/python -m pytest ...`` line of .ci/run."""
    head = ".venv/bin/python -m pytest"
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [shlex.split(line[len(head):]) for line in lines if line == head or line.startswith(head + " ")]


def test_ci_runs_the_readme_command_and_the_slow_tier():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "slow" in {m.split(":")[0] for m in ini["markers"]}
    assert shlex.split(ini["addopts"])[-2:] == ["-m", "not slow"]
    assert ".venv/bin/python -m pytest\n" in (ROOT / "README.md").read_text()
    assert _ci_pytest_runs() == [[], ["-m", "slow"]]


def test_the_default_run_and_the_slow_tier_collect_every_test_once(tmp_path):
    # pytest's own collection, under this project's pytest settings, of one test per set of markers: each
    # is collected by exactly one of .ci/run's pytest commands (none lost between tiers, none run twice).
    ini = (ROOT / "pyproject.toml").read_text()
    (tmp_path / "pyproject.toml").write_text(ini[ini.index("[tool.pytest.ini_options]"):])
    names = [m.split(":")[0] for m in tomllib.loads(ini)["tool"]["pytest"]["ini_options"]["markers"]]
    assert set(names) >= {*TIERS, "slow"}
    sets = [c for k in range(len(names) + 1) for c in combinations(names, k)]
    body = ["import pytest"]
    for c in sets:
        body += [f"@pytest.mark.{m}" for m in c] + [f"def test_{'_'.join(c) or 'none'}():", "    pass"]
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_all.py").write_text("\n".join(body) + "\n")
    seen = []
    for args in _ci_pytest_runs():
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                              "-p", "xdist.plugin", "-n", "0", *args],  # addopts' -n needs xdist loaded
                             cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}).stdout  # no hypothesis: 3 s
        seen += re.findall(r"::(test_\w+)|<Function (test_\w+)>", out)
    seen = [a or b for a, b in seen]
    assert sorted(seen) == sorted(f"test_{'_'.join(c) or 'none'}" for c in sets)


def test_the_sampled_tests_exist_and_each_keeps_cases_in_both_tiers():
    # conftest.SAMPLED names tests by module and function: a rename must not leave an entry that samples
    # nothing. Each test's own parameter ids (read from a collection of its module without running it)
    # fall on both sides of the split: the default run keeps some, the slow tier gets the rest.
    from conftest import SAMPLED, sampled_out

    for tail, k in SAMPLED.items():
        module, function = tail.split("::")
        tree = ast.parse((ROOT / "tests" / module).read_text())
        assert function in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, tail
        assert k >= 2, tail
    ids = [f"case{i}" for i in range(60)]
    kept = [i for i in ids if not sampled_out("test_hybrid.py::test_state_and_kv_bytes_equal_transformers_cache", i)]
    assert 0 < len(kept) < len(ids)
