"""Closed forms from the literature, checked as sympy identities over our per-operator sums."""

from __future__ import annotations

import sympy as sp
import pytest

from lmcost.model.config import ArchConfig
from lmcost.cost.formulas import symbolic_ops
from lmcost.operators.forward import Dims
from lmcost.operators.ops import OpClass

b, n, d, h, L, V, t = sp.symbols("b n d h L V t", positive=True, integer=True)


def mha(**over) -> ArchConfig:
    """Vanilla MHA decoder: no positions (no RoPE op), plain GELU FFN of 4d, no bias, pre-norm."""
    base = dict(name="mha", d_model=64, n_layers=2, vocab_size=100, attention=dict(n_heads=4),
                ffn=dict(activation="gelu", d_ff=256), positions="none", norm="layernorm")
    return ArchConfig.model_validate({**base, **over})


def mha_subs(expr):
    """Standard MHA: h_kv = h, h*d_h = d; prefill of n tokens: s = n."""
    x = Dims.symbolic()
    return sp.simplify(sp.sympify(expr).subs({x.h_kv: x.h}).subs({x.d_h: x.d / x.h})
                       .subs({x.s: n, x.d: d, x.h: h, x.b: b, x.L: L, x.V: V, x.t: t}))


def layer_ops(ops, names):
    return [op for op in ops if op.name.split(".", 1)[-1] in names]


def test_projections_cost_8bnd2():
    # Q, K, V, O: 4 matmuls [b*n, d] @ [d, d], 2 FLOPs per MAC: 4 * 2 * b*n*d*d = 8bnd².
    ops = symbolic_ops(mha(), "prefill")
    proj = layer_ops(ops, {"attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj"})
    assert len(proj) == 4
    assert sp.simplify(mha_subs(sum(op.flops for op in proj)) - 8 * b * n * d**2) == 0


def test_naive_scores_and_values_cost_4bn2d():
    # QKᵀ: h matmuls [n, d_h] @ [d_h, n] per sequence = 2*b*h*n*n*d_h = 2bn²d; PV the same: 4bn²d.
    ops = symbolic_ops(mha(), "prefill", kernel="naive")
    core = layer_ops(ops, {"attn.score", "attn.value"})
    assert sp.simplify(mha_subs(sum(op.flops for op in core)) - 4 * b * n**2 * d) == 0


def test_flash_computes_only_causal_pairs():
    # Causal prefill keeps n(n+1)/2 of the n² query-key pairs: 4 * b * d * n(n+1)/2 = 2bdn(n+1).
    ops = symbolic_ops(mha(), "prefill", kernel="flash")
    sdpa = layer_ops(ops, {"attn.sdpa"})
    assert sp.simplify(mha_subs(sdpa[0].flops) - 2 * b * d * n * (n + 1)) == 0


def test_naive_prefill_attention_volume_is_shazeer_plus_round_trips():
    # Shazeer 2019 ("Fast Transformer Decoding", section 2.4) sizes the tensors of batched MHA:
    # X and M (the memory: X again in self-attention) and Y, 3bnd; the logits, bhn²; P_q, P_k, P_v, P_o, 4d².
    # Our kernels run unfused, so intermediates make round trips. Tally of our 7 kernels in elements:
    #   q/k/v_proj: read X 3x (3bnd), write Q, K, V (3bnd), weights 3d²
    #   score: read Q, K (2bnd), write S (bhn²);   softmax: read S, write P (2bhn²)
    #   value: read P (bhn²), read V (bnd), write O (bnd);   o_proj: read O (bnd), weights d², write Y (bnd)
    # = 4d² + 12bnd + 4bhn². Against Shazeer: X is read 3 times, not 2 (+bnd); Q, K, V, O are each
    # written and read back (+8bnd); the score matrix is read by softmax and P written and read (+3bhn²).
    ops = symbolic_ops(mha(), "prefill", precision=None, kernel="naive")
    x = Dims.symbolic()
    attn = [op for op in ops if ".attn." in op.name]
    assert [op.name.split(".", 1)[1] for op in attn] == ["attn.q_proj", "attn.k_proj", "attn.v_proj",
                                                          "attn.score", "attn.softmax", "attn.value", "attn.o_proj"]
    elements = mha_subs(sum(op.bytes for op in attn).subs({x.B_w: 1, x.B_a: 1, x.B_kv: 1}))
    shazeer = 3 * b * n * d + b * h * n**2 + 4 * d**2
    assert sp.simplify(elements - (shazeer + b * n * d + 8 * b * n * d + 3 * b * h * n**2)) == 0


