"""Engine profiles (issue 25): the ``engines:`` block of an efficiency block, its overlay
(:meth:`Efficiency.with_engine`) and its selection (:func:`lmcost.apps.setup.select_efficiency`).

The overlay's arithmetic is checked on tests/data/h100-engines.yaml, the shipped H100 SXM with a hand-written
engines block of round invented figures: each expected time below is worked by hand from the formula of
:mod:`lmcost.cost.efficiency` (t = overhead + FLOPs / (peak * fraction * shape)) and the H100 SXM datasheet peaks
(bf16 989.4, fp8 1978.9 dense TFLOP/s; 3.35 TB/s).
"""

import pytest

from lmcost.apps.setup import select_efficiency
from lmcost.basics.errors import LmcostError
from lmcost.cost import kernels as K
from lmcost.cost.kernels import cost, gemm
from lmcost.hardware.gpu import load_gpu

YAML = "tests/data/h100-engines.yaml"


@pytest.fixture(scope="module")
def hw():
    return load_gpu(YAML)


def _gemm_s(gpu, dtype, m=8192, n=8192, k=8192):
    return cost(gemm(m, n, k, dtype), gpu, dtype)["time_s"]["calibrated"]


def test_vllm_gemm_by_hand(hw):
    # vllm profile: peak_fraction 0.8, one 128x128 tile, no split, SMs 132, overhead 5 us.
    # 8192^3: tiles 64*64 = 4096, waves ceil(4096/132) = 32, shape 4096 / (32*132) = 0.969697.
    # FLOPs 2*8192^3 = 1.0995116e12; rate 989.4e12 * 0.8 * 0.969697 = 7.67535e14 FLOP/s -> 1.432521 ms;
    # memory 3 * 8192^2 * 2 B = 402.7 MB at 0.7 * 3.35 TB/s = 0.172 ms (compute-bound). t = 1.432521 + 0.005 ms.
    g = select_efficiency(hw, engine="vllm")
    assert _gemm_s(g, "bf16") == pytest.approx(1.437521e-3, rel=1e-5)
    # fp8 operands: gemm_dtype_fraction.fp8 0.6 of the fp8 peak: 1978.9e12 * 0.6 * 0.969697 = 1.151360e15
    # -> 0.954966 ms, + 5 us = 0.959966 ms.
    assert _gemm_s(g, "fp8") == pytest.approx(0.959966e-3, rel=1e-5)


def test_sglang_takes_gemm_fraction_for_fp8(hw):
    # sglang has no fp8 figure: its bf16 peak_fraction 0.7 applies to the fp8 peak:
    # 1.0995116e12 / (1978.9e12 * 0.7 * 0.969697) = 0.818542 ms, + 4 us.
    g = select_efficiency(hw, engine="sglang@0.5.0")
    assert _gemm_s(g, "fp8") == pytest.approx(0.822542e-3, rel=1e-5)


def test_memory_bound_gemm_uses_profile_bandwidth(hw):
    # M = 1 x N = K = 8192 bf16: bytes = 2*(8192 + 8192*8192 + 8192) = 134,250,496 B at 0.7 * 3.35e12 B/s
    # = 57.25 us (FLOPs 1.34e8 are nothing), + 5 us per call = 62.25 us.
    g = select_efficiency(hw, engine="vllm")
    assert _gemm_s(g, "bf16", 1, 8192, 8192) == pytest.approx(62.2497e-6, rel=1e-4)


