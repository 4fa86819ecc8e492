"""Inputs that were accepted and changed nothing, or changed numbers they mean nothing for (issue 24's
second pass, findings 1-2, 5-6, 21-23): each is refused in one line naming its field, or its meaning is
stated; the other side of each rule still runs.

- a GPU YAML's efficiency block: a figure no formula reads (an empty tile menu, tile_m beside a menu,
  split_k without one) and a GEMM grid with no candidate (split_k without 1);
- a training sequence past a learned position table, as estimate and plan refuse it;
- a training step that does not fit: its figures are "if it fit", said on stderr with the shortfall;
- an HF sliding_window of 0 or less (transformers' mask ``kv > q - w`` lets a query see no key);
- a local:global pattern with no local layer, a decode that is not causal, a collective on one GPU.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml
from typer.testing import CliRunner

from conftest import ROOT, hf_json
from lmcost.basics.errors import LmcostError
from lmcost.hardware.gpu import gpu_from_text, load_gpu
from lmcost.model.loading import load_config

H100 = yaml.safe_load((ROOT / "lmcost" / "data" / "gpus" / "h100-sxm.yaml").read_text())


def _gpu(**paths) -> str:
    """h100-sxm's YAML with dotted paths (``efficiency__gemm__tiles``) set; a value of ... deletes the key."""
    data = copy.deepcopy(H100)
    for path, value in paths.items():
        *head, last = path.split("__")
        node = data
        for k in head:
            node = node[k]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return yaml.safe_dump(data)


def _field(call) -> str:
    with pytest.raises(LmcostError) as e:
        call()
    return e.value.field


# --- the efficiency block ------------------------------------------------------------------------------
V1 = dict(efficiency__gemm__tiles=..., efficiency__gemm__split_k=..., efficiency__gemm__reuse_full=...)


@pytest.mark.parametrize("paths, field", [
    # an empty menu fell to a 1 x 1 tile: no tile or wave quantization (llama-3-8b's TTFT 15.5 -> 14.5 ms)
    (dict(efficiency__gemm__tiles=[]), "efficiency.gemm.tiles"),
    (dict(efficiency__gemm__split_k=[2, 4]), "efficiency.gemm.split_k"),
    (dict(efficiency__gemm__tile_m=128), "efficiency.gemm.tile_m"),       # the menu's tiles are read instead
    ({**V1, "efficiency__gemm__split_k": [1, 2]}, "efficiency.gemm.split_k"),  # v1 splits K on its own
    ({**V1, "efficiency__gemm__reuse_full": 64.0}, "efficiency.gemm.reuse_full"),
    (dict(efficiency__attention_prefill__fa9={"peak_fraction": 0.5, "l_half": 1.0, "overhead_us": 1.0}),
     "efficiency.attention_prefill"),                                     # --kernel cannot name fa9
    (dict(efficiency__kinds__bogus={"norm": {"bandwidth_fraction": 0.5, "overhead_us": 1.0}}), "efficiency.kinds"),
])
def test_efficiency_figures_no_formula_reads_are_refused(paths, field):
    assert _field(lambda: gpu_from_text(_gpu(**paths), "g.yaml")) == f"g.yaml: {field}"


def test_the_other_side_of_the_efficiency_rules_reads():
    # split_tokens 0 means the kernel does not split the keys (vLLM's PagedAttention V1, shipped on A100).
    assert load_gpu("a100").efficiency.attention_decode["paged-v1"].split_tokens == 0
    # The one-tile model (v1) with its tile, as `lmcost calibrate` writes it.
    v1 = gpu_from_text(_gpu(**V1, efficiency__gemm__tile_m=128, efficiency__gemm__tile_n=128, efficiency__sources=...),
                       "g.yaml")
    assert (v1.efficiency.gemm.tiles, v1.efficiency.gemm.tile_m) == ([], 128)
    # A dumped block (every field written, defaults included) reads back, menu or not.
    for gpu in (load_gpu("h100"), v1):
        assert gpu_from_text(yaml.safe_dump(json.loads(gpu.model_dump_json())), "d.yaml") == gpu


# --- training ------------------------------------------------------------------------------------------
def test_training_past_learned_positions_is_refused_as_estimate_refuses_it():
    from lmcost.apps.plan import search_train
    from lmcost.apps.train_run import TrainRequest, run_train

    # gpt2's table has n_positions = 1024 rows (tests/data/hf-configs/gpt2.json).
    assert hf_json("gpt2")["n_positions"] == 1024
    assert _field(lambda: run_train(TrainRequest(model="gpt2", gpus=1, seq=1025))) == "seq"
    assert _field(lambda: search_train(load_config("gpt2"), [load_gpu("h100")], 1, 2048, 64)) == "seq"


