"""MFU's convention (lmcost.apps.train): model FLOPs never exceed the FLOPs that run, so MFU <= HFU, and
neither passes 100% when the step is timed at the roofline (the calibrated time is at or above it)."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lmcost import load_config
from lmcost.apps.train import TrainSetup, model_flops_per_token, train_step
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout

MODELS = {n: load_config(n) for n in ("llama-3-8b", "mistral-7b", "mixtral-8x7b", "gpt-oss-20b", "deepseek-v2-lite",
                                      "gpt2", "bert-large-layer")}
GPUS = {n: load_gpu(n) for n in ("h100", "a100-80gb", "b200", "l4")}


@st.composite
def steps(draw):
    """A training setup of a shipped model: tp, cp, pp, micro-batch, recompute, kernel, LoRA, 256 to 1M tokens."""
    name = draw(st.sampled_from(sorted(MODELS)))
    tp, cp, pp = (draw(st.sampled_from(v)) for v in ((1, 2, 4, 8), (1, 2, 8, 64), (1, 2, 4)))
    seq = cp * 2 ** draw(st.integers(8, 14))  # 256 .. 16k tokens per CP rank: up to 1M with cp = 64
    mb, dp = draw(st.sampled_from((1, 2))), draw(st.sampled_from((1, 2)))
    lora = draw(st.booleans())
    setup = dict(gpus=tp * cp * pp * dp, seq=seq, global_batch=dp * mb * draw(st.sampled_from((1, 4))),
                 micro_batch=mb, layout=Layout(tp=tp, cp=cp, pp=pp, sp=tp > 1 and draw(st.booleans())),
                 recompute=draw(st.sampled_from(("none", "selective", "full"))), zero=draw(st.sampled_from((1, 2))),
                 attention=draw(st.sampled_from(("flash", "naive"))))
    if lora:
        from lmcost.apps.setup import lora_adapters

        setup["lora"] = lora_adapters(16)
    return name, draw(st.sampled_from(sorted(GPUS))), setup


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(steps())
def test_mfu_at_most_hfu_at_most_one(drawn):
    # Timed at the roofline every operator takes at least flops / peak, so the FLOPs that run over the step
    # time cannot pass the peak (HFU <= 1); the default (causal) model FLOPs count only pairs the kernel
    # computes, so MFU <= HFU. Memory enters neither, so this holds whether or not the layout fits; the
    # calibrated time is at or above the roofline, so its MFU is at most the roofline's.
    name, gpu, setup = drawn
    cfg, hw = MODELS[name], GPUS[gpu]
    try:
        roof = train_step(cfg, hw, TrainSetup(**setup), "roofline")
    except LmcostError:  # a split the model or batch does not divide, or a layout it cannot take
        assume(False)
    assert roof.mfu == roof.mfu_causal
    assert roof.mfu <= roof.hfu * (1 + 1e-12) and roof.hfu <= 1 + 1e-12, (roof.mfu, roof.hfu, roof.fits)
    if hw.efficiency is not None:
        cal = train_step(cfg, hw, TrainSetup(**setup), "calibrated")
        assert cal.step_s >= roof.step_s * (1 - 1e-12) and cal.mfu <= roof.mfu * (1 + 1e-12)


def test_palm_counts_every_pair_and_passes_100_percent_at_long_context():
    # The case: Llama-3-8B, 1M tokens over cp = 16 (the layout does not need to fit for FLOPs).
    # palm's attention term per token is 6 x 32 heads x 256 x 1,048,576 keys x 32 layers = 1.649e15
    # against 6N = 6 x 7,504,924,672 = 4.5e10: it counts (s + 1)/(2 s) ~ 2x the pairs a causal kernel
    # runs, so its "MFU" exceeds the hardware FLOPs' and 100% at the roofline; the headline (causal) one does not.
    cfg = load_config("llama-3-8b")
    s = 1 << 20
    palm, causal = (model_flops_per_token(cfg, s, c) for c in ("palm", "causal"))
    attn = 6 * 32 * 256 * 32
    assert math.isclose(palm - causal, attn * (s - (s + 1) / 2), rel_tol=1e-12)
    r = train_step(cfg, load_gpu("h100"), TrainSetup(gpus=16, seq=s, global_batch=1, layout=Layout(cp=16)), "roofline")
    assert r.mfu_palm > 1 > r.hfu >= r.mfu == r.mfu_causal


def test_bidirectional_model_counts_every_pair_under_both_conventions():
    # A bidirectional encoder attends every key: causal and palm count the same s keys.
    cfg = MODELS["bert-large-layer"]
    assert not cfg.causal
    assert model_flops_per_token(cfg, 512, "causal") == model_flops_per_token(cfg, 512, "palm")


@pytest.mark.parametrize("convention, noted", [("causal", False), ("palm", True)])
def test_train_says_when_palm_counts_more_than_runs(convention, noted):
    from lmcost.apps.train_run import TrainRequest, run_train

    said = []
    run_train(TrainRequest(model="llama-3-8b", gpus=8, cp=8, seq=131072, global_batch=1, flops_convention=convention,
                           time_model="roofline"), said.append)
    assert any("exceeds the FLOPs that run" in line for line in said) == noted
