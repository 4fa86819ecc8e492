"""Engine profiles as data (lmcost/hardware/engines.py, lmcost/data/engines/): each shipped default is the figure
the engine's source gives (quoted from /work/shared/engine-defaults.md or the cited file), names resolve as the
GPU names do, and a bad file gets one LmcostError naming the field."""

from __future__ import annotations

import pytest
import yaml

from lmcost.basics import shipped
from lmcost.basics.errors import LmcostError
from lmcost.hardware.engines import EngineProfile, engine_names, load_engine

GIB = 2**30


def test_shipped_profiles_and_names():
    assert engine_names() == ["sglang-0.5", "trtllm-1.0", "vllm-0.11"]
    for stem in engine_names():  # the file's name is name-version, and every profile is unfitted so far
        e = load_engine(stem)
        # the fitted figures are tests/test_serve_fit.py's (equal to reports/serve-fit.json); here, that they say so
        assert e.key == stem and "serving-silicon.csv" in e.fitted and e.kernel_overhead_us > 0
        assert e.sources and all(s.strip() for s in e.sources)
    # a bare name takes the newest shipped version; an alias the file that lists it
    assert load_engine("vllm").key == "vllm-0.11" and load_engine("VLLM-0.11").key == "vllm-0.11"
    assert load_engine("tensorrt-llm-1.0").key == "trtllm-1.0"


