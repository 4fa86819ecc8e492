"""Parameters of the vision tower a multimodal wrapper carries beside its decoder.

lmcost costs the decoder (the wrapper's ``text_config``); the tower runs once per image, outside
prefill and decode, but its weights sit in GPU memory. ``estimate --vision`` adds them to the weights.
Only towers whose parameter count is exact against transformers are counted (SigLIP, in Gemma 3);
others are 0 and the model's source says the tower is not counted.
"""

from __future__ import annotations

from lmcost.basics.errors import LmcostError
from lmcost.model.config import MAX_LAYERS, MAX_WIDTH

#: SiglipVisionConfig's defaults (transformers 5.24), for keys a vision_config leaves out.
SIGLIP_DEFAULTS = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_channels=3,
                       image_size=224, patch_size=16, vision_use_head=True)


def _int(v: dict, key: str, source: str) -> int:
    value = v.get(key, SIGLIP_DEFAULTS[key])
    if value is None:
        value = SIGLIP_DEFAULTS[key]
    top = MAX_LAYERS if key == "num_hidden_layers" else MAX_WIDTH  # the decoder's bounds (lmcost.model.config)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= top:
        raise LmcostError(f"{source}: vision_config.{key}", f"must be a whole number from 1 to {top:,}, got {value!r:.40}",
                          f"write {key} as in the model's config.json")
    return value


def siglip_params(v: dict, source: str = "config.json") -> int:
    """Parameters of a SigLIP vision tower (Zhai et al. 2023; transformers' SiglipVisionTransformer).

    With d = hidden_size, f = intermediate_size, p = patch_size, c = num_channels, L layers and
    N = (image_size / p)^2 patches: patch embedding c*p*p*d + d (a convolution with bias); position table
    N*d; per layer two LayerNorms 4d, q/k/v/o 4(d^2 + d), MLP 2df + f + d; a final LayerNorm 2d; and with
    vision_use_head, the attention-pooling head: a probe d, a multi-head attention 4d^2 + 4d, a LayerNorm
    2d and an MLP 2df + f + d. Raises: LmcostError for a width that is not a positive whole number.
    """
    d, f, L = (_int(v, k, source) for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    c, image, p = (_int(v, k, source) for k in ("num_channels", "image_size", "patch_size"))
    mlp = 2 * d * f + f + d
    n = c * p * p * d + d + (image // p) ** 2 * d + L * (4 * d + 4 * (d * d + d) + mlp) + 2 * d
    head = v.get("vision_use_head", SIGLIP_DEFAULTS["vision_use_head"])
    if head:
        n += d + 4 * d * d + 4 * d + 2 * d + mlp
    return n


def wrapper_vision_params(model_type: str, data: dict, d_text: int, source: str = "config.json") -> int:
    """The vision tower and projector of a wrapper config (0 where lmcost cannot count them exactly).

    Gemma 3: SigLIP (vision_config) + its projector, an RMSNorm of the tower's width and a [d_v, d_text]
    matrix (Gemma3MultiModalProjector): d_v * d_text + d_v. Only the widths above are read from
    vision_config; its other keys are not checked (the tower is not in the decoder's costs).
    Raises: LmcostError for a vision_config that is not a mapping, or a width that is not a positive whole number.
    """
    v = data.get("vision_config") or {}
    if not isinstance(v, dict):
        raise LmcostError(f"{source}: vision_config", f"must be a mapping, got {v!r:.40}",
                          "write vision_config as the tower's JSON object, or remove it")
    if model_type != "gemma3" or v.get("model_type", "siglip_vision_model") != "siglip_vision_model":
        return 0
    d_v = _int(v, "hidden_size", source)
    return siglip_params(v, source) + d_v * d_text + d_v
