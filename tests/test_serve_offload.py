"""KV offload tiers from the node file (lmcost.apps.serve_offload): the node's share per GPU worked by hand
from the datasheets, the two-tier cache against the one-tier one, the run's JSON, and the refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve_offload import HOST_MEMORY_FRACTION, Tiers, parse_tiers
from lmcost.apps.serve_prefix import PrefixCache
from lmcost.apps.serve_sim import simulate
from lmcost.cli import app
from lmcost.hardware.cluster import load_cluster
from tests.test_serve_prefix import KNOBS, LLAMA_KV, step_model, summary

H100 = load_cluster("dgx-h100")
#: one block of llama-3-8b: 16 tokens x 131,072 B
BLOCK = 16 * LLAMA_KV


# --- exact: the node's share per GPU ----------------------------------------------------------------------------

def test_the_cpu_share_per_gpu_from_the_datasheet():
    # DGX H100 datasheet: "System memory 2TB" = 2,048 GiB; x 0.5 (HOST_MEMORY_FRACTION) / 8 GPUs = 128 GiB
    # = 137,438,953,472 B per GPU; H100 SXM "PCIe Gen5: 128GB/s" both directions = 64 GB/s per direction
    assert HOST_MEMORY_FRACTION == 0.5
    t = parse_tiers("cpu", H100)
    assert (t.cpu_bytes, t.cpu_bytes_s, t.disk_bytes, t.names) == (137_438_953_472, 64e9, 0, ("cpu",))
    # DGX A100 (640GB) datasheet: 2TB, 8 GPUs: the same 128 GiB; A100 SXM4 "PCIe Gen4: 64GB/s": 32 GB/s
    a = parse_tiers("cpu", load_cluster("dgx-a100"))
    assert (a.cpu_bytes, a.cpu_bytes_s) == (137_438_953_472, 32e9)


def test_the_disk_share_per_gpu_from_the_datasheet():
    # DGX H100 datasheet: "Internal storage 8x 3.84 TB NVMe U.2" = 30.72e12 B / 8 GPUs = 3.84e12 B per GPU;
    # its read bandwidth is not on the datasheet, so it is given by hand (6 GB/s)
    t = parse_tiers("cpu:1G,disk::6", H100)
    assert (t.cpu_bytes, t.cpu_bytes_s, t.disk_bytes, t.disk_bytes_s) == (2**30, 64e9, 3_840_000_000_000, 6e9)
    assert t.names == ("cpu", "disk")
    d = parse_tiers("disk:1T:6", H100)
    assert (d.cpu_bytes, d.disk_bytes, d.disk_bytes_s, d.names) == (0, 2**40, 6e9, ("disk",))


def test_the_original_form_is_unchanged():
    assert parse_tiers("cpu:256G", H100) == (256 * 2**30, 64e9)
    assert parse_tiers("cpu:1TiB:50", load_cluster("hgx-h200")) == (2**40, 50e9)  # a node with no host: block


# --- the cache: two tiers against one ---------------------------------------------------------------------------

def run(offload):
    # test_serve_prefix's LRU case: ids 0, 1, 2, 0 under a cache of 1,300 tokens; id 0's evicted tail (28 or
    # 29 of its 32 blocks) goes below the GPU and the last request loads it back
    cap, order = 1300 * LLAMA_KV, [0, 1, 2, 0]
    n = len(order)
    return simulate(step_model(), KNOBS, np.zeros(n), np.full(n, 700), np.full(n, 20), kv_capacity_bytes=cap,
                    kv_per_token_bytes=float(LLAMA_KV), concurrency=1,
                    prefix_cache=PrefixCache(order, [512] * n, 16, float(LLAMA_KV), offload))


def test_a_disk_tier_of_nothing_is_the_cpu_tier_alone():
    one = run((2**30, 64e9))
    two = run(Tiers(2**30, 64e9, 0, 6e9, ("cpu", "disk"), {}))
    assert one.prefix_cache.loaded > 0 and two.prefix_cache.disk_loaded == 0
    assert summary(two) == summary(one)
    assert two.prefix_cache.load_s == one.prefix_cache.load_s


def test_blocks_spill_to_disk_and_load_at_its_rate():
    # a CPU tier of 5 blocks and a 1 GiB disk: id 0's evicted tail takes 5 blocks on the CPU, the rest spill
    # to disk; the last request loads all of them (the hit of 512 tokens the 1 GiB CPU tier alone gives), the
    # CPU's 5 blocks at 64 GB/s and the disk's at 6 GB/s: load_s = 5 x 2,097,152 / 64e9 + k x 2,097,152 / 6e9
    one = run((2**30, 64e9)).prefix_cache
    two = run(Tiers(5 * BLOCK, 64e9, 2**30, 6e9, ("cpu", "disk"), {})).prefix_cache
    assert dict(two.hits) == dict(one.hits) == {512: 1}
    assert two.loaded == 5 and two.loaded + two.disk_loaded == one.loaded
    assert two.load_s == pytest.approx(5 * BLOCK / 64e9 + two.disk_loaded * BLOCK / 6e9, rel=1e-12)
    # a disk of 3 blocks: the spill past it is dropped; the last request hits what is left of id 0's 32
    # blocks: the GPU's 32 - 28 = 4, the CPU's 5 and the disk's 3: 12 blocks, 192 tokens
    small = run(Tiers(5 * BLOCK, 64e9, 3 * BLOCK, 6e9, ("cpu", "disk"), {})).prefix_cache
    assert one.loaded == 28 and dict(small.hits) == {192: 1}
    assert (small.loaded, small.disk_loaded, small.disk_peak) == (5, 3, 3) and small.disk_evicted > 0


# --- the run: JSON, the node's tier against the same size by hand, refusals -------------------------------------

ARGS = ["serve", "tiny-gqa", "--requests", "40", "--prefix", "groups:8:2000", "--json"]


def offload_of(*extra) -> tuple:
    r = CliRunner().invoke(app, [*ARGS, *extra])
    assert r.exit_code == 0, r.stderr
    run_ = json.loads(r.stdout)
    run_ = run_["runs"][0] if "runs" in run_ else run_
    return run_, run_["prefix_cache"]["offload"]


def test_the_node_tier_is_the_same_size_given_by_hand():
    node, off = offload_of("--kv-offload", "cpu")
    hand, off_hand = offload_of("--kv-offload", "cpu:128G")
    assert {k: v for k, v in off.items() if k in off_hand} == off_hand
    node.pop("prefix_cache"), hand.pop("prefix_cache")
    assert node == hand
    # the capacity it buys: 128 GiB / (16-token blocks of tiny-gqa's KV per token) x 16 tokens
    per_token = off["tiers"]["cpu"]["capacity_bytes"] / off["capacity_tokens"]
    assert off["tiers"]["cpu"]["capacity_tokens"] == off["capacity_tokens"] and per_token > 0
    assert off["sources"]["cpu_bytes"] == "dgx-h100 host.memory_gib x 0.5 / 8 GPUs"


@pytest.mark.parametrize("spec, says", [
    ("disk", "gives no NVMe read bandwidth"),           # not on the DGX H100 datasheet
    ("cpu:300G", "more than the node's"),                 # 300 GiB > 2,048 GiB / 8
    ("disk:4T:6", "more than the node's"),               # 4 TiB > 3.84e12 B
    ("disk,cpu", "cpu before disk"),
    ("cpu,cpu", "each tier once"),
    ("gpu", "is not a tier"),
])
def test_bad_tiers_are_one_line(spec, says):
    r = CliRunner().invoke(app, [*ARGS, "--kv-offload", spec])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: --kv-offload: "), r.stderr
    assert says in lines[0]


def test_a_node_file_without_host_memory_is_refused():
    r = CliRunner().invoke(app, [*ARGS, "--gpu", "h200", "--kv-offload", "cpu"])
    assert r.exit_code == 2 and "'hgx-h200' gives no system memory" in r.stderr, r.stderr


def test_the_tiers_json_exactly():
    # the spill case above, its prefix_cache.offload.tiers byte for byte, worked by hand: a block is 16 x
    # 131,072 = 2,097,152 B. CPU: 5 blocks = 10,485,760 B, 80 tokens beyond the GPU cache; 5 loaded (80 tokens)
    # in 10,485,760 / 64e9 = 0.00016384 s; 56 blocks entered it (ids 0 and 1's evicted 28 each), 46 spilled
    # (all but the 5 of each it held), peak 5 blocks. Disk: 2^30 B = 512 blocks = 8,192 tokens; id 0's 28 - 5 =
    # 23 blocks (368 tokens, 48,234,496 B) loaded in 48,234,496 / 6e9 = 0.008039082666... s; nothing dropped, peak 23 blocks
    from lmcost.apps.serve_prefix import tiers_summary

    c = run(Tiers(5 * BLOCK, 64e9, 2**30, 6e9, ("cpu", "disk"), {})).prefix_cache
    assert json.dumps(tiers_summary(c, 1.0)["tiers"], sort_keys=True) == (
        '{"cpu": {"bandwidth_bytes_per_s": 64000000000.0, "bytes_loaded": 10485760.0, "capacity_bytes": 10485760, '
        '"capacity_tokens": 80, "evictions": 46, "hit_tokens": 80, "load_s": 0.00016384, "peak_bytes": 10485760.0}, '
        '"disk": {"bandwidth_bytes_per_s": 6000000000.0, "bytes_loaded": 48234496.0, "capacity_bytes": 1073741824, '
        '"capacity_tokens": 8192, "evictions": 0, "hit_tokens": 368, "load_s": 0.008039082666666668, '
        '"peak_bytes": 48234496.0}}')
    assert tiers_summary(c, 1.0)["capacity_tokens"] == 80 + 8192


def test_a_gpu_with_no_node_file_takes_tiers_by_hand_only():
    # an L4 has no shipped node: cpu:SIZE runs as before (its tier of 1 GiB at PCIe Gen5 x16's 64 GB/s), the
    # node's tiers are refused in one line
    r = CliRunner().invoke(app, [*ARGS, "--gpu", "l4", "--kv-offload", "cpu:1G"])
    assert r.exit_code == 0, r.stderr
    off = json.loads(r.stdout)["prefix_cache"]["offload"]
    assert (off["capacity_bytes"], off["bandwidth_bytes_per_s"], "tiers" in off) == (2**30, 64e9, False)
    r = CliRunner().invoke(app, [*ARGS, "--gpu", "l4", "--kv-offload", "cpu"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --kv-offload: this GPU has no node file: it gives no"), r.stderr
