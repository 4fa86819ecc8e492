"""Map a Hugging Face ``config.json`` onto :class:`lmcost.model.config.ArchConfig`, through the one registry of
families (:mod:`lmcost.model.hf.registry`).

Each supported ``model_type`` names the keys it reads and the defaults its ``transformers`` config class uses
when a key is absent (the reference for what a field means). A key that changes the cost and that the mapping
does not read is an error, not a silent default; keys that do not change FLOPs, bytes or parameters (token ids,
dropout, epsilons, RoPE frequencies and scaling, initialisation) are listed in
:data:`lmcost.model.hf.reader.NO_COST` and skipped. A ``quantization_config`` selects the checkpoint's recipe
(:func:`lmcost.model.quant.from_hf`) or is refused.

The families, one file per group, each registering its own: :mod:`~lmcost.model.hf.llama_like` (table entries,
:class:`~lmcost.model.hf.llama_like.FamilySpec`, with Gemma 3's and Mistral 3's wrappers), :mod:`~lmcost.model.hf.moe`
(the Llama-like mixtures of experts), :mod:`~lmcost.model.hf.gpt` (GPT-style families),
:mod:`~lmcost.model.hf.attention_features` (sinks, chunked attention, NoPE layers) and :mod:`~lmcost.model.hf.hybrid`
(recurrent-state layers beside attention), :mod:`~lmcost.model.hf.mla_variants` (MLA and MoE variants: LongCat-Flash's
zero-computation experts and shortcut MoE, A.X-K1's post-MoE norm). ``python -m lmcost.model.hf`` prints the README's list of accepted
:mod:`~lmcost.model.hf.attention_features` (sinks, chunked attention, NoPE layers), :mod:`~lmcost.model.hf.hybrid`
(recurrent-state layers beside attention) and :mod:`~lmcost.model.hf.linear_attention` (linear-attention layers
beside attention). ``python -m lmcost.model.hf`` prints the README's list of accepted
and refused types.
"""

from __future__ import annotations

import warnings

from pydantic import ValidationError

from lmcost.basics.errors import LmcostError, LmcostNote, from_validation_error
from lmcost.model.config import ArchConfig
from lmcost.model.hf import alibi, attention_features, classic, filled, gemma_n, gpt, hybrid, layouts_a, layouts_b, linear_attention, llama_like, mla_variants, moe, odds, rnn, sparse, ssm
from lmcost.model.hf.architectures import through_architectures
from lmcost.model.hf.reader import _NO_COST_PATTERN, NO_COST, Reader, check_values
from lmcost.model.hf.registry import FAMILIES, Wrapper
from lmcost.model.vision import wrapper_vision_params
from lmcost.model.hf.verdicts import REFUSED
from lmcost.model.quant import from_hf

#: The family group files: each registers its families as it is imported.
GROUPS = (llama_like, moe, gpt, attention_features, hybrid, alibi, mla_variants, layouts_a, layouts_b, linear_attention, ssm, sparse, filled, gemma_n, classic, rnn, odds)


def supported() -> list[str]:
    """Every model_type with a mapping of its own (the registry less its wrappers), sorted."""
    return sorted(mt for mt, entry in FAMILIES.items() if not isinstance(entry, Wrapper))


#: The model types mapped (at import: a family registered later is mapped but not listed here).
SUPPORTED = supported()
#: The multimodal wrappers: model_type -> Wrapper (its text_config's type, and whose tie_word_embeddings rules).
WRAPPERS = {mt: entry for mt, entry in sorted(FAMILIES.items()) if isinstance(entry, Wrapper)}


#: Keys of a Hugging Face config that count MTP modules (DeepSeek-V3, GLM-4.5, MiMo: num_nextn_predict_layers;
#: Qwen3-Next: mtp_num_hidden_layers; MiMo-V2-Flash: num_mtp_layers): ArchConfig.mtp_modules.
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers")
#: Top-level keys every wrapper's config class has (its towers' configs, tying, quantization, token ids); a key
#: outside these, the wrapper's own (Wrapper.own), NO_COST and token ids is the decoder's, and refused there.
WRAPPER_KEYS = {"text_config", "vision_config", "audio_config", "quantization_config", "tie_word_embeddings",
                "model_type", "architectures", "_name_or_path"}


