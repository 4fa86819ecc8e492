"""Wide EP in an engine step: the context-free part of a step (:attr:`lmcost.cost.engine_step.StepModel.tokens`)
re-timed with DeepEP's dispatch and combine (:mod:`lmcost.cost.deepep`) and, as a named option, two-batch
overlap (TBO: SGLang's ``--enable-two-batch-overlap``, DeepSeek's "Day 6" inference overview, Feb 2025).

A step of T tokens on one rank of EP over attention-DP costs, in its context-free operators (:mod:`lmcost.cost.engine_step`):

    no TBO:  C(T) + M(T)
    TBO:     st(A1, D0) + st(E0, D1) + st(E1, B0) + (L - 1)/L st(A0, B1) + (A0 + B1) / L     st(x, y) = max(y, x + f y)

C: every operator but the collectives (the engine's fitted factors applied), A its part outside the routed experts
(attention's projections, shared experts, norms), E the routed experts' GEMMs; M: the EP all-to-alls of the
step's L MoE layers, D the dispatches and B the combines (NCCL's model scaled by the engine's ``comm`` factor,
as today, or DeepEP's published kernels, unscaled). Under TBO the step runs as two micro-batches, 0 of
floor(T/2) tokens and 1 of ceil(T/2) (A0, A1, ... each summed over the layers), and each all-to-all of one runs
beside one stage of the other's compute, as SGLang's TBO schedules a layer (LMSYS blog 2025-05-05, "Two-batch
Overlap", its prefill figure; DeepSeek's Day 6 overview, prefilling: "the computation of one micro-batch overlaps
with the all-to-all of the other"; both recalled): attention of 1 beside the dispatch of 0, the experts of 0
beside the dispatch of 1, the experts of 1 beside the combine of 0, attention of 0 (next layer) beside the
combine of 1. Each stage lasts the longer of its pair (st), and the first layer's attention of 0 and the last
layer's combine of 1 run alone. Before this revision the model let all of a layer's compute hide all of its
communication (max(C2, M2)), which in an all-to-all-bound prefill hid a combine under compute it cannot run
beside. With no communication TBO is the step at two half batches (the split GEMMs' cost: smaller GEMMs run
further from peak). The attention over the context is not counted as compute that hides communication (it is affine in the context, which the
simulation's closed-form decode runs need); SGLang overlaps it too, so TBO's gain is understated at long
contexts. With ``a2a`` nccl and no TBO the table is the step model's own, unchanged.

**SM contention** (f, :func:`sm_share`). DeepEP's normal (high-throughput) kernels run on SMs of their own while
they move data, so the other micro-batch's compute runs on the rest: while the all-to-all runs, compute proceeds
at (1 - f) of its rate, f = DeepEP's SMs / the GPU's SMs (the idea of the training model's term,
:mod:`lmcost.cost.train_system`, "SM contention"; DeepEP's figure, not NCCL's channels). A stage of
compute x beside an all-to-all y then lasts st(x, y) = max(y, x + f y): the compute fits under the all-to-all
while x <= (1 - f) y, and otherwise runs f y longer than alone. The SMs: DeepEP's README sets the normal kernels' SM count with
``Buffer.set_num_sms(24)`` in its example (:data:`DEEPEP_HT_SMS`; the DeepSeek-V3 technical report, arXiv
2412.19437, section 3.2.2: "only 20 SMs are sufficient to fully utilize the bandwidths of IB and NVLink"), both
recalled, not re-read in this session. The low-latency kernels hold none while TBO waits on them (f = 0): DeepEP's
README, "a hook-based communication-computation overlapping method, which does not occupy any SM resource";
DeepSeek's profile-data README (Day 4, Feb 2025): in decoding "the all-to-all communication ... does not occupy
GPU SMs: after RDMA messages are issued, all GPU SMs are freed" (recalled). NCCL's all-to-all under TBO keeps
f = 0 (not modelled: SGLang's TBO runs on DeepEP). With f = 0 the formula is the one above without contention.
"""

