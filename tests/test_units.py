"""Units as typed and as shown: token counts (k/K, M, G binary), byte sizes (K, M, G and KiB.. binary; the
SI-or-binary MB refused), durations (ns, us/µs, ms, s, case-sensitive), fusion lists, times past 1,000 s,
empty output paths, ``--version`` alone, and exit 2 on bad input whether or not stderr takes the line."""

from __future__ import annotations

import errno
import io
import sys

import pytest

from lmcost import LmcostError
from lmcost.cli import main
from lmcost.cli.options import parse_bytes, parse_count, parse_duration
from lmcost.operators.fusion import FUSIONS, parse_fusion
from lmcost.output.render import si


@pytest.fixture
def run(monkeypatch, capsys):
    """``run(*args)`` -> (exit code, stdout, stderr) through the console script's entry point, as a user
    runs it (usage errors are rendered there)."""

    def go(*args):
        monkeypatch.setattr(sys, "argv", ["lmcost", *map(str, args)])
        with pytest.raises(SystemExit) as e:
            main()
        return (e.value.code, *capsys.readouterr())

    return go


def one_error(r, start: str) -> None:
    code, _, err = r
    assert code == 2 and err.startswith(start) and len(err.strip().splitlines()) == 1, err


# Binary, as context lengths are quoted (the README's 1M = 1,048,576).
@pytest.mark.parametrize("text, n", [("4096", 4096), ("128k", 131_072), ("128K", 131_072), ("1M", 1_048_576),
                                     ("1G", 1_073_741_824), (" 8k ", 8192)])
def test_token_counts_are_binary(text, n):
    assert parse_count(text) == n


@pytest.mark.parametrize("text, why", [("1m", "m is milli"), ("1g", "g is gram"), ("\uff18", "not a whole number"),
                                       ("\u0668", "not a whole number"), ("1x", "not a whole number"),
                                       ("1.5k", "not a whole number"), ("", "not a whole number")])
def test_token_counts_refuse_milli_and_foreign_digits(text, why):
    with pytest.raises(ValueError, match=why):
        parse_count(text)


def test_a_count_option_refuses_lowercase_m_and_fullwidth_digits(run):
    one_error(run("estimate", "llama-3-8b", "--prompt", "1m"), "error: --prompt: '1m': a lowercase m")
    one_error(run("estimate", "llama-3-8b", "--prompt", "\uff18"), "error: --prompt: '\uff18' is not a whole number")
    one_error(run("kv", "llama-3-8b", "--context", "4k,1m"), "error: --context: '1m': a lowercase m")


# nccl-tests' -b 64M is 64 x 2^20 bytes; IEC's MiB the same.
@pytest.mark.parametrize("text, n", [("65536", 65_536), ("64B", 64), ("64K", 65_536), ("64k", 65_536),
                                     ("64M", 67_108_864), ("64MiB", 67_108_864), ("1G", 2**30), ("1GiB", 2**30),
                                     ("1T", 2**40)])
def test_byte_sizes_are_binary(text, n):
    assert parse_bytes(text) == n


@pytest.mark.parametrize("text, why", [("64MB", "ambiguous: MB is 10\\^6 bytes in SI"), ("64KB", "ambiguous"),
                                       ("64kB", "ambiguous"), ("1GB", "ambiguous"), ("64m", "milli"),
                                       ("64Mb", "not a size"), ("0", "not a size"), ("\uff18M", "not a size"),
                                       ("64Mi", "not a size")])
def test_byte_sizes_refuse_ambiguous_and_milli(text, why):
    with pytest.raises(LmcostError, match=f"^--bytes: .*{why}"):
        parse_bytes(text)


@pytest.mark.parametrize("text, seconds", [("800ns", 800e-9), ("1ns", 1e-9), ("250us", 250e-6), ("250\u00b5s", 250e-6),
                                           ("50ms", 0.05), ("0.2s", 0.2), ("2E-3s", 2e-3), (" 5 ms ", 5e-3)])
def test_durations_take_si_units(text, seconds):
    assert parse_duration(text, "--ttft") == pytest.approx(seconds, rel=1e-15)


@pytest.mark.parametrize("text, why", [("50MS", "has the unit 'MS'"), ("50Ms", "has the unit 'Ms'"), ("50MS", "m is milli"),
                                       ("5", "has no unit"), ("1h", "ns, us or µs, ms, s"), ("", "empty"), ("  ", "empty"),
                                       ("\uff15ms", "not a duration"), ("-5ms", "not a duration"), ("2h", "unit 'h'")])
def test_durations_refuse_wrong_case_and_unknown_units(text, why):
    with pytest.raises(LmcostError, match=f"^--ttft: .*{why}"):
        parse_duration(text, "--ttft")


def test_an_empty_slo_is_refused_not_dropped(run):
    one_error(run("plan", "llama-3-8b", "--ttft", ""), "error: --ttft: empty;")
    one_error(run("plan", "llama-3-8b", "--tpot", "50MS"), "error: --tpot: '50MS' has the unit 'MS'")


@pytest.mark.parametrize("text, why", [("none,silu_mul", "gives none \\(no fusion\\) with others"),
                                       ("none,none", "with others"), ("silu_mul,silu_mul", "gives silu_mul twice"),
                                       ("vllm,qkv", "gives qkv twice"), ("default,silu_mul", "silu_mul twice"),
                                       ("vllm,all", "silu_mul twice \\(all includes it\\)")])
def test_a_fusion_given_twice_or_beside_none_is_refused(text, why):
    with pytest.raises(LmcostError, match=f"^fusion: .*{why}"):
        parse_fusion(text)


