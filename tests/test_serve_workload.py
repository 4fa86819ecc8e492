"""Serving workloads (lmcost/apps/serve_workload.py): generated lengths and arrivals against their closed forms,
reproducibility per seed, JSONL replay, and every refusal naming its field.

Tolerances: a sample mean of n draws has standard error sd / sqrt(n); each check allows 5 standard errors (a
false failure once in 1.7 million runs; the seeds are fixed, so a run is deterministic anyway)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from lmcost.apps import serve_workload as sw
from lmcost.apps.serve_workload import Requests, datasets, lengths, make_requests, read_requests
from lmcost.basics.errors import LmcostError

N = 100_000


def _draw(spec: str, field: str = "workload.prompt", n: int = N) -> np.ndarray:
    return lengths(spec, n, np.random.default_rng(7), field)


def test_fixed_and_uniform():
    assert _draw("1024", n=5).tolist() == [1024] * 5
    x = _draw("uniform:100:300")
    # discrete uniform on 100..300: mean (100 + 300) / 2 = 200, variance ((301 - 100)^2 - 1) / 12 = 3366.7, sd 58.0;
    # SE 58.0 / sqrt(1e5) = 0.18, 5 SE = 0.92; both ends drawn
    assert abs(x.mean() - 200) < 0.92 and x.min() == 100 and x.max() == 300 and x.dtype == np.int64


def test_normal_mean():
    # normal:500:50: clipping at 1 cuts 10 sd below the mean (nothing); rounding is unbiased. SE 50 / sqrt(1e5) = 0.16
    x = _draw("normal:500:50")
    assert abs(x.mean() - 500) < 5 * 50 / math.sqrt(N) and abs(x.std() - 50) < 0.5
    assert _draw("normal:2:100").min() == 1  # clipped to >= 1


def test_lognormal_mean():
    # lognormal:1000:0.5: mean = median * exp(sigma^2 / 2) = 1000 * exp(0.125) = 1133.15;
    # sd = mean * sqrt(exp(sigma^2) - 1) = 1133.15 * 0.5329 = 603.9; SE 603.9 / sqrt(1e5) = 1.91, 5 SE = 9.5
    x = _draw("lognormal:1000:0.5")
    assert abs(x.mean() - 1000 * math.exp(0.125)) < 9.5
    assert abs(np.median(x) - 1000) < 10  # the median is the spec's


def test_dataset_shapes_keep_their_published_means():
    # sharegpt: mean input 161.31, output 337.99 tokens (Kwon et al. 2023, Fig. 11a), lognormal sigma 1 (assumed),
    # so median = mean * exp(-1/2). sd = mean * sqrt(e - 1) = 1.311 mean; 5 SE = 5 * 1.311 * mean / sqrt(1e5) = 2.07%
    # of the mean (rounding and the clip at 1, 5.3 sd below the log-mean, move it by far less)
    assert set(datasets()) >= {"sharegpt", "alpaca"} and all(d.source for d in datasets().values())
    for field, mean in (("workload.prompt", 161.31), ("workload.output", 337.99)):
        x = _draw("sharegpt", field)
        assert abs(x.mean() / mean - 1) < 0.0207, field
        assert abs(np.median(x) - mean * math.exp(-0.5)) < 2, field


def test_poisson_gaps():
    # exponential gaps at 4 requests/s: mean 1/4 s, CV 1 (sd = mean). SE of the mean 0.25 / sqrt(1e5) = 0.00079;
    # the sample CV's SE ~ sqrt((kurtosis 9 - 1) / (4 n)) = 0.0045, 5 SE = 0.022
    r = make_requests(N, prompt="10", output="10", rate=4.0, seed=1)
    gaps = np.diff(r.arrival_s)
    assert r.arrival_s[0] == 0 and abs(gaps.mean() - 0.25) < 5 * 0.00079 and abs(gaps.std() / gaps.mean() - 1) < 0.022


def test_gamma_gaps():
    # gamma:2 at rate 2: shape k = 1 / CV^2 = 0.25, scale 1 / (rate k) = 2, mean k * scale = 0.5 s, sd sqrt(k) * scale
    # = 1 (CV 2). SE of the mean 1 / sqrt(2e5) = 0.0022; the CV's SE ~ CV * sqrt((kurtosis 27 - 1) / (4 n)) = 0.023
    # at n = 2e5 (plus the mean's share), 0.12 covers 5 SE
    r = make_requests(2 * N, prompt="10", output="10", rate=2.0, arrival="gamma:2", seed=3)
    gaps = np.diff(r.arrival_s)
    assert abs(gaps.mean() - 0.5) < 5 * 0.0022 and abs(gaps.std() / gaps.mean() - 2) < 0.12


def test_gamma_at_its_bounds_draws_finite_gaps():
    # CV 0.01: k = 1e4, gaps within 1% sd of 1/rate (sample CV 0.01, its SE ~ 0.01 / sqrt(2 n) = 7e-5 at n = 1e4);
    # CV 100 (k = 1e-4) at the highest rate, and 0.01 at the lowest over few requests: every gap finite and >= 0
    gaps = np.diff(make_requests(10_001, prompt="10", output="10", rate=1.0, arrival="gamma:0.01").arrival_s)
    assert abs(gaps.mean() - 1) < 5 * 0.01 / 100 and abs(gaps.std() / gaps.mean() - 0.01) < 5 * 7e-5
    for rate, cv, n in ((sw.MAX_RATE, 100, 10_000), (sw.MIN_RATE, 0.01, 100), (sw.MIN_RATE, 100, 100)):
        t = make_requests(n, prompt="10", output="10", rate=rate, arrival=f"gamma:{cv}").arrival_s
        assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= 0) and t[-1] <= sw.MAX_ARRIVAL_S


def test_bounds_are_refused_without_numpy_warnings():
    # 1e-320 requests/s once made 1/rate inf and numpy warned on stderr before an error quoting np.float64(inf);
    # CV 1e-300 squared underflows to 0 (a ZeroDivisionError). Each is now one error naming the field.
    import warnings

    cases = ((dict(rate=1e-320), "workload.rate", "1e-320 requests/s is outside 1e-6 to 1e9"),
             (dict(rate=9.9e-7), "workload.rate", "outside 1e-6 to 1e9"),
             (dict(rate=1.1e9), "workload.rate", "outside 1e-6 to 1e9"),
             (dict(rate=1.0, arrival="gamma:1e-300"), "workload.arrival", "CV 1e-300 is outside 0.01 to 100"),
             (dict(rate=1.0, arrival="gamma:0.0099"), "workload.arrival", "outside 0.01 to 100"),
             (dict(rate=1.0, arrival="gamma:101"), "workload.arrival", "outside 0.01 to 100"),
             # 1,000 gaps of mean 1e6 s: the last arrival near 1e9 s, 2,000 past it (float64 spacing there 0.12 us)
             (dict(rate=1e-6, n=2000), "workload.rate", "arrive until 2.02e9 s, past 1e9 s, where float64 resolves"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for kwargs, field, what in cases:
            args = dict(n=10, prompt="16", output="16") | kwargs
            with pytest.raises(LmcostError, match=what) as err:
                make_requests(args.pop("n"), **args)
            assert err.value.field == field
        with pytest.raises(LmcostError) as err:  # inf - inf in the order check: no RuntimeWarning, no np.float64
            Requests(np.array([0.0, np.inf, np.inf]), np.ones(3), np.ones(3))
        assert "request 1 arrives at inf s" in err.value.what
        with pytest.raises(LmcostError, match="the last request arrives at 1e30 s, past 1e9 s"):
            Requests(np.array([0.0, 1e30]), np.ones(2), np.ones(2))
    assert Requests(np.array([0.0, 1e9]), np.ones(2), np.ones(2)).n == 2


def test_token_figures_take_count_suffixes():
    # the count parser of every count option (lmcost.basics.counts): k = 1024, M = 1024^2; no 1e3 or 1_000
    assert _draw("8k", n=3).tolist() == [8192] * 3 and _draw(" 1M ", n=1).tolist() == [2**20]
    x = _draw("uniform:1k:2k", n=1000)
    assert x.min() >= 1024 and x.max() <= 2048
    assert _draw("normal:1k:0", n=3).tolist() == [1024] * 3 and abs(np.median(_draw("lognormal:1k:0.5")) - 1024) < 10
    for spec, what in (("1e3", "'1e3' is not a whole number"), ("1_000", "'1_000' is not a whole number"),
                       ("8m", "lowercase m"), ("uniform:1e3:2e3", "LO '1e3' of"), ("normal:500:1.5", "SD '1.5' of"),
                       ("uniform:2k:1k", "LO 2,048 is above HI 1,024")):
        with pytest.raises(LmcostError, match=what):
            _draw(spec, n=1)


@pytest.mark.parametrize("spec, wrong, right", [("lognormal:1000:5", "SIGMA '5'", "MEDIAN"),
                                                ("lognormal:0:1", "MEDIAN 0", "SIGMA")])
def test_a_length_spec_names_only_the_part_that_is_wrong(spec, wrong, right):
    with pytest.raises(LmcostError) as err:
        _draw(spec, n=1)
    assert wrong in err.value.what and right not in err.value.what


def test_offline_and_closed_loop():
    r = make_requests(10, prompt="uniform:1:9", output="5", arrival="offline")
    assert r.arrival_s.tolist() == [0.0] * 10 and r.concurrency is None and r.n == 10
    c = make_requests(10, prompt="8", output="5", concurrency=4)
    assert c.concurrency == 4 and not c.arrival_s.any()


def test_reproducible_per_seed():
    a, b, c = (make_requests(1000, prompt="sharegpt", output="sharegpt", rate=3.0, arrival="gamma:1.5", seed=s)
               for s in (5, 5, 6))
    assert all(np.array_equal(getattr(a, k), getattr(b, k)) for k in ("arrival_s", "prompt", "output"))
    assert not np.array_equal(a.prompt, c.prompt) and not np.array_equal(a.arrival_s, c.arrival_s)


@pytest.mark.parametrize("kwargs, field", [
    (dict(rate=0.0), "workload.rate"),
    (dict(rate=-1.0), "workload.rate"),
    (dict(rate=float("nan")), "workload.rate"),
    (dict(rate=float("inf")), "workload.rate"),
    (dict(rate=True), "workload.rate"),
    (dict(rate=None), "workload.rate"),  # poisson with no rate
    (dict(rate=1.0, arrival="offline"), "workload.rate"),
    (dict(rate=1.0, arrival="weibull"), "workload.arrival"),
    (dict(rate=1.0, arrival="gamma:0"), "workload.arrival"),
    (dict(rate=1.0, arrival="gamma:x"), "workload.arrival"),
    (dict(rate=1.0, concurrency=4), "workload.concurrency"),
    (dict(concurrency=0), "workload.concurrency"),
    (dict(concurrency=4, arrival="gamma:2"), "workload.concurrency"),
    (dict(rate=1.0, n=0), "workload.n"),
    (dict(rate=1.0, n=sw.MAX_REQUESTS + 1), "workload.n"),
    (dict(rate=1.0, seed=-1), "workload.seed"),
    (dict(rate=1.0, prompt="abc"), "workload.prompt"),
    (dict(rate=1.0, prompt="0"), "workload.prompt"),
    (dict(rate=1.0, prompt="12.5"), "workload.prompt"),
    (dict(rate=1.0, prompt=""), "workload.prompt"),
    (dict(rate=1.0, prompt="uniform:5:3"), "workload.prompt"),
    (dict(rate=1.0, prompt="uniform:0:3"), "workload.prompt"),
    (dict(rate=1.0, prompt="uniform:1.5:3"), "workload.prompt"),
    (dict(rate=1.0, prompt="normal:100"), "workload.prompt"),
    (dict(rate=1.0, prompt="normal:0.5:1"), "workload.prompt"),
    (dict(rate=1.0, output="lognormal:100:-1"), "workload.output"),
    (dict(rate=1.0, output="lognormal:100:5"), "workload.output"),
    (dict(rate=1.0, output="lognormal:1e99:1"), "workload.output"),
])
def test_generation_refusals(kwargs, field):
    args = dict(n=10, prompt="16", output="16") | kwargs
    with pytest.raises(LmcostError) as err:
        make_requests(args.pop("n"), **args)
    assert err.value.field == field


def _write(tmp_path, lines) -> str:
    path = tmp_path / "req.jsonl"
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return str(path)


def test_replay(tmp_path):
    path = _write(tmp_path, [{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}, "",
                             {"arrival_s": 0.5, "prompt_tokens": 7, "output_tokens": 1},
                             {"output_tokens": 3, "prompt_tokens": 9, "arrival_s": 0.5}])
    r = read_requests(path)
    assert r.arrival_s.tolist() == [0, 0.5, 0.5] and r.prompt.tolist() == [5, 7, 9] and r.output.tolist() == [2, 1, 3]
    assert r.prompt.dtype == np.int64 and r.arrival_s.dtype == np.float64


GOOD = {"arrival_s": 1.0, "prompt_tokens": 5, "output_tokens": 2}


@pytest.mark.parametrize("line, field, what", [
    (GOOD | {"arrival_s": 0.5}, "line 2: arrival_s", "before the line above"),
    (GOOD | {"arrival_s": -1.0}, "line 2: arrival_s", "not a time"),
    ('{"arrival_s": NaN, "prompt_tokens": 5, "output_tokens": 2}', "line 2: arrival_s", "not a time"),
    (GOOD | {"prompt_tokens": 2.5}, "line 2: prompt_tokens", "not a whole number"),
    (GOOD | {"prompt_tokens": 5.0}, "line 2: prompt_tokens", "not a whole number"),
    (GOOD | {"prompt_tokens": "5"}, "line 2: prompt_tokens", "not a whole number"),
    (GOOD | {"output_tokens": 0}, "line 2: output_tokens", "not a whole number"),
    (GOOD | {"output_tokens": True}, "line 2: output_tokens", "not a whole number"),
    ({"arrival_s": 1.0, "prompt_tokens": 5}, "line 2: output_tokens", "missing"),
    (GOOD | {"model": "x", "id": 3}, "line 2", "unknown keys 'id', 'model'"),
    ("[1, 2, 3]", "line 2", "not a JSON object"),
    ("[" * 100_000, "line 2", "nested deeper than 32 levels"),  # once a RecursionError
    ('{"a": ' * 1000 + "1" + "}" * 1000, "line 2", "nested deeper than 32 levels"),
    ('{"arrival_s": 1.0, "prompt_tokens": 5, "prompt_tokens": 6, "output_tokens": 2}', "line 2: prompt_tokens",
     "given twice"),
    ('{"arrival_s": 1.0, "prompt_tokens": 1e3, "output_tokens": 2}', "line 2: prompt_tokens", "a JSON integer"),
    (GOOD | {"arrival_s": 1e30}, "line 2: arrival_s", "past 1e9 s, where float64 resolves 0.1 us"),
    ("{arrival_s: 1}", "line 2", "not valid JSON"),
])
def test_replay_refusals(tmp_path, line, field, what):
    path = _write(tmp_path, [GOOD | {"arrival_s": 0.9}, line])
    with pytest.raises(LmcostError, match=what) as err:
        read_requests(path)
    assert err.value.field == f"{path}: {field}"


def test_replay_file_refusals(tmp_path, monkeypatch):
    path = _write(tmp_path, ["", "  "])
    with pytest.raises(LmcostError, match="holds no requests"):
        read_requests(path)
    monkeypatch.setattr(sw, "MAX_REQUESTS", 2)  # the bound itself, not 10 million lines
    with pytest.raises(LmcostError, match="more than 2 requests") as err:
        read_requests(_write(tmp_path, [GOOD] * 3))
    assert err.value.field == str(tmp_path / "req.jsonl")
    with pytest.raises(LmcostError, match="no such file"):
        read_requests(tmp_path / "missing.jsonl")


def test_requests_checked_when_built():
    ok = dict(arrival_s=np.zeros(2), prompt=np.array([1, 2]), output=np.array([3, 4]))
    for change, field in ((dict(arrival_s=np.array([1.0, 0.5])), "workload.arrival_s"),
                          (dict(arrival_s=np.array([-1.0, 0.0])), "workload.arrival_s"),
                          (dict(arrival_s=np.zeros(0), prompt=np.zeros(0), output=np.zeros(0)), "workload.arrival_s"),
                          (dict(prompt=np.array([1, 0])), "workload.prompt"),
                          (dict(output=np.array([1.5, 2.0])), "workload.output"),
                          (dict(output=np.array([1, 2, 3])), "workload.output"),
                          (dict(concurrency=0), "workload.concurrency")):
        with pytest.raises(LmcostError) as err:
            Requests(**(ok | change))
        assert err.value.field == field
    r = Requests(**(ok | dict(output=np.array([1.0, 2.0]))))
    assert r.output.dtype == np.int64 and r.output.tolist() == [1, 2]