def test_newest_version_wins(tmp_path, monkeypatch):
    # 0.9 < 0.11 < 0.12 as versions, not as strings ("0.9" > "0.11" as text)
    src = shipped.folder("engines") / "vllm-0.11.yaml"
    for v in ("0.9", "0.12"):
        data = yaml.safe_load(src.read_text())
        data.update(version=v, aliases=[])
        (tmp_path / f"vllm-{v}.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "vllm-0.11.yaml").write_text(src.read_text())
    monkeypatch.setattr(shipped, "folder", lambda kind: tmp_path)
    assert load_engine("vllm").version == "0.12" and load_engine("vllm-0.9").version == "0.9"


def test_vllm_defaults():
    e = load_engine("vllm-0.11")
    # engine-defaults.md, vLLM: "`max_num_seqs` | from `get_batch_defaults`: 1024 (LLM class and OpenAI server) when
    # the GPU has >= 70 GiB and its name does not contain "a100"; otherwise 256."
    assert e.seqs_for(80e9, "h100-sxm") == 1024 and e.seqs_for(141e9, "h200") == 1024
    assert e.seqs_for(80e9, "a100-80gb") == 256 and e.seqs_for(48e9, "l40s") == 256
    assert e.seqs_for(70 * GIB, "x") == 1024 and e.seqs_for(70 * GIB - 1, "x") == 256  # ">= 70 GiB" at the edge
    # "`max_num_batched_tokens` | ... >= 70 GiB and not A100: `LLM` class 16384, OpenAI API server 8192; other
    # GPUs: `LLM` class 8192, API server 2048."
    assert e.tokens_for(80e9, "h100-sxm") == 8192 and e.tokens_for(80e9, "NVIDIA A100-SXM4-80GB") == 2048
    # "`enable_chunked_prefill` | True"; "`max_num_partial_prefills` / ... | 1 / 1"
    assert e.chunked_prefill is True and e.max_partial_prefills == 1
    # "`gpu_memory_utilization` | 0.9 (@01230b40) | Fraction of GPU memory ... for weights, activations and KV cache"
    assert (e.memory_fraction, e.memory_fraction_of) == (0.9, "total")
    # "`block_size` | ... Later: `DEFAULT_BLOCK_SIZE = 16` when unset."
    assert e.block_size == 16
    assert (e.admission, e.preemption, e.mixed_batches) == ("on_demand", "recompute", True)


def test_sglang_defaults():
    e = load_engine("sglang-0.5")
    # "`enable_mixed_chunk` | False | Mix prefill chunks and decodes in one batch."
    assert e.mixed_batches is False
    # "`page_size` | None (resolved per backend)": sglang 0.5.3 _handle_page_size resolves None to 1
    assert e.block_size == 1
    # "`mem_fraction_static` | None (resolved at start-up) | ... model weights plus the KV-cache pool": resolved on
    # an 80 GB H100 at TP 1 (sglang 0.5.3 server_args.py): reserved 512 + 8192 x 1.5 + 256 x 2 + 1 x 1 / 8 x 1024
    # = 13,440 MiB of 81,559 MiB, (81559 - 13440) / 81559 = 0.83521 -> round(, 3) = 0.835
    assert e.memory_fraction == round((81559 - (512 + 8192 * 1.5 + 256 * 2 + 1024 / 8)) / 81559, 3) == 0.835
    assert e.memory_fraction_of == "total"
    # chunked_prefill_size / cuda_graph_max_bs tiers (sglang 0.5.3 _handle_gpu_memory_settings, TP < 4):
    # < 20 GiB 2048/8, < 35 GiB 2048/16, < 60 GiB 4096/32, < 160 GiB 8192/256, else 16384/512
    for gib, tokens, graphs in ((16, 2048, 8), (24, 2048, 16), (48, 4096, 32), (80, 8192, 256), (141, 8192, 256),
                                (180, 16384, 512)):
        assert (e.tokens_for(gib * GIB), e.graphs_for(gib * GIB)) == (tokens, graphs), gib
    assert e.chunked_prefill and e.admission == "on_demand"


def test_trtllm_defaults():
    e = load_engine("trtllm-1.0")
    # "`kv_cache_config.free_gpu_memory_fraction` | 0.9 | Fraction of the GPU memory still free after weights"
    assert (e.memory_fraction, e.memory_fraction_of) == (0.9, "free")
    # "`scheduler_config.capacity_scheduler_policy` | `GUARANTEED_NO_EVICT` | ... admits a request only if it can
    # finish without being paused"
    assert (e.admission, e.preemption) == ("reserve_full", "none")
    # "`cuda_graph_config` (decode) | ... `enable_padding` False; if neither batch sizes nor max is given, max batch
    # size 128 is used"
    assert (e.cuda_graph_max_batch, e.cuda_graph_padding) == (128, False)
    assert e.mixed_batches is True


def _vllm() -> dict:
    return yaml.safe_load((shipped.folder("engines") / "vllm-0.11.yaml").read_text())


@pytest.mark.parametrize("key, value, field", [
    ("max_num_seqs", 0, "max_num_seqs"),
    ("max_num_seqs", 2**31 + 1, "max_num_seqs"),
    ("max_num_seqs", 1.5, "max_num_seqs"),
    ("max_num_batched_tokens", -1, "max_num_batched_tokens"),
    ("memory_fraction", 0.0, "memory_fraction"),
    ("memory_fraction", 1.01, "memory_fraction"),
    ("memory_fraction", float("nan"), "memory_fraction"),
    ("memory_fraction_of", "used", "memory_fraction_of"),
    ("block_size", 0, "block_size"),
    ("admission", "greedy", "admission"),
    ("preemption", "pause", "preemption"),
    ("cuda_graph_max_batch", -1, "cuda_graph_max_batch"),
    ("step_overhead_us", -0.1, "step_overhead_us"),
    ("seq_overhead_us", 1e6 + 1, "seq_overhead_us"),
    ("chunked_prefill", "yes", "chunked_prefill"),
    ("max_partial_prefills", 2000, "max_partial_prefills"),
    ("version", "latest", "version"),
    ("name", "v/llm", "name"),
    ("max_num_seqs_typo", 3, "max_num_seqs_typo"),
    ("smaller_gpus", [{"below_gib": 70}], "smaller_gpus.0.max_num_seqs"),
    ("smaller_gpus", [{"below_gib": 70, "max_num_seqs": 8}, {"below_gib": 20, "max_num_seqs": 4}], "smaller_gpus"),
    ("smaller_gpus", [{"below_gib": 0, "max_num_seqs": 8}], "smaller_gpus.0.below_gib"),
])
def test_bad_field_is_named(tmp_path, key, value, field):
    data = _vllm()
    data[key] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LmcostError) as err:
        load_engine(str(path))
    assert err.value.field == f"{path}: {field}"


