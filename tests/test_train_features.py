"""lmcost train's kernel features (issue 26): fp8 recipes, the attention kernel family forward and backward,
ring attention under CP and redundant experts, against figures worked by hand from the GPU YAMLs and the
model's shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmcost import load_config
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout
from lmcost.apps.train import TrainSetup, train_step

H100 = load_gpu("h100")
# Llama-3-8B: 32 layers of q [4096 -> 4096], k, v [4096 -> 1024], o [4096 -> 4096], gate, up [4096 -> 14336],
# down [14336 -> 4096]: 218,103,808 GEMM weights per layer (its 218,112,000 parameters per block less two
# RMSNorm weights of 4096); the sum over its GEMMs of K + N is 81,920.
LAYERS, W_LAYER, KN_LAYER = 32, 218_103_808, 81_920


@pytest.fixture(scope="module")
def llama8():
    return load_config("llama-3-8b")


def _step(cfg, model="roofline", gpu=H100, **kw):
    kw = dict(dict(gpus=1, seq=4096, global_batch=2, micro_batch=1), **kw)
    return train_step(cfg, gpu, TrainSetup(**kw), model)


def test_fp8_gemms_run_at_the_fp8_peak(llama8):
    # Roofline, one GPU, 2 microbatches of 4096 tokens: every layer GEMM is compute-bound at the fp8 peak too
    # (its intensity, >= 682 FLOP/B for the K/V projections, exceeds 1978.9e12 / 3.35e12 = 591), so each
    # forward GEMM's time goes from F / 989.4e12 to F / 1978.9e12, F = 2 x 4096 tokens x its weights.
    bf16, fp8 = _step(llama8), _step(llama8, precision="fp8-delayed")
    F = 2 * 4096 * W_LAYER * LAYERS
    saved = 2 * F * (1 / 989.4e12 - 1 / 1978.9e12)  # two microbatches
    assert math.isclose(bf16.parts_s["forward_s"] - fp8.parts_s["forward_s"], saved, rel_tol=1e-9)
    # the backward's dgrad and wgrad GEMMs: twice the forward's FLOPs, the same saving twice over
    assert math.isclose(bf16.parts_s["backward_s"] - fp8.parts_s["backward_s"], 2 * saved, rel_tol=1e-9)
    # Quantize kernels, memory-bound (H100 has no kernel floor): per microbatch X [4096, K] and dY [4096, N] of
    # every GEMM read in bf16 and written as fp8 copy + transpose, 4 bytes per element; the weights once per
    # step, 4 bytes per element.
    acts = 4096 * KN_LAYER * LAYERS * 4 / 3.35e12
    weights = W_LAYER * LAYERS * 4 / 3.35e12
    assert math.isclose(fp8.parts_s["fp8_quantize_s"], 2 * acts + weights, rel_tol=1e-9)
    assert bf16.parts_s["fp8_quantize_s"] == 0
    # the step's table by operator class shows the GEMMs at the fp8 rate too: 989.4 / 1978.9 of their bf16 time
    gemm = [next(r["time_s"] for r in st.class_rows if r["op_class"] == "gemm") for st in (bf16, fp8)]
    assert math.isclose(gemm[1], gemm[0] * 989.4 / 1978.9, rel_tol=1e-9)
    # MFU stays against the bf16 peak (the convention of NVIDIA's fp8 tables)
    d = fp8.to_dict()
    assert d["mfu_peak_dtype"] == "bf16"
    assert math.isclose(d["mfu"], d["model_flops_per_step"] / (d["step_s"] * 989.4e12), rel_tol=1e-12)


def test_fp8_calibrated_gemms_at_the_ratio_of_the_peaks(llama8):
    # Calibrated: a GEMM's time is overhead + F / (peak x 0.77 x shape(M, N, K)) with the same shape factor at
    # either peak, so only the compute term halves: the step's GEMMs are compute-bound and their overhead
    # (8 us x 7 GEMMs x 32 layers x 3 passes = 5.4 ms) small against 0.3 s, so the forward falls to between
    # half and 0.6 of the bf16 forward's GEMM time plus the unchanged rest.
    bf16, fp8 = _step(llama8, "calibrated"), _step(llama8, "calibrated", precision="fp8-delayed")
    rel = fp8.parts_s["forward_s"] / bf16.parts_s["forward_s"]
    assert 0.5 < rel < 0.75, rel
    assert fp8.tokens_per_s > bf16.tokens_per_s


def test_fp8_weight_copy_bytes(llama8):
    # Transformer Engine keeps an fp8 copy and an fp8 transpose of every layer GEMM weight: 2 bytes x
    # 218,103,808 x 32 = 13,958,643,712 B; block scaling adds an fp32 scale per 128x128 block of each, 4 / 16384
    # bytes per element. The states are bf16-mixed's.
    bf16 = _step(llama8)
    for recipe, per in (("fp8-delayed", 2), ("fp8-block", 2 * (1 + 4 / 16384))):
        m = _step(llama8, precision=recipe).memory
        assert m["fp8_weight_copy_bytes"] == math.ceil(W_LAYER * LAYERS * per)
        assert m["model_states_bytes"] == bf16.memory["model_states_bytes"]
        assert m["total_bytes"] == bf16.memory["total_bytes"] + m["fp8_weight_copy_bytes"]
    # ZeRO-3 over 8 ranks shards the copy with the weights
    m = _step(llama8, gpus=8, global_batch=8, zero=3, precision="fp8-delayed").memory
    assert m["fp8_weight_copy_bytes"] == 2 * math.ceil(W_LAYER * LAYERS / 8)


def test_fp8_on_a100_refused_in_one_line():
    from typer.testing import CliRunner

    from lmcost.cli import app

    r = CliRunner().invoke(app, ["train", "llama-3-8b", "--gpu", "a100", "--precision", "fp8-delayed"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: --precision: a100-80gb has no fp8") and r.output.count("\n") == 1, r.output


def test_attention_kernel_fa2_against_fa3_from_their_figures(llama8):
    # Calibrated, seq 4096, b = 1: the flash forward runs 2 b h P (d_qk + d_v) FLOPs per layer over P = s(s+1)/2
    # causal pairs per head, at 989.4e12 x peak_fraction x L / (L + l_half), L = P / s = 2048.5 keys per query
    # (h100-sxm.yaml efficiency.attention_prefill: fa2 0.40 and l_half 256, fa3 0.74 and 384, 3 us per
    # kernel each); its backward 2.5 x the FLOPs at the family's backward rate (fa2 0.86, fa3 0.75:
    # FeatureFigures). Everything else in the step is the same, so the differences are the attention's.
    s, L = 4096, 4097 / 2
    F = 2 * 32 * (s * (s + 1) / 2) * 256

    def t(frac, l_half, bwd=1.0, mult=1.0):
        return (3e-6 + mult * F / (989.4e12 * frac * L / (L + l_half))) / bwd  # the whole kernel's time scaled

    fa2, fa3 = (_step(llama8, "calibrated", attention_kernel=k) for k in ("fa2", "fa3"))
    m = 2 * LAYERS  # two microbatches of 32 layers
    # a compute-bound kernel runs at the sustained clock the fit found (h100-sxm.yaml training.sustained_clock)
    m /= H100.training.sustained_clock
    assert math.isclose(fa2.parts_s["forward_s"] - fa3.parts_s["forward_s"],
                        m * (t(0.40, 256) - t(0.74, 384)), rel_tol=1e-9)
    assert math.isclose(fa2.parts_s["backward_s"] - fa3.parts_s["backward_s"],
                        m * (t(0.40, 256, 0.86, 2.5) - t(0.74, 384, 0.75, 2.5)), rel_tol=1e-9)
    # (fa2's forward kernel takes 0.74/0.40 x (L + 256)/(L + 384) = 1.75 x fa3's compute time at this size)


def test_unknown_kernel_family_refused(llama8):
    with pytest.raises(LmcostError) as e:
        _step(llama8, "calibrated", attention_kernel="fa9")
    assert e.value.field == "efficiency.kernel"


def test_ring_attention_per_block_kernel(llama8):
    # Under cp = 2 the training record's flash kernel runs as 2 ring blocks: mnk's keys are 1/cp of the rank's
    # pairs, so the ramp reads L = (P / 2) / (s / 2) / 2 keys per query per block, P = S(S+1)/2 over the whole
    # S = 8192-token sequence, and each block pays the 3 us kernel overhead.
    from lmcost.cost.compile import phase_records
    from lmcost.cost.phases import PhaseCost
    from lmcost.operators.workload import Settings

    S, cp = 8192, 2
    rec = phase_records(llama8, Precision(), "train", 1, S, Settings(layout=Layout(cp=cp), model="calibrated"))
    i = next(j for j, op in enumerate(rec.graph.templates) if op.role == "attn.sdpa")
    P_rank = S * (S + 1) / 2 / cp
    L = P_rank / (S / cp) / cp
    F = 2 * 32 * P_rank * 256
    want = cp * 3e-6 + F / (989.4e12 * 0.54 * L / (L + 384))  # auto's figures: 0.54, l_half 384
    got = PhaseCost(rec, H100, Precision(), "train", "calibrated").times["time_s"][i] / LAYERS
    assert math.isclose(got, want, rel_tol=1e-9)


def test_ring_exposed_send_worked_by_hand():
    # 4 layers, cp = 3: 2 sends per layer and pass. Forward: attention 12 ms over the layers (1 ms per block),
    # sends 8 x 1.5 ms: each exposes 0.5 ms, 4 ms in all, 8 ms hidden. Backward: attention 24 ms (2 ms a
    # block), sends 8 x 1.5 ms: all hidden.
    from lmcost.cost.attention_training import ring_exposed
    from lmcost.operators.ops import OpClass, OpCost

    ops = [OpCost("attn.sdpa", OpClass.ATTENTION, count=4, group="layers"),
           OpCost("cp.kv_ring", OpClass.COMMUNICATION, count=8, group="layers"),
           OpCost("other", OpClass.GEMM, count=4, group="layers"),
           OpCost("bwd.cp.kv_ring", OpClass.COMMUNICATION, count=8, group="layers"),
           OpCost("bwd.attn.sdpa", OpClass.ATTENTION, count=4, group="layers")]
    per_op = np.array([12e-3, 12e-3, 5e-3, 12e-3, 24e-3])
    out, exposed, hidden = ring_exposed(ops, per_op, [op.count for op in ops])
    assert np.allclose(out, [12e-3, 4e-3, 5e-3, 0.0, 24e-3], rtol=0, atol=1e-15)
    assert math.isclose(exposed, 4e-3) and math.isclose(hidden, 20e-3)
    # half the block's time overlapping: forward 8 x (1.5 - 0.5) = 8 ms, backward 8 x (1.5 - 1) = 4 ms
    _, exposed, _ = ring_exposed(ops, per_op, [op.count for op in ops], overlap=0.5)
    assert math.isclose(exposed, 12e-3)


def test_ring_sends_split_into_exposed_and_hidden(llama8):
    # tp = pp = 1: the step's only collectives in its class rows are the ring's, so exposed + hidden is their time.
    r = train_step(llama8, H100, TrainSetup(gpus=2, seq=2048, global_batch=1, layout=Layout(cp=2)), "roofline")
    p = r.parts_s
    assert p["cp_ring_hidden_s"] > 0
    assert math.isclose(p["cp_ring_exposed_s"] + p["cp_ring_hidden_s"], p["communication_s"], rel_tol=1e-12)


def test_redundant_experts_bytes():
    # Mixtral-8x7B, EP 8 over dp (tp 1), 8 redundant experts: one replica per rank per MoE layer, 3 x 4096 x
    # 14336 = 176,160,768 weights x 32 layers = 5,637,144,576 parameters. bf16-mixed AdamW under ZeRO-1:
    # on 8 GPUs (expert dp 1) 2 + 2 + 4 + 8 = 16 B each; on 16 (expert dp 2) 2 + 2 + (4 + 8) / 2 = 10 B.
    cfg = load_config("mixtral-8x7b")
    P = 3 * 4096 * 14336 * 32
    for gpus, per in ((8, 16), (16, 10)):
        for n in (8, 5):  # 5 replicas over 8 ranks: the busiest holds ceil(5/8) = 1
            st = train_step(cfg, H100, TrainSetup(gpus=gpus, seq=1024, global_batch=gpus, layout=Layout(ep=8),
                                                  redundant_experts=n), "roofline")
            assert st.memory["redundant_experts_bytes"] == P * per
    setup = dict(gpus=8, seq=1024, global_batch=8, layout=Layout(ep=8))
    base = train_step(cfg, H100, TrainSetup(**setup), "roofline")
    more = train_step(cfg, H100, TrainSetup(**setup, redundant_experts=8), "roofline")
    assert base.memory["redundant_experts_bytes"] == 0
    assert more.memory["total_bytes"] - base.memory["total_bytes"] == P * 16
    # under an fp8 recipe each replica's weights also get TE's fp8 copy and transpose: 2 more bytes each
    fp8 = train_step(cfg, H100, TrainSetup(**setup, redundant_experts=8, precision="fp8-delayed"), "roofline")
    assert fp8.memory["redundant_experts_bytes"] == P * 18


def test_redundant_experts_refused_without_ep(llama8):
    with pytest.raises(LmcostError) as e:
        _step(llama8, redundant_experts=2)
    assert e.value.field == "redundant_experts"
    with pytest.raises(LmcostError) as e:
        train_step(load_config("mixtral-8x7b"), H100, TrainSetup(gpus=1, seq=1024, global_batch=1, redundant_experts=2))
    assert "ep is 1" in str(e.value)


def test_runtime_selects_the_memory_bound_figures_estimate_uses(llama8):
    # --runtime on train picks the same efficiency block as estimate --runtime (lmcost.apps.setup.select_efficiency):
    # the step under torch-eager equals the step on the GPU copy with that runtime's figures chosen, and the
    # eager figures (H100's torch-eager norm: 0.54 of bandwidth against auto's 0.73, h100-sxm.yaml) make the norms slower.
    from lmcost.apps.setup import select_efficiency

    eager = _step(llama8, "calibrated", runtime="torch-eager")
    chosen = _step(llama8, "calibrated", gpu=select_efficiency(H100, None, "torch-eager"))
    auto = _step(llama8, "calibrated")
    assert eager.step_s == chosen.step_s
    assert eager.step_s > auto.step_s
    with pytest.raises(LmcostError, match="runtime"):
        _step(llama8, "calibrated", runtime="bogus")
