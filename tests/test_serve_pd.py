"""Prefill/decode disaggregation (issue 28, :mod:`lmcost.apps.serve_pd`): the KV moved per request, byte for
byte; the metamorphic relations (1P1D with free transfer is the two hand-run simulations, number for number;
a transfer charged to an idle decode pool makes TTFT later by exactly its time and changes nothing else; one
request alone is aggregated serving: no interference to remove); the prefilled arrivals of ``simulate``;
the closed loop's fixed point; the refusals. Oracles: the hand-run simulations (:func:`simulate` as
aggregated serving uses it), and the arithmetic in the comments. Every run here is tens of requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmcost.apps.serve import ServeRequest, prepare, request_delay, run_serve
from lmcost.apps.serve_pd import Pools, closed_loop, kv_transfer, pools, run_pd, simulate_pd
from lmcost.apps.serve_sim import simulate
from lmcost.basics.errors import LmcostError
from lmcost.cli import app

#: Llama-3-8B's KV per token in bf16: 2 (K, V) x 32 layers x 8 KV heads x 128 (head dim) x 2 bytes = 131,072 B
LLAMA_KV = 2 * 32 * 8 * 128 * 2
BASE = dict(model="llama-3-8b", gpu="h100", pd=True)


def sim(setup, arrival, prompt, output, prefilled=None):
    return simulate(setup.step, setup.knobs, np.asarray(arrival, float), np.asarray(prompt), np.asarray(output),
                    kv_capacity_bytes=setup.kv_capacity_bytes, kv_per_token_bytes=setup.kv_per_token_bytes,
                    kv_per_seq_bytes=setup.kv_per_seq_bytes, prefilled=prefilled)


# --- the bytes ---------------------------------------------------------------------------------------


def test_kv_bytes_per_request_exact():
    # a prompt of 1,000 tokens moves 1,000 x 131,072 = 131,072,000 B (the whole model, all 32 layers); on TP1
    # pools each GPU's piece is that whole; prefill TP2 -> decode TP4: the total is the same, the pieces
    # 65,536,000 B (prefill: 4 of the 8 KV heads) and 32,768,000 B (decode: 2): the larger is the prefill's
    assert LLAMA_KV == 131_072
    p = pools(ServeRequest(**BASE, kv_link="nvlink", decode_workers=1))
    total, piece, t = kv_transfer(p, np.array([1000, 1]))
    assert total.tolist() == [131_072_000.0, 131_072.0]
    assert piece.tolist() == [131_072_000.0, 131_072.0]
    assert (t > 0).all()
    q = pools(ServeRequest(**BASE, tp=4, prefill_tp=2, kv_link="nvlink"))
    total2, piece2, t2 = kv_transfer(q, np.array([1000]))
    assert total2.tolist() == [131_072_000.0]
    assert piece2.tolist() == [65_536_000.0]
    assert t2[0] < t[0]  # half the bytes per GPU, over the same link, in parallel


def test_transfer_is_the_p2p_model_over_the_chosen_link():
    # auto on an H100 node of 8 GPUs: 1P1D (2 GPUs) stays on NVLink; 4P4D of TP2 (16 GPUs) spans two nodes:
    # RDMA, whose per-GPU share of the NICs (400 Gb/s = 50 GB/s) is well below NVLink's 450 GB/s
    from lmcost.cost.collectives import collective
    from lmcost.hardware.cluster import load_cluster

    near = pools(ServeRequest(**BASE))
    far = pools(ServeRequest(**BASE, tp=2, prefill_workers=4, decode_workers=4))
    assert (near.link, far.link) == ("nvlink", "rdma")
    node = load_cluster("dgx-h100")
    b = 131_072_000.0
    assert kv_transfer(near, np.array([1000]))[2][0] == collective("send_recv", 2, node, 1).times(b)["calibrated_s"]
    half = kv_transfer(far, np.array([1000]))[2][0]
    assert half == collective("send_recv", 2, node, 2).times(b / 2)["calibrated_s"]
    assert half > b / 2 / 50e9  # no faster than the NIC's line rate


# --- the prefilled arrivals --------------------------------------------------------------------------


def test_prefilled_request_decodes_from_admission():
    # one request arriving prefilled at 1 s into an idle decode worker: admitted and its first token at 1 s,
    # then output - 1 = 9 decode steps, each the aggregated run's decode step at the same context
    setup = prepare(ServeRequest(model="llama-3-8b", gpu="h100"))
    tr = sim(setup, [1.0], [500], [10], prefilled=np.array([True]))
    assert tr.admitted_s[0] == tr.first_token_s[0] == 1.0
    agg = sim(setup, [0.0], [500], [10])
    assert tr.finish_s[0] - tr.first_token_s[0] == pytest.approx(agg.finish_s[0] - agg.first_token_s[0], rel=1e-12)
    assert tr.steps == 9  # no prefill step
    one = sim(setup, [0.0, 0.0], [500, 500], [1, 1], prefilled=np.array([True, True]))
    assert one.finish_s.tolist() == [0.0, 0.0] and one.steps == 0  # nothing left to generate


# --- metamorphic -------------------------------------------------------------------------------------


def test_1p1d_free_is_the_two_hand_run_simulations():
    # 1P1D on identical layouts (TP1 each), free transfer: the prefill pool is a run of the same requests
    # with output 1, the decode pool a run of them arriving prefilled at the prefill's first tokens
    r = ServeRequest(**BASE, requests=60, rate=20.0, prompt="uniform:100:2000", output="uniform:10:200",
                     kv_link="none", slo_ttft_s=0.1)
    res = run_pd(r)
    setup = prepare(ServeRequest(model="llama-3-8b", gpu="h100"))
    from lmcost.apps.serve_workload import make_requests

    w = make_requests(n=60, rate=20.0, prompt="uniform:100:2000", output="uniform:10:200", seed=0, arrival="poisson")
    pre = sim(setup, w.arrival_s, w.prompt, np.ones_like(w.output))
    order = np.argsort(pre.first_token_s, kind="stable")
    dec = sim(setup, pre.first_token_s[order], w.prompt[order], w.output[order], prefilled=np.ones(60, bool))
    first, finish = np.empty(60), np.empty(60)
    first[order], finish[order] = dec.first_token_s, dec.finish_s
    ttft = first - w.arrival_s + request_delay(setup, w.prompt)
    s = res.summary
    assert s["ttft_s"]["mean"] == pytest.approx(ttft.mean(), rel=1e-12)
    assert s["ttft_s"]["p99"] == pytest.approx(np.percentile(ttft, 99), rel=1e-12)
    multi = w.output > 1
    tpot = (finish - first)[multi] / (w.output[multi] - 1)
    assert s["tpot_s"]["mean"] == pytest.approx(tpot.mean(), rel=1e-12)
    assert s["pd"]["prefill"]["steps"] == pre.steps and s["pd"]["decode"]["steps"] == dec.steps
    span = finish.max() - w.arrival_s.min()
    assert s["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(w.output.sum() / span / 2, rel=1e-12)
    assert s["pd"]["decode"]["busy_fraction"] == pytest.approx(dec.busy_s / span, rel=1e-12)
    assert s["pd"]["kv_transfer"]["bytes_per_request"] == pytest.approx(LLAMA_KV * w.prompt.mean(), rel=1e-12)
    assert s["pd"]["kv_transfer"]["time_s"]["max"] == 0.0


def test_transfer_charged_on_an_idle_pool_shifts_ttft_by_it():
    # requests 10 s apart (each done in well under 10 s): the decode pool is idle when each arrives, so a
    # charged transfer makes each TTFT later by exactly its time, and TPOT does not move
    p = pools(ServeRequest(**BASE, kv_link="rdma"))
    free = Pools(prefill=p.prefill, decode=p.decode, prefill_workers=1, decode_workers=1, link="none")
    arrival, prompt, output = np.arange(6) * 10.0, np.array([300, 4000, 1000, 50, 2000, 700]), np.full(6, 40)
    t = kv_transfer(p, prompt)[2]
    assert (t > 1e-4).all()
    _, a = simulate_pd(free, arrival, prompt, output)
    _, b = simulate_pd(p, arrival, prompt, output)
    assert (b.first_token_s - a.first_token_s) == pytest.approx(t, rel=1e-9)
    assert (b.finish_s - b.first_token_s) == pytest.approx(a.finish_s - a.first_token_s, rel=1e-12)


def test_one_request_is_aggregated_serving():
    # alone, nothing interferes: 1P1D with free transfer serves a lone request as an aggregated engine does
    # (its prefill step, then its decode steps at the same contexts)
    kw = dict(model="llama-3-8b", gpu="h100", requests=1, prompt="1500", output="64")
    agg = run_serve(ServeRequest(**kw)).summary
    pd = run_pd(ServeRequest(**kw, pd=True, kv_link="none")).summary
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert pd[key]["mean"] == pytest.approx(agg[key]["mean"], rel=1e-9)
    assert pd["throughput"]["output_tokens_per_s_per_gpu"] == pytest.approx(
        agg["throughput"]["output_tokens_per_s_per_gpu"] / 2, rel=1e-9)  # the same rate over twice the GPUs


def test_more_decode_workers_split_the_decode_batch():
    # offline, 64 requests: 1P2D gives each decode worker 32 of them where 1P1D gives one all 64: TPOT falls
    kw = dict(**BASE, requests=64, prompt="512", output="64", kv_link="none")
    one = run_pd(ServeRequest(**kw)).summary
    two = run_pd(ServeRequest(**kw, decode_workers=2)).summary
    assert two["tpot_s"]["mean"] < one["tpot_s"]["mean"]
    assert two["pd"]["decode"]["gpus"] == 2 and two["pd"]["ratio"] == "1P2D"


def test_closed_loop_is_a_fixed_point():
    # 4 users, 16 requests: request 4 + k arrives at the k-th finish (the loop's definition), at the fixed point
    p = pools(ServeRequest(**BASE, kv_link="nvlink"))
    run, tr = closed_loop(p, np.full(16, 800), np.full(16, 30), 4)
    assert (tr.arrival_s[:4] == 0).all()
    assert tr.arrival_s[4:] == pytest.approx(np.sort(tr.finish_s)[:12], rel=1e-15)
    assert run.passes <= 16 // 4 + 3


# --- refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, field", [
    (dict(prefill_workers=2), "prefill_workers"),  # without pd
    (dict(kv_link="rdma"), "kv_link"),
    (dict(pd=True, kv_link="pcie"), "kv_link"),
    (dict(pd=True, decode_workers=0), "decode_workers"),
    (dict(pd=True, prefill_tp=2.5), "prefill_tp"),
    (dict(pd=True, tp=2, nodes=1), "nodes"),
    (dict(pd=True, tp=4, prefill_workers=2, decode_workers=2, kv_link="nvlink"), "kv_link"),  # 16 GPUs > 8
])
def test_refused(kw, field):
    with pytest.raises(LmcostError) as e:
        (run_pd if kw.get("pd") else run_serve)(ServeRequest(model="llama-3-8b", requests=8, **kw))
    assert e.value.field == field


def test_each_entry_refuses_the_other():
    with pytest.raises(LmcostError) as e:
        run_serve(ServeRequest(model="llama-3-8b", requests=8, pd=True))
    assert e.value.field == "pd"
    with pytest.raises(LmcostError) as e:
        run_pd(ServeRequest(model="llama-3-8b", requests=8))
    assert e.value.field == "pd"


def test_cli_json_and_error():
    runner = CliRunner()
    r = runner.invoke(app, ["serve", "llama-3-8b", "--requests", "20", "--rate", "5", "--pd", "--decode-workers", "2",
                            "--prefill-max-num-batched-tokens", "4096", "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["pd"]["ratio"] == "1P2D" and d["pd"]["prefill"]["max_num_batched_tokens"] == 4096
    assert d["pd"]["kv_transfer"]["link"] == "nvlink"
    bad = runner.invoke(app, ["serve", "llama-3-8b", "--kv-link", "nvlink"])
    assert bad.exit_code == 2
    assert bad.stderr.strip().splitlines() == [
        "error: --kv-link: has no effect without --pd (prefill/decode disaggregation); add --pd, or drop it"]
    text = runner.invoke(app, ["serve", "llama-3-8b", "--requests", "20", "--pd"])
    assert text.exit_code == 0 and "P/D 1P1D: prefill pool 1 x one GPU (1 GPU)" in text.stdout


def test_disagg_rows_as_the_source_gives_them():
    # benchmarks/convert_silicon_disagg.py's output against the source row's figures (silicon_sample.csv,
    # id ..._deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c8_tp8_0_ep8_0_678: silicon_ttft_ms
    # 1030.884944632999, silicon_tpot_ms 5.635777552315075, silicon_concurrency=8, prefill/decode tp 8, ep 8)
    import csv
    import io

    from lmcost.basics import shipped

    text = (shipped.folder("measurements") / "serving-silicon-disagg.csv").read_text()
    assert "aiconfigurator-core 0.12.0" in text and "Apache-2.0" in text
    rows = list(csv.DictReader(io.StringIO("".join(ln for ln in text.splitlines(True) if not ln.startswith("#")))))
    assert len(rows) == 642
    r = next(r for r in rows if r["id"] == "2026_03_25_deepseek_r1_b200_sxm_sglang_fp8_disagg_8192x1024_c8_tp8_0_ep8_0_678")
    assert (float(r["ttft_s"]), float(r["tpot_s"])) == (1030.884944632999 / 1e3, 5.635777552315075 / 1e3)
    assert (r["model"], r["gpu"], r["concurrency"], r["prefill_tp"], r["decode_ep"]) == ("deepseek-v3", "b200", "8", "8", "8")
