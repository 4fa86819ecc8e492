"""Shared fixtures: the real Hugging Face configs in tests/data/hf-configs and their parameter oracle; the
test tiers.

The configs are copies of the published config.json files (copied from the developers' shared hf-configs folder):
everything a test reads lives in the repository, so the tests pass on a clone with nothing beside it.

Tiers (markers registered in pyproject.toml): ``torch``, ``transformers``, ``distributed`` (gloo process
groups) and ``browser`` (Chromium). A module that needs one says so in its first lines (``pytestmark``), a
single test by its decorator; tests/test_tiers.py checks that every import of torch or transformers is
covered. ``pytest -m "not slow and not torch and not transformers and not distributed and not browser"`` is the pure
tier: the modules it deselects whole are not even imported (:func:`pytest_pycollect_makemodule`), and a test
of it that imports torch fails (:func:`pytest_runtest_call`). ``slow`` marks what a test costs, not what it
needs: ``pytest`` without ``-m`` runs every tier but it (pyproject's addopts ``-m "not slow"``), ``pytest -m
slow`` runs it, and .ci/run runs both (tests/test_tiers.py checks that they collect every test once).
"""

from __future__ import annotations

import ast
import json
import sys
import warnings
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
HF_DIR = DATA / "hf-configs"
#: The published collective measurements the shipped clusters are fitted on: the package's one copy.
COLLECTIVE_CSV = ROOT / "lmcost" / "data" / "measurements" / "collective-measurements.csv"
#: Configs outside the shipped-model checks: qwen3-30b-a3b, modelled since issue 14 and checked exactly in
#: test_hf (no shipped YAML of it). Nemotron-H and gpt-oss, refused before issue 14, are modelled and shipped
#: (lmcost/data/models/nemotron-h-56b.yaml, lmcost/data/models/gpt-oss-20b.yaml). kimi-k2's model_type
#: (kimi_k2) is known to neither lmcost nor transformers: lmcost reads it through its architectures (deepseek_v3).
UNSUPPORTED = {"qwen3-30b-a3b", "kimi-k2"}
HF_CONFIGS = sorted(p for p in HF_DIR.glob("*.json") if p.stem not in UNSUPPORTED)


def hf_json(stem: str) -> dict:
    return json.loads((HF_DIR / f"{stem}.json").read_text())


#: Settings config classes leave unset that their models need, by model_type: {"source", "fill", "tiny"}
#: (tests/data/filled-defaults.json says where each value comes from).
FILLED = {k: v for k, v in json.loads((DATA / "filled-defaults.json").read_text()).items() if not k.startswith("_")}


def filled_default(model_type: str) -> dict:
    """The transformers config class's defaults (``to_dict``) with the settings it leaves unset filled in
    (:data:`FILLED`'s ``fill``): the default model of each supported type, built by the walkers."""
    transformers = pytest.importorskip("transformers")
    return {**transformers.CONFIG_MAPPING[model_type]().to_dict(), **FILLED.get(model_type, {}).get("fill", {})}