from __future__ import annotations

import numpy as np

from lmcost.cost.deepep import check_kernel, layer_seconds, step_bytes
from lmcost.cost.engine_step import StepModel, _Table

_EP_ROLES = ("ep.dispatch", "ep.combine", "ep.counts")
#: SMs DeepEP's normal kernels hold (DeepEP README's example, ``Buffer.set_num_sms(24)``; recalled).
DEEPEP_HT_SMS = 24


def sm_share(kernel: str, gpu) -> float:
    """f: the fraction of ``gpu``'s SMs (``efficiency.gemm.sm_count``) the all-to-all ``kernel`` holds while it
    runs under TBO (module docstring): :data:`DEEPEP_HT_SMS` / SMs for ``deepep-ht``, 0 for ``deepep-ll`` (hook-based:
    no SM held while waiting), ``nccl`` (not modelled) or a GPU without an SM count. Raises: nothing."""
    eff = getattr(gpu, "efficiency", None)
    if kernel != "deepep-ht" or eff is None:
        return 0.0
    return min(0.9, DEEPEP_HT_SMS / eff.gemm.sm_count)


def moe_layers(graph) -> int:
    """MoE layers one rank runs (the count of its ``ep.dispatch`` operator; 0 without EP over attention-DP)."""
    return int(sum(t.count for t in graph.templates if t.role == "ep.dispatch"))


def _parts(step: StepModel, xs: np.ndarray) -> tuple:
    """(compute C, communication M under NCCL) at ``xs`` tokens, with the step model's scales."""
    tab = step.tokens
    comp = sum(step.scales[g] * np.interp(xs, tab.xs, v) for g, v in tab.parts.items() if g != "comm")
    comm = step.scales["comm"] * np.interp(xs, tab.xs, tab.parts["comm"])
    return np.asarray(comp, dtype=float), np.asarray(comm, dtype=float)


def _experts(step: StepModel, xs: np.ndarray) -> np.ndarray:
    """The routed experts' part of :func:`_parts`' compute at ``xs`` tokens (groups ``experts.*``)."""
    tab = step.tokens
    return np.asarray(sum(step.scales[g] * np.interp(xs, tab.xs, v) for g, v in tab.parts.items()
                          if g.startswith("experts.")), dtype=float)


