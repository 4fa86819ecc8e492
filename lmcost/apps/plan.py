"""The deployment planner: every parallel layout of a GPU budget x batch sizes, costed per GPU, and the
Pareto front of throughput per GPU against speed per user.

For each layout (:class:`lmcost.operators.parallel.Layout`) that splits the model over exactly ``gpus`` GPUs of
one type, and each batch (global concurrent sequences, a multiple of dp * pp), the point is the serving
point :func:`lmcost.cost.serving.serving_point` gives, the one ``estimate`` reports for that layout, batch,
``isl`` prompt and ``osl`` generated tokens: TTFT (the prefill along the pipeline), TPOT (the mean of the
osl - 1 decode steps, each at its own context), tokens/s per GPU and per user (1 / TPOT), memory per GPU
(the busiest stage's weights, KV cache at the final context, activations and buffers) and the bound of a
decode step. A point is kept when it fits in every GPU's memory and meets the SLOs given (TTFT, TPOT).

The SLOs are judged on the time model of the search: calibrated by default (the GPU's efficiency block,
the expected time; equal to the roofline on a GPU without one), with each point's roofline TTFT and TPOT
beside it as a stated lower bound (``ttft_roofline_s``, ``tpot_roofline_s``); ``time_model`` roofline
judges them on the bound itself.

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


def _per_node(gpu: GPU, n_gpus: int, cluster: str | None) -> int:
    """GPUs per node of ``gpu``'s node (or ``cluster``'s); one GPU alone needs no node (nothing is sent).

    Raises: LmcostError (gpu, cluster) from :func:`cluster_for` when several GPUs have no node to time."""
    if n_gpus == 1 and cluster is None:
        return 1
    return cluster_for(Layout(cluster=cluster), gpu).gpus_per_node


def batches(max_batch: int, per: int = 48) -> np.ndarray:
    """Candidate global batch sizes: 1 .. max_batch, about ``per`` per factor of 16 (geometric), distinct."""
    n = max(2, int(np.ceil(np.log(max_batch) / np.log(16) * per)) + 1)
    return np.unique(np.round(np.geomspace(1, max_batch, n)).astype(np.int64))


def search(cfg: ArchConfig, gpus_of: list[GPU], n_gpus: int, isl: int, osl: int, precision: Precision,
           settings: Settings = Settings(), ttft_s: float | None = None, tpot_s: float | None = None,
           max_batch: int = 4096, cluster: str | None = None, progress=None, density: int = 48) -> Plan:
    """Search layouts x batch sizes on ``n_gpus`` GPUs of each type in ``gpus_of``.

    ``settings.model`` times every point and judges the SLOs (``ttft_s``, ``tpot_s``); the roofline's
    times are kept beside them (``ttft_roofline_s``, ``tpot_roofline_s``: a lower bound, equal under the
    roofline model). ``density``: batch sizes per factor of 16 (:func:`batches`).
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
        found, bad = layouts(cfg, n_gpus, _per_node(gpu, n_gpus, cluster), cluster)
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
            bound_of = p if settings.model == "roofline" else serving_point(
                cfg, gpu, precision, replace(settings, layout=lay, model="roofline"), batch=glob, isl=isl, osl=osl)
            rows.append(pd.DataFrame(dict(
                gpu=gpu.name, layout=lay.describe(), tp=lay.tp, pp=lay.pp, dp=lay.dp, ep=lay.ep, batch=glob,
                ttft_s=p.ttft_s, tpot_s=p.tpot_s, ttft_roofline_s=bound_of.ttft_s, tpot_roofline_s=bound_of.tpot_s,
                tokens_per_s_per_gpu=p.tokens_per_s_per_gpu,
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
                 recomputes=("none", "full"), progress=None, framework: str = "auto",
                 power_limit: float | None = None, attention_kernel: str = "auto", runtime: str = "auto"):
    """The fastest training step that fits: every layout of ``n_gpus`` GPUs (tp within a node x pp, dp
    the rest; ep dividing dp with tp = 1 for a MoE model) x ZeRO stage x recompute x micro-batch size,
    each costed by :func:`lmcost.apps.train.train_step` (flash attention: selective recompute saves and
    costs what none does, so it is not searched). At dp = 1 only the lowest of ``zeros`` is searched:
    ZeRO shards over the dp x cp ranks, and over one rank every stage keeps the same states.
    ``framework``, ``power_limit`` (W), ``attention_kernel``, ``runtime`` and an fp8 ``precision`` recipe
    apply to every layout: each setup gets them, as :class:`lmcost.apps.train.TrainSetup`'s fields.

    Returns: (DataFrame of the setups that fit, sorted by step time; [(setup label, reason)] of those that
    could not run). Raises: LmcostError naming the field for a count out of range (n_gpus, seq,
    global_batch; ``seq`` past a learned position table), an unknown optimizer, precision recipe or framework,
    an fp8 recipe on a GPU without fp8, a power cap out of range, a kernel family or runtime a GPU has no
    figures of, or a model no training step is modelled for
    (checked first: each would skip every layout, and be blamed on ``n_gpus``); LmcostError (n_gpus) if
    nothing can run at all.
    """
    import pandas as pd

    from lmcost.apps.train import TrainSetup, check_trainable, train_step
    from lmcost.apps.train_checks import check_recipe
    from lmcost.cost.optimizers import optimizer as optimizer_named

    check_count("n_gpus", n_gpus, 65536)
    check_count("seq", seq)
    check_count("global_batch", global_batch)
    optimizer_named(optimizer)
    check_recipe(precision)  # the states and fp8 recipes: each point is a train_step
    _check_train_options(gpus_of, precision, framework, power_limit, attention_kernel, runtime)
    check_trainable(cfg)
    check_positions(cfg, seq, "seq")  # before the search: no layout changes it
    rows, skipped = [], []
    for gpu in gpus_of:
        per_node = _per_node(gpu, n_gpus, cluster)
        for tp in divisors(n_gpus):
            if tp > per_node:
                continue
            for pp in divisors(n_gpus // tp):
                dp = n_gpus // (tp * pp)
                eps = [1] + ([e for e in divisors(dp) if e > 1] if cfg.moe is not None and tp == 1 else [])
                for ep in eps:
                    for mb in micro_batches:
                        if global_batch % (dp * mb):
                            continue
                        for zero in (zeros if dp > 1 else sorted(zeros)[:1]):  # (docstring: dp = 1)
                            for rc in recomputes:
                                lay = Layout(tp=tp, pp=pp, ep=ep, cluster=cluster, sp=tp > 1)
                                label = f"{gpu.name} {replace(lay, dp=dp).describe()} mb{mb} ZeRO-{zero} {rc}"
                                try:
                                    setup = TrainSetup(gpus=n_gpus, seq=seq, global_batch=global_batch, micro_batch=mb,
                                                       layout=lay, zero=zero, recompute=rc, optimizer=optimizer,
                                                       precision=precision, framework=framework, power_limit=power_limit,
                                                       attention_kernel=attention_kernel, runtime=runtime)
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


def _check_train_options(gpus_of: list[GPU], precision: str, framework: str, power_limit: float | None,
                         attention_kernel: str, runtime: str) -> None:
    """Refuse, before the search, a training option every layout would be refused for (each would
    otherwise skip every setup, and be blamed on ``n_gpus``), with train's own errors.

    Raises: LmcostError (precision) for an unknown recipe or an fp8 one on a GPU without fp8; (framework)
    for an unknown framework; (power_limit) for a cap out of range or on a GPU without a TDP;
    (efficiency.kernel, runtime) for a family or runtime a GPU has no figures of."""
    from lmcost.apps.setup import select_efficiency
    from lmcost.cost.fp8_training import check_fp8, states_precision
    from lmcost.cost.optimizers import train_precision
    from lmcost.hardware.frameworks import resolve_framework
    from lmcost.hardware.power import power_clock

    train_precision(states_precision(precision))
    resolve_framework(framework, 0)
    for gpu in gpus_of:
        check_fp8(precision, gpu)
        power_clock(power_limit, gpu.tdp_w, 1.0)
        select_efficiency(gpu, attention_kernel, runtime, designs=False)


#: The columns of a serving plan's front and best point, as ``lmcost plan`` reports them.
FRONT_COLUMNS = ("gpu", "layout", "tp", "pp", "dp", "ep", "batch", "ttft_s", "tpot_s", "ttft_roofline_s",
                 "tpot_roofline_s", "tokens_per_s_per_gpu",
                 "tokens_per_s_per_user", "memory_per_gpu_bytes", "bound", "meets_slo")


#: A serving plan's options, with their defaults (None in :class:`PlanRequest`: not given).
SERVING_DEFAULTS = dict(isl=2048, osl=256, ttft=None, tpot=None, max_batch=4096, dtype="auto", weight_dtype=None,
                        kv_dtype=None, fusion="default", output=None)
#: A training plan's options, with their defaults.
TRAIN_DEFAULTS = dict(seq=4096, global_batch=64, optimizer="adamw", precision="bf16-mixed", framework="auto",
                      power_limit=None, attention_kernel="auto", runtime="auto")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanRequest:
    """One ``lmcost plan`` run: a serving plan, or with ``train`` a training one.

    ``model``: a shipped name or a path (or a loaded ArchConfig); ``gpu``: the GPU types searched (names,
    paths or GPUs; one named twice is searched once); ``n_gpus``: GPUs of each type; ``cluster``: the node
    or cluster; ``top``: rows of the table shown (1..10,000); ``time_model``: roofline or calibrated (None:
    calibrated, which judges the SLOs and ranks the setups; equal to the roofline on a GPU without an
    efficiency block).
    Serving (:data:`SERVING_DEFAULTS` where None): ``isl``/``osl`` tokens per request; ``ttft``/``tpot``:
    SLOs (s, None: none); ``max_batch``: the largest global batch searched; ``dtype`` ... ``kv_dtype``: as
    :func:`lmcost.apps.setup.resolve_precision` (``weight_dtype`` replaces the model's own recipe, as in
    ``estimate``); ``fusion``: a fusion spec; ``output``: an HTML file to write the figure to.
    Training (:func:`search_train`; :data:`TRAIN_DEFAULTS` where None): ``seq`` tokens per sequence,
    ``global_batch`` sequences per step, ``optimizer`` and ``precision`` (a training recipe, fp8 ones too),
    ``framework``, ``power_limit`` (W), ``attention_kernel`` and ``runtime``: as :class:`lmcost.apps.train.TrainSetup`,
    for every setup searched.
    Both: ``engine``: auto, torch, vllm, sglang or trtllm (``@version`` optional): every GPU's kernel figures
    are the engine's, and a serving plan's fusions the engine's unless ``fusion`` is given
    (:func:`lmcost.apps.engine_choice.choose_engine`; None: not given).
    An option of the other kind of plan is refused, not ignored.
    """

    model: str | ArchConfig
    gpu: tuple[str | GPU, ...] = ("h100",)
    n_gpus: int = 8
    isl: int | None = None
    osl: int | None = None
    ttft: float | None = None
    tpot: float | None = None
    max_batch: int | None = None
    dtype: str | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    time_model: str | None = None
    fusion: str | None = None
    cluster: str | None = None
    top: int = 15
    output: Path | None = None
    train: bool = False
    seq: int | None = None
    global_batch: int | None = None
    optimizer: str | None = None
    precision: str | None = None
    framework: str | None = None
    power_limit: float | None = None
    attention_kernel: str | None = None
    runtime: str | None = None
    engine: str | None = None

    def given(self, names) -> dict:
        """The options of ``names`` given (not None), their defaults filled in for the rest."""
        return {k: (d if getattr(self, k) is None else getattr(self, k)) for k, d in names.items()}


@dataclass(frozen=True, kw_only=True, slots=True)
class ServingPlan:
    """What :func:`run_plan` found for serving: the model, the time model that judged the SLOs, the
    :class:`Plan`, its front and best point as plain records (:data:`FRONT_COLUMNS`; best None when no
    point fits and meets the SLOs), the figure's path if one was written, the options searched (isl, osl,
    SLOs: :data:`SERVING_DEFAULTS` filled in), ``check``: the ``lmcost estimate`` arguments that cost the
    best point alone (None without one), and ``settings``: the engine (auto where none was given:
    :func:`lmcost.apps.engine_choice.engine_record`), where each GPU's figures came from and the fusions."""

    cfg: ArchConfig
    time_model: str
    plan: Plan
    front: list[dict]
    best: dict | None
    figure: Path | None
    options: dict
    check: tuple[str, ...] | None
    settings: dict | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainPlan:
    """What :func:`run_plan` found for training: the model, the time model, the setups that fit as plain
    records (fastest first; columns of :func:`search_train`), [(setup label, reason)] of those that
    could not run, the options searched (:data:`TRAIN_DEFAULTS` filled in) and ``check``: the ``lmcost
    train`` arguments that cost the fastest setup alone (None when nothing fits); ``settings``: as
    :class:`ServingPlan`'s."""

    cfg: ArchConfig
    time_model: str
    fits: list[dict]
    skipped: list
    options: dict
    check: tuple[str, ...] | None
    settings: dict | None = None


def _plain(row) -> dict:
    """A record with numpy scalars as Python numbers."""
    return {k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}


def _refuse_other(request: PlanRequest) -> None:
    """Refuse an option of the other kind of plan (serving options with ``train``, training ones without).

    Raises: LmcostError naming the first such field (ttft/tpot: SLOs with ``train``)."""
    if request.train:
        check_train_slos(request.ttft, request.tpot)
    other, what = (SERVING_DEFAULTS, "a serving") if request.train else (TRAIN_DEFAULTS, "a training")
    for name in other:
        if getattr(request, name) is not None:
            fix = "drop it, or drop `train`" if request.train else "drop it, or add `train`"
            raise LmcostError(name, f"is an option of {what} plan, and this plan {'trains' if request.train else 'serves'}",
                              fix)


def _typed(request: PlanRequest, cfg: ArchConfig, gpus: list[GPU]) -> tuple[str, dict]:
    """The model and each GPU (by name) as the request named them, for a command that reloads them."""
    model = request.model if isinstance(request.model, str) else cfg.name
    names = {}
    for g, hw in zip(request.gpu, gpus):
        names.setdefault(hw.name, g if isinstance(g, str) else hw.name)
    return model, names


def serving_check(model: str, gpu: str, best: dict, options: dict, precision: Precision, time_model: str,
                  cluster: str | None, engine: str | None = None) -> tuple[str, ...]:
    """The ``lmcost estimate`` arguments that cost ``best`` (a front record) alone, every option that
    changes its numbers included: the layout, batch, prompt and gen, the planner's lm_head setting (last),
    the dtypes in effect, the time model, the fusion, the engine (``engine``, as given) and the cluster. The
    planner's attention kernel (flash), MLA form (auto) and efficiency figures (auto) are estimate's defaults."""
    argv = ["estimate", model, "--gpu", gpu, "--tp", str(best["tp"]), "--pp", str(best["pp"]), "--dp", str(best["dp"]),
            "--ep", str(best["ep"]), "--batch", str(best["batch"]), "--prompt", str(options["isl"]),
            "--gen", str(options["osl"]), "--logits", "last", "--dtype", precision.activations]
    if precision.weights != precision.activations:
        argv += ["--weight-dtype", precision.weights]
    if precision.kv_cache != precision.activations:
        argv += ["--kv-dtype", precision.kv_cache]
    argv += ["--model", time_model]
    if options["fusion"] != "default":
        argv += ["--fuse", options["fusion"]]
    if engine is not None:
        argv += ["--engine", engine]
    if cluster is not None:
        argv += ["--cluster", cluster]
    return tuple(argv)


def train_check(model: str, gpu: str, best: dict, options: dict, n_gpus: int, time_model: str,
                cluster: str | None, engine: str | None = None) -> tuple[str, ...]:
    """The ``lmcost train`` arguments that cost ``best`` (a :func:`search_train` record) alone: the GPUs,
    sequence, global batch, layout, micro-batch, ZeRO stage, recompute, optimizer, precision, time model
    and cluster, and the framework, power cap, kernel family and runtime where not train's defaults (the
    planner's flash attention, 1F1B schedule and causal MFU are train's defaults)."""
    argv = ["train", model, "--gpu", gpu, "--gpus", str(n_gpus), "--seq", str(options["seq"]),
            "--global-batch", str(options["global_batch"]), "--tp", str(best["tp"]), "--pp", str(best["pp"]),
            "--ep", str(best["ep"]), *(["--sp"] if best["sp"] else []), "--micro-batch", str(best["micro_batch"]),
            "--zero", str(best["zero"]), "--recompute", best["recompute"], "--optimizer", options["optimizer"],
            "--precision", options["precision"], "--model", time_model]
    for flag, key in (("--framework", "framework"), ("--kernel", "attention_kernel"), ("--runtime", "runtime")):
        if options.get(key, "auto") != "auto":
            argv += [flag, options[key]]
    if options.get("power_limit") is not None:
        argv += ["--power-limit", f"{options['power_limit']:g}"]
    if engine is not None:
        argv += ["--engine", engine]
    return tuple(argv + (["--cluster", cluster] if cluster is not None else []))


def run_plan(request: PlanRequest, say: Say = quiet, progress=None) -> ServingPlan | TrainPlan:
    """Load what ``request`` names and search it: :func:`search` (serving; its figure written when
    ``request.output`` is set) or :func:`search_train` (``request.train``). ``progress``: called with
    each layout's label as it is costed (None: nothing). Says (``say``) when a GPU has no efficiency block
    under the calibrated model (its times are then the roofline's).

    Raises: LmcostError for an unknown model, GPU, dtype, fusion or engine, an engine a GPU has no profile of,
    ``top`` out of range, an option of the other kind of plan (SLOs, ``isl``, ``output`` ... with ``train``;
    ``seq`` ... without), and the errors of :func:`search` and :func:`search_train`.
    """
    from lmcost.apps.engine_choice import choose_engine, engine_fusion, or_auto, say_figures
    from lmcost.apps.setup import resolve_quant, say_uncalibrated
    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.fusion import parse_fusion

    r = request
    _refuse_other(r)
    check_top(r.top)
    cfg = r.model if isinstance(r.model, ArchConfig) else load_config(r.model)
    loaded = [g if isinstance(g, GPU) else load_gpu(g) for g in r.gpu]
    hws = list({h.name: h for h in loaded}.values())  # a GPU named twice is searched once
    model_name, gpu_names = _typed(r, cfg, loaded)
    time_model = r.time_model or "calibrated"
    chosen = [choose_engine(hw, r.engine, designs=not r.train) for hw in hws]
    hws = [hw for hw, _ in chosen]
    engine = chosen[0][1]
    for hw, choice in chosen:
        say_uncalibrated(hw, time_model, say)
        say_figures(hw, choice, say, time_model == "calibrated")
    fusion = None if r.train else engine_fusion(engine, r.fusion, cfg.norm)
    settings_record = _engine_settings([(hw, or_auto(hw, c)) for hw, c in chosen], fusion)  # auto's without an engine
    # the check command names the engine at the version each GPU's figures are of
    pinned = {hw.name: c.name + (f"@{c.version}" if c.version else "") for hw, c in chosen if c is not None}
    if r.train:
        o = r.given(TRAIN_DEFAULTS)
        fits, skipped = search_train(cfg, hws, r.n_gpus, o["seq"], o["global_batch"], optimizer=o["optimizer"],
                                     precision=o["precision"], model=time_model, cluster=r.cluster, progress=progress,
                                     framework=o["framework"], power_limit=o["power_limit"],
                                     attention_kernel=o["attention_kernel"], runtime=o["runtime"])
        rows = [_plain(x) for x in fits.to_dict("records")]
        check = (train_check(model_name, gpu_names[rows[0]["gpu"]], rows[0], o, r.n_gpus, time_model, r.cluster,
                             pinned.get(rows[0]["gpu"])) if rows else None)
        return TrainPlan(cfg=cfg, time_model=time_model, fits=rows, skipped=skipped, options=o, check=check,
                         settings=settings_record)
    o = r.given(SERVING_DEFAULTS)
    precision = resolve_precision(o["dtype"], o["weight_dtype"], o["kv_dtype"], hws, say)
    cfg, _ = resolve_quant(cfg, None, o["weight_dtype"], say)  # one dtype for every weight, as estimate
    # Serving engines run the lm_head on each sequence's last token only (the planner's setting).
    settings = Settings(kernel="flash", mla="auto", logits="last", model=time_model, fusion=parse_fusion(fusion))
    result = search(cfg, hws, r.n_gpus, o["isl"], o["osl"], precision, settings, o["ttft"], o["tpot"], o["max_batch"],
                    r.cluster, progress=progress)
    keep = list(FRONT_COLUMNS)
    front = [_plain(x) for x in result.front[keep].to_dict("records")]
    best = None if result.best is None else _plain({k: v for k, v in result.best.items() if k in keep})
    figure = None
    if o["output"] is not None:
        from lmcost.output.plots import plan_figure, write_html

        fig = plan_figure(result.points, result.front, f"{cfg.name} on {r.n_gpus} GPUs, ISL {o['isl']}, OSL {o['osl']}",
                          o["ttft"], o["tpot"])
        figure = write_html(fig, o["output"])
    check = (serving_check(model_name, gpu_names[best["gpu"]], best, o, precision, time_model, r.cluster,
                           pinned.get(best["gpu"])) if best is not None else None)
    return ServingPlan(cfg=cfg, time_model=time_model, plan=result, front=front, best=best, figure=figure, options=o,
                       check=check, settings=settings_record)


def _engine_settings(chosen: list, fusion: str | None) -> dict:
    """A plan's JSON ``settings`` (auto's where no engine was given): the engine (its version: each GPU's
    profile's, comma-joined where they differ), where the kernel figures came from (per GPU, ``gpu: figures``,
    where several are searched), and a serving plan's fusions (None under ``train``)."""
    from lmcost.operators.fusion import parse_fusion

    choices = [(hw.name, c) for hw, c in chosen]
    versions = list(dict.fromkeys(c.version for _, c in choices))
    figures = list(dict.fromkeys(c.kernel_figures for _, c in choices))
    return dict(engine=dict(name=choices[0][1].name, version=versions[0] if len(versions) == 1 else
                            ", ".join(f"{n}: {c.version}" for n, c in choices)),
                kernel_figures=figures[0] if len(figures) == 1 else "; ".join(f"{n}: {c.kernel_figures}" for n, c in choices),
                fusion=None if fusion is None else list(parse_fusion(fusion)))
