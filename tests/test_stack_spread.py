"""auto's and torch's norm and elementwise bands span the kernels serving stacks run (lmcost.calibration.stack_spread,
lmcost/data/engine-memory-kernels.yaml ``stack_spread``): the shipped spread is the one the H200 sweep gives,
recomputed here with pandas from the CSV; it covers the rows of a separate run (sweep 1, tests/data, never fitted)
and each implementation left out; the calibrated time does not move, only its band."""

import numpy as np
import pandas as pd
import pytest

from lmcost.apps.engine_choice import choose_engine
from lmcost.calibration.memory_kernel_fit import sweep_table
from lmcost.calibration.stack_spread import around_gpu, coverage, leave_one_implementation_out, load_rows, union
from lmcost.cost import kernels as K
from lmcost.hardware.engine_memory import stack_spread
from lmcost.hardware.gpu import load_gpu

SWEEP1 = "tests/data/gpu-kernels-h200.csv"


def _ops(r):
    if r.op in ("rmsnorm", "layernorm"):
        return K.norm(r.op, int(r.tokens), int(r.hidden), "bf16", bias=r.op == "layernorm",
                      residual=r.implementation.endswith("fused-add"))
    if r.op == "rope":
        return K.elementwise("rope", int(r.tokens), None, int(r.heads_q), int(r.heads_kv), int(r.head_dim), dtype="bf16")
    return K.elementwise(r.op, int(r.tokens), int(r.width), dtype="bf16")


@pytest.mark.parametrize("around", ["torch", "auto"])
def test_shipped_spread_is_the_sweep_recomputed(around):
    # Independently of load_rows: the sweep's single-kernel rows (kernels_per_call 1) of the norm and pointwise ops,
    # each costed as `lmcost op` does on the H200 under torch (bands) and under auto (auto_bands: vLLM's designs),
    # 5th and 95th percentile of measured / calibrated.
    d = pd.read_csv(sweep_table())
    d = d[(d.status == "ok") & (d.kernels_per_call == 1) & d.op.isin(["rmsnorm", "layernorm", "silu_mul", "rope", "add"])]
    hw = choose_engine(load_gpu("h200"), around)[0]
    ratio = np.array([r.time_us * 1e-6 / K.cost(_ops(r), hw, "bf16")["time_s"]["calibrated"] for r in d.itertuples()])
    norm = d.op.isin(["rmsnorm", "layernorm"]).to_numpy()
    # 450 norm rows (5 implementations x 90) and 220 pointwise ones (silu_mul 2 x 70, rope 2 x 40)
    assert norm.sum() == 450 and (~norm).sum() == 220
    for cls, m in (("norm", norm), ("elementwise", ~norm)):
        lo, hi = np.percentile(ratio[m], [5, 95])
        assert stack_spread(around)[cls] == pytest.approx((lo, hi), abs=5e-4)


def test_bands_cover_the_held_out_sweep():
    # Sweep 1 (a separate run on the H200: PyTorch's fused norms, Triton, eager add), never fitted. Its single-kernel
    # rows inside the H200's band before (norm 0.747-1.3, elementwise 0.914-1.183) and inside auto's band after (the
    # union with the spread): norm 54% -> 85% of 84 rows, elementwise 25% -> 86% of 36 rows.
    r = load_rows(SWEEP1)
    shipped = {c: tuple(load_gpu("h200").efficiency.band(c)) for c in ("norm", "elementwise")}
    after = {c: tuple(choose_engine(load_gpu("h200"), "torch")[0].efficiency.band(c)) for c in shipped}
    assert after == {c: union(shipped[c], stack_spread()[c]) for c in shipped}
    before, now = coverage(r, shipped), coverage(r, after)
    assert (np.sum(r.cls == "norm"), np.sum(r.cls == "elementwise")) == (84, 36)
    assert before == pytest.approx({"norm": 45 / 84, "elementwise": 9 / 36})
    assert now["norm"] >= 0.8 and now["elementwise"] >= 0.8
    # auto (vLLM's designs): its band before the spread is the designs' (norm 0.775-1.347, elementwise 0.838-1.519),
    # after, their union with the spread around auto; sweep 1's kernels (none of them vLLM's) predicted under auto
    ra = load_rows(SWEEP1, around_gpu("auto"))
    designs = {c: tuple(around_gpu("auto").efficiency.band(c)) for c in shipped}
    auto = {c: tuple(choose_engine(load_gpu("h200"), None)[0].efficiency.band(c)) for c in shipped}
    assert auto == {c: union(designs[c], stack_spread("auto")[c]) for c in shipped}
    assert coverage(ra, auto)["norm"] >= 0.8 and coverage(ra, auto)["elementwise"] >= 0.8