def test_incremental_decoding_reads_4nd2_plus_bdn_n_plus_1():
    # Shazeer 2019, section 2.4.1: generating n tokens one at a time from an empty prefix, step j
    # (context t = j) reads the 4 projection matrices (4d²) and K, V of j tokens (2bjd):
    # sum_{j=1..n} 4d² + 2bjd = 4nd² + bdn(n+1).
    ops = symbolic_ops(mha(), "decode", precision=None)
    x = Dims.symbolic()
    attn = [op for op in ops if ".attn." in op.name]
    per_step = sum(op.weight_bytes + op.kv_read_bytes for op in attn).subs({x.B_w: 1, x.B_a: 1, x.B_kv: 1})
    per_step = mha_subs(per_step)
    j = sp.Symbol("j", positive=True, integer=True)
    total = sp.summation(per_step.subs(t, j), (j, 1, n))
    assert sp.simplify(total - (4 * n * d**2 + b * d * n * (n + 1))) == 0


def test_megatron_forward_flops():
    # Narayanan et al. 2021 (Megatron-LM, appendix): a forward pass of an MHA decoder with a 4d FFN
    # costs 24·b·s·L·d²·(1 + s/(6d) + V/(12Ld)) FLOPs in its matmuls (no causal discount).
    cfg = mha()
    ops = symbolic_ops(cfg, "prefill", kernel="naive")
    x = Dims.symbolic()
    mm = sum(op.flops * op.count for op in ops if op.matmul).subs({x.d_ff: 4 * x.d})
    megatron = 24 * b * n * L * d**2 * (1 + n / (6 * d) + V / (12 * L * d))
    assert sp.simplify(mha_subs(mm) - megatron) == 0


def test_kv_cache_formulas():
    # KV cache = 2·b·t·L·h_kv·d_h·bytes (MHA/MQA/GQA); L·t·b·(kv_lora_rank + qk_rope_head_dim)·bytes (MLA).
    from lmcost.operators.attention import cached_tokens, kv_width

    x = Dims.symbolic(precision=None)
    gqa = mha(attention=dict(n_heads=8, n_kv_heads=2))
    assert sp.simplify(x.L * x.b * cached_tokens(x, False) * kv_width(gqa, x) * x.B_kv
                       - 2 * x.b * x.t * x.L * x.h_kv * x.d_h * x.B_kv) == 0
    mla = mha(attention=dict(n_heads=8, mla=dict(kv_lora_rank=32, qk_nope_head_dim=8, v_head_dim=8)))
    assert sp.simplify(kv_width(mla, x) - (x.d_c + x.d_r)) == 0
    # A local layer caches min(t, w) tokens.
    assert cached_tokens(x, True) == sp.Min(x.t, x.w)


def test_gated_ffn_has_three_matrices():
    ops = symbolic_ops(mha(ffn=dict(activation="swiglu", d_ff=128)), "prefill")
    gemms = [op.name.split(".", 1)[1] for op in ops if op.op_class is OpClass.GEMM and ".ffn." in op.name]
    assert gemms == ["ffn.gate", "ffn.up", "ffn.down"]


def test_lm_head_flops_are_2bsdV():
    ops = symbolic_ops(mha(), "prefill")
    head = [op for op in ops if op.name == "lm_head"][0]
    assert sp.simplify(mha_subs(head.flops) - 2 * b * n * d * V) == 0


@pytest.mark.parametrize("s_, t_, w_", [(1, 10, 4), (5, 5, 3), (7, 20, 4), (6, 6, 100), (3, 9, 9)])
def test_windowed_causal_pairs_equal_brute_force(s_, t_, w_):
    # Query at absolute position j (1-based) sees min(j, w) keys; the pass covers j = t-s+1 .. t.
    from lmcost.operators.attention import _causal_pairs

    x = Dims(b=1, s=s_, t=t_, d=0, h=0, h_kv=0, d_h=0, d_ff=0, V=0, L=0, w=w_)
    assert _causal_pairs(x, True) == sum(min(j, w_) for j in range(t_ - s_ + 1, t_ + 1))
    assert _causal_pairs(x, False) == sum(j for j in range(t_ - s_ + 1, t_ + 1))