def test_a_step_that_does_not_fit_says_so_and_by_how_much():
    from lmcost.apps.train_run import TrainRequest, run_train
    from lmcost.output.render import si
    from lmcost.output.tables import train_tables

    said = []
    # Full training of llama-3-8b on one 80 GB H100: 8.03e9 parameters x (2 weights + 2 gradients + 4 master
    # + 8 AdamW moments) bytes = 128 GB of model states alone.
    run = run_train(TrainRequest(model="llama-3-8b", gpus=1, seq=1024, global_batch=1), said.append)
    step = run.step
    assert not step.fits and step.memory["capacity_bytes"] == 80e9 and step.memory["total_bytes"] > 128e9
    # the note states the device figure (lmcost.cost.train_memory: reserved + CUDA context + NCCL), the
    # allocated peak, and the margin, negative: capacity - device figure
    mem = step.memory
    # against the 80 GiB a process can hold (80 x 2^30 = 85.9e9 bytes: the datasheet's GB are binary)
    assert mem["usable_bytes"] == 80 * 2**30
    assert mem["margin_bytes"] == 80 * 2**30 - mem["nvidia_smi_bytes"] < 80 * 2**30 - mem["total_bytes"] < 0
    assert [s for s in said if "does not fit" in s] == [
        f"note: does not fit: {si(mem['nvidia_smi_bytes'], 'B')} per GPU as the device holds it (allocated "
        f"{si(mem['allocated_bytes'], 'B')}) against 85.9 GB (margin {si(mem['margin_bytes'], 'B')}); "
        "its time, throughput and MFU are what the step would take if it fit"]
    titles = [t.title for t in train_tables(step, run.setup, 989e12)]
    assert "Throughput if it fit" in titles and "Step time if it fit (per GPU)" in titles
    assert step.to_dict()["fits"] is False


# --- model files and variants --------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-3-8b", "mistral-7b-v0.1"])
def test_a_negative_hf_sliding_window_is_refused(model):
    from lmcost.model.loading import config_from_dict

    assert _field(lambda: config_from_dict({**hf_json(model), "sliding_window": -5}, "c.json")) == "c.json: sliding_window"


def test_hf_sliding_window_null_zero_or_past_the_positions_is_read():
    from lmcost.model.loading import config_from_dict

    # Mixtral writes null (no window); transformers 5.24's Qwen2MoeConfig writes 0 where use_sliding_window
    # is false ("self.sliding_window if self.use_sliding_window else 0", configuration_qwen2_moe.py; its
    # default config is read in test_hf_types); Qwen2.5 writes 131072 with use_sliding_window false.
    assert config_from_dict(hf_json("mixtral-8x7b"), "m.json").attention.sliding_window is None
    assert config_from_dict({**hf_json("mixtral-8x7b"), "sliding_window": 0}, "z.json").attention.sliding_window is None
    assert config_from_dict(hf_json("qwen2.5-7b"), "q.json").attention.sliding_window is None
    cfg = config_from_dict({**hf_json("mistral-7b-v0.1"), "sliding_window": 2**20}, "w.json")
    assert cfg.attention.sliding_window == 2**20


def test_a_local_global_pattern_with_no_local_layer_is_refused():
    from lmcost.model.variants import with_window

    cfg = load_config("llama-3-8b")
    assert _field(lambda: with_window(cfg, 1024, "0:1")) == "local_global"
    # 1:0 is every layer local: the window on all of them.
    assert with_window(cfg, 1024, "1:0").attention.layer_pattern == ["local"]


# --- op ------------------------------------------------------------------------------------------------
def test_a_decode_that_is_not_causal_is_refused_and_causal_changes_nothing_there():
    from lmcost.cost.kernels import attention

    args = (1, 32, 8, 128)
    assert _field(lambda: attention("decode", *args, None, 4096, causal=False)) == "attention.causal"
    # One query at the last of t = 4096 positions: causal pairs s*t - s*(s-1)/2 = 4096, every key; the same
    # query costed as a one-token prefill, masked or not, and as a decode step gives the same work.
    costs = [attention("prefill", *args, 1, 4096, causal=c)[0] for c in (True, False)]
    costs.append(attention("decode", *args, None, 4096)[0])
    assert len({(o.flops, o.bytes) for o in costs}) == 1


def test_a_collective_needs_two_gpus_and_send_recv_is_one_pair_inside_a_node():
    from lmcost.apps.collective import collective_cost

    assert _field(lambda: collective_cost(kind="all_reduce", size=2**26, ranks=1)) == "ranks"
    # nccl-tests' sendrecv_perf: every rank sends to the next at once, so inside a node any group is one pair.
    two, eight = (collective_cost(kind="send_recv", size=2**26, ranks=n).record for n in (2, 8))
    assert two["time_s"] == eight["time_s"] and eight["level"] == "intra"
    assert collective_cost(kind="send_recv", size=2**26, ranks=16).record["level"] == "inter"


def test_the_cli_names_the_flags():
    from lmcost.cli.app import app

    for argv, flag in [
        (["op", "attention", "--phase", "decode", "--no-causal", "--heads", "32", "--kv-heads", "8",
          "--head-dim", "128", "--kv-len", "4096"], "--no-causal"),
        (["op", "collective", "--kind", "all_reduce", "--gpus", "1", "--bytes", "64M"], "--gpus"),
        (["kv", "llama-3-8b", "--local-global", "0:1", "--window", "1024"], "--local-global"),
        (["train", "gpt2", "--seq", "2048", "--gpus", "1"], "--seq"),
    ]:
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 2 and r.stderr.startswith(f"error: {flag}: ") and len(r.stderr.strip().splitlines()) == 1, \
            (argv, r.stderr)
