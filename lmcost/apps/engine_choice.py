"""``--engine``: which serving engine's kernels a run is costed with, resolved once for every command
(estimate, plan, report, train, op).

An engine choice does three things (:mod:`lmcost.hardware.engine_kernels` holds the per-engine data):
the GPU's efficiency figures become the engine's profile (:meth:`Efficiency.with_engine`, fitted on that
engine's measured kernel rows); the decoder runs the engine's fusions unless ``fusion`` is given; and
``op rmsnorm`` costs the engine's norm kernel (fused residual add + RMSNorm). ``auto`` (the default) and
``torch`` keep the GPU's base figures and lmcost's default fusion, except that auto times norms, activations
and RoPE as the default serving engine's designs (:data:`lmcost.hardware.engine_memory.AUTO_STACK`; not for
training); ``auto`` says (one note) where the base figures are not the public kernel table's fit, and records
the designs in ``kernel_figures``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcost.apps.setup import Say, quiet, select_efficiency
from lmcost.basics.errors import LmcostError
from lmcost.hardware.engine_kernels import EngineKernels, engine_kernels, parse_engine
from lmcost.hardware.gpu import GPU


@dataclass(frozen=True)
class EngineChoice:
    """The engine a run is costed under: ``name`` (auto, torch, vllm, sglang, trtllm), ``version`` (the
    profile's, None for auto and torch), ``kernel_figures`` (where the efficiency figures came from, in
    words: ``public-kernels.csv fit``, ``vllm 0.24.0 profile (engine-kernels.csv)``, ``engines pooled``)
    and ``kernels`` (the engine's kernel choices, None for auto and torch)."""

    name: str
    version: str | None
    kernel_figures: str
    kernels: EngineKernels | None = None

    @property
    def label(self) -> str:
        """``vllm 0.24.0``, ``torch``, ``auto``."""
        return f"{self.name} {self.version}" if self.version else self.name

    @property
    def fusion(self) -> str | None:
        """The engine's fusions as a ``fusion`` spec (``silu_mul,add_norm,...``), None for auto and torch."""
        return None if self.kernels is None else ",".join(self.kernels.fusions)

    def record(self) -> dict:
        """What a JSON's ``settings`` records: ``engine`` {name, version} and ``kernel_figures``."""
        return dict(engine=dict(name=self.name, version=self.version), kernel_figures=self.kernel_figures)


def base_figures(gpu: GPU) -> str:
    """Where ``gpu``'s efficiency figures came from, in words: :func:`block_figures`, and where norms, activations
    and RoPE are timed as a serving engine's designs under auto (``Efficiency.memory_designs``), that too:
    ``public-kernels.csv fit; norms, activations, RoPE: vllm's kernel designs (engine-memory-kernels.yaml)``."""
    e = gpu.efficiency
    said = block_figures(gpu)
    if e is not None and e.memory_designs and not e.engine:
        said += f"; norms, activations, RoPE: {e.memory_designs}'s kernel designs (engine-memory-kernels.yaml)"
    return said


def block_figures(gpu: GPU) -> str:
    """Where ``gpu``'s base efficiency block came from, in words, from its ``fit`` record: ``public-kernels.csv
    fit``, ``engines pooled (engine-kernels.csv)``, ``<table> fit``, ``lmcost calibrate`` (a block with no
    fit table, measured on a local device), or ``roofline`` (no block: calibrated times are the roofline)."""
    e = gpu.efficiency
    if e is None:
        return "roofline (no efficiency block)"
    fit = e.fit or {}
    said = " ".join(str(v) for v in fit.values() if isinstance(v, str))
    if "pooled" in said:  # lmcost fit --engines writes table: "engine-kernels.csv, engines pooled"
        table = str(fit.get("table", "engine-kernels.csv")).split(",")[0].strip()
        return f"engines pooled ({table})"
    if fit.get("table"):
        return f"{fit['table']} fit"
    return "lmcost calibrate" if e.conditions else "the GPU file's efficiency block"


def choose_engine(gpu: GPU, engine: str | None, kernel: str | None = None,
                  runtime: str | None = None, designs: bool = True) -> tuple[GPU, EngineChoice | None]:
    """``gpu`` with the efficiency figures of ``engine`` and the kernel family and runtime chosen
    (:func:`lmcost.apps.setup.select_efficiency`; ``designs`` False for training, whose auto keeps the block's
    norm and activation figures), and the :class:`EngineChoice` (None when ``engine`` is None: not given,
    recorded nowhere).

    ``engine``: auto, torch, vllm, sglang, trtllm, optionally ``name@version`` (:func:`parse_engine`).
    Raises: LmcostError (engine) for an unknown engine or a bad version text; for a serving engine on a GPU
    without an efficiency block or without that engine's profile, or at another version than its profile's
    (listing what the GPU has); the errors of :func:`select_efficiency`.
    """
    parsed = parse_engine(engine)
    name, version = parsed if parsed is not None else ("auto", None)
    if name in ("auto", "torch"):
        hw = select_efficiency(gpu, kernel, runtime, name, designs)
        return hw, None if parsed is None else EngineChoice(name, None, base_figures(hw))
    have = sorted(gpu.efficiency.engines) if gpu.efficiency is not None else []
    profile = gpu.efficiency.engines.get(name) if have else None
    if profile is None:
        what = "no efficiency block" if gpu.efficiency is None else "no engine profiles" if not have else \
            f"profiles of {', '.join(gpu.efficiency.engine_names())} only"
        raise LmcostError("engine", f"{gpu.name} has no {name} profile ({what})",
                          f"use one of: auto, torch{''.join(', ' + n for n in have)}, or a GPU with a {name} profile "
                          "(lmcost gpus list, column fitted)")
    if version is not None and version != profile.version:
        raise LmcostError("engine", f"{gpu.name}'s {name} profile is of {name} {profile.version}, not {version}",
                          f"use {name}@{profile.version}, or {name} alone")
    hw = select_efficiency(gpu, kernel, runtime, f"{name}@{profile.version}")
    table = profile.fit.get("table", "engine-kernels.csv")
    return hw, EngineChoice(name, profile.version, f"{name} {profile.version} profile ({table})", engine_kernels(name))


def engine_record(gpu: GPU, choice: EngineChoice | None) -> dict:
    """What a JSON's ``settings`` records of the engine, given or not (estimate, report, plan, train, op):
    ``choice``'s :meth:`EngineChoice.record`, or, where no engine was given (``choice`` None), the record
    ``engine`` auto writes, the default it is (``choose_engine`` costs both alike: ``gpu``'s own figures,
    lmcost's default fusion): ``engine`` {name: auto, version: None} and ``kernel_figures`` (:func:`base_figures`
    of ``gpu``, the GPU with its figures chosen). So every record says whose kernel figures timed it."""
    return or_auto(gpu, choice).record()


def or_auto(gpu: GPU, choice: EngineChoice | None) -> EngineChoice:
    """``choice``, or where no engine was given (None) the choice ``engine`` auto makes on ``gpu`` (see
    :func:`engine_record`)."""
    return choice if choice is not None else EngineChoice("auto", None, base_figures(gpu))


def say_figures(gpu: GPU, choice: EngineChoice | None, say: Say = quiet, calibrated: bool = True) -> None:
    """Under auto (``choice`` None or auto) and ``calibrated``, one note to ``say`` when ``gpu``'s figures are
    not the public kernel table's fit (:func:`base_figures`: a GPU costed on the engines' pooled rows, or on
    a calibrate run's); nothing on a GPU without an efficiency block (:func:`lmcost.apps.setup.say_uncalibrated`
    says that). Under a serving engine with a runtime other than auto, one note that the runtime's figures
    replace the engine's kernel designs for norms, activations and RoPE (``Efficiency.kind_figures`` takes the
    selected runtime's figures first)."""
    runtime = gpu.efficiency.runtime if gpu.efficiency is not None else "auto"
    if calibrated and choice is not None and choice.name not in ("auto", "torch") and runtime != "auto":
        say(f"note: --runtime {runtime}: {runtime}'s figures replace {choice.label}'s kernel designs for norms, "
            "activations and RoPE (the engine's GEMM and attention figures stay)")
    if choice is not None and choice.name != "auto":
        return
    figures = block_figures(gpu)
    if calibrated and gpu.efficiency is not None and figures != "public-kernels.csv fit":
        say(f"note: {gpu.name}'s kernel figures: {figures}, not a fit of public kernel timings (`engine` to choose)")


def engine_fusion(choice: EngineChoice | None, fusion: str | None, norm: str = "rmsnorm") -> str:
    """The fusion spec a run uses: ``fusion`` when given (an explicit choice wins), else the engine's
    (:attr:`EngineChoice.fusion`), else ``default`` (silu_mul, lmcost's numbers without an engine).
    ``norm``: the model's norm (rmsnorm, layernorm): an engine whose kernel for that norm is not a fused
    add + norm (:attr:`EngineKernels.layernorm`: none of the three fuses LayerNorm) runs no add_norm."""
    if fusion is not None:
        return fusion
    if choice is None or choice.kernels is None:
        return "default"
    fused_norm = getattr(choice.kernels, norm, "rmsnorm").startswith("fused_add_")
    return ",".join(f for f in choice.kernels.fusions if f != "add_norm" or fused_norm)
