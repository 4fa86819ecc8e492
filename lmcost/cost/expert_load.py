"""Expert load imbalance of EP serving: the busiest expert-parallel rank's routed rows over the mean, from a
model of how the router spreads tokens over experts, and what redundant experts (EPLB) do to it.

Loads (``spec`` of :func:`expert_shares`, each expert's share p_i of the k x T routed pairs, summing to 1):

- ``uniform``: p_i = 1/E;
- ``zipf:S``: p_i proportional to i^-S (S >= 0; zipf:0 is uniform), each share capped at 1/k (a token picks an
  expert at most once, so an expert gets at most T of the k T pairs; the excess spread over the others);
- ``hot:F``: the hottest expert gets F times the mean share (F from 1 to E/k), the others share the rest alike;
- a number X >= 1: a measured max/mean rank load, used as the imbalance directly.

Imbalance without replicas (:func:`rank_imbalance`): experts sit E/ep to a rank in id order and which ids are
hot is arbitrary, so a rank's load is the sum of m = E/ep shares drawn without replacement. Derivation: its
mean is 1/ep and its variance m s^2 (E - m)/(E - 1) (s^2 the shares' population variance; sampling without
replacement); the ep loads sum to 1, so, taken as normal, they are sigma sqrt(ep/(ep-1)) (Y_r - mean Y) for
iid standard normals Y, whose expected maximum is sigma sqrt(ep/(ep-1)) e(ep), e(n) = E[max of n standard
normals] (integrated numerically): 1 + ep sigma sqrt(ep/(ep-1)) e(ep) over the mean. Where one expert dominates
(few experts per rank, a steep skew) the normal misses the tail; the rank holding the hottest expert (share
p_1) then bounds it from below: ep (p_1 + (m - 1)(1 - p_1)/(E - 1)) on average. The imbalance is the larger of
the two, at most ep: a Monte Carlo of random placements checks it within 5% (tests/test_wide_ep.py). It is the
imbalance of the expected loads: the sampling noise of a finite batch (which routed rows a step's tokens
happen to pick) is not included, so ``uniform`` is 1, lmcost's default.

Redundant experts (:func:`eplb_imbalance`): DeepSeek's EPLB (DeepSeek-V3 technical report, section 3.4;
github.com/deepseek-ai/eplb, ``replicate_experts`` and ``balanced_packing``): each of the N extra slots goes to
the expert of the largest load per replica, then replicas are packed heaviest first onto the lightest rank
that has a slot left ((E + N) / ep slots each). The loads are known (EPLB places from measured statistics),
so the result is deterministic: max rank load over the mean.
"""

from __future__ import annotations

import math

import numpy as np

from lmcost.basics.errors import LmcostError

FIX = "use uniform, zipf:S (S >= 0), hot:F (F from 1 to E/k), or a measured max/mean rank load >= 1"


def parse_load(spec: str) -> tuple:
    """``spec`` as (kind, value): ('uniform', None), ('zipf', S), ('hot', F) or ('measured', X).
    Raises: LmcostError (expert_load) for anything else."""
    if not isinstance(spec, str):
        raise LmcostError("expert_load", f"must be text, got {spec!r}", FIX)
    s = spec.strip().lower()
    if s == "uniform":
        return "uniform", None
    kind, _, val = s.partition(":")
    try:
        v = float(val if val else kind)
    except ValueError:
        raise LmcostError("expert_load", f"cannot read {spec!r}", FIX) from None
    if not math.isfinite(v):
        raise LmcostError("expert_load", f"cannot read {spec!r}", FIX)
    if kind == "zipf" and val:
        if not 0 <= v <= 10:
            raise LmcostError("expert_load", f"a Zipf exponent must be from 0 to 10, got {v:g}", FIX)
        return "zipf", v
    if kind == "hot" and val:
        if v < 1:
            raise LmcostError("expert_load", f"a hot expert's load over the mean must be 1 or more, got {v:g}", FIX)
        return "hot", v
    if not val:
        if not 1 <= v <= 64:
            raise LmcostError("expert_load", f"a measured max/mean rank load must be from 1 to 64, got {v:g}", FIX)
        return "measured", v
    raise LmcostError("expert_load", f"unknown load model {spec!r}", FIX)


def _cap(p: np.ndarray, cap: float) -> np.ndarray:
    """Shares capped at ``cap`` each, the excess spread over the uncapped in proportion (water-filling)."""
    p = p.copy()
    for _ in range(len(p)):
        over = p > cap * (1 + 1e-12)
        if not over.any():
            break
        excess = float((p[over] - cap).sum())
        p[over] = cap
        free = p < cap * (1 - 1e-12)
        p[free] += excess * p[free] / p[free].sum()
    return p


