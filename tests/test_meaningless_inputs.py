"""Inputs that parse but mean nothing (issue 24): each is refused in one line naming the field, never
accepted and never a traceback. Model files (lmcost YAML and Hugging Face config.json), GPU and cluster
YAML, fit tables, op sizes and LoRA adapters.

Each case names the field the error must name; the bounds are physical (lmcost.model.config's MAX_*,
a GPU's datasheet memory), and each boundary is tested from both sides where a number sets it.
"""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import HF_DIR, ROOT, hf_json
from lmcost.basics.errors import LmcostError
from lmcost.model.loading import config_from_dict

LLAMA = hf_json("llama-3-8b")
GPU_YAML = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())
CLUSTER_YAML = yaml.safe_load((ROOT / "lmcost" / "data" / "clusters" / "dgx-h100.yaml").read_text())
NAN, INF = float("nan"), float("inf")


def _set(data: dict, path: str, value) -> dict:
    """``data`` with the dotted ``path`` set to ``value`` (inner mappings created)."""
    out = copy.deepcopy(data)
    *head, last = path.split(".")
    node = out
    for k in head:
        node = node.setdefault(k, {}) if isinstance(node.get(k), dict) or k not in node else node[k]
    node[last] = value
    return out


def _field(call) -> str:
    with pytest.raises(LmcostError) as e:
        call()
    msg = str(e.value)
    # never a pydantic class or Python type: the field and what it expects
    assert "instance of" not in msg and "Efficiency" not in msg and "Figures" not in msg, msg
    return e.value.field


