"""Quantization recipes: which storage format each weight tensor of a checkpoint is in, and its bytes.

A checkpoint people download is mixed: a GGUF K-quant assigns a format per tensor, AWQ/GPTQ leave the
embeddings, lm_head and norms in 16-bit, FP8 checkpoints keep fp32 scales per tensor, row or 128x128 block.
A :class:`Recipe` maps each tensor kind to a :class:`Format`, and a format's bytes follow from its block
layout (one tensor of ``rows`` output rows and ``cols`` input columns, blocks running along a row as
GGUF's ``ne[0]`` and AWQ/GPTQ's groups do)::

    bytes = rows * ceil(cols / block) * block_bytes          values and in-block scales/zeros
          + tensor_bytes                                     one global scale (fp8 per tensor, NVFP4)
          + rows * row_bytes                                 a scale per output channel (int8, fp8 per channel)
          + cols * col_bytes                                 GPTQ's g_idx, one int32 per input column
          + ceil(rows / tile) * ceil(cols / tile) * tile_bytes   one scale per 2-D tile (fp8 block 128x128)

Tensor kinds come from the operator records' roles (:class:`lmcost.operators.ops.OpCost`): ``embedding`` (token
table), ``pos_embedding`` (a learned position table), ``attention`` (q/k/v/o and MLA projections),
``ffn`` (dense and shared-expert gate/up/down), ``expert`` (routed experts, one 3-D tensor per matrix),
``router`` (the expert gate), ``lm_head``, and ``vector`` (norm weights and biases: 1-D tensors).

Sources (block structs re-derived, bytes per block):
- GGUF (llama.cpp ``ggml-common.h``): Q4_0 = fp16 d + 16 B of nibbles = 18 B / 32; Q8_0 = fp16 d + 32 int8 =
  34 B / 32; Q5_0 = fp16 d + 4 B high bits + 16 B nibbles = 22 B / 32; Q5_1 = Q5_0 + fp16 m = 24 B / 32;
  Q4_K = fp16 d + fp16 dmin + 12 B 6-bit scales/mins + 128 B nibbles = 144 B / 256; Q5_K = Q4_K + 32 B high
  bits = 176 B / 256; Q6_K = 128 B low nibbles + 64 B high 2 bits + 16 int8 scales + fp16 d = 210 B / 256.
  Which tensor gets which type: llama.cpp ``llama_tensor_get_type`` (see :func:`gguf_type`).
- AWQ/GPTQ int4 g128: 128 x 4-bit = 64 B, one fp16 scale, one 4-bit zero (qzeros packs 8 per int32) per
  group of 128 inputs of one output: 66.5 B / 128 = 4.15625 bits; GPTQ also stores ``g_idx`` (int32 per input).
- FP8 e4m3: 1 B per weight; fp32 scales per tensor, per output channel, or per 128x128 block (DeepSeek-V3
  ``weight_scale_inv``).
- NVFP4: 16 e2m1 (8 B) + one e4m3 scale = 9 B / 16, plus one fp32 global scale per tensor (ModelOpt
  ``weight_scale_2``; the activation's ``input_scale`` is not counted).
- MXFP4 (OCP MX v1.0): 32 e2m1 (16 B) + one e8m0 exponent = 17 B / 32 (gpt-oss ``*_blocks`` + ``*_scales``).

GEMM compute (:attr:`Recipe.compute`, :meth:`Recipe.gemm_dtype`): the GEMMs over the weights a recipe
quantizes (``Recipe.kinds``: attention projections, FFN, experts; never attention's QK^T/PV, nor an
lm_head, embedding or router it leaves 16-bit) run at the tensor peak of the dtype their operands are
multiplied in. Which that is, is what the serving engines' kernels do with such a checkpoint
("recalled": read from the engines' source or docs before, not re-read for this table):
- fp8-tensor / fp8-channel / fp8-block128: W8A8, the fp8 peak. vLLM's ``Fp8LinearMethod`` and
  compressed-tensors W8A8-FP8 quantize the activations dynamically (per token for channel-wise weights,
  per tensor otherwise; 1x128 groups for the 128x128-block DeepSeek-V3 checkpoints) and run cutlass /
  cuBLASLt fp8 GEMMs; TensorRT-LLM's FP8 and FP8-block-scales modes do the same (recalled). On a GPU
  without fp8 tensor cores (A100) vLLM runs them weight-only, W8A16 through its FP8 Marlin kernel ("Your
  GPU does not have native support for FP8 computation ... Weight-only FP8 compression will be used
  leveraging the Marlin kernel", recalled): the 16-bit peak.
- nvfp4: W4A4, the fp4 peak: ModelOpt NVFP4 checkpoints carry an activation ``input_scale`` and vLLM
  (``ModelOptNvFp4LinearMethod``: cutlass / FlashInfer fp4 GEMMs) and TensorRT-LLM quantize the
  activations to NVFP4 on Blackwell (recalled). Without fp4 tensor cores (Hopper, Ampere) vLLM runs
  NVFP4 weights through Marlin, W4A16 (recalled): the 16-bit peak, not fp8 (no engine known here runs
  NVFP4 weights against fp8 activations).
- mxfp4 (gpt-oss experts): W4A16 on a GPU without an fp4 peak (vLLM's Marlin / Triton MoE kernels on
  Hopper); W4A8 on one with an fp4 peak (Blackwell, MI355X): FlashInfer's and TensorRT-LLM's MXFP4 x
  MXFP8 MoE kernels, the default gpt-oss path of TensorRT-LLM on B200 (recalled). An MXFP4 x MXFP8 MMA
  (``tcgen05.mma kind::f8f6f4``) runs at the fp8 rate, so: the fp8 peak. One rule, stated; an engine run
  with its W4A16 (``..._MXFP4_BF16``) backend is slower than this.
- int8, awq-g128, gptq-g128, GGUF: weight-only (A16): the weights are dequantized in the kernel and
  multiplied in the run's activation dtype, at its peak.
Bytes are unchanged by the compute dtype: a W8A8/W4A4 GEMM's activation read is counted in the
activation dtype, and the kernel that quantizes the activations (vLLM's per-token fp8 quant reads the
16-bit activation and writes fp8) is not an op of its own here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

from lmcost.basics.errors import LmcostError


@dataclass(frozen=True)
class Format:
    """A storage format: ``block`` values along a row take ``block_bytes``, plus the extras of its scales
    (per tensor, per output row, per input column, per ``tile`` x ``tile`` block). Bytes; see the module."""

    name: str
    block: int
    block_bytes: Fraction
    tensor_bytes: int = 0
    row_bytes: Fraction = Fraction(0)
    col_bytes: int = 0
    tile: int = 0
    tile_bytes: int = 0

    def nbytes(self, rows: int, cols: int) -> Fraction:
        """Bytes of one [rows, cols] tensor (a 1-D tensor is rows = 1), exact."""
        out = rows * math.ceil(cols / self.block) * Fraction(self.block_bytes) + self.tensor_bytes
        out += rows * Fraction(self.row_bytes) + cols * self.col_bytes
        if self.tile:
            out += math.ceil(rows / self.tile) * math.ceil(cols / self.tile) * self.tile_bytes
        return out

    @property
    def bits_per_weight(self) -> float:
        """Bits per weight of the blocks alone (no per-tensor/row/tile extras)."""
        return float(8 * Fraction(self.block_bytes) / self.block)


F = Fraction
FORMATS = {f.name: f for f in (
    Format("F32", 1, F(4)), Format("F16", 1, F(2)), Format("BF16", 1, F(2)),
    Format("Q4_0", 32, F(18)), Format("Q5_0", 32, F(22)), Format("Q5_1", 32, F(24)), Format("Q8_0", 32, F(34)),
    Format("Q4_K", 256, F(144)), Format("Q5_K", 256, F(176)), Format("Q6_K", 256, F(210)),
    # int8 weight-only, symmetric, one fp16 scale per output channel
    Format("INT8-channel", 1, F(1), row_bytes=F(2)),
    # 64 B of nibbles + fp16 scale + 4-bit zero per group of 128 inputs
    Format("AWQ-g128", 128, F(133, 2)),
    Format("GPTQ-g128", 128, F(133, 2), col_bytes=4),
    Format("FP8-tensor", 1, F(1), tensor_bytes=4),
    Format("FP8-channel", 1, F(1), row_bytes=F(4)),
    Format("FP8-block128", 1, F(1), tile=128, tile_bytes=4),
    Format("NVFP4", 16, F(9), tensor_bytes=4),
    Format("MXFP4", 32, F(17)),
)}

#: GGUF recipes and their base type (llama.cpp ``LLAMA_FTYPE_MOSTLY_*``).
GGUF_BASE = {"q4_0": "Q4_0", "q8_0": "Q8_0", "q4_k_m": "Q4_K", "q5_k_m": "Q5_K", "q6_k": "Q6_K"}
#: llama.cpp's fallback for a K-quant whose rows are not a whole number of 256-blocks (then F16 if still not).
_K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

KINDS = ("embedding", "pos_embedding", "attention", "ffn", "expert", "router", "lm_head", "vector")
_LINEAR = ("attention", "ffn", "expert")


@dataclass(frozen=True)
class Recipe:
    """A quantization recipe: a format per tensor kind (``rules``), or for a GGUF mix the llama.cpp rules
    (``gguf``: the ftype, see :func:`gguf_type`). ``summary`` is the line the README and help show."""

    name: str
    summary: str
    rules: dict = field(default_factory=dict)
    gguf: str = ""
    #: The dtype the GEMMs over the quantized weights multiply in where the GPU runs the recipe's native
    #: kernel ("": weight-only, the run's activation dtype); ``native``: the tensor peak that kernel needs
    #: (the weights' own: fp8, fp4); ``kinds``: the tensor kinds those GEMMs read. See the module.
    compute: str = ""
    native: str = ""
    kinds: tuple = ()

    def gemm_dtype(self, peaks, activations: str) -> str:
        """The dtype whose dense tensor peak a GEMM over this recipe's quantized weights runs at, on a GPU
        whose ``peak_tflops`` are ``peaks`` (a mapping: dtype -> TFLOP/s), in a run whose activations are
        ``activations``: ``compute`` where the GPU has both the ``native`` and the ``compute`` peak, else
        ``activations`` (weight-only: the weights dequantized into the activation dtype in the kernel, as
        vLLM's Marlin kernels run fp8 and fp4 weights on GPUs without those tensor cores). Source: the
        module's table of what engines run."""
        if self.compute and self.native in peaks and self.compute in peaks:
            return self.compute
        return activations

    def format_for(self, cfg, kind: str, sub: str = "", layer: int = 0, rows: int = 1, cols: int = 1) -> Format:
        """The format of one tensor: of ``kind`` (KINDS), role ``sub`` within it (``v_proj``, ``down``...),
        in layer ``layer``, ``cols`` wide (input features, the row GGUF blocks run along)."""
        if self.gguf:
            return FORMATS[gguf_type(self.gguf, cfg, kind, sub, layer, cols)]
        return FORMATS[self.rules[kind]]


def _plain(name: str, fmt: str, summary: str) -> Recipe:
    return Recipe(name, summary, {k: fmt for k in KINDS})


def _linear(name: str, fmt: str, rest: str, summary: str, kinds=_LINEAR, compute: str = "", native: str = "") -> Recipe:
    return Recipe(name, summary, {k: (fmt if k in kinds else rest) for k in KINDS}, compute=compute,
                  native=native or compute, kinds=tuple(kinds))


RECIPES = {r.name: r for r in (
    _plain("fp32", "F32", "every tensor fp32 (32 bits)"),
    _plain("bf16", "BF16", "every tensor bf16 (16 bits)"),
    _plain("fp16", "F16", "every tensor fp16 (16 bits)"),
    _linear("int8", "INT8-channel", "F16", "linear weights in the layers int8 with an fp16 scale per output "
            "channel (8 + 16/in bits); embedding, lm_head, router, norms fp16"),
    _linear("awq-g128", "AWQ-g128", "F16", "linear weights in the layers 4-bit, group 128 along the input, fp16 "
            "scale + 4-bit zero per group (4.156 bits); embedding, lm_head, router, norms fp16"),
    _linear("gptq-g128", "GPTQ-g128", "F16", "as awq-g128, plus GPTQ's g_idx (one int32 per input column)"),
    Recipe("q4_0", "GGUF Q4_0 (4.5 bits); output Q6_K; norms, router F32", gguf="q4_0"),
    Recipe("q8_0", "GGUF Q8_0 (8.5 bits); norms, router F32", gguf="q8_0"),
    Recipe("q4_k_m", "GGUF Q4_K_M: Q4_K (4.5 bits), attn_v/ffn_down Q6_K in use_more_bits layers, output Q6_K, "
           "norms F32", gguf="q4_k_m"),
    Recipe("q5_k_m", "GGUF Q5_K_M: Q5_K (5.5 bits), attn_v/ffn_down Q6_K in use_more_bits layers, output Q6_K, "
           "norms F32", gguf="q5_k_m"),
    Recipe("q6_k", "GGUF Q6_K (6.5625 bits); norms, router F32", gguf="q6_k"),
    _linear("fp8-tensor", "FP8-tensor", "BF16", "linear weights in the layers fp8 e4m3 with one fp32 scale per "
            "tensor; embedding, lm_head, router, norms bf16", compute="fp8"),
    _linear("fp8-channel", "FP8-channel", "BF16", "linear weights in the layers fp8 with an fp32 scale per output "
            "channel (8 + 32/in bits); the rest bf16", compute="fp8"),
    _linear("fp8-block128", "FP8-block128", "BF16", "linear weights in the layers fp8 with an fp32 scale per "
            "128x128 block (8 + 32/16384 bits, DeepSeek-V3); the rest bf16", compute="fp8"),
    _linear("nvfp4", "NVFP4", "BF16", "linear weights in the layers NVFP4: 16 e2m1 + an e4m3 scale (4.5 bits) "
            "+ an fp32 scale per tensor; the rest bf16", compute="fp4"),
    _linear("mxfp4", "MXFP4", "BF16", "routed experts MXFP4: 32 e2m1 + an e8m0 scale (4.25 bits, gpt-oss); "
            "everything else bf16 (a dense model keeps every tensor bf16)", kinds=("expert",), compute="fp8",
            native="fp4"),
)}


#: The W4A4 GEMM ``lmcost op gemm --dtype fp4`` costs, by the FP4 format of the GPU's tensor cores
#: (:attr:`lmcost.hardware.gpu.GPU.fp4_format`): A and B both in that format, multiplied at the fp4 peak.
#: NVFP4's is the nvfp4 recipe's GEMM (NVIDIA Blackwell). MXFP4 x MXFP4 is what AMD's CDNA 4 FP4 rate is
#: quoted for (the MI355X datasheet's "MXFP4" figure); it is no checkpoint recipe lmcost models (its mxfp4
#: recipe is gpt-oss's W4A8 experts), so it lives here only: no ``quant`` setting takes it.
FP4_GEMMS = {"NVFP4": RECIPES["nvfp4"],
             "MXFP4": Recipe("mxfp4-w4a4", "A and B MXFP4: 32 e2m1 + an e8m0 scale (4.25 bits), at the fp4 peak",
                             {k: "MXFP4" for k in KINDS}, compute="fp4", native="fp4", kinds=_LINEAR)}


def gemm_recipe(name: str) -> Recipe:
    """The recipe an operator record's ``quant`` names (:attr:`lmcost.operators.ops.OpCost.quant`): a recipe of
    :data:`RECIPES`, or a W4A4 GEMM of :data:`FP4_GEMMS` (``mxfp4-w4a4``), which only ``lmcost op gemm`` builds.
    Raises: LmcostError (quant) for any other name, as :func:`recipe`."""
    extra = {r.name: r for r in FP4_GEMMS.values()}
    return extra.get(str(name).lower()) or recipe(name)


def recipe(name: str) -> Recipe:
    """The recipe called ``name``. Raises: LmcostError naming ``quant`` for an unknown name, listing them."""
    if isinstance(name, Recipe):
        return name
    key = str(name).lower()
    if key not in RECIPES:
        raise LmcostError("quant", f"unknown recipe {name!r}", f"use one of {', '.join(RECIPES)}")
    return RECIPES[key]


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's layers that get more bits in a _M mix: the first and last eighth and every third between
    (C integer division: n/8, 7n/8)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _is_70b(cfg) -> bool:
    """llama.cpp's LLM_TYPE_70B (Llama-2/3-70B, Qwen-72B): 80 layers of grouped-query attention."""
    return cfg.n_layers == 80 and cfg.h_kv < cfg.attention.n_heads and cfg.moe is None


def gguf_type(ftype: str, cfg, kind: str, sub: str, layer: int, cols: int) -> str:
    """The GGUF type llama.cpp's ``llama_tensor_get_type`` gives one tensor under ``ftype`` (no imatrix).

    - 1-D tensors (norms, biases), the router (``ffn_gate_inp``) and a learned position table stay F32;
    - ``output`` (the lm_head, or the token table when tied): Q8_0 under q8_0 or when its rows are not whole
      256-blocks, else Q6_K; the token table otherwise takes the base type;
    - q4_k_m/q5_k_m: ``attn_v`` and ``ffn_down`` (dense, shared and routed experts) Q6_K in the layers
      where use_more_bits(i, n_layers) holds;
    - 70B (80 layers, GQA): an ``attn_v`` left Q4_K (or Q3_K) becomes Q5_K;
    - 8 experts (Mixtral): ``attn_k`` and ``attn_v`` Q8_0, and under q4_k_m ``attn_output`` Q5_K;
    - a K-quant whose row (``cols``) is not a whole number of 256-blocks falls back to Q5_0/Q5_1/Q8_0,
      and to F16 if the row is not whole 32-blocks either.
    The layer index counts over all layers (every layer has attn_v and ffn_down here, as in llama.cpp for
    a model whose layers all have them). Falcon's fused attn_qkv and its own rules are not modelled.
    """
    base = GGUF_BASE[ftype]
    if kind in ("vector", "router", "pos_embedding"):
        return "F32"
    n = cfg.n_layers
    if kind == "lm_head":
        t = "Q8_0" if (base == "Q8_0" or cols % 256) else "Q6_K"
    else:
        t = base
        if ftype in ("q4_k_m", "q5_k_m") and use_more_bits(layer, n) and (
                (kind == "attention" and sub == "v_proj") or (kind in ("ffn", "expert") and sub == "down")):
            t = "Q6_K"
        if kind == "attention" and sub == "v_proj" and _is_70b(cfg) and t == "Q4_K":
            t = "Q5_K"
        experts = cfg.moe.n_experts if cfg.moe else 0
        if experts == 8 and kind == "attention":
            if sub in ("k_proj", "v_proj"):
                t = "Q8_0"
            elif sub == "o_proj" and ftype == "q4_k_m":
                t = "Q5_K"
    if cols % FORMATS[t].block:
        t = _K_FALLBACK.get(t, "F16")
        if cols % FORMATS[t].block:
            t = "F16"
    return t


def effective(cfg, quant: str | None) -> str | None:
    """The recipe that applies: the one given (``--quant``), else the checkpoint's own (``cfg.quant``)."""
    return quant or getattr(cfg, "quant", None)


def check_train(quant: str | None) -> None:
    """Raises: LmcostError if a recipe is asked for a training step (training reads its own precision)."""
    if quant:
        raise LmcostError("quant", "a training step with a quantization recipe is not modelled",
                          "drop `quant` (train takes `precision`, or `qlora` for 4-bit base weights)")


#: HF ``quantization_config`` -> recipe, by quant_method. Anything else is refused at load time.
#: quantization_config keys that say how a checkpoint was made or is run, not what it stores (AutoAWQ,
#: AutoGPTQ/GPTQModel, compressed fp8 and gpt-oss configs).
QC_NO_COST = {"quant_method", "version", "backend", "do_fuse", "fuse_max_seq_len", "exllama_config", "desc_act",
              "sym", "true_sequential", "damp_percent", "damp_auto_increment", "static_groups",
              "model_name_or_path", "model_file_base_name", "checkpoint_format", "meta", "use_exllama", "dataset",
              "tokenizer", "cache_block_outputs", "module_name_preceding_first_block", "batch_size",
              "pad_token_id", "use_cuda_fp16", "max_input_length", "activation_scheme", "fmt", "pack_dtype",
              "modules_in_block_to_quantize"}
#: Keys each recipe's arithmetic reads (the rest of a config is refused, never ignored).
QC_READ = {"bits", "group_size", "zero_point", "lm_head", "modules_to_not_convert", "ignored_layers",
           "weight_block_size", "weight_per_channel", "strategy"}


def from_hf(qc, source: str) -> str:
    """The recipe of a Hugging Face ``quantization_config``.

    awq/gptq with bits 4 and group_size 128 -> awq-g128/gptq-g128; fp8 with ``weight_block_size``
    [128, 128] -> fp8-block128, fp8 with ``weight_per_channel``/``strategy: channel`` -> fp8-channel, other
    fp8 -> fp8-tensor; mxfp4 -> mxfp4 (gpt-oss's modules_to_not_convert: everything but the experts).
    Keys that change what is stored and that no recipe holds are refused: modules kept in 16-bit
    (``modules_to_not_convert``/``ignored_layers``, except under mxfp4), GPTQ's quantized ``lm_head``,
    AWQ without zero-points; keys of QC_NO_COST are skipped. Raises: LmcostError naming
    ``quantization_config.<key>``.
    """
    where = f"{source}: quantization_config"
    supported = "supported: awq/gptq bits 4 group_size 128, fp8 (per tensor, channel, block [128, 128]), mxfp4"
    if not isinstance(qc, dict):
        raise LmcostError(where, f"must be a mapping, got {qc!r:.40}", supported)
    if qc.get("quant_method") not in ("awq", "gptq", "fp8", "mxfp4"):
        raise LmcostError(f"{where}.quant_method", f"quant_method {qc.get('quant_method')!r:.40} has no recipe",
                          f"{supported}; or write an lmcost YAML with quant: <recipe>")
    for key in qc:
        if key not in QC_NO_COST and key not in QC_READ:
            raise LmcostError(f"{where}.{key}", "not understood by lmcost's recipes",
                              "remove it if it does not change what the checkpoint stores, or write an lmcost "
                              "YAML with quant: <recipe>")
    method = qc.get("quant_method")
    if method != "mxfp4":
        for key in ("modules_to_not_convert", "ignored_layers"):
            if qc.get(key):
                raise LmcostError(f"{where}.{key}", f"modules kept unquantized ({qc[key]!r:.40}) are not in the "
                                  f"{method} recipe", "remove it, or write an lmcost YAML with quant: <recipe>")
    if qc.get("lm_head"):
        raise LmcostError(f"{where}.lm_head", "a quantized lm_head is not in the recipe (it keeps fp16)",
                          "set lm_head to false, or write an lmcost YAML with quant: <recipe>")
    if method == "awq" and qc.get("zero_point") is False:
        raise LmcostError(f"{where}.zero_point", "AWQ without zero-points is not in the recipe (it stores them)",
                          "set zero_point to true, or write an lmcost YAML with quant: <recipe>")
    if method in ("awq", "gptq"):
        for key, want in (("bits", 4), ("group_size", 128)):
            if qc.get(key) != want:
                raise LmcostError(f"{where}.{key}", f"{method} with {key} {qc.get(key)!r} has no recipe",
                                  f"{supported}; or write an lmcost YAML with quant: <recipe>")
        return f"{method}-g128"
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block is not None:
            if list(block) != [128, 128]:
                raise LmcostError(f"{where}.weight_block_size", f"fp8 blocks {block!r:.40} have no recipe",
                                  f"{supported}; or write an lmcost YAML with quant: <recipe>")
            return "fp8-block128"
        if qc.get("weight_per_channel") or qc.get("strategy") == "channel":
            return "fp8-channel"
        return "fp8-tensor"
    if method == "mxfp4":
        return "mxfp4"
    raise LmcostError(f"{where}.quant_method", f"quant_method {method!r:.40} has no recipe",
                      f"{supported}; or write an lmcost YAML with quant: <recipe>")
