"""Serving workloads: the requests a simulated server receives (arrival time, prompt and output tokens).

Generated (:func:`make_requests`: a length distribution for prompts and outputs, arrivals offline, Poisson or
gamma at a rate, or a closed loop of fixed concurrency; seeded) or replayed from a JSONL file
(:func:`read_requests`). numpy only. Every :class:`Requests` is checked when built, so the simulator can trust
it: arrivals ascending and >= 0, lengths whole numbers >= 1.

Length specs (:func:`lengths`): ``1024`` or ``8k`` (fixed), ``uniform:LO:HI`` (whole numbers, both ends
included), ``normal:MEAN:SD`` (clipped to >= 1, rounded), ``lognormal:MEDIAN:SIGMA`` (rounded, >= 1), or a named
dataset shape from ``lmcost/data/workloads/datasets.yaml`` (``sharegpt``, ``alpaca``), each with its source.
Every token figure of a spec is a count as the CLI's count options take it (:func:`lmcost.basics.counts.parse_count`:
ASCII digits, k/K/M/G binary suffixes; no ``1e3``, ``1_000`` or ``12.5``); SIGMA is a plain decimal number.
Arrivals: ``offline`` (all at t = 0), ``poisson`` (exponential gaps of mean 1/rate), ``gamma:CV`` (gamma gaps
of mean 1/rate and coefficient of variation CV; CV 1 is Poisson, above 1 burstier). The first request arrives
at t = 0 and the n - 1 gaps follow it; no arrival is later than MAX_ARRIVAL_S.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lmcost.basics import shipped
from lmcost.basics.counts import parse_count
from lmcost.basics.errors import LmcostError, from_validation_error
from lmcost.basics.files import MAX_DEPTH, MAX_TRACE_BYTES, _no_duplicate_json_keys, read_mapping, read_text, shown

#: Most requests one workload holds (generated or replayed): the simulator keeps a few numbers per request.
MAX_REQUESTS = 10_000_000
#: Longest prompt or output (tokens): int32's range; generated samples beyond it are clipped to it.
MAX_LENGTH = 2**31 - 1
#: Largest lognormal sigma a spec may give: exp(4 sigma) is a factor of 9e6 at +4 sd, enough for any dataset.
MAX_SIGMA = 4.0
#: Largest coefficient of variation of gamma gaps (shape 1/CV^2 = 1e-4 already draws gaps of 0 in float64).
MAX_CV = 100.0
#: Smallest coefficient of variation of gamma gaps: at CV 0.01 (shape k = 1/CV^2 = 10^4) every gap is within a
#: few % of 1/rate, a fixed pace in all but name; a smaller CV changes nothing a run shows, and past CV 1e-154
#: CV^2 underflows (k = 1/CV^2 infinite, or a division by 0).
MIN_CV = 0.01
#: Rates of generated arrivals, requests/s: from one in 11.6 days to one a nanosecond (past any engine's step
#: rate). Outside them 1/rate overflows (1e-320: an infinite mean gap) or arrivals outrun MAX_ARRIVAL_S.
MIN_RATE, MAX_RATE = 1e-6, 1e9
#: Latest arrival, seconds, generated or read: float64's spacing at 1e9 s is 2^-23 s = 0.12 us, under any
#: latency a run reports (a decode step is tens of us); at 1e30 s it is 1.4e14 s, so a TTFT shorter than
#: that rounds to 0 or to the spacing.
MAX_ARRIVAL_S = 1e9


def _g(x: float, digits: int = 6) -> str:
    """``x`` as %g writes it (``digits`` significant), without the exponent's + and zeros: 1e9, 1e-6, 2.5e30."""
    return f"{x:.{digits}g}".replace("e+", "e").replace("e0", "e").replace("e-0", "e-")


