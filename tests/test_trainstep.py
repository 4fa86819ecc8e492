"""A training step at scale (lmcost.apps.train): FLOPs conventions, the collectives of a TP/SP/PP
training step, recompute and the pipeline bubble, against figures worked by hand."""

from __future__ import annotations

import math

import pytest

from lmcost import load_config
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout
from lmcost.cost.compile import phase_ops
from lmcost.apps.train import TrainSetup, model_flops_per_token, train_step
from lmcost.operators.workload import Settings

BF16 = Precision()


@pytest.fixture(scope="module")
def llama70():
    return load_config("llama-3.1-70b")


def test_model_flops_per_token_palm_and_causal(llama70):
    # PaLM appendix B: 6N + 12 L H Q T per token. Llama-3.1-70B: N = 70,553,706,496 - 1,050,673,152 (the
    # embedding table, not multiplied) = 69,503,033,344; attention 6 x 64 heads x (128 + 128) x 8192 keys x 80
    # layers = 64,424,509,440: 417,018,200,064 + 64,424,509,440 = 481,442,709,504 FLOPs per token.
    assert model_flops_per_token(llama70, 8192, "palm") == 481_442_709_504
    # causal: the mean keys per query (8192 + 1) / 2 instead of 8192.
    assert math.isclose(model_flops_per_token(llama70, 8192, "causal"),
                        417_018_200_064 + 64_424_509_440 * 8193 / 2 / 8192, rel_tol=1e-15)


def test_flash_backward_is_two_and_a_half_forwards(llama70):
    # FlashAttention-2 (Dao 2023, section 3.1): the backward runs 5 matmuls against the forward's 2 (it
    # recomputes the scores): 2.5 x the forward's FLOPs.
    ops = phase_ops(llama70, BF16, "train", 1, 2048)
    fwd = next(op for op in ops if op.name == "layers.attn.sdpa")
    bwd = next(op for op in ops if op.name == "bwd.layers.attn.sdpa")
    assert bwd.flops == 2.5 * fwd.flops


def test_tp_training_step_collectives(llama70):
    # Megatron-LM (Shoeybi et al. 2019, figure 3): per layer 2 all-reduces forward (g after attention and MLP)
    # and 2 backward (f before them), each [b*s, d] bf16 = 1 x 4096 x 8192 x 2 = 67,108,864 B; the embedding's
    # forward all-reduce (none backward); vocab-parallel cross-entropy: 3 all-reduces of [b*s] fp32 = 16,384 B.
    ops = phase_ops(llama70, BF16, "train", 1, 4096, Settings(layout=Layout(tp=8)))
    big = sum(op.count for op in ops if op.collective == "all_reduce" and op.comm_bytes == 67_108_864)
    small = sum(op.count for op in ops if op.collective == "all_reduce" and op.comm_bytes == 16_384)
    assert big == 4 * 80 + 1 and small == 3
    assert not any(op.collective == "all_gather" for op in ops)  # no logits are gathered in training


def test_pipeline_bubble_and_recompute(llama70):
    # 1F1B, pp = 4, m = 32 microbatches: the slowest stage (the last: 20 layers + lm_head and loss; issue 26)
    # sets the steady state, the other three stages' times fill and drain: m max t + (sum t - max t)
    # (lmcost.cost.pipeline; (m + p - 1) t for equal stages, tests/test_train_pipeline.py works it by hand).
    # Full recompute adds every layer's forward again; HFU then exceeds MFU.
    gpu = load_gpu("h100")
    base = dict(gpus=64, seq=4096, global_batch=64, micro_batch=1, zero=1, layout=Layout(tp=8, pp=4, sp=True))
    r = train_step(llama70, gpu, TrainSetup(**base), "roofline")
    assert r.setup.dp == 2 and r.setup.microbatches == 32
    t = r.pipeline["stage_s"]
    assert r.pipeline["slowest_stage"] == 3 and t[1] == t[2] and t[0] < t[1] < t[3]
    assert math.isclose(r.parts_s["pipeline_s"], 32 * t[3] + t[0] + t[1] + t[2], rel_tol=1e-12)
    assert math.isclose(r.parts_s["bubble_s"], t[0] + t[1] + t[2], rel_tol=1e-12)
    full = train_step(llama70, gpu, TrainSetup(**base, recompute="full"), "roofline")
    assert full.step_s > r.step_s and full.parts_s["recompute_s"] > 0
    assert full.hfu > full.mfu and math.isclose(full.mfu_palm * full.step_s, r.mfu_palm * r.step_s, rel_tol=1e-12)
    # Selective recompute re-runs nothing with flash attention (no score-sized tensors are saved).
    sel = train_step(llama70, gpu, TrainSetup(**base, recompute="selective"), "roofline")
    assert sel.parts_s["recompute_s"] == 0


