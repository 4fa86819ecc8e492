"""Variants of the mixture-of-experts block: zero-computation experts, the shortcut MoE beside a dense FFN, and a
norm on the MoE block's output.

- Zero-computation experts (LongCat-Flash, arXiv 2509.01322, section 2.1; transformers ``LongcatFlashExperts``):
  the router scores E FFN experts and Z identity experts, [b,s,d] @ W_router [d,E+Z], and each token takes its
  top k of the E+Z. A pick of an identity expert returns the token unchanged (times its routing weight, inside
  ``moe.combine``): no matmul. Which experts a token picks depends on the data, so lmcost counts the
  expectation under uniform routing, k*E/(E+Z) FFN experts per token (LongCat-Flash's router is trained,
  with its expert bias, to keep the mean near a target; 12 * 512/768 = 8 of its 12 picks are FFN experts).
- Shortcut MoE (LongCat-Flash, section 2.2, "ScMoE"; transformers ``LongcatFlashDecoderLayer``): the MoE reads
  the same normed input as the layer's dense FFN and runs beside it; its output joins the residual stream
  one sublayer later, an add of [b,s,d] (``moe.shortcut_residual``).
- Post-MoE norm (A.X-K1; transformers ``AXK1MoE.post_mlp_layernorm``): RMSNorm [d] over the MoE block's
  output (routed + shared experts) before the residual add, on MoE layers only.
- Output bias (JetMoE; transformers ``JetMoeMoE.bias``): one bias [d] added to the combined output.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ffn import dense_ffn_ops, moe_ops
from lmcost.operators.ops import OpCost, add, elementwise, norm


def moe_layer_ops(cfg, x) -> list[OpCost]:
    """The FFN sublayer of a MoE layer from its normed input [b,s,d] to the output its residual adds.

    :func:`lmcost.operators.ffn.moe_ops`; with ``moe.output_bias`` then ``moe.output_bias`` (d params, 1 FLOP per
    element of [b,s,d]); with ``moe.post_norm`` then ``moe.post_norm`` (RMSNorm over
    [b,s,d], d weights, 4 FLOPs per element); with ``moe.shortcut`` the dense FFN of width d_ff first
    (:func:`lmcost.operators.ffn.dense_ffn_ops`, on the same input) and ``moe.shortcut_residual`` (1 FLOP per
    element of [b,s,d], reading two inputs), the MoE output's add into the residual stream.
    """
    m, n = cfg.moe, x.b * x.s
    ops = moe_ops(cfg, x)
    if m.output_bias:  # JetMoE: one bias [d] on the combined output, an add per element
        ops.append(replace(elementwise("moe.output_bias", n * x.d, 1, 1, x.B_a, shapes="y [b,s,d] + bias [d]",
                                       kind="add"), params=x.d, weight_bytes=x.d * x.B_w))
    if m.post_norm:
        ops.append(norm("moe.post_norm", "rmsnorm", False, n, x.d, x.B_w, x.B_a, shapes="[b,s,d] -> [b,s,d]"))
    if m.shortcut:
        ops = dense_ffn_ops(cfg, x, n, x.d_ff) + ops + [
            add("moe.shortcut_residual", n * x.d, x.B_a, 2, shapes="x + moe(x) [b,s,d], one sublayer later")]
    return ops
