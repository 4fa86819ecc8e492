"""``lmcost serve``: its JSON is the library's (:func:`lmcost.apps.serve.run_serve`) for the request the flags
spell, a sweep has one entry per rate, bad and meaningless inputs are one line naming the flag (exit 2), the
human output says the setup, the percentiles and a saturated queue, and the figures draw what they should
(tests/figure_checks.py)."""

from __future__ import annotations

import contextlib
import json
import sys

import pytest
from typer.testing import CliRunner

from figure_checks import drawn, problems
from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.cli import app
from lmcost.output.render import to_json

runner = CliRunner()
#: The cheapest run: 50 requests of a small model.
BASE = ["serve", "tiny-gqa", "--requests", "50", "--prompt", "256", "--output", "32"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def as_json(result) -> dict:
    """A run's JSON as ``--json`` prints it (numpy numbers as Python's, through the same writer)."""
    return json.loads(to_json(result.to_dict()))


def test_json_is_the_librarys_for_the_same_request():
    r = run("serve", "llama-3-8b", "--requests", "50", "--rate", "4", "--arrival", "gamma:2", "--seed", "3",
            "--slo-ttft", "200ms", "--slo-tpot", "40ms", "--max-num-seqs", "64", "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    lib = run_serve(ServeRequest(model="llama-3-8b", requests=50, rate=4.0, arrival="gamma:2", seed=3,
                                 slo_ttft_s=0.2, slo_tpot_s=0.04, max_num_seqs=64))
    assert data == as_json(lib)
    for key in ("throughput", "ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s", "goodput"):
        assert key in data, key
    assert set(data["throughput"]) >= {"requests_per_s", "input_tokens_per_s", "output_tokens_per_s",
                                       "output_tokens_per_s_per_gpu"}
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(data[key]) >= {"p50", "p90", "p99"}, key
    # the flags as typed: 200ms and 40ms in seconds, the knob overriding vLLM's default of 1,024
    assert (data["goodput"]["slo_ttft_s"], data["goodput"]["slo_tpot_s"]) == (0.2, 0.04)
    assert data["settings"]["max_num_seqs"] == 64 and data["requests"] == 50 and data["rate"] == 4.0


