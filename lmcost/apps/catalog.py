"""What ships, as records: one dict per cluster, GPU and model architecture (``lmcost clusters/gpus/models
list``), in base units (bytes, bytes/s, FLOP/s, parameters)."""

from __future__ import annotations

from lmcost.basics.shipped import names
from lmcost.cost.params import param_counts
from lmcost.hardware.cluster import list_clusters
from lmcost.hardware.gpu import gpu_names, load_gpu
from lmcost.model.loading import load_config


def cluster_rows() -> list[dict]:
    """One row per shipped cluster: name, aliases, GPU, GPUs per node, node fabric and its bandwidth per
    GPU per direction (B/s), NVLS, collective library (nccl, rccl), network and its bandwidth per node (B/s;
    "" and 0 for a single node)."""
    return [dict(name=c.name, aliases=",".join(c.aliases), gpu=c.gpu, gpus_per_node=c.gpus_per_node,
                 intra=c.intra.name, intra_bytes_per_s=c.intra.bandwidth, nvls=c.intra.nvls, library=c.library,
                 inter=c.inter.name if c.inter else "", inter_node_bytes_per_s=c.inter.node_bandwidth if c.inter else 0.0)
            for c in list_clusters()]


def gpu_rows() -> list[dict]:
    """One row per shipped GPU: its dense peak (FLOP/s) in bf16, or else the first of fp16, fp8 and fp32
    it has (None where its sources give no compute figure: H100 NVL), bandwidth (B/s), memory (bytes) and
    ridge point (FLOPs/byte) in that dtype; its dense FP8 and FP4 tensor peaks (FLOP/s, None where it has
    none: :class:`lmcost.hardware.gpu.GPU` says which FP4 format each vendor quotes); ``fitted``: which fitted
    figures it carries (:func:`fitted_label`: ``public; vllm 0.24.0, sglang 0.5.14``; ``-`` for none, where
    calibrated times equal the roofline)."""
    rows = []
    for name in gpu_names():
        g = load_gpu(name)
        dt = next((d for d in ("bf16", "fp16", "fp8", "fp32") if d in g.peak_tflops), None)
        rows.append(dict(name=g.name, aliases=",".join(g.aliases), description=g.description,
                         peak_flops_per_s=g.peak_flops(dt) if dt else None, peak_dtype=dt,
                         bandwidth_bytes_per_s=g.bandwidth, memory_bytes=g.memory_bytes,
                         ridge_flops_per_byte=g.ridge_point(dt) if dt else None,
                         fp8_flops_per_s=g.peak_flops("fp8") if "fp8" in g.peak_tflops else None,
                         fp4_flops_per_s=g.peak_flops("fp4") if "fp4" in g.peak_tflops else None,
                         fitted=fitted_label(g)))
    return rows


def fitted_label(gpu) -> str:
    """Which fitted figures ``gpu`` has, in a few words: its base block's source (``public``: a fit of the public
    kernel table; ``engines pooled``; another table's name; ``calibrate``: a local calibration), then after
    ``;`` each engine profile with its version (``--engine`` takes them), or ``-`` without an efficiency block."""
    from lmcost.apps.engine_choice import base_figures

    e = gpu.efficiency
    if e is None:
        return "-"
    base = base_figures(gpu)
    base = {"public-kernels.csv fit": "public", "lmcost calibrate": "calibrate"}.get(base, base.removesuffix(" fit"))
    if base.startswith("engines pooled"):
        base = "engines pooled"
    engines = getattr(e, "engines", None) or {}
    return base + ("; " + ", ".join(f"{n} {p.version}" for n, p in engines.items()) if engines else "")


def model_rows() -> list[dict]:
    """One row per shipped architecture: attention kind, layers, d_model, parameters (total and active per
    token, :func:`lmcost.cost.params.param_counts`), whether it is a mixture of experts."""
    rows = []
    for name in names("models"):
        cfg = load_config(name)
        p = param_counts(cfg)
        rows.append(dict(name=name, attention=cfg.attention_kind, layers=cfg.n_layers, d_model=cfg.d_model,
                         params=p["total"], active_params=p["active_per_token"], moe=cfg.moe is not None))
    return rows
