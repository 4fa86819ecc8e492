"""Which Hugging Face model types lmcost accepts, and why it refuses the rest.

``transformers`` maps a causal-LM head onto every model type in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``
(196 in 5.24), decoder-only or not. lmcost accepts a type only where its mapping is exact against the
transformers model (parameters, FlopCounterMode matmul FLOPs, cache bytes: tests/test_hf_types.py walks
them all). ``REFUSED`` gives, for each other type, the reason in a few words; the README's list is
:func:`types_markdown`, and a config of a refused type gets the reason in its one-line error. It imports
nothing of lmcost: :mod:`lmcost.model.hf.families` reads it.
"""

from __future__ import annotations

_ENCODER = "an encoder or encoder-decoder stack (bidirectional or cross-attending), not a decoder-only LM"
_INDEXER = "a learned sparse-attention indexer (DeepSeek Sparse Attention style)"
_NO_DEFAULT = "its config class's defaults build no model (a required width is left unset)"
_RECURRENT = "a recurrent mixer lmcost does not model"

REFUSED: dict[str, str] = {
    **dict.fromkeys(["bart", "bert", "bert-generation", "big_bird", "bigbird_pegasus", "blenderbot",
                     "blenderbot-small", "camembert", "data2vec-text", "electra", "ernie", "marian", "mbart",
                     "megatron-bert", "mvp", "pegasus", "plbart", "prophetnet", "rembert", "roberta",
                     "roberta-prelayernorm", "roc_bert", "roformer", "trocr", "whisper", "xlm", "xlm-roberta",
                     "xlm-roberta-xl", "xlnet", "xmod", "modernbert-decoder"], _ENCODER),
    "reformer": "LSH and reversible layers (Reformer)",
    # The DSA indexer itself is modelled (lmcost.model.hf.sparse: deepseek_v32, glm_moe_dsa); these lack another part.
    "dots3_note_text": "DSA beside sliding-window MLA layers with a per-head output gate and a RoPE-key norm (not mapped)",
    "dots3_note": "a wrapper of dots3_note_text (DSA beside sliding-window MLA layers with a per-head output gate, "
                  "not mapped)",
    "axk2": "DSA with low-rank input-gated RMSNorms and a fused query-and-gate MLA projection (not mapped)",
    "hy_v4": "hyper-connections (hc_mult residual streams) around DSA layers",
    "minimax_m3_vl_text": "a block-sparse indexer (top-k blocks of index_block_size keys, plus local blocks) over GQA",
    **dict.fromkeys(["qwen4_exp", "qwen4_exp_text"], "hyper-connections (hc_count residual streams mixed in every "
                    "layer: the first of its mechanisms lmcost does not model)"),
    "zamba": "one attention+MLP block shared by several layers, fed [hidden, embeddings] (2d wide), beside "
             "multi-head Mamba-1 layers (not mapped)",
    "zamba2": "shared attention blocks with per-use LoRA beside Mamba-2 layers",
    "falcon_h1": "attention and a Mamba-2 mixer side by side in every layer, with per-branch multipliers (not mapped)",
    "kimi_linear": f"{_RECURRENT} (Kimi delta attention beside MLA)",
    "bailing_hybrid": f"{_RECURRENT} (a delta attention with a forget gate beside MLA)",
    "lfm3": "gated short convolutions with sandwich norms and attention gates (not mapped)",
    "mllama": "cross-attention layers to image features",
    "musicgen": "cross-attention to a text encoder over audio codebooks",
    "musicgen_melody": "audio codebooks with a conditioning prefix",
    "moshi": "a depth decoder over audio codebooks",
    "moss_transcribe_diarize": "an audio encoder-decoder",
    "fuyu": "image patches projected into the decoder (multimodal)",
    "emu3": "a VQ image tokenizer inside the model (multimodal)",
    "got_ocr2": "a vision encoder inside the model (multimodal)",
    "git": "an image encoder inside the model (multimodal)",
    "phi4_multimodal": "vision and audio towers with LoRA adapters inside the model",
    "blt": "byte-level latent patching (local encoder/decoder around a global model)",
    **dict.fromkeys(["gemma4_assistant", "gemma4_unified_assistant"],
                    "a speculative-decoding drafter whose every layer reads its target model's K/V"),
    "dory": "recurrent-depth loops: a range of shared layers run n_recurrent_loops times (parameters once, FLOPs and "
            "a KV cache per pass), on nGPT's normalized layers",
    "hrm_text": "hierarchical recurrent cycles: two shared stacks run H_cycles x (L_cycles + 1) times (a KV cache per "
                "pass), with prefix-LM masks",
    "inkling2_loop_text": "relative position biases conditioned on the hidden states (Inkling2's), beside loops over "
                          "a range of shared layers",
    "deepseek_v4": "compressed KV attention with " + _INDEXER,
    **dict.fromkeys(["inkling_text", "inkling2_text"], "relative position biases conditioned on the hidden states "
                    "(a projection per head mixing a learned bank of bias-by-distance profiles)"),
    "zaya": "compressed convolutional attention (q/k mixed by causal convolutions, a delayed-value state)",
    "cpmant": "T5-style relative position biases from a learned bucket table (segment-aware), with learned prompt "
              "tokens prepended to every input",
    "gpt_neox_japanese": "a bias on the attention output of the last layer only (a per-layer bias is not modelled)",
}


def types_markdown(accepted: list[str]) -> str:
    """The README's list: the ``accepted`` types (:func:`lmcost.model.hf.families.accepted_types`), then each refused
    type with its reason."""
    lines = [f"Accepted ({len(accepted)}): " + ", ".join(f"`{t}`" for t in accepted) + ".", ""]
    by_reason: dict[str, list[str]] = {}
    for t, why in sorted(REFUSED.items()):
        if t not in accepted:
            by_reason.setdefault(why, []).append(t)
    lines += ["Refused, with the reason:", ""]
    lines += [f"- {why}: " + ", ".join(f"`{t}`" for t in ts) for why, ts in sorted(by_reason.items())]
    return "\n".join(lines)

