"""The spread of the memory-bound kernels a serving stack may run, around ``auto``'s prediction.

Under ``--engine auto`` (and ``torch``, which shares its figures) a norm or a pointwise kernel is timed with the
GPU's ``efficiency.kinds.auto`` figures, fitted on the public table's best fused kernels (Liger's Triton, timed with
their harness's launch). ``auto`` does not know which kernel a stack runs, and the stacks' kernels differ by up to
4x at one shape: on the lent H200 at 8192 tokens x 4096, PyTorch's fused RMSNorm took 34 us, a Triton RMSNorm 43,
vLLM's one-block-per-row scalar ``rms_norm`` 132 and its 8-wide fused add + RMSNorm 69
(``lmcost/data/measurements/gpu-kernels-h200.csv``). The band ``auto`` states must span them.

So the spread of a class (norm: RMSNorm, LayerNorm, fused add + RMSNorm; elementwise: SiLU-and-mul, RoPE, add)
is the 5th-95th percentile (:data:`lmcost.calibration.efficiency_fit.BAND_PCT`) of measured / ``auto``-predicted
calibrated time over the single fused kernels of the class on the H200 sweep (rows of one kernel per call:
PyTorch's fused norm, Triton, the engines' designs; never multi-kernel eager chains such as HF's eager RMSNorm
or eager SiLU-then-mul, which no serving stack runs). ``auto``'s band of the class becomes the union of the band
the GPU ships (the public fit's) and this spread (:func:`lmcost.hardware.engine_memory.widen_by_spread`),
on every GPU: the ratios are assumed to transfer, since only the H200 was timed.

Held out: the spread is computed on sweep 2 (the shipped CSV) and its coverage evaluated on sweep 1
(``tests/data/gpu-kernels-h200.csv``, a separate run: PyTorch, Triton, eager); and leave one implementation out
(the spread of the other implementations, coverage on the one left out): :func:`leave_one_implementation_out`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.calibration.efficiency_fit import BAND_PCT
from lmcost.cost import kernels as K
from lmcost.hardware.engine_memory import AUTO_STACK, engine_memory_figures
from lmcost.hardware.gpu import load_gpu

#: The band class of each measured op (:func:`lmcost.cost.timing._band_class` of the op lmcost builds).
CLASS_OF = {"rmsnorm": "norm", "layernorm": "norm", "silu_mul": "elementwise", "rope": "elementwise",
            "add": "elementwise"}
#: Classes a spread is computed for.
SPREAD_CLASSES = ("norm", "elementwise")


@dataclass
class SpreadRows:
    """Sweep rows of single fused kernels, costed under ``auto`` on the H200: per row its class, ``op``
    ``implementation`` label, measured / ``auto``-predicted calibrated time (``ratio``)."""

    cls: np.ndarray
    impl: np.ndarray
    ratio: np.ndarray


def _ops(row: dict, where: str):
    g = lambda k: int(row[k])  # noqa: E731
    op = row["op"]
    try:
        if op in ("rmsnorm", "layernorm"):
            return K.norm(op, g("tokens"), g("hidden"), "bf16", bias=op == "layernorm",
                          residual="fused-add" in row["implementation"])
        if op in ("silu_mul", "add"):
            return K.elementwise(op, g("tokens"), g("width"), dtype="bf16")
        return K.elementwise("rope", g("tokens"), None, g("heads_q"), g("heads_kv"), g("head_dim"), dtype="bf16")
    except (KeyError, ValueError, TypeError) as e:
        raise LmcostError(where, f"malformed row ({type(e).__name__}: {e})", "regenerate the sweep table") from None
    except LmcostError as e:  # a size out of range: name the row, not a flag of another command
        raise LmcostError(f"{where}: {e.field.lstrip('-')}", e.what, "regenerate the sweep table") from None


def around_gpu(around: str = "torch", designs: tuple[dict, dict] | None = None):
    """The shipped H200 whose prediction a spread is taken around: ``torch``, its own block; ``auto``, with
    :data:`lmcost.hardware.engine_memory.AUTO_STACK`'s designs for the kinds they cost (``designs``: their (figures,
    bands), default the shipped ones), as ``lmcost op`` costs under auto, before any spread widens the bands."""
    gpu = load_gpu("h200")
    if around == "torch":
        return gpu
    eff = gpu.efficiency.with_memory_designs(*engine_memory_figures(AUTO_STACK, designs), AUTO_STACK)
    return gpu.model_copy(update={"efficiency": eff})


def load_rows(path: str | Path, gpu=None) -> SpreadRows:
    """Rows of ``path`` (benchmarks/gpu_kernels.py's CSV) that are one fused norm or pointwise kernel per call
    (``kernels_per_call`` 1, status ok), each costed as ``lmcost op`` costs it on ``gpu`` (default
    :func:`around_gpu` torch: the shipped H200's own figures) (bf16; a ``*fused-add*`` implementation as the fused
    residual add + norm).

    Raises: LmcostError (table) for an unreadable table or one without those rows; naming the row of a malformed one."""
    path = Path(path)
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as e:
        raise LmcostError("table", f"cannot read {path} ({e.strerror})", "give a readable CSV") from None
    gpu = gpu or around_gpu("torch")
    cls, impl, ratio = [], [], []
    for i, row in enumerate(rows, start=2):
        if row.get("status") != "ok" or row.get("op") not in CLASS_OF or row.get("kernels_per_call") != "1":
            continue
        where = f"{path.name} line {i}"
        try:
            t = float(row["time_us"]) * 1e-6
        except (KeyError, ValueError, TypeError):
            raise LmcostError(f"{where}: time_us", "missing or not a number", "regenerate the sweep table") from None
        pred = K.cost(_ops(row, where), gpu, "bf16")["time_s"]["calibrated"]
        cls.append(CLASS_OF[row["op"]])
        impl.append(f"{row['op']} {row['implementation']}")
        ratio.append(t / pred)
    if not ratio:
        raise LmcostError("table", f"{path.name} has no single-kernel norm or pointwise rows",
                          "give a sweep of benchmarks/gpu_kernels.py")
    return SpreadRows(np.array(cls), np.array(impl), np.array(ratio))


def spread(ratios) -> tuple[float, float]:
    """(5th, 95th) percentile of measured / predicted ratios, rounded to 3 places."""
    lo, hi = np.percentile(np.asarray(ratios, dtype=float), BAND_PCT)
    return round(float(lo), 3), round(float(hi), 3)


def union(a, b) -> tuple[float, float]:
    """The smallest band holding bands ``a`` and ``b`` ((low, high) each)."""
    return min(a[0], b[0]), max(a[1], b[1])


def class_spreads(r: SpreadRows) -> dict[str, tuple[float, float]]:
    """Per class of :data:`SPREAD_CLASSES` with rows, its :func:`spread`."""
    return {c: spread(r.ratio[r.cls == c]) for c in SPREAD_CLASSES if np.any(r.cls == c)}


def coverage(r: SpreadRows, bands: dict) -> dict[str, float]:
    """Per class of ``bands`` with rows in ``r``: the share of its rows whose ratio lies in [low, high]."""
    out = {}
    for c, (lo, hi) in bands.items():
        x = r.ratio[r.cls == c]
        if len(x):
            out[c] = float(np.mean((x >= lo) & (x <= hi)))
    return out


def leave_one_implementation_out(r: SpreadRows, shipped: dict) -> dict[str, dict[str, tuple[int, float, float]]]:
    """Per class, per implementation: (rows, coverage of the shipped band, coverage of the union of the shipped band
    and the spread of the class's OTHER implementations) on that implementation's rows. ``shipped``: the GPU's
    band per class, (low, high)."""
    out = {}
    for c in SPREAD_CLASSES:
        m = r.cls == c
        per = {}
        for name in sorted(set(r.impl[m].tolist())):
            test, train = m & (r.impl == name), m & (r.impl != name)
            if not np.any(train):
                continue
            x = r.ratio[test]
            lo, hi = union(shipped[c], spread(r.ratio[train]))
            per[name] = (int(len(x)), float(np.mean((x >= shipped[c][0]) & (x <= shipped[c][1]))),
                         float(np.mean((x >= lo) & (x <= hi))))
        out[c] = per
    return out


def summary(r: SpreadRows, shipped: dict) -> list[dict]:
    """Per class: rows, the spread, the GPU's ``shipped`` band and their union, coverage of the rows by the shipped
    band and by the union (in sample), and leave one implementation out (rows pooled) before and after."""
    out = []
    loio = leave_one_implementation_out(r, shipped)
    for c, sp in class_spreads(r).items():
        u = union(shipped[c], sp)
        per = loio.get(c, {})
        n = sum(k for k, _, _ in per.values()) or 1
        out.append(dict(cls=c, rows=int(np.sum(r.cls == c)), implementations=len(per), spread=sp,
                        shipped=tuple(shipped[c]), band=u, coverage_before=coverage(r, {c: shipped[c]})[c],
                        coverage_after=coverage(r, {c: u})[c],
                        loio_before=sum(k * b for k, b, _ in per.values()) / n,
                        loio_after=sum(k * a for k, _, a in per.values()) / n))
    return out


def spread_yaml(r: SpreadRows, table: str, digest: str, auto: SpreadRows | None = None) -> dict:
    """The ``stack_spread`` section of ``engine-memory-kernels.yaml``: per class [low, high] around torch's
    prediction (``r``, key ``bands``) and around auto's (``auto``: with the default serving engine's designs, key
    ``auto_bands``), the rows and implementations they were computed on, and their source."""
    sp = class_spreads(r)
    return dict(
        source=f"lmcost fit --memory-kernels on lmcost/data/measurements/{table} (sha256 {digest}): 5th-95th "
               "percentile of measured / predicted calibrated time (lmcost op on the H200) over the single fused "
               "kernels of each class (kernels_per_call 1), predicted under torch (bands) and under auto, whose "
               f"norms, activations and RoPE are {AUTO_STACK}'s designs (auto_bands); each selection's band of the "
               "class is its union with the band it has without the spread (lmcost.calibration.stack_spread), on "
               "every GPU: ratios assumed to transfer, only the H200 timed",
        bands={c: list(v) for c, v in sp.items()},
        **({} if auto is None else {"auto_bands": {c: list(v) for c, v in class_spreads(auto).items()}}),
        rows={c: int(np.sum(r.cls == c)) for c in sp},
        implementations={c: sorted(set(r.impl[r.cls == c].tolist())) for c in sp},
    )
