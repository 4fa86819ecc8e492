"""Attention variants of one model: the same architecture with MHA, GQA, MQA or MLA attention.

A variant changes only the attention, so a comparison holds everything else fixed:
- ``mha``, ``gqa:K``, ``mqa``: h_kv = h, K, 1; h and d_h are kept (Ainslie et al. 2023, GQA).
- ``mla:D`` or ``mla:D:R``: multi-head latent attention with latent width d_c = D and a decoupled
  RoPE key of width R (default 64); per-head query/key and value widths stay d_h (DeepSeek-V2,
  section 2.1: d_h = 128, d_c = 512, d_h^R = 64).
- ``base``: the model as given.
From an MLA model, mha/gqa/mqa use heads of width qk_nope_head_dim + qk_rope_head_dim.
A sliding window and a local:global pattern can be applied on top of every variant.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from lmcost.model.config import ArchConfig
from lmcost.basics.errors import LmcostError, from_validation_error


@dataclass(frozen=True)
class Variant:
    """A named attention variant of a base model (``label`` as the user wrote it)."""

    label: str
    cfg: ArchConfig


def _kind(label: str):
    parts = label.strip().lower().split(":")
    head, args = parts[0], parts[1:]
    try:
        nums = [int(a) for a in args]
    except ValueError:
        raise LmcostError("labels", f"{label!r} has a non-integer width", "write e.g. gqa:8 or mla:512:64") from None
    if head in ("base", "mha", "mqa") and not nums:
        return head, nums
    if head == "gqa" and len(nums) == 1 and nums[0] > 0:
        return head, nums
    if head == "mla" and len(nums) in (1, 2) and all(n > 0 for n in nums):
        return head, nums
    raise LmcostError("labels", f"unknown variant {label!r}",
                      "use base, mha, mqa, gqa:K (K KV heads) or mla:D[:R] (latent D, RoPE key R)")


def derive(cfg: ArchConfig, label: str) -> Variant:
    """The variant ``label`` of ``cfg``.

    Raises: LmcostError for an unknown label, K KV heads that do not divide h, or a model without attention.
    """
    kind, nums = _kind(label)
    if kind == "base":
        return Variant(label, cfg)
    if cfg.attention_kind == "none":  # Mamba, RWKV, xLSTM: no attention layer for a variant to change
        raise LmcostError("labels", f"{label}: {cfg.name} has no attention layers, so no attention variant applies",
                          "compare variants of a model with attention, or ask for the base model alone")
    data = cfg.model_dump()
    a = data["attention"]
    mla = cfg.attention.mla
    d_h = mla.qk_nope_head_dim + mla.qk_rope_head_dim if mla else cfg.d_h
    h = cfg.attention.n_heads
    if kind in ("mha", "mqa", "gqa"):
        h_kv = {"mha": h, "mqa": 1}.get(kind) or nums[0]
        if h % h_kv:
            raise LmcostError("labels", f"{label}: {h_kv} KV heads do not divide {h} query heads",
                              f"use gqa:K with K a divisor of {h}")
        a.update(n_kv_heads=h_kv, head_dim=d_h, mla=None)
    else:
        d_r = nums[1] if len(nums) > 1 else 64
        if mla:
            a["mla"] = {**mla.model_dump(), "kv_lora_rank": nums[0], "qk_rope_head_dim": d_r}
        else:
            a["mla"] = dict(q_lora_rank=None, kv_lora_rank=nums[0], qk_nope_head_dim=d_h,
                            qk_rope_head_dim=d_r, v_head_dim=d_h)
        a.update(n_kv_heads=None)
    data["name"] = f"{cfg.name} [{label}]"
    try:
        return Variant(label, ArchConfig.model_validate(data))
    except ValidationError as e:
        raise from_validation_error(e, f"labels {label}") from None


def with_window(cfg: ArchConfig, window: int | None, local_global: str | None) -> ArchConfig:
    """``cfg`` with a sliding window of ``window`` tokens and/or a ``L:G`` local:global pattern
    (``3:1``: three local layers then one global, repeated). A pattern alone needs a window in cfg.

    Raises: LmcostError for a malformed pattern, a pattern with no local layer or no window to apply, or a hybrid stack
    (``cfg.recurrent``: its pattern names every layer's mixer).
    """
    if window is None and local_global is None:
        return cfg
    if cfg.recurrent is not None:  # a hybrid stack's layer kinds are recurrent.layer_pattern's
        field = "window" if window is not None else "local_global"
        raise LmcostError(field, f"{cfg.name} is a hybrid stack: its layer kinds come from recurrent.layer_pattern",
                          "write local layers into recurrent.layer_pattern of an lmcost YAML")
    data = cfg.model_dump()
    a = data["attention"]
    if window is not None:
        if window < 1:
            raise LmcostError("window", f"must be >= 1, got {window}", "give the window in tokens")
        a["sliding_window"] = window
        a["layer_pattern"] = None
    if local_global is not None:
        try:
            n_local, n_global = (int(v) for v in local_global.split(":"))
        except ValueError:
            raise LmcostError("local_global", f"{local_global!r} is not L:G", "write e.g. 3:1") from None
        if n_local < 0 or n_global < 0 or n_local + n_global == 0:
            raise LmcostError("local_global", f"{local_global!r} has no layers", "write e.g. 3:1")
        if n_local == 0:  # every layer global: the window applies to none
            raise LmcostError("local_global", f"{local_global!r} has no local layer, so no layer uses the window",
                              "give L >= 1 (e.g. 3:1), or drop `local_global` and `window` for full attention")
        if n_local + n_global > cfg.n_layers:
            raise LmcostError("local_global", f"a period of {n_local + n_global} layers is longer than "
                              f"{cfg.name}'s {cfg.n_layers}", f"keep L + G <= {cfg.n_layers}, e.g. 3:1")
        if a["sliding_window"] is None:
            raise LmcostError("local_global", f"{cfg.name} has no sliding window", "add `window` W")
        a["layer_pattern"] = ["local"] * n_local + ["global"] * n_global
    return ArchConfig.model_validate(data)


def default_labels(cfg: ArchConfig) -> list[str]:
    """base, mha, gqa:8 (where 8 divides h and differs from both), mqa, mla:512, each unless the model's attention
    has what the variant is not modelled with (MLA: qk-norm, sinks, soft-capping, chunked or NoPE layers; MQA:
    differential attention, which splits the KV heads in two); ask for it with --variants to see why."""
    h = cfg.attention.n_heads
    labels = ["base", "mha"] + (["gqa:8"] if h % 8 == 0 and h > 8 else []) + ["mqa", "mla:512"]
    for label in labels[1:]:
        try:
            derive(cfg, label)
        except LmcostError:
            labels.remove(label)
    return labels


def parse_labels(spec: str | None, cfg: ArchConfig) -> list[str]:
    """Comma-separated variant labels; None (the option not given) gives :func:`default_labels`.

    Raises: LmcostError for a spec with no label in it ("" or ",")."""
    if spec is None:
        return default_labels(cfg)
    parts = [s.strip() for s in spec.split(",")]
    if any(not p for p in parts) and any(parts):
        raise LmcostError("labels", f"{spec!r} has an empty item", "separate the variants with single commas")
    labels = list(dict.fromkeys(p for p in parts if p))  # in order, once each
    if not labels:
        raise LmcostError("labels", "empty", "give e.g. mha,gqa:8,mqa,mla:512")
    return labels
