"""Which layers of a Llama-like family slide, and over how wide a window: the rules a
:class:`lmcost.model.hf.llama_like.FamilySpec` names in its ``window`` field.

A rule takes the reader and the layer count and returns ``(sliding_window, layer_pattern)``: the window in
tokens (None: no layer slides) and the per-layer kinds, ``local`` or ``global`` (None: every layer is as the
window says, all sliding when it is set). Each rule reads the keys its transformers config class reads
(``sliding_window``, ``layer_types``, and the class's own switches), so a config that sets one the model
ignores is still accepted and one it does not know is refused. Sources: the config classes' derivations of
``layer_types`` in transformers 5.24 (named at each rule).
"""

from __future__ import annotations

from collections.abc import Callable

from lmcost.basics.errors import LmcostError
from lmcost.model.hf.reader import Reader, mapped_layer_types

#: layer_types of the sliding-window families -> lmcost's attention kinds.
WINDOW_TYPES = {"sliding_attention": "local", "full_attention": "global"}

Window = tuple[int | None, list[str] | None]
WindowRule = Callable[[Reader, int], Window]
#: derive(reader, n_layers, window, period) -> (window, pattern): a config class's layers without layer_types.
Derive = Callable[[Reader, int, int | None, int | None], Window]


def ignored(r: Reader, n_layers: int) -> Window:
    """No layer slides: LlamaConfig and its kin have no sliding_window (their models never apply one). A window
    set anyway is refused, as for any key no mapping reads (null or 0, "none", is accepted); layer_types is
    accepted and not read.
    Raises: LmcostError naming sliding_window for a window other than null or 0."""
    r.get("layer_types", None, kind=list)
    if r.get("sliding_window", None, kind=int):
        raise LmcostError(f"{r.source}: sliding_window", f"{r.data['model_type']} has no sliding window (its config "
                          "class has no such key, and its attention attends to every token)",
                          "remove sliding_window, or write an lmcost YAML")
    return None, None


def every_layer(r: Reader, n_layers: int) -> Window:
    """sliding_window (null: none) on every layer; layer_types is accepted and not read (Starcoder2, PhiMoE,
    Ministral3 attention)."""
    r.get("layer_types", None, kind=list)
    return r.get("sliding_window", None, kind=int), None


def every_layer_if_enabled(r: Reader, n_layers: int) -> Window:
    """As :func:`every_layer`, only with use_sliding_window (Qwen3MoeConfig keeps the window only then)."""
    r.get("layer_types", None, kind=list)
    window = r.get("sliding_window", None, kind=int)
    return (window, None) if r.get("use_sliding_window", False) else (None, None)


def by_layer_types(derive: Derive, *, window_first: bool = False, derive_first: bool = False) -> WindowRule:
    """A rule that maps layer_types when the config has it, and otherwise ``derive``s the layers as the config
    class does. The period keys (sliding_window_pattern, _sliding_window_pattern, default 6) are read, as
    counts >= 1, whenever the config gets that far.

    window_first: without a window no layer slides, whatever layer_types says (a sliding layer without a
    window attends to everything). derive_first: without layer_types, ``derive`` decides before the period
    keys and the window are looked at (it gets period None).
    """

    def rule(r: Reader, n_layers: int) -> Window:
        types = r.get("layer_types", None, kind=list)
        window = r.get("sliding_window", None, kind=int)
        if window_first and not window:
            return None, None
        if derive_first and types is None:
            return derive(r, n_layers, window, None)
        period = r.count("sliding_window_pattern", r.count("_sliding_window_pattern", 6))
        if types is not None:
            pattern = mapped_layer_types(r, types, n_layers, WINDOW_TYPES)
            return (window if "local" in pattern else None), pattern
        if not window:
            return None, None
        return derive(r, n_layers, window, period)

    return rule


def _all_slide(r, n_layers, window, period) -> Window:
    return window, None


def _upper_layers(key_default: int, *, switch: str | None) -> Derive:
    """Layers at index >= max_window_layers slide (Qwen2Config: only with use_sliding_window)."""

    def derive(r, n_layers, window, period) -> Window:
        if switch is not None and not r.get(switch, False):
            return None, None
        first = r.get("max_window_layers", key_default)
        return window, ["global" if i < first else "local" for i in range(n_layers)]

    return derive


#: Mistral, Mixtral, Phi-3: every layer slides unless layer_types says otherwise.
all_slide = by_layer_types(_all_slide)
#: Ministral: as Mistral, and without a window no layer slides whatever layer_types says.
all_slide_if_windowed = by_layer_types(_all_slide, window_first=True)
#: Qwen2, Qwen2-MoE, Qwen3 (Qwen2Config): layers from max_window_layers (28) on slide, with use_sliding_window.
qwen2_upper_layers = by_layer_types(_upper_layers(28, switch="use_sliding_window"))
#: dots.llm1 (Dots1Config): layers from max_window_layers (62) on slide, the window set or not.
dots1_upper_layers = by_layer_types(_upper_layers(62, switch=None), derive_first=True)
#: Gemma 2 (Gemma2Config): even layers slide, odd are global.
alternating = by_layer_types(lambda r, n_layers, window, period: (window, ["local", "global"]))
#: Gemma 3 (Gemma3TextConfig): every sliding_window_pattern-th layer (6) is global, the others slide.
every_nth_global = by_layer_types(lambda r, n_layers, window, period: (window, ["local"] * (period - 1) + ["global"]))
#: OLMo 3 (Olmo3Config): every 4th layer is global; without a window none slides.
olmo3_fourth_global = by_layer_types(lambda r, n_layers, window, period: (window, ["local"] * 3 + ["global"]),
                                     window_first=True, derive_first=True)


def layer_types_or(pattern: list[str]) -> WindowRule:
    """layer_types says which layers slide; without it ``pattern`` (local/global) repeats, as the config class
    derives it (CwmConfig, VaultGemmaConfig). Without a window no layer slides (layer_types is then not used)."""

    def rule(r: Reader, n_layers: int) -> Window:
        window = r.get("sliding_window", None, kind=int)
        if not window:
            r.get("layer_types", None, kind=list)
            return window, None
        types = r.get("layer_types", None, kind=list)
        if types is None:
            return window, list(pattern)
        kinds = mapped_layer_types(r, types, n_layers, WINDOW_TYPES)
        return (window if "local" in kinds else None), kinds

    return rule
