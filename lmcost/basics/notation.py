"""The field's notation, and the few helpers that let one formula serve numbers and symbols alike.

Every cost formula in lmcost is plain arithmetic over dimensions. Called with ints it gives the exact
number; with numpy arrays, a whole grid at once; with sympy Symbols, the formula itself; with
:class:`lmcost.basics.tracing.Traced` workload dims, a record of it that compiles to one function. sympy is
imported only when symbols are asked for.

Legend (the names used in formulas, docstrings and ``lmcost explain``):

    b      batch: sequences processed together
    s      new tokens per sequence in this pass (prefill: the prompt; decode: 1)
    t      context per sequence after this pass: keys the last query attends to (t >= s)
    d      model width (d_model)
    h      query heads;  h_kv  key/value heads (h_kv = h: MHA; 1: MQA; else GQA);  d_h  head width
    d_ff   FFN inner width;  V  vocabulary;  L  layers
    w      sliding-window width of a local attention layer;  C  chunk of a chunked attention layer (Llama 4)
    d_c    MLA latent (kv_lora_rank);  d_q  MLA query latent (q_lora_rank);  d_r  decoupled RoPE width
    d_nope MLA per-head non-rotary query/key width;  d_v  MLA per-head value width
    E      routed experts;  k  experts per token;  d_e  expert FFN width;  d_sh  shared-expert FFN width
    r      rotary width per head (RoPE on a fraction of d_h)
    P      learned position table rows
    B_w, B_a, B_kv   bytes per element of weights, activations, KV cache
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmcost.basics.tracing import Traced


def is_symbolic(x: Any) -> bool:
    """True for a sympy expression (checked without importing sympy)."""
    return type(x).__module__.startswith("sympy")


def minimum(a, b):
    """min(a, b) for ints (exact), numpy arrays (elementwise) and sympy expressions (``Min``)."""
    if isinstance(a, Traced) or isinstance(b, Traced):
        return (a if isinstance(a, Traced) else b).tracer.call(minimum, a, b)
    if is_symbolic(a) or is_symbolic(b):
        import sympy

        return sympy.Min(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return min(a, b)


def half(x):
    """x / 2, exact for even ints and for symbols (``Rational``), float for arrays."""
    if isinstance(x, Traced):
        return x.tracer.call(half, x)
    if isinstance(x, int) and not isinstance(x, bool) and x % 2 == 0:
        return x // 2
    return x / 2


def symbols(names: str) -> tuple:
    """sympy Symbols (positive integers) for the space-separated ``names``."""
    import sympy

    return sympy.symbols(names, positive=True, integer=True)
