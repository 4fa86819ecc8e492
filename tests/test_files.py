"""The reading and writing boundary (issue 24): every reader refuses a FIFO, a device, a name too long and
a file over its limit in one line, without blocking or reading; a folder is replaced whole and a killed
swap is restored by the next run; names read from inside files never become paths.

Cheap: library calls on small files in tmp_path, and the CLI in-process on arguments refused before any
work (one subprocess, for a closed stdout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lmcost.basics import files
from lmcost.basics.errors import LmcostError
from lmcost.cli import main

#: Above Linux's default pid_max (2^22): a process that cannot be alive, as a killed run's.
DEAD = 2**22 + 12345
LONG = "x" * 300  # one name past NAME_MAX (255 bytes)
HEADER = "device,dtype,op,implementation,M,N,K,batch,seq_q,seq_kv,heads_q,heads_kv,head_dim,causal,tokens,hidden,time_us,source\n"


@pytest.fixture
def no_hang():
    """A reader that blocks (a FIFO opened for reading waits for a writer) fails the test in 10 s."""
    def hung(*_):
        raise TimeoutError("a reader blocked")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _readers():
    """(name, call) for every kind of file lmcost reads."""
    from lmcost import load_config, load_gpu
    from lmcost.calibration import collective_fit
    from lmcost.calibration.measurements import load_table
    from lmcost.hardware.cluster import load_cluster
    return {"model": load_config, "gpu": load_gpu, "cluster": load_cluster, "table": load_table,
            "collective table": collective_fit.load_rows, "mapping": files.read_mapping}


READERS = sorted(_readers())


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_fifo_is_named_a_fifo_by_every_reader(tmp_path, reader, suffix, no_hang):
    fifo = tmp_path / f"fifo{suffix}"
    os.mkfifo(fifo)
    with pytest.raises(LmcostError) as e:
        _readers()[reader](str(fifo))
    assert (e.value.field, e.value.what) == (str(fifo), "is a FIFO (named pipe), not a file")


@pytest.mark.parametrize("reader", READERS)
def test_a_device_is_refused_before_a_byte_is_read(reader, no_hang):
    with pytest.raises(LmcostError) as e:
        _readers()[reader]("/dev/zero")  # read, it never ends (MemoryError before issue 24)
    assert e.value.what == "is a character device, not a file"


@pytest.mark.parametrize("reader", READERS)
def test_a_name_past_name_max_is_one_line(tmp_path, reader):
    with pytest.raises(LmcostError) as e:
        _readers()[reader](str(tmp_path / f"{LONG}.yaml"))
    assert "past the file system's 255" in e.value.what or "past the file system's 255" in str(e.value)


def test_the_size_limit_is_checked_before_reading(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"0123456789")
    assert files.read_bytes(p, 10) == b"0123456789"  # at the limit: read whole
    with pytest.raises(LmcostError) as e:
        files.read_bytes(p, 9)
    assert "more than lmcost reads" in e.value.what


def test_a_folder_is_named_a_folder(tmp_path):
    with pytest.raises(LmcostError) as e:
        files.read_mapping(tmp_path)
    assert e.value.what == "is a folder, not a file"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_utf8_byte_order_mark_is_read(tmp_path, suffix):
    p = tmp_path / f"m{suffix}"
    p.write_text('{"a": 1}', encoding="utf-8-sig")  # JSON is YAML too
    assert files.read_mapping(p) == {"a": 1}


def test_utf16_is_named_utf16(tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"a": 1}', encoding="utf-16")  # Python writes the little-endian BOM first
    with pytest.raises(LmcostError) as e:
        files.read_mapping(p)
    assert e.value.what == "is UTF-16 (it starts with a UTF-16 byte-order mark)"


def test_many_plain_keys_are_not_called_an_alias_bomb(tmp_path):
    p = tmp_path / "big.json"
    p.write_text(json.dumps({f"k{i}": i for i in range(files.MAX_VALUES + 1)}))  # the mapping and its values: 100,002
    with pytest.raises(LmcostError) as e:
        files.read_mapping(p)
    assert "keys and values" in e.value.what and "alias" not in e.value.what


def test_an_alias_bomb_is_still_called_one(tmp_path):
    # Ten levels of ten aliases each: 10^10 values once expanded, a few hundred bytes written.
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    p = tmp_path / "bomb.yaml"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(LmcostError) as e:
        files.read_mapping(p)
    assert "aliases are expanded" in e.value.what


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.builds(bytes.__add__, st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"{", b"a: ", b"- "]),
                      st.binary(max_size=200)))
def test_any_bytes_give_a_mapping_or_one_line(tmp_path, data):
    for suffix in (".json", ".yaml"):
        p = tmp_path / f"h{suffix}"
        p.write_bytes(data)
        try:  # anything but a mapping or LmcostError (a traceback) fails the test
            assert isinstance(files.read_mapping(p), dict)
        except LmcostError as e:
            assert e.what and e.fix


# The CLI: every option that names a file, given a name past NAME_MAX, is one line and exit 2.
CASES = [
    ["estimate", LONG], ["estimate", f"{LONG}.yaml"], ["estimate", "gpt2", "--gpu", LONG],
    ["estimate", "gpt2", "--gpu", f"{LONG}.yaml"], ["estimate", "gpt2", "--cluster", LONG, "--tp", "2"],
    ["estimate", "gpt2", "--cluster", f"{LONG}.yaml", "--tp", "2"], ["models", "show", LONG], ["gpus", "show", LONG],
    ["roofline", "gpt2", "-o", f"{LONG}.html"], ["kv", "gpt2", "--plot", f"{LONG}.html"],
    ["report", "gpt2", "-o", LONG], ["report", "gpt2", "-o", f"d/{LONG}/r"], ["plan", "gpt2", "--gpu", "h100", "-o", f"{LONG}.html"],
    ["fit", "--table", f"{LONG}.csv"], ["fit", "--gpu", "h100", "--out", LONG],
    pytest.param(["validate", "gpt2", "--gpu", "h100", "--trace", f"{LONG}.json"], marks=pytest.mark.torch),
    pytest.param(["validate", "tiny-gqa", "--gpu", "h100", "--report-dir", LONG], marks=pytest.mark.torch),
    pytest.param(["profile", "tiny-gqa", "--trace", f"{LONG}.json"], marks=pytest.mark.torch),
    pytest.param(["calibrate", "-o", f"{LONG}.yaml"], marks=pytest.mark.torch),
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(x if len(x) < 40 else "LONG" for x in a))
def test_a_name_too_long_is_one_line_per_option(args, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lmcost", *args])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.torch
def test_calibrate_refuses_a_json_name_it_would_fill_with_yaml():
    from lmcost.profiling.calibrate import check_output

    with pytest.raises(LmcostError) as e:
        check_output(Path("x.json"))  # --gpu x.json reads JSON: the YAML written there would be refused
    assert e.value.field == "output" and "ending in .yaml" in e.value.fix


def test_closed_stdout_is_one_line_not_a_traceback():
    r = subprocess.run([sys.executable, "-m", "lmcost", "gpus", "list"], stdout=None, stderr=subprocess.PIPE, text=True,
                       preexec_fn=lambda: os.close(1), timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: stdout: closed") and "Traceback" not in r.stderr, r.stderr


# Writing.

def _folder(path: Path, **texts) -> Path:
    path.mkdir()
    for name, text in texts.items():
        (path / name).write_text(text)
    return path


def _contents(path: Path) -> dict:
    return {p.name: p.read_text() for p in path.iterdir()}


def test_a_folder_is_replaced_whole(tmp_path):
    out = tmp_path / "fo"
    files.write_texts(out, {"a100-40gb.yaml": "a", "fit-report.json": "1"}, "fit.out_dir")
    files.write_texts(out, {"h100-sxm.yaml": "h", "fit-report.json": "2"}, "fit.out_dir")
    assert _contents(out) == {"h100-sxm.yaml": "h", "fit-report.json": "2"}  # no A100 YAML beside the H100 report
    assert [p.name for p in tmp_path.iterdir()] == ["fo"]  # and nothing left beside it


@pytest.mark.parametrize("exchange", [True, False])
def test_a_swap_replaces_the_old_folder(tmp_path, monkeypatch, exchange):
    if not exchange:  # a system without renameat2: rename aside, rename in, remove the old
        monkeypatch.setattr(files, "_exchange", lambda a, b: False)
    out = _folder(tmp_path / "out", a="old")
    with files.staged_folder(out, "out_dir") as tmp:
        (tmp / "a").write_text("new")
    assert _contents(out) == {"a": "new"} and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_reader_never_finds_the_folder_missing(tmp_path, monkeypatch):
    # After every rename of a replacement the folder is there: with the atomic exchange no step removes
    # it (the aside-then-in fallback has a step between its two renames without it, which this test
    # catches when _exchange is made to return False, and which remove_stale repairs after a kill).
    probe = _folder(tmp_path / "probe", a="")
    if not files._exchange(_folder(tmp_path / "other"), probe):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here")
    out, missing, rename = _folder(tmp_path / "out", a="0"), [], os.rename

    def spy(src, dst):
        rename(src, dst)
        missing.extend([(src, dst)] if not out.is_dir() else [])
    monkeypatch.setattr(os, "rename", spy)
    with files.staged_folder(out, "out_dir") as tmp:
        (tmp / "a").write_text("1")
    assert missing == [] and _contents(out) == {"a": "1"}


def test_a_failed_write_leaves_the_old_folder(tmp_path):
    out = _folder(tmp_path / "out", a="old")
    with pytest.raises(RuntimeError), files.staged_folder(out, "out_dir") as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("killed")
    assert _contents(out) == {"a": "old"} and [p.name for p in tmp_path.iterdir()] == ["out"]


def _orphan(target: Path, kind: str, text: str) -> Path:
    """A folder a killed run left beside ``target`` (its pid dead): ``kind`` new- (staged whole), old- (the
    old folder moved aside) or '' (still being written)."""
    return _folder(target.with_name(f".{target.name}{files.TEMP_TAG}{DEAD}-{kind}abcd"), a=text)


@pytest.mark.parametrize("left, restored", [
    (("new-", "old-"), "new-"),  # killed between moving the old aside and the new in: the finished new one
    (("old-",), "old-"),          # the old one alone (the new one was still being written)
    (("old-", ""), "old-"),
])
def test_a_killed_swap_is_restored_not_deleted(tmp_path, left, restored):
    out = tmp_path / "rep"
    for kind in left:
        _orphan(out, kind, kind or "partial")
    files.remove_stale(out)  # what the next run does first
    assert _contents(out) == {"a": restored} and [p.name for p in tmp_path.iterdir()] == ["rep"]


def test_leftovers_beside_a_whole_folder_are_removed(tmp_path):
    out = _folder(tmp_path / "rep", a="current")
    for kind in ("new-", "old-", ""):
        _orphan(out, kind, kind)
    files.remove_stale(out)
    assert _contents(out) == {"a": "current"} and [p.name for p in tmp_path.iterdir()] == ["rep"]


@pytest.mark.parametrize("name", ["../../escaped", "", ".hidden", "a/b", "x" * 256])
def test_a_name_from_inside_a_file_never_becomes_a_path(tmp_path, name):
    with pytest.raises(LmcostError):
        files.write_texts(tmp_path / "fo", {f"{name}.yaml" if name else "": "x"}, "fit.out_dir")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name, part", [("../../escaped", "_.._escaped"), ("", "_"), ("a/b c", "a_b_c"),
                                        ("llama-3-8b+gpt2", "llama-3-8b+gpt2"), ("x" * 300, "x" * 100)])
def test_a_models_name_in_a_file_name_stays_one_part(name, part):
    # validate names its reports after the models: `name: ../../escaped` in a model YAML wrote outside --report-dir
    assert files.file_part(name) == part


@pytest.mark.parametrize("name", ["../../escaped", ".."])
def test_fit_refuses_a_gpu_named_as_a_path(tmp_path, name):
    from lmcost.apps.fit import FitRequest, fit

    gpu = tmp_path / "g.yaml"
    gpu.write_text((Path(files.__file__).parents[1] / "data" / "gpus" / "h100-sxm.yaml").read_text()
                   .replace("name: h100-sxm", f"name: {name!r}", 1))
    table = tmp_path / "t.csv"
    table.write_text(HEADER + "h100,bf16,rmsnorm,x,,,,,,,,,,,4096,4096,30,a\n")
    with pytest.raises(LmcostError) as e:
        fit(FitRequest(table=str(table), targets=(str(gpu),), out_dir=str(tmp_path / "fo")))
    assert e.value.field in ("targets", f"{gpu}: name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml", "t.csv"]  # nothing written, inside or out


def test_fit_refuses_a_folder_it_did_not_write(tmp_path):
    from lmcost.apps.fit import _out_folder

    mine = _folder(tmp_path / "mygpus", **{"my.yaml": "name: mine"})
    with pytest.raises(LmcostError) as e:
        _out_folder(str(mine))  # it would be replaced whole: the user's YAML lost
    assert e.value.field == "fit.out_dir"
    earlier = _folder(tmp_path / "fo", **{"h100-sxm.yaml": "x", "fit-report.json": "{}"})
    assert _out_folder(str(earlier)) == earlier


@pytest.mark.torch
def test_the_trace_reader_refuses_a_fifo_a_device_and_a_long_name(tmp_path, no_hang):
    # The trace reader (validate --trace, fit --trace) is on torch's side; the same three refusals as above.
    from lmcost.profiling import trace

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, said in ((fifo, "FIFO"), ("/dev/zero", "character device"), (tmp_path / f"{LONG}.json", "255")):
        with pytest.raises(LmcostError, match=said):
            trace.load(str(path))
