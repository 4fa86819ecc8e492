"""validate --trace on traces lmcost did not write: a transformers Llama profiled by torch.profiler, a GPU
trace of module-scoped kernels, and kernel names as cuBLAS, FlashAttention, cuDNN, Triton and torch write them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from lmcost.cli import app
from lmcost.profiling import foreign
from lmcost.profiling import trace as traces

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

GPU = str(ROOT / "reports" / "cpu-calibration.yaml")
B, S = 2, 16


@pytest.mark.parametrize("name, cls", [
    # cuBLAS: Hopper's nvjet and sm90 xmma kernels, Ampere's, and a CUTLASS kernel.
    ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", "gemm"),
    ("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>", "gemm"),
    # FlashAttention 2 (its template arguments name cutlass), torch's copy of it, FA3, cuDNN SDPA, xformers-style.
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t>>, false, true, false, false, true, true, false, false>",
     "attention"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 4, cutlass::bfloat16_t>>, true, false, false, false, "
     "true, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("cutlass::device_kernel<flash::enable_sm90_or_later<flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, "
     "cute::tuple<cute::C<1>, cute::C<1>, cute::C<1>>, cute::tuple<cute::C<128>, cute::C<128>, cute::C<128>>, 128, "
     "cutlass::bfloat16_t, float, cutlass::arch::Sm90, true, false>>>>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),
    # Triton (torch.compile): pointwise, a reduction that fuses rsqrt (an RMSNorm), persistent reductions, a template GEMM.
    ("triton_poi_fused_mul_silu_0", "elementwise"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1", "norm"),
    ("triton_per_fused__to_copy_add_embedding_mean_mul_pow_rsqrt_0", "norm"),
    ("triton_per_fused__softmax_0", "softmax"),
    ("triton_tem_fused_mm_0", "gemm"),
    ("triton_poi_fused_cat_2", "copy"),
    # torch's own CUDA kernels.
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
     "at::detail::Array<char*, 3>>(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)",
     "elementwise"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, c10::BFloat16, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(c10::BFloat16*, c10::BFloat16 const*, int)", "softmax"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
     "unsigned int, float, 4, 4>>(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, "
     "unsigned int, float, 4, 4>)", "elementwise"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<"
     "at::native::OpaqueType<2>>(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, "
     "char const*, long)#1}>>(long)", "copy"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, true>("
     "at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, "
     "unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)",
     "embedding"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>, "
     "TrivialOffsetCalculator<2, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
     "at::native::memory::LoadWithCast<2>, at::native::memory::StoreWithCast<1>>(int)", "elementwise"),
    ("rms_norm_kernel", "norm"),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(c10::BFloat16*, c10::BFloat16 const*, long, long)", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, "
     "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)", "norm"),
    # An eager RMSNorm's rsqrt alone is elementwise by name (the pattern or its module makes it a norm).
    ("void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>>(int)", "elementwise"),
    ("aten::embedding", "embedding"),
])
def test_cuda_kernel_names_are_classified(name, cls):
    assert traces.classify(name) == cls


def _llama(tmp_path, attn: str, *, stack: bool = True, shapes: bool = True, family: str = "Llama"):
    """A tiny transformers Llama (or Mixtral): its config.json and the Chrome trace of one forward of
    [B, S] token ids."""
    extra = dict(num_local_experts=4, num_experts_per_tok=2) if family == "Mixtral" else {}
    cfg = getattr(transformers, f"{family}Config")(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                                   attn_implementation=attn, **extra)
    cfg.to_json_file(tmp_path / "config.json")
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (B, S))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            model(ids)  # warm-up
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes,
                                        with_stack=stack) as prof:
                model(ids)
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / f"llama-{attn}.json"
    prof.export_chrome_trace(str(path))
    return tmp_path / "config.json", path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """:func:`_llama`, each variant traced once for the module (the tests only read the trace)."""
    made = {}

    def get(attn: str, **kw):
        key = (attn, *sorted(kw.items()))
        if key not in made:
            made[key] = _llama(tmp_path_factory.mktemp("llama"), attn, **kw)
        return made[key]
    return get


def _unpredicted_share(trace, rows) -> float:
    """The share of the trace's ops that no predicted class took, by count: the attribution by op identity.
    Not by time: a stall of the profiling machine inflates whichever op it lands in, and one op preempted
    for about 1.4 ms made 37% of a 2.4 ms trace unpredicted on a loaded 2-core machine (issue 24)."""
    att = foreign.attribute(json.loads(trace.read_text()), set(rows) - {foreign.UNPREDICTED})
    assert sum(att.times.values()) == pytest.approx(sum(x["measured_time_s"] for x in rows.values()))
    return att.counts[foreign.UNPREDICTED] / sum(att.counts.values())


def _validate(cfg, trace, *extra):
    """validate of the trace with the run's options, each option in ``extra`` replacing the run's own (an
    option given twice is refused)."""
    base = {"--gpu": GPU, "--dtype": "fp32", "--batch": str(B), "--prompt": str(S), "--layers": "2"}
    base = [x for k, v in base.items() if k not in extra for x in (k, v)]
    return CliRunner().invoke(app, ["validate", str(cfg), "--trace", str(trace), *base, *extra])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_transformers_llama_trace_is_attributed_by_module(llama, attn):
    cfg, trace = llama(attn)
    r = _validate(cfg, trace, "--json")
    assert r.exit_code == 0, r.output
    rows = {x["op_class"]: x for x in json.loads(r.stdout)}
    # ≥95% of the trace's ops go to predicted classes (6 of 496 with sdpa do not: arange, unsqueeze and the
    # allocations of the causal mask's set-up); the rest of the time is one explicit row.
    assert _unpredicted_share(trace, rows) <= 0.05, rows["unpredicted"]
    assert sum(x["measured_share"] for x in rows.values()) == pytest.approx(1)
    assert rows["unpredicted"]["roofline_time_s"] is None
    # The RMSNorm (pow, mean, rsqrt, mul) is a norm; each module-told class has time.
    for cls in ("norm", "gemm", "attention", "elementwise", "embedding", "lm_head"):
        assert rows[cls]["measured_time_s"] > 0 and rows[cls]["roofline_time_s"] > 0, cls
    assert "attributed by the module" in r.stderr
    assert "1 prefill(s) of 16 tokens and 0 decode step(s) at batch 2, 2 layers" in r.stderr
    # The table says the same share.
    table = _validate(cfg, trace)
    assert table.exit_code == 0 and "attributed to predicted operator classes, by modules" in table.stdout


def test_a_mixtral_trace_credits_its_router(llama):
    cfg, trace = llama("sdpa", family="Mixtral")
    r = _validate(cfg, trace, "--json")
    assert r.exit_code == 0, r.output
    rows = {x["op_class"]: x for x in json.loads(r.stdout)}
    assert _unpredicted_share(trace, rows) <= 0.05, rows["unpredicted"]
    # The router (a TopKRouter module: its linear, softmax and top-k) is moe_routing; the experts are gemm:
    # more ops than the router's (counted, not timed: a stall in one router op would outweigh them).
    assert rows["moe_routing"]["measured_time_s"] > 0 and rows["moe_routing"]["roofline_time_s"] > 0
    att = foreign.attribute(json.loads(trace.read_text()), set(rows) - {foreign.UNPREDICTED})
    assert att.counts["gemm"] > att.counts["moe_routing"] > 0


@pytest.mark.parametrize("flags, said", [
    (["--batch", "3"], "it holds batch 2 (token ids [2, 16] into the embedding), not --batch 3; give --batch 2"),
    (["--prompt", "8"], "its first forward runs 16 tokens per sequence (token ids [2, 16]), not --prompt 8; give --prompt 16"),
    (["--layers", "1"], "it runs 2 decoder layers, not --layers 1; give --layers 2"),
])
def test_a_trace_of_other_work_is_refused_in_one_line(llama, flags, said):
    cfg, trace = llama("sdpa")
    r = _validate(cfg, trace, *flags)
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.startswith(f"error: --trace: {said}") and r.stderr.count("\n") == 1, r.stderr


def test_without_modules_or_shapes_patterns_find_the_norm_and_say_what_was_not_checked(llama):
    cfg, trace = llama("sdpa", stack=False, shapes=False)
    r = _validate(cfg, trace, "--batch", "7", "--json")  # a wrong batch cannot be seen without shapes
    assert r.exit_code == 0, r.output
    rows = {x["op_class"]: x for x in json.loads(r.stdout)}
    assert rows["norm"]["measured_time_s"] > 0
    assert "lm_head" not in rows  # by name the lm_head is a GEMM like any other
    assert "pow/mean/rsqrt/mul pattern" in r.stderr and "could not be checked" in r.stderr


def test_a_trace_with_shapes_but_no_forward_of_the_model_is_refused(llama, tmp_path):
    # A profiled 64 x 64 matmul, shapes recorded: it matches gemm by name, but holds no forward of the
    # model (no token-id lookup into its embedding), so it cannot be compared with a prediction of one.
    cfg, _ = llama("sdpa")
    a = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.mm(a, a)
    trace = tmp_path / "mm.json"
    prof.export_chrome_trace(str(trace))
    r = _validate(cfg, trace)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("error: --trace: it records shapes but no forward of ") and "aten::embedding over its 256 rows" in r.stderr


def test_a_trace_where_nothing_matches_is_one_line(tmp_path):
    ev = [dict(ph="X", cat="cpu_op", name="aten::empty", ts=0, dur=5, tid=1, pid=1),
          dict(ph="X", cat="cpu_op", name="my_custom_op", ts=10, dur=5, tid=1, pid=1)]
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": ev}))
    r = CliRunner().invoke(app, ["validate", "gpt2", "--gpu", "h100", "--trace", str(p)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("error: --trace: nothing in it matches a predicted operator class (")


def _x(name, cat, ts, dur, tid=1, pid=1, **args):
    return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur, pid=pid, tid=tid, args=args)


def test_gpu_kernels_take_the_class_of_the_module_that_launched_them():
    # A host thread: an RMSNorm module whose ops launch a pow, a mean, an rsqrt and a mul kernel, and the
    # lm_head (a Linear outside every layer) launching an nvjet GEMM. Kernels run on stream 7 of device 0.
    host = [_x("nn.Module: LlamaRMSNorm_0", "python_function", 0, 100),
            _x("nn.Module: Linear_0", "python_function", 200, 100)]
    kernels = []
    for i, (op, kernel) in enumerate([("aten::pow", "vectorized_elementwise_kernel<pow_tensor_scalar_kernel>"),
                                      ("aten::mean", "reduce_kernel<MeanOps<float>>"),
                                      ("aten::rsqrt", "vectorized_elementwise_kernel<rsqrt_kernel_cuda>"),
                                      ("aten::mul", "vectorized_elementwise_kernel<MulFunctor<float>>"),
                                      ("aten::mm", "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT")]):
        ts = 10 + 20 * i + (150 if op == "aten::mm" else 0)
        host += [_x(op, "cpu_op", ts, 15, **{"External id": i}),
                 _x("cudaLaunchKernel", "cuda_runtime", ts + 5, 5, correlation=100 + i, **{"External id": i})]
        kernels.append(_x(kernel, "kernel", 1000 + 10 * i, 4, tid=7, pid=0, correlation=100 + i, **{"External id": i}))
    # One kernel no op launched: by its name.
    kernels.append(_x("flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", "kernel", 2000, 8, tid=7, pid=0))
    att = foreign.attribute({"traceEvents": host + kernels}, {"norm", "lm_head", "gemm", "attention", "elementwise"})
    assert att.method == "modules"
    assert dict(att.times) == pytest.approx({"norm": 16e-6, "lm_head": 4e-6, "attention": 8e-6})
    assert dict(att.counts) == {"norm": 4, "lm_head": 1, "attention": 1}  # kernels, whatever their durations


def test_patterns_find_an_eager_rmsnorm_and_rope_in_a_kernel_stream():
    names = ["vectorized_elementwise_kernel<pow_tensor_scalar_kernel>", "reduce_kernel<MeanOps<float>>",
             "vectorized_elementwise_kernel<CUDAFunctor_add>", "vectorized_elementwise_kernel<rsqrt_kernel_cuda>",
             "vectorized_elementwise_kernel<MulFunctor>", "unrolled_elementwise_kernel<direct_copy_kernel_cuda>",
             "vectorized_elementwise_kernel<MulFunctor>", "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT"]
    assert foreign.patterns(names) == {i: "norm" for i in range(7)}
    rope = ["aten::mul", "aten::slice", "aten::slice", "aten::neg", "aten::cat", "aten::mul", "aten::add", "aten::cat"]
    assert foreign.patterns(rope) == {i: "elementwise" for i in range(7)}
    # An rsqrt alone (no pow and mean before it) is no norm.
    assert foreign.patterns(["aten::rsqrt", "aten::mul"]) == {}