#: Why MAX_ARRIVAL_S, as the refusals say it.
_RESOLUTION = f"past {_g(MAX_ARRIVAL_S)} s, where float64 resolves 0.1 us at best; latencies there would be rounding"
#: The keys of one JSONL line.
KEYS = ("arrival_s", "prompt_tokens", "output_tokens")
#: The keys a line may add: its prefix (:mod:`lmcost.apps.serve_prefix`), both or neither.
PREFIX_KEYS = ("prefix_id", "prefix_tokens")


@dataclass(frozen=True)
class Requests:
    """The requests of one workload, in arrival order.

    Shapes: ``arrival_s`` float64 [n] (seconds, ascending, >= 0; all 0 offline), ``prompt`` and ``output``
    int64 [n] (tokens, >= 1). ``concurrency``: a closed loop of at most this many requests in the system, a
    request entering when one finishes (``arrival_s`` then ignored); None: open loop at ``arrival_s``.
    Raises: LmcostError naming ``workload.arrival_s``, ``workload.prompt``, ``workload.output`` or
    ``workload.concurrency`` for arrays of other lengths, no requests, more than MAX_REQUESTS, negative or
    descending or non-finite arrivals or ones past MAX_ARRIVAL_S, lengths not whole or < 1, a concurrency < 1.

    Prefix caching (:mod:`lmcost.apps.serve_prefix`): ``prefix_id`` int64 [n] (-1: no prefix) and
    ``prefix_tokens`` int64 [n] (0 to the prompt; the first ``prefix_tokens`` of the prompt are the id's shared
    sequence), both None when the workload names no prefixes. Raises: LmcostError naming ``workload.prefix_id``
    or ``workload.prefix_tokens`` for one given without the other, values outside those ranges, or tokens on a
    request without an id.
    """

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    concurrency: int | None = None
    # prefix caching
    prefix_id: np.ndarray | None = None
    prefix_tokens: np.ndarray | None = None

    def __post_init__(self):
        arrival = np.asarray(self.arrival_s, dtype=np.float64)
        n = arrival.shape[0] if arrival.ndim == 1 else -1
        if n < 1 or n > MAX_REQUESTS:
            raise LmcostError("workload.arrival_s", f"{'not one-dimensional' if n < 0 else f'{n:,} requests'}",
                              f"give 1 to {MAX_REQUESTS:,} requests in a one-dimensional array")
        with np.errstate(invalid="ignore"):  # inf - inf: refused below, without numpy's warning on stderr
            wrong = ~np.isfinite(arrival) | (arrival < 0) | np.r_[False, np.diff(arrival) < 0]
        if np.any(wrong):
            bad = int(np.flatnonzero(wrong)[0])
            raise LmcostError("workload.arrival_s", f"request {bad} arrives at {float(arrival[bad])!r} s, negative, "
                                                    "not finite or before the one ahead of it",
                              "give finite arrival times >= 0 in ascending order")
        if arrival[-1] > MAX_ARRIVAL_S:
            raise LmcostError("workload.arrival_s", f"the last request arrives at {_g(float(arrival[-1]), 3)} s, "
                              f"{_RESOLUTION}", f"give arrivals of at most {_g(MAX_ARRIVAL_S)} s")
        object.__setattr__(self, "arrival_s", arrival)
        for name in ("prompt", "output"):
            object.__setattr__(self, name, _whole(getattr(self, name), n, f"workload.{name}"))
        c = self.concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 1 <= c <= MAX_LENGTH):
            raise LmcostError("workload.concurrency", f"{c!r:.40} is not a count of requests",
                              f"give a whole number from 1 to {MAX_LENGTH:,}, or none for an open loop")
        if self.prefix_id is not None or self.prefix_tokens is not None:
            _check_prefix(self, n)

    @property
    def n(self) -> int:
        """Number of requests."""
        return int(self.arrival_s.shape[0])


