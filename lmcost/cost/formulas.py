"""The cost formulas in the field's notation: the same operator code evaluated with sympy Symbols.

Used by ``lmcost explain`` and ``estimate --detail``. sympy is imported here, never on the numeric path.
"""

from __future__ import annotations

from dataclasses import replace

from lmcost.basics.dtypes import Precision
from lmcost.operators.fusion import PRESETS, apply_fusion
from lmcost.operators.forward import Dims, forward_ops
from lmcost.operators.ops import OpCost

CONVENTIONS = """\
- FLOPs: 2 per multiply-accumulate. Bytes: every operator reads its inputs from and writes its outputs
  to device memory (no fusion across the operators listed: --fuse says which operators run as one
  kernel; by default only a gated activation and its multiply); weights, activations and KV cache apart.
- Prefill: b sequences of s new tokens, t = s. Decode step: s = 1 new token at context t (t includes it).
- Flash attention computes only the causal pairs, s*t - s*(s-1)/2 (about half of s*t in prefill), and
  writes no score matrix; naive attention computes all s*t scores and writes/reads the [b,h,s,t] matrix.
- GQA/MQA: K/V reads are b*t*h_kv*d_h each; each KV head serves h/h_kv query heads, in the kernel as in
  the cache. Local (sliding-window) layers read min(t, s+w-1) keys and cache min(t, w) tokens.
- MLA (DeepSeek-V2 section 2.1): absorbed attends over the cached latent (d_c + d_r per token); naive
  up-projects the latent of all t keys to per-head K, V in every pass.
- MoE: routed experts run k*b*s token-expert pairs; weight reads are those of the experts touched,
  E*(1-(1-k/E)^(b*s)) expected under uniform routing.
- lm_head runs on all b*s tokens: 2*b*s*d*V FLOPs (--logits last: on b tokens, as serving engines do).
- MLA: --mla auto (default) runs naive in prefill and absorbed in decode, as DeepSeek's inference does.
- Roofline time per op = max(FLOPs / peak, bytes / bandwidth); matmuls at the tensor-core peak of the
  activation dtype, other ops at the vector (fp32) peak. The sum of the two terms is the roofline with no
  overlap (--json: time_upper_s): a bound on the roofline time, not on the calibrated time.
- --model calibrated: the expected time under the GPU's efficiency model (achieved fractions of peak and
  bandwidth, GEMM tile and wave quantization, a fixed time per kernel); see lmcost gpus show.
"""


def symbolic_ops(cfg, phase: str, precision: Precision | None = Precision(), kernel: str = "flash",
                 mla_mode: str = "absorbed", logits: str = "all", fusion=PRESETS["default"]) -> list[OpCost]:
    """Every operator of ``phase`` with sympy expressions for FLOPs and bytes, ``fusion`` applied.

    Byte widths are numbers from ``precision``, or Symbols B_w, B_a, B_kv if it is None.
    Prefill substitutes t = s; decode s = 1.
    """
    x = Dims.symbolic(precision)
    x = replace(x, t=x.s) if phase == "prefill" else replace(x, s=1)
    return apply_fusion(forward_ops(cfg, x, kernel, mla_mode, logits), fusion, kernel)


def show(expr) -> str:
    """A formula as text with common factors pulled out: ``2*b*d*d_h*h*s``."""
    import sympy

    if isinstance(expr, (int, float)):
        return str(expr)
    return str(sympy.factor_terms(expr))
