"""One serving point for estimate and plan (issue 23): TTFT, TPOT, throughput and memory per GPU.

The oracle is ``estimate`` of one workload: every point ``plan`` reports, its best included, must carry
estimate's numbers for that layout, batch, prompt and generation, equal bit for bit; and the vectorised
serving point over an array of batches must equal the serving point of each batch alone.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmcost import Precision, Workload, estimate, load_config, load_gpu
from lmcost.apps.plan import search
from lmcost.basics.errors import LmcostError
from lmcost.cost.memory import Footprint, footprint, rank_footprint
from lmcost.cost.phases import sum_of_max
from lmcost.cost.serving import ServingPoint, pipeline_fill, serving_point
from lmcost.operators.parallel import Layout
from lmcost.operators.workload import Settings

BF16 = Precision()


def _same_as_estimate(cfg, gpu, row, isl: int, osl: int, precision: Precision, settings: Settings) -> None:
    """Plan's ``row`` carries estimate's numbers for its layout and batch, exactly."""
    lay = Layout(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), ep=int(row["ep"]))
    est = estimate(cfg, gpu, Workload(batch=int(row["batch"]), prompt=isl, gen=osl), precision,
                   Settings(kernel=settings.kernel, mla=settings.mla, logits=settings.logits, model=settings.model,
                            fusion=settings.fusion, layout=lay, quant=settings.quant, vision=settings.vision))
    assert row["ttft_s"] == est.ttft_s
    assert row["tpot_s"] == est.tpot_s
    assert row["tokens_per_s_per_gpu"] == est.throughput_tokens_per_s / lay.gpus
    assert row["tokens_per_s_per_user"] == 1.0 / est.tpot_s
    assert row["memory_per_gpu_bytes"] == est.memory["total_bytes"]
    assert row["bound"] == est.decode["bound"]


@pytest.mark.parametrize("model,gpu,model_time,extra", [
    ("llama-3.1-70b", "h100", "roofline", {}),
    ("mixtral-8x7b", "h200", "calibrated", dict(ttft_s=0.5, tpot_s=0.05)),
    ("mistral-7b", "a100", "roofline", {}),  # a sliding window: decode steps that are not affine in the context
    ("deepseek-v2-lite", "h100", "calibrated", {}),
])
def test_plan_points_are_estimates(model, gpu, model_time, extra):
    # The oracle: estimate of the same layout, batch, prompt, generation and settings. The best point, the
    # front's two ends and a spread of every other point searched (pipeline stages and EP included).
    cfg, hw = load_config(model), load_gpu(gpu)
    s = Settings(logits="last", model=model_time)
    isl, osl = 1024, 64
    p = search(cfg, [hw], 8, isl, osl, BF16, s, max_batch=512, density=6, **extra)
    rows = [p.best, p.front.iloc[0].to_dict(), p.front.iloc[-1].to_dict()]
    rows += [p.points.iloc[i].to_dict() for i in np.linspace(0, len(p.points) - 1, 8).astype(int)]
    assert p.best is not None and len(p.points) > 8
    for row in rows:
        _same_as_estimate(cfg, hw, row, isl, osl, BF16, s)


def _fields(point: ServingPoint, i=None) -> dict:
    d = point.to_dict()
    mem = d.pop("memory")
    d.update({f"memory.{k}": v for k, v in mem.items()})
    return d if i is None else {k: (v[i] if isinstance(v, list) else v) for k, v in d.items()}


@pytest.mark.parametrize("model,layout,kw", [
    ("llama-3.1-70b", Layout(tp=2, pp=4), dict(model="calibrated")),   # the busiest stage changes with the batch
    ("llama-3.1-70b", Layout(tp=4, dp=2), dict(quant="awq-g128")),
    ("mixtral-8x7b", Layout(tp=1, dp=8, ep=8), dict(model="calibrated")),
    ("mistral-7b", Layout(), dict(fusion=("silu_mul", "qkv"))),
    ("gpt2", Layout(pp=2), dict(logits="all")),  # learned positions, pipeline stages
])
def test_array_of_batches_equals_each_batch_alone(model, layout, kw):
    cfg, gpu = load_config(model), load_gpu("h100")
    s = Settings(layout=layout, **kw)
    step = layout.dp * layout.pp
    batches = np.array([1, 2, 3, 7, 50, 129, 1000]) * step
    isl, osl = (300, 200) if model == "gpt2" else (2000, 300)
    many = serving_point(cfg, gpu, BF16, s, batch=batches, isl=isl, osl=osl)
    for i, b in enumerate(batches):
        one = serving_point(cfg, gpu, BF16, s, batch=int(b), isl=isl, osl=osl)
        assert _fields(one) == _fields(many, i)


def test_past_int64_the_batches_are_python_ints():
    # At a prompt of 2^28 tokens a prefill's attention FLOPs pass 2^60 (s^2 = 2^56 times heads and widths):
    # the array is evaluated as Python ints, still equal to each batch alone.
    cfg, gpu = load_config("tiny-gqa"), load_gpu("h100")
    many = serving_point(cfg, gpu, BF16, batch=np.array([1, 3, 1000]), isl=2**28, osl=3)
    for i, b in enumerate((1, 3, 1000)):
        assert _fields(serving_point(cfg, gpu, BF16, batch=b, isl=2**28, osl=3)) == _fields(many, i)


def test_serving_point_is_what_estimate_reports():
    cfg, gpu = load_config("llama-3.1-70b"), load_gpu("h100")
    s = Settings(layout=Layout(tp=4, pp=2), model="calibrated")
    est = estimate(cfg, gpu, Workload(batch=16, prompt=4096, gen=512), BF16, s)
    p = serving_point(cfg, gpu, BF16, s, batch=16, isl=4096, osl=512)
    assert (p.ttft_s, p.tpot_s, p.tokens_per_s) == (est.ttft_s, est.tpot_s, est.throughput_tokens_per_s)
    assert dict(p.memory.to_dict(), capacity_bytes=gpu.memory_bytes, fits=p.fits) == est.memory
    # TTFT is the prefill along the pipeline: (2pp - 1)/pp = 3/2 of one stage pass.
    assert pipeline_fill(s.layout) == 1.5 and p.ttft_s == est.prefill["time_s"] * 1.5


def test_plan_keeps_the_vision_tower():
    # A Settings with vision=True reaches every point (plan once rebuilt Settings positionally and dropped it):
    # each GPU holds the whole tower, 419,816,304 parameters of Gemma 3 4B in bf16 (test_hf_published).
    import json

    from conftest import DATA
    from lmcost.model.hf.families import from_hf_config

    data = json.loads((DATA / "hf-published" / "gemma-3-4b-it.json").read_text())
    cfg, gpu = from_hf_config(data, "gemma-3-4b-it.json"), load_gpu("h100")
    plain = search(cfg, [gpu], 2, 512, 16, BF16, Settings(logits="last"), max_batch=8, density=4).points
    tower = search(cfg, [gpu], 2, 512, 16, BF16, Settings(logits="last", vision=True), max_batch=8, density=4).points
    assert (tower["memory_per_gpu_bytes"].to_numpy() - plain["memory_per_gpu_bytes"].to_numpy() == 419_816_304 * 2).all()


def test_footprint_json_keys():
    # estimate --json's memory keys: four on one GPU, six under a layout (the buffer and the stage).
    cfg = load_config("llama-3-8b")
    one = footprint(cfg, BF16, batch=2, context=100, tokens=50, act_bytes=[10, 30, 20])
    assert list(one.to_dict()) == ["weights_bytes", "kv_cache_bytes", "activations_bytes", "total_bytes"]
    # activations: the largest op's 30 bytes + the residual stream 2 x 50 x 4096 x 2 bytes
    assert one.activations_bytes == 30 + 2 * 50 * 4096 * 2
    lay = rank_footprint(cfg, BF16, Layout(tp=2, pp=2), batch=4, context=100, tokens=50, act_bytes=[1], comm_bytes=[7])
    assert list(lay.to_dict()) == ["weights_bytes", "kv_cache_bytes", "activations_bytes", "comm_buffer_bytes",
                                   "total_bytes", "stage"]
    assert isinstance(one, Footprint) and lay.comm_buffer_bytes == 7


def test_settings_are_keyword_only():
    with pytest.raises(TypeError):
        Settings("flash", "auto", "last")  # noqa: the point of the test


def test_plan_needs_a_tpot():
    with pytest.raises(LmcostError) as e:
        search(load_config("llama-3-8b"), [load_gpu("h100")], 1, 512, 1, BF16)
    assert e.value.field == "osl"


def test_a_batch_array_must_split_over_the_layout():
    with pytest.raises(LmcostError) as e:
        serving_point(load_config("llama-3-8b"), load_gpu("h100"), BF16, Settings(layout=Layout(dp=2)),
                      batch=np.array([2, 3]), isl=8, osl=8)
    assert "3 sequences" in e.value.what


def _sum_of_max_one(lines: list[tuple[float, float]], n: int) -> float:
    """sum_of_max of one set of lines as it was written before it took arrays (scalar Python): the oracle."""
    cuts = {0, n}
    for (a1, s1), (a2, s2) in itertools.combinations(lines, 2):
        if s1 != s2:
            k = (a2 - a1) / (s1 - s2)
            if 0 < k < n - 1:
                cuts.add(int(k) + 1)
    cuts = sorted(cuts)
    out = 0.0
    for k0, k1 in zip(cuts, cuts[1:]):  # terms k0 .. k1 - 1
        mid = (k0 + k1 - 1) / 2
        a, slope = max(lines, key=lambda line: line[0] + line[1] * mid)
        count = k1 - k0
        out += count * a + slope * (k0 + k1 - 1) * count / 2
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e3, 1e3)), min_size=3, max_size=3),
                min_size=1, max_size=6),
       st.integers(1, 500), st.booleans())
def test_sum_of_max_over_arrays_equals_each_alone(sets, n, floor):
    # Each element's lines summed by the array form equal, bit for bit, the same lines summed alone.
    k = 3 if floor else 2
    lines = [(np.array([s[j][0] for s in sets]), np.array([s[j][1] for s in sets])) for j in range(k)]
    if floor:
        lines[-1] = (lines[-1][0], 0.0)
    many = sum_of_max(lines, n)
    for i in range(len(sets)):
        alone = [(float(a[i]), float(s if np.ndim(s) == 0 else s[i])) for a, s in lines]
        assert many[i] == _sum_of_max_one(alone, n) == sum_of_max(alone, n)


def test_sum_of_max_crossing_inside_the_range():
    # Lines 10 - k and 4 + k cross at k = 3: terms k = 0..4 are 10, 9, 8, 7, 8, summing to 42.
    lines = [(np.array([10.0, 10.0]), np.array([-1.0, -1.0])), (np.array([4.0, 100.0]), np.array([1.0, 0.0]))]
    assert sum_of_max(lines, 5).tolist() == [42.0, 500.0]