def _check_prefix(r: Requests, n: int) -> None:
    """Set ``r``'s prefix arrays as int64 [n], checked (:class:`Requests`). Raises: LmcostError."""
    if r.prefix_id is None or r.prefix_tokens is None:
        raise LmcostError("workload.prefix_id" if r.prefix_id is None else "workload.prefix_tokens",
                          "missing beside the other prefix array", "give prefix_id and prefix_tokens together")
    ids, toks = (np.asarray(a) for a in (r.prefix_id, r.prefix_tokens))
    for name, a in (("prefix_id", ids), ("prefix_tokens", toks)):
        if a.shape != (n,) or a.dtype.kind not in "iu":
            raise LmcostError(f"workload.{name}", f"shape {a.shape} of {a.dtype}, where the arrivals have ({n},)",
                              "give one whole number per request")
    bad = np.flatnonzero((ids < -1) | (toks < 0) | (toks > r.prompt) | ((ids == -1) & (toks != 0)))
    if bad.size:
        i = int(bad[0])
        field = "prefix_id" if ids[i] < -1 else "prefix_tokens"
        raise LmcostError(f"workload.{field}", f"request {i} has prefix id {int(ids[i])} and {int(toks[i])} prefix "
                          f"tokens of a {int(r.prompt[i])}-token prompt",
                          "give ids >= 0 (-1: none, with 0 tokens) and 0 to prompt tokens of prefix")
    object.__setattr__(r, "prefix_id", ids.astype(np.int64))
    object.__setattr__(r, "prefix_tokens", toks.astype(np.int64))


def _whole(values, n: int, field: str) -> np.ndarray:
    """``values`` as int64 [n], each a whole number in 1..MAX_LENGTH. Raises: LmcostError naming ``field``."""
    a = np.asarray(values)
    if a.shape != (n,):
        raise LmcostError(field, f"shape {a.shape}, where the arrivals have ({n},)", "give one length per request")
    if a.dtype.kind not in "iuf" or a.dtype == np.bool_:
        raise LmcostError(field, f"holds {a.dtype} values", "give whole numbers of tokens")
    bad = ~np.isfinite(a) | (a != np.round(a)) | (a < 1) | (a > MAX_LENGTH) if a.dtype.kind == "f" else \
        (a < 1) | (a > MAX_LENGTH)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise LmcostError(field, f"request {i} has {a[i]!r} tokens", f"give whole numbers from 1 to {MAX_LENGTH:,}")
    return a.astype(np.int64)


# --- named dataset shapes ---------------------------------------------------------------------------------------

_STRICT = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


class Shape(BaseModel):
    """One side's length distribution: lognormal with ``mean`` tokens and log-space ``sigma``."""

    model_config = _STRICT
    distribution: Literal["lognormal"]
    mean: float = Field(ge=1, le=MAX_LENGTH)
    sigma: float = Field(ge=0, le=MAX_SIGMA)


class Dataset(BaseModel):
    """A public dataset's prompt and output length shape, with the source of its figures."""

    model_config = _STRICT
    source: str = Field(min_length=1)
    prompt: Shape
    output: Shape
    notes: str = ""


@lru_cache(maxsize=1)
def datasets() -> dict[str, Dataset]:
    """The named dataset shapes shipped in ``lmcost/data/workloads/datasets.yaml``, by name.

    Raises: LmcostError naming the file and field for an invalid entry (a packaging error).
    """
    path = shipped.folder("workloads") / "datasets.yaml"
    out = {}
    for name, entry in read_mapping(path).items():
        try:
            out[str(name)] = Dataset.model_validate(entry)
        except ValidationError as e:
            raise from_validation_error(e, f"{path}: {name}") from None
    return out


# --- lengths ------------------------------------------------------------------------------------------------------

#: A plain decimal number (SIGMA, CV): ASCII digits, a decimal point, an exponent; no sign or underscore.
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?"
_SPEC = re.compile(r"(uniform|normal|lognormal):([^:]*):([^:]*)")