class WideEP:
    """DeepEP kernel ``kernel`` (or nccl) and TBO on one rank of ``layout`` (EP over attention-DP) for ``cfg`` on
    ``cluster``. :meth:`apply` returns the step model re-timed; :meth:`at` the figures of one step.
    Raises: LmcostError (a2a) for an unknown kernel."""

    def __init__(self, cfg, layout, cluster, graph, *, kernel: str = "nccl", tbo: bool = False):
        self.kernel, self.tbo = check_kernel(kernel), bool(tbo)
        self.cfg, self.layout, self.cluster = cfg, layout, cluster
        self.layers = moe_layers(graph)
        m = cfg.moe
        self.shape = dict(d=cfg.d_model, k=m.top_k, n_experts=m.n_experts, ep=layout.ep, imbalance=layout.imbalance)

    def comm_s(self, step: StepModel, tokens) -> tuple:
        """(dispatch s, combine s) of a step of ``tokens`` (arrays), summed over the MoE layers; under nccl the
        step model's collectives (counts in the dispatch) split in proportion to their bytes."""
        xs = np.asarray(tokens, dtype=float)
        if self.kernel == "nccl":
            _, comm = _parts(step, xs)
            imb = self.shape["imbalance"]
            return comm / (1 + imb), comm * imb / (1 + imb)
        d, c = layer_seconds(xs, cluster=self.cluster, kernel=self.kernel, **self.shape)
        return self.layers * d, self.layers * c

    def step_s(self, step: StepModel, tokens) -> tuple:
        """(seconds without TBO, seconds as run) of the context-free part of steps of ``tokens`` (array)."""
        xs = np.asarray(tokens, dtype=float)
        comp, _ = _parts(step, xs)
        plain = comp + sum(self.comm_s(step, xs))
        if not self.tbo:
            return plain, plain
        lo, hi = np.floor(xs / 2), np.ceil(xs / 2)
        e0, e1 = _experts(step, lo), _experts(step, hi)
        a0, a1 = _parts(step, lo)[0] - e0, _parts(step, hi)[0] - e1
        (d0, b0), (d1, b1) = self.comm_s(step, lo), self.comm_s(step, hi)
        f, n = sm_share(self.kernel, step.gpu), max(self.layers, 1)

        def st(x, y):  # a compute stage beside an all-to-all: compute at (1 - f) while the all-to-all runs
            return np.maximum(y, x + f * y)
        run = st(a1, d0) + st(e0, d1) + st(e1, b0) + st(a0, b1) * (n - 1) / n + (a0 + b1) / n
        return plain, np.where(xs > 0, run, 0.0)

    def apply(self, step: StepModel) -> StepModel:
        """``step`` with its ``tokens`` table re-timed (module docstring); ``step`` itself under nccl without TBO."""
        if self.kernel == "nccl" and not self.tbo:
            return step
        new = object.__new__(StepModel)
        new.__dict__.update(step.__dict__)
        xs = np.array(step.tokens.xs)
        run = self.step_s(step, xs)[1]
        # per group, the compute's seconds as run (both halves under TBO); the rest of the step, group
        # "wide_ep", is the all-to-all left exposed: each group keeps its power level (lmcost.cost.energy)
        tab, halves = step.tokens, ((np.floor(xs / 2), np.ceil(xs / 2)) if self.tbo else (xs,))
        parts = {g: sum(np.interp(h, tab.xs, v) for h in halves) for g, v in tab.parts.items() if g != "comm"}
        comp = sum(step.scales[g] * np.where(xs > 0, v, 0.0) for g, v in parts.items())
        parts["wide_ep"] = run - comp
        new.tokens = _Table(xs, parts, step.scales)
        new.tokens.ys = [float(v) for v in np.where(xs > 0, run, 0.0)]  # the seconds as run, to the bit
        return new

    def at(self, step: StepModel, tokens: float) -> dict:
        """The JSON figures of a step of ``tokens`` tokens on one rank (bytes and seconds summed over the MoE
        layers; ``overlap_saved_s``: TBO's time saved, split cost included, negative where it costs more)."""
        sh = self.shape
        if self.kernel == "nccl":  # BF16 rows both ways, the combine's at the busiest rank (operators.parallel)
            row = tokens * sh["k"] * sh["d"] * 2.0
            b = dict(dispatch=row, combine=row * sh["imbalance"])
        else:
            b = step_bytes(tokens, d=sh["d"], k=sh["k"], n_experts=sh["n_experts"], ep=self.layout.ep,
                           gpus_per_node=self.cluster.gpus_per_node, imbalance=sh["imbalance"], kernel=self.kernel)
        disp, comb = (float(np.ravel(v)[0]) for v in self.comm_s(step, np.array([tokens])))
        plain, run = (float(np.ravel(v)[0]) for v in self.step_s(step, np.array([tokens])))
        out = dict(tokens_per_step=float(tokens), moe_layers=self.layers,
                   dispatch_bytes=float(b["dispatch"]) * self.layers, combine_bytes=float(b["combine"]) * self.layers,
                   dispatch_s=disp, combine_s=comb)
        if "dispatch_rdma" in b:
            out.update(dispatch_rdma_bytes=float(b["dispatch_rdma"]) * self.layers,
                       combine_rdma_bytes=float(b["combine_rdma"]) * self.layers)
        out["overlap_saved_s"] = plain - run if self.tbo else 0.0
        if self.tbo:
            out["comm_sm_share"] = sm_share(self.kernel, step.gpu)
        return out
