"""Totals are exact at any size (issue 10): FLOPs and bytes are Python ints, never a wrapped int64.

The oracle for every compiled evaluation is the graph built directly at int dims (lmcost.operators.assembly.build_ops,
no tracing, no compilation): each operator of the compiled phase must equal it, and each total must be
the exact sum of its operator rows. Hypothesis draws configs with widths up to 2^20 and workloads up to
2^40 tokens (batch and prompt up to 2^20 each), where FLOPs reach ~2^100.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmcost import Precision, Settings, Workload, estimate, load_config, load_gpu
from lmcost.model.config import ArchConfig
from lmcost.operators.fusion import PRESETS
from lmcost.cost.compile import phase_ops
from lmcost.cost.phases import grid
from lmcost.operators.assembly import build_ops, phase_dims
from test_properties import configs

H100 = load_gpu("h100")
BF16 = Precision()
WIDE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def wide_configs(draw):
    """A drawn config (test_properties.configs) with its widths redrawn up to 2^20."""
    data = draw(configs()).model_dump()
    data["d_model"] = draw(st.integers(1, 2**20))
    data["vocab_size"] = draw(st.integers(1, 2**20))
    data["ffn"]["d_ff"] = draw(st.integers(1, 2**20))
    if data.get("moe"):
        data["moe"]["d_ff_expert"] = draw(st.integers(1, 2**20))
    return ArchConfig.model_validate(data)


def same(a, b) -> bool:
    """Equal: exactly for ints, to 1e-12 for floats (MoE expert reads are expectations, not counts)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0)


FIELDS = ("flops", "weight_bytes", "act_read_bytes", "act_write_bytes", "kv_read_bytes", "kv_write_bytes",
          "params", "count", "kernels")


@WIDE
@given(wide_configs(), st.integers(1, 2**20), st.integers(1, 2**20), st.sampled_from(["default", "vllm", "none"]),
       st.sampled_from(["flash", "naive"]))
def test_compiled_phases_equal_the_graph_built_directly(cfg, b, s, fuse, kernel):
    fusion = tuple(f for f in PRESETS[fuse] if kernel == "flash" or f != "rope_attention")
    setting = Settings(kernel=kernel, fusion=fusion)
    for phase in ("prefill", "decode"):
        direct = build_ops(cfg, phase_dims(cfg, BF16, phase, b, s), phase, setting)
        compiled = phase_ops(cfg, BF16, phase, b, s, setting)
        assert [op.name for op in compiled] == [op.name for op in direct]
        for c, d in zip(compiled, direct):
            for f in FIELDS:
                assert same(getattr(c, f), getattr(d, f)), (phase, c.name, f, getattr(c, f), getattr(d, f))


@WIDE
@given(wide_configs(), st.integers(1, 2**20), st.integers(1, 2**20))
def test_totals_are_exact_sums_of_their_rows(cfg, b, s):
    est = estimate(cfg, H100, Workload(b, s, 2), BF16, Settings())
    for phase, tokens in (("prefill", s), ("decode", s + 2)):
        direct = build_ops(cfg, phase_dims(cfg, BF16, phase, b, tokens), phase, Settings())
        exact_flops = sum(op.flops * op.count for op in direct)
        total = getattr(est, phase)
        # Exact: the phase total is the int sum over the directly built graph, the rows add up to it,
        # and so do the classes. Bytes are ints too here (bf16: 2 bytes per element), except MoE reads.
        assert isinstance(total["flops"], int) and total["flops"] == exact_flops >= 0
        rows = [r for r in est.rows if r["phase"] == phase]
        assert sum(r["flops"] for r in rows) == total["flops"]
        # Bytes: an int sum, or where an MoE's expected expert reads make them floats, the correctly
        # rounded sum (math.fsum) of the rows, exactly.
        assert (sum if all(type(r["bytes"]) is int for r in rows) else math.fsum)(r["bytes"] for r in rows) == total["bytes"]
        classes = [c for c in est.class_rows if c["phase"] == phase]
        assert sum(c["flops"] for c in classes) == total["flops"]
        assert all(c["flops"] >= 0 and 0 <= c["flops_share"] <= 1 for c in classes)
        # The grid is float64 (documented): the same totals to float precision.
        g = grid(cfg, H100, BF16, phase, [b], [tokens], frame=False)
        assert math.isclose(g["flops"][0], exact_flops, rel_tol=1e-12)
        assert math.isclose(g["bytes"][0], float(total["bytes"]), rel_tol=1e-12)
        # And the grid's own compiled roofline (per-op max over folded forms) gives the same times.
        for key in ("time_s", "compute_s", "memory_s", "upper_s"):
            assert math.isclose(g[key][0], total["time_upper_s" if key == "upper_s" else key], rel_tol=1e-9), key


def test_the_issue_case_no_longer_wraps():
    # Issue 10: llama-3.1-70b, batch 4096, prompt 32768 printed the prefill GEMM class as -72.1 PFLOP.
    # 4096 * 32768 = 2^27 tokens through ~68.5B GEMM weights (2 FLOPs per MAC) is ~1.8e22 > 2^63 ~ 9.2e18.
    est = estimate(load_config("llama-3.1-70b"), H100, Workload(4096, 32768, 2))
    gemm = next(c for c in est.class_rows if c["phase"] == "prefill" and c["op_class"] == "gemm")
    rows = [r for r in est.rows if r["phase"] == "prefill" and r["op_class"] == "gemm"]
    assert gemm["flops"] == sum(r["flops"] for r in rows) > 2**63
    assert 0 < gemm["flops_share"] < 1
    assert est.to_dict()["prefill"]["flops"] == est.prefill["flops"] > 2**63


