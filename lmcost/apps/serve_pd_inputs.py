"""The checks of a serving request's prefill/decode disaggregation fields (:mod:`lmcost.apps.serve_pd`), before
anything is loaded: the pools' sizes and degrees in range, a known KV link, and nothing P/D-only without
``pd``. Called by :func:`lmcost.apps.serve_inputs.check_request`."""

from __future__ import annotations

from lmcost.basics.errors import LmcostError


def whole_within(value, field: str, high: int, what: str) -> None:
    """Raises: LmcostError (``field``) unless ``value`` is a whole number (not a bool) from 1 to ``high``;
    the fix says to give ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise LmcostError(field, f"{value!r:.40} is not a whole number from 1 to {high:,}", f"give {what}")


#: How the KV cache moves: auto (NVLink inside one node or NVLink domain, else RDMA), nvlink, rdma, or none
#: (free: a bound, and the metamorphic tests' case).
KV_LINKS = ("auto", "nvlink", "rdma", "none")
#: The request's P/D fields (each None unless ``pd``).
PD_FIELDS = ("prefill_workers", "prefill_tp", "prefill_ep", "prefill_dp", "prefill_max_num_batched_tokens",
             "decode_workers", "kv_link", "prefill_max_num_seqs")
#: Bounds of the pools' sizes and degrees (the aggregated layout's degrees are bounded by its own checks).
MAX_WORKERS = 4096


def check_pd(r) -> None:
    """Refuse P/D fields that are out of range or mean nothing. Raises: LmcostError naming the field: one of
    :data:`PD_FIELDS` given without ``pd``; a worker count or degree not a whole number from 1 to
    :data:`MAX_WORKERS` (``prefill_max_num_seqs`` too); ``prefill_max_num_batched_tokens`` not from 1 to 2^31;
    ``kv_link`` not one of :data:`KV_LINKS`; ``nodes`` beside ``pd`` (each pool is placed from its workers)."""
    if not getattr(r, "pd", False):  # (a serve plan's request has none of these fields)
        for name in PD_FIELDS:
            if getattr(r, name, None) is not None:
                raise LmcostError(name, "has no effect without `pd` (prefill/decode disaggregation)",
                                  "add `pd`, or drop it")
        return
    for name in ("prefill_workers", "prefill_tp", "prefill_ep", "prefill_dp", "decode_workers", "prefill_max_num_seqs"):
        if getattr(r, name, None) is not None:
            whole_within(getattr(r, name), name, MAX_WORKERS, "a whole number, e.g. 1, 2, 4 or 8")
    if r.prefill_max_num_batched_tokens is not None:
        whole_within(r.prefill_max_num_batched_tokens, "prefill_max_num_batched_tokens", 2**31,
                      "tokens per prefill step, e.g. 16384")
    if r.kv_link is not None and r.kv_link not in KV_LINKS:
        raise LmcostError("kv_link", f"unknown link {r.kv_link!r:.40}", f"use one of {', '.join(KV_LINKS)}")
    if r.nodes is not None:
        raise LmcostError("nodes", "has no effect with `pd`: each pool is placed from its workers, the link from "
                          "whether both fit one node (`kv_link`)", "drop `nodes`, or name the link with `kv_link`")
