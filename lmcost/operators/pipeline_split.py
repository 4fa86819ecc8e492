"""Uneven pipeline splits: how many layers each pipeline stage (and each model chunk of the interleaved
schedule) holds when the stages are not given equal shares.

Why uneven: the first stage also runs the embedding and the last the final norm, lm_head and loss (at a
128k vocabulary the lm_head and loss cost about what 2-3 layers of an 8B model do), so an even split makes
the last stage the slowest and the busiest in memory. Runs give those stages fewer layers:

- Megatron-LM (Megatron-Core ``TransformerConfig``): ``--decoder-first-pipeline-num-layers`` and
  ``--decoder-last-pipeline-num-layers`` fix the first and last stages' layers, the rest split evenly over
  the middle stages (``get_num_layers_to_build`` asserts that they divide), or
  ``--pipeline-model-parallel-layout`` spells every stage out (here ``stage_layers``, one count per stage);
- Llama 3 405B (Dubey et al. 2024, section 3.3.2): 126 layers over 16 stages, "one Transformer layer each"
  fewer on the first and the last stage (7 + 14 x 8 + 7), so that "the first model chunk on the first stage
  has only the embedding, and the last model chunk on the last stage has only output projection and loss".

Under the interleaved schedule each stage's layers are cut into v model chunks (chunk c of the model, in
order, runs on stage c mod pp). A stage with fewer layers than the others takes the shortfall from its
first chunk on the first stage and from its last chunk on the last stage, as Dubey et al. describe; every
other stage's chunks are numpy.array_split of its layers (the first chunks take the extra layer).
Megatron-LM asks each stage's layers to divide by v; lmcost accepts any split (a chunk may hold none).
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.operators.parallel import _consecutive, stage_layers


def uneven_stages(n_layers: int, pp: int, first: int | None = None, last: int | None = None,
                  split: tuple | None = None) -> tuple | None:
    """Layers per pipeline stage, first to last, from Megatron-LM's first/last-stage counts (the rest
    split evenly over the middle stages) or an explicit ``split``; None when none is given (the even
    split of :func:`lmcost.operators.parallel.stage_layers`).

    Returns: a tuple of pp counts adding up to ``n_layers``, or None.
    Raises: LmcostError (stage_layers, first_stage_layers or last_stage_layers) for a split given with
    first/last counts, a split or counts without pipeline stages, counts below 1, a split whose length is
    not pp or whose sum is not the model's layers, or middle stages that the layers left do not divide or
    leave under 1 layer each.
    """
    if split is not None:
        if first is not None or last is not None:
            raise LmcostError("stage_layers", "an explicit split already fixes the first and last stages",
                              "drop `first_stage_layers`/`last_stage_layers`, or the split")
        split = tuple(split)
        if len(split) != pp:
            raise LmcostError("stage_layers", f"{len(split)} counts for pp={pp} stages", f"give {pp} counts, one per stage")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in split):
            raise LmcostError("stage_layers", f"{split!r} has a count below 1", "give every stage 1 layer or more")
        if sum(split) != n_layers:
            raise LmcostError("stage_layers", f"{'+'.join(map(str, split))} = {sum(split)} layers, and the model has "
                              f"{n_layers}", f"give counts adding up to {n_layers}")
        return split
    if first is None and last is None:
        return None
    for name, k in (("first_stage_layers", first), ("last_stage_layers", last)):
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise LmcostError(name, f"must be a whole number of 1 or more, got {k!r}", f"pass `{name}` >= 1")
    given = (first is not None) + (last is not None)
    field = "first_stage_layers" if first is not None else "last_stage_layers"
    if pp < 2:
        raise LmcostError(field, f"fixes one stage's layers, and pp={pp}", "add `pp` 2 or more, or drop it")
    rest, middle = n_layers - (first or 0) - (last or 0), pp - given
    if middle == 0:
        if rest != 0:
            raise LmcostError(field, f"{first} + {last} layers on the two stages, and the model has {n_layers}",
                              f"give counts adding up to {n_layers}")
        return (first, last)
    if rest < middle:
        taken = " + ".join(str(k) for k in (first, last) if k is not None)
        raise LmcostError(field, f"the first/last stages take {taken} of the {n_layers} layers and leave "
                          f"{max(rest, 0)} for the {middle} middle stages, which need 1 or more each",
                          f"give the first/last stages {n_layers - middle} layers or fewer in all")
    if rest % middle:
        raise LmcostError(field, f"the {rest} layers left do not split evenly over the {middle} other stages "
                          "(Megatron-LM requires it)", "change the count, or give every stage with `stage_layers`")
    each = rest // middle
    return ((first,) if first is not None else ()) + (each,) * middle + ((last,) if last is not None else ())


def chunk_layers(cfg, pp: int, v: int = 1, split: tuple | None = None) -> list[list[int]]:
    """Layer indices of each of the pp x v model chunks, in model order (chunk c runs on stage c mod pp):
    for v = 1, :func:`lmcost.operators.parallel.stage_layers`; for v > 1 without a split, numpy.array_split
    of the layers into pp x v chunks; with a split, each stage's layers cut into v chunks as the module
    docstring says (the first stage's shortfall in its first chunk, the last stage's in its last)."""
    if v == 1 or split is None:
        return stage_layers(cfg, pp * v, split if v == 1 else None)
    sizes = [0] * (pp * v)
    for i, k in enumerate(split):
        base, extra = divmod(k, v)
        per = [base + (1 if c < extra else 0) for c in range(v)]
        if i == 0 and pp > 1:
            per.reverse()  # the short chunk first (Dubey et al. 2024: "only the embedding")
        for c in range(v):
            sizes[c * pp + i] = per[c]
    return _consecutive(sizes)


def parse_counts(field: str, text: str | None) -> tuple | None:
    """'7,8,8,7' -> (7, 8, 8, 7); None -> None. Raises: LmcostError (``field``) for anything else."""
    if text is None:
        return None
    try:
        return tuple(int(k) for k in text.split(","))
    except ValueError:
        raise LmcostError(field, f"{text!r} is not comma-separated layer counts", "write e.g. 7,8,8,7") from None