def test_offline_by_default_and_a_closed_loop():
    # No rate, no concurrency: every request at t = 0 (offline), as ServeRequest documents it; 1,024-token
    # prompts and 256-token outputs (the defaults the help states).
    r = run("serve", "tiny-gqa", "--requests", "20", "--json")
    lib = run_serve(ServeRequest(model="tiny-gqa", requests=20))
    assert r.exit_code == 0 and json.loads(r.stdout) == as_json(lib)
    assert json.loads(r.stdout)["throughput"]["input_tokens_per_s"] * 256 == pytest.approx(
        json.loads(r.stdout)["throughput"]["output_tokens_per_s"] * 1024)
    r = run(*BASE, "--concurrency", "4", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["concurrency"] == 4


def test_a_sweep_has_one_entry_per_rate_and_one_csv_row_each():
    r = run(*BASE, "--rates", "2,50,8", "--json")
    assert r.exit_code == 0, r.stderr
    sweep = json.loads(r.stdout)["sweep"]
    assert [s["rate"] for s in sweep] == [2.0, 50.0, 8.0]
    r = run(*BASE, "--rates", "2,8", "--csv")
    lines = r.stdout.strip().splitlines()
    assert r.exit_code == 0 and len(lines) == 3 and lines[0].startswith("rate,requests,arrival_rate,throughput.requests_per_s")


def test_counts_take_suffixes_as_every_count_option():
    # 1k = 1024 in the length spec and the knobs, as --requests and estimate --prompt take it
    r = run("serve", "tiny-gqa", "--requests", "20", "--prompt", "1k", "--output", "32", "--max-num-seqs", "1k",
            "--concurrency", "4", "--json")
    lib = run_serve(ServeRequest(model="tiny-gqa", requests=20, prompt="1024", output="32", max_num_seqs=1024,
                                 concurrency=4))
    got, want = json.loads(r.stdout), as_json(lib)
    # the workload block records the specs as given ("1k" and "1024"); every figure is the same
    assert r.exit_code == 0 and got.pop("workload")["prompt"] == "1k" and want.pop("workload")["prompt"] == "1024"
    assert got == want, r.stderr


def test_a_sweep_table_lists_the_rates_ascending():
    # --rates 8,2: the table (and the figure, tests below) by ascending rate; the JSON keeps the order given
    r = run(*BASE, "--rates", "8,2")
    rows = [ln.split("│")[1].strip() for ln in r.stdout.splitlines() if ln.count("│") > 5]
    assert r.exit_code == 0 and rows == ["2", "8"], r.stdout


def test_a_status_line_off_a_terminal_as_every_command(monkeypatch):
    # the house rule (lmcost.cli.app.status_line, as estimate and plan): off a terminal, plain lines on stderr once
    # a run takes PROGRESS_AFTER_S (0 here), none before it; --json's stdout stays one JSON document
    import importlib

    cli_app = importlib.import_module("lmcost.cli.app")
    monkeypatch.setattr(cli_app, "PROGRESS_AFTER_S", 0.0)
    r = run(*BASE, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["requests"] == 50
    assert r.stderr == "lmcost: serving tiny-gqa on h100 (0 s)\n"
    monkeypatch.setattr(cli_app, "PROGRESS_AFTER_S", 3600.0)
    r = run(*BASE, "--json")
    assert r.exit_code == 0 and r.stderr == ""


def test_a_workload_file_is_replayed(tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 20}\n'
                 '{"arrival_s": 0.5, "prompt_tokens": 300, "output_tokens": 5}\n')
    r = run("serve", "tiny-gqa", "--workload", f, "--json")
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["requests"] == 2
    # 400 prompt and 25 output tokens over the same span
    assert data["throughput"]["input_tokens_per_s"] / data["throughput"]["output_tokens_per_s"] == pytest.approx(16)


@pytest.mark.parametrize("args, field", [
    (["--rate", "0"], "--rate"),
    (["--rate", "-1"], "--rate"),
    (["--rate", "nan"], "--rate"),
    (["--rate", "inf"], "--rate"),
    (["--concurrency", "0"], "--concurrency"),
    (["--rate", "2", "--concurrency", "4"], "--concurrency"),
    (["--rates", "1,0"], "--rates"),
    (["--rates", "2,2"], "--rates"),
    (["--rates", "1,2", "--rate", "3"], "--rate"),
    (["--arrival", "gamma:2"], "--arrival"),                   # offline: no arrival process
    (["--concurrency", "4", "--arrival", "poisson"], "--arrival"),
    (["--rate", "1", "--arrival", "bogus"], "--arrival"),
    (["--engine", "bogus"], "--engine"),
    (["--prompt", "bogus"], "--prompt"),
    (["--output", "0"], "--output"),
    (["--seed", "-1"], "--seed"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["--block-size", "0"], "--block-size"),
    (["--memory-fraction", "0"], "--memory-fraction"),
    (["--memory-fraction", "nan"], "--memory-fraction"),
    (["--memory-fraction", "1.5"], "--memory-fraction"),
    (["--slo-ttft", "5"], "--slo-ttft"),
    (["--slo-tpot", "0ms"], "--slo-tpot"),
    (["--no-chunked-prefill", "--prompt", "100000"], "--prompt"),  # over vLLM's 8,192-token budget
    (["--rate", "1e-320"], "--rate"),              # 1/rate overflowed to inf (numpy warnings, np.float64(inf))
    (["--rates", "1e-320,1"], "--rates"),
    (["--rate", "1e-30"], "--rate"),               # TTFT p50 0 s: arrivals past float64's resolution
    (["--rate", "10", "--arrival", "gamma:1e-300"], "--arrival"),  # a ZeroDivisionError
    (["--rate", "5_0"], "--rate"),                 # Python's float takes 5_0; counts never took 1_000
    (["--rates", "1,5_0"], "--rates"),
    (["--memory-fraction", "0_5"], "--memory-fraction"),
    (["--rate", "1", "--arrival", ""], "--arrival"),  # empty: once taken for the default, poisson
    (["--prompt", ""], "--prompt"),
    (["--prompt", "uniform:1e3:2e3"], "--prompt"),  # a float where a whole number is meant
    (["--prompt", "lognormal:1000:5"], "--prompt"),
])
def test_bad_inputs_are_one_line_naming_the_flag(args, field):
    r = run(*BASE[:2], "--requests", "20", *args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}: "), r.stderr
    assert "; " in lines[0] and r.stdout == "" and "np.float64" not in lines[0] and "Warning" not in r.stderr


def test_a_rate_list_that_is_not_numbers_is_a_usage_error(monkeypatch, capsys):
    # parsed by the option (a usage error, rendered by the entry point as the user sees it)
    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost", *BASE, "--rates", "1,x"])
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: --rates: '1,x' is not a list of numbers")


@pytest.mark.parametrize("flag, value", [("--prompt", "128"), ("--output", "16"), ("--requests", "10"),
                                         ("--rate", "2"), ("--rates", "1,2"), ("--arrival", "poisson"),
                                         ("--concurrency", "4"), ("--seed", "1")])
def test_a_workload_file_takes_no_generator_flag(tmp_path, flag, value):
    f = tmp_path / "w.jsonl"
    f.write_text('{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 20}\n')
    r = run("serve", "tiny-gqa", "--workload", f, flag, value)
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {flag}: has no effect with --workload"), r.stderr


def test_a_missing_workload_file_names_it(tmp_path):
    r = run("serve", "tiny-gqa", "--workload", tmp_path / "none.jsonl")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {tmp_path / 'none.jsonl'}: ")


def test_human_output_says_the_setup_percentiles_and_saturation():
    # 50 requests at 1,000/s on one H100: llama-3-8b serves far fewer (each 1,024-token prefill alone takes
    # tens of ms), so the queue grows and the run says so.
    r = run("serve", "llama-3-8b", "--requests", "50", "--rate", "1000", "--slo-ttft", "100ms")
    assert r.exit_code == 0, r.stderr
    text = r.stdout
    for part in ("llama-3-8b", "h100-sxm", "vllm 0.11", "max_num_seqs 1024", "token budget 8,192",
                 "chunked prefill on", "Throughput", "output tokens/s per GPU", "TTFT", "TPOT", "ITL", "E2E",
                 "p99", "goodput:", "meet TTFT <= 100 ms", "preemptions", "saturated: the queue grows"):
        assert part in text, part
    # tiny-gqa keeps up with 1,000/s (TTFT in microseconds); llama-3-8b, as above, does not
    r = run(*BASE, "--rates", "1000")
    assert r.exit_code == 0 and "Rate sweep" in r.stdout and "saturated from" not in r.stdout
    r = run("serve", "llama-3-8b", "--requests", "50", "--rates", "2,1000")
    assert r.exit_code == 0 and "saturated from 1000 requests/s" in r.stdout


def test_progress_names_the_requests_and_the_rate(monkeypatch):
    said = []

    class Status:
        def update(self, text):
            said.append(text)

    monkeypatch.setattr("lmcost.cli.serve.status_line", lambda text: contextlib.nullcontext(Status()))
    r = run(*BASE, "--rates", "2,8", "--json")
    assert r.exit_code == 0
    # 50 requests: progress every 50 // 100 -> 1 request (lmcost.apps.serve_sim), each rate in turn
    assert said[0] == "serving tiny-gqa on h100: 1 of 50 requests (rate 2/s, 1 of 2)"
    assert said[-1] == "serving tiny-gqa on h100: 50 of 50 requests (rate 8/s, 2 of 2)"


def test_the_plot_is_written_and_draws_cleanly(tmp_path):
    pytest.importorskip("plotly")
    from lmcost.output.plots import serve_sweep_figure, serve_timeline_figure

    for args, name in ((["--rates", "1,4,16,1000", "--slo-ttft", "50ms", "--slo-tpot", "5ms"], "sweep.html"),
                       (["--rate", "4"], "run.html")):
        r = run(*BASE, *args, "--plot", tmp_path / name)
        assert r.exit_code == 0 and r.stderr.startswith("wrote "), r.stderr
        assert "<html>" in (tmp_path / name).read_text()
    # roofline times (no engine overheads): TTFT spans microseconds at 1/s to a queue at 1000/s, past a decade
    res = run_serve(ServeRequest(model="tiny-gqa", requests=50, prompt="256", output="32", rates=(1.0, 4.0, 1000.0),
                                 slo_ttft_s=0.05, time_model="roofline"))
    sweep = serve_sweep_figure(res.runs, "t", 0.05, None)
    assert problems(drawn(sweep)) == []
    assert sweep.layout.yaxis.type == "log" and [t.name for t in sweep.data] == ["TTFT p50", "TTFT p99", "TTFT SLO 50 ms",
                                                                                 "TPOT p50", "TPOT p99"]
    assert problems(drawn(serve_timeline_figure(res.trace.kv_timeline, "t"))) == []
    # rates 1 to 1,000 span three decades: a log x axis; 2 and 8 (given as 8,2) within one: linear, ascending
    assert sweep.layout.xaxis.type == "log" and list(sweep.data[0].x) == [1.0, 4.0, 1000.0]
    narrow = serve_sweep_figure([res.runs[1] | dict(rate=8.0), res.runs[0] | dict(rate=2.0)], "t")
    assert narrow.layout.xaxis.type == "linear" and list(narrow.data[0].x) == [2.0, 8.0]
    assert problems(drawn(narrow)) == []
