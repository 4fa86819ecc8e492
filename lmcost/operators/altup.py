"""Operators of Gemma 3n's blocks: AltUp's K-copy residual stream and LAuReL's low-rank residual around a
sandwich-norm attention + FFN block, with per-layer inputs (schema: :class:`lmcost.model.layer_sharing.AltUp`).

Source: transformers 5.24 ``models/gemma3n/modeling_gemma3n.py``: Gemma3nTextAltUp (predict, correct,
scale_corrected_output), Gemma3nTextLaurelBlock, Gemma3nTextDecoderLayer.forward and Gemma3nTextModel.forward
(altup_projections, altup_unembed_projections); Baykal et al. 2023 ("Alternating Updates for Efficient
Transformers", section 3) and Menghani et al. 2024 ("LAuReL", section 2.2). n = b*s tokens, K copies,
2 FLOPs per MAC. Gemma3nTextMLP's activation sparsity (a Gaussian top-k of the gate on its first layers: a mean,
a standard deviation and a ReLU per gate element) is elementwise work not counted here.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ffn import dense_ffn_ops
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, add, elementwise, linear, norm
from lmcost.operators.per_layer import layer_attention_ops, per_layer_gate_ops

#: tanh, counted as a sigmoid (an exponential, an add and a divide).
TANH = FLOPS_PER_ELEMENT["sigmoid"]


def _router(x, K: int, step: str, owns: bool) -> list[OpCost]:
    """AltUp's router over the active copy [n,d] (compute_router_modalities): RMSNorm (weight [d]), / d,
    @ W [d,K], tanh -> [n,K]. The router runs in predict and in correct; its weights are owned once (``owns``)."""
    n = x.b * x.s
    ops = [norm(f"altup.{step}.router_norm", "rmsnorm", False, n, x.d, x.B_w, x.B_a),
           elementwise(f"altup.{step}.router_scale", n * x.d, 1, 1, x.B_a, shapes="[b,s,d] / d"),
           linear(f"altup.{step}.modality_router", n, x.d, K, x.B_w, x.B_a, shapes="[b,s,d] @ W_router [d,K]"),
           elementwise(f"altup.{step}.router_tanh", n * K, 1, TANH, x.B_a, shapes="tanh [b,s,K]")]
    return ops if owns else [replace(op, params=0) for op in ops]


def altup_block_ops(cfg, x, kind: str, moe: bool, kernel: str = "flash", mla_mode: str = "absorbed",
                    train: bool = False, ffn: str | None = None) -> list[OpCost]:
    """One Gemma 3n layer over the K copies [K,b,s,d] (Gemma3nTextDecoderLayer.forward).

    predict: the router (``altup.predict.*``), ``altup.prediction_coefs`` [n,K] @ [K,K^2] (K^3 params),
    ``altup.predict`` [b,s,d,K] @ [b,s,K,K] (2*n*d*K^2 FLOPs, a batched matmul), plus the copies.
    The active copy a: attn_norm, LAuReL (``laurel.left`` [d,r], ``laurel.right`` [r,d], ``laurel.norm``, its
    residual), attention (:func:`lmcost.operators.per_layer.layer_attention_ops`), attn_post_norm, a + attn,
    (that + LAuReL) / sqrt(2), then ffn_norm, FFN, ffn_post_norm, residual.
    correct: the router again (weights shared: 0 params), innovation = out - prediction[0],
    ``altup.correction_coefs`` [n,K] @ [K,K] (K^2 params), copies += innovation * (coefs + 1);
    ``altup.output_scale`` (d params, a multiply with correct_scale); the per-layer input
    (:func:`lmcost.operators.per_layer.per_layer_gate_ops`) is added to copies 1..K-1.
    ``moe`` and ``ffn``: as :func:`lmcost.operators.forward.block_ops` (Gemma 3n's are dense).
    """
    au, n, d = cfg.altup, x.b * x.s, x.d
    K = au.n_inputs

    def nrm(name):
        return norm(name, cfg.norm, cfg.norm_bias, n, d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]")

    predict_mm = OpCost("altup.predict", OpClass.GEMM, flops=2 * n * d * K * K,
                        act_read_bytes=n * K * (d + K) * x.B_a, act_write_bytes=n * K * d * x.B_a,
                        shapes="copies [b,s,d,K] @ coefs [b,s,K,K] -> [b,s,d,K]", matmul=True, mnk=(d, K, K))
    ops = _router(x, K, "predict", True) + [
        linear("altup.prediction_coefs", n, K, K * K, x.B_w, x.B_a, shapes="[b,s,K] @ W [K,K^2]"),
        predict_mm, add("altup.predict_residual", K * n * d, x.B_a, shapes="predictions + copies [K,b,s,d]"),
        nrm("attn_norm")]
    if au.laurel_rank is not None:
        r = au.laurel_rank
        ops += [linear("laurel.left", n, d, r, x.B_w, x.B_a, shapes="a [b,s,d] @ W_left [d,r]"),
                linear("laurel.right", n, r, d, x.B_w, x.B_a, shapes="[b,s,r] @ W_right [r,d]"),
                nrm("laurel.norm"), add("laurel.residual", n * d, x.B_a, shapes="a + RMSNorm(.) [b,s,d]")]
    ops += [*layer_attention_ops(cfg, x, kind, kernel, mla_mode, train), nrm("attn_post_norm"),
            add("attn_residual", n * d, x.B_a, shapes="x + f(x) [b,s,d]")]
    if au.laurel_rank is not None:
        ops.append(elementwise("laurel.combine", n * d, 2, 2, x.B_a, shapes="(h + laurel) [b,s,d] / sqrt(2)"))
    ops += [nrm("ffn_norm"), *dense_ffn_ops(cfg, x, n, x.d_ff), nrm("ffn_post_norm"),
            add("ffn_residual", n * d, x.B_a, shapes="x + f(x) [b,s,d]")]
    ops += _router(x, K, "correct", False) + [
        elementwise("altup.innovation", n * d, 2, 1, x.B_a, shapes="out - predictions[0] [b,s,d]"),
        linear("altup.correction_coefs", n, K, K, x.B_w, x.B_a, shapes="[b,s,K] @ W [K,K]"),
        elementwise("altup.correct", K * n * d, 3, 2, x.B_a, shapes="predictions + innovation * (coefs + 1) [K,b,s,d]"),
        replace(elementwise("altup.output_scale", n * d if au.correct_scale else 0, 1, 1, x.B_a,
                            shapes="corrected[0] [b,s,d] * scale [d]"), params=d, weight_bytes=d * x.B_w)]
    return ops + per_layer_gate_ops(cfg, x, K - 1)


def altup_input_ops(cfg, x) -> list[OpCost]:
    """The model's K-1 extra copies of the embedded tokens x0 (Gemma3nTextModel.forward): K-1 linears d -> d
    (``altup.project``: 2*n*d^2*(K-1) FLOPs, (K-1)*d^2 params), each rescaled to x0's RMS magnitude
    (``altup.in_magnitude``, 4 FLOPs per element: square, mean, sqrt, multiply-divide). None without altup."""
    if cfg.altup is None:
        return []
    n, d, K = x.b * x.s, x.d, cfg.altup.n_inputs
    return [linear("altup.project", n, d, (K - 1) * d, x.B_w, x.B_a, shapes="x0 [b,s,d] @ W_k [d,d], k = 1..K-1"),
            elementwise("altup.in_magnitude", K * n * d, 1, 4, x.B_a, shapes="copies [K,b,s,d] * |x0| / |copy|")]


def altup_output_ops(cfg, x) -> list[OpCost]:
    """After the last layer: copies 1..K-1 projected back (``altup.unembed``, K-1 linears d -> d), rescaled to
    copy 0's magnitude, and the K copies averaged (``altup.mean``) before the final norm. None without altup."""
    if cfg.altup is None:
        return []
    n, d, K = x.b * x.s, x.d, cfg.altup.n_inputs
    proj = linear("altup.unembed", n, d, (K - 1) * d, x.B_w, x.B_a, shapes="copies[k] [b,s,d] @ W_k [d,d], k = 1..K-1")
    return [replace(proj, act_read_bytes=(K - 1) * n * d * x.B_a),
            elementwise("altup.out_magnitude", K * n * d, 1, 4, x.B_a, shapes="copies [K,b,s,d] * |c0| / |copy|"),
            add("altup.mean", n * d, x.B_a, K, shapes="mean over K of [K,b,s,d] -> [b,s,d]")]
