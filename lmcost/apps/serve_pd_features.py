"""The other features of ``lmcost serve`` under prefill/decode disaggregation (``pd``,
:mod:`lmcost.apps.serve_pd`): the pool each runs on, and its JSON key in the run's summary.

- Prefix caching and KV offload (:mod:`lmcost.apps.serve_prefix`; ``prefix``, ``prefix_caching``,
  ``kv_offload``) run on the **prefill pool**, as SGLang's PD mode keeps its radix cache on the prefill server
  and vLLM's P/D keeps automatic prefix caching on the prefill instance: each prefill replica keeps the cache
  of the requests it is given (round robin, not cache-aware routing: a session's turns reach the same replica
  only when the sessions' count is a multiple of the replicas), a hit shortens the prefill, and the KV
  transferred is still the whole prompt's (the decode worker holds no copy of it). A chat's next turn hits
  the last turn's prompt, not its output (the output's KV was made on the decode pool). The decode pool keeps
  no prefix cache (its requests arrive prefilled). ``prefix_cache``: the prefill pool's caches, counts summed
  over its replicas, peaks the largest replica's (one GPU).
- Speculative decoding (:mod:`lmcost.apps.serve_spec`) on **both pools**: the decode pool drafts and verifies
  (k + 1 rows per sequence); the prefill pool runs the prompt through the drafter too and holds its KV (its
  step model is the speculative one: :meth:`lmcost.cost.spec_decode.SpecStepModel.step_s`'s prefill). ``spec``:
  the decode pool's figures. The KV transfer (``bytes_per_request`` and the per-GPU piece) counts the
  drafter's KV with the target's.
- Wide EP (:mod:`lmcost.apps.serve_wide_ep`; ``a2a``, ``expert_load``, ``redundant_experts``, ``tbo``) is the
  **decode pool's**, as ``tp``/``ep``/``dp`` are: the prefill pool runs NCCL's all-to-all, no TBO, no
  redundant experts, its imbalance ``imbalance`` (SGLang's DeepSeek deployment runs DeepEP's normal kernels on
  prefill and its low-latency kernels on decode: one kernel cannot name both). ``wide_ep`` carries
  ``pool: "decode"``.
- Energy and cost count every replica of both pools (:func:`lmcost.apps.serve_pd.run_pd`).
"""

from __future__ import annotations

import numpy as np

#: The prefill pool's wide-EP fields: off (wide EP is the decode pool's).
PREFILL_WIDE_EP_OFF = dict(a2a="nccl", expert_load=None, redundant_experts=0, tbo=False)


def prefill_cache(setup, prefix, sl: slice):
    """The prefix cache of the prefill replica given requests ``sl`` (:class:`lmcost.apps.serve_prefix.PrefixCache`
    over ``prefix`` = (ids, tokens) arrays [n] in the pool's order), None when the workload names no prefixes or
    caching is off."""
    if prefix is None or not setup.prefix_caching:
        return None
    from lmcost.apps.serve_prefix import PrefixCache

    ids, tokens = prefix
    return PrefixCache(ids[sl], tokens[sl], setup.knobs.block_size, setup.kv_per_token_bytes, setup.kv_offload)


def _merged(parts: list, caches: list) -> dict:
    """One ``prefix_cache`` block from each replica's (:func:`lmcost.apps.serve_prefix.summary` at scale 1):
    counts summed, peaks the largest, the hit rate over every replica's admissions."""
    out = dict(parts[0])
    for key in ("hit_tokens", "saved_prefill_flops", "evictions"):
        out[key] = type(parts[0][key])(sum(p[key] for p in parts))
    out["peak_cached_bytes"] = max(p["peak_cached_bytes"] for p in parts)
    asked = sum(c.asked for c in caches)
    out["hit_rate"] = sum(c.hit_tokens for c in caches) / asked if asked else 0.0
    if "offload" in out:
        off = dict(out["offload"])
        for key in ("hit_tokens", "bytes_loaded", "bytes_offloaded", "load_s", "evictions"):
            off[key] = type(off[key])(sum(p["offload"][key] for p in parts))
        off["peak_bytes"] = max(p["offload"]["peak_bytes"] for p in parts)
        for name in off.get("tiers", ()):  # the tiers of serve_offload: each tier's counts the same way
            rows = [p["offload"]["tiers"][name] for p in parts]
            off["tiers"] = {**off["tiers"], name: {**rows[0], **{k: type(rows[0][k])(sum(r[k] for r in rows)) for k in
                            ("hit_tokens", "bytes_loaded", "load_s", "evictions")},
                            "peak_bytes": max(r["peak_bytes"] for r in rows)}}
        out["offload"] = off
    return out


def pd_feature_keys(p, run, tr, has_prefix: bool) -> dict:
    """The run summary's keys of the features on beside P/D (module docstring): ``prefix_cache`` (when the
    workload names prefixes), ``spec`` (speculative decoding on), ``wide_ep`` (wide-EP options on). ``p``:
    :class:`lmcost.apps.serve_pd.Pools`; ``run``: its :class:`lmcost.apps.serve_pd.PdRun`; ``tr``: the run's
    trace (the decode pool's ITL segments)."""
    out: dict = {}
    if has_prefix:
        from lmcost.apps.serve_prefix import summary

        caches = [c for c in run.caches if c is not None]
        out["prefix_cache"] = (_merged([summary(c, p.prefill, scale=1.0) for c in caches], caches) if caches
                               else summary(None, p.prefill, scale=1.0))
        out["prefix_cache"]["pool"] = "prefill"
    if hasattr(p.decode.step, "tokens_per_step"):
        from lmcost.apps.serve_spec import spec_summary

        out["spec"] = spec_summary(p.decode, tr) | {"pool": "decode"}
    if p.decode.wide_ep is not None:
        from lmcost.apps.serve_wide_ep import summary

        steps = sum(t.steps for t in run.decode_traces)
        out["wide_ep"] = summary(p.decode.wide_ep, float(np.sum(tr.output)) / max(steps, 1)) | {"pool": "decode"}
    return out
