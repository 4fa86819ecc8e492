"""A config's ``architectures`` -> the model_type whose mapping reads it, for a ``model_type`` lmcost does not know.

Custom-code checkpoints commonly keep a known architecture under a new ``model_type`` (moonshotai/Kimi-K2's
config.json: ``model_type: kimi_k2``, ``architectures: [DeepseekV3ForCausalLM]``). ``CLASSES`` is transformers
5.24's ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` inverted (class -> model_type); where several types share a class,
the one whose config is the class's own (``LlamaForCausalLM`` -> llama; a ``_text`` decoder before its wrapper).
tests/test_hf_types.py checks it against transformers.
"""

from __future__ import annotations

#: Causal-LM class name -> model_type (transformers 5.24, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES inverted).
CLASSES: dict[str, str] = {
    "AXK1ForCausalLM": "axk1", "AXK2ForCausalLM": "axk2", "AfmoeForCausalLM": "afmoe",
    "Apertus1p5TextForCausalLM": "apertus1p5_text", "ApertusForCausalLM": "apertus", "ArceeForCausalLM": "arcee",
    "AriaTextForCausalLM": "aria_text", "BailingHybridForCausalLM": "bailing_hybrid", "BambaForCausalLM": "bamba",
    "BartForCausalLM": "bart", "BeamForCausalLM": "beam", "BertGenerationDecoder": "bert-generation",
    "BertLMHeadModel": "bert", "BigBirdForCausalLM": "big_bird", "BigBirdPegasusForCausalLM": "bigbird_pegasus",
    "BioGptForCausalLM": "biogpt", "BitNetForCausalLM": "bitnet", "BlenderbotForCausalLM": "blenderbot",
    "BlenderbotSmallForCausalLM": "blenderbot-small", "BloomForCausalLM": "bloom", "BltForCausalLM": "blt",
    "CTRLLMHeadModel": "ctrl", "CamembertForCausalLM": "camembert", "CodeGenForCausalLM": "codegen",
    "Cohere2ForCausalLM": "cohere2", "Cohere2MoeForCausalLM": "cohere2_moe",
    "CohereCompassForCausalLM": "cohere_compass_text", "CohereForCausalLM": "cohere", "CpmAntForCausalLM": "cpmant",
    "CwmForCausalLM": "cwm", "Data2VecTextForCausalLM": "data2vec-text", "DbrxForCausalLM": "dbrx",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV32ForCausalLM": "deepseek_v32",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV4ForCausalLM": "deepseek_v4",
    "DiffLlamaForCausalLM": "diffllama", "DogeForCausalLM": "doge", "DoryForCausalLM": "dory",
    "Dots1ForCausalLM": "dots1", "Dots3NoteForCausalLM": "dots3_note_text", "ElectraForCausalLM": "electra",
    "Emu3ForCausalLM": "emu3", "Ernie4_5ForCausalLM": "ernie4_5", "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "ErnieForCausalLM": "ernie", "Exaone4ForCausalLM": "exaone4", "ExaoneMoeForCausalLM": "exaone_moe",
    "FalconForCausalLM": "falcon", "FalconH1ForCausalLM": "falcon_h1", "FalconMambaForCausalLM": "falcon_mamba",
    "FlexOlmoForCausalLM": "flex_olmo", "FlintForCausalLM": "flint", "FuyuForCausalLM": "fuyu",
    "GPT2LMHeadModel": "gpt2", "GPTBigCodeForCausalLM": "gpt_bigcode", "GPTJForCausalLM": "gptj",
    "GPTNeoForCausalLM": "gpt_neo", "GPTNeoXForCausalLM": "gpt_neox",
    "GPTNeoXJapaneseForCausalLM": "gpt_neox_japanese", "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
    "Gemma3nForCausalLM": "gemma3n_text", "Gemma3nForConditionalGeneration": "gemma3n",
    "Gemma4AssistantForCausalLM": "gemma4_assistant", "Gemma4ForCausalLM": "gemma4_text",
    "Gemma4ForConditionalGeneration": "gemma4", "Gemma4UnifiedAssistantForCausalLM": "gemma4_unified_assistant",
    "Gemma4UnifiedForCausalLM": "gemma4_unified_text", "Gemma4UnifiedForConditionalGeneration": "gemma4_unified",
    "GemmaForCausalLM": "gemma", "GitForCausalLM": "git", "Glm4ForCausalLM": "glm4",
    "Glm4MoeForCausalLM": "glm4_moe", "Glm4MoeLiteForCausalLM": "glm4_moe_lite", "GlmForCausalLM": "glm",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa", "GotOcr2ForConditionalGeneration": "got_ocr2",
    "GptOssForCausalLM": "gpt_oss", "GraniteForCausalLM": "granite", "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeHybridForCausalLM": "granitemoehybrid", "GraniteMoeSWAForCausalLM": "granitemoe_swa",
    "GraniteMoeSharedForCausalLM": "granitemoeshared", "GraniteSWAForCausalLM": "granite_swa",
    "HYV3ForCausalLM": "hy_v3", "HYV4ForCausalLM": "hy_v4", "HeliumForCausalLM": "helium",
    "HrmTextForCausalLM": "hrm_text", "HunYuanDenseV1ForCausalLM": "hunyuan_v1_dense",
    "HunYuanMoEV1ForCausalLM": "hunyuan_v1_moe", "HyperCLOVAXForCausalLM": "hyperclovax",
    "Inkling2ForCausalLM": "inkling2_text", "Inkling2LoopForCausalLM": "inkling2_loop_text",
    "InklingForCausalLM": "inkling_text", "Jais2ForCausalLM": "jais2", "JambaForCausalLM": "jamba",
    "JetMoeForCausalLM": "jetmoe", "KimiLinearForCausalLM": "kimi_linear", "Kolibri1ForCausalLM": "kolibri1",
    "LagunaForCausalLM": "laguna", "LaraMiniForCausalLM": "lara_mini", "Lfm2ForCausalLM": "lfm2",
    "Lfm2MoeForCausalLM": "lfm2_moe", "Lfm3ForCausalLM": "lfm3", "Llama4ForCausalLM": "llama4_text",
    "LlamaForCausalLM": "llama", "LongcatFlashForCausalLM": "longcat_flash", "MBartForCausalLM": "mbart",
    "Mamba2ForCausalLM": "mamba2", "MambaForCausalLM": "mamba", "MarianForCausalLM": "marian",
    "MegatronBertForCausalLM": "megatron-bert", "MellumForCausalLM": "mellum",
    "MiMoV2FlashForCausalLM": "mimo_v2_flash", "MiniCPM3ForCausalLM": "minicpm3", "MiniMaxForCausalLM": "minimax",
    "MiniMaxM2ForCausalLM": "minimax_m2", "MiniMaxM3VLForCausalLM": "minimax_m3_vl_text",
    "Ministral3ForCausalLM": "ministral3", "MinistralForCausalLM": "ministral", "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral", "MllamaForCausalLM": "mllama",
    "ModernBertDecoderForCausalLM": "modernbert-decoder", "MoshiForCausalLM": "moshi",
    "MossTranscribeDiarizeForConditionalGeneration": "moss_transcribe_diarize", "MptForCausalLM": "mpt",
    "MusicgenForCausalLM": "musicgen", "MusicgenMelodyForCausalLM": "musicgen_melody", "MvpForCausalLM": "mvp",
    "NanoChatForCausalLM": "nanochat", "NemotronForCausalLM": "nemotron", "NemotronHForCausalLM": "nemotron_h",
    "OPTForCausalLM": "opt", "Olmo2ForCausalLM": "olmo2", "Olmo3ForCausalLM": "olmo3", "OlmoForCausalLM": "olmo",
    "OlmoHybridForCausalLM": "olmo_hybrid", "OlmoeForCausalLM": "olmoe", "OpenAIGPTLMHeadModel": "openai-gpt",
    "PLBartForCausalLM": "plbart", "PegasusForCausalLM": "pegasus", "PersimmonForCausalLM": "persimmon",
    "Phi3ForCausalLM": "phi3", "Phi4MultimodalForCausalLM": "phi4_multimodal", "PhiForCausalLM": "phi",
    "PhimoeForCausalLM": "phimoe", "ProphetNetForCausalLM": "prophetnet", "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5_text",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text", "Qwen4ExpForCausalLM": "qwen4_exp_text",
    "RecurrentGemmaForCausalLM": "recurrent_gemma", "ReformerModelWithLMHead": "reformer",
    "RemBertForCausalLM": "rembert", "RoCBertForCausalLM": "roc_bert", "RoFormerForCausalLM": "roformer",
    "RobertaForCausalLM": "roberta", "RobertaPreLayerNormForCausalLM": "roberta-prelayernorm",
    "RwkvForCausalLM": "rwkv", "SeedOssForCausalLM": "seed_oss", "SmolLM3ForCausalLM": "smollm3",
    "SolarOpenForCausalLM": "solar_open", "StableLmForCausalLM": "stablelm", "Starcoder2ForCausalLM": "starcoder2",
    "TrOCRForCausalLM": "trocr", "VaultGemmaForCausalLM": "vaultgemma", "WhisperForCausalLM": "whisper",
    "XGLMForCausalLM": "xglm", "XLMRobertaForCausalLM": "xlm-roberta", "XLMRobertaXLForCausalLM": "xlm-roberta-xl",
    "XLMWithLMHeadModel": "xlm", "XLNetLMHeadModel": "xlnet", "XmodForCausalLM": "xmod", "YoutuForCausalLM": "youtu",
    "Zamba2ForCausalLM": "zamba2", "ZambaForCausalLM": "zamba", "ZayaForCausalLM": "zaya",
    "xLSTMForCausalLM": "xlstm",
}


def through_architectures(data: dict, known) -> tuple[str, str] | None:
    """The (model_type, class) to read ``data`` as when its own model_type is not in ``known``: the first class of
    ``data["architectures"]`` whose model_type is, or None (no list, or no class lmcost models)."""
    archs = data.get("architectures")
    if not isinstance(archs, list):
        return None
    for cls in archs:
        mt = CLASSES.get(cls) if isinstance(cls, str) else None
        if mt is not None and mt in known:
            return mt, cls
    return None
