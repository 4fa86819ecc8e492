"""What a fresh user of ``lmcost serve`` found (issue 28's follow-up): one GPU count under ``--pd`` (settings,
the ``pd`` block and the setup line agree), the prefill pool's errors under its own flags, the power cap's
range message for any number, ``--kv-offload``'s sizes (fractional with a unit) and what its errors name,
one prefix id of growing length (a session), and the README's prefix-caching figures with their command.
Oracles: the pools' sizes by hand, the binary units by hand, the cache's hits by hand in the comments, and
the README's text. Every run here is tens of requests."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, run_serve
from lmcost.apps.serve_pd import run_pd
from lmcost.apps.serve_prefix import PrefixCache, parse_offload
from lmcost.cli import app

SMALL = ["--requests", "12", "--prompt", "256", "--output", "8"]


def serve(*args: str):
    return CliRunner().invoke(app, ["serve", *args])


# --- one GPU count under --pd ----------------------------------------------------------------------------------

def test_pd_settings_count_both_pools_and_keep_the_decode_workers_layout():
    # 2P3D of TP1 workers: 2 + 3 = 5 GPUs; decode TP2 beside prefill TP1, 2P1D: 2 x 1 + 1 x 2 = 4 GPUs
    d = run_pd(ServeRequest(model="llama-3-8b", requests=12, prompt="256", output="8", pd=True,
                            prefill_workers=2, decode_workers=3)).to_dict()
    assert d["settings"]["gpus"] == d["pd"]["gpus"] == 5
    assert d["settings"]["layout_of"] == "decode worker"
    e = run_pd(ServeRequest(model="llama-3-8b", requests=12, prompt="256", output="8", pd=True, tp=2,
                            prefill_tp=1, prefill_workers=2)).to_dict()
    assert e["settings"]["gpus"] == e["pd"]["gpus"] == 4
    assert (e["settings"]["tp"], e["pd"]["decode"]["tp"], e["pd"]["prefill"]["tp"]) == (2, 2, 1)


def test_settings_without_pd_are_as_before():
    d = run_serve(ServeRequest(model="llama-3-8b", requests=12, prompt="256", output="8", tp=2)).to_dict()
    assert d["settings"]["gpus"] == 2 and "layout_of" not in d["settings"]


def test_pd_setup_line_says_both_pools():
    r = serve("llama-3-8b", *SMALL, "--pd", "--tp", "2", "--prefill-tp", "1", "--prefill-workers", "2")
    assert r.exit_code == 0, r.stderr
    head = " ".join(r.stdout.split())  # the line wraps at the terminal's width
    assert "llama-3-8b on 4 x h100-sxm in two pools (prefill 2 x one GPU, decode 1 x TP2) with vllm" in head
    assert "the decode worker: max_num_seqs" in head
    assert "(TP2 (2 GPUs))" not in head


# --- the prefill pool's errors name its flags -------------------------------------------------------------------

@pytest.mark.parametrize("args, line", [
    # (a budget alone now caps the prefill pool's max_num_seqs, serve_pd.prefill_seqs: refused only against a given one)
    (["--prefill-max-num-batched-tokens", "16", "--prefill-max-num-seqs", "32"],
     "error: --prefill-max-num-batched-tokens: the prefill pool: a budget of 16 tokens per step is below "
     "max_num_seqs 32"),
    (["--prefill-tp", "3"], "error: --prefill-tp: the prefill pool: llama-3-8b has 32 query heads, not a multiple"),
    (["--prefill-ep", "2"], "error: --prefill-ep: the prefill pool: llama-3-8b has no experts; drop --prefill-ep"),
    (["--tp", "3"], "error: --tp: llama-3-8b has 32 query heads"),  # the decode pool's stays --tp
])
def test_prefill_pool_errors_name_the_prefill_flag(args, line):
    r = serve("llama-3-8b", *SMALL, "--pd", *args)
    assert r.exit_code == 2, r.stdout
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith(line), r.stderr
    assert "lower max_num_seqs" not in r.stderr  # the prefill pool's max_num_seqs is no flag


# --- the power cap --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cap", ["1e9", "1", "0", "-5", "1401"])
def test_any_cap_out_of_range_hears_the_gpus_range(cap):
    # an H100 SXM's TDP is 700 W: caps 0.25 x 700 = 175 W to 2 x 700 = 1400 W
    r = serve("llama-3-8b", *SMALL, "--power-limit", cap)
    assert r.exit_code == 2
    assert "is outside the caps h100-sxm takes: 175 W (25% of its 700 W TDP) to 1400 W; give 175 to 1400 W" \
        in r.stderr, r.stderr


# --- --kv-offload's sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, want", [
    ("cpu:1.5G", 1_610_612_736),        # 1.5 x 2^30
    ("cpu:0.5TiB", 549_755_813_888),    # 2^39
    ("cpu:1.5K", 1536),
    ("cpu:0.1K", 102),                  # 102.4 B, floored to whole bytes
])
def test_fractional_sizes_with_a_unit(spec, want):
    assert parse_offload(spec) == (want, 64e9)


@pytest.mark.parametrize("spec, what", [
    ("cpu:1.5", "a size in bytes is a whole number"),
    ("cpu:1.5X", "'X' is not a binary unit"),
    ("cpu:64GB", "'GB' is not a binary unit"),
    ("gpu:1G", "is not a tier (cpu or disk"),
    ("cpu:.5G", "is not cpu:SIZE[:GBPS]"),
])
def test_offload_errors_say_what_is_wrong(spec, what):
    r = serve("tiny-gqa", "--requests", "8", "--prefix", "shared:64", "--kv-offload", spec)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: --kv-offload: ") and what in r.stderr, r.stderr


# --- one prefix id, growing -----------------------------------------------------------------------------------

def test_one_id_of_growing_length_hits_each_lines_own_length():
    # id 0 with prefix_tokens 256, 512, 256 (blocks of 16, prompts of 800): the first prefills all 800 and
    # caches up to the id's longest prefix, 512 // 16 = 32 blocks; the second hits all 512; the third its own
    # 256 (16 blocks), and the chain stays 32 blocks: a shorter line never shortens it
    c = PrefixCache([0, 0, 0], [256, 512, 256], 16, 1.0)
    assert c.admit(0, 800) == 0
    c.prefilled(0, 800)
    c.release(0, 864)
    assert c.chain[0] == 32
    assert c.admit(1, 800) == 512
    c.prefilled(1, 800)
    c.release(1, 864)
    assert c.admit(2, 800) == 256
    c.prefilled(2, 800)
    c.release(2, 864)
    assert c.chain[0] == 32 and c.hit_tokens == 768


def test_growing_id_is_accepted_from_a_jsonl(tmp_path):
    lines = [dict(arrival_s=0.05 * i, prompt_tokens=800, output_tokens=8, prefix_id="chat",
                  prefix_tokens=256 if i % 2 else 512) for i in range(10)]
    path = tmp_path / "grow.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = serve("llama-3-8b", "--workload", str(path), "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    pc = d["prefix_cache"]
    # each line arrives 50 ms after the last, which has prefilled by then (its TTFT is under 50 ms): the first
    # (512) prefills everything, every later line hits its own length, all whole blocks:
    # 4 x 512 + 5 x 256 = 3,328 of 10 x 800 = 8,000 tokens asked, a hit rate of 0.416
    assert d["ttft_s"]["max"] < 0.05
    assert pc["hit_tokens"] == 3328 and pc["hit_rate"] == pytest.approx(3328 / 8000, rel=1e-12)


# --- the README's prefix-caching figures -------------------------------------------------------------------------

def test_readme_prefix_figures_are_what_its_command_prints():
    text = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    m = re.search(r"\(`lmcost serve (llama-3-8b [^`]*--prefix sessions:5)`, 80 requests: 16 sessions of 5 turns\): "
                  r"mean TTFT ([\d.]+) ms with `--no-prefix-caching`, ([\d.]+) ms with the cache "
                  r"\(`prefix_cache.hit_rate` ([\d.]+)", text)
    assert m, "the README's prefix-caching sentence"
    args = m.group(1).split()
    off = json.loads(serve(*args, "--no-prefix-caching", "--json").stdout)
    on = json.loads(serve(*args, "--json").stdout)
    assert f"{off['ttft_s']['mean'] * 1e3:.3g}" == m.group(2)
    assert f"{on['ttft_s']['mean'] * 1e3:.3g}" == m.group(3)
    assert f"{on['prefix_cache']['hit_rate']:.2f}" == m.group(4)