def hf_param_count(data: dict) -> int:
    """sum(p.numel()) of the transformers model built on the meta device: the independent oracle."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.CONFIG_MAPPING[data["model_type"]](**{k: v for k, v in data.items() if k != "model_type"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def hf_decode_cache(model_type, b=3, prompt=5, steps=14, tiny=True, **over):
    """Prefill ``prompt`` tokens then decode ``steps`` tokens with a tiny bf16 transformers model (eager
    attention); return (lmcost's config of it, the cache layers transformers allocated). ``over`` replaces
    the tiny widths (hidden 64, 2 layers, 4 heads of 16, FFN 96, vocabulary 128); ``tiny=False``: ``over``
    alone (a config class with keys of its own, e.g. BLOOM's n_layer)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from lmcost.model.hf.families import from_hf_config

    kw = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=128, pad_token_id=None)
    if not tiny:
        kw = {}
    elif model_type != "falcon":
        kw.update(intermediate_size=96, head_dim=16)
    cfg = transformers.CONFIG_MAPPING[model_type](**{**kw, **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval().to(torch.bfloat16)
        ids = torch.randint(0, 100, (b, prompt + steps))
        with torch.no_grad():
            cache = model(ids[:, :prompt], use_cache=True).past_key_values
            for i in range(steps):
                cache = model(ids[:, prompt + i:prompt + i + 1], past_key_values=cache, use_cache=True).past_key_values
    return from_hf_config(cfg.to_dict(), model_type), cache.layers


def in_pieces(model, ids, prefill: int, chunk_end: int):
    """The reference decoder's logits for ``ids`` [b, n] run as a prefill of ``prefill`` tokens, one pass up
    to ``chunk_end``, then one decode step per remaining token (the cache reset first): concatenated
    [b, n, V], to compare with one prefill of all n."""
    torch = pytest.importorskip("torch")
    model.reset_cache()
    n = ids.shape[1]
    parts = [model(ids[:, :prefill], 0), model(ids[:, prefill:chunk_end], prefill)]
    parts += [model(ids[:, j:j + 1], j) for j in range(chunk_end, n)]
    return torch.cat(parts, 1)


# ---------------------------------------------------------------------------------------------------
# Tiers

#: The markers that say a test needs torch (each of them runs torch code).
TORCH_TIERS = ("torch", "transformers", "distributed")


def module_marks(tree: ast.Module) -> set[str]:
    """The marker names of a test module's ``pytestmark = pytest.mark.x`` (or a list of them), from its
    syntax tree: what every test of the module carries."""
    marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for n in ast.walk(node.value):
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark":
                    marks.add(n.attr)
    return marks


def _deselects_all(expr: str, marks: set[str], known: set[str]) -> bool:
    """Whether the ``-m`` expression is false for every test carrying ``marks`` (whatever other known markers
    it adds). False where the expression is more than names joined by and/or/not: then collect and let
    pytest decide."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False
    if not all(isinstance(n, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Name, ast.Load))
               for n in ast.walk(tree)):
        return False
    code = compile(tree, "-m", "eval")
    names = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} & known - marks)
    for i in range(2 ** len(names)):
        have = marks | {n for j, n in enumerate(names) if i >> j & 1}
        if eval(code, {"__builtins__": {}}, {n.id: n.id in have for n in ast.walk(tree) if isinstance(n, ast.Name)}):
            return False
    return True


class _Deselected(pytest.Module):
    """A test module the ``-m`` expression deselects whole: collected without being imported."""

    def collect(self):
        return []


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent):
    """Do not import a test module whose ``pytestmark`` the ``-m`` expression deselects: its module-level
    ``importorskip("torch")`` would otherwise import torch into the pure tier (named on the command line
    or found in a folder alike)."""
    expr = parent.config.option.markexpr
    if not expr:
        return None
    marks = module_marks(ast.parse(module_path.read_text()))
    known = {line.split(":")[0].strip() for line in parent.config.getini("markers")}
    if marks and _deselects_all(expr, marks, known):
        return _Deselected.from_parent(parent, path=module_path)
    return None


#: Parametrised tests the default run samples, one case in k, by a hash of the case's id (the same cases
#: on every run and machine); the others carry ``slow``, so .ci/run's ``pytest -m slow`` runs them and CI
#: still runs every case. These are the costliest sets of cases of the default run (pytest --durations):
#: the oracles against transformers, torch.optim and gloo that repeat one check over many shapes, and the
#: generated sweeps of bad input.
SAMPLED = {
    "test_hybrid.py::test_state_and_kv_bytes_equal_transformers_cache": 3,
    "test_mla_variants.py::test_kv_bytes_equal_transformers_cache": 3,
    "test_flop_oracle.py::test_matmul_flops_equal_flop_counter": 2,
    "test_distributed.py::test_logits_match_the_unsharded_decoder": 2,
    "test_model_states.py::test_torch_optim_state_bytes_exact": 2,
    "test_decoder.py::test_profiler_scopes_are_the_analytic_ops": 2,
    "test_bad_inputs.py::test_every_option_with_weird_values": 3,
    "test_bad_inputs.py::test_bad_input_is_one_line_and_exit_2": 2,
}


def sampled_out(nodeid_tail: str, case_id: str) -> bool:
    """Whether the case ``case_id`` of the test ``<module>::<function>`` is left to the slow tier."""
    k = SAMPLED.get(nodeid_tail)
    return bool(k) and zlib.crc32(case_id.encode()) % k != 0


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark ``slow`` the cases of :data:`SAMPLED` the default run leaves out (before ``-m`` selects)."""
    for item in items:
        if sampled_out(f"{item.path.name}::{getattr(item, 'originalname', item.name)}", item.name):
            item.add_marker(pytest.mark.slow)


_TORCH_BEFORE = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.stash[_TORCH_BEFORE] = "torch" in sys.modules
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test carrying none of the torch tiers must not import torch, in its fixtures or its body: it would
    fail where torch is not installed, and drag it into the pure tier. Checked where torch was not imported
    before the test."""
    result = yield
    if not item.stash.get(_TORCH_BEFORE, True) and "torch" in sys.modules \
            and not any(item.get_closest_marker(m) for m in TORCH_TIERS):
        raise AssertionError(f"{item.nodeid} imported torch without a marker of {TORCH_TIERS}: add the one it needs")
    return result


@pytest.fixture(autouse=True)
def _progress_lines_off(monkeypatch):
    """A command run in-process (CliRunner) writes progress lines to its piped stderr once it has taken
    2 s (lmcost.cli.app.Ticker): on a slow machine a test comparing stderr whole would see one. Off
    here; tests of the lines set the threshold themselves."""
    import importlib

    monkeypatch.setattr(importlib.import_module("lmcost.cli.app"), "PROGRESS_AFTER_S", float("inf"))
