"""Wide expert parallelism in ``lmcost serve``: attention-DP x EP across nodes as SGLang and vLLM run
DeepSeek-V3/R1, Kimi-K2 and Qwen3-MoE: the all-to-all kernel (``a2a``: nccl, deepep-ht, deepep-ll;
:mod:`lmcost.cost.deepep`), the expert load (``expert_load``: uniform, zipf:S, hot:F or a measured max/mean;
:mod:`lmcost.cost.expert_load`), redundant experts (``redundant_experts``, EPLB: memory taken from the KV
cache, balance from :func:`lmcost.cost.expert_load.eplb_imbalance`) and two-batch overlap (``tbo``;
:mod:`lmcost.cost.wide_ep`). Off (the defaults), a run is today's to the byte; on, its JSON carries ``wide_ep``.
"""

from __future__ import annotations

import math

from lmcost.basics.dtypes import bytes_per_element
from lmcost.basics.errors import LmcostError
from lmcost.cost.deepep import check_kernel
from lmcost.cost.expert_load import imbalance_for
from lmcost.cost.optimizers import param_tensors


def active(r) -> bool:
    """Whether ``r`` (a :class:`lmcost.apps.serve.ServeRequest`) asks for any wide-EP option."""
    return r.a2a != "nccl" or r.expert_load is not None or bool(r.redundant_experts) or bool(r.tbo)


def check(r, cfg) -> None:
    """Raises: LmcostError (a2a, expert_load, redundant_experts, tbo) for a bad value, or an option without EP
    over attention-DP (tp 1, ep > 1 dividing dp), or ``expert_load`` beside ``imbalance`` (both set it)."""
    check_kernel(r.a2a)
    n = r.redundant_experts
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 4096:
        raise LmcostError("redundant_experts", f"must be a whole number from 0 to 4,096, got {n!r}", "give 0 or more")
    if not isinstance(r.tbo, bool):
        raise LmcostError("tbo", f"must be true or false, got {r.tbo!r}", "pass `tbo` or leave it out")
    if not active(r):
        return
    field = ("a2a" if r.a2a != "nccl" else "expert_load" if r.expert_load is not None
             else "redundant_experts" if r.redundant_experts else "tbo")
    if cfg.moe is None:
        raise LmcostError(field, f"{cfg.name} has no routed experts", f"drop `{field}`")
    if not (r.tp == 1 and r.ep > 1 and r.dp > 1 and r.dp % r.ep == 0):
        raise LmcostError(field, f"applies to EP over attention-DP (tp 1, ep > 1 dividing dp); got tp={r.tp}, "
                          f"ep={r.ep}, dp={r.dp}", f"use `tp` 1 and `ep` = `dp` (e.g. 32 each), or drop `{field}`")
    if r.expert_load is not None and r.imbalance != 1.0:
        raise LmcostError("expert_load", "sets the EP imbalance, which `imbalance` also gives",
                          "give one of `expert_load` and `imbalance`")


def imbalance(r, cfg) -> tuple:
    """(imbalance, source) the layout runs with: ``r.imbalance`` as given, or the expert-load model's."""
    if r.expert_load is None and not r.redundant_experts:
        return r.imbalance, "given" if r.imbalance != 1.0 else "default (balanced)"
    if r.expert_load is None and r.imbalance != 1.0:
        return r.imbalance, "given (redundant experts charged for memory only)"
    return imbalance_for(r.expert_load or "uniform", cfg.moe.n_experts, cfg.moe.top_k, r.ep, r.redundant_experts)


def redundant_bytes(cfg, layout, weights_dtype: str, n: int) -> float:
    """Bytes of weights one rank holds for its ceil(n / ep) replicas: each an expert's matrices in every MoE
    layer (:func:`lmcost.cost.optimizers.param_tensors`), at ``weights_dtype`` (a quantization recipe's scales
    not counted)."""
    if not n:
        return 0.0
    r = math.ceil(n / layout.ep)
    elems = sum(math.prod(t.shape[1:]) * t.count for t in param_tensors(cfg, layout)[0]
                if t.role.startswith("moe.expert."))
    return float(r * elems * bytes_per_element(weights_dtype))


def attach(r, cfg, precision, settings, step, cluster, source: str, engine_scales: dict | None = None) -> tuple:
    """(step model re-timed, info for :func:`summary`) of a run with wide-EP options on. ``engine_scales``: the
    engine profile's fitted factors the step carries (None under the roofline or calibrated time models); under a
    DeepEP kernel its ``experts.compute`` is replaced by DeepGEMM's (:mod:`lmcost.cost.deepgemm`)."""
    from lmcost.cost.compile import phase_graph
    from lmcost.cost.deepgemm import expert_scales
    from lmcost.cost.wide_ep import WideEP

    scales = expert_scales(step.scales, engine_scales, r.a2a)
    if scales is not step.scales:
        step = step.scaled(scales)
    lay = settings.layout
    wide = WideEP(cfg, lay, cluster, phase_graph(cfg, precision, "decode", settings), kernel=r.a2a, tbo=r.tbo)
    info = dict(model=wide, step=step, imbalance_source=source,
                redundant_bytes=redundant_bytes(cfg, lay, precision.weights, r.redundant_experts),
                redundant_experts=r.redundant_experts)
    return wide.apply(step), info


def summary(info: dict, tokens_per_step: float) -> dict:
    """The run's ``wide_ep`` JSON: kernel, TBO, the imbalance used and its source, redundant experts and their
    memory, and the dispatch/combine bytes and seconds of a step of the run's mean tokens per step
    (:meth:`lmcost.cost.wide_ep.WideEP.at`). ``step.overlap_saved_s`` is TBO's saving per step, negative where
    TBO is a cost: at small batches its two micro-batches' split GEMMs read the weights twice, more than the
    dispatch/combine it hides."""
    wide = info["model"]
    return dict(a2a=wide.kernel, tbo=wide.tbo, ep=wide.layout.ep, imbalance=wide.layout.imbalance,
                imbalance_source=info["imbalance_source"], redundant_experts=info["redundant_experts"],
                redundant_bytes_per_gpu=info["redundant_bytes"],
                step=wide.at(info["step"], tokens_per_step))


def attach_draft(r, step, precision, settings, cluster):
    """``step`` (a :class:`lmcost.cost.spec_decode.SpecStepModel`) with its drafter's MoE layer re-timed as the
    target's are (an MTP module is an MoE layer on the same EP ranks: its dispatch and combine run on the same
    kernel, under the same TBO); unchanged for a dense drafter (EAGLE heads, draft models without experts)."""
    d = getattr(step, "draft", None)
    if d is None or d.cfg.moe is None:
        return step
    from lmcost.cost.compile import phase_graph
    from lmcost.cost.wide_ep import WideEP

    wide = WideEP(d.cfg, settings.layout, cluster, phase_graph(d.cfg, precision, "decode", settings), kernel=r.a2a,
                  tbo=r.tbo)
    step.draft = wide.apply(d)
    return step