@WIDE
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e3, 1e3)), min_size=1, max_size=4), st.integers(1, 500))
def test_sum_of_max_is_the_sum_of_the_envelope(lines, n):
    from lmcost.cost.phases import sum_of_max

    brute = math.fsum(max(a + s * k for a, s in lines) for k in range(n))
    assert math.isclose(sum_of_max(lines, n), brute, rel_tol=1e-9, abs_tol=1e-6 * n)


@pytest.mark.parametrize("model", ["llama-3-8b", "mistral-7b", "mixtral-8x7b", "deepseek-v3", "gpt2"])
def test_decode_steps_in_closed_form_equal_each_step_summed(model):
    # TPOT sums gen - 1 decode steps; affine attention ops are summed in closed form (lmcost.cost.phases.
    # time_over_steps). The oracle: every step evaluated on its own and added up.
    from lmcost.cost.phases import phase_totals
    from lmcost.cost.steps import time_over_steps

    from lmcost.cost.compile import phase_graph

    cfg = load_config(model)
    # The closed form is what is under test: a global-attention model has affine decode attention ops.
    assert phase_graph(cfg, BF16, "decode").affine or model == "mistral-7b"
    first, last = 700, 1023  # gpt2 has 1024 learned positions
    for b in (1, 37):
        brute = math.fsum(phase_totals(cfg, H100, BF16, "decode", b, t).time_s for t in range(first, last + 1))
        assert math.isclose(time_over_steps(cfg, H100, BF16, "decode", b, first, last), brute, rel_tol=1e-12)


def test_decode_steps_across_a_window_edge():
    # Mistral-7B slides a 4096-token window: a decode step's keys grow to 4096 and stop (not affine).
    from lmcost.cost.phases import phase_totals
    from lmcost.cost.steps import time_over_steps

    cfg = load_config("mistral-7b")
    brute = math.fsum(phase_totals(cfg, H100, BF16, "decode", 3, t).time_s for t in range(4000, 4200))
    assert math.isclose(time_over_steps(cfg, H100, BF16, "decode", 3, 4000, 4199), brute, rel_tol=1e-12)


@pytest.mark.parametrize("model,gpu,kernel", [("llama-3-8b", "h100", "flash"), ("deepseek-v2-lite", "a100-80gb", "flash"),
                                              ("llama-3-8b", "l4", "flash"), ("gpt2", "h100", "naive")])
def test_calibrated_steps_past_the_first_chunk_in_closed_form(model, gpu, kernel):
    # Past its first ``chunk`` steps, time_over_steps sums an affine, non-GEMM op's calibrated time (and
    # its band's ends) in closed form (lmcost.cost.steps). The oracle: the same times evaluated at every
    # step and added up (one chunk as long as the run: the step-by-step path). l4 has no efficiency
    # block (calibrated = roofline); gpt2 naive's score and value GEMMs stay step by step. Past 20,000 keys
    # every decode kernel's occupancy is full (at most 128 keys per split on 132 SMs, one stream for MLA),
    # so nothing else is left to the steps.
    import numpy as np

    from lmcost.cost.compile import phase_graph
    from lmcost.cost.steps import _closed_tail, time_over_steps

    cfg, g, s = load_config(model), load_gpu(gpu), Settings(model="calibrated", kernel=kernel)
    first, last, chunk = 20000, 20719, 100
    graph = phase_graph(cfg, BF16, "decode", s)
    closed, _ = _closed_tail(graph, g, BF16, 1, first + chunk, last, "calibrated_s")
    gemm = [graph.templates[i].mnk is not None and graph.templates[i].kind != "sdpa" for i in graph.with_tokens]
    assert closed.tolist() == [not x for x in gemm] and closed.any()
    for b in (1, 37, np.array([1, 5, 64])):
        for key in ("calibrated_s", "calibrated_low_s", "calibrated_high_s"):
            fast = time_over_steps(cfg, g, BF16, "decode", b, first, last, s, chunk=chunk, key=key)
            slow = time_over_steps(cfg, g, BF16, "decode", b, first, last, s, chunk=last - first + 1, key=key)
            assert np.allclose(fast, slow, rtol=1e-12, atol=0), (b, key)


@pytest.mark.parametrize("model", ["mistral-7b", "gpt-oss-20b"])
def test_calibrated_steps_past_a_sliding_window_in_closed_form(model):
    # A sliding window's keys are min(context, window): not affine by formula, affine on each side of the
    # window. time_over_steps sums it in closed form on the halves of the run that lie on one side
    # (lmcost.cost.steps._tail) and step by step only on the one chunk holding the kink. The oracle: every
    # step evaluated and added up. The run 3,000..9,000 holds mistral's 4,096 window; gpt-oss-20b
    # alternates 128-token windows with global layers.
    import numpy as np

    from lmcost.cost.steps import time_over_steps

    cfg, g = load_config(model), load_gpu("h100")
    first, last = 3000, 9000
    for b in (7, np.array([1, 64])):
        for key in ("calibrated_s", "calibrated_high_s", "roofline_s"):
            s = Settings(model=key.split("_")[0])
            fast = time_over_steps(cfg, g, BF16, "decode", b, first, last, s, chunk=200, key=key)
            slow = time_over_steps(cfg, g, BF16, "decode", b, first, last, s, chunk=last - first + 1, key=key)
            assert np.allclose(fast, slow, rtol=1e-12, atol=0), (b, key)