def _lognormal(median: float, sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.lognormal(math.log(median), sigma, n)


def _tokens(part: str, name: str, text: str, field: str, low: int) -> int:
    """``part`` of the spec ``text``, the token figure ``name``, as a count (:func:`parse_count`) in
    ``low``..MAX_LENGTH. Raises: LmcostError naming ``field``."""
    whole = part == text  # a fixed length: the spec itself
    try:
        v = parse_count(part)
    except ValueError as e:
        said = f"{shown(part)!r:.30}" if whole else f"{name} {shown(part)!r:.30} of {shown(text)!r:.60}"
        raise LmcostError(field, str(e) if "lowercase" in str(e) else f"{said} is not a whole number of tokens",
                          "write e.g. 512, 8k or 1M (k = 1024, M = 1024^2)") from None
    if not low <= v <= MAX_LENGTH:
        said = f"{v:,} tokens" if whole else f"{name} {v:,} of {text!r:.60}"
        raise LmcostError(field, f"{said} is outside {low} to {MAX_LENGTH:,} tokens", f"give {low} to {MAX_LENGTH:,}")
    return v


def lengths(spec: str, n: int, rng: np.random.Generator, field: str) -> np.ndarray:
    """``n`` token lengths drawn from ``spec`` with ``rng``.

    Shapes: int64 [n], each in 1..MAX_LENGTH (continuous draws rounded to the nearest whole number, then
    clipped: below 1 to 1, past MAX_LENGTH to it).
    Specs: ``1024`` or ``8k`` fixed; ``uniform:LO:HI`` whole numbers LO..HI, both included (mean (LO + HI) / 2);
    ``normal:MEAN:SD``; ``lognormal:MEDIAN:SIGMA`` (log-space sigma, mean MEDIAN * exp(SIGMA^2 / 2)); a dataset
    name (:func:`datasets`), whose ``prompt`` or ``output`` side is taken by the last part of ``field``
    (``workload.prompt`` -> prompt): lognormal with the dataset's mean, so median = mean * exp(-sigma^2 / 2).
    N, LO, HI, MEAN, SD and MEDIAN are counts (:func:`lmcost.basics.counts.parse_count`: ``8k`` = 8,192);
    SIGMA a plain decimal number.
    Raises: LmcostError naming ``field`` for a spec that does not parse, or out of range (LO > HI, a length
    < 1, SIGMA outside 0..4, a figure past MAX_LENGTH), naming only the part that is wrong.
    """
    text = str(spec).strip()
    if text.lower() in datasets():
        side = field.rsplit(".", 1)[-1]
        shape = getattr(datasets()[text.lower()], "output" if side == "output" else "prompt")
        x = _lognormal(shape.mean * math.exp(-shape.sigma ** 2 / 2), shape.sigma, n, rng)
        return np.clip(np.rint(x), 1, MAX_LENGTH).astype(np.int64)
    m = _SPEC.fullmatch(text)
    if m is None:
        if text[:1].isdigit():
            return np.full(n, _tokens(text, "the length", text, field, 1), dtype=np.int64)
        raise LmcostError(field, "empty" if not text else f"{shown(text)!r:.60} is not a length spec",
                          "give a whole number of tokens (8k = 8,192), uniform:LO:HI, normal:MEAN:SD, "
                          "lognormal:MEDIAN:SIGMA or a dataset: " + ", ".join(datasets()))
    kind, a, b = m.groups()
    if kind == "uniform":
        lo, hi = _tokens(a, "LO", text, field, 1), _tokens(b, "HI", text, field, 1)
        if lo > hi:
            raise LmcostError(field, f"LO {lo:,} is above HI {hi:,} in {text!r:.60}", "give uniform:LO:HI with LO <= HI")
        return rng.integers(lo, hi, n, endpoint=True, dtype=np.int64)
    if kind == "normal":
        x = rng.normal(_tokens(a, "MEAN", text, field, 1), _tokens(b, "SD", text, field, 0), n)
    else:
        median = _tokens(a, "MEDIAN", text, field, 1)
        if not re.fullmatch(_NUMBER, b) or not 0 <= float(b) <= MAX_SIGMA:
            raise LmcostError(field, f"SIGMA {shown(b)!r:.30} of {text!r:.60} is not a number from 0 to {MAX_SIGMA:g}",
                              f"give lognormal:MEDIAN:SIGMA with SIGMA 0 to {MAX_SIGMA:g} (log-space), e.g. 0.5")
        x = _lognormal(median, float(b), n, rng)
    return np.clip(np.rint(x), 1, MAX_LENGTH).astype(np.int64)


# --- arrivals and generation --------------------------------------------------------------------------------------

def check_rate(value, field: str) -> float:
    """``value`` (requests/s) as a float from MIN_RATE to MAX_RATE. Raises: LmcostError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise LmcostError(field, f"{value!r:.40} is not a number", "give requests per second, e.g. 2.5")
    if not MIN_RATE <= value <= MAX_RATE:  # nan too
        raise LmcostError(field, f"{float(value)!r} requests/s is outside {_g(MIN_RATE)} to {_g(MAX_RATE)}",
                          f"give requests per second from {_g(MIN_RATE)} to {_g(MAX_RATE)}, e.g. 2.5")
    return float(value)


def _count(value, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise LmcostError(field, f"{value!r:.40} is not a whole number from {low:,} to {high:,}", "give one in that range")
    return int(value)


def arrivals(spec: str, n: int, rate: float | None, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of ``n`` requests: ``offline`` all 0; ``poisson`` gaps ~ Exponential(mean 1/rate);
    ``gamma:CV`` gaps ~ Gamma(shape k = 1/CV^2, scale 1/(rate k)), so mean k * scale = 1/rate and
    CV = 1/sqrt(k). The first request at 0, then the n - 1 gaps' cumulative sums.

    Shapes: float64 [n], seconds, ascending, finite. Source: gamma mean k·theta and variance k·theta^2 (so CV
    1/sqrt(k)). The bounds keep every gap's scale finite and > 0: 1/rate <= 1e6 s, and theta = 1/(rate k) from
    1/(1e9 x 1e4) = 1e-13 s to 1e6 / 1e-4 = 1e10 s.
    Raises: LmcostError naming ``workload.arrival`` (a spec that does not parse, CV outside MIN_CV..MAX_CV) or
    ``workload.rate`` (missing for poisson or gamma, given for offline, outside MIN_RATE..MAX_RATE, or so low
    that the last arrival is past MAX_ARRIVAL_S).
    """
    text = str(spec).strip().lower()
    if text == "offline":
        if rate is not None:
            raise LmcostError("workload.rate", "given with offline arrivals (all at t = 0)",
                              "drop the rate, or use poisson or gamma:CV arrivals")
        return np.zeros(n)
    m = re.fullmatch(rf"gamma:({_NUMBER})", text)
    if text != "poisson" and m is None:
        raise LmcostError("workload.arrival", f"{shown(str(spec))!r:.60} is not an arrival process",
                          "give offline, poisson or gamma:CV (e.g. gamma:2)")
    if rate is None:
        raise LmcostError("workload.rate", f"missing for {text} arrivals",
                          "give requests per second, or offline arrivals, or a concurrency")
    rate = check_rate(rate, "workload.rate")
    if m is None:
        gaps = rng.exponential(1 / rate, n - 1)
    else:
        cv = float(m.group(1))
        if not MIN_CV <= cv <= MAX_CV:
            raise LmcostError("workload.arrival", f"CV {cv:g} is outside {MIN_CV:g} to {MAX_CV:g}",
                              f"give gamma:CV with CV from {MIN_CV:g} (gaps within a few % of 1/rate: a fixed pace) "
                              f"to {MAX_CV:g}")
        k = 1 / cv ** 2
        gaps = rng.gamma(k, 1 / (rate * k), n - 1)
    t = np.concatenate([[0.0], np.cumsum(gaps)])
    if t[-1] > MAX_ARRIVAL_S:
        raise LmcostError("workload.rate", f"{n:,} requests at {_g(rate)}/s arrive until {_g(t[-1], 3)} s, {_RESOLUTION}",
                          "give a higher rate or fewer requests")
    return t


def make_requests(n: int, *, prompt: str, output: str, rate: float | None = None, arrival: str = "poisson",
                  concurrency: int | None = None, seed: int = 0) -> Requests:
    """``n`` generated requests: lengths from ``prompt`` and ``output`` specs (:func:`lengths`), arrivals by
    ``arrival`` at ``rate`` requests/s (:func:`arrivals`), or a closed loop of ``concurrency`` requests (all
    ``arrival_s`` 0; ``rate`` must be None and ``arrival`` poisson, the default, or offline).

    Reproducible: the same arguments give the same requests (numpy's default generator seeded with ``seed``,
    drawing prompts, then outputs, then gaps).
    Raises: LmcostError naming ``workload.n`` (not 1 to MAX_REQUESTS), ``workload.seed`` (not a whole number
    >= 0), ``workload.prompt`` / ``workload.output`` (:func:`lengths`), ``workload.rate`` /
    ``workload.arrival`` (:func:`arrivals`) or ``workload.concurrency`` (< 1, or with a rate or gamma arrivals).
    """
    n = _count(n, "workload.n", 1, MAX_REQUESTS)
    seed = _count(seed, "workload.seed", 0, 2**63 - 1)
    if concurrency is not None:
        concurrency = _count(concurrency, "workload.concurrency", 1, MAX_LENGTH)
        if rate is not None:
            raise LmcostError("workload.concurrency", "a closed loop takes no rate (a request enters when one finishes)",
                              "give a concurrency or a rate, not both")
        if str(arrival).strip().lower() not in ("poisson", "offline"):
            raise LmcostError("workload.concurrency", f"a closed loop has no {arrival!r:.40} arrivals",
                              "drop the arrival process, or the concurrency")
    rng = np.random.default_rng(seed)
    p = lengths(prompt, n, rng, "workload.prompt")
    o = lengths(output, n, rng, "workload.output")
    t = np.zeros(n) if concurrency is not None else arrivals(arrival, n, rate, rng)
    return Requests(t, p, o, concurrency)


# --- replay -------------------------------------------------------------------------------------------------------

def _line_value(obj: dict, key: str, where: str) -> float | int:
    v = obj.get(key)
    field = f"{where}: {key}"
    if v is None:
        raise LmcostError(field, "missing" if key not in obj else "null", f"give {key} on every line")
    if key == "arrival_s":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise LmcostError(field, f"{v!r:.40} is not a time >= 0", "give seconds since the start, a number >= 0")
        if v > MAX_ARRIVAL_S:
            raise LmcostError(field, f"{_g(v, 3)} s is {_RESOLUTION}", f"give arrivals of at most {_g(MAX_ARRIVAL_S)} s")
        return v
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_LENGTH:
        raise LmcostError(field, f"{v!r:.40} is not a whole number of tokens >= 1",
                          f"give a JSON integer from 1 to {MAX_LENGTH:,} (no 1e3, 1000.0 or \"1000\")")
    return v


def read_requests(path: str | Path) -> Requests:
    """Requests replayed from a JSONL file: one ``{"arrival_s": float, "prompt_tokens": int, "output_tokens":
    int}`` object per line (blank lines skipped), in arrival order. Read through :func:`lmcost.basics.files.read_text`
    (at most 1 GiB). A line may add ``"prefix_id"`` (a JSON string or integer >= 0 naming a shared prefix: a
    system prompt, a chat session) and ``"prefix_tokens"`` (an integer, 0 to prompt_tokens: how many of the
    prompt's first tokens are that id's sequence), both or neither; ids are numbered in order of first
    appearance (:attr:`Requests.prefix_id`, None when no line names one). One id's lines may name different
    ``prefix_tokens`` (256 on one, 512 on a later one): an id is one sequence that may grow, as a chat
    session's turns or a radix path (:mod:`lmcost.apps.serve_prefix`: a line hits at most its own length).

    Raises: LmcostError naming the file, line and key (``requests.jsonl: line 3: prompt_tokens``) for a line
    that is not a JSON object, nested deeper than MAX_DEPTH (the files' limit: a line is one flat object), a key
    given twice, a missing or unknown key (the unknown ones named), an arrival negative, not finite, past
    MAX_ARRIVAL_S or before the line above, a length not a JSON integer >= 1; naming the file when it holds no
    requests or more than MAX_REQUESTS; or as ``read_text`` for a file it cannot read.
    """
    text = read_text(path, MAX_TRACE_BYTES, "JSONL file of requests")
    name = shown(path)
    t, p, o = [], [], []
    ids: dict = {}
    pid, ptok = [], []
    last = 0.0
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}: line {i}"
        if len(t) >= MAX_REQUESTS:
            raise LmcostError(name, f"more than {MAX_REQUESTS:,} requests", "split the file or sample it")
        try:
            obj = json.loads(line, object_pairs_hook=_no_duplicate_json_keys)
        except LmcostError as e:  # a key given twice
            raise LmcostError(f"{where}: {e.field}", e.what, e.fix) from None
        except RecursionError:  # json's reader recurses per level: a line of 100,000 [ ends here
            raise LmcostError(where, f"nested deeper than {MAX_DEPTH} levels",
                              "write one flat {...} object per line") from None
        except ValueError:  # JSONDecodeError, and an integer of thousands of digits
            raise LmcostError(where, "not valid JSON", 'write one object per line: {"arrival_s": 0.0, '
                                                       '"prompt_tokens": 512, "output_tokens": 128}') from None
        if not isinstance(obj, dict):
            raise LmcostError(where, "not a JSON object", "write one {...} object per line")
        extra = sorted(set(obj) - set(KEYS) - set(PREFIX_KEYS))
        if extra:
            raise LmcostError(where, f"unknown key{'s' * (len(extra) > 1)} {', '.join(map(repr, extra))}",
                              f"keep only {', '.join(KEYS)} (and {', '.join(PREFIX_KEYS)})")
        a = _line_value(obj, "arrival_s", where)
        if a < last:
            raise LmcostError(f"{where}: arrival_s", f"{a!r} s is before the line above ({last!r} s)",
                              "sort the lines by arrival_s")
        last = a
        t.append(a)
        p.append(_line_value(obj, "prompt_tokens", where))
        o.append(_line_value(obj, "output_tokens", where))
        pid.append(_line_prefix(obj, where, ids, p[-1]))
        ptok.append(obj.get("prefix_tokens", 0))
    if not t:
        raise LmcostError(name, "holds no requests", 'write one object per line: {"arrival_s": 0.0, '
                                                     '"prompt_tokens": 512, "output_tokens": 128}')
    prefix = (np.array(pid, dtype=np.int64), np.array(ptok, dtype=np.int64)) if ids else (None, None)
    return Requests(np.array(t, dtype=np.float64), np.array(p, dtype=np.int64), np.array(o, dtype=np.int64),
                    None, *prefix)


def _line_prefix(obj: dict, where: str, ids: dict, prompt: int) -> int:
    """The line's prefix id, numbered in order of first appearance in ``ids`` (-1: none), its
    ``prefix_tokens`` checked (0 to ``prompt``). Raises: LmcostError naming the line and key."""
    has = [k in obj for k in PREFIX_KEYS]
    if not any(has):
        return -1
    if not all(has):
        key = PREFIX_KEYS[has.index(False)]
        raise LmcostError(f"{where}: {key}", "missing beside the other prefix key", "give prefix_id and "
                          "prefix_tokens together, or neither")
    v, n = obj["prefix_id"], obj["prefix_tokens"]
    if isinstance(v, bool) or not (isinstance(v, str) and v or isinstance(v, int) and 0 <= v <= MAX_LENGTH):
        raise LmcostError(f"{where}: prefix_id", f"{v!r:.40} is not an id", "give a non-empty string or an integer >= 0")
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= prompt:
        raise LmcostError(f"{where}: prefix_tokens", f"{n!r:.40} is not a count from 0 to the prompt's {prompt:,}",
                          "give how many of the prompt's first tokens the prefix is")
    return ids.setdefault((type(v).__name__, v), len(ids))
