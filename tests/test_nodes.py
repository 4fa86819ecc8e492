"""The nodes people deploy on: A100 PCIe and H100 NVL servers, AMD MI300X and MI355X (xGMI, RCCL), and the
GB200 NVL72 rack. Rooflines worked by hand from the datasheet figures in each test's comment; the fabric a
group sees (an NVLink-bridged pair inside a PCIe node, n - 1 links of an xGMI mesh); bad files.

Roofline of one collective (lmcost.cost.collectives): one hop of the level's latency + payload x traffic /
bandwidth per GPU per direction, traffic for a ring all-reduce = 2(n-1)/n (nccl-tests' bus factor)."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from lmcost.basics.errors import LmcostError
from lmcost.cli import app
from lmcost.cost.collectives import collective
from lmcost.hardware.cluster import DEFAULT_NODE, default_cluster, list_clusters, load_cluster

runner = CliRunner()
NEW = ("a100-pcie-8gpu-nobridge", "h100-nvl-pair", "h100-nvl-8gpu", "mi300x-8gpu", "mi355x-8gpu")
MIB64 = 64 * 2**20  # 67,108,864 B, the CLI's "64M"


def _op(*args) -> dict:
    r = runner.invoke(app, ["op", "collective", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_new_nodes_load_and_are_listed():
    listed = runner.invoke(app, ["clusters", "list"])
    assert listed.exit_code == 0
    for name in NEW:
        c = load_cluster(name)
        assert c.sources and c.collectives.fit["loso_median_abs_error_pct"] == "no rows of this device"
        assert name in listed.output
    rows = {r["name"]: r for r in json.loads(runner.invoke(app, ["clusters", "list", "--json"]).output)}
    assert rows["mi300x-8gpu"]["library"] == rows["mi355x-8gpu"]["library"] == "rccl"
    assert rows["dgx-h100"]["library"] == rows["h100-nvl-8gpu"]["library"] == "nccl"  # the default
    assert "rccl" in runner.invoke(app, ["clusters", "show", "mi300x-node"]).output  # by alias
    assert "h100-nvl-pair" in runner.invoke(app, ["clusters", "show", "h100-nvl-8gpu"]).output  # its island


@pytest.mark.parametrize("gpu,node", [("a100-pcie-80gb", "a100-pcie-8gpu-nobridge"), ("h100-nvl", "h100-nvl-8gpu"),
                                      ("mi300x", "mi300x-8gpu"), ("mi355x", "mi355x-8gpu"), ("gb200", "gb200-nvl72")])
def test_default_node_per_gpu(gpu, node):
    assert default_cluster(gpu).name == node
    assert _op("--gpu", gpu, "--kind", "all_reduce", "--bytes", "64M", "--gpus", "8")["cluster"] == node


# Hand-worked 8-rank ring all-reduce of 64 MiB: traffic 2*7/8 = 1.75, so 1.75 x 67,108,864 = 117,440,512 B over
# each GPU's link per direction, plus one hop of latency:
# - MI300X: 896 GB/s bidirectional per GPU (gpu-specs.md line 20) = 448e9 B/s per direction:
#   117,440,512 / 448e9 = 262.144 us, + 0.6 us (NVLink-class hop) = 262.744 us
# - MI355X: 7 x 153.6 GB/s bidirectional (recalled) = 537.6e9 per direction: 218.453 us + 0.6 = 219.053 us
# - A100 PCIe: PCIe4 x16 32 GB/s per direction (gpu-specs.md line 47): 3,670.016 us + 1.0 us (PCIe hop) = 3,671.016 us
# - H100 NVL, 8 GPUs: the ring crosses PCIe Gen5 x16 between pairs, 64e9: 1,835.008 us + 1.0 = 1,836.008 us
@pytest.mark.parametrize("gpu,bw,hop_us", [("mi300x", 448e9, 0.6), ("mi355x", 537.6e9, 0.6),
                                           ("a100-pcie-80gb", 32e9, 1.0), ("h100-nvl", 64e9, 1.0)])
def test_eight_rank_all_reduce_roofline_by_hand(gpu, bw, hop_us):
    d = _op("--gpu", gpu, "--kind", "all_reduce", "--bytes", "64M", "--gpus", "8")
    assert d["level"] == "intra" and d["nodes"] == 1
    assert d["time_s"]["roofline"] == pytest.approx(hop_us * 1e-6 + 2 * 7 / 8 * MIB64 / bw, rel=1e-9)
    assert d["time_s"]["roofline"] <= d["time_s"]["calibrated"]


def test_h100_nvl_pair_runs_on_its_bridge_and_wider_groups_on_pcie():
    # A 2-rank group of consecutive GPUs sits on a bridged pair (GPUs 0-1): NVLink bridge 600 GB/s
    # bidirectional = 300e9 per direction, ring traffic 2*1/2 = 1: 67,108,864 / 300e9 = 223.696 us + 0.6 us.
    d = _op("--gpu", "h100-nvl", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "2")
    assert d["cluster"] == "h100-nvl-8gpu"
    assert d["time_s"]["roofline"] == pytest.approx(0.6e-6 + MIB64 / 300e9, rel=1e-9)
    # 4 ranks span two pairs: the ring's slowest hop is PCIe Gen5 x16, 64e9: 1.5 x 67,108,864 / 64e9 + 1 us
    d4 = _op("--gpu", "h100-nvl", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "4")
    assert d4["time_s"]["roofline"] == pytest.approx(1e-6 + 1.5 * MIB64 / 64e9, rel=1e-9)
    node = load_cluster("h100-nvl-8gpu")
    # two ranks two GPUs apart (GPUs 0 and 2: a DP pair across TP pairs) are on different bridges: PCIe
    assert node.for_group(2).intra.generation == "nvlink4-bridge"
    assert node.for_group(2, stride=2).intra.generation == "pcie5"
    # across nodes the network bounds the group: the node as it is
    assert node.for_group(2, nodes=2) is node


def test_xgmi_group_reaches_its_links_only():
    # Full mesh: a group of n MI300X GPUs reaches each other over n - 1 links of 64 GB/s per direction
    # (128 GB/s bidirectional each, 896 / 7). 2 ranks all-reduce 64 MiB: traffic 1, 67,108,864 / 64e9 =
    # 1,048.576 us + 0.6 us; 4 ranks: 3 links = 192e9, traffic 1.5: 524.288 us + 0.6 us.
    d2 = _op("--gpu", "mi300x", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "2")
    assert d2["time_s"]["roofline"] == pytest.approx(0.6e-6 + MIB64 / 64e9, rel=1e-9)
    d4 = _op("--gpu", "mi300x", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "4")
    assert d4["time_s"]["roofline"] == pytest.approx(0.6e-6 + 1.5 * MIB64 / 192e9, rel=1e-9)
    mi = load_cluster("mi300x-8gpu")
    assert mi.for_group(8) is mi  # 7 links: the whole 448


def test_tp_pair_in_an_estimate_uses_the_mesh_links():
    # lmcost estimate's communication ops see the same fabric: TP=2 on MI300X moves its all-reduces over one
    # xGMI link (64e9 per direction), TP=8 over seven; the prefill's communication time is then
    # wire bytes / bandwidth + 0.6 us per all-reduce (2 per layer x 32 layers + the logits: the op count
    # cancels in the difference below, so only the bandwidth term is checked).
    def comm(tp):
        r = runner.invoke(app, ["estimate", "llama-2-7b", "--gpu", "mi300x", "--tp", str(tp), "--batch", "1",
                                "--prompt", "512", "--gen", "16", "--model", "roofline", "--json"])
        assert r.exit_code == 0, r.output
        d = json.loads(r.output)
        assert d["settings"]["layout"]["cluster"] == "mi300x-8gpu"
        return next(c for c in d["op_classes"] if c["phase"] == "prefill" and c["op_class"] == "communication")

    c2, c8 = comm(2), comm(8)
    # the latency term is the same count of hops (one per all-reduce, same ops) in both
    assert c2["time_s"] - c2["wire_bytes"] / 64e9 == pytest.approx(c8["time_s"] - c8["wire_bytes"] / 448e9, rel=1e-9)


def test_gb200_nvl72_is_one_nvlink_domain():
    # 72 GPUs (18 trays x 4) in one NVLink5 domain: a 72-rank all-reduce stays on NVLink (intra), at 900e9 per
    # direction: 2*71/72 x 67,108,864 / 900e9 = 147.060 us + 0.6 us. 73 ranks need a second rack (the network).
    c = load_cluster("gb200-nvl72")
    assert c.gpus_per_node == 72 and c.intra.generation == "nvlink5"
    d = _op("--gpu", "gb200", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "72")
    assert (d["level"], d["nodes"]) == ("intra", 1)
    assert d["time_s"]["roofline"] == pytest.approx(0.6e-6 + 2 * 71 / 72 * MIB64 / 900e9, rel=1e-9)
    assert collective("all_reduce", 73, c).level == "inter"


def test_existing_nodes_see_their_own_fabric():
    # No shipped node but the new ones has an island or a mesh: every group inside one of them sees the
    # node's fabric unchanged, so no number of theirs moves.
    for c in list_clusters():
        if c.name in NEW:
            continue
        assert c.island is None and c.intra.mesh_link_gb_s is None, c.name
        assert all(c.for_group(n) is c for n in range(1, c.gpus_per_node + 1))
    assert set(NEW) - {"h100-nvl-pair"} <= set(DEFAULT_NODE.values())


def _node_yaml(tmp_path, name: str, dotted: str, value) -> Path:
    """The shipped ``name``'s YAML with the field at ``dotted`` (``island.gpus``) set to ``value``, written
    to tmp_path."""
    d = yaml.safe_load((Path(__file__).parents[1] / "lmcost" / "data" / "clusters" / f"{name}.yaml").read_text())
    *heads, last = dotted.split(".")
    where = d
    for h in heads:
        where = where[h]
    where[last] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(d))
    return tmp_path / "c.yaml"


@pytest.mark.parametrize("name,dotted,value,field", [
    ("mi300x-8gpu", "library", 3, "library"),
    ("mi300x-8gpu", "library", "mpi", "library"),
    ("mi300x-8gpu", "intra.mesh_link_gb_s", "fast", "intra.mesh_link_gb_s"),
    ("h100-nvl-8gpu", "island.gpus", "two", "island.gpus"),
    ("h100-nvl-8gpu", "island.gpus", 3, "island.gpus"),  # 8 GPUs are not whole islands of 3
    ("h100-nvl-8gpu", "island.cluster", "h100-pcie-pair", "island.cluster"),  # another GPU
    ("h100-nvl-8gpu", "island.cluster", "nope", "island.cluster"),
    ("h100-nvl-8gpu", "island.cluster", "h100-nvl-8gpu", "island.cluster"),  # itself: an island of its own
])
def test_bad_new_fields_are_one_line(tmp_path, name, dotted, value, field):
    p = _node_yaml(tmp_path, name, dotted, value)
    with pytest.raises(LmcostError) as e:
        load_cluster(p)
    assert field in str(e.value)
    r = runner.invoke(app, ["op", "collective", "--kind", "all_reduce", "--bytes", "1M", "--gpus", "8", "--cluster", str(p)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], r.output
