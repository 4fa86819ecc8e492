"""Writes survive kill -9 and concurrent runs (issue 11): a report folder is whole or absent, temporary
leftovers of killed runs are removed by the next run, and two runs into one folder both succeed.

Bounded: a few runs of `lmcost report` on GPT-2 (about 2 s each), killed at staggered moments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

LMCOST = [sys.executable, "-m", "lmcost"]


def _report(out: Path) -> subprocess.Popen:
    return subprocess.Popen([*LMCOST, "report", "gpt2", "--gpu", "h100", "--prompt", "256", "--gen", "8", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _whole(out: Path) -> bool:
    """A complete report: every file there and its JSON readable."""
    names = {p.name for p in out.iterdir()}
    return {"index.html", "summary.json", "ops.csv", "roofline_points.csv"} <= names and \
        json.loads((out / "summary.json").read_text())["model"] == "gpt2"


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".lmcost-" in p.name)


def test_kill_9_never_leaves_a_broken_report_and_the_next_run_cleans_up(tmp_path):
    out = tmp_path / "rep"
    first = _report(out)
    assert first.wait(timeout=120) == 0, first.stderr.read()
    killed = 0
    for delay in (0.3, 0.8, 1.2, 1.6, 2.0, 2.4):  # staggered: before, during and after the writing
        p = _report(out)
        time.sleep(delay)
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            killed += 1
        p.wait(timeout=120)
        assert _whole(out), f"a report killed after {delay} s left {out} incomplete"
    assert killed >= 3  # the loop really killed runs mid-way
    last = _report(out)
    assert last.wait(timeout=120) == 0, last.stderr.read()
    assert _whole(out) and _leftovers(tmp_path) == []


def test_two_reports_into_one_folder_both_succeed(tmp_path):
    out = tmp_path / "rep"
    runs = [_report(out) for _ in range(2)]
    codes = [p.wait(timeout=180) for p in runs]
    assert codes == [0, 0], [p.stderr.read() for p in runs]
    assert _whole(out) and _leftovers(tmp_path) == []


@pytest.mark.parametrize("run", range(2))
def test_a_leftover_of_a_live_run_is_kept(tmp_path, run):
    # remove_stale removes only what dead processes left: this process's own temporary file stays.
    from lmcost.basics.files import remove_stale, temp_prefix

    target = tmp_path / "x.json"
    mine = tmp_path / f"{temp_prefix(target)}abc.tmp"
    dead = tmp_path / f".x.json.lmcost-{2**22 + 12345 + run}-abc.tmp"  # above Linux's default pid_max
    mine.write_text("")
    dead.write_text("")
    remove_stale(target)
    assert mine.exists() and not dead.exists()
