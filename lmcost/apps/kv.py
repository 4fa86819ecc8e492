"""Compare attention variants of one model: KV-cache footprint, what fits, and decode cost.

For each variant (see :mod:`lmcost.model.variants`) and context t, with b sequences:
- KV bytes per token (all layers) and for the batch at t, exact and paged (blocks of ``block_size``); a
  hybrid stack's constant-size state per sequence (conv + SSM states) is shown beside, and is in the totals;
- the attention's parameters (K/V projections shrink with fewer KV heads; MLA has its
  down/up projections);
- the largest batch that fits at t and the longest context that fits at b: memory = weights +
  paged KV cache + activations of a decode step, against the GPU's capacity (serving-time planning:
  the prompt is assumed prefilled in chunks no bigger than a decode batch's activations);
- one decode step's roofline time, tokens/s (b / step time) and the attention kernels' arithmetic
  intensity (FLOPs / bytes of the ATTENTION-class operators).
MLA variants are reported twice, absorbed and naive (DeepSeek-V2, section 2.1).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lmcost.model.config import ArchConfig
from lmcost.basics.dtypes import Precision
from lmcost.cost.compile import phase_ops
from lmcost.cost.phases import phase_totals
from lmcost.operators.workload import MAX_COUNT, Settings, check_count, check_positions, require_decoder
from lmcost.operators.forward import total
from lmcost.hardware.gpu import GPU
from lmcost.cost.kvcache import kv_bytes, kv_bytes_per_token, state_bytes_per_sequence
from lmcost.cost.memory import Footprint, check_block, footprint, largest
from lmcost.model.quant import effective
from lmcost.operators.ops import OpClass
from lmcost.cost.roofline import intensity
from lmcost.model.variants import Variant, derive


def decode_footprint(cfg: ArchConfig, precision: Precision, b: int, t: int, settings: Settings,
                     block_size: int | None) -> Footprint:
    """Memory of serving b sequences at context t: weights + paged KV + one decode step's activations."""
    ops = phase_ops(cfg, precision, "decode", b, t, settings)
    return footprint(cfg, precision, batch=b, context=t, ops=ops, tokens=1, block_size=block_size,
                     quant=effective(cfg, settings.quant))


def max_batch(cfg, gpu: GPU, precision: Precision, t: int, settings: Settings = Settings(),
              block_size: int | None = 16) -> int:
    """Largest b with decode_footprint(b, t) <= capacity (0 if not even one sequence fits)."""
    cap = gpu.memory_bytes
    return largest(lambda b: decode_footprint(cfg, precision, b, t, settings, block_size).total_bytes <= cap,
                   MAX_COUNT)


def max_context(cfg, gpu: GPU, precision: Precision, b: int, settings: Settings = Settings(),
                block_size: int | None = 16) -> int:
    """Largest t with decode_footprint(b, t) <= capacity, up to the learned position table or MAX_COUNT
    tokens (a model whose every layer slides fits any context once weights and window fit)."""
    cap = gpu.memory_bytes
    limit = cfg.max_positions if cfg.positions == "learned" else MAX_COUNT
    return largest(lambda t: decode_footprint(cfg, precision, b, t, settings, block_size).total_bytes <= cap,
                   limit)


def _attention_params(cfg, precision) -> int:
    ops = phase_ops(cfg, precision, "decode", 1, 1)
    return int(sum(op.params * op.count for op in ops if op.role.startswith("attn.")))


def compare(cfg: ArchConfig, gpu: GPU, labels: list[str], contexts: list[int], batch: int = 1,
            precision: Precision = Precision(), settings: Settings = Settings(),
            block_size: int | None = 16) -> pd.DataFrame:
    """One row per (variant, MLA mode, context) with the quantities in the module docstring.

    Columns: variant, attention, mla_mode, context, batch, kv_bytes_per_token, state_bytes_per_seq (a hybrid
    stack's constant-size conv/SSM state per sequence, :mod:`lmcost.operators.recurrent`; 0 otherwise), attention_params,
    kv_bytes, kv_bytes_paged, max_batch, max_context, decode_time_s, tokens_per_s,
    attention_intensity, memory_bytes (paged footprint at batch, context), fits.
    Raises: LmcostError for a bad label, context, batch or block size.
    """
    require_decoder(cfg)
    check_count("batch", batch)
    check_block(block_size)
    for t in contexts:
        check_count("context", t)
        check_positions(cfg, t, "contexts")
    rows = []
    for v in [derive(cfg, label) for label in labels]:
        modes = ["absorbed", "naive"] if v.cfg.attention.mla is not None else [None]
        per_token = kv_bytes_per_token(v.cfg, precision)
        state = state_bytes_per_sequence(v.cfg, precision)
        attn_params = _attention_params(v.cfg, precision)
        for mode in modes:
            s = Settings(kernel=settings.kernel, mla=mode or settings.mla, logits=settings.logits, quant=settings.quant)
            longest = max_context(v.cfg, gpu, precision, batch, s, block_size)
            for t in contexts:
                ops = phase_ops(v.cfg, precision, "decode", batch, t, s)
                attn = [op for op in ops if op.op_class is OpClass.ATTENTION]
                step = phase_totals(v.cfg, gpu, precision, "decode", batch, t, s).time_s
                mem = decode_footprint(v.cfg, precision, batch, t, s, block_size).total_bytes
                rows.append(dict(
                    variant=v.label, attention=v.cfg.attention_kind, mla_mode=mode or "", context=t, batch=batch,
                    kv_bytes_per_token=per_token, state_bytes_per_seq=state, attention_params=attn_params,
                    kv_bytes=kv_bytes(v.cfg, precision, batch, t),
                    kv_bytes_paged=kv_bytes(v.cfg, precision, batch, t, block_size),
                    max_batch=max_batch(v.cfg, gpu, precision, t, s, block_size), max_context=longest,
                    decode_time_s=float(step), tokens_per_s=batch / float(step),
                    attention_intensity=intensity(total(attn, "flops"), total(attn, "bytes")),
                    memory_bytes=mem, fits=bool(mem <= gpu.memory_bytes)))
    return pd.DataFrame(rows)


def curves(cfg: ArchConfig, gpu: GPU, labels: list[str], t_max: int, batch: int = 1,
           precision: Precision = Precision(), settings: Settings = Settings(), points: int = 64) -> pd.DataFrame:
    """KV bytes and decode step time on a log-spaced grid of contexts up to t_max, per variant and
    MLA mode, evaluated as arrays (for plotting). Columns: variant, context, kv_bytes, decode_time_s."""
    ts = np.unique(np.geomspace(min(256, t_max), t_max, points).astype(int))
    frames = []
    for label in labels:
        v: Variant = derive(cfg, label)
        for mode in (["absorbed", "naive"] if v.cfg.attention.mla is not None else [None]):
            s = Settings(kernel=settings.kernel, mla=mode or settings.mla, logits=settings.logits, quant=settings.quant)
            name = f"{label} ({mode})" if mode else label
            step = phase_totals(v.cfg, gpu, precision, "decode", batch, ts.astype(float), s).time_s
            frames.append(pd.DataFrame(dict(variant=name, context=ts,
                                            kv_bytes=kv_bytes(v.cfg, precision, batch, ts.astype(float)),
                                            decode_time_s=np.broadcast_to(step, ts.shape))))
    return pd.concat(frames, ignore_index=True)
