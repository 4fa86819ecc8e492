"""The training-runs fitting set read as lmcost train cases (lmcost.calibration.training_runs), the sources' FLOP
conventions (lmcost.calibration.training_flops) and the evaluation behind ``lmcost fit --training``
(lmcost.apps.train_fit). Conversions are worked by hand in the comments from the row's own figures."""

import csv
import json
from dataclasses import dataclass, field, replace

import pytest
from typer.testing import CliRunner

from lmcost.apps import train_fit
from lmcost.basics import shipped
from lmcost.calibration import training_runs as tr
from lmcost.calibration.training_flops import flops_per_token
from lmcost.model.config import ArchConfig

TABLE = shipped.folder("measurements") / "training-runs.csv"


@pytest.fixture(scope="module")
def records():
    with open(TABLE, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs():
    return tr.load_runs()


def _gpt(L, h, heads, vocab, ffn, activation="gelu"):
    return ArchConfig.model_validate(dict(name="hand", d_model=h, n_layers=L, vocab_size=vocab,
                                          attention=dict(n_heads=heads), ffn=dict(activation=activation, d_ff=ffn)))


def test_shipped_copy_is_the_shared_set_with_its_header():
    doc = (shipped.folder("measurements") / "training-runs.md").read_text()
    assert doc.startswith("> Shipped copy of `../shared/training-runs.md`") and "issue 26" in doc.splitlines()[0]
    with open(TABLE, newline="", encoding="utf-8") as f:
        assert sum(1 for _ in csv.DictReader(f)) == 660  # the .md: "660 rows, one published figure per row"


def test_every_row_resolves_or_says_why_in_one_line(runs):
    assert len(runs) == 660
    for r in runs:
        if r.skip is None:
            assert r.published > 0 and r.cfg is not None and r.gpu and r.seq and r.global_batch, r.row
            assert r.global_batch % (r.dp * r.micro_batch) == 0 or r.metric_class != "throughput", r.row
        else:
            assert r.skip.strip() and "\n" not in r.skip, r.row


def test_encoder_decoder_skipped_fp8_rows_read_as_their_recipe_and_gb200_on_gb200(runs):
    # The .md: the 2022 PEFT README rows are T0_3B and mt0-xxl, "encoder-decoder (T5 family)" (6 rows). The
    # 179 FP8/MXFP8 precision cells map to lmcost's recipes by their words: "MXFP8" -> mxfp8, "blockwise" ->
    # fp8-block, "current scaling" and torchao float8 (tensorwise dynamic) -> fp8-current, plain FP8 under
    # Transformer Engine -> its default delayed scaling. GB200 rows run on the gb200 file.
    enc = [r for r in runs if r.model in ("bigscience/T0_3B", "bigscience/mt0-xxl")]
    assert len(enc) == 6 and {r.skip for r in enc} == {"encoder-decoder model: lmcost trains decoder-only stacks"}
    fp8 = [r for r in runs if r.fp8]
    assert len(fp8) == 179 and "fp8 training is not modelled yet" not in {r.skip for r in fp8}
    assert {r.precision for r in fp8} == {"mxfp8", "fp8-block", "fp8-current", "fp8-delayed"}
    words = {"mxfp8": "mxfp8", "blockwise": "fp8-block", "current scaling": "fp8-current", "torchao": "fp8-current"}
    import csv
    from lmcost.basics import shipped
    text = {i: r["precision"].lower() for i, r in enumerate(csv.DictReader(
        (shipped.folder("measurements") / "training-runs.csv").open()), start=1)}
    for r in fp8:
        want = next((v for k, v in words.items() if k in text[r.row]), "fp8-delayed")
        assert r.precision == want, (r.row, text[r.row])
    assert {r.gpu for r in runs if "GB200" in r.gpu_text and r.skip is None} == {"gb200"}


def test_megatron_mfu_row_read_back_with_num_floating_point_operations(records, monkeypatch):
    # Data row 2: GPT 1.7B (24 layers, hidden 2048, 16 heads, vocab 131072, GELU FFN 4h), seq 4096, MFU 0.41 on
    # 989 TFLOP/s. Megatron-LM's formula per token: 12 L h^2 [(1 + g/a + s/h) + (f/h)] + 6 h V
    # = 12 * 24 * 2048^2 * (1 + 1 + 2 + 4) + 6 * 2048 * 131072 = 9,663,676,416 + 1,610,612,736 = 11,274,289,152;
    # tokens/s/GPU = 0.41 * 989e12 / 11,274,289,152 = 35,965.7. Its TFLOP/s row (408.8) reads 36,259.9: the
    # published MFU is the TFLOP/s rounded to a whole percent (408.8 / 989 = 41.3%).
    cfg = _gpt(24, 2048, 16, 131072, 8192)
    assert flops_per_token("megatron-lm", cfg, 4096) == 11_274_289_152
    monkeypatch.setattr(tr, "_model", lambda name: cfg)
    rec = dict(records[1], micro_batch="1")  # the table leaves the micro-batch empty; given here to reach the conversion
    row = tr.resolve(rec, 2)
    assert row.skip is None and row.metric == "mfu" and row.convention == "megatron-lm"
    assert row.published == pytest.approx(0.41 * 989e12 / 11_274_289_152, rel=1e-12)
    assert row.zero == 1 and any("distributed optimizer" in a for a in row.assumptions)
    tflops = tr.resolve(dict(records[0], micro_batch="1"), 1)
    assert tflops.published == pytest.approx(408.8e12 / 11_274_289_152, rel=1e-12)


def test_step_time_row_becomes_tokens_per_gpu(runs):
    # Data row 238: AutoModel Llama 3 70B, 64 H100, GBS 128 x seq 8192, 18.9 s per step:
    # 128 * 8192 / 18.9 / 64 = 866.84 tokens/s/GPU; the same run's published tokens/s (row 240) is 866.77.
    step, tps = runs[237], runs[239]
    assert (step.metric, step.value, tps.metric) == ("step_time_s", 18.9, "tokens_per_s_per_gpu")
    assert step.published == pytest.approx(128 * 8192 / 18.9 / 64, rel=1e-12)
    assert step.published == pytest.approx(tps.published, rel=1e-3)
    assert (step.zero, step.shard_group, step.framework) == (3, None, "fsdp")  # FSDP=32 = every dp rank: full shard


def test_internevo_hardware_tflops_with_its_recompute(records, monkeypatch):
    # Data row 572: InternLM 7B (32 layers, h 4096, SwiGLU 11008, vocab 103168), seq 2048, checkpointing on,
    # 193 hardware TFLOP/s. Narayanan Eq. 3 with 4 passes (recompute counted):
    # 4 * 32 * (2 * (4 h^2 + 3 h 11008) + 4 s h) + 6 h V = 128 * (2 * 202,375,168 + 33,554,432) + 2,535,456,768
    # = 58,638,467,072 FLOPs/token, so 193e12 / that = 3291.4 tokens/s/GPU; InternEvo's own tokens/s for
    # the run (row 571) is 3314: 0.7% apart (its formula takes the FFN as 8/3 h, 10923, not 11008).
    cfg = _gpt(32, 4096, 32, 103168, 11008, activation="swiglu")
    assert flops_per_token("narayanan", cfg, 2048, "full") == 58_638_467_072
    monkeypatch.setattr(tr, "_model", lambda name: cfg)
    row = tr.resolve(records[571], 572)
    assert row.skip is None and row.recompute == "full" and row.convention == "narayanan"
    assert row.published == pytest.approx(193e12 / 58_638_467_072, rel=1e-12)
    assert row.published == pytest.approx(3314, rel=0.01)
    assert (row.zero, row.shard_group) == (1, None)  # zero1=8 on 8 GPUs shards over every rank


@dataclass
class _Step:
    tokens_per_s_per_gpu: float
    fits: bool = True
    memory: dict = field(default_factory=dict)


def test_evaluate_scores_and_counts_a_run_once(runs):
    # A predict that answers twice the published tokens/s of the tokens/s row of each run: every throughput
    # ratio is 2 against that row; the AutoModel step-time twin (row 238: 866.84 against 866.77, ratio 1.99975)
    # counts once in the throughput class, as its tokens/s row (the first metric of THROUGHPUT).
    rows = [runs[237], runs[239]]
    pub = runs[239].published
    res = train_fit.evaluate(rows, predict=lambda req: _Step(2 * pub))
    assert res["rows_used"] == 2 and res["summary"]["throughput"]["rows"] == 1
    assert res["summary"]["throughput"]["median_ratio"] == 2.0
    assert res["summary"]["by_metric"]["step_time_s"]["median_ratio"] == pytest.approx(2 * 866.77 / (128 * 8192 / 18.9 / 64))
    assert res["summary"]["throughput"]["within_25"] == 0.0


def test_request_carries_only_fields_train_has(runs):
    row = runs[239]
    req = train_fit.request_for(row)
    assert (req.gpus, req.seq, req.global_batch, req.cp, req.zero) == (64, 8192, 128, 2, 3)
    # The row's framework reaches TrainRequest; its table's FSDP=32 shards over all dp = 64 / cp 2 = 32
    # ranks, so no HSDP shard group is set (CSV line 241).
    assert (req.framework, req.shard_group) == ("fsdp", None)


def test_cli_json_on_two_rows():
    from lmcost.cli import app

    # Data row 19: Mixtral 8x7B, 438 TFLOP/s (Megatron-LM MCore v0.8); row 327: LitGPT LoRA Llama 2 7B, 21.30 GB.
    out = CliRunner().invoke(app, ["fit", "--training", "--rows", "19,327", "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.stdout)
    assert res["rows_read"] == 2 and res["rows_used"] == 2
    assert [r["row"] for r in res["results"]] == [19, 327]
    assert res["results"][1]["published"] == 21.30e9 and res["results"][1]["metric_class"] == "memory"
    assert set(res["summary"]) == {"throughput", "memory", "oom", "by_metric"}


@pytest.mark.parametrize("args, line", [
    (["--training", "--rows", "3-x"], "error: --rows: '3-x' is not a row number or a range a-b"),
    (["--rows", "3"], "error: --rows: selects rows of a training-runs table; add --training, or drop it"),
    (["--training", "--collectives"], "error: --training: evaluates lmcost train on training runs"),
])
def test_cli_refuses_bad_selections(args, line):
    from lmcost.cli import app

    out = CliRunner().invoke(app, ["fit", *args])
    assert out.exit_code == 2 and line in out.output


def test_model_prefers_training_models_when_it_is_there(monkeypatch):
    # The seam for lmcost.calibration.training_models: a name it builds is its config, not the shipped one; a name
    # it refuses is a skip carrying its words. A stand-in module plays it here.
    import sys
    import types

    from lmcost.basics.errors import LmcostError

    cfg = _gpt(2, 64, 4, 128, 256)

    def training_model(name):
        if name == "refused":
            raise LmcostError("model", "no such model in the table", "name one")
        return cfg

    monkeypatch.setitem(sys.modules, "lmcost.calibration.training_models", types.SimpleNamespace(training_model=training_model))
    tr._model.cache_clear()
    try:
        assert tr._model("Llama 3 8B") is cfg
        with pytest.raises(tr.Skip, match="model 'refused' not buildable: no such model in the table"):
            tr._model("refused")
    finally:
        tr._model.cache_clear()
