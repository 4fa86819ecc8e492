"""Kernel fusion as a setting of the prediction: which operators a runtime runs as one kernel.

The graph (:mod:`lmcost.operators.forward`) writes one kernel per operator, each reading its inputs from memory
and writing its output back, with one exception kept by default: a gated FFN's activation and its
gating multiply are one kernel (``silu_mul``). A fusion removes the round trip of the intermediate
between the fused operators (its write and its read back) and the launches of all but one kernel;
FLOPs never change. Fusions (as in vLLM's kernels, and FlashAttention's fused rotary):

- ``silu_mul``: act(gate) * up in one kernel. Without it: act writes its output, a second kernel
  reads it back with up and writes the product (two more passes over [b,s,d_ff]).
- ``add_norm``: a residual add and the norm that follows it in one kernel (reads the two inputs,
  writes the new residual and the normalised output; the residual is not read back). Across layers,
  the block's last residual fuses into the next block's first norm: counted on this block's first norm.
- ``rope_attention``: RoPE applied inside the attention kernel (flash only): no pass of its own over
  Q and K.
- ``qkv``: Q, K and V projections as one GEMM of N = (h + 2 h_kv) d_h (MLA: q_a and kv_a): x read once.
- ``gate_up``: gate and up projections as one GEMM of N = 2 d_ff: x read once.
- ``moe_grouped``: the routed experts as one grouped GEMM kernel instead of one GEMM per expert hit.

Presets: ``none``; ``default`` (silu_mul, the numbers lmcost has always given); ``vllm`` and ``all``
(every fusion above).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from lmcost.basics.errors import LmcostError
from lmcost.operators.ops import OpClass, OpCost

FUSIONS = ("silu_mul", "add_norm", "rope_attention", "qkv", "gate_up", "moe_grouped")
PRESETS = {"none": (), "default": ("silu_mul",), "vllm": FUSIONS, "all": FUSIONS}


def parse_fusion(text: str) -> tuple[str, ...]:
    """``vllm`` or ``silu_mul,add_norm`` (or ``default,qkv``) -> the fusions, in FUSIONS order.

    Raises: LmcostError naming an unknown fusion or preset, ``none`` beside anything else (it says no
    fusion), or a fusion given twice, by name or inside a preset (``silu_mul,silu_mul``, ``vllm,qkv``).
    """
    if not text.strip(" ,"):
        raise LmcostError("fusion", "empty", "give none, default, vllm, or fusions separated by commas")
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:
        raise LmcostError("fusion", f"{text!r} has an empty item", "separate the fusions with single commas")
    if "none" in parts and len(parts) > 1:
        raise LmcostError("fusion", f"{text!r} gives none (no fusion) with others", "give none alone, or only the fusions wanted")
    names: list[str] = []
    for part in parts:
        if part not in PRESETS and part not in FUSIONS:
            raise LmcostError("fusion", f"unknown fusion {part!r}",
                              f"use presets {', '.join(PRESETS)} or fusions {', '.join(FUSIONS)}, comma-separated")
        for name in PRESETS.get(part, (part,)):
            if name in names:
                raise LmcostError("fusion", f"{text!r} gives {name} twice" + (f" ({part} includes it)" if part in PRESETS else ""),
                                  "name each fusion once")
            names.append(name)
    return tuple(f for f in FUSIONS if f in names)


def unfused_gated(op: OpCost) -> OpCost:
    """A gated activation (:func:`lmcost.operators.ffn.activation`) as two kernels: act(gate) writes its output,
    then act * up reads it back and writes the product (one more write and read of the output size)."""
    return replace(op, act_read_bytes=op.act_read_bytes + op.act_write_bytes, act_write_bytes=2 * op.act_write_bytes,
                   kernels=2)


def _merge_gemms(ops: list[OpCost], bases: tuple[str, ...], merged: str) -> list[OpCost]:
    """One GEMM from several that read the same input: FLOPs, weights, outputs add; the input is read once."""
    found = [op for op in ops if op.role in bases]
    if len(found) < 2:
        return ops
    first = found[0]
    m, _, k = first.mnk
    sum_ = lambda f: sum(getattr(op, f) for op in found)
    active = None if all(op.active_params is None for op in found) else \
        sum(op.params if op.active_params is None else op.active_params for op in found)
    fused = replace(first, name=f"{first.group + '.' if first.group else ''}{merged}", role=merged, flops=sum_("flops"),
                    weight_bytes=sum_("weight_bytes"), act_write_bytes=sum_("act_write_bytes"),
                    kv_write_bytes=sum_("kv_write_bytes"), params=sum_("params"), active_params=active,
                    mnk=(m, sum(op.mnk[1] for op in found), k),
                    shapes=" ; ".join(op.shapes for op in found))
    out = []
    for op in ops:
        if op is first:
            out.append(fused)
        elif not any(op is f for f in found):
            out.append(op)
    return out


#: Norm kinds whose fused residual add + norm kernel has a kind of its own, ``fused_add_<kind>``: a serving engine
#: runs another kernel for it than for the plain norm (vLLM: ``fused_add_rms_norm_kernel``'s vector path against
#: ``rms_norm_kernel``); figures without that kind fall back to the norm's (:meth:`lmcost.hardware.efficiency.Efficiency.kind_figures`).
FUSED_NORMS = ("rmsnorm", "layernorm")


def _fuse_add_norm(ops: list[OpCost]) -> list[OpCost]:
    """Each residual add followed (cyclically: last op -> first op of the next block) by a norm; the fused
    op's kind is ``fused_add_<norm kind>`` (:data:`FUSED_NORMS`)."""
    out = list(ops)
    i = 0
    while i < len(out):
        op = out[i]
        j = (i + 1) % len(out)
        nxt = out[j]
        if op.role.endswith("residual") and nxt.op_class is OpClass.NORM and j != i:
            fused = replace(nxt, flops=nxt.flops + op.flops, kind=f"fused_add_{nxt.kind}" if nxt.kind in FUSED_NORMS else nxt.kind,
                            act_read_bytes=nxt.act_read_bytes - op.act_write_bytes + op.act_read_bytes,
                            act_write_bytes=nxt.act_write_bytes + op.act_write_bytes,
                            shapes=f"{op.shapes} fused with {nxt.shapes}")
            out[j] = fused
            del out[i]
            continue
        i += 1
    return out


