"""Which SDPA backend a measured run uses, chosen once and pinned, so that it cannot silently fall back.

``torch.nn.functional.scaled_dot_product_attention`` picks a backend per call (flash, memory-efficient,
cuDNN, math) and falls back quietly when the preferred one cannot take the inputs: on CPU the
flash kernel needs equal query/key and value head dims, so an MLA call with d_qk != d_v runs the
math backend, which computes all s x t scores and repeats K/V per query head. A run whose backend
changes under it measures a different kernel than the one it reports. So the decoder asks
:func:`sdpa_backend` once per attention shape, records the name, and runs every call inside
``torch.nn.attention.sdpa_kernel([that backend])``: a call the pinned backend cannot run raises
``RuntimeError: No available kernel`` instead of falling back.

Preference (the first backend that runs the shape, found by one tiny call of that shape on the device):

- CPU: ``flash_attention`` (``_scaled_dot_product_flash_attention_for_cpu``: causal pairs only,
  GQA without copying K/V, boolean masks; torch 2.13 needs d_qk = d_v), else ``math``.
- CUDA: ``flash_attention`` (fp16/bf16; is_causal but no explicit mask), ``efficient_attention``
  (masks, fp32 too), ``cudnn_attention``, then ``math``: torch's own default order.

The three call variants of a decoder differ in what the backends accept, so each is probed:
``causal`` (is_causal, s = t: a prefill from position 0), ``masked`` (a boolean mask [s, t]: a chunk
over a cache, a sliding window) and ``full`` (no mask: a decode step, bidirectional attention).
"""

from __future__ import annotations

import re
import warnings
from functools import partial
from typing import Callable, ContextManager

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

#: lmcost name -> torch backend.
BACKENDS = {
    "flash_attention": SDPBackend.FLASH_ATTENTION,
    "efficient_attention": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn_attention": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}

#: lmcost name -> the ATen op the backend runs as (what a profiler trace shows inside ``attn.sdpa``).
ATEN_OPS = {
    ("cpu", "flash_attention"): "aten::_scaled_dot_product_flash_attention_for_cpu",
    ("cuda", "flash_attention"): "aten::_scaled_dot_product_flash_attention",
    ("cuda", "efficient_attention"): "aten::_scaled_dot_product_efficient_attention",
    ("cuda", "cudnn_attention"): "aten::_scaled_dot_product_cudnn_attention",
    ("cpu", "math"): "aten::_scaled_dot_product_attention_math",
    ("cuda", "math"): "aten::_scaled_dot_product_attention_math",
}

#: The call variants a decoder makes (see the module docstring).
VARIANTS = ("causal", "masked", "full")

#: The name recorded when attention runs as explicit matmuls, with no SDPA call at all.
EXPLICIT = "explicit"


def preferred(device: str) -> list[str]:
    """Backend names in the order tried on ``device`` (``cpu``, ``cuda``, ``cuda:N``)."""
    if str(device).startswith("cuda"):
        return ["flash_attention", "efficient_attention", "cudnn_attention", "math"]
    return ["flash_attention", "math"]


def _probe(name: str, device, dtype, heads: int, kv_heads: int, d_qk: int, d_v: int, variant: str) -> str:
    """Run one tiny SDPA call of this shape pinned to ``name``; returns '' if it ran, else why not."""
    s, t = (1, 3) if variant == "full" else (2, 2) if variant == "causal" else (2, 3)
    # Token-major tensors viewed head-major, as the decoder passes its cache (strides included).
    q = torch.randn(1, s, heads, d_qk, device=device).to(dtype).transpose(1, 2)
    k = torch.randn(1, t, kv_heads, d_qk, device=device).to(dtype).transpose(1, 2)
    v = torch.randn(1, t, kv_heads, d_v, device=device).to(dtype).transpose(1, 2)
    mask = torch.ones(s, t, dtype=torch.bool, device=device).tril(t - s) if variant == "masked" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([BACKENDS[name]]), torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=variant == "causal",
                                               enable_gqa=kv_heads != heads)
            return ""
        except RuntimeError as e:
            # torch warns why each kernel was not used: keep the reasons, less its source locations
            why = [re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(w.message)).strip() for w in caught]
            why = [w for w in why if w and not w.endswith("because:")] or [str(e).splitlines()[0]]
            return "; ".join(dict.fromkeys(why))


def sdpa_backend(device, dtype, *, heads: int, kv_heads: int, d_qk: int, d_v: int, variant: str = "causal",
                 prefer: str | None = None) -> tuple[str, Callable[[], ContextManager]]:
    """The SDPA backend that runs attention of this shape on ``device``, and a way to pin it.

    Shapes: q [b, heads, s, d_qk], k [b, kv_heads, t, d_qk], v [b, kv_heads, t, d_v] (GQA when
    kv_heads < heads, passed with ``enable_gqa``); ``variant`` one of :data:`VARIANTS`.
    Args: ``prefer`` a name of :data:`BACKENDS` to insist on (None: the first of :func:`preferred`
    that runs the shape).
    Returns: (name, pin): ``pin()`` returns a fresh ``sdpa_kernel([backend])`` context (a
    contextmanager runs once, so each ``with`` needs its own); inside it a call the backend cannot
    run raises ``RuntimeError`` instead of falling back.
    Raises: ValueError if ``prefer`` is unknown or cannot run the shape here (with torch's reason),
    or if no backend can.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: use one of {', '.join(VARIANTS)}")
    if prefer is not None and prefer not in BACKENDS:
        raise ValueError(f"SDPA backend {prefer!r} is unknown: use one of {', '.join(BACKENDS)}")
    shape = f"{variant} attention, {heads}/{kv_heads} heads, d_qk {d_qk}, d_v {d_v}, {dtype} on {device}"
    reasons = {}
    for name in [prefer] if prefer else preferred(device):
        why = _probe(name, device, dtype, heads, kv_heads, d_qk, d_v, variant)
        if not why:
            return name, partial(sdpa_kernel, [BACKENDS[name]])
        reasons[name] = why
    if prefer:
        raise ValueError(f"SDPA backend {prefer} cannot run {shape}: {reasons[prefer]}")
    raise ValueError(f"no SDPA backend runs {shape}: " + "; ".join(f"{n}: {w}" for n, w in reasons.items()))
