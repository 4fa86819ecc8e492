"""Operators of the Mamba-1 selective state-space mixer (``mamba`` in ``recurrent.layer_pattern``), per layer, for
a pass of s new tokens per sequence at context t: Mamba, Falcon-Mamba, Jamba's Mamba layers.

Conventions as :mod:`lmcost.operators.recurrent` (n = b*s tokens, 2 FLOPs per multiply-accumulate, the
projections GEMMs, the conv and the scan ops of class ``recurrent``), which dispatches here.

Widths: E = d_inner (expand * d), N = d_state, R = dt_rank, K = d_conv.

State per sequence and layer: the conv state [E, K] (the last K inputs of x, in the activation dtype, B_kv:
transformers' ``LinearAttentionLayer.conv_states``) and the SSM state h [E, N] in fp32 (``STATE_BYTES``):
transformers' scan starts h in the model dtype and multiplies it by exp(dt*A) in fp32, so the final state it
caches is fp32, as mamba_ssm keeps it.

Sources: Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", section 3.2 and
Algorithm 2 (the selective SSM: B, C, dt = s_B(x), s_C(x), softplus(param + s_dt(x)) with s_dt a rank-R
projection; discretization A_bar = exp(dt*A), B_bar x = dt*B*x, h_t = A_bar h_{t-1} + B_bar x_t, y_t = C h_t),
section 3.4 and Figure 3 (the block: in_proj to x and z, conv, SiLU, SSM, y * SiLU(z), out_proj);
transformers' MambaMixer torch path (``mamba_selective_scan``: a loop over positions whose only matmul is
h·C per step, [b, E, N] @ [b, N, 1]; ``mamba_selective_state_update`` for a decode step, the same matmul).
Falcon-Mamba and Jamba normalise dt, B and C after x_proj (FalconMambaMixer: RMSNorms without weight;
JambaMambaMixer: with weights).
"""

from __future__ import annotations

from lmcost.operators.ops import FLOPS_PER_ELEMENT, OpClass, OpCost, linear, norm
from lmcost.operators.recurrent import STATE_BYTES, _starts_from_state, conv_op

#: The mixers this module costs (entries of recurrent.layer_pattern).
SSM_KINDS = ("mamba",)
#: Vector FLOPs of the selective scan per token, channel and state element: dt*A, exp, dt*B, (dt*B)*x,
#: A_bar*h, + (Algorithm 2's discretization and recurrence, elementwise).
SCAN_FLOPS_PER_STATE = 6
#: softplus(v) = log(1 + exp(v)): exp, add, log.
SOFTPLUS_FLOPS = 3


def conv_channels(cfg, kind: str) -> int:
    """Channels of the Mamba-1 conv: d_inner (x only; B, C and dt come after it, from x_proj)."""
    return cfg.recurrent.mamba.d_inner


def state_elements(cfg, kind: str) -> tuple[int, int, int]:
    """Per sequence and layer: (conv state E*K, conv width K, SSM state E*N) elements."""
    m = cfg.recurrent.mamba
    return m.d_inner * m.d_conv, m.d_conv, m.d_inner * m.d_state


def mamba_ops(cfg, x) -> list[OpCost]:
    """A Mamba-1 mixer (Gu & Dao 2023, Algorithm 2; HF MambaMixer / FalconMambaMixer / JambaMambaMixer torch path).

    - ``mixer.in_proj`` GEMM d -> 2E (x, z), bias with proj_bias;
    - ``mixer.conv``: depthwise conv of K taps + SiLU over E channels; conv state [E, K];
    - ``mixer.x_proj`` GEMM E -> R + 2N (dt, B, C), no bias;
    - ``mixer.bc_dt_norm`` (Falcon-Mamba, Jamba): RMSNorm of dt [R], B [N] and C [N] per token (R + 2N weights
      in Jamba, none in Falcon-Mamba);
    - ``mixer.dt_proj`` GEMM R -> E; its bias [E] is added in the scan (transformers' delta_bias), counted
      here as a parameter, not as matmul FLOPs (it is not an addmm);
    - ``mixer.ssm`` (matmul): y_t = h_t·C_t, E*N MACs per token (b*s*E*N in prefill and in a decode step:
      transformers' loop runs one [b, E, N] @ [b, N, 1] per position);
    - ``mixer.ssm_state`` (vector work): dt + bias and softplus (1 + 3 per element of [n, E]), the
      discretization and recurrence (6 per [n, E, N]: SCAN_FLOPS_PER_STATE), the D skip (2 per [n, E]) and
      the gate y * SiLU(z) (5 per [n, E]); it owns A_log [E, N] and D [E], and reads the SSM state [E, N]
      (fp32) when t > s and writes it;
    - ``mixer.out_proj`` GEMM E -> d, bias with proj_bias.
    """
    m = cfg.recurrent.mamba
    E, N, R, K = m.d_inner, m.d_state, m.dt_rank, m.d_conv
    n, b = x.b * x.s, x.b
    state = E * N * STATE_BYTES
    ops = [linear("mixer.in_proj", n, x.d, 2 * E, x.B_w, x.B_a, m.proj_bias, shapes="x [b,s,d] @ W_in [d,2E] -> x, z"),
           conv_op(x, E, K, m.conv_bias, "silu", E * K * x.B_kv),
           linear("mixer.x_proj", n, E, R + 2 * N, x.B_w, x.B_a, shapes="x [b,s,E] @ W_x [E,R+2N] -> dt, B, C")]
    if m.bc_dt_norm != "none":
        ops.append(norm("mixer.bc_dt_norm", "rmsnorm", False, n, R + 2 * N, x.B_w, x.B_a,
                        shapes="rmsnorm(dt [b,s,R]), rmsnorm(B [b,s,N]), rmsnorm(C [b,s,N])",
                        weight=m.bc_dt_norm == "weighted"))
    dt = linear("mixer.dt_proj", n, R, E, x.B_w, x.B_a, True, shapes="dt [b,s,R] @ W_dt [R,E] (+ bias in the scan)")
    vec = n * E * (SCAN_FLOPS_PER_STATE * N + 1 + SOFTPLUS_FLOPS + 2
                   + FLOPS_PER_ELEMENT["silu"] + FLOPS_PER_ELEMENT["mul"])
    return ops + [
        dt,
        OpCost("mixer.ssm", OpClass.RECURRENT, flops=2 * n * E * N, act_read_bytes=n * (E + N) * x.B_a,
               act_write_bytes=n * E * x.B_a, shapes="y [b,E] = h [b,E,N] @ C [b,N,1] per position", matmul=True,
               kind="selective_scan"),
        OpCost("mixer.ssm_state", OpClass.RECURRENT, flops=vec, params=E * N + E, weight_bytes=(E * N + E) * x.B_w,
               act_read_bytes=n * (3 * E + N) * x.B_a, act_write_bytes=n * E * x.B_a,
               kv_read_bytes=b * state * _starts_from_state(x), kv_write_bytes=b * state,
               shapes="dt, exp(dt*A), dt*B*x, h = A_bar*h + B_bar*x, D skip, * silu(z); state [b,E,N] fp32",
               kind="ssm_state"),
        linear("mixer.out_proj", n, E, x.d, x.B_w, x.B_a, m.proj_bias, shapes="y [b,s,E] @ W_out [E,d]")]


def ssm_ops(cfg, x, kind: str) -> list[OpCost]:
    """The operators of one ``kind`` layer (SSM_KINDS). Raises: ValueError for another kind."""
    if kind == "mamba":
        return mamba_ops(cfg, x)
    raise ValueError(f"not an SSM mixer: {kind!r}")
