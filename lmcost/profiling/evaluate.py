"""``validate`` and ``profile`` as library calls: a keyword-only request in, a typed result out, and the
checks they make before running anything.

Errors name the API fields (``trace``, ``csv_out``, ``batches``); the CLI shows each as its flag. Notes go
to ``say`` (one line each, fields in backticks as errors write them), as :mod:`lmcost.apps.setup` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from lmcost.basics.errors import LmcostError


def check_profile_outputs(trace: Path, csv_out: Path) -> None:
    """Refuse, before running, a profile's two output files when they are one path, a folder, or in a
    folder that cannot be written, and a trace not named ``.json``: it is written as plain Chrome trace
    JSON (``--trace x.txt`` or ``x.json.gz`` would hold JSON that ``validate --trace`` and Perfetto take
    by its name for something else).

    Raises: LmcostError (csv_out, trace)."""
    from lmcost.basics.files import check_folder, check_name

    check_name(trace, "trace")
    check_name(csv_out, "csv_out")
    if Path(trace).suffix.lower() != ".json":
        raise LmcostError("trace", f"the trace is written as plain Chrome trace JSON, not {Path(trace).suffix or 'a name without a suffix'}",
                          "give a path ending in .json")
    if trace.resolve() == csv_out.resolve():
        raise LmcostError("csv_out", f"{csv_out} is also the `trace` path", "give the two files different names")
    for path, name in ((trace, "trace"), (csv_out, "csv_out")):
        if path.is_dir():
            raise LmcostError(name, f"{path} is a folder", "give a file path")
        check_folder(path.parent, name, "give a file path inside a folder")


def check_sharded(device: str, dtype: str, trace) -> None:
    """Refuse a sharded (gloo) check off CPU, outside fp32, or against a trace.

    Raises: LmcostError (tp/pp/ep/dp)."""
    if device != "cpu" or dtype != "fp32" or trace is not None:
        raise LmcostError("tp/pp/ep/dp", "the sharded check runs on CPU in fp32 with gloo (no NCCL run here)",
                          "use `device` cpu `dtype` fp32 and no `trace`")


def check_options(request: "ValidateRequest") -> None:
    """Refuse options a validate run would ignore: ``fusion`` without a ``trace`` (a run of the reference
    decoder fuses what it fuses, and records it), and, in the sharded check (tp/pp/ep/dp), a ``gpu`` to
    predict with, ``fusion`` or ``recalibrate`` (it compares logits and collectives, not times).

    Raises: LmcostError (fusion, validate.gpu, refresh)."""
    r = request
    if r.fusion != "none" and r.trace is None:
        raise LmcostError("fusion", "says what a foreign trace's runtime fused, and no `trace` is given",
                          "drop it, or add the `trace` it describes")
    if r.sharded:
        for field, given in (("validate.gpu", r.gpu is not None), ("refresh", r.recalibrate)):
            if given:
                raise LmcostError(field, "the sharded check (`tp`/`pp`/`ep`/`dp`) compares logits and collectives, "
                                  "not times: nothing is predicted with a GPU", "drop it, or drop the layout")


def check_request(request: "ValidateRequest") -> None:
    """Refuse, before anything slow (torch's import, the calibration, a run), a request whose own values
    are wrong: options it would ignore (:func:`check_options`), a batch size, prompt, number of decode
    steps or repeats out of range, a batch size given twice, and several models or batch sizes against one
    trace. (:func:`lmcost.profiling.validate.preflight` checks the rest, models loaded.)

    Raises: LmcostError (those of check_options, batch, prompt, gen, repeats, batches, batches/MODELS)."""
    from lmcost.operators.workload import check_count

    r = request
    check_options(r)
    for name, v in (*(("batch", b) for b in r.batches), ("prompt", r.prompt), ("gen", r.steps), ("repeats", r.repeats)):
        check_count(name, v)
    if len(set(r.batches)) != len(r.batches):
        raise LmcostError("batches", "a batch size is repeated", "give each once")
    if r.trace is not None:
        check_trace_run(len(r.models), len(r.batches))


def check_trace_run(n_models: int, n_batches: int) -> None:
    """Refuse several models or batch sizes against one trace (it holds one run).

    Raises: LmcostError (batches/MODELS)."""
    if n_batches != 1 or n_models != 1:
        raise LmcostError("batches/MODELS", "a trace holds one run", "give the one model and batch size it was taken at")


def check_trace_gpu(gpu) -> None:
    """Refuse a trace compared without the GPU it was taken on (nothing to calibrate: the run is not here).

    Raises: LmcostError (validate.gpu) if ``gpu`` is None."""
    if gpu is None:
        raise LmcostError("validate.gpu", "missing", "name the GPU (or calibrated YAML) the trace was taken on")


Say = Callable[[str], None]


def quiet(line: str) -> None:
    """The default ``say``: notes are dropped."""


def note_layers(cfg, layers: int | None, say: Say = quiet) -> None:
    """Say so when ``layers`` asks for more blocks than the model has (all of them are kept)."""
    from lmcost.model.config import layers_note

    note = layers_note(cfg, layers)
    if note:
        say(note)


def note_threads(threads: int | None, say: Say = quiet) -> None:
    """Say so when ``threads`` asks for more intra-op threads than this process has physical cores."""
    from lmcost.profiling.control import physical_cores

    cores = physical_cores()
    if threads is not None and threads > cores:
        say(f"note: `threads` {threads} is more than the {cores} physical core(s) here: threads will share cores "
            "and times will vary")


@dataclass(frozen=True, kw_only=True, slots=True)
class ValidateRequest:
    """What ``validate`` compares: ``models`` (shipped names, YAML or config.json paths) run on the reference
    decoder on ``device`` in ``dtype``, truncated to ``layers`` blocks (0: all), at each of ``batches``, a
    ``prompt`` of tokens and ``steps`` decode steps, ``repeats`` times, under ``kernel`` and ``mla``;
    predicted with ``gpu`` (a GPU name or YAML; None: the local device's cached calibration, measured again
    with ``recalibrate``). With ``trace``, the run a Chrome trace holds instead of running one (``fusion``:
    what a foreign trace's runtime fused). Reports go to ``report_dir``. ``threads``: torch's intra-op
    threads; ``retries``: measurements again while the machine looks busy. ``mla`` None: absorbed (and
    refused, given, on a model without MLA). Options a run would ignore are refused (:func:`check_options`)."""

    models: tuple[str, ...]
    gpu: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    layers: int = 2
    batches: tuple[int, ...] = (1,)
    prompt: int = 128
    steps: int = 8
    repeats: int = 10
    kernel: str = "flash"
    mla: str | None = None
    trace: Path | None = None
    fusion: str = "none"
    report_dir: Path = Path("reports")
    recalibrate: bool = False
    threads: int | None = None
    retries: int = 2
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def sharded(self) -> bool:
        """Whether this is the distributed check (:func:`validate_sharded`): any of tp, pp, ep, dp above 1."""
        return (self.tp, self.pp, self.ep, self.dp) != (1, 1, 1, 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class Validation:
    """What :func:`validate` found. ``gpu``: the GPU predicted with. A foreign trace (no lmcost scopes) gives
    ``foreign`` (a :class:`lmcost.profiling.foreign.Comparison`) and nothing else; otherwise ``results``
    (per-class rows of every run, with model and batch), ``per_run`` ([(run, per-class DataFrame,
    measured)]) and ``report`` (the markdown written). ``trace_note``: the line saying a trace's recorded
    run was used, or None."""

    gpu: object
    trace_note: str | None = None
    foreign: object = None
    results: list = field(default_factory=list)
    per_run: list = field(default_factory=list)
    report: Path | None = None


def validate(request: ValidateRequest, say: Say = quiet, progress=None, stage=None) -> Validation:
    """Predicted (roofline and calibrated) against measured time per operator class and phase: run each
    model and batch of ``request`` on the reference decoder (or read its ``trace``), compare, and write the
    markdown report and per-operator CSVs in ``report_dir``. Everything is refused before anything runs
    (:func:`check_request`, the models and the trace read first, then
    :func:`lmcost.profiling.validate.preflight`). ``say`` hears the notes (calibration, threads, retries);
    ``progress(iterable, batch)`` wraps each run's steps (a progress bar); ``stage(text)``: a context
    manager around the slow part (torch's import, preflight, the calibration and the runs, or the trace's
    comparison), entered once the request's own values, the models and the trace have been read (a status
    line then follows only a request that can run).

    Returns: :class:`Validation`.
    Raises: LmcostError (batches/MODELS, validate.gpu, report_dir, mla, those of :func:`check_request` and of
    preflight, the calibration cache, the trace and the GPU).
    """
    import contextlib

    from lmcost.hardware.gpu import load_gpu
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import check_mla
    from lmcost.profiling import trace as traces

    r = request
    check_request(r)
    cfgs = [load_config(m) for m in r.models]
    for cfg in cfgs:
        check_mla(cfg, r.mla)
    data, hw = None, None
    if r.trace is not None:  # read, and its GPU loaded, before the status line: a malformed one is one line
        hw = load_gpu(r.gpu) if r.gpu is not None else None
        check_trace_gpu(hw)
        data = traces.load(r.trace)
    with (stage or (lambda _: contextlib.nullcontext()))("validating: preflight and calibration"):
        return _validate(r, cfgs, data, hw, say, progress)


def _validate(r: ValidateRequest, cfgs, data, hw, say: Say, progress) -> Validation:
    """:func:`validate` once its request, models and trace (``data``, read with its GPU ``hw``) are in."""
    from lmcost.basics.files import check_folder
    from lmcost.hardware.gpu import load_gpu
    from lmcost.operators.fusion import parse_fusion
    from lmcost.operators.workload import Settings
    from lmcost.profiling import trace as traces
    from lmcost.profiling.profile import measured_from_trace
    from lmcost.profiling.validate import (calibration_notes, foreign_trace, preflight, profile_model, resolve_trace,
                                           trace_path)

    batches = list(r.batches)
    fusion = parse_fusion(r.fusion)
    layers = r.layers or None
    threads = r.threads
    if r.trace is not None:  # a profiled run says so itself
        note_layers(cfgs[0], r.layers, say)
    settings = Settings(kernel=r.kernel, mla=r.mla or "absorbed")
    if r.trace is None:  # refuse before running anything: every model and batch must be valid and fit
        preflight(cfgs, batches, device=r.device, dtype=r.dtype, layers=layers, prompt=r.prompt, steps=r.steps,
                  repeats=r.repeats, settings=Settings(kernel=r.kernel, mla="absorbed"))
        from lmcost.profiling.cache import cached_calibration
        from lmcost.profiling.control import set_threads

        if threads is None and r.device == "cpu":  # the default count: one thread where the cores are taken
            from lmcost.profiling.cache import busy
            from lmcost.profiling.control import physical_cores

            if load := busy(physical_cores()):
                threads = 1
                say(f"note: the machine is busy ({load}): calibrating and running at 1 thread; pass `threads` "
                    "to choose")
        threads = set_threads(threads)  # the calibration and every run use the same count
        note_threads(threads, say)
        hw = load_gpu(r.gpu) if r.gpu is not None else cached_calibration(r.device, r.recalibrate, say=say, threads=threads)
        check_folder(r.report_dir, "report_dir")
        if r.gpu is not None:
            for line in calibration_notes(hw, r.device, r.dtype, threads):
                say(line)
        if r.device == "cpu" and hw.vendor != "measured":
            say(f"note: predicting a CPU run with {hw.name}'s datasheet figures; omit `gpu` to calibrate this CPU")
        runs = []
        for cfg in cfgs:
            for b in batches:
                note_layers(cfg, layers, say)  # before each run, as its progress bar starts
                wrap = (lambda it, b=b: progress(it, b)) if progress is not None else None
                runs.append(profile_model(cfg, device=r.device, dtype=r.dtype, layers=layers, batch=b, prompt=r.prompt,
                                          steps=r.steps, repeats=r.repeats, settings=settings,
                                          trace_path=trace_path(r.report_dir, cfg, b), progress=wrap, threads=threads,
                                          retries=r.retries, gpu=hw, say=say)[:2])
        return _compared(runs, hw, r, cfgs, None)
    run, data, note = resolve_trace(r.trace, cfgs[0], device=r.device, dtype=r.dtype, layers=layers,
                                    batch=batches[0], prompt=r.prompt, steps=r.steps, repeats=r.repeats,
                                    settings=settings, fusion=fusion, data=data)
    if not traces.has_scopes(data):
        return Validation(gpu=hw, trace_note=note, foreign=foreign_trace(run, hw, data))
    check_folder(r.report_dir, "report_dir")
    return _compared([(run, measured_from_trace(run, data))], hw, r, cfgs, note)


def _compared(runs, hw, r: ValidateRequest, cfgs, note) -> Validation:
    """:func:`lmcost.profiling.validate.validate_runs` of ``runs`` as a :class:`Validation`."""
    from lmcost.profiling.validate import validate_runs

    results, per_run, md = validate_runs(runs, hw, r.report_dir, "+".join(c.name for c in cfgs),
                                         write_ops=r.trace is None)
    return Validation(gpu=hw, trace_note=note, results=results, per_run=per_run, report=md)


@dataclass(frozen=True, kw_only=True, slots=True)
class Sharded:
    """What :func:`validate_sharded` found: one row per model and batch (model, batch, layout and
    :func:`lmcost.profiling.distributed.compare`'s fields), and ``ok``: every run matched."""

    results: list
    ok: bool


def validate_sharded(request: ValidateRequest, stage=None) -> Sharded:
    """validate's distributed check: each model and batch of ``request`` run on its tp x pp x ep x dp
    layout over gloo processes, its logits against one process's and its collectives against lmcost's
    communication operators (:func:`lmcost.profiling.distributed.compare`). ``stage(text)`` is a context
    manager around each run (a status line).

    Raises: LmcostError (tp/pp/ep/dp) off CPU, outside fp32 or with a trace; those of :func:`check_options`
    and of the layout."""
    import contextlib

    from lmcost.model.config import truncate
    from lmcost.model.loading import load_config
    from lmcost.operators.parallel import Layout
    from lmcost.profiling.distributed import compare

    r = request
    check_sharded(r.device, r.dtype, r.trace)
    check_options(r)
    layout = Layout(tp=r.tp, pp=r.pp, ep=r.ep, dp=r.dp)
    results, ok = [], True
    for m in r.models:
        cfg = load_config(m)
        cfg = truncate(cfg, r.layers) if r.layers else cfg
        for b in r.batches:
            with (stage or (lambda _: contextlib.nullcontext()))(f"{cfg.name}: {layout.describe()}, batch {b}, gloo"):
                res = compare(cfg, layout, batch=b, prompt=r.prompt, gen=r.steps)
            ok &= res["match"] and res["logits_ok"]
            results.append(dict(model=cfg.name, batch=b, layout=layout.describe(), **res))
    return Sharded(results=results, ok=ok)


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileRequest:
    """What ``profile`` runs: ``model`` on the reference decoder on ``device`` in ``dtype``, ``layers``
    blocks (0: all), ``batch`` sequences of ``prompt`` tokens and ``steps`` decode steps, ``repeats`` times,
    under ``kernel`` and ``mla``, with torch's ``threads``; the Chrome trace goes to ``trace`` and the
    per-operator measured times (CSV) to ``csv_out``. ``mla`` None: absorbed (and refused, given, on a
    model without MLA)."""

    model: str
    device: str = "cpu"
    dtype: str = "fp32"
    layers: int = 2
    batch: int = 1
    prompt: int = 128
    steps: int = 8
    repeats: int = 10
    kernel: str = "flash"
    mla: str | None = None
    trace: Path = Path("trace.json")
    csv_out: Path = Path("ops_measured.csv")
    threads: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Profiled:
    """What :func:`profile` measured: the ``run``, its :class:`lmcost.profiling.profile.Measured` and the
    paths of the trace and the CSV written."""

    run: object
    measured: object
    trace: Path
    csv_out: Path


def profile(request: ProfileRequest, say: Say = quiet, progress=None) -> Profiled:
    """Run ``request`` under torch.profiler (:func:`lmcost.profiling.validate.profile_model`) and write its
    Chrome trace and per-operator CSV. ``say`` hears the notes; ``progress(iterable, batch)`` wraps the steps.

    Raises: LmcostError (csv_out, trace) for outputs that cannot be written; those of the run."""
    from lmcost.basics.files import write_text
    from lmcost.model.loading import load_config
    from lmcost.operators.workload import Settings, check_mla
    from lmcost.profiling.validate import profile_model

    r = request
    check_profile_outputs(r.trace, r.csv_out)
    note_threads(r.threads, say)
    cfg = load_config(r.model)
    check_mla(cfg, r.mla)
    note_layers(cfg, r.layers or None, say)
    wrap = (lambda it: progress(it, r.batch)) if progress is not None else None
    run, measured, path = profile_model(cfg, device=r.device, dtype=r.dtype, layers=r.layers or None, batch=r.batch,
                                        prompt=r.prompt, steps=r.steps, repeats=r.repeats,
                                        settings=Settings(kernel=r.kernel, mla=r.mla or "absorbed"), trace_path=r.trace,
                                        progress=wrap, threads=r.threads, say=say)
    write_text(r.csv_out, measured.ops.to_csv(index=False))
    return Profiled(run=run, measured=measured, trace=path, csv_out=r.csv_out)
