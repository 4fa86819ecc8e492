"""The calibrated efficiency model, kernel fusion, and `lmcost op`: numbers worked by hand or from oracles."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lmcost import load_config, load_gpu
from lmcost.cli import app
from lmcost.basics.dtypes import Precision
from lmcost.cost.efficiency import gemm_shape_efficiency
from lmcost.hardware.efficiency import Efficiency, GemmEfficiency
from lmcost.cost.timing import expected_time
from lmcost.apps.estimate import Settings, phase_ops
from lmcost.operators.fusion import FUSIONS, PRESETS, parse_fusion
from lmcost.operators.forward import total
from lmcost.hardware.gpu import gpu_names
from lmcost.operators.ops import OpClass, OpCost, linear, norm
from lmcost.cost.roofline import op_time

BF16 = Precision()
H100 = GemmEfficiency(peak_fraction=0.8, tile_m=128, tile_n=128, sm_count=132)


def test_wave_quantization_of_a_prefill_gemm_on_132_sms():
    # M=4096, N=14336 in 128x128 tiles: 32 * 112 = 3584 tiles; 28 waves of 132 = 3696 slots.
    assert gemm_shape_efficiency(H100, 4096, 14336, 4096) == pytest.approx(3584 / 3696)


def test_tile_quantization_and_small_m():
    # M=200 pads to 256 rows (two 128-row tiles), N=256 is exact: 200/256 of the work is useful;
    # 2*2 = 4 tiles < 132 SMs: split-K, no wave loss.
    assert gemm_shape_efficiency(H100, 200, 256, 1024) == pytest.approx(200 / 256)
    # M=16 (a decode batch) takes a 16-row tile: no padding; 112 tiles < 132: no wave loss.
    assert gemm_shape_efficiency(H100, 16, 14336, 4096) == pytest.approx(1.0)
    # M=1 still pads to the 16-row MMA.
    assert gemm_shape_efficiency(H100, 1, 4096, 4096) == pytest.approx(1 / 16)
    # Small K: K / (K + k_half).
    g = GemmEfficiency(peak_fraction=1.0, k_half=64.0)
    assert gemm_shape_efficiency(g, 1, 1, 64) == pytest.approx(0.5)


def test_expected_time_of_a_gemm_and_a_norm_on_the_shipped_h100():
    # The formulas worked by hand with the figures the shipped (fitted) H100 block holds.
    gpu = load_gpu("h100")
    e = gpu.efficiency
    assert e.gemm.sm_count == 132 and e.gemm.k_half == 0.0 and [256, 128] in e.gemm.tiles
    # Prefill GEMM 4096 x 14336 x 4096: a 256x128 tile (reuse 85 >= 64: full rate) gives 16*112 = 1792
    # tiles in ceil(1792/132) = 14 waves: 4096*14336 / (14*132*256*128) = 3584/3696 of the peak fraction
    # (128x128 tiles give the same: 3584 tiles, 28 waves; split-K only adds waves). Plus the GEMM overhead.
    op = linear("gemm", 4096, 4096, 14336, 2, 2)
    want = 2 * 4096 * 14336 * 4096 / (989.4e12 * e.gemm.peak_fraction * 3584 / 3696) + e.kernel_overhead_us["gemm"] * 1e-6
    assert expected_time(op, gpu, BF16) == pytest.approx(want)
    # RMSNorm [4096, 8192] bf16: reads x and the weight, writes y = (2*4096*8192 + 8192) * 2 bytes, at the
    # rmsnorm figures of the default runtime (auto), plus their per-call time.
    n = norm("n", "rmsnorm", False, 4096, 8192, 2, 2)
    assert n.bytes == 134_234_112
    f = e.kinds["auto"]["rmsnorm"]
    assert expected_time(n, gpu, BF16) == pytest.approx(134_234_112 / (3.35e12 * f.bandwidth_fraction) + f.overhead_us * 1e-6)
    # A named runtime takes its own figures: torch's eager LayerNorm.
    ln = norm("n", "layernorm", True, 4096, 8192, 2, 2)
    g = e.kinds["torch-eager"]["layernorm"]
    eager = gpu.model_copy(update={"efficiency": e.select(runtime="torch-eager")})
    assert expected_time(ln, eager, BF16) == pytest.approx(ln.bytes / (3.35e12 * g.bandwidth_fraction) + g.overhead_us * 1e-6)


def test_no_efficiency_block_means_the_roofline():
    gpu = load_gpu("l4")
    assert gpu.efficiency is None
    op = linear("gemm", 512, 4096, 4096, 2, 2)
    assert expected_time(op, gpu, BF16) == float(op_time(op, gpu, BF16).time_s)


def test_finest_key_wins_and_in_kernel_work_costs_its_roofline():
    gpu = load_gpu("h100")
    e = Efficiency(gemm=GemmEfficiency(peak_fraction=1.0), bandwidth_fraction={"default": 0.5, "elementwise": 0.25, "add": 1.0},
                   kernel_overhead_us={"default": 1.0, "add": 3.0})
    add = OpCost("a", OpClass.ELEMENTWISE, act_read_bytes=2 * 3.35e6, act_write_bytes=3.35e6, kind="add")
    act = OpCost("b", OpClass.ELEMENTWISE, act_read_bytes=3.35e6, kind="silu")
    nrm = OpCost("c", OpClass.NORM, act_read_bytes=3.35e6, kind="rmsnorm")
    # 3.35 MB at 3.35 TB/s is 1 us of traffic at full bandwidth.
    assert expected_time(add, gpu, BF16, e) == pytest.approx(3e-6 + 3e-6)       # kind: 100%, 3 us
    assert expected_time(act, gpu, BF16, e) == pytest.approx(1e-6 + 4e-6)       # class: 25%, default 1 us
    assert expected_time(nrm, gpu, BF16, e) == pytest.approx(1e-6 + 2e-6)       # default: 50%
    # A flash kernel's softmax: no overhead or traffic of its own; its FLOPs at the vector (fp32) rate.
    inside = OpCost("softmax", OpClass.SOFTMAX, flops=1e9, kernels=0)
    assert expected_time(inside, gpu, BF16, e) == pytest.approx(1e9 / 67e12)


def test_calibrated_is_never_below_the_roofline(tmp_path):
    # A block of fractions 1 and no overhead is the roofline itself: the calibrated time may not beat
    # it, for any operator (here prefill attention, whose softmax the roofline adds at the vector rate).
    import yaml

    data = json.loads(load_gpu("h100").model_dump_json())
    data["efficiency"] = {"gemm": {"peak_fraction": 1.0}}
    p = tmp_path / "ideal.yaml"
    p.write_text(yaml.safe_dump(data))
    args = ["attention", "--phase", "prefill", "--seq", "4096", "--heads", "32", "--kv-heads", "8", "--head-dim", "128"]
    d = _op(*args, "--gpu", str(p))
    assert d["time_s"]["calibrated"] == pytest.approx(d["time_s"]["roofline"])
    for op in _ops("vllm", "prefill") + _ops("none", "decode"):
        assert expected_time(op, load_gpu("a100"), BF16) >= float(op_time(op, load_gpu("a100"), BF16).time_s)


@pytest.mark.parametrize("name", gpu_names())
def test_every_shipped_efficiency_figure_has_a_source(name):
    gpu = load_gpu(name)
    if gpu.efficiency is None:
        return
    assert gpu.efficiency.unsourced() == []
    # The check bites: with no sources, every figure is reported.
    assert gpu.efficiency.model_copy(update={"sources": {}}).unsourced() == gpu.efficiency.figures()


def test_a100_and_h100_carry_efficiency():
    assert load_gpu("a100").efficiency is not None and load_gpu("h100").efficiency is not None


@pytest.mark.parametrize("block, field", [
    ("{gemm: {peak_fraction: 1.5}}", "efficiency.gemm.peak_fraction"),
    ("{gemm: {peak_fraction: 0.8}, bandwidth_fraction: {norm: 1.2}}", "efficiency.bandwidth_fraction"),
    ("{gemm: {peak_fraction: 0.8}, bandwidth_fraction: {nrom: 0.5}}", "efficiency.bandwidth_fraction"),
    ("{gemm: {peak_fraction: 0.8}, kernel_overhead_us: {default: -1}}", "efficiency.kernel_overhead_us"),
    ("{gemm: {peak_fraction: 0.8, tile: 128}}", "efficiency.gemm.tile"),
    ("{gemm: {peak_fraction: 0.8}, kernel_overhead_us: {default: 1.0e+30}}", "efficiency.kernel_overhead_us"),
    ("{gemm: {peak_fraction: 0.8}, sources: {gemm.peek: a paper}}", "efficiency.sources"),
    ("{gemm: {peak_fraction: 1.0e-300}}", "efficiency.gemm.peak_fraction"),
    ("{gemm: {peak_fraction: 0.8, k_half: 1.0e+300}}", "efficiency.gemm.k_half"),
    ("{gemm: {peak_fraction: 0.8, tile_m: 100000}}", "efficiency.gemm.tile_m"),
])
def test_bad_efficiency_blocks_are_one_line_errors(tmp_path, block, field):
    text = (load_gpu("l40s").model_dump_json())
    data = json.loads(text)
    import yaml

    data["efficiency"] = yaml.safe_load(block)
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["op", "gemm", "--m", "1", "--n", "1", "--k", "1", "--gpu", str(p)])
    assert r.exit_code == 2 and field in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---------------------------------------------------------------------------------------------- fusion

LLAMA = load_config("llama-3-8b")


def _ops(fuse, phase="prefill", cfg=LLAMA, b=1, s=512):
    return phase_ops(cfg, BF16, phase, b, s, Settings(fusion=parse_fusion(fuse)))


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite", "gpt2", "falcon-7b"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_fusion_never_changes_flops_and_never_adds_bytes(model, phase):
    cfg = load_config(model)
    base_flops, base_bytes = total(_ops("none", phase, cfg), "flops"), total(_ops("none", phase, cfg), "bytes")
    for f in [*FUSIONS, "vllm"]:
        ops = _ops(f, phase, cfg)
        assert total(ops, "flops") == base_flops, f
        assert total(ops, "bytes") <= base_bytes, f


def test_unfused_silu_mul_writes_and_reads_the_activation_once_more():
    # Llama-3-8B prefill b=1, s=512: the gated act over n*d_ff = 512*14336 elements, bf16.
    # Fused: read gate, up; write out = 3 passes. Unfused: silu reads gate, writes a; mul reads a, up,
    # writes out = 5 passes, in 2 kernels.
    fused = next(o for o in _ops("default") if o.name == "layers.ffn.act")
    unfused = next(o for o in _ops("none") if o.name == "layers.ffn.act")
    assert fused.bytes == 3 * 512 * 14336 * 2 and unfused.bytes == 5 * 512 * 14336 * 2
    assert (fused.kernels, unfused.kernels) == (1, 2)


def test_qkv_and_gate_up_read_the_input_once():
    ops = {o.name: o for o in _ops("qkv,gate_up")}
    qkv = ops["layers.attn.qkv_proj"]
    # N = (h + 2 h_kv) d_h = (32 + 16) * 128 = 6144; x [512, 4096] read once.
    assert qkv.mnk == (512, 6144, 4096)
    assert qkv.flops == 2 * 512 * 4096 * 6144
    assert qkv.act_read_bytes == 512 * 4096 * 2
    assert "layers.attn.q_proj" not in ops and "layers.ffn.gate" not in ops
    assert ops["layers.ffn.gate_up"].mnk == (512, 2 * 14336, 4096)


def test_add_norm_saves_one_pass_over_the_residual_per_pair():
    # Pre-norm: two residual adds per block, each fused into the norm that follows (the block's last
    # into the next block's first). Each fusion drops the norm's read of the sum: n*d*B bytes, and a kernel.
    n, d, L = 512, 4096, 32
    saved = total(_ops("default"), "bytes") - total(_ops("silu_mul,add_norm"), "bytes")
    assert saved == 2 * L * n * d * 2
    names = {o.name for o in _ops("silu_mul,add_norm")}
    assert "layers.attn_residual" not in names and "layers.ffn_residual" not in names


def test_rope_into_attention_drops_its_own_pass():
    rope = next(o for o in _ops("silu_mul,rope_attention") if o.name == "layers.attn.rope")
    assert rope.bytes == 0 and rope.kernels == 0 and rope.flops > 0


def test_grouped_moe_is_one_kernel():
    mix = load_config("mixtral-8x7b")
    eager = next(o for o in _ops("default", cfg=mix) if o.name == "layers.moe.expert.up")
    grouped = next(o for o in _ops("moe_grouped", cfg=mix) if o.name == "layers.moe.expert.up")
    # 512 tokens pick 2 of 8 experts: all 8 are hit (expected 8 * (1 - (3/4)^512)), one GEMM each.
    assert eager.kernels == pytest.approx(8.0) and grouped.kernels == 1
    assert grouped.mnk[0] == pytest.approx(2 * 512)


def test_unknown_fusion_is_refused():
    from lmcost import LmcostError
    with pytest.raises(LmcostError, match="unknown fusion 'silu'"):
        parse_fusion("silu")
    for empty in ("", ",,,"):
        with pytest.raises(LmcostError, match="^fusion: empty"):
            parse_fusion(empty)
    assert parse_fusion("none") == () and parse_fusion("vllm") == FUSIONS and parse_fusion("default") == PRESETS["default"]


def test_estimate_reports_both_models_and_the_detail_follows_fusion():
    r = CliRunner().invoke(app, ["estimate", "llama-3-8b", "--gpu", "h100", "--model", "calibrated", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    pre = d["prefill"]
    assert pre["time_s"] == pre["time_calibrated_s"] > pre["time_roofline_s"] and d["settings"]["model"] == "calibrated"
    r = CliRunner().invoke(app, ["estimate", "llama-3-8b", "--gpu", "h100", "--fuse", "vllm", "--detail"])
    assert r.exit_code == 0 and "attn.qkv_proj" in r.stdout, r.output


# ---------------------------------------------------------------------------------------------- lmcost op


def _op(*args):
    r = CliRunner().invoke(app, ["op", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_op_gemm_counts_and_json_contract():
    d = _op("gemm", "--m", "4096", "--n", "14336", "--k", "4096", "--dtype", "bf16", "--gpu", "h100")
    assert d["flops"] == 2 * 4096 * 14336 * 4096
    assert d["bytes"] == (4096 * 4096 + 4096 * 14336 + 4096 * 14336) * 2
    assert d["time_s"]["roofline"] == pytest.approx(d["flops"] / 989.4e12)
    assert d["time_s"]["calibrated"] > d["time_s"]["roofline"] and d["bound"] == "compute"


def test_op_attention_decode_bytes_are_the_gqa_cache():
    d = _op("attention", "--phase", "decode", "--batch", "16", "--kv-len", "32768", "--heads", "32", "--kv-heads", "8",
            "--head-dim", "128", "--gpu", "h100")
    # K and V: 2 * b * t * h_kv * d_h * 2 B; Q and O: b * h * d_h * 2 B each.
    assert d["bytes"] == 2 * 16 * 32768 * 8 * 128 * 2 + 2 * 16 * 32 * 128 * 2
    assert d["matmul_flops"] == 4 * 16 * 32 * 32768 * 128 and d["bound"] == "memory"


@pytest.mark.torch
def test_op_attention_flops_match_flop_counter_without_mask():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    b, h, h_kv, s, d = 2, 8, 8, 256, 64
    q = torch.randn(b, h, s, d, device="meta")
    k = torch.randn(b, h_kv, s, d, device="meta")
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.scaled_dot_product_attention(q, k, k)
    got = _op("attention", "--phase", "prefill", "--batch", str(b), "--seq", str(s), "--heads", str(h), "--kv-heads",
              str(h_kv), "--head-dim", str(d), "--no-causal")
    assert got["matmul_flops"] == fc.get_total_flops()


def test_op_chunked_prefill_uses_the_bottom_right_causal_mask():
    # s = 1024 queries at positions 3073..4096 of t = 4096 keys: sum_j j = s*t - s*(s-1)/2 pairs per head.
    d = _op("attention", "--phase", "prefill", "--seq", "1024", "--kv-len", "4096", "--heads", "32", "--kv-heads", "8",
            "--head-dim", "128")
    pairs = 1024 * 4096 - 1024 * 1023 // 2
    assert d["matmul_flops"] == 4 * 32 * pairs * 128


def test_op_norms_and_elementwise_bytes():
    assert _op("rmsnorm", "--tokens", "4096", "--hidden", "8192")["bytes"] == (2 * 4096 * 8192 + 8192) * 2
    assert _op("layernorm", "--tokens", "8", "--hidden", "16", "--bias")["bytes"] == (2 * 8 * 16 + 2 * 16) * 2
    # silu_and_mul: reads gate and up, writes the product.
    assert _op("elementwise", "--kind", "silu_mul", "--tokens", "512", "--width", "28672")["bytes"] == 3 * 512 * 28672 * 2
    assert _op("elementwise", "--kind", "add", "--tokens", "512", "--width", "4096")["bytes"] == 3 * 512 * 4096 * 2
    # RoPE in place on q [512, 32, 128] and k [512, 8, 128]: read and write both, read cos and sin [512, 128].
    rope = _op("elementwise", "--kind", "rope", "--tokens", "512", "--heads", "32", "--kv-heads", "8", "--head-dim", "128")
    assert rope["bytes"] == (2 * 512 * 32 * 128 + 2 * 512 * 8 * 128 + 2 * 512 * 128) * 2
    assert rope["flops"] == 3 * 512 * (32 + 8) * 128


@pytest.mark.parametrize("args, field", [
    (["attention", "--phase", "prefill", "--seq", "64", "--heads", "32", "--kv-heads", "7", "--head-dim", "64"], "--kv-heads"),
    (["attention", "--phase", "decode", "--heads", "32", "--kv-heads", "8", "--head-dim", "64"], "--kv-len"),
    (["attention", "--phase", "prefill", "--seq", "64", "--kv-len", "32", "--heads", "8", "--kv-heads", "8", "--head-dim", "64"], "--kv-len"),
    (["attention", "--phase", "decode", "--seq", "4", "--kv-len", "32", "--heads", "8", "--kv-heads", "8", "--head-dim", "64"], "--seq"),
    (["elementwise", "--kind", "swish", "--tokens", "4", "--width", "4"], "--kind"),
    (["elementwise", "--kind", "rope", "--tokens", "4"], "--heads"),
    (["elementwise", "--kind", "add", "--tokens", "4"], "--width"),
    (["gemm", "--m", "0", "--n", "4", "--k", "4"], "--m"),
    (["gemm", "--m", "2147483648", "--n", "2147483648", "--k", "2147483648"], "sizes"),
    (["elementwise", "--kind", "rope", "--tokens", "4", "--heads", "32", "--kv-heads", "7", "--head-dim", "64"], "--kv-heads"),
    (["elementwise", "--kind", "rope", "--tokens", "4", "--heads", "8", "--kv-heads", "8", "--head-dim", "63"], "--head-dim"),
    (["elementwise", "--kind", "rope", "--tokens", "4", "--width", "8", "--heads", "8", "--kv-heads", "8", "--head-dim", "64"], "--width"),
    (["elementwise", "--kind", "add", "--tokens", "4", "--width", "8", "--heads", "8"], "--heads"),
    (["rmsnorm", "--tokens", "4", "--hidden", "8", "--dtype", "fp8", "--gpu", "a100"], "--dtype"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--dtype", "fp12"], "--dtype"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--gpu", "h900"], "--gpu"),
    (["gemm", "--m", "4", "--n", "4", "--k", "4", "--dtype", "fp8", "--gpu", "a100"], "--dtype"),
])
def test_op_bad_input_is_one_line(args, field):
    r = CliRunner().invoke(app, ["op", *args])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {field}") and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("fuse", ["default", "vllm"])
@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v2-lite", "llama-3-8b"])
def test_calibrated_grid_equals_its_points(model, fuse):
    # The vectorised path (arrays of batch and tokens: MoE kernel counts become arrays too) gives
    # exactly what the scalar path gives point by point.
    from lmcost.apps.estimate import grid, phase_totals

    cfg, gpu, s = load_config(model), load_gpu("h100"), Settings(model="calibrated", fusion=parse_fusion(fuse))
    df = grid(cfg, gpu, BF16, "decode", [1, 8, 64], [1024, 4096], s)
    for r in df.itertuples():
        assert r.time_s == pytest.approx(float(phase_totals(cfg, gpu, BF16, "decode", r.batch, r.tokens, s).time_s))


def test_rope_into_attention_needs_the_flash_kernel():
    from lmcost import LmcostError
    with pytest.raises(LmcostError, match="rope_attention needs the flash kernel"):
        Settings(kernel="naive", fusion=parse_fusion("vllm"))


def test_a_negative_kernel_floor_is_refused(tmp_path):
    import yaml

    data = json.loads(load_gpu("l40s").model_dump_json())
    data["kernel_floor_us"] = -1.0
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["op", "gemm", "--m", "1", "--n", "1", "--k", "1", "--gpu", str(p)])
    assert r.exit_code == 2 and "kernel_floor_us" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_estimate_csv_detail_exits_zero():
    r = CliRunner().invoke(app, ["estimate", "gpt2", "--gpu", "h100", "--csv", "--detail", "--model", "calibrated"])
    assert r.exit_code == 0 and r.stdout.startswith("phase,name,op_class"), r.output
