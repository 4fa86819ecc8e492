"""Every command the CLI has, walked from the click group typer builds of ``lmcost.cli.app`` (not a hand-kept
list): its ``--help`` exits 0 and names each of its options (and, for a group, each of its commands), and an
unknown option is one line ``error: --bogus: ...`` with exit 2 through the console script, as a user sees it.
"""

from __future__ import annotations

import importlib
import re
import sys
import tomllib

import pytest
import typer.main
from typer.testing import CliRunner

from conftest import ROOT
from lmcost.cli import app

#: The commands the README documents: the walk must find at least these, so it cannot pass by finding none.
DOCUMENTED = {
    "estimate", "explain", "kv", "plan", "roofline", "report", "train", "breakdown", "calibrate", "fit", "profile",
    "validate", "op gemm", "op attention", "op rmsnorm", "op layernorm", "op elementwise", "op collective",
    "gpus list", "gpus show", "models list", "models show", "clusters list", "clusters show",
}


def _walk() -> dict[str, object]:
    """{"op gemm": its click command, ...} for every command and group under the root ("" is the root)."""
    out = {}

    def walk(cmd, path):
        out[" ".join(path)] = cmd
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _walk()


def _console_script():
    """The function ``lmcost`` runs: pyproject's [project.scripts] entry, resolved."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["lmcost"]
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def test_the_walk_finds_every_documented_command():
    assert DOCUMENTED <= set(COMMANDS), sorted(DOCUMENTED - set(COMMANDS))
    # the groups hold what they say: op's six kernels, and list/show for each catalogue
    assert {p for p in COMMANDS if p.startswith("op ")} >= {p for p in DOCUMENTED if p.startswith("op ")}
    assert {"op", "gpus", "models", "clusters"} <= set(COMMANDS)


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: p or "lmcost")
def test_help_names_every_option(path):
    cmd = COMMANDS[path]
    # wide enough that no option name is cut by the help table
    r = CliRunner().invoke(app, [*path.split(), "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert r.exit_code == 0, r.output
    options = [o for p in cmd.params if p.param_type_name == "option" and not p.hidden for o in p.opts]
    commands = sorted(getattr(cmd, "commands", {}))
    # something to name: a command's options or arguments, a group's commands
    assert options or commands or any(p.param_type_name == "argument" for p in cmd.params), path
    named = set(re.findall(r"(?<![\w-])(-[\w-]+|[a-z][\w-]*)", r.stdout))  # whole words: --gpu is not --gpus
    assert [o for o in options if o not in named] == []
    assert [c for c in commands if c not in named] == []


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=lambda p: p or "lmcost")
def test_an_unknown_option_is_one_line_exit_2(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["lmcost", *path.split(), "--bogus"])
    with pytest.raises(SystemExit) as e:
        _console_script()()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and out == "", (e.value.code, out[-400:])
    assert len(lines) == 1 and lines[0].startswith("error: --bogus: No such option"), err[-400:]
