"""KV-cache footprints against the tensors PyTorch decode loops allocate, and the variant comparison."""

from __future__ import annotations

import json

import pytest

from conftest import ROOT, hf_decode_cache
from lmcost import LmcostError, Precision, Settings, load_config, load_gpu
from lmcost.cli import app
from lmcost.cost.kvcache import kv_bytes
from lmcost.apps.kv import compare, decode_footprint, max_batch, max_context
from lmcost.model.variants import derive, with_window

pytestmark = [pytest.mark.torch, pytest.mark.transformers]
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BF16 = Precision()
H100 = load_gpu("h100")


@pytest.mark.parametrize("model_type, over", [
    ("llama", dict(num_key_value_heads=2)),     # GQA-2
    ("llama", dict(num_key_value_heads=4)),     # MHA
    ("falcon", dict(num_kv_heads=1)),           # MQA (multi_query)
])
def test_global_cache_equals_transformers_tensors(model_type, over):
    cfg, layers = hf_decode_cache(model_type, **over)
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    # 3 sequences at context t = 5 + 14 = 19 tokens.
    assert kv_bytes(cfg, BF16, 3, 19) == allocated


@pytest.mark.parametrize("model_type, over", [
    ("bloom", dict(hidden_size=64, n_layer=2, n_head=4, vocab_size=128)),
    ("mpt", dict(d_model=64, n_layers=2, n_heads=4, vocab_size=128)),
    ("falcon", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, alibi=True,
                    multi_query=False)),
])
def test_alibi_caches_equal_transformers_tensors(model_type, over):
    # ALiBi keeps no position state: the cache is K and V, [b, h, t, d_h] per layer. 3 sequences at
    # t = 5 + 14 = 19: 2 layers x 2 (K, V) x 4 heads x 16 x 2 B x 3 x 19 = 29,184 B.
    cfg, layers = hf_decode_cache(model_type, tiny=False, **over)
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    assert kv_bytes(cfg, BF16, 3, 19) == allocated == 2 * 2 * 4 * 16 * 2 * 3 * 19


def test_sliding_window_cache_against_transformers():
    # transformers' DynamicSlidingWindowLayer trims to w - 1 tokens between steps (the next query
    # brings the w-th); Mistral's reference rolling buffer and vLLM hold w. Ours holds min(t, w) = w:
    # exactly one token per local layer more than transformers keeps between steps.
    cfg, layers = hf_decode_cache("gemma2", sliding_window=8, num_hidden_layers=4, num_key_value_heads=2)
    kinds = [kind for kind, _ in cfg.layer_kinds()]
    assert kinds == ["local", "global", "local", "global"]
    per_token = 2 * 2 * 16 * 2  # K and V x 2 heads x 16 x 2 bytes, per sequence and layer
    allocated = sum(layer.keys.nbytes + layer.values.nbytes for layer in layers)
    assert [layer.keys.shape[2] for layer in layers] == [7, 19, 7, 19]
    assert kv_bytes(cfg, BF16, 3, 19) == allocated + 2 * 3 * per_token


def test_rolling_buffer_and_latent_caches_of_a_decode_loop():
    # A decode loop shaped like Mistral's reference (a rolling buffer of w positions per layer) and
    # like DeepSeek's absorbed MLA inference (a latent cache [b, t, d_c] and a RoPE-key cache [b, t, d_r]):
    # the buffers it allocates for b = 2 sequences at context t = 40.
    b, t, w = 2, 40, 16
    mistral = with_window(load_config("mistral-7b"), w, None)
    k = [torch.empty(b, w, 8, 128, dtype=torch.bfloat16) for _ in range(32)]
    v = [torch.empty(b, w, 8, 128, dtype=torch.bfloat16) for _ in range(32)]
    assert kv_bytes(mistral, BF16, b, t) == sum(x.nbytes for x in k + v)
    ds = load_config("deepseek-v2-lite")
    latent = [torch.empty(b, t, 512, dtype=torch.bfloat16) for _ in range(27)]
    rope_k = [torch.empty(b, t, 64, dtype=torch.bfloat16) for _ in range(27)]
    assert kv_bytes(ds, BF16, b, t) == sum(x.nbytes for x in latent + rope_k)


def test_paged_cache_rounds_up_to_blocks():
    # t = 17 tokens in blocks of 16 take 2 blocks = 32 token slots: 32 x 131,072 B for Llama-3-8B.
    cfg = load_config("llama-3-8b")
    assert kv_bytes(cfg, BF16, 1, 17, block_size=16) == 32 * 131_072
    assert kv_bytes(cfg, BF16, 1, 17) == 17 * 131_072


def test_variants_change_only_attention():
    base = load_config("llama-2-7b")
    for label in ("mha", "gqa:8", "mqa", "mla:512"):
        v = derive(base, label).cfg
        same = {k: getattr(v, k) for k in ("d_model", "n_layers", "vocab_size", "ffn", "norm", "block")}
        assert same == {k: getattr(base, k) for k in same}
    assert derive(base, "gqa:8").cfg.h_kv == 8 and derive(base, "mqa").cfg.h_kv == 1
    mla = derive(base, "mla:512").cfg.attention.mla
    assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim) == (512, 64, 128, 128)
    with pytest.raises(LmcostError, match="5 KV heads do not divide 32"):
        derive(base, "gqa:5")


