"""xIELU, the FFN activation of Apertus with two learned scalars per layer (Huang et al. 2024, "Deriving
Activation Functions Using Integration", arXiv 2411.13010, eq. 7; transformers' ``XIELUActivation``).

    xielu(x) = a_p * x^2 + beta * x                              for x > 0
             = a_n * (expm1(min(x, eps)) - x) + beta * x          for x <= 0

with a_p = softplus(alpha_p) and a_n = beta + softplus(alpha_n): alpha_p and alpha_n are parameters ([1] each,
so 2 per layer), beta (0.5) and eps (-1e-6) are buffers.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.operators.ops import OpCost, elementwise

#: FLOPs per element of xIELU as transformers' ``_xielu_python`` computes it (both branches, then a select):
#: positive a_p * x * x + beta * x (3 multiplies, 1 add), negative (expm1(min(x, eps)) - x) * a_n + beta * x
#: (min, expm1, subtract, 2 multiplies, add), the comparison and the select: 4 + 6 + 2 = 12. The softplus of the
#: two scalars is per call, not per element, and is not counted.
XIELU_FLOPS = 12
#: Learned scalars per xIELU activation (alpha_p and alpha_n, [1] each).
XIELU_PARAMS = 2


def xielu(name: str, n_elements, B_w, B_a, shapes: str = "") -> OpCost:
    """xIELU over ``n_elements`` FFN inner elements: one kernel reading up [b,s,d_ff] and the 2 scalars, writing
    its output. Returns: XIELU_FLOPS per element, 2 params (weight bytes 2 * B_w)."""
    op = elementwise(name, n_elements, 1, XIELU_FLOPS, B_a, shapes=shapes or "xielu(up) [b,s,d_ff]")
    return replace(op, params=XIELU_PARAMS, weight_bytes=XIELU_PARAMS * B_w)
