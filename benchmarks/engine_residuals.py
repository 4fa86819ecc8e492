"""Residuals of the engine kernel profiles against shape features (issue 25, second round: analysis, not shipped).

Loads the engine kernel table (lmcost/data/measurements/engine-kernels.csv), fits each (GPU, engine) profile
in-sample (:func:`lmcost.calibration.engine_fit.fit_profile` on all its default-kernel rows) and prints, per
class, the median log2(measured / predicted) and median |pred/meas - 1| over bins of shape features:
GEMM: M, N, K, tiles of a 128x128 tile and waves over the GPU's SMs; decode: batch, kv-heads, keys per
sequence, KV bytes, CTAs = b * h_kv * splits over SMs; prefill: s_q, b * h, CTAs over SMs.

Usage: python benchmarks/engine_residuals.py [--save residuals.pkl] [--load residuals.pkl]
"""

from __future__ import annotations

import argparse
import pickle
from collections import defaultdict

import numpy as np
import pandas as pd

from lmcost.calibration import engine_fit
from lmcost.calibration.efficiency_fit import _sm_count
from lmcost.calibration.measurements import engine_table, load_table


def residual_frame() -> pd.DataFrame:
    """One row per fitted table row: its features, measured and in-sample predicted time (s)."""
    path = engine_table()
    ms, _ = load_table(path)
    why = engine_fit.fitting_rows(path)
    ms = [m for m in ms if not why.get(m.index) and m.engine and m.cls in engine_fit.ENGINE_CLASSES]
    raw = pd.read_csv(path)
    groups = defaultdict(list)
    for m in ms:
        groups[(m.gpu.name, m.engine)].append(m)
    out = []
    for (g, e), rs in sorted(groups.items()):
        prof = engine_fit.fit_profile(rs, _sm_count(rs[0].gpu), "x")
        pred = engine_fit.predict_rows(rs, prof)
        for m, p in zip(rs, pred):
            r = raw.iloc[m.index - 1]
            op = m.main
            out.append(dict(gpu=g, engine=e, cls=m.cls, dtype=m.dtype, sm=_sm_count(m.gpu), meas=m.time_s, pred=p,
                            roof=m.roofline_s, flops=float(op.flops), bytes=float(sum(o.bytes for o in m.ops)),
                            M=r.M, N=r.N, K=r.K, batch=r.batch, seq_q=r.seq_q, seq_kv=r.seq_kv, hq=r.heads_q,
                            hkv=r.heads_kv, d=r.head_dim, impl=r.implementation,
                            mnk=tuple(float(v) for v in (op.mnk or (1, 1, 1)))))
    df = pd.DataFrame(out)
    df["lr"] = np.log2(df.meas / df.pred)
    df["err"] = (df.pred / df.meas - 1).abs()
    return df


def table(df: pd.DataFrame, by: str, bins=None) -> None:
    """Median log2 ratio, median |error| and count per bin of ``by``."""
    key = pd.cut(df[by], bins) if bins is not None else df[by]
    t = df.groupby(key, observed=True).agg(n=("lr", "size"), lr=("lr", "median"), err=("err", "median"))
    print(f"-- by {by}\n{t.round(3).to_string()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--load")
    a = ap.parse_args()
    df = pd.read_pickle(a.load) if a.load else residual_frame()
    if a.save:
        df.to_pickle(a.save)
    for c in engine_fit.ENGINE_CLASSES:
        d = df[df.cls == c].copy()
        print(f"==== {c}: rows {len(d)}, median |error| {d.err.median():.3f}")
        table(d, "engine")
        table(d, "gpu")
        if c == "gemm":
            d["tiles"] = np.ceil(d.M / 128) * np.ceil(d.N / 128)
            d["waves"] = d.tiles / d.sm
            d["ai"] = d.flops / d.bytes
            table(d, "dtype")
            for f, b in (("M", [0, 8, 32, 128, 512, 2048, 1e9]), ("N", [0, 1024, 4096, 16384, 1e9]),
                         ("K", [0, 512, 2048, 8192, 1e9]), ("waves", [0, .25, .5, 1, 2, 4, 16, 1e9]),
                         ("ai", [0, 16, 64, 256, 1024, 1e9])):
                table(d, f, b)
        elif c == "attention_decode":
            d["ctas"] = d.batch * d.hkv
            d["occ"] = d.ctas / d.sm
            d["ms_pred"] = d.pred * 1e6
            d["us"] = d.meas * 1e6
            for f, b in (("batch", [0, 1, 4, 16, 64, 256, 1e9]), ("hkv", [0, 1, 2, 4, 8, 1e9]),
                         ("seq_kv", [0, 16, 64, 256, 1024, 4096, 16384, 1e9]), ("occ", [0, .1, .5, 1, 4, 16, 1e9]),
                         ("us", [0, 10, 20, 50, 200, 1000, 1e9])):
                table(d, f, b)
        else:
            d["bh"] = d.batch * d.hq
            d["ctas"] = np.ceil(d.seq_q / 128) * d.bh / d.sm
            d["us"] = d.meas * 1e6
            for f, b in (("seq_q", [0, 128, 512, 2048, 8192, 1e9]), ("bh", [0, 8, 32, 128, 512, 1e9]),
                         ("ctas", [0, .5, 1, 4, 16, 1e9]), ("d", [0, 64, 128, 256]),
                         ("us", [0, 10, 20, 50, 200, 1000, 1e9])):
                table(d, f, b)


if __name__ == "__main__":
    main()