def test_overlay_replaces_attention_auto_and_bands_only(hw):
    base = hw.efficiency
    e = select_efficiency(hw, engine="vllm").efficiency
    prof = base.engines["vllm"]
    assert e.engine == "vllm@0.11.0"
    assert e.prefill_figures() == prof.attention_prefill and e.decode_figures() == prof.attention_decode
    assert e.band("gemm") == [0.9, 1.2] and e.band("attention_decode") == [0.7, 1.4]
    # Memory-bound kinds the engine's kernels run take their designs' figures (lmcost/data/engine-memory-kernels.yaml:
    # vLLM's plain RMSNorm the scalar row design, 0.25 of bandwidth, 1.25 us, 0.38 ns per row element); the
    # kinds it runs no kernel of its own for (softmax, add) and the other runtimes stay the block's.
    assert e.kinds["auto"]["rmsnorm"].bandwidth_fraction == 0.25 and e.kinds["auto"]["rmsnorm"].row_ns == 0.38
    assert e.kinds["auto"]["fused_add_rmsnorm"].bandwidth_fraction == 0.8
    assert e.kinds["auto"]["softmax"] == base.kinds["auto"]["softmax"]
    assert {k: v for k, v in e.kinds.items() if k != "auto"} == {k: v for k, v in base.kinds.items() if k != "auto"}
    # the norm band spans the designs vLLM runs for norms (scalar 0.775-1.347, vec8 0.85-1.129)
    assert e.band("norm") == (0.775, 1.347)
    # A named family keeps its own figures (fa3 on H100 has published rows).
    assert e.attention_prefill["fa3"] == base.attention_prefill["fa3"]


@pytest.mark.parametrize("engine", ["torch", "Torch"])
def test_torch_is_the_block(hw, engine):
    # The block's figures, but for the norm and elementwise bands: torch does not know which kernel a stack
    # runs, so those span the H200 spread of the single fused kernels (lmcost/data/engine-memory-kernels.yaml
    # stack_spread.bands, norm 0.317-3.128, elementwise 0.165-2.125) as well as the block's own band.
    e = select_efficiency(hw, engine=engine).efficiency
    assert e.model_copy(update={"bands": hw.efficiency.bands}) == hw.efficiency
    for c, (lo, hi) in {"norm": (0.317, 3.128), "elementwise": (0.165, 2.125)}.items():
        assert e.band(c) == [min(lo, hw.efficiency.band(c)[0]), max(hi, hw.efficiency.band(c)[1])]
    assert {k: v for k, v in e.bands.items() if k not in ("norm", "elementwise")} == \
        {k: v for k, v in hw.efficiency.bands.items() if k not in ("norm", "elementwise")}
    assert _gemm_s(select_efficiency(hw, engine=engine), "bf16") == _gemm_s(hw, "bf16")


@pytest.mark.parametrize("engine", [None, "auto"])
def test_auto_is_the_block_with_vllms_memory_designs(hw, engine):
    # auto: the block (a public-kernels.csv fit) with vLLM's norm, activation, RoPE and add designs for those kinds
    # (AUTO_STACK; engine-memory-kernels.yaml: the plain RMSNorm the scalar row design, 0.25 of bandwidth, 0.38 ns per
    # row element; the fused add + norm the vec8 one, 0.8), and no engine profile: GEMM and attention stay the block's.
    e = select_efficiency(hw, engine=engine).efficiency
    assert e.engine == "" and e.memory_designs == "vllm"
    assert e.kinds["auto"]["rmsnorm"].bandwidth_fraction == 0.25 and e.kinds["auto"]["rmsnorm"].row_ns == 0.38
    assert e.kinds["auto"]["fused_add_rmsnorm"].bandwidth_fraction == 0.8
    assert e.kinds["auto"]["layernorm"] == hw.efficiency.kinds["auto"]["layernorm"]
    assert {k: v for k, v in e.kinds.items() if k != "auto"} == {k: v for k, v in hw.efficiency.kinds.items() if k != "auto"}
    assert _gemm_s(select_efficiency(hw, engine=engine), "bf16") == _gemm_s(hw, "bf16")
    # bands: the designs' (norm: scalar 0.775-1.347 and vec8 0.85-1.129; elementwise: scalar act 0.838-1.519, scalar
    # rope, vector-act for the add) widened by the spread around auto (stack_spread.auto_bands: norm 0.327-2.512,
    # elementwise 0.308-1.26); LayerNorm, which the designs do not cost, keeps torch's band (own_bands)
    assert e.band("norm") == [0.327, 2.512]
    assert e.band("elementwise")[0] == 0.308 and e.band("elementwise")[1] > 1.26
    assert e.own_bands == select_efficiency(hw, engine="torch").efficiency.bands
    assert {k: v for k, v in e.bands.items() if k not in ("norm", "elementwise")} == \
        {k: v for k, v in hw.efficiency.bands.items() if k not in ("norm", "elementwise")}


