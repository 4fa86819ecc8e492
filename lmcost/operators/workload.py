"""What runs and how: the workload (batch, prompt, generated tokens), the kernel settings, and the
checks every entry point applies to them before anything is costed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.operators.fusion import FUSIONS, PRESETS
from lmcost.operators.forward import KERNELS, LOGITS, MLA_MODES
from lmcost.operators.parallel import Layout
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.hardware.gpu import GPU
from lmcost.model.quant import recipe

#: The two time models (:mod:`lmcost.cost.timing` evaluates them): the roofline (a lower bound) and the
#: calibrated expectation.
TIME_MODELS = ("roofline", "calibrated")

#: Largest batch or token count accepted: beyond it float64 sweeps lose integer exactness and the
#: per-step TPOT evaluation stops being cheap; no real workload comes near.
MAX_COUNT = 2**31
#: Generated tokens: TPOT evaluates every decode step (in chunks), so keep that to seconds.
MAX_GEN = 2**24


def check_count(name: str, v, limit: int = MAX_COUNT) -> None:
    """Raises: LmcostError unless v is a whole number in [1, limit]."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= limit:
        raise LmcostError(name, f"must be a whole number from 1 to {limit:,}, got {v!r}",
                          f"pass `{name}` in that range")


def past_trained_context(cfg: ArchConfig, tokens: int) -> str | None:
    """A warning line if ``tokens`` exceeds the context a RoPE (or position-free) model was trained
    for (its max_position_embeddings), else None. Learned tables refuse instead (check_positions)."""
    if cfg.positions != "learned" and cfg.max_positions and tokens > cfg.max_positions:
        return (f"note: context {tokens:,} is past the {cfg.max_positions:,} positions {cfg.name} was trained for "
                "(its config's trained context): the costs hold, the model's outputs may not")
    return None


def check_positions(cfg: ArchConfig, tokens: int, field: str, what: str | None = None) -> None:
    """Raises: LmcostError naming ``field`` if ``tokens`` positions (``what``, default the number)
    exceed the learned position table of ``cfg``. A model with RoPE or no positions has no limit."""
    if cfg.positions == "learned" and tokens > cfg.max_positions:
        raise LmcostError(field, f"{what or tokens} exceeds the {cfg.max_positions} learned positions of {cfg.name}",
                          f"keep `{field}` <= {cfg.max_positions}")


@dataclass(frozen=True)
class Workload:
    """What runs: ``batch`` concurrent sequences, ``prompt`` tokens each, then ``gen`` generated tokens.

    Raises: LmcostError if a value is below 1.
    """

    batch: int = 1
    prompt: int = 512
    gen: int = 256

    def __post_init__(self):
        for name in ("batch", "prompt", "gen"):
            check_count(name, getattr(self, name), MAX_GEN if name == "gen" else MAX_COUNT)

    @property
    def context(self) -> int:
        """Final context per sequence: prompt + gen."""
        return self.prompt + self.gen


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How kernels run (keyword-only: ``Settings(kernel="naive", layout=Layout(tp=8))``).

    ``kernel``: flash|naive attention. ``mla``: absorbed|naive MLA, or auto: naive in prefill and
    absorbed in decode, as DeepSeek's and vLLM's inference do (the cheaper way for each phase).
    ``logits``: all|last, which tokens the lm_head runs on.
    ``model``: roofline|calibrated, how an op's time is predicted (:mod:`lmcost.cost.efficiency`).
    ``fusion``: which operators run fused (:mod:`lmcost.operators.fusion`); by default the gated activation
    and its multiply only. Fusion applies to prefill and decode (a training step runs unfused ops).
    ``layout``: how the model is split over GPUs (:class:`lmcost.operators.parallel.Layout`); the phases are then
    one GPU's work and communication (a training step stays one GPU's: issue 16).
    ``quant``: a quantization recipe (:mod:`lmcost.operators.quant`) the weights are stored in, over the config's
    own (``cfg.quant``); None: the config's own, else every weight in the precision's weight dtype.
    ``vision``: a multimodal model's vision tower and projector (``cfg.vision_params``) sit in memory
    beside the decoder, in the weight dtype (the decoder's costs do not change).
    """

    kernel: str = "flash"
    mla: str = "auto"
    logits: str = "all"
    model: str = "roofline"
    fusion: tuple = PRESETS["default"]
    #: The parallel layout (:mod:`lmcost.operators.parallel`): one GPU by default.
    layout: Layout = Layout()
    quant: str | None = None
    vision: bool = False

    def __post_init__(self):
        if self.quant is not None:
            object.__setattr__(self, "quant", recipe(self.quant).name)
        for name, allowed in (("kernel", KERNELS), ("mla", MLA_MODES + ("auto",)), ("logits", LOGITS),
                              ("model", TIME_MODELS)):
            if getattr(self, name) not in allowed:
                raise LmcostError("settings.model" if name == "model" else name,
                                  f"unknown value {getattr(self, name)!r}", f"use one of {', '.join(allowed)}")
        for f in self.fusion:
            if f not in FUSIONS:
                raise LmcostError("fusion", f"unknown fusion {f!r}", f"use some of {', '.join(FUSIONS)}")
        if "rope_attention" in self.fusion and self.kernel != "flash":
            raise LmcostError("fusion", "rope_attention needs the flash kernel (RoPE inside it)",
                              "use `kernel` flash, or list the fusions without rope_attention")

    def mla_for(self, phase: str) -> str:
        """The MLA mode a phase runs."""
        if self.mla != "auto":
            return self.mla
        return "naive" if phase == "prefill" else "absorbed"


_UNCHECKED = object()


def check_api_types(cfg, gpu, precision, settings, workload=_UNCHECKED) -> None:
    """Raises: TypeError naming the argument of the Python API given the wrong kind of object (a model
    name where a loaded config belongs, None for a precision): a programming error, said plainly."""

    for name, value, kind, fix in (("cfg", cfg, ArchConfig, "lmcost.load_config(name or path)"),
                                   ("gpu", gpu, GPU, "lmcost.load_gpu(name or path)"),
                                   ("precision", precision, Precision, "lmcost.Precision(...)"),
                                   ("settings", settings, Settings, "lmcost.Settings(...)"),
                                   ("workload", workload, Workload, "lmcost.Workload(batch, prompt, gen)")):
        if value is not _UNCHECKED and not isinstance(value, kind):
            raise TypeError(f"{name} must be of type {kind.__name__}, got {type(value).__name__}; use {fix}")


def check_mla(cfg: ArchConfig, mla: str | None) -> None:
    """Refuse an MLA execution mode (``absorbed``, ``naive``) asked of a model without MLA attention: it
    would change nothing. ``auto`` and None (a caller's default) pass.

    Raises: LmcostError (mla)."""
    if mla not in (None, "auto") and cfg.attention.mla is None:
        raise LmcostError("mla", f"{cfg.name} has {cfg.attention_kind.upper()} attention, not MLA: {mla} changes nothing",
                          "drop `mla` (it chooses how MLA attention runs, as in DeepSeek-V2/V3)")


def require_decoder(cfg: ArchConfig) -> None:
    """Raises: LmcostError for a bidirectional model, which generates nothing (no decode step to report)."""
    if not cfg.causal:
        raise LmcostError("phase", f"{cfg.name} is bidirectional (causal: false): it has no decode step",
                          "use breakdown with `phase` prefill or train")
