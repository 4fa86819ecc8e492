"""``lmcost kv`` as one call: a model, a GPU and options in (:class:`KvRequest`), the comparison of attention
variants out (:class:`KvComparison`, the table of :func:`lmcost.apps.kv.compare`), its figure written on request.

The figure's "free memory" line is the GPU's memory less the weights, stored in the run's recipe or dtype
(:func:`free_memory`): the memory the KV cache and activations may take.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lmcost.apps.kv import compare, curves
from lmcost.apps.setup import Say, check_quant, quiet, resolve_precision, resolve_quant
from lmcost.basics.dtypes import Precision
from lmcost.cost.memory import weight_memory
from lmcost.operators.workload import Settings
from lmcost.hardware.gpu import GPU, load_gpu
from lmcost.model.config import ArchConfig
from lmcost.model.loading import load_config
from lmcost.model.quant import effective
from lmcost.model.variants import parse_labels, with_window


@dataclass(frozen=True, kw_only=True, slots=True)
class KvRequest:
    """One comparison of attention variants.

    ``model``/``gpu``: a shipped name or a path (or a loaded ArchConfig); ``variants``: comma-separated
    labels (None: the defaults of :func:`lmcost.model.variants.default_labels`); ``contexts``: tokens t
    (one given twice is compared once); ``window``/``local_global``: a sliding window (tokens) and an
    ``L:G`` layer pattern put on every variant; ``block_size``: tokens per paged-cache block; ``dtype``
    ... ``quant``: as :func:`lmcost.apps.setup.resolve_precision` and
    :func:`~lmcost.apps.setup.resolve_quant`; ``attention``: flash or naive; ``plot``: an HTML file to write the figure to.
    """

    model: str | ArchConfig
    gpu: str = "h100"
    variants: str | None = None
    contexts: tuple[int, ...] = (4096, 32768, 131072)
    batch: int = 1
    window: int | None = None
    local_global: str | None = None
    block_size: int = 16
    dtype: str = "auto"
    weight_dtype: str | None = None
    quant: str | None = None
    kv_dtype: str | None = None
    attention: str = "flash"
    plot: Path | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class KvComparison:
    """What :func:`compare_variants` found: the model as compared (window applied, recipe resolved), the
    GPU, the precision and recipe, the table (one row per variant, MLA mode and context; columns of
    :func:`lmcost.apps.kv.compare`), and the figure's path if one was written."""

    cfg: ArchConfig
    gpu: GPU
    precision: Precision
    quant: str | None
    table: pd.DataFrame
    figure: Path | None


def free_memory(cfg: ArchConfig, gpu: GPU, precision: Precision, quant: str | None) -> float:
    """Bytes of ``gpu``'s memory left beside the weights: capacity - weight bytes (the recipe's, per
    tensor, when the run or the model has one; else parameters x the weights' bytes per element)."""
    return gpu.memory_bytes - weight_memory(cfg, precision, effective(cfg, quant))


def compare_variants(request: KvRequest, say: Say = quiet) -> KvComparison:
    """Compare the attention variants of ``request`` (see :mod:`lmcost.apps.kv`); write its figure when
    ``request.plot`` is set.

    Raises: LmcostError for an unknown model, GPU, dtype, recipe or variant label, a bad window or
    pattern, and the errors of :func:`lmcost.apps.kv.compare` (contexts, batch, block size).
    """
    cfg = request.model if isinstance(request.model, ArchConfig) else load_config(request.model)
    cfg = with_window(cfg, request.window, request.local_global)
    hw = load_gpu(request.gpu)
    check_quant(cfg, request.quant, request.weight_dtype, [hw])  # before the dtype (see check_quant)
    precision = resolve_precision(request.dtype, request.weight_dtype, request.kv_dtype, [hw], say)
    cfg, quant = resolve_quant(cfg, request.quant, request.weight_dtype, say)
    labels = parse_labels(request.variants, cfg)
    settings = Settings(kernel=request.attention, quant=quant)
    contexts = list(dict.fromkeys(request.contexts))  # a context given twice is compared once, as a variant is
    table = compare(cfg, hw, labels, contexts, request.batch, precision, settings, request.block_size)
    path = None
    if request.plot is not None:
        from lmcost.output.plots import kv_figure, write_html

        fig = kv_figure(curves(cfg, hw, labels, max(contexts), request.batch, precision, settings),
                        free_memory(cfg, hw, precision, quant),
                        f"{cfg.name} on {hw.name}: batch {request.batch}, KV {precision.kv_cache}")
        path = write_html(fig, request.plot)
    return KvComparison(cfg=cfg, gpu=hw, precision=precision, quant=quant, table=table, figure=path)
