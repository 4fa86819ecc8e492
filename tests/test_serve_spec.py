"""Speculative decoding in ``lmcost serve`` (issue 28): the expected tokens per step from per-position rates
(worked by hand), the verification's matmul FLOPs (by hand for a small config), the draft model's KV bytes
per token (its published config), the metamorphic relations (k = 0 or no method: plain decoding number for
number; acceptance of 1 token per step: plain decoding's steps plus exactly the draft's and the wider
verification's cost), the decode steps a request needs (ceil((output - 1) / a), by hand), where it stops
paying, and the CLI's refusals. Every run here is tens of requests on tables to 4,096 contexts.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, prepare, run_serve
from lmcost.apps.serve_sim import Knobs, simulate
from lmcost.apps.serve_spec import _draft_hint, crossover_batch, parse_acceptance, per_token_s, spec_step
from lmcost.apps.setup import resolve_precision
from lmcost.basics.errors import LmcostError
from lmcost.cli import app
from lmcost.cost.engine_step import StepModel
from lmcost.cost.spec_decode import SpecStepModel, accepted_per_step, head_config, verify_gemm_flops
from lmcost.hardware.gpu import load_gpu
from lmcost.model.loading import load_config
from lmcost.operators.workload import Settings

BF16 = resolve_precision("bf16")
H100 = load_gpu("h100")
#: Llama-3.2-1B as its Hugging Face config.json publishes it (meta-llama/Llama-3.2-1B): hidden 2048, 16 layers,
#: 32 heads, 8 KV heads of 64, intermediate 8192, vocabulary 128,256 (Llama 3's tokenizer), tied embeddings.
LLAMA_1B = """name: llama-3.2-1b
d_model: 2048
n_layers: 16
vocab_size: 128256
tie_embeddings: true
attention:
  n_heads: 32
  n_kv_heads: 8
  head_dim: 64
ffn:
  activation: swiglu
  d_ff: 8192
