"""``lmcost serve --spec METHOD``: speculative decoding in a serving run. The request's fields checked
(:func:`check_spec`), the step model built (:func:`spec_step`: :class:`lmcost.cost.spec_decode.SpecStepModel`
over the target's), and the run's ``spec`` figures (:func:`spec_summary`): the draft's and the verification's
seconds per step at the run's mean batch, the step time per token against plain decoding's, and the batch
from which speculative decoding stops paying (:func:`crossover_batch`).

Acceptance is an input, never a default: no figure of it is shipped (it depends on the model pair, the data
and the sampling temperature). The CLI's ``--acceptance`` text is read by :func:`parse_acceptance`.
"""

from __future__ import annotations

import math

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.cost.engine_step import StepModel
from lmcost.cost.spec_decode import MAX_TOKENS, METHODS, SpecStepModel, accepted_per_step, head_config

#: The request fields that mean something only with a method.
SPEC_FIELDS = ("spec_tokens", "draft_model", "acceptance")
#: The fewest draft tokens per step taken with a method: k = 0 drafts nothing (plain decoding, but for a
#: drafter's weights and memory); the tests lower it to 0 to check that k = 0 is plain decoding.
MIN_TOKENS = 1


def parse_acceptance(text: str):
    """``--acceptance``: one number in (0, 1) is a per-position conditional rate (k = 1: 0.99 is ~1.99 tokens
    per step), any other single number the mean accepted length (tokens per step, bonus included: 1 is one
    token; 0 or below is refused as a mean outside [1, k + 1]); several comma-separated are the rates
    p1,...,pk. Returns: float or tuple of floats. Raises: LmcostError (``acceptance``) for text that is no
    number."""
    try:
        vals = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise LmcostError("acceptance", f"{text!r:.40} is not a number or a list of numbers",
                          "give a mean accepted length (e.g. 2.3) or per-position rates (e.g. 0.8,0.6)") from None
    if any(not math.isfinite(v) for v in vals):
        raise LmcostError("acceptance", f"{text!r:.40} is not finite", "give finite numbers")
    return vals[0] if len(vals) == 1 and not 0 < vals[0] < 1 else tuple(vals)


def method_of(r) -> str | None:
    """The request's method, None when speculative decoding is off (no method, or ``none``)."""
    spec = getattr(r, "spec", None)
    return None if spec in (None, "none") else spec


def check_spec(r) -> None:
    """Refuse speculative-decoding fields of ``r`` (:class:`lmcost.apps.serve.ServeRequest`) that are out of
    range or mean nothing. Raises: LmcostError naming ``spec`` (unknown method), ``spec_tokens`` (missing
    with a method, not a whole number 1-32: k = 0 drafts nothing), ``acceptance`` (missing, or past [1, k + 1]:
    :func:`lmcost.cost.spec_decode.accepted_per_step`), ``draft_model`` (missing for ``draft``, given for
    another method), or any of :data:`SPEC_FIELDS` without a method."""
    method = method_of(r)
    if r.spec is not None and method is not None and method not in METHODS:
        raise LmcostError("spec", f"unknown method {r.spec!r:.40}", f"use one of none, {', '.join(METHODS)}")
    if method is None:
        for name in SPEC_FIELDS:
            if getattr(r, name) is not None:
                raise LmcostError(name, "has no effect without a speculative-decoding method",
                                  f"give `spec` ({', '.join(METHODS)}) or drop it")
        return
    k = r.spec_tokens
    if k is None:
        raise LmcostError("spec_tokens", f"missing: `spec` {method} needs the draft tokens per step (vLLM's "
                          "num_speculative_tokens)", "give it, e.g. 3")
    if isinstance(k, bool) or not isinstance(k, int) or not MIN_TOKENS <= k <= MAX_TOKENS:
        what = (f"0 drafts nothing: `spec` {method} would be plain decoding with a drafter's weights and memory"
                if k == 0 and not isinstance(k, bool) else f"{k!r:.40} is not a whole number from 1 to {MAX_TOKENS}")
        raise LmcostError("spec_tokens", what, "give the draft tokens per step, e.g. 3, or drop `spec`")
    if r.acceptance is None:
        raise LmcostError("acceptance", "missing: no acceptance is assumed (it depends on the model pair and "
                          "the data)", "give a mean accepted length (e.g. 2.3) or per-position rates (0.8,0.6)")
    accepted_per_step(k, r.acceptance)
    if method == "draft" and r.draft_model is None:
        raise LmcostError("draft_model", "missing: `spec` draft needs the draft model", _draft_hint(r.model))
    if method != "draft" and r.draft_model is not None:
        raise LmcostError("draft_model", f"has no effect with `spec` {method} (only `draft` runs a draft model)",
                          "drop it, or use `spec` draft")


def _draft_hint(model) -> str:
    """The fix of a missing draft model: the smallest shipped model (d_model x layers) of ``model``'s
    vocabulary that is smaller than it, or none when no shipped model is (or ``model`` does not load)."""
    from lmcost.basics.shipped import names
    from lmcost.model.config import ArchConfig
    from lmcost.model.loading import load_config

    ask = "give a smaller model of the target's tokenizer (a shipped name, YAML or config.json)"
    try:
        cfg = model if isinstance(model, ArchConfig) else load_config(model)
    except LmcostError:
        return ask
    size = lambda c: c.d_model * c.n_layers  # noqa: E731
    same = [c for c in map(load_config, names("models")) if c.vocab_size == cfg.vocab_size and size(c) < size(cfg)]
    if not same:
        return f"{ask}; no shipped model has {cfg.name}'s vocabulary ({cfg.vocab_size:,}) at a smaller size"
    return f"{ask}, e.g. {min(same, key=size).name}"


