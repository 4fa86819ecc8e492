"""Run the reference decoder under ``torch.profiler``: prefill and decode steps, a Chrome trace, and
the measured time of every analytic operator.

A run: build the decoder for ``layers`` blocks of the model, check with the analytic memory model
that it fits on the device (refuse clearly if not), warm up, then ``repeats`` times: reset the
cache, prefill ``prompt`` tokens (step scope ``lmcost.prefill.<k>``), and run ``steps`` decode steps
at context t = prompt + 1 (each rewrites the same cache slot, so every step has the same shape;
scope ``lmcost.decode.<k>``). Times per operator are read back from the exported trace
(:mod:`lmcost.profiling.trace`), so a trace read later gives the same table.
"""

from __future__ import annotations

import functools
import os
import tempfile
import time

from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch

from lmcost.model.config import ArchConfig, truncate
from lmcost.model.layer_sharing import reference_decoder_lacks
from lmcost.basics.dtypes import Precision
from lmcost.basics.errors import LmcostError
from lmcost.cost.compile import phase_ops
from lmcost.operators.workload import Settings, check_count, check_positions
from lmcost.cost.memory import footprint
from lmcost.profiling import trace as traces
from lmcost.profiling.control import StepTimes, fast_half, reference_times, set_threads, settle, spread, sync as device_sync
from lmcost.profiling.device import check_device
from lmcost.profiling.decoder import build_decoder
from lmcost.profiling.torch_dtypes import TORCH_DTYPES
from lmcost.profiling.quiet import without_profiler_lines



@dataclass(frozen=True)
class Run:
    """What was profiled: the (truncated) config and the workload. Decode is at context prompt + 1."""

    cfg: ArchConfig
    device: str
    dtype: str
    batch: int
    prompt: int
    steps: int
    repeats: int
    settings: Settings
    threads: int = 0
    sdpa_backend: str = ""

    @property
    def precision(self) -> Precision:
        return Precision(self.dtype, self.dtype, self.dtype)

    def phase_tokens(self, phase: str) -> int:
        """Prompt tokens of prefill; context of the decode step (prompt + 1)."""
        return self.prompt if phase == "prefill" else self.prompt + 1

    def metadata(self) -> dict:
        """What this run was, as plain data (see :func:`run_from_metadata`)."""
        return dict(config=self.cfg.model_dump(), device=self.device, dtype=self.dtype, batch=self.batch,
                    prompt=self.prompt, steps=self.steps, repeats=self.repeats, kernel=self.settings.kernel,
                    mla=self.settings.mla, logits=self.settings.logits, fusion=list(self.settings.fusion),
                    torch=str(torch.__version__), threads=self.threads, sdpa_backend=self.sdpa_backend)

    def ops(self, phase: str):
        return phase_ops(self.cfg, self.precision, phase, self.batch, self.phase_tokens(phase), self.settings)

    def kernels(self, phase: str) -> float:
        """Kernels of one ``phase`` step (a prefill, one decode step): each operator's kernels times its count."""
        return sum(float(op.kernels) * float(op.count) for op in self.ops(phase))


