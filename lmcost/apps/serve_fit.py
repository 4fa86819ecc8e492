"""Fitting an engine's figures on measured serving points, and evaluating them on points left out.

The data: ``lmcost/data/measurements/serving-silicon.csv`` (aiconfigurator-core 0.12.0's measured
TTFT/TPOT of TensorRT-LLM, vLLM and SGLang at a fixed concurrency, converted by
``benchmarks/convert_silicon.py``; its header cites the source). Each point is a closed loop of
``concurrency`` users sending ``isl``-token prompts for ``osl`` tokens; lmcost simulates it
(:func:`lmcost.apps.serve.run_once`) and compares mean TTFT and mean TPOT.

The fitted figures, per engine (all its versions pooled; never per model or GPU), are the engine's
step time against the cost model's: a factor per group of operator classes (``time_scales``: GEMMs,
attention, collectives, small kernels; :data:`lmcost.cost.engine_step.GROUPS`) and the CPU time per
step and per scheduled sequence (``step_overhead_us``, ``seq_overhead_us``). They minimise the sum of
squared log-ratios of predicted to measured TTFT and TPOT by Gauss-Newton: the simulation's sensitivity to
each figure by finite differences (a factor x1.25, an overhead +100 us / +2 us), a bounded linear
least-squares step, re-simulated, a few times. Leave-one-model-out and leave-one-GPU-out refit on the rest
(from the last linearisation) and re-simulate the held-out points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lmcost.apps.serve import ServeRequest, check_requests, prepare, run_once
from lmcost.apps.serve_sim import Knobs
from lmcost.apps.serve_workload import Requests
from lmcost.basics.errors import LmcostError

#: The figures fitted, in order: four factors (fitted in log space) and two overheads (us).
PARAMS = ("gemm.compute", "gemm.memory", "experts.compute", "experts.memory", "attention.compute",
          "attention.memory", "other.memory", "comm", "floor", "step_overhead_us", "seq_overhead_us",
          "request_overhead_us", "prompt_token_overhead_us", "kernel_overhead_us")
_SCALES = PARAMS[:9]
_STEPS = {**{g: 0.25 for g in _SCALES}, "step_overhead_us": 100.0, "seq_overhead_us": 2.0,
          "request_overhead_us": 1000.0, "prompt_token_overhead_us": 1.0, "kernel_overhead_us": 1.0}
#: Bounds, physical: factors 1..20 (the roofline is a lower bound: no kernel beats it); CPU time per step
#: 0..10 ms, per scheduled sequence 0..100 us, per kernel 0..20 us (a launch gap); before a request's first
#: token 0..10 ms (an API server's HTTP handling) and 0..5 us per prompt token (tokenization runs at about a
#: million tokens/s per core). Wider, the fit takes the closed loops' queueing into a per-request constant
#: (90 ms for SGLang unbounded) that a request alone at low load would pay too.
_LO = np.array([0.0] * 9 + [0.0] * 5)
_HI = np.array([math.log(20.0)] * 9 + [1e4, 100.0, 1e4, 5.0, 20.0])


def read_points(path: str | None = None):
    """The measured serving points as a pandas DataFrame (one row per point; the columns of the CSV)."""
    import io

    import pandas as pd

    from lmcost.basics import shipped
    from lmcost.basics.files import read_text
    from lmcost.calibration.measurements import MAX_TABLE_BYTES

    src = path or shipped.folder("measurements") / "serving-silicon.csv"
    return pd.read_csv(io.StringIO(read_text(src, MAX_TABLE_BYTES, "CSV of serving points")), comment="#")


def precision_of(row) -> dict:
    """ServeRequest fields for a point's precision: bf16; fp8 (weights, activations and KV cache); a
    DeepSeek-style block-scaled fp8 (``fp8_block``: the fp8-block128 recipe); fp4 (NVFP4 weights, fp8
    activations: no GPU here has an FP4 peak yet)."""
    prec, gemm = str(row["precision"]), str(row.get("gemm_quant") or "")
    if prec == "fp8":
        return {"dtype": "fp8", "quant": "fp8-block128" if gemm == "fp8_block" else None}
    if prec == "fp4":
        return {"dtype": "fp8", "quant": "nvfp4" if row["model"] != "gpt-oss-120b" else None}
    return {"dtype": "bf16", "quant": None}


def _request(row, engine: str, time_model: str = "calibrated") -> ServeRequest:
    tp, ep, dp = int(row["tp"]), int(row["ep"]), int(row["dp"])
    if dp > 1:  # attention-DP: tp ranks per replica ... the layout's dp replicas each of tp GPUs
        tp = max(1, tp // dp) if tp >= dp else tp
    return ServeRequest(model=row["model"], gpu=row["gpu"], engine=engine, tp=tp, ep=ep, dp=dp, time_model=time_model,
                        **precision_of(row))


@dataclass
class Point:
    """One measured point, ready to simulate."""

    row: dict
    setup: object
    reqs: Requests


def points(df, engine: str, requests_per_user: int = 10, say=None, time_model: str = "calibrated") -> list[Point]:
    """The points of ``df`` (one engine's rows) with their setups (built once per model, GPU, precision and
    layout) and closed-loop workloads of ``requests_per_user`` x concurrency requests (at least 32, at most 4096).
    Rows lmcost cannot cost (a layout that does not split the model, no room for the KV cache) are left
    out and said."""
    setups, out = {}, []
    for _, row in df.iterrows():
        r = _request(row, engine, time_model)
        key = (r.model, r.gpu, r.dtype, r.quant, r.tp, r.ep, r.dp)
        top = int((df["isl"] + df["osl"]).max())
        try:
            if key not in setups:
                setups[key] = prepare(r, max_context=top)
            setup = setups[key]
        except (LmcostError, ZeroDivisionError) as e:
            if say:
                say(f"skip {row['id']} ({key}): {e!r}")
            setups[key] = None
            continue
        if setup is None:
            continue
        try:  # a request that cannot be served alone (its KV cache over the capacity) is not a point
            check_requests(setup, np.array([int(row["isl"])]), np.array([int(row["osl"])]))
        except LmcostError as e:
            if say:
                say(f"skip {row['id']} ({key}): {e!r}")
            continue
        c = int(row["concurrency"])
        n = min(4096, max(32, requests_per_user * c))
        reqs = Requests(arrival_s=np.zeros(n), prompt=np.full(n, int(row["isl"])), output=np.full(n, int(row["osl"])),
                        concurrency=c)
        out.append(Point(row=dict(row), setup=setup, reqs=reqs))
    return out


def _setup_with(setup, theta: np.ndarray):
    """``setup`` with the engine figures ``theta`` (:data:`PARAMS`; factors as logs)."""
    from dataclasses import replace

    scales = {g: math.exp(theta[i]) for i, g in enumerate(_SCALES)}
    knobs = replace(setup.knobs, step_overhead_s=(theta[9] + theta[13] * setup.step.kernels) * 1e-6,
                    seq_overhead_s=theta[10] * 1e-6)
    return replace(setup, step=setup.step.scaled(scales), knobs=knobs)


def simulate_points(pts: list[Point], theta: np.ndarray) -> np.ndarray:
    """Predicted (mean TTFT, mean TPOT) of each point under ``theta``: array [points, 2] (s), over every
    request of the run, the burst that starts a closed loop included (as a benchmark client's means are: a
    run of 10 x concurrency requests from a cold start fits the measured TTFTs better than its steady state
    alone, 26% median error against 34% with the same figures on 56 vLLM points)."""
    out = np.empty((len(pts), 2))
    cache: dict = {}
    for k, p in enumerate(pts):
        s = cache.get(id(p.setup))
        if s is None:
            s = cache[id(p.setup)] = _setup_with(p.setup, theta)
        dp = s.settings.layout.dp
        _, tr = run_once(s, p.reqs, dp=dp)
        skip = 0
        ttft = tr.first_token_s[skip:] - tr.arrival_s[skip:]
        tpot = (tr.finish_s[skip:] - tr.first_token_s[skip:]) / np.maximum(tr.output[skip:] - 1, 1)
        out[k] = ttft.mean() + (theta[11] + theta[12] * p.reqs.prompt[0]) * 1e-6, tpot.mean()
    return out


def _measured(pts) -> np.ndarray:
    return np.array([[p.row["ttft_s"], p.row["tpot_s"]] for p in pts])


#: The soft-L1 loss's scale (log-ratio): residuals beyond ~20% weigh linearly, not quadratically, so a few
#: points the model cannot express (an architecture's kernel the engine lacks) do not set every figure.
_DELTA = 0.2


def _loss(r: np.ndarray) -> float:
    r = r[np.isfinite(r)]
    return float(np.sum(2 * _DELTA ** 2 * (np.sqrt(1 + (r / _DELTA) ** 2) - 1)))


def _solve(y0, J, target, theta0, rows, damping: float = 0.0) -> np.ndarray:
    """The bounded least-squares step of the linearised problem on ``rows`` (a bool mask over points):
    minimise |y0 + J (theta - theta0) - target|^2 over the rows' TTFT and TPOT, theta within bounds
    (projected coordinate descent on the normal equations: six unknowns)."""
    A = J[rows].reshape(-1, len(PARAMS))
    b = (target - y0)[rows].reshape(-1)
    keep = np.isfinite(b) & np.all(np.isfinite(A), axis=1)
    A, b = A[keep], b[keep]
    w = np.sqrt(1 / np.sqrt(1 + (b / _DELTA) ** 2))  # soft-L1 as reweighted least squares at the current point
    A, b = A * w[:, None], b * w
    # column scaling so the overheads (us) and the log-factors are comparable
    col = np.maximum(np.sqrt((A ** 2).sum(axis=0)), 1e-12)
    As = A / col
    H, g = As.T @ As, As.T @ b
    H = H + (1e-6 + damping) * np.diag(np.diag(H) + 1e-12)
    d = np.zeros(len(PARAMS))
    lo, hi = (_LO - theta0) * col, (_HI - theta0) * col
    for _ in range(500):
        for i in range(len(PARAMS)):
            r = g[i] - H[i] @ d + H[i, i] * d[i]
            d[i] = min(hi[i], max(lo[i], r / H[i, i]))
    return theta0 + d / col


def fit(pts: list[Point], theta0: np.ndarray | None = None, iterations: int = 3, say=None) -> dict:
    """Fit :data:`PARAMS` on ``pts`` by Gauss-Newton (module docstring). Returns: dict with ``theta`` (the
    figures: factors, overheads in us), the last linearisation (``y0``, ``J``, ``theta_lin``) for refits on
    subsets, and the fitted predictions ``pred`` [points, 2] (s)."""
    theta = np.zeros(len(PARAMS)) if theta0 is None else theta0.copy()
    target = np.log(_measured(pts))
    base = simulate_points(pts, theta)

    def cost(pred):
        return _loss(np.log(pred) - target)

    best = cost(base)
    damping = 1.0
    for it in range(iterations):
        y0 = np.log(base)
        J = np.empty((len(pts), 2, len(PARAMS)))
        for i, name in enumerate(PARAMS):
            th = theta.copy()
            th[i] += _STEPS[name]
            J[:, :, i] = (np.log(simulate_points(pts, th)) - y0) / _STEPS[name]
        theta_lin = theta
        for _ in range(4):  # Levenberg-Marquardt: a step is kept only if the simulated error falls
            new = _solve(y0, J, target, theta, np.ones(len(pts), dtype=bool), damping)
            pred = simulate_points(pts, new)
            if cost(pred) < best:
                theta, base, best, damping = new, pred, cost(pred), damping / 3
                break
            damping *= 4
        if say:
            err = np.median(np.abs(base / np.exp(target) - 1), axis=0)
            say(f"iteration {it + 1}: median |error| TTFT {err[0]:.1%} TPOT {err[1]:.1%}, {figures(theta)}")
    return {"theta": theta, "y0": y0, "J": J, "theta_lin": theta_lin, "pred": base}


def figures(theta: np.ndarray) -> dict:
    """The fitted figures by name: factors as multipliers, overheads in us."""
    return {**{g: round(math.exp(theta[i]), 4) for i, g in enumerate(_SCALES)},
            "step_overhead_us": round(float(theta[9]), 2), "seq_overhead_us": round(float(theta[10]), 3),
            "request_overhead_us": round(float(theta[11]), 1), "prompt_token_overhead_us": round(float(theta[12]), 4),
            "kernel_overhead_us": round(float(theta[13]), 4)}


def held_out(pts: list[Point], fitted: dict, by: str) -> dict:
    """Leave-one-``by``-out (``model`` or ``gpu``): for each value, the figures refit on the other points (from
    the last linearisation) and the held-out points re-simulated with them. Returns: {value: (figures,
    predicted [points, 2], measured [points, 2])}."""
    target = np.log(_measured(pts))
    keys = np.array([p.row[by] for p in pts])
    out = {}
    for v in sorted(set(keys)):
        rest = keys != v
        if not rest.any():
            continue
        theta = _solve(fitted["y0"], fitted["J"], target, fitted["theta_lin"], rest)
        held = [p for p, k in zip(pts, keys) if k == v]
        out[v] = (figures(theta), simulate_points(held, theta), _measured(held))
    return out
