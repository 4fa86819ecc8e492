"""Collectives and clusters: bus factors, the time model's relations, the fit held out, the CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from lmcost.cli import app
from lmcost.hardware.cluster import Cluster, default_cluster, list_clusters, load_cluster
from lmcost.calibration.collective_fit import fit_rows, load_rows, predict, run, shipped_digest, shipped_rows
from lmcost.cost.collectives import KINDS, bus_factor, collective
from lmcost.basics.errors import LmcostError

runner = CliRunner()


def test_bus_factors_from_nccl_tests_performance_md():
    # doc/PERFORMANCE.md: all_reduce 2(n-1)/n -> 2*7/8 = 1.75 on 8 ranks; 2*15/16 = 1.875 on 16
    assert bus_factor("all_reduce", 8) == 1.75
    assert bus_factor("all_reduce", 16) == 1.875
    # all_gather, reduce_scatter, alltoall (n-1)/n -> 3/4 on 4 ranks
    for k in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(k, 4) == 0.75
    # send_recv, broadcast: 1
    assert bus_factor("send_recv", 8) == bus_factor("broadcast", 8) == 1.0


@pytest.mark.parametrize("kind", KINDS)
def test_one_rank_takes_no_time(kind):
    t = collective(kind, 1, load_cluster("dgx-h100")).times(np.array([0.0, 1024, 2**30]))
    for v in t.values():
        assert np.all(v == 0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cluster,n", [("dgx-a100", 8), ("dgx-h100", 4), ("dgx-h100", 16), ("aws-p5en", 32), ("dgx-b200", 2),
                                       ("h100-pcie-pair", 2)])
def test_monotone_and_never_below_the_roofline(kind, cluster, n):
    size = 2.0 ** np.arange(3, 35)
    c = collective(kind, n, load_cluster(cluster))
    t = c.times(size)
    assert np.all(np.diff(t["calibrated_s"]) >= 0) and np.all(np.diff(t["roofline_s"]) >= 0)
    assert np.all(t["calibrated_s"] >= t["roofline_s"])
    assert np.all(t["calibrated_low_s"] <= t["calibrated_s"]) and np.all(t["calibrated_s"] <= t["calibrated_high_s"])
    assert c.level == ("intra" if n <= load_cluster(cluster).gpus_per_node else "inter")
    b = c.bound(size)
    assert b[0] == "latency" and b[-1] == "bandwidth"
    assert isinstance(c.times(1024.0)["calibrated_s"], float) and c.bound(1024) in ("latency", "bandwidth")


def test_placement_spans_nodes():
    c = load_cluster("dgx-h100")
    # consecutive placement: 8 ranks stay in one node; 9 span ceil(9/8) = 2
    assert c.nodes_for(8) == 1 and c.level(8) == "intra"
    assert c.nodes_for(9) == 2 and c.level(9) == "inter"
    assert collective("all_reduce", 16, c).nodes == 2


def test_default_nodes_and_a_gpu_without_one():
    assert default_cluster("h100").name == "dgx-h100"
    assert default_cluster("a100").name == "dgx-a100"
    with pytest.raises(LmcostError, match="no shipped node"):
        default_cluster("l4")


@pytest.mark.parametrize("args,match", [(("gather", 8), "^kind: "), (("all_reduce", 0), "^n_ranks: "),
                                        (("all_reduce", 16, 1), "^nodes: ")])
def test_bad_collectives(args, match):
    with pytest.raises(LmcostError, match=match):
        collective(*args[:2], load_cluster("dgx-h100"), *args[2:])


def test_every_shipped_cluster_loads_and_carries_the_current_fit():
    digest = shipped_digest()
    for c in list_clusters():
        assert c.collectives.fit["sha256"] == digest, c.name
        assert c.sources


@pytest.fixture(scope="module")
def report():
    rows, skipped = shipped_rows()
    return run(rows, skipped)


@pytest.mark.slow  # the leave-one-source-out fit over both shipped tables: about 2 minutes
def test_shipped_errors_are_the_recomputed_ones(report):
    errs = {(e["device"], e["regime"]): round(100 * e["median_abs_error"], 1) for e in report.errors()}
    for c in list_clusters():
        shipped = c.collectives.fit["loso_median_abs_error_pct"]
        if isinstance(shipped, dict):
            dev = c.collectives.fit["device"]
            assert shipped == {r: errs[(dev, r)] for r in shipped}, c.name


@pytest.mark.slow
def test_held_out_error_is_recomputed_per_source(report):
    rows = report.rows
    clusters = {c.name: c for c in list_clusters()}
    sources = sorted({r.source for r in rows})
    for s in sources[::3]:  # a third of the sources, refitted without each here
        mine = [r for r in rows if r.source == s]
        fit = fit_rows([r for r in rows if r.source != s], clusters)
        got = np.median([abs(t / r.time_s - 1) for r, (t, _) in zip(mine, predict(mine, fit, clusters))])
        said = next(x["median_abs_error"] for x in report.by_source() if x["source"] == s)
        assert got == pytest.approx(said, rel=1e-9)


def _ok(args):
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    return r.output


def test_cli_json_fields():
    d = json.loads(_ok(["op", "collective", "--kind", "all_reduce", "--bytes", "64M", "--gpus", "8", "--gpu", "h100", "--json"]))
    assert d["bytes"] == 64 * 2**20 and d["cluster"] == "dgx-h100" and d["level"] == "intra"
    t = d["time_s"]
    assert t["roofline"] <= t["calibrated"] and t["calibrated_low"] <= t["calibrated"] <= t["calibrated_high"]
    assert d["algbw_b_s"] == pytest.approx(d["bytes"] / t["calibrated"])
    assert d["busbw_b_s"] == pytest.approx(d["algbw_b_s"] * 1.75)
    assert d["bound"] in ("latency", "bandwidth")
    d = json.loads(_ok(["op", "collective", "--kind", "send_recv", "--bytes", "2K", "--gpus", "16", "--cluster", "dgx-a100", "--json"]))
    assert d["level"] == "inter" and d["nodes"] == 2 and d["bound"] == "latency"
    assert "dgx-b200" in _ok(["clusters", "list"]) and "NVLink4" in _ok(["clusters", "show", "hgx-h200"])


@pytest.mark.parametrize("args,field", [
    (["--kind", "gather", "--bytes", "1M", "--gpus", "8"], "--kind"),
    (["--kind", "all_reduce", "--bytes", "1X", "--gpus", "8"], "--bytes"),
    (["--kind", "all_reduce", "--bytes", "-5", "--gpus", "8"], "--bytes"),
    (["--kind", "all_reduce", "--bytes", "1M", "--gpus", "0"], "--gpus"),
    (["--kind", "all_reduce", "--bytes", "1M", "--gpus", "8", "--cluster", "nope"], "--cluster"),
    (["--kind", "all_reduce", "--bytes", "1M", "--gpus", "8", "--gpu", "l4"], "--gpu"),
    (["--kind", "all_reduce", "--bytes", "1M", "--gpus", "8", "--cluster", "dgx-a100", "--gpu", "h100"], "--gpu"),
    (["--kind", "all_reduce", "--bytes", "1M", "--gpus", "4", "--cluster", "h100-pcie-pair"], "--cluster"),
])
def test_cli_bad_input_is_one_line(args, field):
    r = runner.invoke(app, ["op", "collective", *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}"), r.output
    assert "Traceback" not in r.output


def _cluster_yaml(tmp_path, **change):
    d = yaml.safe_load((Path(__file__).parents[1] / "lmcost" / "data" / "clusters" / "dgx-h100.yaml").read_text())
    for k, v in change.items():
        head, _, tail = k.partition("__")
        if tail:
            d[head][tail] = v
        else:
            d[head] = v
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


@pytest.mark.parametrize("change,field", [
    (dict(intra__bandwidth_gb_s=0.0), "intra.bandwidth_gb_s"),
    (dict(inter__nics_per_node=0), "inter.nics_per_node"),
    (dict(intra__speed=3), "intra.speed"),
    (dict(gpus_per_node=None), "gpus_per_node"),
    (dict(gpu="tpu-v9"), "gpu"),
])
def test_cluster_yaml_validation(tmp_path, change, field):
    p = _cluster_yaml(tmp_path, **change)
    with pytest.raises(LmcostError) as e:
        load_cluster(p)
    assert field in str(e.value)
    r = runner.invoke(app, ["op", "collective", "--kind", "all_reduce", "--bytes", "1M", "--gpus", "8", "--cluster", str(p)])
    assert r.exit_code == 2 and len([ln for ln in r.output.splitlines() if ln.strip()]) == 1


def test_cluster_band_must_hold_one(tmp_path):
    d = Cluster.model_validate(yaml.safe_load((Path(__file__).parents[1] / "lmcost" / "data" / "clusters" / "dgx-h100.yaml").read_text()))
    bad = d.model_dump()
    bad["collectives"]["band"]["latency"] = [1.2, 2.0]
    with pytest.raises(Exception):
        Cluster.model_validate(bad)


def test_a_group_with_one_gpu_per_node_gets_one_nic():
    # DGX H100: 8 x 400 Gb/s NICs per node, one per GPU (50 GB/s each). A 2-rank all-reduce across 2 nodes (a
    # data-parallel group of one GPU per node, the other GPUs running their own groups) moves its 1 GB over one
    # GPU's NIC: at least 1e9 x 2(2-1)/2 / 50e9 = 20 ms at line rate; 16 ranks on the same 2 nodes use all 8 NICs.
    from lmcost.hardware.cluster import load_cluster

    dgx = load_cluster("dgx-h100")
    pair = collective("all_reduce", 2, dgx, nodes=2).times(1e9)["roofline_s"]
    assert pair >= 1e9 / 50e9
    full = collective("all_reduce", 16, dgx, nodes=2).times(1e9)["roofline_s"]
    assert full < pair / 4