"""
#: Plain serving of 24 requests on an H100 (llama-3-8b: KV 128 KiB per token), tables to 4,096 contexts.
BASE = dict(model="llama-3-8b", gpu="h100", requests=24, prompt="256", output="64", max_num_seqs=64,
            max_num_batched_tokens=2048)


@lru_cache(maxsize=None)
def steps(k: int, method: str = "eagle") -> tuple:
    """(target StepModel, SpecStepModel at acceptance 1) of llama-3-8b, roofline, tables to 64 x (k + 1)
    sequences and 4,096 contexts."""
    cfg, s = load_config("llama-3-8b"), Settings(logits="last", model="roofline")
    sizes = dict(max_tokens=2048, max_seqs=64 * (k + 1), max_context=4096)
    target = StepModel(cfg, H100, BF16, s, **sizes)
    draft = StepModel(head_config(cfg, method), H100, BF16, s, **sizes) if method != "ngram" else None
    return target, SpecStepModel(target, method, k, 1.0, draft)


# --- exact ---------------------------------------------------------------------------------------------


def test_tokens_per_step_from_rates_by_hand():
    # a = 1 + p1 + p1 p2 (Leviathan et al. 2023): 1 + 0.8 + 0.8 x 0.6 = 2.28
    assert accepted_per_step(2, (0.8, 0.6)) == pytest.approx(2.28, abs=1e-12)
    # three positions: 1 + 0.9 + 0.9 x 0.5 + 0.9 x 0.5 x 0.2 = 2.44; every draft kept: k + 1; the first refused: 1
    assert accepted_per_step(3, (0.9, 0.5, 0.2)) == pytest.approx(2.44, abs=1e-12)
    assert accepted_per_step(3, (1, 1, 1)) == 4 and accepted_per_step(3, (0, 1, 1)) == 1
    assert accepted_per_step(3, 2.5) == 2.5


@pytest.mark.parametrize("acceptance", [4.01, 0.99, (0.8, 0.6), (0.8, 0.6, 1.2)])
def test_acceptance_past_its_range_is_refused(acceptance):
    with pytest.raises(LmcostError) as e:
        accepted_per_step(3, acceptance)
    assert e.value.field == "acceptance"


def test_verification_gemm_flops_by_hand():
    # tiny-gqa: d 512, 4 layers, 8 heads of 64, 2 KV heads, SwiGLU 1408, vocabulary 8,000 (untied).
    # weights a token meets per layer: q 512x512 + k, v 512x128 each + o 512x512 + 3 x 512x1408 = 2,818,048;
    # x 4 layers = 11,272,192; + lm_head 512 x 8000 = 4,096,000 -> 15,368,192; 2 FLOPs each: 30,736,384 per token.
    # The verification of n = 3 sequences with k = 2 runs 3 x (2 + 1) = 9 rows: 276,627,456 FLOPs.
    cfg = load_config("tiny-gqa")
    s = Settings(logits="last")
    assert verify_gemm_flops(cfg, BF16, s, 3, 2) == 9 * 30_736_384
    assert verify_gemm_flops(cfg, BF16, s, 3, 0) == 3 * 30_736_384


def test_draft_model_kv_bytes_per_token(tmp_path):
    # Llama-3.2-1B's cache per token: 2 (K, V) x 16 layers x 8 KV heads x 64 x 2 bytes = 32,768, beside
    # llama-3-8b's 2 x 32 x 8 x 128 x 2 = 131,072
    path = tmp_path / "llama-3.2-1b.yaml"
    path.write_text(LLAMA_1B)
    r = ServeRequest(**BASE, spec="draft", spec_tokens=3, acceptance=2.0, draft_model=str(path))
    setup = prepare(r, max_context=4096)
    assert setup.kv_per_token_bytes == 131_072 + 32_768
    # an EAGLE head: one layer of the target's attention, 2 x 8 x 128 x 2 = 4,096 bytes
    setup = prepare(ServeRequest(**BASE, spec="eagle", spec_tokens=3, acceptance=2.0), max_context=4096)
    assert setup.kv_per_token_bytes == 131_072 + 4_096


# --- metamorphic -----------------------------------------------------------------------------------------


def _plain_and(**spec) -> tuple[dict, dict]:
    plain = run_serve(ServeRequest(**BASE)).to_dict()
    return plain, run_serve(ServeRequest(**BASE, **spec)).to_dict()


@pytest.mark.parametrize("spec", [dict(spec="eagle", spec_tokens=0, acceptance=1.0), dict(spec="none")])
def test_no_draft_tokens_is_plain_decoding_number_for_number(spec, monkeypatch):
    # k = 0 is refused to users (it drafts nothing); the library's floor lowered to 0 here keeps the relation
    monkeypatch.setattr("lmcost.apps.serve_spec.MIN_TOKENS", 0)
    plain, run = _plain_and(**spec)
    got = run.pop("spec", None)
    assert run == plain
    assert (got is None) == (spec["spec"] == "none")


def test_one_token_per_step_is_plain_decoding_plus_the_draft_and_the_wider_verification():
    # step level: the speculative step is the plain step with the draft's k steps added and the plain decode
    # replaced by the verification of k + 1 tokens; the verification costs more than a plain decode, the draft
    # something: strictly more time
    target, spec = steps(2)
    for n, m in ((1, 300.0), (17, 1000.0), (64, 3000.5)):
        plain = target.step_s(n, m)
        draft, verify = spec.draft_s(n, m), spec.verify_s(n, m)
        assert spec.step_s(n, m) == pytest.approx(plain + draft + (verify - plain), rel=1e-12)
        assert draft > 0 and verify > plain
    # run level: the same output tokens in the same decode steps, each longer
    plain, run = _plain_and(spec="eagle", spec_tokens=2, acceptance=1.0)
    assert run["steps"] == plain["steps"] and run["requests"] == plain["requests"]
    assert run["tpot_s"]["mean"] > plain["tpot_s"]["mean"] and run["spec"]["speedup_per_token"] < 1
    assert run["spec"]["crossover_batch"] == 1  # no token gained: it never pays


@pytest.mark.parametrize("k, acceptance, a", [(3, 2.5, 2.5), (2, (0.8, 0.6), 2.28)])
def test_a_request_takes_ceil_of_its_tokens_over_a_steps(k, acceptance, a):
    # one request of 100 prompt tokens and 101 output tokens, alone: one prefill step (its first token), then
    # ceil(100 / a) decode steps: a = 2.5 -> 40, a = 2.28 -> ceil(43.86) = 44
    target, _ = steps(k)
    spec = SpecStepModel(target, "ngram", k, accepted_per_step(k, acceptance))
    knobs = Knobs(max_num_seqs=64, max_num_batched_tokens=2048)
    tr = simulate(spec, knobs, np.zeros(1), np.array([100]), np.array([101]), kv_capacity_bytes=50e9,
                  kv_per_token_bytes=131072.0)
    assert tr.steps == 1 + math.ceil(100 / a)
    # the decode steps run at contexts 101, 101 + a, ...: their times summed (an affine run, by the closed form)
    want = sum(spec.step_s(1, 101 + a * j) for j in range(math.ceil(100 / a)))
    assert tr.finish_s[0] - tr.first_token_s[0] == pytest.approx(want, rel=1e-9)


def test_crossover_is_where_a_token_costs_more_than_plain():
    # n-gram drafting (no draft cost), k = 3, a = 2: at batch 1 a step is memory-bound (the weights read once),
    # two tokens for about one's time; once the verification's 4n rows are compute-bound a step costs about 4x
    # plain's for 2x its tokens: somewhere between, a token starts to cost more than plain decoding's
    req = dict(BASE, max_num_seqs=256)
    setup = prepare(ServeRequest(**req, spec="ngram", spec_tokens=3, acceptance=2.0, time_model="roofline"),
                    max_context=4096)
    m = 300.0
    n = crossover_batch(setup, m)
    assert n is not None and 1 < n <= 256
    s, p = per_token_s(setup, n, m)
    s1, p1 = per_token_s(setup, n - 1, m)
    assert s > p and s1 <= p1
    s, p = per_token_s(setup, 1, m)
    assert 1.9 < p / s <= 2  # two tokens in one memory-bound step (a little more read: 4 rows' activations)


# --- inputs ---------------------------------------------------------------------------------------------


def test_mtp_on_a_config_with_no_module_is_refused(tmp_path):
    data = json.loads(open("tests/data/hf-configs/deepseek-v3.json").read())
    assert data["num_nextn_predict_layers"] == 1
    data["num_nextn_predict_layers"] = 0
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    cfg = load_config(str(path))
    r = ServeRequest(model=str(path), spec="mtp", spec_tokens=1, acceptance=1.8)
    target = StepModel(cfg, H100, BF16, Settings(logits="last"), max_tokens=16, max_seqs=2, max_context=16)
    with pytest.raises(LmcostError) as e:
        spec_step(r, target, max_tokens=16, max_seqs=2, max_context=16, say=lambda _: None)
    assert e.value.field == "spec"


def cli(*args):
    return CliRunner().invoke(app, ["serve", "llama-3-8b", "--requests", "8", "--prompt", "128", "--output", "16",
                                    *args])


@pytest.mark.parametrize("args, field", [
    (["--spec-tokens", "3"], "--spec-tokens"),                              # no method
    (["--acceptance", "2"], "--acceptance"),
    (["--draft-model", "llama-3-8b"], "--draft-model"),
    (["--spec", "bogus", "--spec-tokens", "1", "--acceptance", "1"], "--spec"),
    (["--spec", "eagle", "--acceptance", "2"], "--spec-tokens"),            # k missing
    (["--spec", "eagle", "--spec-tokens", "2"], "--acceptance"),            # no acceptance assumed
    (["--spec", "eagle", "--spec-tokens", "33", "--acceptance", "2"], "--spec-tokens"),
    (["--spec", "eagle", "--spec-tokens", "0", "--acceptance", "1"], "--spec-tokens"),   # drafts nothing
    (["--spec", "mtp", "--spec-tokens", "1", "--acceptance", "1.8"], "--spec"),          # llama: no MTP module
    (["--spec", "eagle", "--spec-tokens", "2", "--acceptance", "3.5"], "--acceptance"),   # past k + 1
    (["--spec", "eagle", "--spec-tokens", "2", "--acceptance", "0.8"], "--acceptance"),   # one rate for two
    (["--spec", "eagle", "--spec-tokens", "2", "--acceptance", "x"], "--acceptance"),
    (["--spec", "eagle", "--spec-tokens", "2", "--acceptance", "2", "--draft-model", "llama-3-8b"], "--draft-model"),
    (["--spec", "draft", "--spec-tokens", "2", "--acceptance", "2"], "--draft-model"),
    (["--spec", "draft", "--spec-tokens", "2", "--acceptance", "2", "--draft-model", "tiny-gqa"], "--draft-model"),
])
def test_bad_spec_inputs_are_one_line_naming_the_flag(args, field):
    r = cli(*args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {field}: "), r.stderr


def test_json_carries_spec_accepted_per_step():
    r = cli("--spec", "eagle3", "--spec-tokens", "2", "--acceptance", "0.8,0.6", "--json")
    assert r.exit_code == 0, r.stderr
    spec = json.loads(r.stdout)["spec"]
    assert spec["accepted_per_step"] == pytest.approx(2.28) and spec["method"] == "eagle3" and spec["tokens"] == 2
    assert spec["acceptance"] == [0.8, 0.6] and spec["draft_s_per_step"] > 0
    text = cli("--spec", "eagle3", "--spec-tokens", "2", "--acceptance", "0.8,0.6").stdout
    assert "speculative decoding: eagle3" in text and "2.28 tokens per step" in text


@pytest.mark.parametrize("admission", ["on_demand", "reserve_full"])
def test_kv_cache_never_over_capacity_under_pressure(admission):
    # a cache for ~6 requests of 1,000 + 400 tokens and 40 of them offline, each decode step taking k + 1 = 4
    # slots and advancing 2.3 tokens: decodes still preempt the newest when slots are missing, the cache in use
    # never passes its capacity, every request finishes, each in at least ceil(399 / 2.3) = 174 decode steps
    target, _ = steps(3)
    spec = SpecStepModel(target, "ngram", 3, 2.3)
    per_token = 131072.0
    cap = per_token * (6 * 1400 + 6 * 15)
    knobs = Knobs(max_num_seqs=64, max_num_batched_tokens=2048, admission=admission)
    n = 40
    tr = simulate(spec, knobs, np.zeros(n), np.full(n, 1000), np.full(n, 400), kv_capacity_bytes=cap,
                  kv_per_token_bytes=per_token)
    assert admission == "reserve_full" or tr.preemptions.sum() > 0
    assert tr.kv_timeline[:, 1].max() <= 1.0 + 1e-12
    assert np.isfinite(tr.finish_s).all() and (tr.finish_s > tr.first_token_s).all()
    decode_steps = tr.steps - int((tr.itl_segments[:, 2] == 0).sum())
    assert decode_steps >= math.ceil(399 / 2.3)


# --- what a fresh user found (issue 28) ------------------------------------------------------------------


def test_spec_tokens_zero_and_fractions_refused_in_our_words():
    r = cli("--spec", "eagle", "--spec-tokens", "0", "--acceptance", "1")
    assert "error: --spec-tokens: 0 drafts nothing" in r.stderr
    # the installed command's one line (typer's usage box under CliRunner is not what a user sees)
    import subprocess
    import sys

    for flag, model in (("--spec-tokens", "llama-3-8b"), ("--redundant-experts", "deepseek-v3")):
        p = subprocess.run([sys.executable, "-m", "lmcost", "serve", model, flag, "2.5"], capture_output=True, text=True)
        assert p.returncode == 2 and p.stderr.startswith(f"error: {flag}: '2.5' is not a whole number"), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def test_mtp_module_count_comes_from_the_config():
    # DeepSeek-V3's config.json: "num_nextn_predict_layers": 1; the shipped YAML states the same; Llama has none
    data = json.loads(open("tests/data/hf-configs/deepseek-v3.json").read())
    assert data["num_nextn_predict_layers"] == 1
    assert load_config("tests/data/hf-configs/deepseek-v3.json").mtp_modules == 1
    assert load_config("deepseek-v3").mtp_modules == 1
    assert load_config("llama-3.1-8b").mtp_modules == 0
    with pytest.raises(LmcostError) as e:
        prepare(ServeRequest(model="llama-3.1-8b", spec="mtp", spec_tokens=1, acceptance=1.8), max_context=64)
    assert e.value.field == "spec" and "no MTP module" in e.value.what


@pytest.mark.parametrize("text, k, a", [("0.99", 1, 1.99), ("1", 1, 1.0), ("1.5", 3, 1.5), ("0.5,0.5", 2, 1.75)])
def test_one_acceptance_value_is_a_rate_below_1_and_a_mean_from_1(text, k, a):
    # a rate p: 1 + p tokens per step with k = 1 (0.99 -> 1.99); a mean m is m itself; rates (0.5, 0.5): 1 + 0.5
    # + 0.25 = 1.75
    assert accepted_per_step(k, parse_acceptance(text)) == pytest.approx(a, rel=1e-12)


@pytest.mark.parametrize("text", ["0", "-1"])
def test_acceptance_zero_or_negative_is_a_mean_out_of_range(text):
    with pytest.raises(LmcostError) as e:
        accepted_per_step(3, parse_acceptance(text))
    assert "is outside [1, 4]" in e.value.what and "per-position rates for" not in e.value.what


def test_missing_draft_model_suggests_a_shipped_one_or_none():
    r = cli("--spec", "draft", "--spec-tokens", "2", "--acceptance", "2")
    assert "llama-3.2-1b" not in r.stderr and "no shipped model has llama-3-8b's vocabulary (128,256)" in r.stderr
    hint = _draft_hint("llama-3.1-70b")
    name = hint.rsplit("e.g. ", 1)[1]
    draft, target = load_config(name), load_config("llama-3.1-70b")  # shipped, same vocabulary, smaller
    assert draft.vocab_size == target.vocab_size and draft.d_model * draft.n_layers < target.d_model * target.n_layers
