"""Device memory of a run: weights + KV cache + activations, and the capacity searches built on it.

The activation peak of a pass is the largest input + output of one of its operators plus the
residual stream [b, s, d] kept alive beside it: buffers of one operator are freed before the next
(an estimate of what an eager framework holds, not of its allocator's fragmentation).
"""

from __future__ import annotations

from .dtypes import Precision
from .errors import LmcostError
from .kvcache import kv_bytes
from .ops import OpCost
from .params import param_counts


def footprint(cfg, precision: Precision, *, batch: int, context: int, tokens: int, ops: list[OpCost] | None = None,
              act_bytes=None, block_size: int | None = None) -> dict:
    """Bytes of weights, of the KV cache of ``batch`` sequences at ``context`` (paged in blocks of
    ``block_size`` tokens if given), and of the activations of a pass over ``tokens`` new tokens per
    sequence: the ops of that pass (``ops``), or each op's activation bytes read + written (``act_bytes``),
    and their total.
    """
    if act_bytes is None:
        act_bytes = [op.act_read_bytes + op.act_write_bytes for op in ops]
    weights = param_counts(cfg, precision)["total"] * precision.B_w
    kv = kv_bytes(cfg, precision, batch, context, block_size)
    acts = max(act_bytes) + batch * tokens * cfg.d_model * precision.B_a
    return dict(weights_bytes=weights, kv_cache_bytes=kv, activations_bytes=acts, total_bytes=weights + kv + acts)


def largest(fits, limit: int) -> int:
    """The largest n in [0, limit] with fits(n), for a ``fits`` that is true up to some n and false after
    (fits(0) is taken as true). Exponential then binary search: O(log limit) calls."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)  # fits(lo) is true; fits(hi) false, or hi is past the limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def check_block(block_size: int | None) -> None:
    """Raises: LmcostError unless block_size is None or a whole number of tokens from 1 to 2^31 (the
    longest context lmcost takes: a block past it holds no real cache)."""
    if block_size is not None and not 1 <= block_size <= 2**31:
        raise LmcostError("--block-size", f"must be from 1 to {2**31:,}, got {block_size}",
                          "give tokens per block, e.g. 16")
