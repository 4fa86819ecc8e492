"""The deployment planner: every parallel layout of a GPU budget x batch sizes, costed per GPU, and the
Pareto front of throughput per GPU against speed per user.

For each layout (:class:`lmcost.graph.parallel.Layout`) that splits the model over exactly ``gpus`` GPUs of
one type, and each batch (global concurrent sequences, a multiple of dp * pp), one serving point is:

- TTFT: the prefill of ``isl`` tokens of one microbatch along the pipeline, times (2pp - 1)/pp
  (the pp microbatches leave after 2pp - 1 stage times), as ``estimate`` computes it;
- TPOT: one decode step at the mean context isl + osl/2 (attention over a global context is affine in
  it, so that step's time is the mean over the generation; a sliding window makes it an approximation);
- tokens/s per GPU = batch * osl / (TTFT + (osl - 1) * TPOT) / gpus, tokens/s per user = 1 / TPOT;
- memory per GPU (busiest stage): sharded weights + the KV cache and activations, which grow linearly
  with the batch: evaluated exactly at one sequence per GPU and scaled (the chosen point is then
  re-checked by :func:`lmcost.apps.estimate.estimate`, exactly);
- a point is kept when it fits in every GPU's memory and meets the SLOs given (TTFT, TPOT).

Every layout's phases are costed in one vectorised pass over its batch sizes (:func:`lmcost.cost.phases.grid`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import GPU
from lmcost.graph.parallel import Layout, cluster_for, staged
from lmcost.graph.workload import Settings, check_count


@dataclass(frozen=True)
class Plan:
    """The searched points (a DataFrame: one row per layout x batch that fits) and what was asked."""

    points: object          # pandas DataFrame
    front: object           # the Pareto front rows (DataFrame)
    best: dict | None       # the highest tokens/s per GPU meeting the SLOs, or None
    layouts: int            # layouts searched
    searched: int           # layout x batch points evaluated
    skipped: list           # (layout label, reason) of layouts that cannot split the model


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
    Source of the serving model: the module docstring; costs per GPU from :mod:`lmcost.graph.parallel`.
    """
    import pandas as pd

    from lmcost.cost.memory import rank_footprint
    from lmcost.cost.phases import grid, phase_records

    check_count("n_gpus", n_gpus, 65536)
    check_count("isl", isl)
    check_count("osl", osl)
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
            per_gpu = glob // step
            s = Settings(settings.kernel, settings.mla, settings.logits, settings.model, settings.fusion, lay,
                         settings.quant)
            pre = grid(cfg, gpu, precision, "prefill", per_gpu, [isl], s, frame=False)
            dec = grid(cfg, gpu, precision, "decode", per_gpu, [isl + max(osl // 2, 1)], s, frame=False)
            searched += len(glob)
            fill = (2 * lay.pp - 1) / lay.pp
            ttft = pre["time_s"] * fill
            tpot = dec["time_s"]
            total = ttft + (osl - 1) * tpot
            # Memory: exact at one sequence per GPU and at two, the batch's share linear between.
            one, two = (_memory(cfg, precision, lay, phase_records, rank_footprint, m, isl, osl, s) for m in (1, 2))
            mem = one + (two - one) * (per_gpu - 1)
            rows.append(pd.DataFrame(dict(
                gpu=gpu.name, layout=lay.describe(), tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep, batch=glob,
                ttft_s=ttft, tpot_s=tpot, tokens_per_s_per_gpu=glob * osl / total / n_gpus,
                tokens_per_s_per_user=1.0 / tpot, memory_per_gpu_bytes=mem,
                fits=mem <= gpu.memory_bytes, bound=dec["bound"])))
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


def _memory(cfg, precision, lay, phase_records, rank_footprint, per_gpu: int, isl: int, osl: int, s) -> float:
    """Bytes per GPU (busiest stage) at ``per_gpu`` sequences per microbatch, exactly."""
    batch = per_gpu * lay.dp * lay.pp
    pre = phase_records(cfg, precision, "prefill", per_gpu, isl, s)
    acts = [a + w for a, w in zip(pre.col("act_read_bytes"), pre.col("act_write_bytes"))]
    return float(rank_footprint(cfg, precision, lay, batch=batch, context=isl + osl, tokens=isl, act_bytes=acts,
                                comm_bytes=staged(pre), quant=s.quant or cfg.quant)["total_bytes"])


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
