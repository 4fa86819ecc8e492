"""Operators of the recurrent (RNN-style) token mixers: Griffin's RG-LRU block (RecurrentGemma), per layer,
for a pass of s new tokens per sequence at context t. Conventions, state and names as
:mod:`lmcost.operators.recurrent`, whose dispatch (``conv_channels``, ``state_elements``, ``recurrent_ops``)
sends these kinds here.

Sources: De et al. 2024, "Griffin: Mixing Gated Linear Recurrences with Local Attention for Efficient Language
Models", section 2.4 (the recurrent block, fig. 2) and section 2.4's eq. 1-4 (the RG-LRU); transformers'
RecurrentGemmaRecurrentBlock and RecurrentGemmaRglru (the layout and what its cache holds).
"""

from __future__ import annotations

from lmcost.operators import recurrent as _rec
from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, elementwise, linear

#: The mixer kinds this module costs (entries of :data:`lmcost.model.mixers.RECURRENT_KINDS`).
KINDS = ("rg_lru",)

#: FLOPs per element of the RG-LRU's vector work (De et al. 2024, eq. 1-4, as RecurrentGemmaRglru computes
#: it): the two gate sigmoids (2 * 4), log a = -8 * r * softplus(Λ) (2: softplus(Λ) is per channel, not per
#: token), a = exp(log a) (1), a² = exp(2 log a) (2), sqrt(1 - a²) (2), (x * i) * sqrt(1 - a²) (2), the
#: recurrence h = a * h + x (2).
RG_LRU_FLOPS = 2 * FLOPS_PER_ELEMENT["sigmoid"] + 2 + 1 + 2 + 2 + 2 + 2


def conv_channels(cfg, kind: str) -> int:
    """Channels of the depthwise causal conv of a ``kind`` layer: RG-LRU its width (W_x's output)."""
    if kind == "rg_lru":
        return cfg.recurrent.rg_lru.width
    raise ValueError(f"not an rnn mixer: {kind!r}")


def state_elements(cfg, kind: str) -> tuple[int, int, int]:
    """Per sequence and layer: (conv state elements, conv width d_conv, recurrent state elements).

    RG-LRU: (W * (d_conv - 1), d_conv, W): transformers' RecurrentGemmaRecurrentBlock keeps the last
    d_conv - 1 conv inputs [b, W, d_conv - 1] in the activation dtype (``conv1d_state``) and the RG-LRU
    state h [b, W] in float32 (``rg_lru.recurrent_states``).
    """
    if kind == "rg_lru":
        g = cfg.recurrent.rg_lru
        return g.width * (g.d_conv - 1), g.d_conv, g.width
    raise ValueError(f"not an rnn mixer: {kind!r}")


def _block_diagonal(name: str, n, width: int, blocks: int, x, shapes: str) -> OpCost:
    """A block-diagonal projection with bias: ``blocks`` blocks of [width/blocks, width/blocks] (torch.baddbmm
    in RecurrentGemmaRglru): 2*n*width*(width/blocks) FLOPs, weight width*(width/blocks) + bias width.
    Reads x [n, width], writes [n, width]."""
    op = linear(name, n, width // blocks, width, x.B_w, x.B_a, True, shapes=shapes)
    return OpCost(**{**op.__dict__, "act_read_bytes": n * width * x.B_a})


def rg_lru_ops(cfg, x) -> list[OpCost]:
    """Griffin's recurrent block (De et al. 2024, section 2.4, fig. 2; HF RecurrentGemmaRecurrentBlock).

    Width W (lru_width), n_blocks blocks of width W/n_blocks in the gates, conv of K taps, n = b*s tokens.
    - ``mixer.linear_y`` GEMM d -> W (+ bias), then ``mixer.y_act`` GeLU (tanh) over [n, W];
    - ``mixer.linear_x`` GEMM d -> W (+ bias);
    - ``mixer.conv``: depthwise causal conv of K taps (+ bias, no activation) over W channels; its state,
      the last K - 1 inputs [W, K - 1] in the activation dtype (B_kv), read when t > s and written;
    - ``mixer.input_gate``, ``mixer.a_gate``: the RG-LRU's gates i = sigmoid(u W_i + b_i) and
      r = sigmoid(u W_a + b_a), each block-diagonal (baddbmm over n_blocks blocks): matmuls of
      2*n*W*(W/n_blocks) FLOPs, W*(W/n_blocks) + W parameters each;
    - ``mixer.rg_lru`` (vector work, :data:`RG_LRU_FLOPS` per element): a = exp(-8 r softplus(Λ)),
      h_t = a h_{t-1} + sqrt(1 - a²) (i * u_t), sequential over the s positions in both phases (no
      chunked form: transformers loops over t); it owns Λ (W parameters) and reads the state h [W]
      (fp32) when t > s and writes it;
    - ``mixer.gate_out`` h * y; ``mixer.linear_out`` GEMM W -> d (+ bias).
    """
    g = cfg.recurrent.rg_lru
    W, nb, K = g.width, g.n_blocks, g.d_conv
    n, b = x.b * x.s, x.b
    state = W * _rec.STATE_BYTES
    return [linear("mixer.linear_y", n, x.d, W, x.B_w, x.B_a, True, shapes="x [b,s,d] @ W_y [d,W] -> y"),
            elementwise("mixer.y_act", n * W, 1, FLOPS_PER_ELEMENT["gelu"], x.B_a, OpClass.RECURRENT,
                        shapes="gelu_tanh(y) [b,s,W]", kind="gelu"),
            linear("mixer.linear_x", n, x.d, W, x.B_w, x.B_a, True, shapes="x [b,s,d] @ W_x [d,W] -> u"),
            _rec.conv_op(x, W, K, True, None, W * (K - 1) * x.B_kv),
            _block_diagonal("mixer.input_gate", n, W, nb, x, f"u [{nb},b*s,W/{nb}] @ W_i [{nb},W/{nb},W/{nb}] + b_i"),
            _block_diagonal("mixer.a_gate", n, W, nb, x, f"u [{nb},b*s,W/{nb}] @ W_a [{nb},W/{nb},W/{nb}] + b_a"),
            OpCost("mixer.rg_lru", OpClass.RECURRENT, flops=RG_LRU_FLOPS * n * W, params=W, weight_bytes=W * x.B_w,
                   act_read_bytes=3 * n * W * x.B_a, act_write_bytes=n * W * x.B_a,
                   kv_read_bytes=b * state * _rec._starts_from_state(x), kv_write_bytes=b * state,
                   shapes="a = exp(-8 r softplus(Λ)); h = a h + sqrt(1 - a²) (i u); state h [b,W] fp32",
                   kind="rg_lru"),
            elementwise("mixer.gate_out", n * W, 2, FLOPS_PER_ELEMENT["mul"], x.B_a, OpClass.RECURRENT,
                        shapes="h * y [b,s,W]", kind="mul"),
            linear("mixer.linear_out", n, W, x.d, x.B_w, x.B_a, True, shapes="o [b,s,W] @ W_out [W,d]")]


def rnn_ops(cfg, x, kind: str) -> list[OpCost]:
    """The operators of one rnn mixer of kind ``kind`` (:data:`KINDS`), from its normed input [b,s,d] to its
    output [b,s,d]. Raises: ValueError for another kind."""
    if kind == "rg_lru":
        return rg_lru_ops(cfg, x)
    raise ValueError(f"not an rnn mixer: {kind!r}")
