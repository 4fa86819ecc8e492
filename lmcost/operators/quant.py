"""The bytes of quantized weights: each weight-reading operator of the graph mapped to its tensor under a
recipe (:mod:`lmcost.model.quant` holds the recipes and the formats' block layouts), and its weight bytes
rescaled to that tensor's exact bytes."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from lmcost.basics.dtypes import Precision
from lmcost.operators.forward import Dims, forward_ops, layer_group_names
from lmcost.operators.ops import OpClass
from lmcost.model.quant import recipe


def kind_of(op) -> tuple[str, str] | None:
    """(tensor kind, role within it) of an operator's weight, or None for an op that reads no weight.

    MLA's absorbed matmuls read slices of ``kv_b_proj``: they take its role."""
    r = op.role
    if op.op_class is OpClass.NORM or r in ("attn.sinks", "attn.diff") or (op.params and op.mnk is None and (
            r.endswith(".act") or r == "ffn.token_shift")):
        # gpt-oss's sinks: one 1-D tensor [h] per layer; DiffLlama's lambdas; xIELU's two scalars (Apertus);
        # RWKV's channel-mix token-shift ratios (time_mix_key, time_mix_receptance [d] each)
        return "vector", r
    if r == "embed":
        return "embedding", r
    if r == "pos_embed":
        return "pos_embedding", r
    if r == "lm_head":
        return "lm_head", r
    if r in ("moe.router", "moe.shared.gate_proj"):
        return "router", r
    if r.startswith("moe.expert."):
        return "expert", r.rsplit(".", 1)[1]
    if r.startswith(("ffn.", "moe.shared.")):
        return "ffn", r.rsplit(".", 1)[1]
    if r.startswith("attn.") and op.mnk is not None:
        sub = r.split(".", 1)[1]
        return "attention", ("kv_b_proj" if sub in ("q_absorb", "out_absorb") else sub)
    if r.startswith("mixer."):  # constant-state mixers (lmcost.operators.recurrent): projections as attention's,
        if op.mnk is not None:  # the conv weights, A_log, dt_bias and D small tensors kept as norms are
            return "attention", r.split(".", 1)[1]
        return "vector", r
    return None


