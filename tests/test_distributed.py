"""The distributed oracle (issue 15): the reference decoder sharded over gloo processes on the CPU.

Each case runs a prefill of S tokens and GEN decode steps of B sequences, sharded under a layout, and
checks (1) its logits against the unsharded decoder's (same seed, fp32), (2) every collective each rank
issued against counts and payloads derived by hand from the scheme (the tables below, arithmetic in the
comments), and (3) the same records against :func:`lmcost.operators.parallel.expected_collectives`, the analytic
model's. The all_to_all combine of EP over DP depends on the routing per rank: it is compared by its
total over the group.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import Counter
from functools import lru_cache

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.distributed]
pytest.importorskip("torch")

from lmcost.model.config import truncate  # noqa: E402
from lmcost.basics.dtypes import Precision  # noqa: E402
from lmcost.basics.errors import LmcostError  # noqa: E402
from lmcost.model.loading import load_config  # noqa: E402
from lmcost.profiling.distributed import _run, run_sharded, summarize  # noqa: E402

B, S, GEN = 2, 5, 2      # prefill n = B*S = 10 tokens per replica; a decode step n = B = 2
F32 = 4

#: case -> (model, layers kept (None: all), layout)
CASES = {
    "tp2-gqa": ("tiny-gqa", None, dict(tp=2)),
    "tp4-gqa-kv-replicated": ("tiny-gqa", None, dict(tp=4)),  # h_kv = 2 < tp = 4: each KV head on 2 ranks
    "tp2-mla": ("tiny-mla", None, dict(tp=2)),
    "tp2-ep2-moe": ("tiny-moe", None, dict(tp=2, ep=2)),
    "dp2-ep2-moe": ("tiny-moe", None, dict(dp=2, ep=2)),
    "pp2-gqa": ("tiny-gqa", None, dict(pp=2)),
    "tp2-pp2-gqa": ("tiny-gqa", 3, dict(tp=2, pp=2)),        # 3 layers: stage 0 holds 2, stage 1 holds 1
}


def _tp_table(tp, d, V, L, n, ranks=None):
    """Megatron TP, every rank: 1 embedding all_reduce + 2 per layer (attention, FFN or MoE) of n*d*4,
    and 1 all_gather of the logits, n*V*4."""
    return {r: {("all_reduce", "tp", tp, n * d * F32): 1 + 2 * L, ("all_gather", "tp", tp, n * V * F32): 1}
            for r in (ranks or range(tp))}


#: case -> phase -> rank -> {(kind, group, group_size, payload_bytes): calls} for one pass (each decode
#: step alike), all_to_all combines left out (see COMBINE_TOTAL).
HAND = {
    # tiny-gqa d=512, V=8000, L=4. all_reduce: 10*512*4 = 20480 B (decode 2*512*4 = 4096 B), 1 + 2*4 = 9
    # calls; all_gather 10*8000*4 = 320000 B (decode 2*8000*4 = 64000 B), 1 call.
    "tp2-gqa": {"prefill": _tp_table(2, 512, 8000, 4, 10), "decode": _tp_table(2, 512, 8000, 4, 2)},
    # the same per rank on 4 ranks: the replicated KV heads add no collective
    "tp4-gqa-kv-replicated": {"prefill": _tp_table(4, 512, 8000, 4, 10), "decode": _tp_table(4, 512, 8000, 4, 2)},
    # tiny-mla d=512, V=8000, L=4: as tiny-gqa (the latent is replicated, no collective of its own)
    "tp2-mla": {"prefill": _tp_table(2, 512, 8000, 4, 10), "decode": _tp_table(2, 512, 8000, 4, 2)},
    # tiny-moe d=384, V=8000, L=4 MoE layers: one all_reduce per MoE layer as under TP alone:
    # 10*384*4 = 15360 B (decode 2*384*4 = 3072 B), 9 calls
    "tp2-ep2-moe": {"prefill": _tp_table(2, 384, 8000, 4, 10), "decode": _tp_table(2, 384, 8000, 4, 2)},
    # tiny-moe E=8, k=2, d=384, 4 MoE layers, each rank 1 sequence (n_r = 5 prefill, 1 decode); per
    # layer: counts [ep, E/ep] int64 = 8*8 = 64 B, dispatch n_r*k*d*4 = 5*2*384*4 = 15360 B (decode
    # 1*2*384*4 = 3072 B)
    "dp2-ep2-moe": {
        "prefill": {r: {("all_to_all", "ep", 2, 64): 4, ("all_to_all", "ep", 2, 15360): 4} for r in (0, 1)},
        "decode": {r: {("all_to_all", "ep", 2, 64): 4, ("all_to_all", "ep", 2, 3072): 4} for r in (0, 1)}},
    # stage 0 (rank 0) sends [n, d]: 10*512*4 = 20480 B (decode 4096 B) once; stage 1 issues nothing
    "pp2-gqa": {"prefill": {0: {("send_recv", "pp", 2, 20480): 1}, 1: {}},
                "decode": {0: {("send_recv", "pp", 2, 4096): 1}, 1: {}}},
    # stage 0 = ranks 0, 1 (layers 0, 1): all_reduce x (1 embed + 2*2) = 5 and one send of [n, d] each;
    # stage 1 = ranks 2, 3 (layer 2): all_reduce x 2 and the logits all_gather
    "tp2-pp2-gqa": {
        "prefill": {**{r: {("all_reduce", "tp", 2, 20480): 5, ("send_recv", "pp", 2, 20480): 1} for r in (0, 1)},
                    **{r: {("all_reduce", "tp", 2, 20480): 2, ("all_gather", "tp", 2, 320000): 1} for r in (2, 3)}},
        "decode": {**{r: {("all_reduce", "tp", 2, 4096): 5, ("send_recv", "pp", 2, 4096): 1} for r in (0, 1)},
                   **{r: {("all_reduce", "tp", 2, 4096): 2, ("all_gather", "tp", 2, 64000): 1} for r in (2, 3)}}},
}

#: EP over DP: the combine sends every received row back, so summed over the group it moves what the
#: dispatch moved: 4 layers x 2 ranks x n_r*k*d*4 = 8 x 15360 B (prefill), 8 x 3072 B (a decode step).
COMBINE_TOTAL = {"dp2-ep2-moe": {"prefill": 8 * 15360, "decode": 8 * 3072}}


def _config(case):
    name, layers, _ = CASES[case]
    cfg = load_config(name)
    return truncate(cfg, layers) if layers else cfg


@lru_cache(maxsize=None)
def _result(case):
    return run_sharded(_config(case), CASES[case][2], batch=B, prompt=S, gen=GEN, timeout_s=30)


def _passes(records):
    """(phase, step) -> records of that pass."""
    out = {}
    for rec in records:
        out.setdefault((rec["phase"], rec.get("step", 0)), []).append(rec)
    return out


def _split_combine(records, blocked=False):
    """(the records less the all_to_all combines, total payload of the combines). A real run issues,
    per rank and MoE layer, counts, dispatch, combine: every third all_to_all is a combine.
    ``blocked``: the analytic model's order, each operator expanded over the layers of its group
    (counts x L, dispatch x L, combine x L; one MoE layer group here): the last third are combines."""
    a2a = Counter(rec["rank"] for rec in records if rec["kind"] == "all_to_all")
    seen, rest, combine = Counter(), [], 0
    for rec in records:
        if rec["kind"] == "all_to_all":
            seen[rec["rank"]] += 1
            i = seen[rec["rank"]]
            if (i > 2 * a2a[rec["rank"]] // 3) if blocked else (i % 3 == 0):
                combine += rec["payload_bytes"]
                continue
        rest.append(rec)
    return rest, combine


def _per_rank(records):
    table = {}
    for rec in records:
        key = (rec["kind"], rec["group"], rec["group_size"], rec["payload_bytes"])
        table.setdefault(rec["rank"], Counter())[key] += 1
    return table


@pytest.mark.parametrize("case", CASES)
def test_logits_match_the_unsharded_decoder(case):
    res = _result(case)
    assert res["world"] == len(HAND[case]["prefill"])
    assert res["max_abs_diff"] < 1e-4, res["max_abs_diff"]
    assert res["logits_ok"]


@pytest.mark.parametrize("case", CASES)
def test_collectives_match_the_scheme_by_hand(case):
    passes = _passes(_result(case)["collectives"])
    assert sorted(passes) == [("decode", i) for i in range(1, GEN + 1)] + [("prefill", 0)]
    for phase in ("prefill", "decode"):
        for step in ([0] if phase == "prefill" else range(1, GEN + 1)):
            rest, combine = _split_combine(passes.get((phase, step), []))
            want = {r: Counter(t) for r, t in HAND[case][phase].items() if t}
            assert _per_rank(rest) == want, (phase, step)
            assert combine == COMBINE_TOTAL.get(case, {}).get(phase, 0), (phase, step)


@pytest.mark.parametrize("case", CASES)
def test_collectives_match_the_analytic_model(case):
    # EP over DP: the run's counts all_to_all is [ep, E/ep] int64 = E*8 bytes (a receiver must know
    # which of its E/ep experts each row is for), which the analytic model must state the same way.
    from lmcost.operators.parallel import Layout, expected_collectives

    cfg, layout = _config(case), Layout(**CASES[case][2])
    passes = _passes(_result(case)["collectives"])
    precision = Precision("fp32", "fp32", "fp32")
    for phase, step, tokens in [("prefill", 0, S)] + [("decode", i, S + i) for i in range(1, GEN + 1)]:
        expected = expected_collectives(cfg, layout, phase=phase, batch=B, tokens=tokens, precision=precision)
        got_rest, got_combine = _split_combine(passes.get((phase, step), []))
        want_rest, want_combine = _split_combine(expected, blocked=True)
        assert _per_rank(got_rest) == _per_rank(want_rest), (phase, step)
        assert got_combine == want_combine, (phase, step)


def test_summarize_totals_the_records():
    records = _result("tp2-pp2-gqa")["collectives"]
    rows = {(r["phase"], r["kind"], r["group"]): r for r in summarize(records)}
    # prefill all_reduce: ranks 0, 1 issue 5 each, ranks 2, 3 issue 2 each = 14 calls of 20480 B
    assert rows[("prefill", "all_reduce", "tp")]["count"] == 14
    assert rows[("prefill", "all_reduce", "tp")]["payload_bytes"] == 14 * 20480
    # decode send_recv: 2 senders x GEN = 2 steps
    assert rows[("decode", "send_recv", "pp")] == dict(phase="decode", kind="send_recv", group="pp", count=4,
                                                       payload_bytes=4 * 4096, ranks=2)
    assert sum(r["count"] for r in rows.values()) == len(records)
    assert sum(r["payload_bytes"] for r in rows.values()) == sum(r["payload_bytes"] for r in records)


@pytest.mark.parametrize("model, layout, batch, words", [
    ("tiny-gqa", dict(tp=3), 2, "query heads"),          # 8 heads
    ("tiny-moe", dict(dp=3, ep=3), 3, "experts"),        # 8 experts
    ("tiny-gqa", dict(dp=2), 3, "batch"),                # 3 sequences over 2 replicas
    ("tiny-gqa", dict(ep=2, dp=2), 2, "no experts"),
    ("tiny-moe", dict(tp=2, ep=4, dp=2), 2, "not supported"),  # EP wider than TP with TP > 1
    ("tiny-gqa", dict(tp=2, cp=2), 2, "unknown key"),
])
def test_layouts_the_model_cannot_take_are_refused_in_one_line(model, layout, batch, words):
    with pytest.raises(LmcostError) as err:
        run_sharded(load_config(model), layout, batch=batch, prompt=S, gen=GEN)
    assert err.value.field == "layout"
    assert words in str(err.value) and "\n" not in str(err.value)


def _hang(rank):
    time.sleep(600)


def test_a_hung_run_fails_in_seconds_and_leaves_no_process():
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        _run(2, (), 2.0, target=_hang)
    assert time.monotonic() - start < 20
    assert multiprocessing.active_children() == []


def test_validate_cli_compares_a_sharded_run():
    # lmcost validate --tp 2 (gloo, CPU): the same comparison from the command line. tiny-gqa cut to 2 layers,
    # batch 1, prompt 8, 1 decode step, fp32: per rank 1 + 2 x 2 = 5 all-reduces of [8, d] in prefill, so
    # 2 ranks issue 10; the logits [8, V] all-gathered once per rank.
    import json

    from typer.testing import CliRunner

    from lmcost.cli import app
    from lmcost import load_config
    cfg = load_config("tiny-gqa")
    r = CliRunner().invoke(app, ["validate", "tiny-gqa", "--tp", "2", "--layers", "2", "--batch", "1", "--prompt", "8",
                                 "--gen", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)[0]
    assert res["match"] and res["logits_ok"]
    rows = {(x["phase"], x["kind"]): x for x in res["rows"]}
    assert rows[("prefill", "all_reduce")]["calls_run"] == 10
    assert rows[("prefill", "all_reduce")]["bytes_run"] == 10 * 8 * cfg.d_model * 4
    assert rows[("prefill", "all_gather")]["bytes_run"] == 2 * 8 * cfg.vocab_size * 4


@pytest.mark.parametrize("args, field", [
    (["--tp", "3"], "--tp"),                                 # 8 heads
    (["--tp", "2", "--device", "cuda"], "--tp/--pp/--ep/--dp"),  # no NCCL run here
])
def test_validate_cli_refuses_bad_layouts(args, field):
    from typer.testing import CliRunner

    from lmcost.cli import app

    r = CliRunner().invoke(app, ["validate", "tiny-gqa", "--batch", "2", *args])
    assert r.exit_code == 2
    assert r.output.startswith(f"error: {field}:") and r.output.count("\n") == 1


def test_validate_cli_tp_dp_ep():
    # TP2 x DP2 with EP2 inside each TP group (what plan recommends as "TP2 x DP2 x EP2"): each of the 4 ranks
    # issues 1 + 2 x 2 all-reduces in prefill (embedding, attention and MoE of 2 layers): 20 calls.
    import json

    from typer.testing import CliRunner

    from lmcost.cli import app

    r = CliRunner().invoke(app, ["validate", "tiny-moe", "--tp", "2", "--ep", "2", "--dp", "2", "--layers", "2",
                                 "--batch", "2", "--prompt", "8", "--gen", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)[0]
    assert res["match"] and res["logits_ok"] and res["world"] == 4
    assert {(x["phase"], x["kind"]): x["calls_run"] for x in res["rows"]}[("prefill", "all_reduce")] == 20
