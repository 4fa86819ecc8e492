"""The figures of ``lmcost train``'s kernel features (fp8 GEMMs, the attention kernel's backward, ring
attention's overlap) that a fit on published training runs may move: one frozen dataclass, each field
with its prior and where the prior comes from (:data:`FEATURE_FIGURES`, what :func:`lmcost.apps.train.train_step`
takes by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmcost.basics.errors import LmcostError


@dataclass(frozen=True)
class FeatureFigures:
    """Priors of the training features, fractions (1).

    ``fp8_gemm_scale``, ``fp8_block_gemm_scale``: the fraction of the GPU's fp8 peak an fp8 GEMM reaches,
    relative to the fraction its fitted GEMM figures give a bf16 GEMM of the same shape (1: the same
    fraction of a peak twice as high). Prior 1.0 for both: cuBLAS fp8 GEMMs and DeepSeek's DeepGEMM
    (block-scaled 1x128/128x128, "up to 1550 TFLOPS" on H800 in its README: 0.78 of the 1979 TFLOP/s fp8
    peak) reach about the fraction the H100 GEMM fit gives bf16 (0.77). Per-tensor recipes take the first,
    block and MX recipes the second.
    ``fp8_weight_cache``: Transformer Engine casts the weights to fp8 on the first microbatch of a step only
    (``is_first_microbatch``, which Megatron-Core passes), so the weights' cast is charged once per step;
    False charges it every microbatch.
    ``attention_backward``: (kernel family, backward rate / forward rate) pairs: the backward of a flash
    kernel reaches a lower fraction of peak than its forward (both counting the FLOPs each pass runs:
    2.5x the forward's in the backward). fa2 and sdpa (PyTorch's flash backend is FA2): 0.63 / 0.73 = 0.86
    (Dao 2023, FlashAttention-2, section 4.1: forward up to 73% of the A100's peak, backward up to 63%);
    fa3 and cudnn: 0.75 (Shah et al. 2024, FlashAttention-3, figures 5 and 6 on H100, head dim 128:
    forward about 740 TFLOP/s, backward about 550 at 16k); flex: 0.8 (Dong et al. 2024, FlexAttention: 90%
    of FA2's forward and 85% of its backward, 0.86 x 0.85 / 0.9); auto (fitted on every family's forward):
    0.8, between them. Readings of published figures, to be fitted on the training runs.
    ``ring_overlap``: the fraction of one ring-attention block's compute that hides the K/V send issued
    beside it (Liu et al. 2023, ring attention, section 3: the send of the next block overlaps the
    current block's attention; Megatron-LM/Transformer Engine's CP issues it on its own stream): 1.0.
    """

    fp8_gemm_scale: float = 1.0
    fp8_block_gemm_scale: float = 1.0
    fp8_weight_cache: bool = True
    attention_backward: tuple = (("auto", 0.8), ("fa2", 0.86), ("sdpa", 0.86), ("fa3", 0.75), ("cudnn", 0.75),
                                 ("flex", 0.8))
    ring_overlap: float = 1.0

    def __post_init__(self):
        for name in ("fp8_gemm_scale", "fp8_block_gemm_scale", "ring_overlap"):
            v = getattr(self, name)
            if not 0 < v <= 2:
                raise LmcostError(f"figures.{name}", f"must be in (0, 2], got {v!r}", "give a fraction")
        for family, v in self.attention_backward:
            if not 0 < v <= 1:
                raise LmcostError("figures.attention_backward", f"{family}: must be in (0, 1], got {v!r}",
                                  "give the backward's rate over the forward's")

    def backward_fraction(self, family: str) -> float:
        """The backward/forward rate of an attention kernel ``family`` (a family without a prior takes auto's)."""
        table = dict(self.attention_backward)
        return table.get(family, table.get("auto", 1.0))


FEATURE_FIGURES = FeatureFigures()
