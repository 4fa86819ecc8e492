"""The routed experts' GEMMs under DeepEP: DeepGEMM's grouped FP8 kernels, not the MoE kernel an engine's
fitted profile measured.

SGLang's DeepEP path (``--moe-a2a-backend deepep``, formerly ``--enable-deepep-moe``) runs the experts as
DeepGEMM grouped GEMMs: the contiguous layout after DeepEP's normal (high-throughput) dispatch in prefill, the
masked layout after its low-latency dispatch in decode (LMSYS blog, 2025-05-05, "Deploying DeepSeek with PD
Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs", section "DeepGEMM Integration"). An engine profile's ``experts.*`` factors were fitted on
aggregated serving points (:mod:`lmcost.apps.serve_fit`, reports/serve-fit.md): for SGLang every one of them
has attention-DP 1 and no DeepEP (lmcost/data/measurements/serving-silicon.csv), i.e. SGLang's default fused
MoE kernel on experts split by moe_tp, compute-bound only in prefill chunks just past the ridge point. Its
``experts.compute`` factor (10.98 for SGLang 0.5) carried to DeepEP's prefill, whose experts run ~14,000 rows
each (16,384 tokens x top-8 over 9 experts a GPU), made them 3.6 s of a 4 s step; its ``experts.memory``
factor (1.28, fitted on decode TPOTs: weights streamed at small batch) is a statement about reading weights,
which both kernels do at the same bound, and is kept.

Under a DeepEP kernel the ``experts.compute`` factor is therefore DeepGEMM's, from the one measured DeepGEMM
figure lmcost holds on an H100 at a large GEMM: M 1024, N 18432, K 7168 (FP8, block-scaled) in 279.0 us, 969.8
TFLOPS (lmcost/data/measurements/public-kernels.csv, from vllm-project/vllm#13917), against the H100 SXM's
1,978.9 dense FP8 TFLOPS (lmcost/data/gpus/h100-sxm.yaml): 1978.9 / 969.8 = 2.04. That is a dense GEMM, not
a grouped one (no grouped DeepGEMM figure is held; DeepGEMM's README publishes grouped contiguous-layout
figures of ~1,100-1,300 TFLOPS on H800 for DeepSeek-V3's shapes, recalled, not re-read in this session: a
factor of ~1.5-1.8, so 2.04 is the slower side). It is applied on any GPU as a fraction of that GPU's peak.
"""

from __future__ import annotations

#: H100 SXM dense FP8 peak, TFLOPS (lmcost/data/gpus/h100-sxm.yaml) over DeepGEMM's measured 969.8 TFLOPS at
#: M 1024, N 18432, K 7168 (lmcost/data/measurements/public-kernels.csv, vllm-project/vllm#13917).
DEEPGEMM_COMPUTE = 1978.9 / 969.8
#: The DeepEP kernels whose experts run as DeepGEMM grouped GEMMs (lmcost.cost.deepep.A2A_KERNELS).
DEEPGEMM_KERNELS = ("deepep-ht", "deepep-ll")


def expert_scales(scales: dict, engine_scales: dict | None, kernel: str) -> dict:
    """A step model's group factors ``scales`` (:data:`lmcost.cost.engine_step.GROUPS`) with the engine's
    fitted ``experts.compute`` factor (``engine_scales``, None under the roofline or calibrated time models)
    replaced by :data:`DEEPGEMM_COMPUTE` when ``kernel`` is a DeepEP kernel; any other factor applied on top
    of the engine's (a power cap's clock) is kept. ``scales`` itself otherwise. Raises: nothing."""
    if kernel not in DEEPGEMM_KERNELS or not engine_scales:
        return scales
    g = "experts.compute"
    return {**scales, g: scales[g] / float(engine_scales.get(g, 1.0)) * DEEPGEMM_COMPUTE}
