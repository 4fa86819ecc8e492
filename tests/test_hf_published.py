"""Published config.json files of the families issue 14 added, against transformers and the model cards.

Parameters: the transformers model built from each file on the meta device (the decoder, for the Gemma-3
wrapper), and the published totals, worked by hand below. KV bytes: the cache transformers allocates for
a copy of the file shrunk where KV does not depend (vocabulary, FFN and expert widths, the number of
layers cut to one period of the layer pattern), scaled back to the whole depth.
"""

from __future__ import annotations

import json
import warnings

import pytest

from conftest import DATA
from lmcost.basics.dtypes import Precision
from lmcost.model.hf.families import from_hf_config
from lmcost.cost.kvcache import kv_bytes
from lmcost.cost.params import param_counts

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

DIR = DATA / "hf-published"
FILES = sorted(p.stem for p in DIR.glob("*.json"))
TOWERS = ("vision_tower", "multi_modal_projector", "vision_model")


def published(stem: str) -> dict:
    return json.loads((DIR / f"{stem}.json").read_text())


def build(data: dict, device="meta"):
    cfg = transformers.CONFIG_MAPPING[data["model_type"]](**{k: v for k, v in data.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            return transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("stem", FILES)
def test_published_configs_match_transformers_exactly(stem):
    data = published(stem)
    model = build(data)
    decoder = sum(p.numel() for n, p in model.named_parameters() if not any(t in n for t in TOWERS))
    assert param_counts(from_hf_config(data, stem))["total"] == decoder


def test_published_totals_worked_by_hand():
    # phi-2: embed 51200*2560; per layer q, k, v, dense 4*(2560^2 + 2560), fc1 + fc2 2*2560*10240 + 10240
    # + 2560, one LayerNorm 2*2560; final LayerNorm; lm_head with bias 51200*2560 + 51200.
    phi = 51200 * 2560 + 32 * (4 * (2560**2 + 2560) + 2 * 2560 * 10240 + 10240 + 2560 + 2 * 2560) \
        + 2 * 2560 + 51200 * 2560 + 51200
    assert phi == 2_779_683_840 == param_counts(from_hf_config(published("phi-2")))["total"]
    # Qwen3-8B: embed and lm_head 151936*4096 each; per layer q, o 4096^2, k, v 1024*4096, MLP 3*4096*12288,
    # two norms 2*4096 and the per-head q/k norms 2*128; a final norm.
    qwen = 2 * 151936 * 4096 + 36 * (2 * 4096**2 + 2 * 1024 * 4096 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128) + 4096
    assert qwen == 8_190_735_360 == param_counts(from_hf_config(published("qwen3-8b")))["total"]
    # OLMoE-1B-7B: embed and lm_head 50304*2048; per layer q, k, v, o 4*2048^2, q/k norms over all heads
    # 2*2048, router 64*2048, 64 experts of 3*2048*1024, two norms; a final norm. Active: 8 of 64 experts.
    olmoe = 2 * 50304 * 2048 + 16 * (4 * 2048**2 + 2 * 2048 + 64 * 2048 + 64 * 3 * 2048 * 1024 + 2 * 2048) + 2048
    counts = param_counts(from_hf_config(published("olmoe-1b-7b-0924")))
    assert olmoe == 6_919_161_856 == counts["total"]
    assert counts["active_per_token"] == olmoe - 16 * 56 * 3 * 2048 * 1024 == 1_282_017_280  # the card: 1.3B


#: Widths KV does not depend on, shrunk so a CPU forward is quick; the layer count cut to the period.
SHRINK = {"phi-2": dict(num_hidden_layers=2), "qwen3-8b": dict(num_hidden_layers=2),
          "olmoe-1b-7b-0924": dict(num_hidden_layers=2, num_experts=4, num_experts_per_tok=2),
          "gemma-3-4b-it": dict(num_hidden_layers=6)}


@pytest.mark.parametrize("stem, per_token", [
    ("phi-2", 2 * 32 * 80 * 2 * 32),                  # K and V, 32 heads of 80, bf16, 32 layers: 320 KiB
    ("qwen3-8b", 2 * 8 * 128 * 2 * 36),               # 8 KV heads of 128, 36 layers: 144 KiB
    ("olmoe-1b-7b-0924", 2 * 16 * 128 * 2 * 16),      # 16 KV heads of 128, 16 layers: 128 KiB
    ("gemma-3-4b-it", 2 * 4 * 256 * 2 * 34),          # 4 KV heads of 256, 34 layers, below the 1024 window
])
def test_published_kv_bytes_per_token_equal_the_cache(stem, per_token):
    data = published(stem)
    full = from_hf_config(data, stem)
    small = json.loads(json.dumps(data))
    text = small.get("text_config", small)
    text.update(vocab_size=128, intermediate_size=64, **SHRINK[stem])
    if "vision_config" in small:  # the tower holds no KV: a small one builds quickly
        small["vision_config"].update(num_hidden_layers=1, hidden_size=64, intermediate_size=64,
                                      num_attention_heads=4, image_size=224)
    cfg = from_hf_config(small, stem)
    model = build(small, "cpu").eval().to(torch.bfloat16)
    b, t = 2, 9
    with torch.no_grad():
        cache = model(torch.randint(0, 100, (b, t)), use_cache=True).past_key_values
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert kv_bytes(cfg, Precision(), b, t) == allocated
    L, l = full.n_layers, cfg.n_layers
    assert kv_bytes(full, Precision(), 1, 1) == per_token == kv_bytes(cfg, Precision(), 1, 1) * L // l


@pytest.mark.parametrize("data", [published("gemma-3-4b-it"), "default"], ids=["gemma-3-4b-it", "gemma3-default"])
def test_vision_tower_parameters_equal_transformers(data):
    # SigLIP by hand for the default tower (d 768, f 3072, 12 layers, 224 px in 16 px patches, with the
    # attention-pooling head): patch 3*16*16*768 + 768, positions 196*768, 12 layers of 4*768 + 4*(768^2 + 768)
    # + 2*768*3072 + 3072 + 768, post-norm 2*768, head 768 + 4*768^2 + 4*768 + 2*768 + 2*768*3072 + 3072 + 768
    # = 92,884,224; the projector 768*2304 + 768 = 1,770,240 (2304: the default decoder's width).
    if data == "default":
        data = transformers.CONFIG_MAPPING["gemma3"]().to_dict()
        assert from_hf_config(data, "gemma3").vision_params == 92_884_224 + 1_770_240
    model = build(data)
    tower = sum(p.numel() for n, p in model.named_parameters() if any(t in n for t in TOWERS))
    cfg = from_hf_config(data, "gemma3")
    assert cfg.vision_params == tower
    if data.get("_name_or_path"):  # google/gemma-3-4b-it's card: 4,300,079,472 parameters in all
        assert param_counts(cfg)["total"] + cfg.vision_params == 4_300_079_472


def test_estimate_vision_adds_the_tower_to_memory(monkeypatch, capsys, tmp_path):
    from lmcost import Workload, estimate, load_gpu
    from lmcost.cli import main
    from lmcost.operators.workload import Settings

    cfg, gpu, wl = from_hf_config(published("gemma-3-4b-it")), load_gpu("h100"), Workload(batch=1, prompt=64, gen=4)
    with_tower = estimate(cfg, gpu, wl, settings=Settings(vision=True)).memory
    without = estimate(cfg, gpu, wl).memory
    assert with_tower["weights_bytes"] - without["weights_bytes"] == 419_816_304 * 2  # bf16
    path = tmp_path / "qwen.json"
    path.write_text(json.dumps(published("qwen3-8b")))
    monkeypatch.setattr("sys.argv", ["lmcost", "estimate", str(path), "--vision"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: --vision: ")
