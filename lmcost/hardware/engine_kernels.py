"""Which kernels a serving engine runs for a decoder's operators, as data: the fusions it applies to the
operator graph (:data:`lmcost.operators.fusion.FUSIONS` names) and the kernel of its RMSNorm, each with
the source it was read from.

``--engine`` (estimate, plan, report, train, op) selects the engine's measured kernel figures from a GPU's
efficiency block (:meth:`lmcost.hardware.efficiency.Efficiency.with_engine`) and, from this table, the
fusions a decoder runs under it (``estimate``/``plan``/``report`` default ``--fuse`` to them) and the norm
kernel ``lmcost op rmsnorm`` costs. ``torch`` is the eager baseline (one kernel per operator but the fused
SiLU-and-mul lmcost has always counted); ``auto`` is no engine at all (today's defaults).

Sources: the engines' own source files, recalled (not re-read for this table: a path and function name
each), and the op graph the engines' measured tables are costed with in aiconfigurator-core 0.12.0
(Apache-2.0; ``sdk/models/llama.py``: one ``add_norm`` elementwise op reading and writing 2h per token,
one ``qkv_gemm`` of N = (h + 2 h_kv) d_h, one ``gate_ffn1_gemm`` of N = 2 d_ff, one ``act_gate``, and no
RoPE op of its own: the engine's attention op carries it), read from the unpacked wheel.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Engines ``--engine`` takes: ``auto`` (no engine: the GPU's default figures and lmcost's default fusion),
#: ``torch`` (eager PyTorch: the base figures, no engine overlay) and the serving engines profiled.
ENGINE_CHOICES = ("auto", "vllm", "sglang", "trtllm", "torch")
#: The serving engines, whose kernels this table lists and whose figures a GPU's ``engines:`` block holds.
SERVING_ENGINES = ("vllm", "sglang", "trtllm")


@dataclass(frozen=True)
class EngineKernels:
    """One engine's kernel choices for a dense or MoE decoder layer.

    ``fusions``: the fusions (:data:`lmcost.operators.fusion.FUSIONS` names) its model code runs.
    ``rmsnorm``: the kernel of an RMSNorm that follows a residual add (every norm of a layer but the first
    layer's input norm): ``fused_add_rmsnorm`` (reads x, the residual and the weight, writes the normed
    output and the new residual) or ``rmsnorm``. ``layernorm``: the same for LayerNorm.
    ``sources``: per fusion (and per norm), where it was read: a file and function, "recalled" where the
    file was not re-read for this table."""

    fusions: tuple[str, ...]
    rmsnorm: str
    layernorm: str
    sources: dict


#: The shared op graph of aiconfigurator-core's engine tables (see the module docstring).
_AIC = "aiconfigurator-core 0.12.0 sdk/models/llama.py (context_/generation_add_norm_1/2, qkv_gemm, gate_ffn1_gemm, act_gate)"

ENGINE_KERNELS: dict[str, EngineKernels] = {
    "vllm": EngineKernels(
        fusions=("silu_mul", "add_norm", "qkv", "gate_up", "moe_grouped"),
        rmsnorm="fused_add_rmsnorm", layernorm="layernorm",
        sources={
            "silu_mul": "vllm csrc/activation_kernels.cu silu_and_mul, called by SiluAndMul "
                        "(vllm/model_executor/layers/activation.py); recalled",
            "add_norm": "vllm csrc/layernorm_kernels.cu fused_add_rms_norm, called by RMSNorm.forward_cuda with a "
                        "residual (vllm/model_executor/layers/layernorm.py); recalled; " + _AIC,
            "qkv": "vllm/model_executor/layers/linear.py QKVParallelLinear (one GEMM for q, k, v); recalled",
            "gate_up": "vllm/model_executor/layers/linear.py MergedColumnParallelLinear (gate_up_proj); recalled",
            "moe_grouped": "vllm/model_executor/layers/fused_moe/fused_moe.py fused_experts (one grouped kernel); recalled",
            "rope": "not fused: vllm csrc/pos_encoding_kernels.cu rotary_embedding runs in place on q and k before "
                    "attention (vllm/model_executor/layers/rotary_embedding.py); recalled",
            "layernorm": "no fused add + LayerNorm kernel in csrc/layernorm_kernels.cu (rms_norm and "
                         "fused_add_rms_norm only): LayerNorm models run torch's; recalled",
        }),
    "sglang": EngineKernels(
        fusions=("silu_mul", "add_norm", "qkv", "gate_up", "moe_grouped"),
        rmsnorm="fused_add_rmsnorm", layernorm="layernorm",
        sources={
            "silu_mul": "sgl-kernel silu_and_mul, called by SiluAndMul (python/sglang/srt/layers/activation.py); recalled",
            "add_norm": "sgl-kernel fused_add_rmsnorm (FlashInfer include/flashinfer/norm.cuh FusedAddRMSNorm), called by "
                        "RMSNorm.forward_cuda with a residual (python/sglang/srt/layers/layernorm.py); recalled; " + _AIC,
            "qkv": "python/sglang/srt/layers/linear.py QKVParallelLinear; recalled",
            "gate_up": "python/sglang/srt/layers/linear.py MergedColumnParallelLinear (gate_up_proj); recalled",
            "moe_grouped": "python/sglang/srt/layers/moe/fused_moe_triton (fused_experts); recalled",
            "rope": "not fused: sgl-kernel apply_rope_with_cos_sin_cache_inplace before attention "
                    "(python/sglang/srt/layers/rotary_embedding.py); recalled",
            "layernorm": "no fused add + LayerNorm kernel (sgl-kernel fuses RMSNorm only); recalled",
        }),
    "trtllm": EngineKernels(
        fusions=("silu_mul", "add_norm", "rope_attention", "qkv", "gate_up", "moe_grouped"),
        rmsnorm="fused_add_rmsnorm", layernorm="layernorm",
        sources={
            "silu_mul": "tensorrt_llm/_torch/modules/gated_mlp.py GatedMLP: swiglu on the fused gate_up output; recalled",
            "add_norm": "tensorrt_llm/_torch/modules/rms_norm.py RMSNorm.forward with residual: flashinfer "
                        "fused_add_rmsnorm; recalled; " + _AIC,
            "qkv": "tensorrt_llm/_torch/modules/attention.py Attention.qkv_proj (one Linear for q, k, v); recalled",
            "gate_up": "tensorrt_llm/_torch/modules/gated_mlp.py GatedMLP.gate_up_proj; recalled",
            "moe_grouped": "tensorrt_llm/_torch/modules/fused_moe (CutlassFusedMoE); recalled",
            "rope_attention": "tensorrt_llm/_torch/modules/attention.py rope_fusion: the TRTLLM attention backend "
                              "applies RoPE inside its attention op (cpp/tensorrt_llm/kernels/unfusedAttentionKernels "
                              "applyBiasRopeUpdateKVCache in context, the decoder MHA/XQA kernels in generation); "
                              "recalled; " + _AIC + " has no RoPE op",
            "layernorm": "tensorrt_llm/_torch/modules/layer_norm.py: the residual is added before F.layer_norm "
                         "(no fused add + LayerNorm); recalled",
        }),
}


def engine_kernels(name: str) -> EngineKernels | None:
    """The kernel choices of serving engine ``name`` (vllm, sglang, trtllm), or None for auto and torch
    (no engine: lmcost's defaults)."""
    return ENGINE_KERNELS.get(name)


def parse_engine(text: str | None) -> tuple[str, str | None] | None:
    """``vllm`` -> ("vllm", None); ``vllm@0.24.0`` -> ("vllm", "0.24.0"); None -> None (not given).

    Raises: LmcostError (engine) for an empty text, an unknown engine (listing :data:`ENGINE_CHOICES`), a
    version after ``auto`` or ``torch`` (they have none), or an empty version."""
    from lmcost.basics.errors import LmcostError

    if text is None:
        return None
    name, at, version = text.strip().partition("@")
    name = name.strip().lower()
    if not name:
        raise LmcostError("engine", "empty" if not text.strip() else f"{text!r:.60} names no engine",
                          f"give one of {', '.join(ENGINE_CHOICES)}, optionally with @version (vllm@0.24.0)")
    if name not in ENGINE_CHOICES:
        raise LmcostError("engine", f"unknown engine {name!r:.40}",
                          f"use one of {', '.join(ENGINE_CHOICES)}, optionally with @version (vllm@0.24.0)")
    if at and name not in SERVING_ENGINES:
        raise LmcostError("engine", f"{name} has no versions", f"give {name} alone")
    if at and not version.strip():
        raise LmcostError("engine", f"{text!r:.60} has an empty version", f"give {name} alone, or {name}@VERSION")
    return name, (version.strip() or None) if at else None
