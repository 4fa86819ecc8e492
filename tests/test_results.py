"""Typed results (issue 23): frozen, keyword-only, slotted dataclasses whose ``to_dict()`` is the dict
the library returned before it was typed (the keys below are copied from that code, commit 49bb77b),
and records whose columns are read by name.

The oracle for the named columns is the graph built directly at int dims
(:func:`lmcost.operators.assembly.build_ops`, no tracing, no compilation)."""

from __future__ import annotations

import dataclasses

import pytest

from lmcost import Precision, Settings, load_config, load_gpu
from lmcost.cost.activations import layer_activation_bytes, peak_activation_bytes
from lmcost.cost.compile import phase_records
from lmcost.cost.optimizers import model_states
from lmcost.cost.phases import PhaseCost, op_times, phase_totals
from lmcost.cost.timing import op_statics
from lmcost.operators.assembly import build_ops, phase_dims
from lmcost.operators.parallel import Layout

CFG = load_config("tiny-gqa")
H100 = load_gpu("h100")
BF16 = Precision()

# The keys each function's dict had, in order, before it was typed.
TOTALS = ["flops", "bytes", "compute_s", "memory_s", "time_s", "upper_s"]
PHASE_TOTALS = ["flops", "bytes", "compute_s", "memory_s", "roofline_s", "upper_s", "calibrated_s",
                "calibrated_low_s", "calibrated_high_s", "time_s"]
STATES = ["weights_bytes", "grads_bytes", "master_bytes", "optimizer_bytes", "step_bytes", "weights_unsharded_bytes",
          "grads_unsharded_bytes", "weights_shard_bytes", "updated_params", "trainable_params", "frozen_params",
          "total_bytes", "stage"]
ROOFLINE_STATICS = ["peak", "eff", "bandwidth_roof", "floor_s", "collectives", "comm"]


def test_to_dict_keeps_the_keys_of_the_dicts_it_replaces():
    rec = phase_records(CFG, BF16, "prefill", 2, 64)
    assert list(phase_totals(CFG, H100, BF16, "prefill", 2, 64).to_dict()) == TOTALS
    assert list(PhaseCost(rec, H100, BF16, "prefill").totals().to_dict()) == PHASE_TOTALS
    assert list(model_states(CFG, Layout(dp=4), zero=1).to_dict()) == STATES
    assert list(layer_activation_bytes(CFG, BF16, Layout(), 1, 64).to_dict()) == [
        "per_layer", "layers", "embedding", "head", "transient", "tensors", "total"]
    assert list(peak_activation_bytes(CFG, BF16, Layout(pp=2), 1, 64, 4).to_dict()) == [
        "bytes", "stage", "in_flight", "per_stage"]
    assert list(op_times(rec, H100, BF16, ("roofline",)).to_dict()) == ["compute_s", "memory_s", "roofline_s", "upper_s"]
    # A datasheet GPU (no efficiency block) fills only the roofline's statics; a fitted one all of them.
    a100 = load_gpu("a100").model_copy(update={"efficiency": None})
    assert list(op_statics(rec.graph.templates, a100, BF16).to_dict()) == ROOFLINE_STATICS
    # 22 + q_per_stream (issue 25) + pre_cta_us, dec_cta_us, quant_bytes (issue 25, second round)
    assert len(op_statics(rec.graph.templates, H100, BF16).to_dict()) == 26


def test_results_are_frozen_and_keyword_only():
    t = phase_totals(CFG, H100, BF16, "decode", 1, 128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.time_s = 0.0
    with pytest.raises(TypeError):
        type(t)(*t.to_dict().values())
    assert not hasattr(t, "__dict__")  # slots


def test_records_columns_are_named_and_equal_the_graph_built_directly():
    settings = Settings()
    rec = phase_records(CFG, BF16, "decode", 3, 100, settings)
    direct = build_ops(CFG, phase_dims(CFG, BF16, "decode", 3, 100), "decode", settings)
    assert rec.cols.flops == tuple(op.flops for op in direct)
    assert rec.cols.bytes == tuple(op.bytes for op in direct)
    assert rec.cols.kv_read_bytes == tuple(op.kv_read_bytes for op in direct)
    assert (rec.cols.m, rec.cols.n, rec.cols.k) == tuple(
        tuple(1 if op.mnk is None else op.mnk[i] for op in direct) for i in range(3))
    assert rec.col("count") == rec.cols.count == tuple(op.count for op in direct)
