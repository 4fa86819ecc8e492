"""The FLOP conventions of published training runs: how each source turned a step into "TFLOP/s" or "MFU",
so that its figure can be read back as the tokens/s per GPU it measured (:mod:`lmcost.calibration.training_runs`).

Each formula is written once, from the source's own definition (the "FLOP conventions" section of
``lmcost/data/measurements/training-runs.md``), and evaluated on the lmcost config of the row's model: per
trained token, with L layers, h = d_model, H query heads of width Q (MLA: the mean of its query-key and value
widths), s tokens per sequence, V the vocabulary, N the matmul parameters a token multiplies (lmcost's
``active_per_token - embedding``: lm_head included, the embedding table not; norms and biases are under 0.1%).

- ``megatron-lm``: Megatron-LM ``num_floating_point_operations`` (megatron/training/training.py at the
  commit of the r0.8 README table, f2e5db4): 12 L h^2 [(1 + g/H + s/h) HQ/h + (f/h) k m] + 6 h V per token
  (g KV heads, f the FFN width, k routed experts (1 dense), m 3/2 for a gated FFN else 1); attention not
  causal-halved, no recompute;
- ``palm``: 6 N + 12 L H Q s (Chowdhery et al. 2022, appendix B; nanoGPT's estimate_mfu): fms-fsdp's MFU and
  NeMo 24.07's model FLOPs (its check: Llama 3 8B, 711 TFLOP/s / 12273 tok/s = 57.9 GFLOP = 6 N + 12 L s d);
- ``megatron-bridge``: 6 N + 6 L H Q s, the attention term causal-halved (Megatron-Bridge 25.09+; its check:
  Llama 3 8B on H100, 725 / 14079 = 51.5 GFLOP/token);
- ``litgpt``: 6 N_all + 12 L h s, the embedding table counted (lit_gpt/speed_monitor.py estimate_flops, as
  TinyLlama's README uses it);
- ``narayanan``: passes x L x (2 (4 h^2 + m' h f) + 4 s h) + 6 h V, m' the FFN's matrices (3 gated, else 2):
  Narayanan et al. 2021, Eq. 3 (96 B s l h^2 (1 + s/6h + V/16lh) at f = 4h, passes = 4: full recompute
  counted), as Megatron-DeepSpeed prints it for BigScience and DeepSpeed-on-Azure, and as InternEvo's
  "Megatron SC21 formula" does with passes = 3 without checkpointing and 4 with (its TFLOPS/TGS ratio is
  4/3 of the no-checkpoint case);
- ``flop-counter``: passes x (2 N + 4 L H Q s): torch.utils.flop_counter over forward and backward (fms-fsdp's
  HFU), SDPA without a causal discount, the recomputed forward counted (passes 4 under full recompute, 3 else).
"""

from __future__ import annotations

from lmcost.model.config import ArchConfig

#: Dense BF16 peaks the sources divide by for MFU/HFU (training-runs.md, "Peaks": 989 TFLOP/s on H100, 312 on
#: A100), by lmcost GPU name. A GPU not here has no published MFU basis.
MFU_PEAK = {"h100-sxm": 989e12, "a100-80gb": 312e12, "a100-40gb": 312e12}

#: (source name contains, metric) -> convention, first match wins; metric "model" covers
#: model_tflops_per_gpu and mfu, "hardware" covers hardware_tflops_per_gpu and hfu.
SOURCE_CONVENTIONS = (
    ("Megatron-LM README", "model", "megatron-lm"),
    ("Megatron-LM MoE README", "model", "megatron-lm"),
    ("Megatron-Bridge", "model", "megatron-bridge"),
    ("NeMo performance summary (NeMo 24.07", "model", "palm"),
    ("bigscience", "hardware", "narayanan"),
    ("DeepSpeed on Azure", "hardware", "narayanan"),
    ("InternEvo", "hardware", "narayanan"),
    ("fms-fsdp", "model", "palm"),
    ("fms-fsdp", "hardware", "flop-counter"),
    ("TinyLlama", "model", "litgpt"),
)

CONVENTIONS = ("megatron-lm", "palm", "megatron-bridge", "litgpt", "narayanan", "flop-counter")


def convention_for(source: str, metric: str) -> str | None:
    """The FLOP convention of ``source`` for ``metric`` (model_tflops_per_gpu, mfu, hardware_tflops_per_gpu,
    hfu), or None where the source does not state one (its figure cannot be read back as tokens/s)."""
    which = "hardware" if metric in ("hardware_tflops_per_gpu", "hfu") else "model"
    return next((c for s, m, c in SOURCE_CONVENTIONS if s in source and m == which), None)


def _widths(cfg: ArchConfig) -> tuple[float, float]:
    """(H Q, g/H): query heads times the attention width a score pair costs, and KV heads over query heads."""
    a = cfg.attention
    mla = a.mla
    q = (mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim) / 2 if mla else cfg.d_h
    return a.n_heads * q, (a.n_kv_heads or a.n_heads) / a.n_heads


def _matmul_params(cfg: ArchConfig, with_embedding: bool = False) -> float:
    """N: the parameters a token multiplies (lm_head included), plus the embedding table if asked."""
    from lmcost.cost.params import param_counts

    p = param_counts(cfg)
    return float(p["active_per_token"] - (0 if with_embedding else p["embedding"]))


def flops_per_token(convention: str, cfg: ArchConfig, seq: int, recompute: str = "none") -> float:
    """FLOPs per trained token as ``convention`` counts them (module docstring: each formula and its source)
    for ``cfg`` at ``seq`` tokens per sequence; ``recompute`` ("none", "selective", "full") sets the passes of
    the conventions that count recomputation (narayanan for InternEvo, flop-counter).

    Returns: FLOPs per token. Raises: ValueError for a convention not in :data:`CONVENTIONS` (a programming
    error: the caller picks it from :func:`convention_for`)."""
    L, h, V = cfg.n_layers, cfg.d_model, cfg.vocab_size
    hq, g = _widths(cfg)
    gated = cfg.gated
    ffn = cfg.moe.d_ff_expert if cfg.moe is not None else cfg.ffn.d_ff
    k = cfg.moe.top_k if cfg.moe is not None else 1
    if convention == "megatron-lm":
        return 12 * L * h * h * ((1 + g + seq / h) * hq / h + ffn / h * k * (1.5 if gated else 1.0)) + 6 * h * V
    if convention == "palm":
        return 6 * _matmul_params(cfg) + 12 * L * hq * seq
    if convention == "megatron-bridge":
        return 6 * _matmul_params(cfg) + 6 * L * hq * seq
    if convention == "litgpt":
        return 6 * _matmul_params(cfg, with_embedding=True) + 12 * L * h * seq
    passes = 4 if recompute == "full" else 3
    if convention == "narayanan":
        return passes * L * (2 * (4 * h * h + (3 if gated else 2) * h * ffn * k) + 4 * seq * h) + 6 * h * V
    if convention == "flop-counter":
        return passes * (2 * _matmul_params(cfg) + 4 * L * hq * seq)
    raise ValueError(f"unknown FLOP convention {convention!r}; one of {CONVENTIONS}")