@pytest.mark.parametrize("model", ["llama-2-7b", "llama-3-8b", "mistral-7b", "qwen2.5-7b", "deepseek-v2-lite", "gpt2"])
def test_mqa_le_gqa_le_mha_and_linear_in_t(model):
    cfg = load_config(model)
    h = cfg.attention.n_heads
    gqa = next(k for k in (4, 2, 3, 7) if h % k == 0)
    labels = ["mqa", f"gqa:{gqa}", "mha"]
    for t in (256, 1024):  # within GPT-2's 1024 learned positions
        kv = [kv_bytes(derive(cfg, x).cfg, BF16, 4, t) for x in labels]
        step = [compare(cfg, H100, [x], [t], 4)["decode_time_s"].iloc[0] for x in labels]
        assert kv == sorted(kv) and step == sorted(step)
    for x in labels:
        c = derive(cfg, x).cfg
        w = c.attention.sliding_window
        if w is None:
            assert kv_bytes(c, BF16, 4, 3000) == 3 * kv_bytes(c, BF16, 4, 1000)
        else:  # Mistral: every layer slides, so the cache stops growing at w
            assert kv_bytes(c, BF16, 4, 3 * w) == kv_bytes(c, BF16, 4, w) == w * kv_bytes(c, BF16, 4, 1)


@pytest.mark.parametrize("model, gpu, t", [("llama-3-8b", "h100", 32768), ("llama-2-7b", "a100-40gb", 4096),
                                           ("mixtral-8x7b", "h200", 8192), ("deepseek-v2-lite", "l40s", 16384)])
def test_largest_batch_and_context_are_the_largest_that_fit(model, gpu, t):
    cfg, hw = load_config(model), load_gpu(gpu)
    s = Settings(mla="absorbed")
    total = lambda b, tt: decode_footprint(cfg, BF16, b, tt, s, 16).total_bytes
    b = max_batch(cfg, hw, BF16, t, s)
    assert b >= 1 and total(b, t) <= hw.memory_bytes < total(b + 1, t)
    longest = max_context(cfg, hw, BF16, 4, s)
    assert total(4, longest) <= hw.memory_bytes < total(4, longest + 1)


def test_kv_command_json_and_plot(tmp_path):
    from typer.testing import CliRunner

    out = tmp_path / "kv.html"
    r = CliRunner().invoke(app, ["kv", str(ROOT / "lmcost" / "data" / "models" / "llama-2-7b.yaml"), "--gpu", "h100", "--variants",
                                 "mha,gqa:8,gqa:4,mqa,mla:512", "--context", "4k,32k,128k", "--json", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    # 4 variants + MLA twice (absorbed, naive), at 3 contexts each.
    assert len(rows) == 6 * 3
    gqa8 = next(x for x in rows if x["variant"] == "gqa:8" and x["context"] == 32768)
    assert gqa8["kv_bytes"] == 32 * 2 * 8 * 128 * 2 * 32768
    absorbed = [x for x in rows if x["mla_mode"] == "absorbed"]
    naive = [x for x in rows if x["mla_mode"] == "naive"]
    assert all(a["decode_time_s"] < n["decode_time_s"] for a, n in zip(absorbed, naive))
    html = out.read_text()
    assert "plotly" in html and "src=\"http" not in html  # plotly.js inlined: the page opens offline
    for label in ("mha", "gqa:8", "mqa", "mla:512 (absorbed)", "mla:512 (naive)"):
        assert f'"name":"{label}"' in html


@pytest.mark.parametrize("args, prefix", [
    (["--variants", "gqa:5"], "error: --variants: gqa:5: 5 KV heads do not divide 32"),
    (["--variants", "xyz"], "error: --variants: unknown variant 'xyz'"),
    (["--local-global", "3:1"], "error: --local-global: llama-2-7b has no sliding window"),
    (["--context", "4q"], "error: --context: '4q' is not a token count"),
    (["--block-size", "0"], "error: --block-size: must be from 1 to 2,147,483,648, got 0"),
])
def test_kv_command_errors(args, prefix):
    from typer.testing import CliRunner

    r = CliRunner().invoke(app, ["kv", "llama-2-7b", *args])
    assert r.exit_code == 2 and r.stderr.startswith(prefix), r.stderr


def test_a_local_global_period_longer_than_the_model_is_refused():
    # 99999999999:1 once built a 100-billion-entry pattern (MemoryError); Llama-3-8B has 32 layers.
    from typer.testing import CliRunner

    from lmcost.cli import app

    r = CliRunner().invoke(app, ["kv", "llama-3-8b", "--window", "4096", "--local-global", "99999999999:1"])
    assert r.exit_code == 2 and "keep L + G <= 32" in r.stderr