def device_memory(device: str) -> int:
    """Bytes of memory of ``device``: the GPU's total, or the machine's physical memory."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_runnable(cfg: ArchConfig, prompt: int | None = None) -> None:
    """Raises: LmcostError, before anything is built, for a config the reference decoder cannot run from
    token ids (a bare layer stack, ``embeddings: false``), a Gemma 3n/4 mechanism it does not build
    (:func:`lmcost.model.layer_sharing.reference_decoder_lacks`), or a prompt whose decode step (at position
    prompt + 1) is past a learned position table."""
    if not cfg.embeddings:
        raise LmcostError("model", f"{cfg.name} is a bare layer stack (embeddings: false): the reference decoder "
                          "runs from token ids", "profile a model with embeddings, or use estimate/breakdown for it")
    lacks = reference_decoder_lacks(cfg)
    if lacks:
        raise LmcostError("model", f"{cfg.name} has {', '.join(lacks)} (Gemma 3n/4), which the reference decoder "
                          "does not build", "use estimate/breakdown for it")
    if prompt is not None:
        check_positions(cfg, prompt + 1, "prompt + 1", f"the decode step after {prompt} tokens, at position {prompt + 1},")


def check_fit(run: "Run", factor: float = 1.0, tokens: str = "prompt") -> None:
    """Refuse, before allocating, a run whose analytic footprint (times ``factor``: a training step
    also holds gradients and saved activations) exceeds 90% of the device's memory. ``tokens``: the
    caller's field for the run's tokens per sequence (``prompt``; ``seq`` in a breakdown).
    Raises: LmcostError naming the options to shrink (layers, batch and ``tokens``)."""
    need = factor * footprint(run.cfg, run.precision, batch=run.batch, context=run.prompt + 1, ops=run.ops("prefill"),
                              tokens=run.prompt).total_bytes
    # The decoder's prefill builds [s, s] boolean masks (the mask, its check against tril, the device
    # copy and its complement): about 6 bytes per query-key pair at once.
    need += 6 * run.prompt ** 2
    have = device_memory(run.device)
    if need > 0.9 * have:
        raise LmcostError(f"layers/batch/{tokens}", f"the run needs about {need / 1e9:.1f} GB of the device's "
                          f"{have / 1e9:.1f} GB", f"use fewer `layers`, a smaller `batch` or `{tokens}`")


@dataclass
class Measured:
    """What a profiled run measured.

    ``ops``: one row per (phase, operator): phase, name, op_class, measured_time_s (seconds per step,
    all layers, the mean over the *faster half* of the phase's steps, chosen by the sum of their
    operator scopes (:func:`lmcost.profiling.control.fast_half`), so the rows of a phase add up to
    the mean of real steps), spread_pct (100 * (median - reported) / reported over the steps)
    and samples (the steps measured: one prefill per repeat, ``steps`` decode steps per repeat).
    ``per_repeat``: phase, name, repeat (the step's index), time_s. ``steps``: the end-to-end times
    and the run's stability (:class:`lmcost.profiling.control.StepTimes`); None for a trace older
    than them.
    """

    ops: pd.DataFrame
    per_repeat: pd.DataFrame
    steps: StepTimes | None = None


def _timer(device: str):
    """A stopwatch for one step: synchronised ``perf_counter`` on CPU, CUDA events on a GPU. Returns
    (start, stop) where stop() gives the seconds since start()."""
    if device.startswith("cuda"):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def stop():
            end.record()
            end.synchronize()
            return begin.elapsed_time(end) * 1e-3

        return begin.record, stop
    t = [0.0]

    def start():
        t[0] = time.perf_counter()

    return start, lambda: time.perf_counter() - t[0]


def profile(cfg: ArchConfig, *, device: str = "cpu", dtype: str = "fp32", layers: int | None = 2, batch: int = 1,
            prompt: int = 128, steps: int = 8, repeats: int = 3, settings: Settings = Settings(kernel="flash", mla="absorbed"),
            trace_path: str | Path | None = None, progress=None, seed: int = 0,
            threads: int | None = None, baseline: dict[str, float] | None = None,
            settle_s: float = 10.0) -> tuple[Run, Measured, Path]:
    """Profile ``cfg`` (cut to ``layers`` blocks) and return (run, measured, trace path).

    A controlled run (:mod:`lmcost.profiling.control`): torch's intra-op threads are set to ``threads``
    (default one per physical core); the reference kernels are timed before and after (before: read
    until they match ``baseline``, the calibration's, for up to ``settle_s`` seconds); between them,
    ``repeats`` unprofiled repeats measure the wall time of each prefill and each decode step, then
    ``repeats`` profiled repeats measure every operator scope. ``progress``: optional callable
    wrapping an iterable of the 2 * repeats repeats (a progress bar).
    Raises: LmcostError if the device is missing, the thread count is not one, or the run would not
    fit in the device's memory.
    """
    check_device(device)
    for name, v in (("batch", batch), ("prompt", prompt), ("gen", steps), ("repeats", repeats)):
        check_count(name, v)
    if dtype not in TORCH_DTYPES:
        raise LmcostError("dtype", f"{dtype} cannot run in the reference decoder", "use fp32, bf16 or fp16")
    check_runnable(cfg, prompt)
    n_threads = set_threads(threads)
    cfg = truncate(cfg, layers) if layers else cfg
    # The reference decoder fuses nothing (its SiLU and multiply are two kernels): predict it unfused.
    settings = Settings(kernel=settings.kernel, mla="absorbed" if settings.mla == "auto" else settings.mla,
                        logits=settings.logits, fusion=())
    run = Run(cfg, device, dtype, batch, prompt, steps, repeats, settings, threads=n_threads)
    check_fit(run)
    model = build_decoder(cfg, max_batch=batch, max_context=prompt + 1, dtype=TORCH_DTYPES[dtype], device=device,
                          seed=seed, kernel=settings.kernel, mla_mode=settings.mla)
    run = replace(run, sdpa_backend=str(getattr(model, "sdpa_backend", "")))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt + 1), generator=gen).to(device)
    sync = functools.partial(device_sync, device)
    start, stop = _timer(device)
    wall: dict[str, list[float]] = {"prefill": [], "decode": []}

    def step(phase: str, k: int, timed: bool = False):
        # One step scope per prefill and per decode step (decode step i of repeat k is lmcost.decode.<k*steps+i>):
        # each is one consistent sample of its phase.
        for i in range(1 if phase == "prefill" else steps):
            with torch.profiler.record_function(f"lmcost.{phase}.{k * steps + i if phase == 'decode' else k}"):
                if timed:
                    sync()
                    start()
                if phase == "prefill":
                    model(ids[:, :prompt], 0)
                else:
                    model(ids[:, prompt:prompt + 1], prompt)
                if timed:
                    wall[phase].append(stop())
                sync()

    reps = list(range(2 * repeats))
    ticks = iter(progress(reps) if progress else reps)
    with torch.inference_mode():
        model.reset_cache()
        step("prefill", -1)
        step("decode", -1)  # warm-up, outside the profiler
        first, waited = settle(device, baseline, settle_s)
        reference = [first]
        for _ in range(repeats):  # end to end, unprofiled
            next(ticks, None)
            model.reset_cache()
            step("prefill", -2, timed=True)
            step("decode", -2, timed=True)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.startswith("cuda"):
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with without_profiler_lines(), torch.profiler.profile(activities=activities) as prof:
            for k in range(repeats):
                next(ticks, None)
                model.reset_cache()
                step("prefill", k)
                step("decode", k)
        reference.append(reference_times(device))
    for _ in ticks:  # finish the progress bar
        pass
    stats = StepTimes(n_threads, {k: (reference[0][k], reference[1][k]) for k in reference[0]}, waited, wall=wall)
    if trace_path is None:
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        trace_path = tmp
    trace_path = Path(trace_path)
    from lmcost.basics.files import check_name

    check_name(trace_path, "trace")
    if trace_path.is_dir():
        raise LmcostError(str(trace_path), "is a folder", "give a file path for the trace")
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    # Exported and read back under this process's own temporary name, then moved into place: two runs
    # writing the same trace path never read each other's half-written file.
    from lmcost.basics.files import remove_stale, temp_prefix

    remove_stale(trace_path)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(trace_path), suffix=".json", dir=trace_path.parent)
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        traces.add_metadata(tmp, {**run.metadata(), "step_times": stats.to_dict()})
        measured = measured_from_trace(run, traces.load(tmp))
        os.replace(tmp, trace_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return run, measured, trace_path


def run_from_metadata(meta: dict) -> Run:
    """The Run recorded in a trace by :func:`profile`.

    Raises: LmcostError if the record is not what :meth:`Run.metadata` writes (a key missing, a value
    of the wrong type, a count out of range, an end-to-end record :meth:`StepTimes.from_dict` refuses): the
    trace was edited or is not lmcost's.
    """
    from pydantic import ValidationError

    bad = LmcostError("trace", "its lmcost record (the run it was taken of) is malformed",
                      "give the trace as lmcost profile wrote it")
    if not isinstance(meta, dict):
        raise bad
    try:
        for key in ("batch", "prompt", "steps", "repeats"):
            check_count(key, meta[key])
        if meta["device"] not in ("cpu",) and not str(meta["device"]).startswith("cuda") or meta["dtype"] not in TORCH_DTYPES:
            raise bad
        threads, backend = meta.get("threads", 0), meta.get("sdpa_backend", "")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0 or not isinstance(backend, str):
            raise bad
        run = Run(ArchConfig.model_validate(meta["config"]), meta["device"], meta["dtype"], meta["batch"],
                  meta["prompt"], meta["steps"], meta["repeats"],
                  Settings(kernel=meta["kernel"], mla=meta["mla"], logits=meta["logits"],
                           fusion=tuple(meta.get("fusion", ()))),
                  threads=threads, sdpa_backend=backend)
    except (KeyError, TypeError, ValueError, ValidationError, LmcostError):
        raise bad from None
    if "step_times" in meta:  # checked with the rest of the record, before anything is said about the run
        try:
            StepTimes.from_dict(meta["step_times"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LmcostError("trace", "its record of end-to-end times (lmcost.step_times) is malformed",
                              "give the trace as lmcost profile wrote it") from None
    return run


def measured_from_trace(run: Run, trace: dict) -> Measured:
    """What an lmcost trace measured (:class:`Measured`): each operator with its analytic class, from the
    faster half of its phase's steps, with the spread over steps; and the run's end-to-end times where the
    trace records them (``lmcost profile`` since issue 13), completed with the profiled step scopes.

    Raises: LmcostError if the trace's record of its end-to-end times is malformed.
    """
    classes = {op.name: op.op_class.value for ph in ("prefill", "decode") for op in run.ops(ph)}
    meta = trace.get("lmcost") or {}
    # Since controlled runs (issue 13) every decode step has its own step scope; before, one scope held
    # a repeat's steps.
    per_step = {"prefill": 1, "decode": 1 if "step_times" in meta else run.steps}
    rep = traces.scope_repeats(trace, set(classes), per_step)
    rep["op_class"] = rep["name"].map(classes)
    rows = []
    sums: dict[str, list[float]] = {}
    for phase, df in rep.groupby("phase", sort=False):
        totals = df.groupby("repeat")["time_s"].sum()
        sums[phase] = [float(totals[r]) for r in sorted(totals.index)]
        chosen = [totals.index[i] for i in fast_half(list(totals.values))]  # whole steps, the faster half
        for name, g in df.groupby("name", sort=False):
            t = g.set_index("repeat")["time_s"]
            rows.append(dict(phase=phase, name=name, op_class=classes[name],
                             measured_time_s=float(t.reindex(chosen, fill_value=0.0).mean()),
                             spread_pct=100 * spread(t.values), samples=len(t)))
    ops = pd.DataFrame(rows, columns=["phase", "name", "op_class", "measured_time_s", "spread_pct", "samples"])
    steps = None
    if "step_times" in meta:
        try:
            steps = StepTimes.from_dict(meta["step_times"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LmcostError("trace", "its record of end-to-end times (lmcost.step_times) is malformed",
                              "give the trace as lmcost profile wrote it") from None
        scoped = traces.step_times(trace, per_step)
        steps.scoped = {ph: [v for _, v in sorted(d.items())] for ph, d in scoped.items()}
        steps.scope_sum = sums
    return Measured(ops, rep[["phase", "name", "repeat", "time_s"]], steps)