def _tensors(op, cfg, tied: bool):
    """The stored tensors of one op as (kind, sub, rows, cols, copies): its matrix (or table) and its bias.

    A linear op's matrix is [N, K] from its mnk (out, in), times the experts or heads it owns; whatever
    params remain are its bias (1-D, kind ``vector``). A tied lm_head owns no tensor (the table is the
    embedding's, stored in the lm_head's format, as llama.cpp does when there is no ``output``)."""
    ks = kind_of(op)
    if ks is None or not op.params:
        return []
    kind, sub = ks
    if kind == "vector":
        return [("vector", sub, 1, op.params, 1)]
    if kind in ("embedding", "pos_embedding"):
        rows = cfg.vocab_size if kind == "embedding" else cfg.max_positions + cfg.position_offset
        return [("lm_head" if (kind == "embedding" and tied) else kind, sub, rows, op.params // rows, 1)]
    _, n_out, k_in = op.mnk
    copies = op.params // (n_out * k_in)
    out = [(kind, sub, n_out, k_in, copies)]
    bias = op.params - copies * n_out * k_in
    if bias:
        out.append(("vector", sub + ".bias", 1, bias, 1))
    return out


_PLANS: dict = {}


def _plan(cfg, name: str):
    """Built once per (config, recipe) and kept (by the config's identity). Per (layer group or "", role): (bytes over all its layers, elements over all its layers), and the
    per-tensor list behind :func:`weight_bytes`: (kind, format name, count, bytes) rows, exact."""
    hit = _PLANS.get((id(cfg), name))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    rec = recipe(name)
    ops = forward_ops(cfg, Dims.of(cfg, Precision(), 1, 1, 1), mla_mode="naive")
    tied = bool(cfg.tie_embeddings)
    by_group: dict = {}
    for op in ops:
        by_group.setdefault(op.group, []).append(op)
    layers = [(name, i) for i, name in enumerate(layer_group_names(cfg))] + [("", 0)]
    per_role: dict = {}
    rows_out: list = []
    for group, i in layers:
        for op in by_group.get(group, []):
            for kind, sub, rows, cols, copies in _tensors(op, cfg, tied):
                fmt = rec.format_for(cfg, kind, sub.removesuffix(".bias"), i, rows, cols)
                nb = copies * fmt.nbytes(rows, cols)
                key = (group, op.role)
                b, e = per_role.get(key, (0, 0))
                per_role[key] = (b + nb, e + copies * rows * cols)
                rows_out.append((kind, fmt.name, copies, nb))
    if len(_PLANS) > 64:
        _PLANS.clear()
    _PLANS[(id(cfg), name)] = (cfg, (per_role, rows_out))
    return per_role, rows_out


def weight_bytes(cfg, name: str) -> dict:
    """Bytes of every weight of ``cfg`` stored under recipe ``name``, exact per tensor over all layers.

    Returns: dict(total (bytes, int when whole), by_kind {kind: bytes}, by_format {format: (tensors, bytes)}).
    A routed-expert matrix is one tensor per layer (all experts), as GGUF stores it.
    Raises: LmcostError for an unknown recipe.
    """
    _, rows = _plan(cfg, recipe(name).name)
    by_kind: dict = {}
    by_format: dict = {}
    for kind, fmt, copies, nb in rows:
        by_kind[kind] = by_kind.get(kind, 0) + nb
        t, b = by_format.get(fmt, (0, 0))
        by_format[fmt] = (t + 1, b + nb)
    total = sum(by_kind.values())
    return dict(total=as_number(total), by_kind={k: as_number(v) for k, v in by_kind.items()},
                by_format={k: (t, as_number(b)) for k, (t, b) in by_format.items()})


def as_number(v: Fraction):
    """An exact byte count as an int when whole, else a float."""
    return int(v) if v.denominator == 1 else float(v)


def bytes_per_param(cfg, name: str, group: str, role: str) -> Fraction | None:
    """Bytes per weight element of the tensor an op of ``role`` in layer ``group`` reads, averaged over the
    group's layers when the format depends on the layer (so count x per-layer is the exact sum); the
    bias of a linear op is folded in. None if the op reads no weight of the recipe's."""
    per_role, _ = _plan(cfg, recipe(name).name)
    if role in ("attn.q_absorb", "attn.out_absorb"):
        role = "attn.kv_b_proj"
    if role == "lm_head" and (group, role) not in per_role and cfg.tie_embeddings:
        role = "embed"  # the tied table, stored in the lm_head's format
    hit = per_role.get((group, role))
    if hit is None or not hit[1]:
        return None
    return Fraction(hit[0]) / hit[1]


#: MLA's absorbed matmuls: vLLM dequantizes ``kv_b_proj`` into 16-bit W_UK / W_UV at load and runs these
#: batched matmuls in 16-bit (``MLACommonImpl.process_weights_after_loading``, recalled): not quantized GEMMs.
_DEQUANTIZED = ("attn.q_absorb", "attn.out_absorb")


def quantized_gemm(op, rec) -> bool:
    """Whether ``op`` is a GEMM the recipe ``rec`` (a :class:`lmcost.model.quant.Recipe`) runs in its own
    compute dtype: a GEMM kernel (``kind`` gemm, with an ``mnk``) reading a weight of a tensor kind the
    recipe quantizes (``rec.kinds``: attention and constant-state mixer projections, FFN, experts), not
    MLA's absorbed matmuls (:data:`_DEQUANTIZED`), and the recipe has a compute dtype of its own."""
    if not rec.compute or op.kind != "gemm" or op.mnk is None or not op.matmul or op.role in _DEQUANTIZED:
        return False
    ks = kind_of(op)
    return ks is not None and ks[0] in rec.kinds


def rescale(cfg, name: str, ops: list, B_w) -> list:
    """``ops`` with each weight read rescaled from ``B_w`` bytes per element to the recipe's bytes for its
    tensor (:func:`bytes_per_param`): a dense GEMM's weight bytes become its tensor's bytes exactly; a
    partial read (embedding rows gathered, the routed experts a batch touches) keeps its share.
    Ops a layout sharded keep the same bytes per element (the format of the whole tensor). A GEMM the
    recipe runs in its own compute dtype (:func:`quantized_gemm`) is marked with the recipe's name
    (``OpCost.quant``: the peak it runs at is :func:`lmcost.cost.roofline.gemm_dtype`'s)."""
    out = []
    rec = recipe(name)
    for op in ops:
        ratio = bytes_per_param(cfg, name, op.group, op.role)
        if ratio is None:
            out.append(op)
            continue
        if quantized_gemm(op, rec):
            op = replace(op, quant=rec.name)
        wb = op.weight_bytes
        if isinstance(wb, int) or (isinstance(wb, float) and wb.is_integer()):
            new = as_number(Fraction(wb) / Fraction(B_w) * ratio)
        else:
            new = wb * float(ratio / Fraction(B_w))
        out.append(replace(op, weight_bytes=new))
    return out