def _unwrap(wrapper: Wrapper, data: dict, source: str) -> ArchConfig:
    """The decoder of a multimodal wrapper config: its text_config, mapped, with the wrapper's
    quantization_config and (where the wrapper's model ties by it) tie_word_embeddings. lmcost counts the
    decoder; the vision tower and projector are not counted (Gemma 3's SigLIP is counted apart), and the
    source says so."""
    mt = wrapper.model_type
    text = data.get("text_config")
    if text is None:  # absent or null: the wrapper's config class fills in its decoder's defaults
        text = {}
    if not isinstance(text, dict):
        raise LmcostError(f"{source}: text_config", f"must be a mapping, got {text!r:.40}",
                          "write text_config as the decoder's JSON object")
    for key in data:
        if key not in WRAPPER_KEYS and key not in wrapper.own and key not in NO_COST \
                and not _NO_COST_PATTERN.match(key) and not key.endswith("_token_index"):
            raise LmcostError(f"{source}: {key}", f"not a key of the {mt} wrapper: the decoder's keys go in text_config",
                              f"move {key} into text_config, or remove it")
    text = {**text, "model_type": text.get("model_type") or wrapper.text_type}
    decoder = FAMILIES.get(text["model_type"])
    if decoder is None or isinstance(decoder, Wrapper):
        raise LmcostError(f"{source}: text_config.model_type", f"the {mt} decoder is {text['model_type']!r}, "
                          "which lmcost does not model", "write an lmcost YAML of the decoder")
    if text["model_type"] not in (wrapper.text_type, *wrapper.aliases):
        raise LmcostError(f"{source}: text_config.model_type",
                          f"{text['model_type']!r} is modelled, but not as the {mt} decoder "
                          f"({' or '.join((wrapper.text_type, *wrapper.aliases))})",
                          f"give the {mt} decoder's type, or map the decoder's config.json alone")
    if wrapper.ties and data.get("tie_word_embeddings") is not None:
        text["tie_word_embeddings"] = data["tie_word_embeddings"]
    if data.get("quantization_config") is not None:
        text["quantization_config"] = data["quantization_config"]
    if data.get("_name_or_path"):
        text["_name_or_path"] = data["_name_or_path"]
    cfg = from_hf_config(text, f"{source}: text_config")

    vision = wrapper_vision_params(mt, data, cfg.d_model, source)
    extra = [k for k in ("vision_config", "audio_config") if k in data]
    note = f"; its {' and '.join(k.removesuffix('_config') for k in extra)} tower is not counted" if extra else ""
    if vision:
        note = f"; its vision tower and projector ({vision:,} parameters) are not in the decoder's costs"
    name = cfg.name if data.get("_name_or_path") else str(source).rstrip("/").split("/")[-1].removesuffix(".json")
    return cfg.model_copy(update={"name": name, "vision_params": vision,
                                  "source": f"Hugging Face config.json ({mt}: the decoder, "
                                            f"text_config {text['model_type']}{note})"})


def from_hf_config(data: dict, source: str = "config.json") -> ArchConfig:
    """An ArchConfig from the fields of a Hugging Face ``config.json``, mapped by its model_type's registry entry.

    A multimodal wrapper (gemma3, mistral3, llama4, ...) maps to its decoder, ``text_config``.
    A ``model_type`` lmcost does not know is read as the type of the first class ``architectures`` names that
    lmcost models (:mod:`lmcost.model.hf.architectures`), with an :class:`LmcostNote` warning saying so.
    Raises: LmcostError for an unknown ``model_type`` (listing the supported ones) or a refused one (with the
    reason, :data:`lmcost.model.hf.verdicts.REFUSED`), a missing required field, a field whose value is not
    modelled (ALiBi, an unknown activation, cross-attention), a field the mapping does not understand, or a value
    that means nothing (:func:`lmcost.model.hf.reader.check_values`: nan, a negative RoPE base, float128).
    """
    mt = data.get("model_type")
    entry = FAMILIES.get(mt)
    check_values(data, source)
    if isinstance(entry, Wrapper):
        return _unwrap(entry, data, source)
    if entry is None:
        known = {t for t, e in FAMILIES.items() if not isinstance(e, Wrapper)}
        via = through_architectures(data, known) if mt not in REFUSED else None
        if via is not None:  # custom code keeping a modelled architecture under a new model_type (Kimi-K2)
            warnings.warn(LmcostNote(f"note: {source}: model_type {mt!r} is not one lmcost knows; read as "
                                     f"{via[0]} because architectures names {via[1]}"), stacklevel=2)
            cfg = from_hf_config({**data, "model_type": via[0]}, source)
            return cfg.model_copy(update={"source": f"Hugging Face config.json ({mt}, read as {via[0]} through "
                                                    f"architectures {via[1]})"})
        if mt in REFUSED:
            raise LmcostError(f"{source}: model_type", f"{mt} is not modelled: {REFUSED[mt]}",
                              "write an lmcost YAML of the architecture (see lmcost/data/models/llama-3-8b.yaml)")
        raise LmcostError(f"{source}: model_type", f"unknown model_type {mt!r}",
                          f"supported: {', '.join(supported())}; or write an lmcost YAML")
    r = Reader(data, source)
    r.must_not("add_cross_attention", "cross-attention")
    if data.get("use_bidirectional_attention") == "vision":  # Gemma 4: image tokens only; text stays causal
        r.used.add("use_bidirectional_attention")
    else:
        r.must_not("use_bidirectional_attention", "bidirectional (non-causal) attention")
    fields = entry(r, mt)
    if fields.get("positions", "rope") != "learned" and "max_positions" not in fields:
        # RoPE has no table, but the context a model was trained for is worth a warning past it.
        trained = r.get("max_position_embeddings", None, kind=int)
        if trained is not None:
            fields["max_positions"] = trained
    qc = r.get("quantization_config", None, kind=dict)
    if qc is not None:
        fields["quant"] = from_hf(qc, source)
    mtp = next((data[k] for k in MTP_KEYS if data.get(k) is not None), None)
    if mtp:  # the MTP modules serve --spec mtp drafts with (their weights cost nothing here)
        fields["mtp_modules"] = mtp
    r.done(mt)
    name = str(data.get("_name_or_path") or source).rstrip("/").split("/")[-1].removesuffix(".json")
    try:
        return ArchConfig.model_validate({"name": name, "source": f"Hugging Face config.json ({mt})", **fields})
    except ValidationError as e:
        raise from_validation_error(e, source) from None


def accepted_types() -> list[str]:
    """Every model_type lmcost maps: the families and the multimodal wrappers whose decoder is one of them."""
    families = supported()
    return sorted(set(families) | {mt for mt, w in WRAPPERS.items() if w.text_type in families})

