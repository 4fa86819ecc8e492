"""The time of one engine step of a mixed batch (decodes and prefill chunks together, as continuous
batching runs them), from the same operators, FLOPs and bytes as ``estimate``, tabulated once so a
simulation of millions of steps reads them in O(1).

A step that decodes ``n`` sequences at mean context ``c`` and prefills chunks of ``c_i`` new tokens after
``p_i`` cached ones (``T = n + sum c_i`` tokens in all) costs, on one GPU of the layout
(:class:`StepModel.step_s`):

    t = tokens(T) + head(n_out) + decode_attention(n, c) + sum_i [prefill_attention(p_i + c_i) - prefill_attention(p_i)]

- ``tokens(T)``: every operator whose cost does not depend on the context (the projections, the FFN or
  experts, norms, elementwise, embedding, the layout's collectives), at T tokens: the decode phase's
  context-free operators at batch T (one GEMM over all the step's tokens, as an engine flattens them), minus
  the lm_head;
- ``head(n_out)``: the lm_head and its logits gather over the sequences that sample a token (the decodes and
  the chunks that finish a prompt), as engines compute logits of the last token only;
- ``decode_attention(n, c)``: the decode phase's context-dependent operators (attention over the cache) at
  batch n and context c (a flash-decode kernel's work is linear in the keys read: the mean context stands
  for the batch's);
- ``prefill_attention(k)``: the prefill phase's attention operators for one sequence of k tokens (causal
  pairs k(k+1)/2 per head); a chunk's is the difference, which counts its pairs exactly
  (sum over the chunk's queries of their keys: S(p + c) - S(p)), and is the whole prefill's for one chunk.

Every table is the cost model's own figure (roofline or calibrated, ``settings.model``) at every integer up
to a dense limit and on a fine geometric grid past it (linear interpolation between nodes: a smooth curve,
relative error below 1e-4 on a 1% grid); ``decode_attention`` on a grid in (n, c), bilinear. A decode step
of one batch is ``estimate``'s decode step to that interpolation (tests/test_serve.py).

MLA: tokens are costed as the decode phase runs them (absorbed), chunks' attention as the prefill phase
(naive under ``mla=auto``), an approximation stated here. Engines' CPU overheads are added by the caller
(:mod:`lmcost.apps.serve`), not here.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import numpy as np

from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.compile import phase_graph
from lmcost.cost.memory import activation_bytes, rank_footprint
from lmcost.cost.phases import op_times
from lmcost.hardware.gpu import GPU
from lmcost.model.config import ArchConfig
from lmcost.model.quant import effective
from lmcost.operators.workload import Settings, require_decoder

#: Integers tabulated exactly before the geometric grid starts, and the grid's ratio.
_DENSE, _RATIO = 4096, 1.01
#: The lm_head's operators, which run on the sampling sequences only.
_HEAD = ("lm_head", "tp.logits_all_gather")


def _grid(top: int, dense: int = _DENSE, ratio: float = _RATIO) -> np.ndarray:
    """0, 1, ..., dense, then a geometric grid of whole numbers up to the first node at or past ``top``: the
    nodes below any context are the same whatever ``top`` is, so two runs whose longest request differs cost
    the same request alike (``serve-plan``'s rows are reproduced by ``serve`` exactly)."""
    pts = list(range(0, min(top, dense) + 1))
    x = float(dense)
    while pts[-1] < top:
        x *= ratio
        pts.append(max(pts[-1] + 1, int(round(x))))
    return np.array(pts, dtype=np.int64)


class _Table:
    """A function of one whole number tabulated at ``xs`` (0 first): exact at every integer up to the
    dense limit, linear between the geometric nodes past it. ``parts``: the values per group of
    :data:`GROUPS`; the table is their sum weighted by ``scales``."""

    def __init__(self, xs: np.ndarray, parts: dict, scales: dict | None = None):
        self.xs, self.parts = [int(v) for v in xs], parts
        self.dense = min(_DENSE, self.xs[-1])
        self.top = self.xs[-1]
        total = sum((scales or {}).get(g, 1.0) * np.where(xs > 0, v, 0.0) for g, v in parts.items())
        self.ys = [float(v) for v in total]

    def scaled(self, scales: dict) -> "_Table":
        return _Table(np.array(self.xs), self.parts, scales)

    def __call__(self, x: int) -> float:
        if x <= self.dense:
            return self.ys[x]
        xs = self.xs
        j = min(bisect.bisect_right(xs, x), len(xs) - 1)  # past the table: the last slope carries on
        x0, x1, y0, y1 = xs[j - 1], xs[j], self.ys[j - 1], self.ys[j]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _split_edges(gpu: GPU, top: int) -> set:
    """Contexts j*split and j*split + 1 (up to ``top``) at which the calibrated decode attention's split count
    ceil(c / split) steps (:func:`lmcost.cost.efficiency.decode_occupancy`), for j up to the SM count (past
    it one stream fills the GPU)."""
    eff = gpu.efficiency
    dec = eff.decode_figures() if eff is not None else None
    if dec is None or not dec.split_tokens:
        return set()
    k = dec.split_tokens
    return {c for j in range(1, eff.gemm.sm_count + 1) for c in (j * k, j * k + 1) if c <= top}


#: The kinds of operators an engine profile may scale (:attr:`StepModel.scaled`): its dense matmuls (GEMMs
#: and the lm_head), the routed experts' GEMMs (one grouped kernel in an engine), attention over the context
#: and every small kernel (norms, elementwise, embedding, routing, recurrent mixers), each split by what
#: bounds it at that point (``.compute``: FLOPs at peak; ``.memory``: bytes at bandwidth); collectives
#: (``comm``); and ops at the GPU's kernel floor (``floor``: too small for either term).
_KINDS = {"gemm": ("gemm", "lm_head"), "attention": ("attention", "softmax"),
          "other": ("norm", "elementwise", "embedding", "moe_routing", "recurrent")}
GROUPS = tuple(f"{k}.{b}" for k in ("gemm", "experts", "attention", "other") for b in ("compute", "memory")) + (
    "comm", "floor")
_KIND_OF = {c: k for k, cs in _KINDS.items() for c in cs}


def kind_of(name: str, op_class: str) -> str:
    """The kind (a prefix of :data:`GROUPS`) of an operator: a routed expert's GEMM (``moe.expert.*``: the
    engine's grouped MoE kernel) is ``experts``, a collective ``comm``, every other by its class."""
    if op_class == "communication":
        return "comm"
    return "experts" if op_class == "gemm" and ".moe.expert." in f".{name}" else _KIND_OF[op_class]


def _sum_ops(graph, idx, b, tokens, gpu, precision, key, records=None) -> dict:
    """Seconds (time ``key`` of :func:`lmcost.cost.phases.op_times`) of the ops at ``idx`` of ``graph``, times
    their layer counts, at batch ``b`` and ``tokens`` (broadcast arrays), per group of :data:`GROUPS`: each
    op's time goes to its kind's group of the roofline term that bounds it at that point (the floor where
    neither reaches it). ``records``: the ops' records to time instead of ``graph.at(b, tokens)`` (the same
    ops, their columns changed: :mod:`lmcost.cost.spec_decode`'s verification). Returns: {group: array of the
    broadcast shape}."""
    shape = np.broadcast_shapes(np.shape(b), np.shape(tokens))
    out = {g: np.zeros(shape) for g in GROUPS}
    if not idx:
        return out
    t = op_times(graph.at(b, tokens) if records is None else records, gpu, precision, (key.removesuffix("_s"),))
    vals = getattr(t, key)
    for i in idx:
        kind, n, v = kind_of(graph.names[i], graph.classes[i]), graph.templates[i].count, vals[i]
        if kind == "comm":
            out["comm"] = out["comm"] + n * v
            continue
        c, m = t.compute_s[i], t.memory_s[i]
        floor = t.roofline_s[i] > np.maximum(c, m)
        comp = ~floor & (c >= m)
        for g, mask in ((f"{kind}.compute", comp), (f"{kind}.memory", ~floor & ~comp), ("floor", floor)):
            out[g] = out[g] + n * np.where(mask, v, 0.0)
    return out


@dataclass(frozen=True)
class KVSpace:
    """What the paged KV cache of one GPU holds (bytes): per token of a sequence (every layer's K and V on
    this GPU, below any sliding window) and per sequence (a hybrid's constant state)."""

    per_token_bytes: float
    per_seq_bytes: float
    weights_bytes: float
    activation_bytes: float  #: the activation peak of a prefill of the step's token budget


class StepModel:
    """Step times of one engine replica (one GPU of ``settings.layout``, ``pp`` = 1) for the model,
    tabulated for steps of up to ``max_tokens`` tokens, ``max_seqs`` decoding sequences and contexts up
    to ``max_context``. Raises: LmcostError for a bidirectional model or a pipeline-parallel layout."""

    def __init__(self, cfg: ArchConfig, gpu: GPU, precision: Precision, settings: Settings, *, max_tokens: int,
                 max_seqs: int, max_context: int):
        require_decoder(cfg)
        if settings.layout.pp != 1:
            raise LmcostError("layout.pp", f"serving with pp={settings.layout.pp} is not modelled (one stage per "
                              "replica)", "use tp, ep and dp for serving")
        self.cfg, self.gpu, self.precision, self.settings = cfg, gpu, precision, settings
        key = f"{settings.model}_s"
        dec = phase_graph(cfg, precision, "decode", settings)
        pre = phase_graph(cfg, precision, "prefill", settings)
        head = tuple(i for i in dec.fixed if dec.names[i] in _HEAD)
        body = tuple(i for i in dec.fixed if dec.names[i] not in _HEAD)
        ctx_names = {dec.names[i] for i in dec.with_tokens}
        pre_ctx = tuple(i for i, n in enumerate(pre.names) if n in ctx_names)
        top_t, top_c = max(1, max_tokens), max(2, max_context)
        xs = _grid(top_t)
        self.tokens = _Table(xs, _sum_ops(dec, body, np.maximum(xs, 1), 1, gpu, precision, key))
        ns = _grid(max(1, max_seqs))
        self.head = _Table(ns, _sum_ops(dec, head, np.maximum(ns, 1), 1, gpu, precision, key))
        cs = _grid(top_c)
        self.prefill_attention = _Table(cs, _sum_ops(pre, pre_ctx, 1, np.maximum(cs, 1), gpu, precision, key))
        # decode attention on a grid in (n, c): dense to 64 in n, then 5%; dense to 256 in c, then 2%, and
        # both sides of every step of a split decode kernel's occupancy (ceil(c / split) splits, which
        # change the time by up to 0.6% at c = 257 on an H100: interpolated across, a step is off by that)
        self._n = [int(v) for v in _grid(max(1, max_seqs), 64, 1.05)[1:]]
        self._c = sorted(set(int(v) for v in _grid(top_c, 256, 1.02)[1:]) | _split_edges(gpu, top_c))
        self._dec_parts = _sum_ops(dec, dec.with_tokens, np.array(self._n)[:, None], np.array(self._c)[None, :], gpu,
                                   precision, key)
        self._dec = sum(self._dec_parts.values()).tolist()
        self.key = key
        #: Kernels one decode step launches on a GPU: every operator of the decode phase, once per layer that
        #: runs it (an engine's per-kernel gaps scale with it: :attr:`lmcost.hardware.engines.EngineProfile.kernel_overhead_us`).
        self.kernels = int(sum(op.count for op in dec.templates))
        self.scales = {g: 1.0 for g in GROUPS}
        self._row = (None, None)  # decode_attention_pair's last n and its row weights

    def scaled(self, scales: dict) -> "StepModel":
        """This model with each group's time (:data:`GROUPS`) multiplied by ``scales[group]`` (missing: 1): an
        engine's kernels against the cost model's, fitted per engine (:mod:`lmcost.apps.serve_fit`). Cheap: the
        tables are recombined, not recomputed. A key outside :data:`GROUPS` (a group a feature adds to its
        tables, such as wide EP's exposed all-to-all) is kept."""
        new = object.__new__(StepModel)
        new.__dict__.update(self.__dict__)
        new.scales = {g: float(scales.get(g, 1.0)) for g in GROUPS}
        new.scales.update({g: float(v) for g, v in scales.items() if g not in new.scales})
        new.tokens, new.head = self.tokens.scaled(new.scales), self.head.scaled(new.scales)
        new.prefill_attention = self.prefill_attention.scaled(new.scales)
        new._dec = sum(new.scales[g] * v for g, v in self._dec_parts.items()).tolist()
        return new

    def decode_attention(self, n: int, c: float) -> float:
        """Seconds of the attention over the cache of a decode step of ``n`` sequences at mean context ``c``
        (bilinear on the tabulated grid; 0 for n = 0)."""
        if n <= 0:
            return 0.0
        ns, cs = self._n, self._c
        i = min(max(bisect.bisect_right(ns, n) - 1, 0), len(ns) - 2) if len(ns) > 1 else 0
        j = min(max(bisect.bisect_right(cs, c) - 1, 0), len(cs) - 2) if len(cs) > 1 else 0
        if len(ns) == 1:
            u, i1 = 0.0, i
        else:
            i1 = i + 1
            u = (n - ns[i]) / (ns[i1] - ns[i])
        if len(cs) == 1:
            v, j1 = 0.0, j
        else:
            j1 = j + 1
            v = (c - cs[j]) / (cs[j1] - cs[j])
        g = self._dec
        return ((1 - u) * ((1 - v) * g[i][j] + v * g[i][j1]) + u * ((1 - v) * g[i1][j] + v * g[i1][j1]))

    def decode_attention_pair(self, twin: "StepModel", n: int, c: float) -> tuple:
        """(:meth:`decode_attention` of this model, of ``twin``) at (``n``, ``c``): ``twin`` one of its
        :meth:`scaled` copies (the same grid; :class:`lmcost.cost.energy.Metered`'s joules), the grid cell found
        once; each value bit for bit its model's :meth:`decode_attention`. Seconds, or what ``twin`` tabulates."""
        if n <= 0:
            return 0.0, 0.0
        ns, cs = self._n, self._c
        row = self._row
        if row[0] == n:  # the n half of the last lookup (a run's cells share their n)
            i, i1, u = row[1]
        else:
            i = min(max(bisect.bisect_right(ns, n) - 1, 0), len(ns) - 2) if len(ns) > 1 else 0
            if len(ns) == 1:
                u, i1 = 0.0, i
            else:
                i1 = i + 1
                u = (n - ns[i]) / (ns[i1] - ns[i])
            self._row = (n, (i, i1, u))
        j = min(max(bisect.bisect_right(cs, c) - 1, 0), len(cs) - 2) if len(cs) > 1 else 0
        if len(cs) == 1:
            v, j1 = 0.0, j
        else:
            j1 = j + 1
            v = (c - cs[j]) / (cs[j1] - cs[j])
        g, h = self._dec, twin._dec
        return (((1 - u) * ((1 - v) * g[i][j] + v * g[i][j1]) + u * ((1 - v) * g[i1][j] + v * g[i1][j1])),
                ((1 - u) * ((1 - v) * h[i][j] + v * h[i][j1]) + u * ((1 - v) * h[i1][j] + v * h[i1][j1])))

    def context_cell_end(self, c: float) -> float:
        """The context at which the cell of the decode-attention grid holding ``c`` ends: up to it (included)
        :meth:`decode_attention` is affine in the context at any n, so a run of decode steps whose contexts stay
        at or below it is summed exactly as an arithmetic series (:mod:`lmcost.apps.serve_sim`); inf in the
        last cell, whose line carries on past the table."""
        cs = self._c
        j = max(bisect.bisect_right(cs, c), 1)
        return float(cs[j]) if j < len(cs) - 1 else math.inf

    def step_s(self, n_decode: int, mean_context: float, chunks=(), n_out: int | None = None) -> float:
        """Seconds of one step: ``n_decode`` decodes at ``mean_context`` and prefill ``chunks`` (pairs
        (cached tokens p, new tokens c)); ``n_out`` sequences sample (default: the decodes and every chunk)."""
        pre = self.prefill_attention
        tokens = n_decode + sum(c for _, c in chunks)
        out = n_decode + len(chunks) if n_out is None else n_out
        t = self.tokens(tokens) + self.head(out) + self.decode_attention(n_decode, mean_context)
        for p, c in chunks:
            t += pre(p + c) - pre(p)
        return t

    def kv_space(self, prefill_tokens: int) -> KVSpace:
        """Bytes per cached token and per sequence on one GPU, the weights, and the activation peak of a
        prefill of ``prefill_tokens`` tokens (:func:`lmcost.cost.memory.rank_footprint`)."""
        cfg, precision, settings = self.cfg, self.precision, self.settings
        layout, quant = settings.layout, effective(cfg, settings.quant)
        pre = phase_graph(cfg, precision, "prefill", settings).at(1, prefill_tokens)
        acts = activation_bytes(pre)
        dp = layout.dp

        def fp(context):
            return rank_footprint(cfg, precision, layout, batch=dp, context=context, tokens=prefill_tokens,
                                  act_bytes=acts, quant=quant)
        one, two = fp(1), fp(2)
        per_token = float(two.kv_cache_bytes - one.kv_cache_bytes)
        per_seq = float(one.kv_cache_bytes) - per_token
        return KVSpace(per_token_bytes=per_token, per_seq_bytes=max(0.0, per_seq), weights_bytes=float(one.weights_bytes),
                       activation_bytes=float(one.activations_bytes + (one.comm_buffer_bytes or 0)))