def test_each_implementation_left_out():
    # The spread of the other implementations of the class, unioned with the H200's band, on the one left out
    # (sweep 2, rows pooled): norm 35% -> 84% of 450 rows, elementwise 14% -> 79% of 220. The worst left out is the
    # fastest kernel (Triton's RMSNorm, 58%; Triton SiLU-and-mul, 60%): no other implementation runs as far under
    # auto's figures, fitted on Liger's harness times, which carry a launch each.
    r = load_rows(sweep_table())
    shipped = {c: tuple(load_gpu("h200").efficiency.band(c)) for c in ("norm", "elementwise")}
    loio = leave_one_implementation_out(r, shipped)
    pooled = {c: sum(n * a for n, _, a in v.values()) / sum(n for n, _, _ in v.values()) for c, v in loio.items()}
    assert pooled["norm"] == pytest.approx(0.84, abs=0.005) and pooled["elementwise"] == pytest.approx(0.79, abs=0.005)
    assert loio["norm"]["rmsnorm triton"][2] == pytest.approx(52 / 90)


@pytest.mark.parametrize("engine", ["torch", "Torch"])
def test_op_rmsnorm_keeps_its_time_and_widens_its_band(engine):
    # 8192 x 4096 RMSNorm on an H100 (3.35 TB/s): bytes 8192 * 4096 * 2 (x) + the same (out) + 4096 * 2 (weight)
    # = 134,225,920 B; roofline 134,225,920 / 3.35e12 = 40.0674 us. torch's kinds.auto.rmsnorm (0.75 of bandwidth,
    # 5 us): 53.4233 + 5 = 58.4233 us, as before the spread. Band: the union of the H100's norm band (0.747-1.3) and
    # the spread (0.317-3.128): high 58.4233 * 3.128 = 182.748 us; low 58.4233 * 0.317 = 18.52 us, under the roofline,
    # so the roofline's 40.0674 us (a kernel cannot beat it).
    t = K.cost(K.norm("rmsnorm", 8192, 4096), choose_engine(load_gpu("h100-sxm"), engine)[0], "bf16")["time_s"]
    assert t["calibrated"] == pytest.approx(58.4233e-6, rel=1e-5)
    assert t["calibrated_high"] == pytest.approx(182.748e-6, rel=1e-5)
    assert t["calibrated_low"] == pytest.approx(40.0674e-6, rel=1e-5)
    assert t["calibrated_low"] <= t["calibrated"] <= t["calibrated_high"]
    # a runtime named is a kernel known: its band stays the GPU's (0.747-1.3)
    tr = K.cost(K.norm("rmsnorm", 8192, 4096), choose_engine(load_gpu("h100-sxm"), engine, None, "triton")[0], "bf16")["time_s"]
    assert tr["calibrated_high"] == pytest.approx(58.4233e-6 * 1.3, rel=1e-5)


@pytest.mark.parametrize("engine", [None, "auto"])
def test_op_rmsnorm_under_auto_is_vllms_design_with_the_spread_around_it(engine):
    # The same RMSNorm under auto: vLLM's scalar row design (rows-scalar-norm: 0.25 of the H200's 4.8 TB/s, latency-
    # bound, so 1.2e12 B/s on the H100's same 132 SMs; 1.25 us + 0.38 ns x 4096 = 2.80648 us):
    # 134,225,920 / 1.2e12 = 111.8549 us + 2.80648 = 114.6614 us. Band: the union of the designs' norm band (0.775-1.347)
    # and the spread around auto (0.327-2.512): high 114.6614 * 2.512 = 288.029 us; low 37.49 us, under the roofline,
    # so the roofline's 40.0674 us.
    t = K.cost(K.norm("rmsnorm", 8192, 4096), choose_engine(load_gpu("h100-sxm"), engine)[0], "bf16")["time_s"]
    assert t["calibrated"] == pytest.approx(114.6614e-6, rel=1e-5)
    assert t["calibrated_high"] == pytest.approx(288.029e-6, rel=1e-5)
    assert t["calibrated_low"] == pytest.approx(40.0674e-6, rel=1e-5)
    # a runtime named is a kernel known: the runtime's figures (triton: 0.75, 5 us = 58.4233 us) and the GPU's band
    tr = K.cost(K.norm("rmsnorm", 8192, 4096), choose_engine(load_gpu("h100-sxm"), engine, None, "triton")[0], "bf16")["time_s"]
    assert tr["calibrated"] == pytest.approx(58.4233e-6, rel=1e-5)
    assert tr["calibrated_high"] == pytest.approx(58.4233e-6 * 1.3, rel=1e-5)


def test_a_malformed_spread_is_one_error(tmp_path, monkeypatch):
    # A band below 1 at its top is not a spread of measured / predicted ratios: refused by name, not a traceback;
    # a file written before the section existed has no spread ({}), and auto's bands stay the GPU's.
    import lmcost.hardware.engine_memory as em
    from lmcost.basics.errors import LmcostError

    bad = tmp_path / "engine-memory-kernels.yaml"
    bad.write_text("stack_spread:\n  bands:\n    norm: [0.5, 0.9]\n")
    monkeypatch.setattr(em, "figures_file", lambda: bad)
    em.stack_spread.cache_clear()
    try:
        with pytest.raises(LmcostError, match=r"stack_spread.bands.norm is not .* \[low <= 1, high >= 1\]"):
            em.stack_spread()
        em.stack_spread.cache_clear()
        bad.write_text("designs: {}\n")
        assert em.stack_spread() == {}
    finally:
        em.stack_spread.cache_clear()