def test_selective_recompute_of_a_naive_kernel_repeats_the_attention_core():
    # A naive kernel saves its [b,h,s,s] scores; selective recompute re-runs QK^T, softmax and PV instead:
    # per layer 2 x (2 b h s^2 d_h) matmul FLOPs + 5 b h s^2 softmax FLOPs more hardware FLOPs, nothing more
    # model FLOPs. tiny-gqa: h = 8, d_h = 64, L = 4; b = 1, s = 256.
    # Per layer two matmuls of 2 x 1 x 8 x 256^2 x 64 = 67,108,864 each, and the softmax 5 x 8 x 256^2 = 2,621,440:
    # 136,839,168; x 4 layers.
    cfg = load_config("tiny-gqa")
    assert (cfg.attention.n_heads, cfg.d_h, cfg.n_layers) == (8, 64, 4)
    gpu = load_gpu("h100")
    base = dict(gpus=1, seq=256, global_batch=1, attention="naive")
    a = train_step(cfg, gpu, TrainSetup(**base), "roofline")
    b = train_step(cfg, gpu, TrainSetup(**base, recompute="selective"), "roofline")
    assert b.hardware_flops_per_gpu - a.hardware_flops_per_gpu == 4 * 136_839_168
    assert b.model_flops == a.model_flops


@pytest.mark.parametrize("kw, field", [
    (dict(gpus=6, layout=Layout(tp=4)), "gpus"),
    (dict(zero=4), "zero"),
    (dict(recompute="some"), "recompute"),
    (dict(virtual_stages=2), "virtual_stages"),
    (dict(schedule="zb"), "schedule"),
])
def test_bad_setups_refused_in_one_line(kw, field):
    base = dict(gpus=8, seq=4096, global_batch=64)
    with pytest.raises(LmcostError) as e:
        TrainSetup(**{**base, **kw})
    assert e.value.field == field


def test_global_batch_must_split_into_microbatches(llama70):
    with pytest.raises(LmcostError) as e:
        train_step(llama70, load_gpu("h100"), TrainSetup(gpus=16, seq=4096, global_batch=3, micro_batch=1,
                                                        layout=Layout(tp=8)))  # 3 sequences over dp = 2
    assert e.value.field == "global_batch"