def test_presets_combine_with_other_fusions():
    assert parse_fusion("default,qkv") == ("silu_mul", "qkv") and parse_fusion("qkv,gate_up") == ("qkv", "gate_up")
    assert parse_fusion("all") == FUSIONS


@pytest.mark.parametrize("seconds, shown", [(999.4, "999 s"), (999.6, "1,000 s"), (1234.5, "1,230 s"),
                                            (42_249, "42,200 s"), (8.8e6, "8,800,000 s"), (9.996e6, "1.00e7 s"),
                                            (3.1e22, "3.10e22 s"), (5.19e-3, "5.19 ms")])
def test_long_times_never_use_ks_or_Ms(seconds, shown):
    # 3 significant figures, as every time shown; "Ms" (megaseconds) would read as milliseconds.
    assert si(seconds, "s") == shown


def test_a_billion_sequences_print_seconds_not_megaseconds(run):
    code, out, _ = run("estimate", "llama-3-8b", "--batch", 1_000_000_000)
    line = next(t for t in out.splitlines() if "TTFT" in t)
    assert " Ms" not in line and " ks" not in line and line.split("TTFT ")[1].split()[1] == "s"


def test_version_takes_nothing_else(run):
    one_error(run("--version", "extra"), "error: --version: takes nothing else, given 'extra'")
    assert run("--version")[0] == 0


@pytest.mark.parametrize("args, field", [(["kv", "llama-3-8b", "--plot", ""], "--plot"),
                                         (["roofline", "llama-3-8b", "-o", ""], "-o/--output"),
                                         (["report", "llama-3-8b", "--output", ""], "-o/--output")])
def test_an_empty_output_path_names_its_option(run, args, field):
    one_error(run(*args), f"error: {field}: empty; give a path")


@pytest.mark.parametrize("name", ["rep.html", "rep.HTM", "summary.json"])
def test_a_report_is_a_folder_not_an_html_file(run, tmp_path, name):
    r = run("report", "llama-3-8b", "-o", tmp_path / name)
    one_error(r, f"error: -o: {tmp_path / name} names a file; a report is a folder")
    assert not (tmp_path / name).exists()


@pytest.mark.torch
@pytest.mark.parametrize("name, ok", [("x.json", True), ("x.txt", False), ("x.json.gz", False), ("trace", False)])
def test_a_profile_trace_is_named_json(tmp_path, name, ok):
    from lmcost.profiling.evaluate import check_profile_outputs

    if ok:
        check_profile_outputs(tmp_path / name, tmp_path / "o.csv")
    else:
        with pytest.raises(LmcostError, match="^trace: the trace is written as plain Chrome trace JSON"):
            check_profile_outputs(tmp_path / name, tmp_path / "o.csv")


class _Full(io.TextIOBase):
    """A stderr like 2>/dev/full: every write fails with ENOSPC."""

    def write(self, s):
        raise OSError(errno.ENOSPC, "No space left on device")


def _closed():
    s = io.StringIO()
    s.close()
    return s


@pytest.mark.parametrize("stream", [_Full, _closed], ids=["full", "closed"])
@pytest.mark.parametrize("argv", [["estimate", "llama-3-8b", "--gpu", "h999"], ["estimate", "llama-3-8b", "--bogus"],
                                  ["--version", "extra"]], ids=["library", "usage", "version"])
def test_bad_input_exits_2_whatever_stderr_takes(monkeypatch, stream, argv):
    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost", *argv])
    monkeypatch.setattr(sys, "stderr", stream())
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2


@pytest.mark.parametrize("text", ["0.5ns", "1e-12s", "2h"])
def test_a_duration_below_a_nanosecond_or_past_an_hour_is_refused(text):
    # 1 ns .. 1 h (3600 s): below a nanosecond no GPU event is timed; an SLO of 1 fs made every point miss
    with pytest.raises(LmcostError, match="out of range|unit"):
        parse_duration(text, "ttft")
    assert parse_duration("1ns", "ttft") == 1e-9


@pytest.mark.parametrize("name, said", [("", "empty"), ("../../evil", "holds '/'"), ("a\\b", "holds '\\\\'"),
                                        ("x\u202ey", "holds '\\u202e'"), ("x" * 101, "101 characters")])
def test_a_gpu_name_must_be_a_printable_name(name, said):
    # A GPU YAML's name is printed in every table and names fit --out's files: '' printed "on : batch 1",
    # U+202E reversed the terminal's line, '/' made a path. The message shows the character as ascii() does.
    from importlib.resources import files

    import yaml
    from pydantic import ValidationError

    from lmcost.hardware.gpu import GPU

    data = yaml.safe_load((files("lmcost") / "data" / "gpus" / "h100-sxm.yaml").read_text())
    with pytest.raises(ValidationError) as e:
        GPU(**{**data, "name": name})
    assert e.value.errors()[0]["loc"] == ("name",) and said in e.value.errors()[0]["msg"]
    assert GPU(**{**data, "name": "my h100"}).name == "my h100"


def test_a_closed_pipe_after_the_first_line_exits_0(tmp_path):
    # `lmcost estimate ... | head -1`: rich's console exits 1 on a broken pipe; the reader leaving is not
    # an error (exit 0, as `gpus list | head` already did).
    import subprocess

    p = subprocess.Popen([sys.executable, "-m", "lmcost", "estimate", "llama-3-8b", "--gpu", "h100"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    assert p.wait(timeout=60) == 0 and p.stderr.read() == b""