def test_an_engine_runs_on_the_blocks_sms(hw):
    # A GPU file whose SM count was edited (66, the profile's own GEMM figures still saying 132): under --engine vllm
    # the profile's tiles and vLLM's latency-bound norm design run on the block's 66 SMs, as auto's designs do. A
    # plain 4096 x 4096 RMSNorm: 67,117,056 B at 0.25 x 4.8e12 x 66 / 132 = 0.6e12 B/s = 111.862 us, + 1.25 us +
    # 0.38 ns x 4096 = 2.80648 us -> 114.668 us under both (a fresh-user finding: the engine path took 132 SMs).
    half = hw.model_copy(update={"efficiency": hw.efficiency.model_copy(
        update={"gemm": hw.efficiency.gemm.model_copy(update={"sm_count": 66})})})
    ops = K.norm("rmsnorm", 4096, 4096)
    vllm, auto = (K.cost(ops, select_efficiency(half, engine=e), "bf16")["time_s"]["calibrated"] for e in ("vllm", None))
    assert vllm == pytest.approx(auto, rel=1e-12) and auto == pytest.approx(114.668e-6, rel=1e-4)
    assert select_efficiency(half, engine="vllm").efficiency.gemm.sm_count == 66


def test_a_block_of_ones_own_keeps_its_figures_under_auto(hw):
    # auto's designs apply to the blocks lmcost ships (fit table public-kernels.csv or engine-kernels.csv), not to a
    # fit of one's own table or a calibrate run's (a block with conditions)
    own = hw.efficiency.model_copy(update={"fit": {**hw.efficiency.fit, "table": "my-kernels.csv"}})
    e = select_efficiency(hw.model_copy(update={"efficiency": own})).efficiency
    assert e.memory_designs == "" and e.kinds == own.kinds
    cal = hw.efficiency.model_copy(update={"conditions": {"device": "cuda"}})
    assert select_efficiency(hw.model_copy(update={"efficiency": cal})).efficiency.memory_designs == ""
    assert select_efficiency(hw, designs=False).efficiency.memory_designs == ""


def test_engine_without_profile_lists_those_there_are(hw):
    with pytest.raises(LmcostError) as e:
        select_efficiency(hw, engine="trtllm")
    assert e.value.field == "engine" and "sglang@0.5.0, vllm@0.11.0" in e.value.fix


def test_version_mismatch_names_the_shipped_one(hw):
    with pytest.raises(LmcostError) as e:
        select_efficiency(hw, engine="vllm@0.24.0")
    assert e.value.field == "engine" and "vllm@0.11.0" in e.value.fix
    assert select_efficiency(hw, engine="vllm@0.11.0").efficiency.engine == "vllm@0.11.0"


@pytest.mark.parametrize("bad", ["", "@1.0", "vllm@", "torch@2.5"])
def test_malformed_engine_refused(hw, bad):
    with pytest.raises(LmcostError) as e:
        select_efficiency(hw, engine=bad)
    assert e.value.field == "engine"


def test_gpu_without_block_takes_torch_not_an_engine():
    bare = load_gpu("v100")
    assert bare.efficiency is None
    assert select_efficiency(bare, engine="torch") is bare
    with pytest.raises(LmcostError) as e:
        select_efficiency(bare, engine="vllm")
    assert e.value.field == "engine"


def test_unknown_engine_key_refused_in_yaml():
    import yaml

    from lmcost.hardware.gpu import gpu_from_text

    d = yaml.safe_load(open(YAML))
    d["efficiency"]["engines"]["tgi"] = d["efficiency"]["engines"].pop("sglang")
    with pytest.raises(LmcostError, match="unknown engine 'tgi'"):
        gpu_from_text(yaml.safe_dump(d), "x.yaml")
