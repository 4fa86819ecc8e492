"""The deployment planner: every parallel layout of a GPU budget x batch sizes, costed per GPU, and the
Pareto front of throughput per GPU against speed per user.

For each layout (:class:`lmcost.operators.parallel.Layout`) that splits the model over exactly ``gpus`` GPUs of
one type, and each batch (global concurrent sequences, a multiple of dp * pp), the point is the serving
point :func:`lmcost.cost.serving.serving_point` gives, the one ``estimate`` reports for that layout, batch,
``isl`` prompt and ``osl`` generated tokens: TTFT (the prefill along the pipeline), TPOT (the mean of the
osl - 1 decode steps, each at its own context), tokens/s per GPU and per user (1 / TPOT), memory per GPU
(the busiest stage's weights, KV cache at the final context, activations and buffers) and the bound of a
decode step. A point is kept when it fits in every GPU's memory and meets the SLOs given (TTFT, TPOT).

Each layout's batches are costed in one vectorised call (every batch equal bit for bit to ``estimate``
of it alone).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from lmcost.apps.setup import Say, quiet, resolve_precision
from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import GPU
from lmcost.operators.parallel import Layout, cluster_for
from lmcost.operators.workload import Settings, check_count, check_positions


@dataclass(frozen=True)
class Plan:
    """The searched points (a DataFrame: one row per layout x batch that fits) and what was asked."""

    points: object          # pandas DataFrame
    front: object           # the Pareto front rows (DataFrame)
    best: dict | None       # the highest tokens/s per GPU meeting the SLOs, or None
    layouts: int            # layouts searched
    searched: int           # layout x batch points evaluated
    skipped: list           # (layout label, reason) of layouts that cannot split the model


def check_top(top: int) -> None:
    """Refuse a number of rows to print outside 1..10,000 (a plan's table, serving or training).

    Raises: LmcostError (top)."""
    if not 1 <= top <= 10000:
        raise LmcostError("top", f"must be from 1 to 10,000, got {top}", "give the rows to print")


def check_train_slos(ttft, tpot) -> None:
    """Refuse serving SLOs given to a training plan (it minimises the step time, it has no TTFT or TPOT).

    Raises: LmcostError (ttft/tpot) if either is given."""
    if ttft or tpot:
        raise LmcostError("ttft/tpot", "are serving SLOs; a training plan minimises the step time",
                          "drop them with `train`")


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(cfg: ArchConfig, gpus: int, gpus_per_node: int, cluster: str | None = None) -> tuple[list, list]:
    """Layouts of exactly ``gpus`` GPUs: tp (within a node) x pp x dp, with ep for a MoE model (inside
    TP: ep dividing tp; over attention-DP: tp = 1, ep = dp). Returns (layouts that split ``cfg``,
    [(label, reason)] of those that do not)."""
    ok, bad = [], []
    for tp in divisors(gpus):
        if tp > gpus_per_node:
            continue
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            eps = [1]
            if cfg.moe is not None:
                eps = sorted(set([e for e in divisors(tp) if e > 1] + ([dp] if tp == 1 and dp > 1 else []) + [1]))
            for ep in eps:
                lay = Layout(tp=tp, pp=pp, ep=ep, dp=dp, cluster=cluster)
                try:
                    lay.check(cfg)
                except LmcostError as e:
                    bad.append((lay.describe(), str(e)))
                    continue
                ok.append(lay)
    return ok, bad


def batches(max_batch: int, per: int = 48) -> np.ndarray:
    """Candidate global batch sizes: 1 .. max_batch, about ``per`` per factor of 16 (geometric), distinct."""
    n = max(2, int(np.ceil(np.log(max_batch) / np.log(16) * per)) + 1)
    return np.unique(np.round(np.geomspace(1, max_batch, n)).astype(np.int64))


def search(cfg: ArchConfig, gpus_of: list[GPU], n_gpus: int, isl: int, osl: int, precision: Precision,
           settings: Settings = Settings(), ttft_s: float | None = None, tpot_s: float | None = None,
           max_batch: int = 4096, cluster: str | None = None, progress=None, density: int = 48) -> Plan:
    """Search layouts x batch sizes on ``n_gpus`` GPUs of each type in ``gpus_of``.

    ``density``: batch sizes per factor of 16 (:func:`batches`).
    Returns: :class:`Plan`. Raises: LmcostError for counts out of range, or when no layout splits the
    model (each layout's reason is kept in ``Plan.skipped``).
    Source of each point: :func:`lmcost.cost.serving.serving_point` (the module docstring).
    """
    import pandas as pd

    from lmcost.cost.serving import serving_point

    check_count("n_gpus", n_gpus, 65536)
    check_count("isl", isl)
    check_count("osl", osl)
    if osl < 2:
        raise LmcostError("osl", "a plan needs a TPOT: at least one token after the first (osl >= 2)",
                          "pass `osl` 2 or more")
    check_positions(cfg, isl + osl, "isl + osl", f"context {isl + osl}")
    check_count("max_batch", max_batch, 1 << 20)
    rows, skipped, n_layouts, searched = [], [], 0, 0
    for gpu in gpus_of:
        node = cluster_for(Layout(cluster=cluster), gpu)
        found, bad = layouts(cfg, n_gpus, node.gpus_per_node, cluster)
        skipped += [(f"{gpu.name} {label}", why) for label, why in bad]
        for lay in found:
            n_layouts += 1
            if progress:
                progress(f"{gpu.name} {lay.describe()}")
            step = lay.dp * lay.pp
            if step > max_batch:  # its smallest batch (one sequence per replica and microbatch) is too big
                skipped.append((f"{gpu.name} {lay.describe()}", f"needs a batch of at least {step}, above --max-batch"))
                n_layouts -= 1
                continue
            glob = batches(max_batch, density)
            glob = np.unique(np.maximum(step, (glob // step) * step))
            searched += len(glob)
            p = serving_point(cfg, gpu, precision, replace(settings, layout=lay), batch=glob, isl=isl, osl=osl)
            rows.append(pd.DataFrame(dict(
                gpu=gpu.name, layout=lay.describe(), tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep, batch=glob,
                ttft_s=p.ttft_s, tpot_s=p.tpot_s, tokens_per_s_per_gpu=p.tokens_per_s_per_gpu,
                tokens_per_s_per_user=p.tokens_per_s_per_user,
                memory_per_gpu_bytes=np.asarray(p.memory.total_bytes, dtype=float), fits=p.fits, bound=p.bound)))
    if not rows:
        reason = skipped[0][1] if skipped else "no GPU given"
        raise LmcostError("n_gpus", f"no layout of {n_gpus} GPUs splits {cfg.name} ({reason})",
                          "try another `n_gpus` count")
    pts = pd.concat(rows, ignore_index=True)
    fit = pts[pts["fits"]].copy()
    meets = np.ones(len(fit), dtype=bool)
    if ttft_s is not None:
        meets &= fit["ttft_s"].to_numpy() <= ttft_s
    if tpot_s is not None:
        meets &= fit["tpot_s"].to_numpy() <= tpot_s
    fit["meets_slo"] = meets
    front = pareto(fit)
    ok = fit[fit["meets_slo"]]
    best = ok.loc[ok["tokens_per_s_per_gpu"].idxmax()].to_dict() if len(ok) else None
    return Plan(points=fit, front=front, best=best, layouts=n_layouts, searched=searched, skipped=skipped)


def pareto(points):
    """Rows of ``points`` no other row beats on both tokens/s per GPU and tokens/s per user (ties kept
    once), sorted by speed per user."""
    if not len(points):
        return points
    p = points.sort_values(["tokens_per_s_per_user", "tokens_per_s_per_gpu"], ascending=[False, False])
    keep, best = [], -np.inf
    for idx, thr in zip(p.index, p["tokens_per_s_per_gpu"].to_numpy()):
        if thr > best:
            keep.append(idx)
            best = thr
    return p.loc[keep]


def search_train(cfg: ArchConfig, gpus_of: list[GPU], n_gpus: int, seq: int, global_batch: int, *,
                 optimizer: str = "adamw", precision: str = "bf16-mixed", model: str = "calibrated",
                 cluster: str | None = None, micro_batches=(1, 2, 4), zeros=(1, 3),
                 recomputes=("none", "full"), progress=None):
    """The fastest training step that fits: every layout of ``n_gpus`` GPUs (tp within a node x pp, dp
    the rest; ep dividing dp with tp = 1 for a MoE model) x ZeRO stage x recompute x micro-batch size,
    each costed by :func:`lmcost.apps.train.train_step` (flash attention: selective recompute saves and
    costs what none does, so it is not searched).

    Returns: (DataFrame of the setups that fit, sorted by step time; [(setup label, reason)] of those that
    could not run). Raises: LmcostError if nothing can run at all.
    """
    import pandas as pd

    from lmcost.apps.train import TrainSetup, train_step

    rows, skipped = [], []
    for gpu in gpus_of:
        node = cluster_for(Layout(cluster=cluster), gpu)
        for tp in divisors(n_gpus):
            if tp > node.gpus_per_node:
                continue
            for pp in divisors(n_gpus // tp):
                dp = n_gpus // (tp * pp)
                eps = [1] + ([e for e in divisors(dp) if e > 1] if cfg.moe is not None and tp == 1 else [])
                for ep in eps:
                    for mb in micro_batches:
                        if global_batch % (dp * mb):
                            continue
                        for zero in zeros:
                            for rc in recomputes:
                                lay = Layout(tp=tp, pp=pp, ep=ep, cluster=cluster, sp=tp > 1)
                                label = f"{gpu.name} {replace(lay, dp=dp).describe()} mb{mb} ZeRO-{zero} {rc}"
                                try:
                                    setup = TrainSetup(gpus=n_gpus, seq=seq, global_batch=global_batch, micro_batch=mb,
                                                       layout=lay, zero=zero, recompute=rc, optimizer=optimizer,
                                                       precision=precision)
                                    if progress:
                                        progress(label)
                                    r = train_step(cfg, gpu, setup, model)
                                except LmcostError as e:
                                    skipped.append((label, str(e)))
                                    continue
                                rows.append(dict(gpu=gpu.name, layout=replace(lay, dp=dp).describe(), tp=tp, pp=pp,
                                                 dp=dp, ep=ep, sp=lay.sp, micro_batch=mb, zero=zero, recompute=rc,
                                                 step_s=r.step_s, tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
                                                 mfu=r.mfu, hfu=r.hfu, memory_per_gpu_bytes=r.memory["total_bytes"],
                                                 fits=r.fits))
    if not rows:
        raise LmcostError("n_gpus", f"no training layout of {n_gpus} GPUs runs {cfg.name} "
                          f"({skipped[0][1] if skipped else 'none searched'})", "try another `n_gpus` or `global_batch`")
    df = pd.DataFrame(rows)
    return df[df.fits].sort_values("step_s").reset_index(drop=True), skipped


#: The columns of a serving plan's front and best point, as ``lmcost plan`` reports them.
FRONT_COLUMNS = ("gpu", "layout", "tp", "pp", "dp", "ep", "batch", "ttft_s", "tpot_s", "tokens_per_s_per_gpu",
                 "tokens_per_s_per_user", "memory_per_gpu_bytes", "bound", "meets_slo")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    """One ``lmcost plan`` run: a serving plan, or with ``train`` a training one.

    ``model``: a shipped name or a path (or a loaded ArchConfig); ``gpu``: the GPU types searched (names,
    paths or GPUs; one named twice is searched once); ``n_gpus``: GPUs of each type; ``cluster``: the node
    or cluster; ``top``: rows of the table shown (1..10,000); ``time_model``: roofline or calibrated (None:
    roofline for serving, calibrated for training).
    Serving: ``isl``/``osl`` tokens per request; ``ttft``/``tpot``: SLOs (s, None: none); ``max_batch``: the
    largest global batch searched; ``dtype`` ... ``kv_dtype``: as :func:`lmcost.apps.setup.resolve_precision`;
    ``fusion``: a fusion spec; ``output``: an HTML file to write the figure to.
    Training (:func:`search_train`): ``seq`` tokens per sequence, ``global_batch`` sequences per step,
    ``optimizer`` and ``precision`` (a training recipe); SLOs are refused.
    """

    model: str | ArchConfig
    gpu: tuple[str | GPU, ...] = ("h100",)
    n_gpus: int = 8
    isl: int = 2048
    osl: int = 256
    ttft: float | None = None
    tpot: float | None = None
    max_batch: int = 4096
    dtype: str = "auto"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    time_model: str | None = None
    fusion: str = "default"
    cluster: str | None = None
    top: int = 15
    output: Path | None = None
    train: bool = False
    seq: int = 4096
    global_batch: int = 64
    optimizer: str = "adamw"
    precision: str = "bf16-mixed"


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingPlan:
    """What :func:`run_plan` found for serving: the model, the time model, the :class:`Plan`, its front
    and best point as plain records (:data:`FRONT_COLUMNS`; best None when no point fits and meets the
    SLOs), and the figure's path if one was written."""

    cfg: ArchConfig
    time_model: str
    plan: Plan
    front: list[dict]
    best: dict | None
    figure: Path | None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainPlan:
    """What :func:`run_plan` found for training: the model, the time model, the setups that fit as plain
    records (fastest first; columns of :func:`search_train`) and [(setup label, reason)] of those that
    could not run."""

    cfg: ArchConfig
    time_model: str
    fits: list[dict]
    skipped: list


def _plain(row) -> dict:
    """A record with numpy scalars as Python numbers."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def run_plan(request: PlanRequest, say: Say = quiet, progress=None) -> ServingPlan | TrainPlan:
    """Load what ``request`` names and search it: :func:`search` (serving; its figure written when
    ``request.output`` is set) or :func:`search_train` (``request.train``). ``progress``: called with
    each layout's label as it is costed (None: nothing).

    Raises: LmcostError for an unknown model, GPU, dtype or fusion, ``top`` out of range, SLOs with
    ``train``, and the errors of :func:`search` and :func:`search_train`.
    """
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.fusion import parse_fusion

    r = request
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    loaded = (g if isinstance(g, GPU) else load_gpu(g) for g in r.gpu)
    hws = list({h.name: h for h in loaded}.values())  # a GPU named twice is searched once
    if r.train:
        check_train_slos(r.ttft, r.tpot)
        check_top(r.top)
        time_model = r.time_model or "calibrated"
        fits, skipped = search_train(cfg, hws, r.n_gpus, r.seq, r.global_batch, optimizer=r.optimizer,
                                     precision=r.precision, model=time_model, cluster=r.cluster, progress=progress)
        return TrainPlan(cfg=cfg, time_model=time_model, fits=[_plain(x) for x in fits.to_dict("records")],
                         skipped=skipped)
    time_model = r.time_model or "roofline"
    precision = resolve_precision(r.dtype, r.weight_dtype, r.kv_dtype, hws, say)
    check_top(r.top)
    # Serving engines run the lm_head on each sequence's last token only (the planner's setting).
    settings = Settings(kernel="flash", mla="auto", logits="last", model=time_model, fusion=parse_fusion(r.fusion))
    result = search(cfg, hws, r.n_gpus, r.isl, r.osl, precision, settings, r.ttft, r.tpot, r.max_batch, r.cluster,
                    progress=progress)
    keep = list(FRONT_COLUMNS)
    front = [_plain(x) for x in result.front[keep].to_dict("records")]
    best = None if result.best is None else _plain({k: v for k, v in result.best.items() if k in keep})
    figure = None
    if r.output is not None:
        from lmcost.output.plots import plan_figure, write_html

        fig = plan_figure(result.points, result.front, f"{cfg.name} on {r.n_gpus} GPUs, ISL {r.isl}, OSL {r.osl}",
                          r.ttft, r.tpot)
        figure = write_html(fig, r.output)
    return ServingPlan(cfg=cfg, time_model=time_model, plan=result, front=front, best=best, figure=figure)