def spec_step(r, step: StepModel, *, max_tokens: int, max_seqs: int, max_context: int, say) -> SpecStepModel:
    """The speculative step model of ``r`` over the target's ``step`` (engine-scaled as it is): a draft model
    or head built with the same GPU, precision, settings and table sizes. Raises: LmcostError (``draft_model``)
    for a draft whose vocabulary is not the target's, (``spec``) for ``mtp`` on a config with no MTP module,
    and the loaders' errors."""
    from lmcost.model.config import ArchConfig
    from lmcost.model.loading import load_config

    method, k = method_of(r), r.spec_tokens
    a = accepted_per_step(k, r.acceptance)
    cfg = step.cfg
    draft, head_weights, name = None, None, None

    def build(dcfg):
        s = StepModel(dcfg, step.gpu, step.precision, step.settings, max_tokens=max_tokens, max_seqs=max_seqs,
                      max_context=max_context)
        return s.scaled(step.scales)
    if method == "draft":
        dcfg = r.draft_model if isinstance(r.draft_model, ArchConfig) else load_config(r.draft_model)
        if dcfg.vocab_size != cfg.vocab_size:
            raise LmcostError("draft_model", f"{dcfg.name}'s vocabulary ({dcfg.vocab_size:,}) is not {cfg.name}'s "
                              f"({cfg.vocab_size:,}): its tokens cannot be verified", "use a draft of the same tokenizer")
        step.settings.layout.check(dcfg)
        draft, name = build(dcfg), dcfg.name
    elif method in ("eagle", "eagle3", "mtp"):
        if method == "mtp":
            if not cfg.mtp_modules:
                raise LmcostError("spec", f"{cfg.name} has no MTP module (its YAML's mtp_modules, a config.json's "
                                  "num_nextn_predict_layers, is 0 or absent)",
                                  "use eagle, draft or ngram, or state mtp_modules in the model's YAML")
        head = head_config(cfg, method)
        draft, name = build(head), head.name
        two = StepModel(head.model_copy(update={"n_layers": 2}), step.gpu, step.precision,
                        step.settings, max_tokens=1, max_seqs=1, max_context=2)
        # one layer's weights on a GPU (two layers' less one's) and the fc, replicated on every GPU
        fc = {"eagle": 2, "eagle3": 3, "mtp": 2}[method] * cfg.d_model * cfg.d_model * step.precision.B_w
        head_weights = two.kv_space(1).weights_bytes - draft.kv_space(1).weights_bytes + fc
    st = SpecStepModel(step, method, k, a, draft, head_weights)
    st.info = dict(acceptance=list(r.acceptance) if isinstance(r.acceptance, tuple) else r.acceptance, draft=name)
    return st


def _overhead(setup, n: int, kernels: int) -> float:
    """The engine's CPU seconds of a decode step of ``n`` sequences launching ``kernels`` kernels."""
    k, spec = setup.knobs, setup.step
    per_kernel = 0.0 if setup.time_model == "roofline" else setup.engine.kernel_overhead_us * 1e-6
    base = k.step_overhead_s - per_kernel * spec.kernels  # the knobs hold the speculative step's kernels
    return base + per_kernel * kernels + k.seq_overhead_s * n


def per_token_s(setup, n: int, m: float) -> tuple[float, float]:
    """Seconds per emitted token of a decode step of ``n`` sequences at mean context ``m`` (CPU overheads
    included): (speculative, plain). Speculative: its step / (n a); plain: the target's step / n."""
    spec = setup.step
    tgt = spec.target
    s = _overhead(setup, n, spec.kernels) + spec.step_s(n, m)
    p = _overhead(setup, n, tgt.kernels) + tgt.step_s(n, m)
    return s / (n * spec.tokens_per_step), p / n


def crossover_batch(setup, m: float) -> int | None:
    """The smallest batch (decoding sequences, 1 to max_num_seqs) at which speculative decoding's step time
    per token at mean context ``m`` exceeds plain decoding's (:func:`per_token_s`); None if it pays at
    every batch the engine runs."""
    for n in range(1, setup.knobs.max_num_seqs + 1):
        s, p = per_token_s(setup, n, m)
        if s > p:
            return n
    return None


def spec_summary(setup, tr) -> dict:
    """The run's ``spec`` figures: method, tokens (k), acceptance as given, accepted_per_step (a), draft (the
    draft model or head), the run's mean batch of decoding sequences over its decode steps and the mean
    context (mean prompt + 1 + half the mean output), at them: draft_s_per_step and verify_s_per_step (GPU
    seconds), step_s_per_step and plain_s_per_step (with the engine's overheads), speedup_per_token (plain
    over speculative, per emitted token), and crossover_batch (:func:`crossover_batch`)."""
    spec = setup.step
    seg = tr.itl_segments
    batch = float(np.dot(seg[:, 2], seg[:, 3]) / seg[:, 2].sum()) if len(seg) and seg[:, 2].sum() else 0.0
    m = float(np.mean(tr.prompt)) + 1 + float(np.mean(tr.output - 1)) / 2
    n = max(1, int(round(batch)))
    s, p = per_token_s(setup, n, m)
    return dict(method=spec.method, tokens=spec.k, acceptance=spec.info["acceptance"],
                accepted_per_step=spec.tokens_per_step, draft=spec.info["draft"], mean_batch=batch, mean_context=m,
                draft_s_per_step=spec.draft_s(n, m), verify_s_per_step=spec.verify_s(n, m),
                step_s_per_step=s * n * spec.tokens_per_step, plain_s_per_step=p * n, speedup_per_token=p / s,
                crossover_batch=crossover_batch(setup, m))