def test_train_cli_json_and_memory_parts(llama70):
    # lmcost train --json: every memory part per GPU, the model states equal to lmcost.cost.optimizers' figure and the
    # total their sum with the activations; MFU = model FLOPs / (step x GPUs x peak).
    import json

    from typer.testing import CliRunner

    from lmcost.cli import app
    from lmcost.cost.optimizers import model_states

    r = CliRunner().invoke(app, ["train", "llama-3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "4",
                                 "--sp", "--seq", "4096", "--global-batch", "64", "--zero", "1", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    m = d["memory"]
    states = model_states(llama70, Layout(tp=8, pp=4, dp=2, sp=True), zero=1)
    assert m["model_states_bytes"] == states.total_bytes
    assert m["total_bytes"] == m["model_states_bytes"] + m["activations_bytes"]
    assert math.isclose(d["mfu"], d["model_flops_per_step"] / (d["step_s"] * 64 * 989.4e12), rel_tol=1e-9)
    assert d["layout"] == dict(tp=8, cp=1, pp=4, dp=2, ep=1, sp=True) and d["microbatches"] == 32


@pytest.mark.parametrize("args, field", [
    (["--gpus", "6", "--tp", "4"], "--gpus"),
    (["--zero", "5"], "--zero"),
    (["--recompute", "half"], "--recompute"),
    (["--optimizer", "lion"], "--optimizer"),
    (["--precision", "fp8"], "--precision"),
    (["--global-batch", "3"], "--global-batch"),
    (["--qlora"], "--qlora"),
    (["--lora-rank", "0"], "--lora-rank"),
])
def test_train_cli_refuses_bad_input_in_one_line(args, field):
    from typer.testing import CliRunner

    from lmcost.cli import app

    base = [x for k, v in {"--gpus": "8", "--global-batch": "64"}.items() if k not in args for x in (k, v)]
    r = CliRunner().invoke(app, ["train", "llama-3-8b", *base, *args])  # an option given twice is refused
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: {field}:") and r.output.count("\n") == 1, r.output


def test_plan_train_finds_a_fitting_step(llama70):
    # plan --train: the fastest setup that fits on 64 H100s; it fits per GPU and train reproduces its step time.
    from lmcost.apps.plan import search_train

    fits, _ = search_train(llama70, [load_gpu("h100")], 64, 4096, 64, micro_batches=(1,), zeros=(1,))
    best = fits.iloc[0]
    assert best.fits and best.memory_per_gpu_bytes <= 80e9
    again = train_step(llama70, load_gpu("h100"), TrainSetup(
        gpus=64, seq=4096, global_batch=64, layout=Layout(tp=int(best.tp), pp=int(best.pp), ep=int(best.ep), sp=bool(best.sp)),
        zero=1, recompute=best.recompute))
    assert math.isclose(again.step_s, best.step_s, rel_tol=1e-12)


def test_lora_backward_computes_input_gradients_only():
    # LoRA (Hu et al. 2021): the frozen base's backward runs dX = dY W^T only, half of a trained GEMM's
    # 2 x forward; model FLOPs are then 4N + attention per token (forward 2N, input gradients 2N).
    from lmcost.cost.optimizers import LoRA

    cfg = load_config("llama-3-8b")
    gpu = load_gpu("h100")
    base = dict(gpus=8, seq=4096, global_batch=8)
    full = train_step(cfg, gpu, TrainSetup(**base), "roofline")
    lora = train_step(cfg, gpu, TrainSetup(**base, lora=LoRA(rank=16)), "roofline")
    ops = phase_ops(cfg, BF16, "train", 1, 4096)
    bwd_gemm = sum(op.flops * op.count for op in ops if op.role.startswith("bwd.")
                   and op.op_class.value in ("gemm", "lm_head", "moe_routing"))
    # ... and the optimizer updates the adapters only (12 FLOPs per updated parameter; ZeRO-1 over the 8 replicas, TrainSetup's default)
    from lmcost.cost.optimizers import model_states

    upd = [model_states(cfg, Layout(dp=8), zero=1, lora=x).updated_params for x in (None, LoRA(rank=16))]
    assert math.isclose(full.hardware_flops_per_gpu - lora.hardware_flops_per_gpu,
                        bwd_gemm / 2 + 12 * (upd[0] - upd[1]), rel_tol=1e-12)
    n = 8_030_261_248 - 525_336_576  # parameters less the embedding table
    assert math.isclose(full.model_flops - lora.model_flops, 2 * n * 8 * 4096, rel_tol=1e-12)
    assert lora.step_s < full.step_s


def test_selective_recompute_flops_factor_of_korthikanti():
    # Korthikanti et al. 2022, section 5: a GPT layer's model FLOPs are 72 b s h^2 (1 + s/(6h)) per step
    # (forward + backward), and selective recompute repeats the attention's QK^T and PV forward matmuls,
    # 4 b s^2 h: hardware / model = 1 + s / (18h + 3s) from those matmuls. GPT-3 175B's layer (h = 12288,
    # a = 96, s = 2048), 2 layers here: 1 + 2048 / (221,184 + 6,144) = 1.009009...
    # The recomputed softmax (5 FLOPs) and dropout (1 FLOP) per probability, 6 b a s^2, come on top.
    from oracles import korthikanti_config

    cfg = korthikanti_config(n_layers=2)
    gpu = load_gpu("a100-80gb")
    base = dict(gpus=1, seq=2048, global_batch=1, attention="naive")
    a = train_step(cfg, gpu, TrainSetup(**base), "roofline")
    b = train_step(cfg, gpu, TrainSetup(**base, recompute="selective"), "roofline")
    bsz, s, h, heads, L = 1, 2048, 12288, 96, 2
    extra = b.hardware_flops_per_gpu - a.hardware_flops_per_gpu - L * 6 * bsz * heads * s * s
    model_per_layer = 72 * bsz * s * h * h * (1 + s / (6 * h))
    assert extra == L * 4 * bsz * s * s * h
    assert math.isclose(1 + extra / (L * model_per_layer), 1 + s / (18 * h + 3 * s), rel_tol=1e-12)


# ---- HF default configs that crashed `train` (issue 29's walk) ----

#: transformers 5.24's default BloomConfig (its model-relevant keys): d = 64, 2 layers, 8 heads, V = 250880, tied.
BLOOM_DEFAULT = dict(model_type="bloom", hidden_size=64, n_layer=2, n_head=8, vocab_size=250880,
                     layer_norm_epsilon=1e-5, apply_residual_connection_post_layernorm=False, tie_word_embeddings=True)


def _hf(data):
    from lmcost.model.hf.families import from_hf_config

    return from_hf_config(dict(data), data["model_type"])


@pytest.mark.parametrize("pp", [1, 2])
def test_bloom_embedding_norm_sits_with_the_embedding(pp):
    # By hand (d = 64, d_ff = 4d, V = 250880, biases everywhere): the table V*d = 16,056,320; the embeddings'
    # LayerNorm 2d = 128; a layer: 2 LayerNorms 256, qkv 64*192 + 192 = 12,480, dense 4,160, h_to_4h 16,640,
    # 4h_to_h 16,448: 49,984; the final norm 128. pp = 1: 16,156,544. pp = 2: stage 0 the table, its norm and
    # layer 0 (16,106,432); stage 1 layer 1, the final norm and the tied table's copy (16,106,432).
    from lmcost.cost.memory import _stage_statics
    from lmcost.cost.optimizers import param_tensors

    cfg = _hf(BLOOM_DEFAULT)
    want = [16_156_544] if pp == 1 else [16_106_432, 16_106_432]
    assert [st[0] for st in _stage_statics(cfg, BF16, Layout(pp=pp))] == want
    assert [sum(t.numel * t.count for t in stage) for stage in param_tensors(cfg, Layout(pp=pp))] == want
    step = train_step(cfg, load_gpu("h100"), TrainSetup(gpus=8, seq=4096, global_batch=64, layout=Layout(pp=pp)))
    assert step.memory["weights_bytes"] == 2 * want[0]  # bf16; the busiest stage is the first


def test_mpt_alibi_trains():
    # MPT (ALiBi, learned_pos_emb off under alibi): runs; ALiBi saves nothing, so its activations equal the
    # same model's with positions "none" (the bias add's backward passes dY through; flash: inside the kernel).
    data = dict(model_type="mpt", d_model=64, n_heads=4, n_layers=2, vocab_size=128, max_seq_len=4096,
                expansion_ratio=4, no_bias=True, attn_config=dict(alibi=True), tie_word_embeddings=True)
    cfg = _hf(data)
    assert cfg.positions == "alibi"
    from lmcost.cost.activations import layer_activation_bytes

    for kernel in ("flash", "naive"):
        ours = layer_activation_bytes(cfg, BF16, Layout(), 1, 256, kernel=kernel)
        plain = layer_activation_bytes(cfg.model_copy(update=dict(positions="none")), BF16, Layout(), 1, 256,
                                       kernel=kernel)
        assert ours.total == plain.total
    step = train_step(cfg, load_gpu("h100"), TrainSetup(gpus=8, seq=4096, global_batch=64))
    assert step.memory["total_bytes"] >= step.memory["weights_bytes"] > 0


@pytest.mark.transformers
@pytest.mark.parametrize("model_type, ep, what", [
    ("deepseek_v32", 1, "deepseek_v32 has DeepSeek sparse attention"),
    ("deepseek_v32", 8, "deepseek_v32 has DeepSeek sparse attention"),
    ("gemma3n_text", 1, "gemma3n_text has per-layer input embeddings (PLE)"),
    ("gemma4_text", 1, "gemma4_text has per-layer input embeddings (PLE)"),
])
def test_sparse_attention_and_per_layer_inputs_refuse_training(model_type, ep, what, tmp_path):
    # transformers' default config of each type, as a user's file
    from typer.testing import CliRunner

    from lmcost.cli import app

    transformers = pytest.importorskip("transformers")
    path = tmp_path / f"{model_type}.json"
    path.write_text(transformers.CONFIG_MAPPING[model_type]().to_json_string())
    r = CliRunner().invoke(app, ["train", str(path), "--gpu", "h100", "--gpus", str(8 * ep), "--ep", str(ep),
                                 "--seq", "4096", "--global-batch", "64", "--json"])
    assert r.exit_code == 2, r.output
    assert r.output.startswith(f"error: model: {what}") and r.output.count("\n") == 1, r.output