# --- Hugging Face config.json: (key, value) -> the key the error names ---------------------------------
HF_CASES = [
    ("head_dim", 2**31, "head_dim"),
    ("hidden_size", 2**31, "hidden_size"),
    ("intermediate_size", 2**21, "intermediate_size"),     # MAX_WIDTH = 2^20
    ("vocab_size", 2**24 + 1, "vocab_size"),                # MAX_VOCAB = 2^24
    ("num_attention_heads", 2**21, "num_attention_heads"),
    ("num_hidden_layers", 100_001, "num_hidden_layers"),    # MAX_LAYERS
    ("max_position_embeddings", 2**31 + 1, "max_position_embeddings"),
    ("rope_theta", -1, "rope_theta"),
    ("rope_theta", 0, "rope_theta"),
    ("rope_theta", NAN, "rope_theta"),
    ("rope_theta", INF, "rope_theta"),
    ("rope_theta", "big", "rope_theta"),
    ("rope_scaling", {"rope_type": "bogus", "factor": 2.0}, "rope_scaling.rope_type"),
    ("rope_scaling", {"type": "linear", "factor": -2.0}, "rope_scaling.factor"),
    ("rope_scaling", {"rope_type": "linear", "factor": 0}, "rope_scaling.factor"),
    ("rope_scaling", {"rope_type": "yarn", "factor": NAN}, "rope_scaling.factor"),
    ("rope_scaling", "linear", "rope_scaling"),
    ("rope_parameters", {"full_attention": {"rope_type": "nope"}}, "rope_parameters.full_attention.rope_type"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": -5.0}, "rope_parameters.rope_theta"),
    ("torch_dtype", "float128", "torch_dtype"),
    ("torch_dtype", 16, "torch_dtype"),
    ("dtype", "int3", "dtype"),
    ("rms_norm_eps", -1e-5, "rms_norm_eps"),
    ("attention_dropout", 1.5, "attention_dropout"),
    ("initializer_range", NAN, "initializer_range"),
    ("eos_token_id", [1, INF], "eos_token_id[1]"),
]


@pytest.mark.parametrize("key, value, field", HF_CASES, ids=[f"{k}={v!r}" for k, v, _ in HF_CASES])
def test_hf_values_that_mean_nothing_name_their_key(key, value, field):
    assert _field(lambda: config_from_dict({**LLAMA, key: value}, "c.json")) == f"c.json: {field}"


def test_hf_values_at_the_bounds_are_accepted():
    # The other side of each bound: the widest width, a RoPE type and factor transformers takes, a limit's
    # inf (Mamba-2's time_step_limit default is [0.0, inf], so a published Bamba file carries Infinity).
    cfg = config_from_dict({**LLAMA, "intermediate_size": 2**20, "rope_theta": 1e-3, "torch_dtype": "torch.float16",
                            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
                           "c.json")
    assert cfg.ffn.d_ff == 2**20
    nemotron = hf_json("nemotron-h-56b-base-8k")
    assert config_from_dict({**nemotron, "time_step_limit": [0.0, INF]}, "n.json").n_layers == nemotron["num_hidden_layers"]


def test_a_wrapper_checks_its_text_config():
    gemma = json.loads((ROOT / "tests" / "data" / "hf-published" / "gemma-3-4b-it.json").read_text())
    bad = _set(gemma, "text_config.rope_theta", -1.0)
    assert _field(lambda: config_from_dict(bad, "g.json")) == "g.json: text_config: rope_theta"  # the wrapper maps its decoder as a file of its own


# --- lmcost YAML model files ----------------------------------------------------------------------------
YAML_MODEL = yaml.safe_load((ROOT / "lmcost" / "data" / "models" / "llama-3-8b.yaml").read_text())
YAML_CASES = [
    ("d_model", 2**20 + 1, "d_model"),
    ("attention.head_dim", 2**31, "attention.head_dim"),
    ("vocab_size", 2**24 + 1, "vocab_size"),
    ("ffn.d_ff", 0, "ffn.d_ff"),
    ("rotary_fraction", NAN, "rotary_fraction"),
    ("final_logit_softcap", INF, "final_logit_softcap"),
    ("attention.logit_softcap", NAN, "attention.logit_softcap"),
    ("attention", 3, "attention"),
    ("ffn", [1], "ffn"),
    ("moe", {"n_experts": 8, "top_k": 2, "d_ff_expert": 14336, "n_shared_experts": 10**30}, "moe.n_shared_experts"),
    ("vision_params", 10**16, "vision_params"),
]


@pytest.mark.parametrize("path, value, field", YAML_CASES, ids=[f"{p}={v!r}" for p, v, _ in YAML_CASES])
def test_yaml_model_values_that_mean_nothing_name_their_field(path, value, field):
    assert _field(lambda: config_from_dict(_set(YAML_MODEL, path, value), "m.yaml")) == f"m.yaml: {field}"


def test_gpt_oss_swiglu_clamp_must_be_positive():
    data = yaml.safe_load((ROOT / "lmcost" / "data" / "models" / "gpt-oss-20b.yaml").read_text())
    assert _field(lambda: config_from_dict(_set(data, "ffn.swiglu_limit", -7.0), "o.yaml")) == "o.yaml: ffn.swiglu_limit"


# --- GPU and cluster YAML -------------------------------------------------------------------------------
GPU_CASES = [
    ("l2_mb", -1, "l2_mb"),
    ("l2_mb", 0, "l2_mb"),
    ("l2_mb", NAN, "l2_mb"),
    ("tdp_w", -700, "tdp_w"),
    ("interconnect_gb_s", 0, "interconnect_gb_s"),
    ("interconnect_gb_s", INF, "interconnect_gb_s"),
    ("kernel_floor_us", -1, "kernel_floor_us"),
    ("efficiency", "fast", "efficiency"),
    ("efficiency.gemm", 3, "efficiency.gemm"),
    ("efficiency.gemm", [1, 2], "efficiency.gemm"),
    ("efficiency.gemm.sm_count", 0, "efficiency.gemm.sm_count"),
    ("efficiency.attention_prefill.fa2", 0.5, "efficiency.attention_prefill.fa2"),
    ("efficiency.bandwidth_fraction.default", NAN, "efficiency.bandwidth_fraction.default"),
    ("efficiency.bands.gemm", [INF, 1.5], "efficiency.bands.gemm.0"),
    ("efficiency.kernel", "fa9", "efficiency.kernel"),         # a typo took auto's figures silently
    ("efficiency.runtime", "cuda", "efficiency.runtime"),      # h100-sxm has no cuda figures
    ("efficiency.dispatch_us", INF, "efficiency.dispatch_us"),
]


@pytest.mark.parametrize("path, value, field", GPU_CASES, ids=[f"{p}={v!r}" for p, v, _ in GPU_CASES])
def test_gpu_yaml_values_that_mean_nothing_name_their_field(path, value, field):
    from lmcost.hardware.gpu import gpu_from_text

    text = yaml.safe_dump(_set(GPU_YAML, path, value))
    assert _field(lambda: gpu_from_text(text, "g.yaml")) == f"g.yaml: {field}"


def test_gpu_yaml_selection_with_figures_is_accepted():
    from lmcost.hardware.gpu import gpu_from_text

    gpu = gpu_from_text(yaml.safe_dump(_set(_set(GPU_YAML, "efficiency.kernel", "fa3"), "l2_mb", 50)), "g.yaml")
    assert gpu.efficiency.kernel == "fa3" and gpu.l2_mb == 50


CLUSTER_CASES = [
    ("gpus_per_node", 0, "gpus_per_node"),
    ("intra", 5, "intra"),
    ("intra.bandwidth_gb_s", NAN, "intra.bandwidth_gb_s"),
    ("inter.nics_per_node", -8, "inter.nics_per_node"),
    ("collectives.intra.ring", 0, "collectives.intra.ring"),
    ("collectives.band", "wide", "collectives.band"),
]


@pytest.mark.parametrize("path, value, field", CLUSTER_CASES, ids=[f"{p}={v!r}" for p, v, _ in CLUSTER_CASES])
def test_cluster_yaml_values_that_mean_nothing_name_their_field(path, value, field):
    from lmcost.hardware.cluster import cluster_from_text

    text = yaml.safe_dump(_set(CLUSTER_YAML, path, value))
    assert _field(lambda: cluster_from_text(text, "c.yaml")) == f"c.yaml: {field}"


# --- fit tables, op sizes, LoRA -------------------------------------------------------------------------
def test_fit_table_refuses_a_column_given_twice(tmp_path):
    from lmcost.calibration.measurements import load_table

    p = tmp_path / "t.csv"
    p.write_text("device,dtype,op,implementation,time_us,source,M,N,K, time_us\n"
                 "h100,bf16,gemm,cuBLAS,100,x,4096,4096,4096,5\n")
    assert _field(lambda: load_table(p)) == f"{p}: time_us"


def test_op_sizes_past_the_gpu_memory_are_refused():
    from lmcost.cost.kernels import cost, gemm
    from lmcost.hardware.gpu import load_gpu

    h100 = load_gpu("h100")
    # 8192^3 bf16: A, B and C are 3 x 8192^2 x 2 B = 402,653,184 B, well inside 80 GB
    assert cost(gemm(8192, 8192, 8192), h100)["bytes"] == 402_653_184
    # 2^20 x 2^20 x 2^20: 3 x 2^40 x 2 B = 6.6 TB on an 80 GB GPU
    assert _field(lambda: cost(gemm(2**20, 2**20, 2**20), h100)) == "sizes"


def test_collective_payload_past_one_gpu_is_refused():
    from lmcost.apps.collective import collective_cost

    # H100 SXM holds 80 GB (80e9 B, its datasheet): each rank holds nccl-tests' count, so 80e9 is the last
    # payload that exists and 80e9 + 1 the first that does not, whatever the group size.
    assert collective_cost(kind="all_reduce", size=80 * 10**9, ranks=8, gpu_type="h100").record["bytes"] == 80 * 10**9
    for size in (80 * 10**9 + 1, 64 * 2**40, 0):
        assert _field(lambda: collective_cost(kind="all_gather", size=size, ranks=64, gpu_type="h100")) == "payload_bytes"


def test_lora_rank_above_a_projection_and_empty_targets_are_refused():
    from lmcost.apps.setup import lora_adapters
    from lmcost.cost.optimizers import model_states
    from lmcost.model.loading import load_config

    cfg = load_config("llama-3-8b")
    # k_proj is [h_kv * d_h, d] = [8 * 128, 4096]: B A has rank at most 1024
    assert model_states(cfg, lora=lora_adapters(1024)).trainable_params > 0
    assert _field(lambda: model_states(cfg, lora=lora_adapters(1025))) == "lora.rank"
    assert _field(lambda: model_states(cfg, lora=lora_adapters(65536))) == "lora.rank"
    # without k and v the smallest targeted projection is q/o [4096, 4096]
    assert model_states(cfg, lora=lora_adapters(2048, "q,o")).trainable_params == 32 * 2 * 2048 * (4096 + 4096)
    for targets in ("", " ", "q,,k"):
        assert _field(lambda: lora_adapters(16, targets)) == "lora_targets"


# --- a few through the CLI: one line, exit 2 ------------------------------------------------------------
def _cli(args, monkeypatch, capsys) -> str:
    from lmcost.cli import main

    monkeypatch.setattr(sys, "argv", ["lmcost", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_cli_refuses_them_in_one_line(tmp_path, monkeypatch, capsys):
    hf = tmp_path / "config.json"
    hf.write_text(json.dumps({**LLAMA, "rope_theta": NAN}))  # json writes NaN, as Python's json reads it
    assert _cli(["estimate", hf], monkeypatch, capsys).startswith(f"error: {hf}: rope_theta: must be a finite number")
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(yaml.safe_dump(_set(GPU_YAML, "efficiency.gemm", 3)))
    assert _cli(["estimate", "gpt2", "--gpu", gpu], monkeypatch, capsys).startswith(
        f"error: {gpu}: efficiency.gemm: must be a mapping")
    assert _cli(["op", "collective", "--kind", "all_reduce", "--bytes", "64T", "--gpus", "8"], monkeypatch,
                capsys).startswith("error: --bytes: ")
    assert _cli(["train", "llama-3-8b", "--gpus", "1", "--global-batch", "8", "--lora-rank", "65536"], monkeypatch,
                capsys).startswith("error: --lora-rank: 65536 exceeds")


# --- random numbers into an HF config's numeric fields: a model or one LmcostError, nothing else --------
BASES = {stem: hf_json(stem) for stem in ("llama-3-8b", "mixtral-8x7b", "deepseek-v2-lite", "gpt2")}
NUMBERS = st.one_of(st.integers(-2**40, 2**40), st.sampled_from([0, 1, -1, 2**31, 2**63]),
                    st.floats(allow_nan=True, allow_infinity=True))


def _numeric_keys(data: dict) -> list[str]:
    return sorted(k for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)) + \
        ["head_dim", "rope_theta", "partial_rotary_factor", "sliding_window"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_numbers_in_hf_configs_give_a_model_or_one_error(data):
    stem = data.draw(st.sampled_from(sorted(BASES)))
    base = dict(BASES[stem])
    keys = data.draw(st.lists(st.sampled_from(_numeric_keys(base)), min_size=1, max_size=3, unique=True))
    for k in keys:
        base[k] = data.draw(NUMBERS)
    try:
        cfg = config_from_dict(base, f"{stem}.json")
    except LmcostError as e:
        assert e.field.startswith(f"{stem}.json"), e
        return
    # accepted: every width is within the physical bounds, every number the model keeps is finite (an MLA
    # model's heads are no split of d_model: its d_h is not a width it uses)
    assert 0 < cfg.d_model <= 2**20 and 0 < cfg.vocab_size <= 2**24
    assert cfg.attention.mla is not None or 0 < cfg.d_h <= 2**20
    assert math.isfinite(cfg.rotary_fraction)