def expert_shares(spec: str, n_experts: int, k: int) -> np.ndarray:
    """Each expert's share of the routed pairs, hottest first (array [E], summing to 1), for a load ``spec``
    (module docstring). Raises: LmcostError (expert_load) for a bad spec, a hot factor past E/k, or a measured
    figure (which gives no shares)."""
    kind, v = parse_load(spec)
    E = n_experts
    if kind == "uniform" or (kind == "zipf" and v == 0):
        return np.full(E, 1.0 / E)
    if kind == "zipf":
        p = np.arange(1, E + 1, dtype=float) ** -v
        return _cap(p / p.sum(), 1.0 / k)
    if kind == "hot":
        if v > E / k:
            raise LmcostError("expert_load", f"an expert gets at most one row per token: {v:g} x the mean is past "
                              f"E/k = {E / k:g}", f"use hot:F with F from 1 to {E / k:g}")
        p = np.full(E, (1.0 - v / E) / (E - 1))
        p[0] = v / E
        return p
    raise LmcostError("expert_load", "a measured rank load gives no per-expert shares", FIX)


def expected_max_normal(n: int) -> float:
    """E[max of n iid standard normals] = integral of x n phi(x) Phi(x)^(n-1) dx (trapezoid on [-12, 12],
    24,001 points; error below 1e-9 for n up to 65,536). e(1) = 0, e(2) = 1/sqrt(pi)."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    Phi = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    f = x * n * phi * Phi ** (n - 1)
    return float(np.sum((f[1:] + f[:-1]) / 2) * (x[1] - x[0]))


def rank_imbalance(p: np.ndarray, ep: int) -> float:
    """Expected max over ``ep`` ranks of the summed shares of E/ep experts placed without regard to load, over
    the mean 1/ep (normal approximation of the module docstring). ``p``: shares [E]. Raises: nothing."""
    E = len(p)
    if ep <= 1:
        return 1.0
    m = E // ep
    var = float(np.var(p)) * m * (E - m) / (E - 1) if E > 1 else 0.0
    if var <= 0:
        return 1.0
    spread = 1.0 + ep * math.sqrt(var) * math.sqrt(ep / (ep - 1)) * expected_max_normal(ep)
    top = float(np.max(p))
    hot = ep * (top + (m - 1) * (1.0 - top) / (E - 1))  # the rank holding the hottest expert, on average
    return float(min(ep, max(spread, hot)))


def eplb_imbalance(p: np.ndarray, ep: int, redundant: int) -> float:
    """Max over ranks of the load after EPLB's replication of ``redundant`` experts and balanced packing, over
    the mean (module docstring). Raises: LmcostError (redundant_experts) unless ep divides E + N."""
    E = len(p)
    if (E + redundant) % ep:
        raise LmcostError("redundant_experts", f"{E} experts + {redundant} replicas do not fill ep={ep} ranks alike "
                          "(EPLB needs ep to divide the physical experts)",
                          f"use a count that makes E + N a multiple of {ep}")
    reps = np.ones(E, dtype=int)
    for _ in range(redundant):
        reps[int(np.argmax(p / reps))] += 1
    items = sorted(((float(p[i] / reps[i]), i) for i in range(E) for _ in range(reps[i])), reverse=True)
    slots = (E + redundant) // ep
    load, used = np.zeros(ep), np.zeros(ep, dtype=int)
    for w, _ in items:
        free = np.flatnonzero(used < slots)
        r = int(free[np.argmin(load[free])])
        load[r] += w
        used[r] += 1
    return float(load.max() * ep)


def imbalance_for(spec: str, n_experts: int, k: int, ep: int, redundant: int = 0) -> tuple:
    """(imbalance, how): the busiest rank's routed rows over the mean for a load ``spec`` on ``ep`` ranks with
    ``redundant`` EPLB replicas, and a phrase naming its source. Raises: LmcostError (expert_load,
    redundant_experts) for bad inputs, or replicas beside a measured figure (which already holds a placement)."""
    kind, v = parse_load(spec)
    if kind == "measured":
        if redundant:
            raise LmcostError("redundant_experts", "a measured max/mean rank load already holds its placement",
                              "give a load model (zipf:S, hot:F) with replicas, or drop `redundant_experts`")
        return v, f"measured max/mean {v:g}"
    p = expert_shares(spec, n_experts, k)
    if redundant:
        return eplb_imbalance(p, ep, redundant), f"{spec} after EPLB with {redundant} redundant experts"
    return rank_imbalance(p, ep), f"{spec}, experts placed without regard to load (expected max over ranks)"
