"""GEMMs over quantized weights at their recipe's compute peak (issue 25): W8A8 fp8 at the fp8 peak, NVFP4
W4A4 at the fp4 peak, MXFP4 W4A8 at the fp8 peak where the GPU has fp4 tensor cores, weight-only recipes at
the 16-bit peak; a GPU without the recipe's tensor cores runs them weight-only, with one note.

Peaks are the GPU files' datasheet figures (dense TFLOP/s): B200 bf16 2250, fp8 4500, fp4 9000; H100 SXM
bf16 989.4, fp8 1978.9; A100 has no fp8. Every expected time below is FLOPs / one of these, worked by hand.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmcost import Precision, load_gpu
from lmcost.apps.estimate import EstimateRequest, run_estimate
from lmcost.cli import app
from lmcost.cost.kernels import gemm
from lmcost.cost.phases import grid
from lmcost.cost.roofline import gemm_dtype
from lmcost.cost.timing import expected_time, op_statics
from lmcost.model.quant import RECIPES
from lmcost.operators.fusion import parse_fusion
from lmcost.operators.workload import Settings

runner = CliRunner()

# llama-3-8b prefill of 4096 tokens (b = 1): q_proj is 4096 x 4096 x 4096, 2*4096^3 FLOPs per layer, 32 layers.
Q_FLOPS = 32 * 2 * 4096 ** 3            # 4,398,046,511,104
FFN_FLOPS = 32 * 2 * 4096 * 14336 * 4096  # gate, up and down each


def _rows(gpu, quant, model="llama-3-8b", say=None):
    lines = []
    r = run_estimate(EstimateRequest(model=model, gpu=gpu, quant=quant, batch=1, prompt=4096, gen=2, fusion="none"),
                     say=lines.append)
    return {row["name"]: row for row in r.estimate.rows if row["phase"] == "prefill"}, r, lines


def test_nvfp4_on_b200_runs_its_gemms_at_the_fp4_peak():
    rows, r, notes = _rows("b200", "nvfp4")
    assert rows["layers.attn.q_proj"]["compute_s"] == pytest.approx(Q_FLOPS / 9000e12, rel=1e-12)  # 488.67 us
    assert rows["layers.ffn.down"]["compute_s"] == pytest.approx(FFN_FLOPS / 9000e12, rel=1e-12)
    # nvfp4 leaves the lm_head bf16 (4096 x 128256 x 4096) and attention's QK^T/PV are not weight GEMMs.
    assert rows["lm_head"]["compute_s"] == pytest.approx(2 * 4096 * 128256 * 4096 / 2250e12, rel=1e-12)
    assert rows["layers.attn.sdpa"]["flops"] / rows["layers.attn.sdpa"]["compute_s"] == pytest.approx(2250e12)
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "fp4"
    assert not [n for n in notes if "peak" in n]


def test_nvfp4_prefill_gemm_time_falls_by_the_fp4_over_bf16_peak_ratio():
    # Compute-bound limit: a GEMM's roofline time is FLOPs / peak, so the recipe's GEMMs take
    # 2250 / 9000 = 1/4 of their bf16 time. q_proj, o_proj, gate, up, down are compute-bound at 4096 tokens
    # in both runs (q_proj at fp4: 488.7 us of compute against 306.2 us of bytes); k_proj and v_proj
    # (N = 1024, intensity 2*1024*4096 / (2*(4096+1024)) ~ 819 FLOPs/B < 9000/8 = 1125) stay memory-bound.
    fp4, _, _ = _rows("b200", "nvfp4")
    bf16, _, _ = _rows("b200", None)
    for name in ("layers.attn.q_proj", "layers.attn.o_proj", "layers.ffn.gate", "layers.ffn.up", "layers.ffn.down"):
        assert fp4[name]["bound"] == "compute" == bf16[name]["bound"]
        assert bf16[name]["time_s"] / fp4[name]["time_s"] == pytest.approx(9000 / 2250, rel=1e-12)
    gemm = [n for n, row in fp4.items() if row["op_class"] == "gemm"]
    assert sum(bf16[n]["compute_s"] for n in gemm) / sum(fp4[n]["compute_s"] for n in gemm) == pytest.approx(4, rel=1e-12)


@pytest.mark.parametrize("quant", ["awq-g128", "gptq-g128", "int8", "q4_k_m"])
def test_weight_only_recipes_keep_the_16_bit_peak(quant):
    rows, r, _ = _rows("b200", quant)
    assert rows["layers.attn.q_proj"]["compute_s"] == pytest.approx(Q_FLOPS / 2250e12, rel=1e-12)
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "bf16"


@pytest.mark.parametrize("quant", ["fp8-tensor", "fp8-channel", "fp8-block128"])
def test_fp8_recipes_on_h100_run_at_1978_9_tflops(quant):
    rows, r, notes = _rows("h100", quant)
    assert rows["layers.attn.q_proj"]["compute_s"] == pytest.approx(Q_FLOPS / 1978.9e12, rel=1e-12)  # 2.2225 ms
    assert rows["lm_head"]["compute_s"] == pytest.approx(2 * 4096 * 128256 * 4096 / 989.4e12, rel=1e-12)
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "fp8"
    assert not [n for n in notes if "peak" in n]


def test_a_gpu_without_the_tensor_cores_runs_the_recipe_weight_only_with_one_note():
    rows, r, notes = _rows("h100", "nvfp4")
    assert rows["layers.attn.q_proj"]["compute_s"] == pytest.approx(Q_FLOPS / 989.4e12, rel=1e-12)
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "bf16"
    said = [n for n in notes if "fp4 peak" in n]
    assert said == ["note: h100-sxm has no fp4 peak: nvfp4 GEMMs are costed weight-only at the bf16 peak "
                    "(W4A16, as vLLM's Marlin kernels run them), not at fp4"]
    rows, r, notes = _rows("a100", "fp8-tensor")  # A100: no fp8 tensor cores (FP8 Marlin, W8A16)
    assert rows["layers.attn.q_proj"]["compute_s"] == pytest.approx(Q_FLOPS / 312e12, rel=1e-12)
    assert len([n for n in notes if "no fp8 peak" in n and "W8A16" in n]) == 1


def test_mxfp4_runs_experts_w4a8_where_the_gpu_has_fp4_and_w4a16_elsewhere():
    # gpt-oss-20b carries its own mxfp4 recipe (routed experts only): expert GEMMs at the fp8 peak on B200,
    # the attention projections and the router bf16.
    rows, r, _ = _rows("b200", None, model="gpt-oss-20b")
    e = rows["layers.local.moe.expert.down"]
    assert e["flops"] / e["compute_s"] == pytest.approx(4500e12, rel=1e-12)
    for name in ("layers.local.attn.q_proj", "layers.local.moe.router", "lm_head"):
        assert rows[name]["flops"] / rows[name]["compute_s"] == pytest.approx(2250e12, rel=1e-12)
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "fp8"
    rows, r, notes = _rows("h200", None, model="gpt-oss-20b")
    e = rows["layers.local.moe.expert.down"]
    assert e["flops"] / e["compute_s"] == pytest.approx(989.4e12, rel=1e-12)  # H200: H100's tensor peaks
    assert r.estimate.to_dict()["settings"]["gemm_compute"] == "bf16"
    assert len([n for n in notes if "no fp4 peak" in n]) == 1


def test_json_records_the_compute_dtype_only_under_a_recipe():
    _, r, _ = _rows("b200", None)
    assert "gemm_compute" not in r.estimate.to_dict()["settings"]
    want = {"fp8-tensor": "fp8", "fp8-channel": "fp8", "fp8-block128": "fp8", "nvfp4": "fp4", "awq-g128": "bf16"}
    for quant, dtype in want.items():
        assert RECIPES[quant].gemm_dtype(load_gpu("b200").peak_tflops, "bf16") == dtype


def test_the_hook_gives_each_op_its_compute_dtype():
    # The function the efficiency model reads: recipe GEMMs get the recipe's dtype, the rest the activations'.
    from lmcost.cost.compile import phase_ops
    from lmcost.model.loading import load_config

    cfg, b200, p = load_config("llama-3-8b"), load_gpu("b200"), Precision()
    ops = {op.role: op for op in phase_ops(cfg, p, "prefill", 1, 64, Settings(quant="nvfp4"))}
    assert gemm_dtype(ops["attn.q_proj"], b200, p) == "fp4"
    assert gemm_dtype(ops["ffn.down"], b200, p) == "fp4"
    assert gemm_dtype(ops["lm_head"], b200, p) == "bf16"
    assert gemm_dtype(ops["attn.sdpa"], b200, p) == "bf16"


def test_the_calibrated_model_applies_its_gemm_fraction_to_the_recipe_peak():
    # H100 has an efficiency block. A compute-bound 8192^3 GEMM: calibrated = overhead + FLOPs / (peak *
    # fraction * shape); the same op marked fp8-tensor differs only in the peak (1978.9 vs 989.4), so the
    # compute terms stand in the peaks' ratio 1978.9 / 989.4.
    h100, p = load_gpu("h100"), Precision()
    plain = gemm(8192, 8192, 8192)[0]
    from dataclasses import replace

    fp8 = replace(plain, quant="fp8-tensor")
    st_plain, st_fp8 = op_statics([plain], h100, p), op_statics([fp8], h100, p)
    assert st_fp8.peak[0] == 1978.9e12 and st_plain.peak[0] == 989.4e12
    ov = st_plain.overhead_s[0]
    assert st_fp8.overhead_s[0] == ov and st_fp8.frac[0] == st_plain.frac[0]
    ratio = (expected_time(plain, h100, p) - ov) / (expected_time(fp8, h100, p) - ov)
    assert ratio == pytest.approx(1978.9 / 989.4, rel=1e-9)


def test_the_grid_sums_each_gemm_at_its_own_peak():
    # The vectorised roofline grid (one peak per op) against the per-op rows of estimate.
    from lmcost.model.loading import load_config

    rows, _, _ = _rows("b200", "nvfp4")
    df = grid(load_config("llama-3-8b"), load_gpu("b200"), Precision(), "prefill", [1], [4096],
              Settings(quant="nvfp4", fusion=parse_fusion("none")))
    assert df.compute_s[0] == pytest.approx(sum(row["compute_s"] for row in rows.values()), rel=1e-12)
    assert df.time_s[0] == pytest.approx(sum(row["time_s"] for row in rows.values()), rel=1e-12)


def test_op_gemm_fp4_on_a_gpu_with_an_fp4_peak():
    r = runner.invoke(app, ["op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--dtype", "fp4",
                            "--gpu", "b200", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    # A and B: 8192 rows x 512 blocks of 16 x 9 B (8 B of e2m1 + an e4m3 scale) + a 4 B fp32 scale each;
    # C: 8192^2 bf16. FLOPs 2 * 8192^3 at 9000 TFLOP/s = 122.17 us.
    assert d["bytes"] == 2 * (8192 * 512 * 9 + 4) + 8192 * 8192 * 2 == 209_715_208
    assert d["dtype"] == "fp4" and d["flops"] == 2 * 8192 ** 3
    assert d["time_s"]["roofline"] == pytest.approx(2 * 8192 ** 3 / 9000e12, rel=1e-12)
    r = runner.invoke(app, ["op", "gemm", "--m", "64", "--n", "64", "--k", "64", "--dtype", "fp4", "--gpu", "h100"])
    assert r.exit_code == 2
    lines = (r.stderr or r.stdout).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --dtype: h100-sxm has no fp4 peak;")
    r = runner.invoke(app, ["op", "rmsnorm", "--tokens", "8", "--hidden", "64", "--dtype", "fp4", "--gpu", "b200"])
    assert r.exit_code == 2 and "rmsnorm takes no fp4: fp4 is the operand format of a GEMM" in (r.stderr or r.stdout)


def test_op_gemm_fp4_on_cdna4_costs_mxfp4_operands():
    # MI355X (vendor amd) quotes its 10,000 TFLOP/s fp4 figure for MXFP4 (OCP MX v1.0): 32 e2m1 values (16 B) and
    # one e8m0 scale (1 B) per 32 elements along K, 17/32 B, no per-tensor scale. 8192^3: A and B are
    # 8192 rows x 256 blocks x 17 B = 35,651,584 B each, C 8192^2 bf16 = 134,217,728 B; FLOPs 2 * 8192^3 at
    # 10,000 TFLOP/s = 109.95 us. (NVFP4 would be 2 * (8192 * 512 * 9 + 4) + C = 209,715,208 B, as on B200 above.)
    assert load_gpu("mi355x").fp4_format == "MXFP4" and load_gpu("b200").fp4_format == "NVFP4"
    r = runner.invoke(app, ["op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--dtype", "fp4",
                            "--gpu", "mi355x", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["bytes"] == 2 * 8192 * 256 * 17 + 8192 * 8192 * 2 == 205_520_896
    assert d["shapes"] == "A [8192,8192] @ B [8192,8192] -> C [8192,8192] (MXFP4 A and B, bf16 C)"
    assert d["time_s"]["roofline"] == pytest.approx(2 * 8192 ** 3 / 10000e12, rel=1e-12)
    table = runner.invoke(app, ["op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--dtype", "fp4", "--gpu", "mi355x"])
    assert table.exit_code == 0 and "(MXFP4 A and B, bf16 C)" in table.stdout
    nv = runner.invoke(app, ["op", "gemm", "--m", "8192", "--n", "8192", "--k", "8192", "--dtype", "fp4", "--gpu", "b200", "--json"])
    assert json.loads(nv.stdout)["shapes"].endswith("(NVFP4 A and B, bf16 C)")


def test_op_gemm_unknown_dtype_lists_fp4():
    # fp4 is a rate (no storage dtype of its own) that only op gemm takes, on a GPU with FP4 tensor cores: on B200
    # its refusal of fp6 lists it beside the storage dtypes B200 has peaks for (its datasheet: fp32/tf32, bf16,
    # fp16, fp8, int8, fp4; no int4); on H100 (Hopper: no FP4 tensor cores) it does not; a kernel that takes no
    # fp4 (attention) never lists it.
    r = runner.invoke(app, ["op", "gemm", "--m", "16", "--n", "16", "--k", "16", "--dtype", "fp6", "--gpu", "b200"])
    assert r.exit_code == 2
    assert r.stderr.strip() == ("error: --dtype: unknown dtype 'fp6'; use --dtype fp32 or bf16 or fp16 or fp8 or int8 "
                                "or fp4 (NVFP4 A and B)")
    r = runner.invoke(app, ["op", "gemm", "--m", "16", "--n", "16", "--k", "16", "--dtype", "fp6", "--gpu", "h100"])
    assert r.exit_code == 2 and r.stderr.strip().endswith("use --dtype fp32 or bf16 or fp16 or fp8 or int8")
    r = runner.invoke(app, ["op", "attention", "--phase", "decode", "--heads", "8", "--kv-heads", "8", "--head-dim", "64",
                            "--kv-len", "100", "--dtype", "fp6", "--gpu", "b200"])
    assert r.exit_code == 2 and r.stderr.strip().endswith("use --dtype fp32 or bf16 or fp16 or fp8 or int8")


# What each GPU's datasheet gives a dense tensor rate for (tests/data has no copy: the shipped GPU files cite them):
# H100 SXM and B200: fp32 (TF32), bf16, fp16, fp8, int8 (B200 adds fp4); A100: no fp8 (Ampere has no FP8 tensor
# cores); MI355X's file carries only fp8 and fp4 rates. No GPU here runs int4 activations, and no norm or pointwise
# kernel reads fp4 elements.
_TAKES = {"h100": "fp32 or bf16 or fp16 or fp8 or int8", "b200": "fp32 or bf16 or fp16 or fp8 or int8",
          "a100": "fp32 or bf16 or fp16 or int8", "mi355x": "fp8"}
_MEMORY_BOUND = {"rmsnorm": ["op", "rmsnorm", "--tokens", "8", "--hidden", "64"],
                 "layernorm": ["op", "layernorm", "--tokens", "8", "--hidden", "64"],
                 "elementwise": ["op", "elementwise", "--kind", "silu_mul", "--tokens", "8", "--width", "64"]}


@pytest.mark.parametrize("gpu", sorted(_TAKES))
@pytest.mark.parametrize("op", sorted(_MEMORY_BOUND))
def test_a_memory_bound_ops_dtype_refusal_lists_what_it_takes_on_that_gpu(op, gpu):
    # Before: `op rmsnorm --dtype fp4` said "unknown dtype 'fp4'; use one of fp32, bf16, fp16, fp8, int8, int4" on
    # every GPU, and the int4 (and on A100 the fp8) it offered was then refused. Now each refusal is one line
    # naming only the dtypes the op runs in on that GPU, every one of which then runs.
    said = {}
    for dtype in ("fp4", "int4", "fp6"):
        r = runner.invoke(app, _MEMORY_BOUND[op] + ["--gpu", gpu, "--dtype", dtype])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and r.stdout == "", r.output
        said[dtype] = lines[0]
    name = load_gpu(gpu).name
    assert said["fp4"] == (f"error: --dtype: {op} takes no fp4: fp4 is the operand format of a GEMM on fp4 tensor cores "
                           f"(op gemm); use --dtype {_TAKES[gpu]}")
    assert said["int4"] == f"error: --dtype: {op} on {name} takes no int4; use --dtype {_TAKES[gpu]}"
    assert said["fp6"] == f"error: --dtype: unknown dtype 'fp6'; use --dtype {_TAKES[gpu]}"
    for dtype in _TAKES[gpu].split(" or "):
        r = runner.invoke(app, _MEMORY_BOUND[op] + ["--gpu", gpu, "--dtype", dtype, "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["dtype"] == dtype, r.output
    if gpu == "a100":  # a dtype the op has but this GPU lacks names the GPU
        r = runner.invoke(app, _MEMORY_BOUND[op] + ["--gpu", gpu, "--dtype", "fp8"])
        assert r.stderr.strip() == f"error: --dtype: {op} on a100-80gb takes no fp8; use --dtype {_TAKES[gpu]}"


@pytest.mark.parametrize("extra", [[], ["--dtype", "fp8"]])
def test_nvfp4_on_an_mxfp4_gpu_blames_quant(extra):
    # MI355X's FP4 tensor cores run MXFP4: an NVFP4 recipe is refused naming --quant (the field given), not
    # --dtype (MI355X's sources give no 16-bit peak, so the default dtype alone would be refused too), with or
    # without a dtype it has; before, --dtype fp8 costed NVFP4 GEMMs at the MXFP4 rate.
    for cmd in (["estimate", "llama-3-8b"], ["kv", "llama-3-8b"], ["serve", "llama-3-8b"]):
        r = runner.invoke(app, cmd + ["--gpu", "mi355x", "--quant", "nvfp4"] + extra)
        assert r.exit_code == 2, (cmd, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "error: --quant: nvfp4 stores NVFP4 (16 e2m1 per e4m3 scale), and mi355x's FP4 tensor cores run MXFP4"), lines
    # mxfp4 on a dense model on MI355X: the quant fault is named first, and its fix does not offer nvfp4
    r = runner.invoke(app, ["estimate", "llama-3-8b", "--gpu", "mi355x", "--quant", "mxfp4"] + extra)
    assert r.exit_code == 2 and r.stderr.strip() == (
        "error: --quant: mxfp4 stores routed experts only (as gpt-oss), and llama-3-8b has none; use awq-g128 or "
        "gptq-g128 for 4-bit weights everywhere (mi355x runs no nvfp4)")
    # nvfp4 on NVIDIA Blackwell runs; on a GPU without fp4 (MI300X) it is costed weight-only, as before.
    assert runner.invoke(app, ["estimate", "llama-3-8b", "--gpu", "b200", "--quant", "nvfp4"]).exit_code == 0
    assert runner.invoke(app, ["estimate", "llama-3-8b", "--gpu", "mi300x", "--quant", "nvfp4"]).exit_code == 0


def test_cost_refuses_fp4_operands_of_another_format_than_the_gpus():
    # A Python caller building gemm(..., "fp4") (NVFP4 by default) and costing it on MI355X (MXFP4) is told so.
    from lmcost.basics.errors import LmcostError
    from lmcost.cost.kernels import cost

    with pytest.raises(LmcostError) as e:
        cost(gemm(64, 64, 64, "fp4"), load_gpu("mi355x"), "fp4")
    assert e.value.field == "fp4_format" and e.value.what == (
        "the GEMM's operands are NVFP4, and mi355x's FP4 tensor cores run MXFP4")
    # 64^3 in MXFP4: A and B 64 rows x 2 blocks x 17 B = 2176 B each, C 64*64*2 = 8192 B
    assert cost(gemm(64, 64, 64, "fp4", "MXFP4"), load_gpu("mi355x"), "fp4")["bytes"] == 2 * 2176 + 8192


def test_the_weight_only_note_on_an_amd_gpu_names_no_cuda_kernel():
    # MI300X has no fp4 peak: nvfp4 runs weight-only at its bf16 peak, as on H100, but vLLM's Marlin kernels
    # are CUDA-only, so the note says what is costed instead of whose kernel.
    _, _, notes = _rows("mi300x", "nvfp4")
    assert [n for n in notes if "fp4 peak" in n] == [
        "note: mi300x has no fp4 peak: nvfp4 GEMMs are costed weight-only at the bf16 peak "
        "(W4A16, the weights dequantized in the kernel), not at fp4"]
