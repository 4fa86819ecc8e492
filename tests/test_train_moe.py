"""A MoE training step's terms beside its experts (lmcost.cost.moe_training), worked by hand on tiny-moe
(d 384, 4 layers, 8 experts top-2, bf16): the token permutations Megatron-Core's all-to-all dispatcher runs
around the dispatch and combine, forward and backward."""

from __future__ import annotations

import pytest

from lmcost import load_config
from lmcost.apps.train import TrainSetup, train_step
from lmcost.basics.dtypes import Precision
from lmcost.cost.moe_training import permute_ops, permute_seconds
from lmcost.cost.phases import op_totals, phase_records
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout
from lmcost.operators.workload import Settings

BF16 = Precision("bf16", "bf16", "bf16")


@pytest.fixture(scope="module")
def moe():
    return load_config("tiny-moe")


def _rec(cfg, layout=Layout(), b=1, s=64):
    return phase_records(cfg, BF16, "train", b, s, Settings(model="roofline", layout=layout))


def test_one_gpu_permutes_k_n_rows_forward_and_backward(moe):
    # One GPU, 64 tokens, top-2: the permute gathers k n = 128 rows of d = 384 (49,152 bf16 elements:
    # 98,304 bytes read and as many written), in each of the 4 MoE layers, forward and backward; no
    # all-to-all, so no chunk sort.
    got = permute_ops(_rec(moe))
    assert [op.name.split(".", 1)[1] for _, op in got] == ["moe.permute", "bwd.moe.permute"]
    for _, op in got:
        assert (op.flops, op.act_read_bytes, op.act_write_bytes, op.count) == (0, 98_304, 98_304, 4)


def test_expert_parallel_sorts_the_received_rows_by_local_expert(moe):
    # ep 2 over dp 2: the group routes 2 x 64 tokens, this rank runs P = k x 128 / 2 = 128 pairs on its
    # 4 experts; sort_chunks and unsort_chunks each copy P x d = 49,152 elements (98,304 bytes each way).
    # Imbalance 1.5 (the busiest rank's pairs over the mean): P = 192, the sorts 147,456 bytes; the permute
    # (this rank's own k n rows) does not change.
    for imbalance, sort_bytes in ((1.0, 98_304), (1.5, 147_456)):
        got = permute_ops(_rec(moe, Layout(ep=2, dp=2, imbalance=imbalance)))
        by = {op.name.split(".", 1)[1]: op for _, op in got}
        assert sorted(by) == sorted(f"{w}moe.{r}" for w in ("", "bwd.") for r in ("permute", "sort_chunks", "unsort_chunks"))
        assert by["moe.permute"].act_read_bytes == pytest.approx(98_304)
        assert by["moe.sort_chunks"].act_read_bytes == pytest.approx(sort_bytes, rel=1e-3)
        assert by["bwd.moe.unsort_chunks"].act_write_bytes == pytest.approx(sort_bytes, rel=1e-3)


def test_copies_sit_beside_the_combine_and_are_timed_as_memory_bound_kernels(moe):
    h100 = load_gpu("h100")
    rec = _rec(moe)
    ops = rec.graph.templates
    got = permute_ops(rec)
    assert [ops[i].role for i, _ in got] == ["moe.combine", "bwd.moe.combine"]
    # Roofline: 196,608 bytes per layer at the H100's 3.35 TB/s, x 4 layers, FLOPs 0.
    secs = permute_seconds(rec, h100, BF16, "roofline")
    for i, op in got:
        assert secs[i] == pytest.approx(float(op_totals([op], h100, BF16, "roofline").time_s))
    assert sum(secs.values()) == pytest.approx(2 * 4 * 196_608 / 3.35e12, rel=1e-6)


def test_a_dense_model_has_none_and_its_step_is_unchanged():
    dense = load_config("tiny-gqa")
    assert permute_ops(_rec(dense)) == []
    step = train_step(dense, load_gpu("h100"), TrainSetup(gpus=1, seq=64, global_batch=2), "roofline")
    assert step.parts_s["moe_permute_s"] == 0


def test_the_step_carries_the_copies_once_per_microbatch(moe, monkeypatch):
    # 4 microbatches of one sequence on one GPU: moe_permute_s = 4 x one microbatch's copies, and the
    # step is longer by that than the same step with the copies taken out (they run on the critical path;
    # memory-bound, so the clock does not scale them, and Megatron's step efficiency is 1; kernel launches
    # off, whose floor would hide microseconds at this size).
    from dataclasses import replace

    import lmcost.cost.moe_training as mt
    from lmcost.cost.train_system import system_figures

    h100 = load_gpu("h100")
    setup = TrainSetup(gpus=1, seq=64, global_batch=4, zero=0, framework="megatron")
    figures = replace(system_figures(h100, "megatron"), kernel_launch_us=0.0)
    step = train_step(moe, h100, setup, "roofline", figures=figures)
    one = sum(permute_seconds(_rec(moe), h100, BF16, "roofline").values())
    assert step.parts_s["moe_permute_s"] == pytest.approx(4 * one)
    monkeypatch.setattr(mt, "permute_seconds", lambda *a: {})
    bare = train_step(moe, h100, setup, "roofline", figures=figures)
    assert step.step_s - bare.step_s == pytest.approx(4 * one, rel=1e-6)