def _layer(ops: list[OpCost], fusion: set[str], kernel: str) -> list[OpCost]:
    if "silu_mul" not in fusion:
        ops = [unfused_gated(op) if op.kind.endswith("_mul") else op for op in ops]
    if "qkv" in fusion:
        ops = _merge_gemms(ops, ("attn.q_proj", "attn.k_proj", "attn.v_proj"), "attn.qkv_proj")
        ops = _merge_gemms(ops, ("attn.q_a_proj", "attn.kv_a_proj"), "attn.qkv_a_proj")
    if "gate_up" in fusion:
        for prefix in ("ffn.", "moe.expert.", "moe.shared."):
            ops = _merge_gemms(ops, (f"{prefix}gate", f"{prefix}up"), f"{prefix}gate_up")
    if "moe_grouped" in fusion:
        ops = [replace(op, mnk=(op.mnk[0] * op.kernels, *op.mnk[1:]), kernels=1)
               if op.role.startswith("moe.expert.") and op.mnk is not None else op for op in ops]
    if "rope_attention" in fusion and kernel == "flash":
        ops = [replace(op, weight_bytes=0, act_read_bytes=0, act_write_bytes=0, kv_read_bytes=0,
                       kv_write_bytes=0, kernels=0, shapes="inside attn.sdpa: no memory traffic of its own")
               if op.role == "attn.rope" else op for op in ops]
    if "add_norm" in fusion:
        ops = _fuse_add_norm(ops)
    return ops


def apply_fusion(ops: list[OpCost], fusion, kernel: str = "flash") -> list[OpCost]:
    """The ops of one forward pass with ``fusion`` applied, block by block (ops of one layer group).

    ``fusion``: names from FUSIONS. ``rope_attention`` needs the flash kernel (ignored with naive).
    """
    fusion = set(fusion)
    if fusion == {"silu_mul"}:
        return ops
    out: list[OpCost] = []
    for group, run in groupby(ops, key=lambda o: o.group):
        run = list(run)
        out += _layer(run, fusion, kernel) if group else run
    return out