def test_preemption_none_needs_reserve_full_and_swap_is_said(tmp_path):
    # preemption none with on-demand pages overflowed the KV cache (148% in use): refused, one line
    data = _vllm() | dict(preemption="none")
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LmcostError, match="lets the KV cache overflow; give admission: reserve_full") as err:
        load_engine(str(path))
    assert err.value.field == f"{path}: preemption"
    path.write_text(yaml.safe_dump(data | dict(admission="reserve_full")))
    assert load_engine(str(path)).notes_for_serve() == []
    # swap is accepted, costed as recompute, and the profile says so for serve to print
    path.write_text(yaml.safe_dump(_vllm() | dict(preemption="swap")))
    notes = load_engine(str(path)).notes_for_serve()
    assert len(notes) == 1 and notes[0].startswith("note: vllm 0.11 preempts by swap") and "as recompute" in notes[0]
    assert all(load_engine(n).notes_for_serve() == [] for n in engine_names())


def test_missing_field_and_bad_yaml(tmp_path):
    data = _vllm()
    del data["block_size"]
    path = tmp_path / "e.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LmcostError, match="block_size: missing"):
        load_engine(str(path))
    path.write_text("name: vllm\nmax_num_seqs: [1\n")
    with pytest.raises(LmcostError, match="not valid YAML at line"):
        load_engine(str(path))


def test_unknown_name_lists_the_known():
    with pytest.raises(LmcostError) as err:
        load_engine("vlm")
    assert err.value.field == "engine" and "vllm-0.11" in err.value.fix and "sglang" in err.value.fix
    with pytest.raises(LmcostError, match="no such file"):
        load_engine("engines/missing.yaml")


def test_profiles_are_frozen():
    with pytest.raises(Exception):
        load_engine("vllm").max_num_seqs = 1
    assert EngineProfile.model_config["frozen"]


@pytest.mark.parametrize("spelling, key", [("vllm@0.11", "vllm-0.11"), ("VLLM@0.11.0", "vllm-0.11"),
                                           ("sglang @ 0.5", "sglang-0.5"), ("trtllm@1.0", "trtllm-1.0")])
def test_estimates_name_at_version_spelling(spelling, key):
    # estimate's and op's --engine spell an engine name@version; serve's profiles are name-version files.
    assert load_engine(spelling).key == key


@pytest.mark.parametrize("spelling, said", [
    ("vllm@0.24.0", "no shipped vllm 0.24.0 profile; use one of: sglang-0.5, trtllm-1.0, vllm-0.11, or vllm alone"),
    ("vllm@", "'vllm@' names no engine version"), ("@0.11", "'@0.11' names no engine version"),
    ("torch", "torch chooses the kernel figures of estimate"), ("auto", "auto chooses the kernel figures of estimate")])
def test_other_spellings_that_name_no_profile_are_one_error(spelling, said):
    with pytest.raises(LmcostError, match="^engine: ") as e:
        load_engine(spelling)
    assert said in str(e.value)


def test_serve_takes_name_at_version_on_the_command_line():
    from typer.testing import CliRunner

    from lmcost.cli import app

    args = ["serve", "tiny-gqa", "--gpu", "h100", "--requests", "20", "--json"]
    a, b = (CliRunner().invoke(app, args + ["--engine", e]) for e in ("vllm-0.11", "vllm@0.11"))
    assert a.exit_code == 0 == b.exit_code, b.output
    assert a.stdout == b.stdout
    r = CliRunner().invoke(app, args + ["--engine", "torch"])
    assert r.exit_code == 2 and r.output.strip().startswith("error: --engine: torch chooses")
