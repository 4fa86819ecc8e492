"""The training step's system terms (lmcost.cost.train_system, lmcost.cost.train_overlap,
lmcost.hardware.power, lmcost.hardware.frameworks), each worked by hand on a tiny case: the exposed-gather
schedule of ZeRO-3/FSDP, the bucketed DP reduce, the clock under a power cap, kernel launches, SM contention,
overlap schemes, and the refusals of --framework, --overlap and --power-limit."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from lmcost import load_config
from lmcost.apps.train import TrainSetup, train_step
from lmcost.basics.errors import LmcostError
from lmcost.cost.train_overlap import Units, bucketed, exposed, schedule, zero3_step
from lmcost.cost.train_system import SystemFigures, parse_overlap, rated, system_figures
from lmcost.hardware.gpu import load_gpu
from lmcost.hardware.power import power_clock
from lmcost.operators.ops import OpClass, OpCost
from lmcost.operators.parallel import Layout


@pytest.fixture(scope="module")
def h100():
    return load_gpu("h100")


def test_gathers_prefetched_one_unit_ahead_expose_the_first_and_each_excess():
    # Three units of 1 s compute, each needing a 2 s gather, prefetched one ahead on one stream:
    # AG0 0-2, unit 0 2-3 (AG1 issued at 2: 2-4), unit 1 4-5 (AG2 4-6), unit 2 6-7: makespan 7,
    # exposed 7 - 3 = 4 = the first gather (2) + 2 x (2 - 1).
    assert schedule([1, 1, 1], [2, 2, 2], [0, 0, 0], 1) == 7
    assert exposed([1, 1, 1], [2, 2, 2], [0, 0, 0], 1).exposed_s == 4
    # Just in time (depth 0): each gather issued when the unit before ends: every gather exposed (6).
    assert exposed([1, 1, 1], [2, 2, 2], [0, 0, 0], 0).exposed_s == 6
    # Gathers shorter than the compute they prefetch under: only the first is exposed.
    assert exposed([3, 3, 3], [2, 2, 2], [0, 0, 0], 1).exposed_s == 2


def test_zero3_step_whose_gathers_exceed_compute_exposes_the_worked_excess():
    # 4 blocks, forward 1 s and backward 2 s each, a block's gather 3 s, reduce-scatter 1 s; no root unit.
    # Forward: 3 + 3 x (3 - 1) = 9 s exposed. Backward gathers alone: 3 + 3 x (3 - 2) = 6 s.
    # With the reduce-scatters on the same stream (by hand): AG1 0-3, B1 3-5, AG2 3-6, RS1 6-7, B2 6-8,
    # AG3 7-10, RS2 10-11, B3 10-12, AG4 11-14, RS3 14-15, B4 14-16, RS4 16-17: makespan 17 against 8 s of
    # compute, 9 s exposed, of which 9 - 6 = 3 s the reduce-scatters add.
    u = Units(head_fwd=0, block_fwd=1, tail_fwd=0, head_bwd=0, block_bwd=2, tail_bwd=0, n=4)
    g, r = zero3_step(u, 3.0, 0.0, 1.0, 0.0, forward_prefetch=1, backward_prefetch=1, regather=False)
    assert g.exposed_s == 9 + 6 and r.exposed_s == 3
    assert g.comm_s == 8 * 3 and r.comm_s == 4
    # The recompute forward's re-gather (DeepSpeed) doubles each backward gather: 6 s against 2 s of
    # compute: 6 + 3 x (6 - 2) = 18 s exposed in the backward, 9 in the forward.
    g2, _ = zero3_step(u, 3.0, 0.0, 0.0, 0.0, forward_prefetch=1, backward_prefetch=1, regather=True)
    assert g2.exposed_s == 9 + 18


def test_dp_reduce_in_one_bucket_exposes_all_of_it(h100):
    # One bucket: it is ready when the backward ends, and nothing hides it.
    assert bucketed(100.0, 1000.0, 5.0, lambda b: 2.0, before=False).exposed_s == 2.0
    # Two buckets of 2 s under a 5 s backward: the first ready at 2.5 s (runs to 4.5), the second at 5: 5-7,
    # 2 s exposed (the last bucket).
    assert bucketed(100.0, 50.0, 5.0, lambda b: 2.0, before=False).exposed_s == 2.0
    cfg = load_config("tiny-gqa")
    setup = TrainSetup(gpus=16, seq=256, global_batch=16, zero=0)
    one = replace(system_figures(h100, "megatron"), bucket_bytes=1e12, sm_contention=0.0)
    r = train_step(cfg, h100, setup, figures=one)
    assert r.parts_s["dp_comm_s"] > 0 and r.parts_s["dp_comm_exposed_s"] == pytest.approx(r.parts_s["dp_comm_s"], rel=1e-12)  # all of it, to rounding


def test_sm_contention_costs_f_times_the_communication_hidden(h100):
    # ZeRO-0 (no parameter gather): the step grows by f x (reduce issued - reduce exposed).
    cfg = load_config("llama-2-7b")
    setup = TrainSetup(gpus=16, seq=1024, global_batch=16, zero=0)
    base = replace(system_figures(h100, "megatron"), sm_contention=0.0)
    a = train_step(cfg, h100, setup, figures=base)
    b = train_step(cfg, h100, setup, figures=replace(base, sm_contention=0.25))
    hidden = a.parts_s["dp_comm_s"] - a.parts_s["dp_comm_exposed_s"]
    assert hidden > 0
    assert math.isclose(b.step_s - a.step_s, 0.25 * hidden, rel_tol=1e-9)


def test_power_cap_at_tdp_changes_nothing_and_below_it_slows_compute_bound_time(h100):
    cfg = load_config("tiny-gqa")
    setup = TrainSetup(gpus=8, seq=256, global_batch=8)
    free = train_step(cfg, h100, setup)
    assert train_step(cfg, h100, replace(setup, power_limit=700.0)).step_s == free.step_s  # H100 SXM TDP 700 W
    assert train_step(cfg, h100, replace(setup, power_limit=900.0)).step_s == free.step_s
    # Half the TDP under the cube law: the clock falls to 0.5^(1/3) = 0.7937.
    assert math.isclose(power_clock(350, 700, 3.0), 0.5 ** (1 / 3), rel_tol=1e-15)
    # A compute-bound op (C 2 s, M 1 s) at that clock: max(2 / 0.7937, 1) = 2.52 s; a memory-bound one
    # (C 1, M 2) keeps its 2 s; a collective (no roofline terms) keeps its time.
    ops = [OpCost("g", OpClass.GEMM), OpCost("n", OpClass.NORM), OpCost("c", OpClass.COMMUNICATION)]
    times = dict(compute_s=np.array([2.0, 1.0, 0.0]), memory_s=np.array([1.0, 2.0, 0.0]))
    t, added = rated(np.array([2.0, 2.0, 2.0]), times, ops, [1, 1, 1], SystemFigures(), 0.5 ** (1 / 3))
    assert np.allclose(t, [2.0 * 2 ** (1 / 3), 2.0, 2.0], rtol=1e-15)
    assert np.allclose(added["clock_s"], [2.0 * 2 ** (1 / 3) - 2.0, 0.0, 0.0], rtol=1e-15)


def test_kernel_launches_shorter_than_the_cpu_idle_the_gpu():
    # 10 us of CPU per launch: an op of 3 kernels of 4 us each leaves 3 x 6 us idle; a 20 us kernel none.
    ops = [OpCost("a", OpClass.ELEMENTWISE), OpCost("b", OpClass.GEMM)]
    times = dict(compute_s=np.zeros(2), memory_s=np.array([12e-6, 20e-6]))
    t, added = rated(np.array([12e-6, 20e-6]), times, ops, [3, 1], SystemFigures(kernel_launch_us=10.0), 1.0)
    assert np.allclose(added["kernel_launch_s"], [18e-6, 0.0], rtol=1e-12, atol=0)
    assert np.allclose(t, [30e-6, 20e-6], rtol=1e-12)


def test_zero3_exposure_grows_as_the_micro_batch_shrinks(h100):
    # The same tokens per step; the smaller the micro-batch, the more gathers (one set per microbatch) and the
    # less compute each hides under (the issue: worst as the micro-batch shrinks).
    cfg = load_config("llama-2-7b")
    exp = {}
    for mb in (1, 8):
        s = TrainSetup(gpus=64, seq=1024, global_batch=512, micro_batch=mb, zero=3, layout=Layout(cluster="aws-p5"))
        exp[mb] = train_step(cfg, h100, s).parts_s["param_gather_exposed_s"]
    assert exp[1] > 2 * exp[8] > 0


def test_tbo_hides_the_expert_all_to_all_up_to_the_compute(h100):
    # tiny-moe with EP over DP (tp 1, pp 1): the only collectives on the path are EP's all-to-alls, which
    # the class table sums as communication; two-batch overlap hides all of them (compute exceeds them),
    # and the step loses (1 - f) of that.
    cfg = load_config("tiny-moe")
    s = TrainSetup(gpus=8, seq=256, global_batch=16, layout=Layout(ep=8), zero=1)
    a = train_step(cfg, h100, s)
    b = train_step(cfg, h100, replace(s, overlap="tbo"))
    comm = a.parts_s["communication_s"]
    assert comm > 0 and math.isclose(b.parts_s["overlap_hidden_s"], comm, rel_tol=1e-9)
    f = system_figures(h100, "megatron").sm_contention
    assert math.isclose(a.step_s - b.step_s, (1 - f) * comm, rel_tol=1e-6)


def test_framework_auto_is_megatron_or_fsdp_under_zero3(h100):
    cfg = load_config("tiny-gqa")
    assert train_step(cfg, h100, TrainSetup(gpus=8, seq=256, global_batch=8)).to_dict()["framework"] == "megatron"
    d = train_step(cfg, h100, TrainSetup(gpus=8, seq=256, global_batch=8, zero=3)).to_dict()
    assert d["framework"] == "fsdp" and d["overlap"] == "none" and d["power_limit_w"] is None


@pytest.mark.parametrize("kw, field", [
    (dict(framework="jax"), "framework"),
    (dict(overlap="pipedream"), "overlap"),
    (dict(overlap="none,tbo"), "overlap"),
    (dict(overlap="dualpipe"), "overlap"),  # pp is 1
    (dict(overlap="async-tp"), "overlap"),  # tp is 1
    (dict(power_limit=0.0), "power_limit"),
])
def test_bad_system_settings_refused(kw, field):
    with pytest.raises(LmcostError) as e:
        TrainSetup(gpus=8, seq=256, global_batch=8, **kw)
    assert e.value.field == field


def test_overlap_list_parsed():
    assert parse_overlap("none") == () and parse_overlap("tbo, async-tp") == ("tbo", "async-tp")
    with pytest.raises(LmcostError) as e:  # a scheme named twice is a typo, not a second overlap
        parse_overlap("tbo, async-tp,tbo")
    assert e.value.field == "overlap"


def test_figures_out_of_range_refused():
    with pytest.raises(LmcostError) as e:
        SystemFigures(sm_contention=1.5)
    assert e.value.field == "sm_contention"


@pytest.mark.parametrize("args, field", [
    (["--framework", "jax"], "--framework"),
    (["--overlap", "pipedream"], "--overlap"),
    (["--power-limit", "lots"], "--power-limit"),
])
def test_train_cli_refuses_bad_system_flags_in_one_line(args, field):
    from typer.testing import CliRunner

    from lmcost.cli import app

    r = CliRunner().invoke(app, ["train", "tiny-gqa", "--gpus", "8", "--global-batch", "8", "--seq", "256", *args])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {field}:") and r.output.count("\n") == 1, r.output


def test_hsdp_shards_within_the_group_and_replicates_across(h100):
    # HSDP over all the dp ranks is FSDP; over 8 of 32 the model states are those of ZeRO-3 over dp = 8
    # (lmcost.cost.optimizers), and the gradient reduce adds the shard's all-reduce across the 4 replicas.
    from lmcost.cost.optimizers import model_states

    cfg = load_config("tiny-gqa")
    s = TrainSetup(gpus=32, seq=256, global_batch=32, zero=3, layout=Layout(cluster="aws-p5"))
    full = train_step(cfg, h100, s)
    assert train_step(cfg, h100, replace(s, shard_group=32)).step_s == full.step_s
    hsdp = train_step(cfg, h100, replace(s, shard_group=8))
    assert hsdp.memory["model_states_bytes"] == model_states(cfg, Layout(dp=8), zero=3).total_bytes
    assert hsdp.parts_s["dp_comm_s"] != full.parts_s["dp_comm_s"]
    with pytest.raises(LmcostError) as e:
        replace(s, shard_group=5)
    assert e.value.field == "shard_group"
    with pytest.raises(LmcostError) as e:
        replace(s, zero=1, shard_group=8)
    assert e.value.field == "shard_group"
