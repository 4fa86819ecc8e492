"""Measured share of time by operator class (Ivanov et al. 2021, Table 1) for one phase of the
reference decoder: prefill, one decode step, or a training step (forward + backward of a loss).

Kernels (GPU) or leaf aten ops (CPU) are classified by name (:func:`lmcost.profiling.trace.classify`):
gemm and attention are tensor contractions; norm and softmax, normalization; elementwise,
element-wise; copies and anything unclassified are reported as ``other``. The reference decoder
has no dropout, so a training step's measured element-wise share lacks it.
"""

from __future__ import annotations

import functools
import os
import tempfile

import pandas as pd
import torch

from lmcost.model.config import ArchConfig
from lmcost.operators.workload import Settings, check_count
from lmcost.operators.ops import IVANOV_CLASSES
from lmcost.profiling import trace as traces
from lmcost.profiling.control import sync as device_sync
from lmcost.profiling.device import check_device
from lmcost.profiling.decoder import build_decoder
from lmcost.profiling.profile import Run, check_fit
from lmcost.profiling.torch_dtypes import TORCH_DTYPES
from lmcost.profiling.quiet import without_profiler_lines

KERNEL_TO_IVANOV = {"gemm": "tensor contraction", "attention": "tensor contraction", "norm": "normalization",
                    "softmax": "normalization", "elementwise": "element-wise"}
assert set(KERNEL_TO_IVANOV.values()) == set(IVANOV_CLASSES.values())


def measured_shares(cfg: ArchConfig, phase: str, batch: int, tokens: int, device: str = "cpu", dtype: str = "fp32",
                    kernel: str = "naive", repeats: int = 3, seed: int = 0) -> pd.DataFrame:
    """Columns: op_class (tensor contraction, normalization, element-wise, other), measured_time_s
    (seconds per step, summed over kernels, median-free total over ``repeats`` divided by repeats),
    measured_share (fraction of all measured kernel time)."""
    check_device(device)
    for name, v in (("batch", batch), ("seq", tokens), ("repeats", repeats)):
        check_count(name, v)
    # Before allocating: weights, cache and activations; a training step also keeps gradients and the
    # activations saved for backward (about three times the forward's footprint, a rough margin).
    check_fit(Run(cfg, device, dtype, batch, tokens, 1, repeats, Settings(kernel=kernel, mla="naive")),
              factor=3.0 if phase == "train" else 1.0, tokens="seq")
    ctx = tokens + 1 if phase == "decode" else tokens
    model = build_decoder(cfg, max_batch=batch, max_context=ctx, dtype=TORCH_DTYPES[dtype], device=device, seed=seed,
                          kernel=kernel, mla_mode="absorbed" if phase == "decode" else "naive")
    if phase == "train":
        model.trainable()
    g = torch.Generator().manual_seed(seed)
    if cfg.embeddings:
        x = torch.randint(0, cfg.vocab_size, (batch, ctx), generator=g).to(device)
    else:
        x = torch.randn(batch, ctx, cfg.d_model, generator=g).to(device=device, dtype=TORCH_DTYPES[dtype])
    sync = functools.partial(device_sync, device)

    def step():
        if phase == "decode":
            model(x[:, tokens:tokens + 1], tokens)
        else:
            y = model(x[:, :tokens], 0)
            if phase == "train":
                y.float().square().mean().backward()
                model.zero_grad(set_to_none=True)
                for buf in model.kv_cache_tensors():  # the cache writes joined the graph: cut it
                    buf.detach_()
        sync()

    if phase == "decode":
        with torch.no_grad():
            model(x[:, :tokens], 0)
    step()  # warm-up
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with without_profiler_lines(), torch.profiler.profile(activities=acts) as prof:
        for _ in range(repeats):
            step()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        k = traces.kernel_class_times(traces.load(path))
    finally:
        os.unlink(path)
    k["op_class"] = k["op_class"].map(lambda c: KERNEL_TO_IVANOV.get(c, "other"))
    out = k.groupby("op_class", as_index=False)["measured_time_s"].sum()
    out["measured_time_s"] /= repeats
    out["measured_share"] = out.measured_time_s / out.measured_time_s.sum()
    return out


def measured_for(cfg: ArchConfig, request) -> pd.DataFrame:
    """:func:`measured_shares` of a :class:`lmcost.apps.roofline.BreakdownRequest` (its phase, batch, seq,
    device, run_dtype, attention and repeats) on ``cfg`` as costed: the ``measure`` of
    :func:`lmcost.apps.roofline.run_breakdown`."""
    r = request
    return measured_shares(cfg, r.phase, r.batch, r.seq, r.device, r.run_dtype, r.attention, r.repeats)
