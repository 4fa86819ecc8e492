"""Refusals of ``lmcost train``, ``plan --train`` and ``fit --training`` inputs that the step would
otherwise cost as if they ran (lmcost.apps.train_checks): each one line ``error: <flag>: <what>; <fix>``,
exit 2, the bound in the line worked by hand in the comment."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from lmcost.cli import app

BASE70 = ["train", "llama-3.1-70b", "--gpus", "64", "--pp", "4"]  # 80 layers (Llama 3.1 70B config)
MIXTRAL = ["train", "mixtral-8x7b", "--gpus", "8", "--ep", "8"]  # 8 experts per MoE layer
SMALL = ["train", "tiny-gqa", "--gpus", "8", "--global-batch", "8", "--seq", "256"]


def one_line(args: list[str]) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    return r.output.strip()


@pytest.mark.parametrize("args, line", [
    # 80 layers / pp 4 = 20 per stage
    (BASE70 + ["--recompute", "full", "--recompute-layers", "21"],
     "error: --recompute-layers: 21 layers to recompute, and the largest stage has 20; give 0 to 20 (layers of each stage)"),
    (BASE70 + ["--recompute", "full", "--recompute-layers", "1000000"],
     "error: --recompute-layers: 1000000 layers to recompute, and the largest stage has 20; give 0 to 20 (layers of each stage)"),
    # interleaved, 2 chunks per stage: 80 / (4 x 2) = 10 per chunk
    (BASE70 + ["--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "full", "--recompute-layers", "11"],
     "error: --recompute-layers: 11 layers to recompute, and the largest model chunk has 10; give 0 to 10 (layers of each model chunk)"),
    # first 80 leaves 80 - 80 = 0 layers for 3 middle stages; at most 80 - 3 = 77 on the first/last
    (BASE70 + ["--first-stage-layers", "80"],
     "error: --first-stage-layers: the first/last stages take 80 of the 80 layers and leave 0 for the 3 middle "
     "stages, which need 1 or more each; give the first/last stages 77 layers or fewer in all"),
    (MIXTRAL + ["--ep-imbalance", "9"],
     "error: --ep-imbalance: 9 is the busiest rank's tokens over the mean of 8 expert-parallel ranks, which cannot "
     "pass 8 (every token on one rank); give 1 to 8"),
    # every rank holds all 8 experts after 8 x (8 - 1) = 56 replicas
    (MIXTRAL + ["--redundant-experts", "100000"],
     "error: --redundant-experts: 100000 replicas, and with 8 experts over ep=8 every rank holds every expert after "
     "56 (EPLB replicates hot experts on other ranks); give 0 to 56"),
    # H100 SXM TDP 700 W: 0.25 x 700 = 175 W to 2 x 700 = 1400 W
    (SMALL + ["--power-limit", "1"],
     "error: --power-limit: 1 W is outside the caps h100-sxm takes: 175 W (25% of its 700 W TDP, as nvidia-smi's "
     "minimum) to 1400 W; give 175 to 1400 W, or leave the cap out"),
    (SMALL + ["--power-limit", "1401"],
     "error: --power-limit: 1401 W is outside the caps h100-sxm takes: 175 W (25% of its 700 W TDP, as nvidia-smi's "
     "minimum) to 1400 W; give 175 to 1400 W, or leave the cap out"),
    (SMALL + ["--tp", "2", "--overlap", "async-tp,async-tp"],
     "error: --overlap: async-tp is named twice; name each scheme once"),
    (SMALL + ["--framework", "fsdp", "--zero", "1"],
     "error: --zero: PyTorch FSDP shards as ZeRO-3 (FULL_SHARD), ZeRO-2 (SHARD_GRAD_OP) or not at all (NO_SHARD, "
     "DDP): it has no ZeRO-1 (--zero 1 is the default); give --zero 0, 2 or 3 with fsdp, or --framework megatron"),
    # DualPipe is its own bidirectional schedule (DeepSeek-V3 technical report, section 3.2.1)
    (SMALL + ["--pp", "2", "--overlap", "dualpipe", "--schedule", "gpipe"],
     "error: --overlap: dualpipe is a pipeline schedule of its own (DeepSeek-V3 report, 3.2.1), and --schedule is "
     "gpipe; drop --schedule (1f1b), or drop dualpipe from --overlap"),
    (SMALL + ["--framework", "megatron", "--zero", "2"],
     "error: --zero: Megatron-LM's distributed optimizer shards optimizer states only (ZeRO-1); it does not shard "
     "gradients; use --zero 1 with megatron, or --framework deepspeed or fsdp"),
    (SMALL + ["--framework", "deepspeed", "--zero", "3", "--pp", "2"],
     "error: --zero: DeepSpeed's pipeline engine refuses ZeRO-3 with pp > 1; use --framework fsdp, which runs ZeRO-3 "
     "with pipeline stages, or --zero 1, or --pp 1"),
    (SMALL + ["--precision", "mxfp8", "--gpu", "h100"],
     "error: --precision: mxfp8 needs block-scaled (MX) tensor cores, and h100-sxm has none (the marker: an fp4 "
     "peak, listed by Blackwell and CDNA 4 GPUs only); use --precision fp8-delayed, fp8-current or fp8-block, or a "
     "Blackwell GPU"),
    (SMALL + ["--precision", "mxfp8", "--gpu", "mi355x"],  # its YAML: fp8 and fp4 peaks, no bf16
     "error: --precision: mi355x has no bf16 peak, which mxfp8 computes in outside its fp8 GEMMs (the lm_head, "
     "attention, and MFU's denominator); mi355x's YAML lists no peak any recipe computes in: add its peak_tflops, "
     "or use another GPU"),
    (SMALL + ["--precision", "fp16-mixed", "--gpu", "h100-nvl"],  # its YAML: no peak at all
     "error: --precision: h100-nvl has no fp16 peak, which fp16-mixed computes in; h100-nvl's YAML lists no peak "
     "any recipe computes in: add its peak_tflops, or use another GPU"),
    (SMALL + ["--precision", "fp9"],
     "error: --precision: unknown recipe 'fp9'; use one of bf16-mixed, bf16-mixed-fp32-grads, fp16-mixed, fp32, "
     "bf16, fp8-delayed, fp8-current, fp8-block, mxfp8"),
    (["plan", "tiny-gqa", "--gpus", "8", "--train", "--precision", "fp9"],
     "error: --precision: unknown recipe 'fp9'; use one of bf16-mixed, bf16-mixed-fp32-grads, fp16-mixed, fp32, "
     "bf16, fp8-delayed, fp8-current, fp8-block, mxfp8"),
    (["fit", "--training", "--rows", ""],
     "error: --rows: is empty, which would read as every row; give row numbers, e.g. 1-20,35, or drop it"),
    (["fit", "--training", "--source", ""],
     "error: --source: has an empty text, which every source contains; give part of a source's name, or drop it"),
    (["fit", "--training", "--table", "/nonexistent.csv"],
     "error: --table: /nonexistent.csv: no such file; check the path; give the path of a table"),
])
def test_train_input_refused_in_one_line(args, line):
    assert one_line(args) == line


def test_a_gpu_with_some_peaks_is_told_the_recipes_it_has():
    # a100-80gb lists bf16, fp16 and fp32 peaks and no fp8: asked for fp16-mixed on a copy without fp16,
    # the fix names the bf16 and fp32 recipes only.
    from lmcost.apps.train import _compute_precision
    from lmcost.apps.train_checks import check_peak
    from lmcost.basics.errors import LmcostError
    from lmcost.hardware.gpu import load_gpu

    gpu = load_gpu("a100-80gb")
    gpu = gpu.model_copy(update={"peak_tflops": {k: v for k, v in gpu.peak_tflops.items() if k != "fp16"}})
    with pytest.raises(LmcostError) as e:
        check_peak(gpu, "fp16-mixed", lambda p: _compute_precision(p).activations)
    assert e.value.fix == "use `precision` bf16-mixed, bf16-mixed-fp32-grads, fp32, bf16"


def test_the_bounds_themselves_run():
    # 20 layers of 20, 56 replicas of 56, 175 W and 1400 W: accepted.
    for args in (BASE70 + ["--recompute", "full", "--recompute-layers", "20"],
                 MIXTRAL + ["--redundant-experts", "56", "--ep-imbalance", "8"],
                 SMALL + ["--power-limit", "175"], SMALL + ["--power-limit", "1400"],
                 ["plan", "tiny-gqa", "--gpus", "8", "--train", "--precision", "fp8-delayed"]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, (args, r.output)


@pytest.mark.parametrize("args, note", [
    (["--model", "roofline", "--kernel", "fa2"], "note: --kernel and --runtime choose efficiency figures: they "
     "change calibrated times only (add --model calibrated)"),
    (["--attention", "naive", "--kernel", "fa3"], "note: --kernel names a flash kernel family; --attention naive "
     "runs no flash kernel, so it is unused"),
])
def test_kernel_that_changes_nothing_is_said_as_estimate_says_it(args, note):
    r = CliRunner().invoke(app, SMALL + args)
    e = CliRunner().invoke(app, ["estimate", "tiny-gqa", *args])
    assert r.exit_code == 0 and note in r.output, r.output
    assert note in e.output, e.output


def test_a_cap_at_or_above_the_tdp_is_said_to_change_nothing():
    # power_clock: min(1, P / TDP)^(1/alpha) = 1 at P >= TDP (700 W on the H100 SXM): the same step as no cap,
    # and a note says so.
    capped = CliRunner().invoke(app, SMALL + ["--power-limit", "1000", "--json"])
    plain = CliRunner().invoke(app, SMALL + ["--json"])
    assert capped.exit_code == plain.exit_code == 0
    import json

    start = lambda out: out[out.index("{"):]
    assert json.loads(start(capped.output))["step_s"] == json.loads(start(plain.output))["step_s"]
    assert "note: a 1000 W cap is at or above h100-sxm's 700 W TDP (its default limit)" in capped.output
