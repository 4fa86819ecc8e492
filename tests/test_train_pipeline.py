"""Pipelines as runs use them (issue 26): uneven stages, ZeRO-3 (FSDP) x PP, recompute of N layers per
stage, the tied lm_head's model FLOPs and the stated FLOPs conventions, against figures worked by hand."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from lmcost import load_config
from lmcost.apps.train import TrainSetup, model_flops_per_token, train_step
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.activations import layer_activation_bytes, peak_activation_bytes
from lmcost.cost.pipeline import pipeline_time, stage_times
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout, stage_layers
from lmcost.operators.pipeline_split import chunk_layers, uneven_stages

BF16 = Precision()


@pytest.fixture(scope="module")
def tiny():
    return load_config("tiny-gqa")


def _cli(*args):
    from typer.testing import CliRunner

    from lmcost.cli import app

    return CliRunner().invoke(app, ["train", *args])


def test_llama3_405b_split_of_the_paper():
    # Dubey et al. 2024, section 3.3.2: 126 layers over 16 stages, one layer fewer on the first and the last:
    # Megatron-LM's --decoder-first/last-pipeline-num-layers 7 leave 126 - 14 = 112 = 14 x 8 for the middle.
    split = uneven_stages(126, 16, first=7, last=7)
    assert split == (7,) + (8,) * 14 + (7,)
    layers = stage_layers(SimpleNamespace(n_layers=126), 16, split)
    assert [len(s) for s in layers] == list(split) and layers[1][0] == 7 and layers[-1] == list(range(119, 126))
    # Interleaved, v = 4: 64 chunks of 2 layers, the first stage's first chunk and the last stage's last
    # chunk with one ("only the embedding" / "only output projection and loss" beside it).
    chunks = chunk_layers(SimpleNamespace(n_layers=126), 16, 4, split)
    sizes = [len(c) for c in chunks]
    assert sizes[0] == 1 and sizes[-1] == 1 and sizes.count(2) == 62 and sum(sizes) == 126
    assert [sizes[c] for c in range(0, 64, 16)] == [1, 2, 2, 2] and [sizes[c] for c in range(15, 64, 16)] == [2, 2, 2, 1]
    assert uneven_stages(32, 4, last=5) == (9, 9, 9, 5)  # 27 layers over the 3 others


@pytest.mark.parametrize("kw, field", [
    (dict(split=(7, 8, 8, 8)), "stage_layers"),  # 31 of 32 layers
    (dict(split=(16, 16)), "stage_layers"),  # 2 counts for 4 stages
    (dict(split=(8, 8, 8, 8), first=8), "stage_layers"),  # both ways at once
    (dict(first=7), "first_stage_layers"),  # 25 layers do not split over 3 stages
    (dict(last=0), "last_stage_layers"),
])
def test_splits_that_do_not_add_up_refused(kw, field):
    with pytest.raises(LmcostError) as e:
        uneven_stages(32, 4, kw.get("first"), kw.get("last"), kw.get("split"))
    assert e.value.field == field


@pytest.mark.parametrize("args, flag", [
    (["--pp", "4", "--stage-layers", "7,8,8,8"], "--stage-layers"),
    (["--pp", "4", "--stage-layers", "8,8,x,8"], "--stage-layers"),
    (["--pp", "4", "--first-stage-layers", "7"], "--first-stage-layers"),
    (["--first-stage-layers", "4"], "--first-stage-layers"),  # no pipeline
    (["--recompute-layers", "2"], "--recompute-layers"),  # needs --recompute full
])
def test_cli_refuses_bad_splits_in_one_line(args, flag):
    r = _cli("llama-3-8b", "--gpus", "8", "--global-batch", "64", *args)
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {flag}:") and r.output.count("\n") == 1, r.output


def _op(role, group="", count=1):
    return SimpleNamespace(role=role, group=group, count=count)


def test_stage_times_and_the_slowest_stage_worked_by_hand(tiny):
    # A 4-layer graph with round times (seconds, all instances): embed 1, a layer op 8 fwd / 16 bwd over 4
    # layers (2 and 4 per layer), one boundary's send 0.5 each way, lm_head 3 fwd / 6 bwd.
    ops = [_op("embed"), _op("attn.q_proj", "layers", 4), _op("pp.send"), _op("lm_head"),
           _op("bwd.lm_head"), _op("bwd.pp.send"), _op("bwd.attn.q_proj", "layers", 4), _op("bwd.embed")]
    times = [1.0, 8.0, 0.5, 3.0, 6.0, 0.5, 16.0, 1.0]
    flops = [0, 80.0, 0, 0, 0, 0, 0, 0]
    chunks = stage_layers(tiny, 2, (1, 3))
    st = stage_times(tiny, ops, times, flops, [], chunks, 2)
    # stage 0: 1 layer (2 + 4) + embed (1 + 1) + its activation send 0.5 = 8.5;
    # stage 1: 3 layers (6 + 12) + lm_head (3 + 6) + its gradient send 0.5 = 27.5.
    assert st.forward == [3.5, 9.0] and st.backward == [5.0, 18.5] and st.totals == [8.5, 27.5]
    # 1F1B, m = 4: 4 x 27.5 at the slowest stage + the other stage's 8.5 of fill and drain = 118.5.
    assert pipeline_time(st.totals, 4) == (118.5, 8.5, 1)
    # Interleaved (v = 2) over equal stages t: (m + (p - 1)/v) t, Narayanan et al. 2021's figure.
    assert pipeline_time([3.0, 3.0, 3.0], 4, 2) == (4 * 3.0 + 2 * 3.0 / 2, 3.0, 0)
    # Full recompute re-runs the layer op's forward: 2 per layer; with recompute_layers 1, one layer per stage.
    full = stage_times(tiny, ops, times, flops, [1], chunks, 2)
    one = stage_times(tiny, ops, times, flops, [1], chunks, 2, recompute_layers=1)
    assert full.recompute == [2.0, 6.0] and one.recompute == [2.0, 2.0] and one.recompute_flops == [20.0, 20.0]


def test_uneven_split_moves_the_slowest_stage(tiny):
    # The last stage runs lm_head + loss (V = 8000 at d = 512: 2 x 512 x 8000 MACs per token, about a
    # third of a layer's 2.8M): even 2/2 makes it the slowest; 3/1 makes stage 0 the slowest, with its
    # three layers; either way pipeline = m max t + (sum t - max t).
    gpu = load_gpu("h100")
    base = dict(gpus=2, seq=1024, global_batch=8)
    even = train_step(tiny, gpu, TrainSetup(**base, layout=Layout(pp=2)), "roofline")
    front = train_step(tiny, gpu, TrainSetup(**base, layout=Layout(pp=2, stage_split=(3, 1))), "roofline")
    assert even.pipeline["stage_layers"] == [2, 2] and even.pipeline["slowest_stage"] == 1
    assert front.pipeline["stage_layers"] == [3, 1] and front.pipeline["slowest_stage"] == 0
    for r in (even, front):
        t = r.pipeline["stage_s"]
        assert math.isclose(r.parts_s["pipeline_s"], 8 * max(t) + sum(t) - max(t), rel_tol=1e-12)
        assert math.isclose(r.parts_s["bubble_s"], sum(t) - max(t), rel_tol=1e-12)
    # Its busiest stage holds 3 layers' activations for its 2 in-flight microbatches (1F1B, stage 0).
    acts = layer_activation_bytes(tiny, BF16, Layout(pp=2), 1, 1024, fused=True)
    assert front.memory["activations_bytes"] == 2 * 3 * acts.per_layer["layers"] + 2 * acts.embedding


def test_zero3_with_pp_shards_each_stage_and_gathers_once(tiny):
    # tiny-gqa, pp 2 x dp 2, ZeRO-3, bf16-mixed AdamW (2 + 2 + 4 + 8 = 16 bytes per parameter):
    # a layer holds q, o 512^2 + k, v 512 x 128 + gate/up/down 3 x 512 x 1408 + 2 norms 512 = 2,819,072;
    # stage 1 (the busiest): 2 layers + final norm 512 + lm_head 8000 x 512 = 9,734,656 parameters,
    # sharded over dp 2: 4,867,328 x 16 = 77,877,248 bytes. Under PP the stage's weights stay gathered
    # and its gradients accumulate unsharded for the step (torchtitan): 9,734,656 x (2 + 2) = 38,938,624.
    r = train_step(tiny, load_gpu("h100"), TrainSetup(gpus=4, seq=256, global_batch=8, zero=3, layout=Layout(pp=2)))
    assert r.memory["model_states_bytes"] == 77_877_248
    assert r.memory["fsdp_pp_unsharded_bytes"] == 38_938_624
    assert r.memory["total_bytes"] == 77_877_248 + 38_938_624 + r.memory["activations_bytes"]


def test_zero3_with_pp_gathers_once_per_step():
    # One all-gather of the stage per step, however many microbatches: its exposed time does not grow with m
    # (without PP, ZeRO-3 gathers in every microbatch's forward and backward: m times).
    cfg, gpu = load_config("llama-3-8b"), load_gpu("h100")
    exposed = []
    for gb in (8, 32):  # pp 1: m = 1 and 4; pp 2: m = 2 and 8
        for pp in (1, 2):
            r = train_step(cfg, gpu, TrainSetup(gpus=8, seq=128, global_batch=gb, zero=3, layout=Layout(pp=pp)))
            exposed.append(r.parts_s["param_gather_exposed_s"])
    m4_pp1, m4_pp2, m16_pp1, m16_pp2 = exposed
    assert m4_pp2 > 0 and m4_pp2 == m16_pp2
    assert math.isclose(m16_pp1, 4 * m4_pp1, rel_tol=1e-9)


def test_recompute_layers_between_none_and_full(tiny):
    # tiny-gqa, 4 layers, one stage: recompute the first N. Activations: N layers keep their input only,
    # 4 - N keep everything, plus one layer's rebuilt set while it recomputes (N > 0); time: N of the 4
    # (identical) layers' forwards again.
    gpu = load_gpu("h100")
    none = layer_activation_bytes(tiny, BF16, Layout(), 1, 512, "none", fused=True)
    full = layer_activation_bytes(tiny, BF16, Layout(), 1, 512, "full", fused=True)
    keep, redo = none.per_layer["layers"], full.per_layer["layers"]
    base = dict(gpus=1, seq=512, global_batch=1)
    steps = {n: train_step(tiny, gpu, TrainSetup(**base, recompute="full", recompute_layers=n), "roofline")
             for n in (0, 1, 2, 4)}
    all_ = train_step(tiny, gpu, TrainSetup(**base, recompute="full"), "roofline")
    nothing = train_step(tiny, gpu, TrainSetup(**base), "roofline")
    for n, r in steps.items():
        hand = n * redo + (4 - n) * keep + none.embedding + none.head + (full.transient if n else 0)
        assert r.memory["activations_bytes"] == hand
        assert math.isclose(r.parts_s["recompute_s"], all_.parts_s["recompute_s"] * n / 4, rel_tol=1e-12)
    assert steps[0].memory["activations_bytes"] == nothing.memory["activations_bytes"]
    assert steps[4].memory["activations_bytes"] == all_.memory["activations_bytes"]
    assert math.isclose(steps[4].step_s, all_.step_s, rel_tol=1e-12)
    # The hardware FLOPs add the recomputed layers' forwards only: 2 of 4 is half of full's extra.
    extra = all_.hardware_flops_per_gpu - nothing.hardware_flops_per_gpu
    assert math.isclose(steps[2].hardware_flops_per_gpu - nothing.hardware_flops_per_gpu, extra / 2, rel_tol=1e-12)


def test_recompute_layers_per_stage_in_memory(tiny):
    # pp 2, 2 layers a stage, N = 1: stage 0 keeps 1 layer's input + 1 layer whole, x 2 in flight (1F1B).
    none = layer_activation_bytes(tiny, BF16, Layout(pp=2), 1, 512, "none")
    full = layer_activation_bytes(tiny, BF16, Layout(pp=2), 1, 512, "full")
    peak = peak_activation_bytes(tiny, BF16, Layout(pp=2), 1, 512, 4, "full", recompute_layers=1)
    stage0 = 2 * (full.per_layer["layers"] + none.per_layer["layers"]) + full.transient + 2 * none.embedding
    assert peak.per_stage[0] == stage0


def test_tied_lm_head_counts_in_model_flops():
    # MPT-7B (tied, d 4096, L 32, V 50432, d_ff 16384, no biases), palm at s = 2048, per token:
    # matmul weights 32 x (4 x 4096^2 + 2 x 4096 x 16384) = 6,442,450,944, LayerNorm weights 32 x 8192 + 4096
    # = 266,240 (counted in N, as before), the tied lm_head 50432 x 4096 = 206,569,472:
    # 6 x 6,649,286,656 + 12 x 32 x 4096 x 2048 = 39,895,719,936 + 3,221,225,472 = 43,116,945,408.
    # Before the fix the lm_head's 6 x 206,569,472 = 1,239,416,832 were dropped: 2.87% low (issue 26: 2.9%).
    from lmcost.model.hf.families import from_hf_config

    mpt = from_hf_config({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "expansion_ratio": 4,
                          "max_seq_len": 2048, "vocab_size": 50432, "no_bias": True, "attn_config": {"alibi": True}},
                         "mpt")
    assert mpt.tie_embeddings
    assert model_flops_per_token(mpt, 2048, "palm") == 43_116_945_408


@pytest.mark.torch
@pytest.mark.transformers
def test_tied_model_flops_against_flop_counter():
    # A tiny tied Llama, eager attention (every query-key pair: the palm count), loss.backward():
    # FlopCounterMode's matmul FLOPs = palm model FLOPs minus 6 x the RMSNorm weights per token
    # ((2 L + 1) d = 5 x 64 = 320: in N, not matmuls).
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import warnings

    from torch.utils.flop_counter import FlopCounterMode

    from lmcost.model.hf.families import from_hf_config

    cfg = transformers.LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=96, vocab_size=128, tie_word_embeddings=True, pad_token_id=None)
    cfg._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, 100, (2, 16))
    with FlopCounterMode(display=False) as fc:
        model(ids, labels=ids).loss.backward()
    ours = from_hf_config(cfg.to_dict(), "llama")
    assert ours.tie_embeddings
    assert model_flops_per_token(ours, 16, "palm") * 32 - 6 * 320 * 32 == fc.get_total_flops()


def test_conventions_stated_in_json_and_table():
    r = _cli("llama-3-8b", "--gpus", "8", "--global-batch", "8", "--seq", "32768", "--flops-convention", "palm",
             "--json")
    d = json.loads(r.stdout)
    assert d["mfu"] > d["hfu"]  # palm counts pairs the causal kernel skips at 32k ...
    assert "every query-key pair" in d["conventions"]["mfu_palm"] and "recomputation" in d["conventions"]["hfu"]
    text = _cli("llama-3-8b", "--gpus", "8", "--global-batch", "8").output
    assert "HFU: hardware FLOPs" in text and "MFU: model FLOPs" in text  # ... and the table says what each counts
