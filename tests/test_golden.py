"""Every number that ``lmcost estimate/op/kv/plan/train --json`` printed before the package was re-laid in
layers (issue 23) is unchanged.

The oracle is tests/data/golden-cli.json.gz, written by tests/data/make_golden_cli.py at commit e47506e
(the last commit before the move; regenerated, not translated from an older file): every shipped model on
every shipped GPU under both time models (calibrated times on every GPU included) at three workloads, the
per-operator rows under three fusion settings, every Hugging Face config under tests/data, parallel layouts
(TP, PP, SP, CP, EP, DP, nodes, clusters), quantization recipes and dtypes, lmcost op on six GPUs, every
collective kind on three clusters, kv, plan (serving and training) and train. A command that failed then
must fail now with the same one line. Numbers must be identical: ints equal, floats equal bit for bit.
The four serving ``plan`` runs were refreshed (``make_golden_cli.py --only plan``) when plan's points became
estimate's serving point (lmcost.cost.serving), every other record unchanged; for issue 24 the plan runs
again (SLOs judged on the calibrated model by default, the roofline bound and the check command added) and
the training runs (``--only train``: the headline MFU counts the causal pairs). Issue 25 (the GEMMs of a
quantization recipe at its compute dtype's peak) regenerated the whole file: every run under a recipe
(``--quant``, or a config's own: gpt-oss's mxfp4, DeepSeek-V3's HF fp8-block128) gained
``settings.gemm_compute``; numbers moved only for gpt-oss-20b on B200 (its MXFP4 experts W4A8 at the fp8
peak: the six estimate runs) and the DeepSeek-V3 HF config on H100 (W8A8 at the fp8 peak); every other
record is as before. A fresh-user finding left from issue 25 (a JSON without ``--engine`` recorded no engine)
regenerated it again, adding keys only: every estimate record's ``settings`` gained ``engine`` {auto} and
``kernel_figures``, and every op, plan and train record a ``settings`` with them (the record ``--engine auto``
writes, the default it is); no number moved (checked: every path that differs is one of these added keys).

The README's ``pytest`` replays a stratified third (:func:`sampled`): every command, layout, op and
collective case, and of the model x GPU x time model x workload grid and the detailed runs a slice in
which every model, GPU, time model, workload and fusion setting still appears; the rest is the ``slow``
tier (``pytest -m slow``, run by .ci/run), so CI holds every number.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "data"))

from make_golden_cli import _SHIPPED, WORKLOADS, cases, run

GOLDEN = json.loads(gzip.decompress((Path(__file__).parent / "data" / "golden-cli.json.gz").read_bytes()))


def diff(old, new, path="") -> list[str]:
    """Paths where ``new`` differs from ``old``: a missing or added key, another type, another value."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{path}: {new!r:.80} is not a dict"]
        out = [f"{path}.{k}: added" for k in new if k not in old]
        return out + [p for k, v in old.items() for p in (diff(v, new[k], f"{path}.{k}") if k in new else [f"{path}.{k}: missing"])]
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [f"{path}: list of {len(old)} became {new!r:.80}"]
        return [p for i, (a, b) in enumerate(zip(old, new)) for p in diff(a, b, f"{path}[{i}]")]
    return [] if type(old) is type(new) and old == new else [f"{path}: {old!r} -> {new!r}"]


def test_golden_set_is_whole():
    # The cases the generator lists today are those it wrote: 18 models x 12 GPUs x 2 time models x 3
    # workloads (1,296) + 18 x 6 detailed runs, 17 HF configs, 36 + 12 layouts, 78 single-op runs, 72
    # collectives, 12 kv, 5 plan and 10 train runs.
    assert [c["argv"] for c in GOLDEN] == cases()
    assert len(GOLDEN) == 1296 + 108 + 17 + 36 + 12 + 78 + 72 + 12 + 5 + 10


def test_the_comparison_can_fail():
    # One ulp off, a key dropped, an int turned float: each is a difference.
    assert diff({"a": 0.1}, {"a": 0.1 + 2 ** -56}) and diff({"a": 1, "b": 2}, {"a": 1}) and diff({"a": 1}, {"a": 1.0})
    assert diff({"a": [1, 2]}, {"a": [1, 2]}) == []


FUSIONS = ["default", "vllm", "none"]


def sampled(argv: list[str]) -> bool:
    """Whether a case is replayed by the default run. Of the grid (model m, GPU g, time model t,
    workload w; indices in make_golden_cli's lists) the case with g = (m + 2 * (3t + w)) mod 12: each
    model at each (t, w) once, each GPU 9 times (108 of 1,296); of the detailed runs (model m, time model
    t, fusion f) f = (m + t) mod 3 (36 of 108); every other case."""
    models, gpus = _SHIPPED["models"], _SHIPPED["gpus"]
    if argv[0] != "estimate" or argv[1] not in models:
        return True
    m, t = models.index(argv[1]), ["roofline", "calibrated"].index(argv[argv.index("--model") + 1])
    if "--detail" in argv:
        return FUSIONS.index(argv[argv.index("--fuse") + 1]) == (m + t) % 3
    if len(argv) != 13 or argv[3] not in gpus:
        return True
    w = WORKLOADS.index(tuple(int(argv[argv.index(f) + 1]) for f in ("--batch", "--prompt", "--gen")))
    return gpus.index(argv[3]) == (m + 2 * (3 * t + w)) % 12


def test_the_default_sample_covers_every_axis():
    # 108 grid + 36 detailed + 17 HF + 48 layouts + 78 op + 72 collectives + 12 kv + 5 plan + 10 train.
    kept = [c["argv"] for c in GOLDEN if sampled(c["argv"])]
    assert len(kept) == 108 + 36 + 17 + 48 + 78 + 72 + 12 + 5 + 10
    grid = [a for c in GOLDEN for a in [c["argv"]] if a[0] == "estimate" and a[1] in _SHIPPED["models"] and len(a) == 13]
    assert len(grid) == 1296
    for i in (1, 3, 5, 7, 9, 11):  # model, GPU, time model, batch, prompt, gen: every value still appears
        assert {a[i] for a in grid if sampled(a)} == {a[i] for a in grid}
    assert {a[a.index("--fuse") + 1] for a in kept if "--detail" in a} == set(FUSIONS)


@pytest.mark.parametrize("i", [pytest.param(i, marks=() if sampled(c["argv"]) else pytest.mark.slow)
                               for i, c in enumerate(GOLDEN)],
                         ids=lambda i: " ".join(GOLDEN[i]["argv"][:2]) + f"-{i}")
def test_cli_json_unchanged(i):
    case = GOLDEN[i]
    differences = diff(case["result"], run(case["argv"]))
    assert not differences, differences[:10]


@pytest.mark.parametrize("model", ["llama-3-8b", "mixtral-8x7b", "deepseek-v3", "gpt2"])
def test_to_dict_is_plain_json(model):
    # The JSON contract: plain Python types only (json.dumps with no fallback, no NaN or Infinity).
    from lmcost import Settings, Workload, estimate, load_config, load_gpu

    for time_model in ("roofline", "calibrated"):
        d = estimate(load_config(model), load_gpu("h100"), Workload(3, 100, 5), settings=Settings(model=time_model)).to_dict()
        json.dumps(d, allow_nan=False)
