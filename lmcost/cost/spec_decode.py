"""Speculative decoding's step costs: a drafter proposes ``k`` tokens per sequence, the target verifies them in
one forward of ``k + 1`` tokens per sequence, and a step advances each sequence by the expected accepted
tokens ``a`` (1 <= a <= k + 1, the bonus token included).

Methods (:data:`METHODS`) and what a decode step of ``n`` sequences at mean context ``m`` is charged:

- every method: the target's verification: its context-free operators (every projection, FFN or experts,
  norms, collectives) and the lm_head over ``n (k + 1)`` rows (one GEMM over the flattened tokens, logits at
  every position), and attention of ``k + 1`` query tokens per sequence against the context ``m + k`` (the
  decode kernel's FLOPs and activation bytes times ``k + 1``, the cache read once: a multi-query decode
  kernel, FlashInfer's or FlashAttention's, reads each sequence's KV once for all its queries);
- ``draft``: a draft model (its own config, a second :class:`lmcost.cost.engine_step.StepModel` on the same
  GPU and layout): ``k`` decode forwards at ``n`` tokens, contexts ``m, ..., m + k - 1``, each with its
  lm_head; its own KV cache per token; the prompt's prefill through it too;
- ``eagle`` (EAGLE-1/2, Li et al. 2024): one decoder layer of the target's shape (dense), fed the projection
  fc [embedding ‖ feature] (2d -> d), and the target's lm_head, ``k`` times; ``eagle3`` (Li et al. 2025): the
  same layer with a fusion fc of three target hidden states (3d -> d), charged on every draft step (the
  released code fuses once per verification and reuses the head's own state after: an upper bound), the
  target's full vocabulary at the head (EAGLE-3's released heads use a 32k draft vocabulary: an upper
  bound) and its 2d-wide QKV input not modelled;
- ``mtp`` (DeepSeek-V3's multi-token prediction, DeepSeek-AI 2024, section 2.2): one transformer block of
  the target's last kind (an MoE block for DeepSeek-V3) with its projection M (2d -> d), embedding and output
  head shared, run ``k`` times (SGLang and vLLM reuse the one module for every draft step);
- ``ngram`` (prompt lookup): no GPU draft (the lookup runs on the CPU, its time not charged: no measured
  figure); verification only.

The heads' layer and the draft model hold their own KV cache (bytes per token added to the target's) and
weights (subtracted from the cache's room); the heads' embedding and lm_head are the target's (no bytes).
Every table sits on the target's grids (:class:`StepModel`), so a run of decode steps is still affine in the
step between the target's grid nodes (:mod:`lmcost.apps.serve_sim`'s closed form).

Expected tokens per step from per-position conditional acceptance rates p_1..p_k (a draft token is kept
only if every one before it was): a = 1 + sum_i prod_{j<=i} p_j (Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding", eq. 1 with i.i.d. rates; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling", the same expectation).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from lmcost.basics.errors import LmcostError
from lmcost.cost.compile import Records, phase_graph
from lmcost.cost.engine_step import KVSpace, StepModel, _grid, _sum_ops, _Table
from lmcost.model.config import ArchConfig
from lmcost.operators.ops import linear

#: The methods, and how many target hidden states the head's fc takes (0: none, no head layer).
METHODS = ("draft", "eagle", "eagle3", "mtp", "ngram")
_FC_IN = {"eagle": 2, "eagle3": 3, "mtp": 2}
#: The most draft tokens per step taken (vLLM and SGLang take any; past 16 no published run).
MAX_TOKENS = 32


def accepted_per_step(k: int, acceptance) -> float:
    """Expected tokens a step emits per sequence (bonus token included), in [1, k + 1], from ``acceptance``:
    a number (the mean accepted length itself) or ``k`` per-position conditional rates in [0, 1] (a = 1 +
    sum_i prod_{j<=i} p_j: Leviathan et al. 2023, Chen et al. 2023). E.g. k = 2, (0.8, 0.6): 1 + 0.8 + 0.48
    = 2.28. Raises: LmcostError (``acceptance``) for a mean outside [1, k + 1], rates outside [0, 1] or not
    k of them."""
    if isinstance(acceptance, (tuple, list)):
        rates = [float(p) for p in acceptance]
        if len(rates) != k:
            one = " (one value below 1 is a rate, not a mean)" if len(rates) == 1 else ""
            raise LmcostError("acceptance", f"{len(rates)} per-position rates for {k} speculative tokens{one}",
                              f"give {k} rates p1,...,p{k}, or one mean accepted length in [1, {k + 1}] "
                              "(from 1 up a single value is a mean: 1 is one token per step)")
        if any(not 0 <= p <= 1 for p in rates):
            raise LmcostError("acceptance", f"rates {acceptance} are not all within [0, 1]",
                              "give each position's conditional acceptance rate, e.g. 0.8,0.6")
        a, keep = 1.0, 1.0
        for p in rates:
            keep *= p
            a += keep
        return a
    if isinstance(acceptance, bool) or not isinstance(acceptance, (int, float)) or not 1 <= acceptance <= k + 1:
        raise LmcostError("acceptance", f"a mean accepted length of {acceptance!r:.40} is outside [1, {k + 1}] "
                          f"(tokens per step, the bonus token included, with {k} speculative tokens)",
                          f"give a mean in [1, {k + 1}] (1: one token per step) or {k} per-position rates in "
                          "[0, 1] (one value below 1 is a rate)")
    return float(acceptance)


def head_config(cfg: ArchConfig, method: str) -> ArchConfig:
    """The one-layer model an EAGLE head or an MTP module runs as: the target's width, attention and vocabulary
    (its lm_head), one decoder layer: dense for EAGLE (its heads are dense layers), the target's last kind for
    MTP (MoE where the target has experts, as DeepSeek-V3's MTP module). Global attention, no recurrent mixer
    (the heads are attention layers). Raises: LmcostError if the target's fields do not make such a layer."""
    data = cfg.model_dump(exclude_defaults=False)
    data.update(name=f"{cfg.name}-{method}-head", n_layers=1, aliases=[])
    att = dict(data["attention"])
    att["layer_pattern"] = None
    data["attention"] = att
    data["recurrent"] = None
    if method == "mtp" and data.get("moe"):
        data["moe"] = dict(data["moe"], first_dense_layers=0, dense_layers=None)
    else:
        data["moe"] = None
    try:
        return ArchConfig.model_validate(data)
    except Exception as e:  # pydantic's error: the target's layer does not stand alone
        raise LmcostError("spec", f"{cfg.name}'s layer does not make a one-layer {method} head ({str(e)[:120]})",
                          "use `spec` draft with a draft model") from None


class SpecStepModel:
    """Step times of one engine replica decoding speculatively: :class:`StepModel`'s interface as
    :func:`lmcost.apps.serve_sim.simulate` reads it, a decode costing ``k`` draft steps and one verification
    (module docstring). ``tokens(n)`` and ``head(n)`` are a pure decode step's context-free parts at ``n``
    decoding sequences (their rows n (k + 1) at the target), ``decode_attention(n, c)`` the verification's
    and the draft steps' attention. ``tokens_per_step``: a; ``decode_rows``: k + 1 (a decode's tokens in the
    step's budget, as vLLM schedules its k lookahead tokens).

    ``target``: the target's StepModel (engine-scaled if it is); ``draft``: the draft model's or head's
    StepModel on the same GPU, settings and tables' sizes (None for ngram); ``head_weights_bytes``: the head
    layer's weights on one GPU (None: the draft model's own, from its footprint)."""

    decode_attention = StepModel.decode_attention
    context_cell_end = StepModel.context_cell_end

    def __init__(self, target: StepModel, method: str, k: int, accepted: float, draft: StepModel | None = None,
                 head_weights_bytes: float | None = None):
        self.target, self.method, self.k, self.tokens_per_step = target, method, int(k), float(accepted)
        self.decode_rows = self.k + 1
        self.draft = draft if self.k else None
        self.head_weights_bytes = head_weights_bytes
        self.cfg, self.gpu, self.precision, self.settings = target.cfg, target.gpu, target.precision, target.settings
        self.scales, self.key = target.scales, target.key
        self._n, self._c = target._n, target._c
        q = self.decode_rows
        dec = phase_graph(target.cfg, target.precision, "decode", target.settings)
        ns, cs = np.array(self._n)[:, None], np.array(self._c)[None, :]
        parts = _sum_ops(dec, dec.with_tokens, ns, cs + self.k, target.gpu, target.precision, self.key,
                         records=_widened(dec.at(ns, cs + self.k), q))
        self._verify = _combine(parts, self.scales)
        draft_attn = np.zeros_like(self._verify)
        self._fc = None
        if self.draft is not None:
            d = self.draft
            ddec = phase_graph(d.cfg, d.precision, "decode", d.settings)
            for i in range(self.k):  # the k draft steps' contexts m, ..., m + k - 1
                draft_attn = draft_attn + _combine(_sum_ops(ddec, ddec.with_tokens, ns, cs + i, d.gpu, d.precision,
                                                            self.key), self.scales)
            if method in _FC_IN:
                xs = _grid(max(target.tokens.top, target.head.top))
                width = _FC_IN[method] * target.cfg.d_model
                fc = [linear("spec.fc", np.maximum(xs, 1), width, target.cfg.d_model, target.precision.B_w,
                             target.precision.B_a)]
                rec = Records.of_ops(fc)
                self._fc = _Table(xs, _sum_ops(rec.graph, (0,), 1, 1, target.gpu, target.precision, self.key,
                                               records=rec), self.scales)
        self._draft_attn = draft_attn
        self._dec = (self._verify + draft_attn).tolist()
        self.kernels = target.kernels + (self.k * (self.draft.kernels + (1 if self._fc else 0)) if self.draft else 0)

    def fc(self, tokens: int) -> float:
        """Seconds of the head's fc projection over ``tokens`` rows (0 without a head)."""
        return self._fc(tokens) if self._fc is not None and tokens > 0 else 0.0

    def tokens(self, n: int) -> float:
        """Seconds of a pure decode step's context-free operators at ``n`` decoding sequences: the target's at
        n (k + 1) rows, the k draft steps' at n (their lm_heads in :meth:`head`)."""
        t = self.target.tokens(n * self.decode_rows)
        if self.draft is not None and n:
            t += self.k * (self.draft.tokens(n) + self.fc(n))
        return t

    def head(self, n: int) -> float:
        """Seconds of the lm_heads of a pure decode step at ``n`` sequences: the target's over n (k + 1) rows
        (logits at every verified position), each draft step's over n."""
        t = self.target.head(n * self.decode_rows)
        if self.draft is not None and n:
            t += self.k * self.draft.head(n)
        return t

    def draft_s(self, n: int, m: float) -> float:
        """Seconds of the k draft steps of a decode step of ``n`` sequences at mean context ``m``."""
        if self.draft is None or n <= 0:
            return 0.0
        return (self.k * (self.draft.tokens(n) + self.draft.head(n) + self.fc(n))
                + StepModel.decode_attention(_Grid(self._n, self._c, self._draft_attn), n, m))

    def verify_s(self, n: int, m: float) -> float:
        """Seconds of the target's verification forward of a decode step: n (k + 1) rows, k + 1 queries per
        sequence against the context."""
        if n <= 0:
            return 0.0
        q = self.decode_rows
        return (self.target.tokens(n * q) + self.target.head(n * q)
                + StepModel.decode_attention(_Grid(self._n, self._c, self._verify), n, m))

    def step_s(self, n_decode: int, mean_context: float, chunks=(), n_out: int | None = None) -> float:
        """Seconds of one step: ``n_decode`` speculative decodes at ``mean_context`` (k draft steps, a
        verification of k + 1 tokens each) and prefill ``chunks`` (pairs (cached p, new c)) through the target
        and the drafter; ``n_out`` sequences sample (default: the decodes and every chunk)."""
        q, tgt = self.decode_rows, self.target
        new = sum(c for _, c in chunks)
        finishing = len(chunks) if n_out is None else n_out - n_decode
        t = (tgt.tokens(n_decode * q + new) + tgt.head(n_decode * q + finishing)
             + self.decode_attention(n_decode, mean_context))
        for p, c in chunks:
            t += tgt.prefill_attention(p + c) - tgt.prefill_attention(p)
        if self.draft is not None:
            d = self.draft
            if n_decode:
                t += self.k * (d.tokens(n_decode) + d.head(n_decode) + self.fc(n_decode))
            if new:  # the prompt through the drafter (EAGLE/MTP: the head over the prompt's hidden states)
                t += d.tokens(new) + self.fc(new)
                for p, c in chunks:
                    t += d.prefill_attention(p + c) - d.prefill_attention(p)
        return t

    def kv_space(self, prefill_tokens: int) -> KVSpace:
        """The target's :meth:`StepModel.kv_space` with the drafter's KV bytes per token and per sequence added,
        its weights added (a head: its one layer, the fc; the embedding and lm_head shared) and the larger
        activation peak."""
        space = self.target.kv_space(prefill_tokens)
        if self.draft is None:
            return space
        d = self.draft.kv_space(prefill_tokens)
        weights = d.weights_bytes if self.head_weights_bytes is None else self.head_weights_bytes
        return KVSpace(per_token_bytes=space.per_token_bytes + d.per_token_bytes,
                       per_seq_bytes=space.per_seq_bytes + d.per_seq_bytes,
                       weights_bytes=space.weights_bytes + weights,
                       activation_bytes=max(space.activation_bytes, d.activation_bytes))


class _Grid:
    """A decode-attention table on the target's grid, for :meth:`StepModel.decode_attention`."""

    def __init__(self, ns, cs, values):
        self._n, self._c, self._dec = ns, cs, values.tolist()


def _combine(parts: dict, scales: dict) -> np.ndarray:
    """The groups' times weighted by an engine's scales (:meth:`StepModel.scaled`)."""
    return sum(scales[g] * v for g, v in parts.items())


def _widened(rec: Records, q: int) -> Records:
    """The decode attention ``rec`` (ops that change with the context) with ``q`` query tokens per sequence:
    FLOPs, activation reads and writes and KV writes times q; the cache read once. Shapes as ``rec``."""
    c = rec.cols

    def times(col):
        return tuple(v * q for v in col)
    flops, ar, aw, kw = times(c.flops), times(c.act_read_bytes), times(c.act_write_bytes), times(c.kv_write_bytes)
    total = tuple(w + a + b + r + x for w, a, b, r, x in zip(c.weight_bytes, ar, aw, c.kv_read_bytes, kw))
    return Records(rec.graph, replace(c, flops=flops, act_read_bytes=ar, act_write_bytes=aw, kv_write_bytes=kw,
                                      bytes=total), rec.shape)


def verify_gemm_flops(cfg: ArchConfig, precision, settings, n: int, k: int) -> float:
    """FLOPs of the target's matmuls (GEMMs and lm_head, every layer) in the verification of ``n`` sequences
    with ``k`` draft tokens: the decode phase's matmuls at n (k + 1) rows, i.e. (k + 1) x a plain decode
    step's at n (each row costs 2 x the weights it meets: Kaplan et al. 2020)."""
    g = phase_graph(cfg, precision, "decode", settings)
    rec = g.at(n * (k + 1), 1)
    return float(sum(f * t.count for f, t in zip(rec.cols.flops, g.templates) if t.matmul
                     and t.op_class.value in ("gemm", "lm_head")))
