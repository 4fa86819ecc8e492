"""The SDPA backend of a run: chosen once, pinned, recorded, and the one that runs (lmcost.profiling.backends)."""

from __future__ import annotations

import pytest

from lmcost.model.config import ArchConfig

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from lmcost.profiling.backends import ATEN_OPS, EXPLICIT, sdpa_backend  # noqa: E402
from lmcost.profiling.decoder import build_decoder  # noqa: E402

SWIGLU = dict(activation="swiglu", d_ff=96)
GQA = dict(n_heads=4, n_kv_heads=2)
MLA = dict(n_heads=4, mla=dict(kv_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12))


def model(attention, **kw):
    cfg = ArchConfig.model_validate(dict(name="b", d_model=64, n_layers=1, vocab_size=128, attention=attention,
                                         ffn=SWIGLU))
    return build_decoder(cfg, max_batch=1, max_context=16, **kw)


def sdpa_ops(m) -> set[str]:
    """The ATen SDPA ops a prefill, a chunk and a decode step run."""
    ids = torch.randint(0, 128, (1, 12))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        m(ids[:, :8], 0)
        m(ids[:, 8:11], 8)
        m(ids[:, 11:], 11)
    return {e.name for e in prof.events() if "scaled_dot_product" in e.name and e.name.startswith("aten::_")}


@pytest.mark.parametrize("attention,kw,expected", [
    (GQA, {}, "flash_attention"),                                   # CPU flash: GQA and masks, d_qk = d_v
    (dict(GQA, sliding_window=4), {}, "flash_attention"),
    (GQA, dict(sdpa_backend="math"), "math"),
    (MLA, dict(mla_mode="naive"), "math"),                          # d_qk 24 != d_v 12: no CPU flash kernel
    (MLA, {}, EXPLICIT),                                            # absorbed: the decoder's latent matmuls
    (GQA, dict(kernel="naive"), EXPLICIT),
], ids=["gqa", "gqa-window", "gqa-math", "mla-naive", "mla-absorbed", "naive-kernel"])
def test_the_recorded_backend_is_the_one_that_runs(attention, kw, expected):
    m = model(attention, **kw)
    assert m.sdpa_backend == expected
    ran = sdpa_ops(m)
    assert ran == (set() if expected == EXPLICIT else {ATEN_OPS[("cpu", expected)]})


def test_a_pinned_backend_that_cannot_run_raises_instead_of_falling_back():
    with pytest.raises(ValueError, match="flash_attention"):
        model(MLA, mla_mode="naive", sdpa_backend="flash_attention")
    with pytest.raises(ValueError, match="efficient_attention"):  # no CPU kernel
        model(GQA, sdpa_backend="efficient_attention")
    with pytest.raises(ValueError, match="unknown"):
        model(GQA, sdpa_backend="fa3")
    name, pin = sdpa_backend("cpu", torch.float32, heads=4, kv_heads=4, d_qk=8, d_v=8)
    assert name == "flash_attention"
    q = k = torch.randn(1, 4, 3, 8)
    with pin():
        F.scaled_dot_product_attention(q, k, k, is_causal=True)
        with pytest.raises(RuntimeError):  # d_v != d_qk: flash cannot, and the pin forbids math
            F.scaled_dot_product_attention(q, k, torch.randn(1, 4, 3, 4), is_causal=True)
    with pin():  # a fresh context each time
        F.scaled_dot_product_attention(q, k, k)
