"""Oracles: closed forms from the literature and predictions of what torch does, written out so that the
tests can hold lmcost's numbers against them. They live here, not in lmcost/, because nothing in the tool
calls them: an oracle shipped in the package it checks is one refactor away from checking itself.
"""

from __future__ import annotations

import math


# ---------------------------------------------------------------------------------------------------
# Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"


def korthikanti_config(d_model: int = 12288, n_heads: int = 96, n_layers: int = 96, vocab_size: int = 51200,
                       max_positions: int = 2048):
    """The GPT layer of Korthikanti et al. 2022 (section 4.1): pre-norm LayerNorm with bias, naive attention
    with dropout on the probabilities, a GELU MLP of 4d, dropout after each sublayer, biases on every linear,
    learned positions. Defaults: GPT-3 175B (their Table 3: h = 12288, a = 96, L = 96)."""
    from lmcost.model.config import ArchConfig

    return ArchConfig.model_validate(dict(
        name="korthikanti-gpt", source="Korthikanti et al. 2022, section 4.1", d_model=d_model, n_layers=n_layers,
        vocab_size=vocab_size, attention=dict(n_heads=n_heads, qkv_bias=True, out_bias=True),
        ffn=dict(activation="gelu", d_ff=4 * d_model, bias=True), norm="layernorm", norm_bias=True,
        block="pre_norm", positions="learned", max_positions=max_positions, dropout=True))


def korthikanti_layer_bytes(s, b, h, a, t: int = 1, sp: bool = False, recompute: str = "none"):
    """Activation bytes per transformer layer (16-bit activations), Korthikanti et al. 2022, eq. 1 and Table 2.

    none:      sbh(34 + 5as/h) (eq. 1, t = 1);  TP: sbh(10 + 24/t + 5as/(ht));  TP+SP: sbh(34/t + 5as/(ht))
    selective: sbh(10 + 24/t);  with SP: sbh*34/t.  full: 2sbh (the layer input).
    Terms (section 4.1): LayerNorm inputs 4sbh; QKV input 2sbh; Q, K 4sbh; softmax output 2as²b; attention
    dropout mask as²b and output 2as²b; V 2sbh; output projection input 2sbh and dropout mask sbh; MLP
    input 2sbh, GELU input 8sbh, second linear input 8sbh, dropout mask sbh.
    """
    if recompute == "full":
        return 2 * s * b * h
    scores = 0 if recompute == "selective" else 5 * a * s / (h * t)
    if sp:
        return s * b * h * (34 / t + scores)
    return s * b * h * (10 + 24 / t + scores)


# ---------------------------------------------------------------------------------------------------
# FSDP2 (torch.distributed.fsdp.fully_shard): how torch cuts a tensor, for the gloo run in test_model_states


def fsdp2_local_rows(dim0: int, dp: int, rank: int) -> int:
    """Rows of a tensor's dim 0 that ``rank`` of ``dp`` holds under FSDP2 (``torch.chunk``: chunks of
    ceil(dim0/dp) rows, the last shorter, the ranks past them empty)."""
    c = -(-dim0 // dp)
    return max(0, min(c, dim0 - rank * c))


def fsdp2_shard_numel(shape: tuple, dp: int) -> int:
    """Elements of one rank's padded shard of a tensor under FSDP2: ceil(dim0/dp) x prod(rest), the
    storage every rank allocates (rank 0's shard is never padded: it is the largest)."""
    return -(-shape[0] // dp) * math.prod(shape[1:])
