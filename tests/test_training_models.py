"""The models of the training-runs fitting set (lmcost/data/measurements/training-models.yaml, read by
lmcost.calibration.training_models): every model string of the set has an entry, each entry builds, its total
parameters match the published size to the precision it is printed with, and the entries a Hugging Face
config.json is held for equal lmcost's reading of that config."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import DATA, HF_DIR, ROOT
from lmcost.basics.errors import LmcostError
from lmcost.basics.files import read_mapping
from lmcost.calibration.training_models import training_model, training_model_names
from lmcost.cost.params import param_counts
from lmcost.model.loading import config_from_dict, load_config


def _published() -> dict[str, str]:
    """model string -> params_b as printed: tests/data/training-runs-models.txt (the distinct models of
    ../shared/training-runs.csv), and the package's copy of the CSV where one is shipped."""
    out = {}
    for line in (DATA / "training-runs-models.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            model, params_b = line.split("\t")
            out[model] = params_b
    for path in (ROOT / "lmcost" / "data" / "measurements").glob("training-runs*.csv"):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                out.setdefault(row["model"], row["params_b"])
    return out


PUBLISHED = _published()
NAMES = training_model_names()
BUILT = [n for n, kind in NAMES.items() if not kind.startswith("skip")]


def _tolerance(printed: str) -> float:
    """The relative precision of a printed size: 1.5% at 3 or more significant digits (a count: 6.74, 405.9,
    1040), 5% at 2 (7.6, 22), 10% at 1 (a name's size class: InternLM "7" is 7.32B, Nemotron "8" 8.54B,
    "2000" for a 2.06T GPT). Trailing zeros of a whole number are not significant, those after a point are."""
    digits = printed.replace(".", "").lstrip("0")
    if "." not in printed:
        digits = digits.rstrip("0")
    return {1: 0.10, 2: 0.05}.get(len(digits), 0.015)


def test_tolerance_reads_the_printed_precision():
    assert [_tolerance(s) for s in ("6.74", "13.0", "0.125", "1040", "7.6", "22", "530", "7", "2000", "80")] == \
        [0.015, 0.015, 0.015, 0.015, 0.05, 0.05, 0.05, 0.10, 0.10, 0.10]


#: Entries whose count is not the CSV's params_b, each with the count it is checked against and why.
#: OLMo-core's llama3_8B builder takes the vocabulary of the script's dolma2 tokenizer (100352), not Llama 3's
#: 128256: 32 x 218,112,000 (the shipped llama-3-8b's block, README) + 2 x 100352 x 4096 (embedding and lm_head)
#: + 4096 (final norm) = 6,979,584,000 + 822,083,584 + 4,096 = 7,801,671,680.
OTHER_COUNT = {"Llama 3 8B (OLMo-core impl.)": 7_801_671_680}


def test_every_model_of_the_set_has_an_entry():
    assert set(PUBLISHED) == set(NAMES)


@pytest.mark.parametrize("name", BUILT)
def test_total_parameters_match_the_published_size(name):
    total = param_counts(training_model(name))["total"]
    if name in OTHER_COUNT:
        assert total == OTHER_COUNT[name]
        return
    printed = PUBLISHED[name]
    assert abs(total / (float(printed) * 1e9) - 1) <= _tolerance(printed), (total, printed)


#: Entries backed by a config.json held in tests/data/hf-configs (copies of the published files): the
#: entry equals lmcost's reading of it but for the fields named (Llama 3 70B has Llama 3.1 70B's widths and
#: Llama 3's context, max_position_embeddings 8192 in meta-llama/Meta-Llama-3-70B's config.json; the shipped
#: deepseek-v3 and kimi-k2 describe the bf16 model, not the fp8 checkpoint, and training reads no recipe).
BF16 = {"quant": None}
HF_BACKED = {"Qwen3-30B-A3B": ("qwen3-30b-a3b", {}), "Llama 3 70B": ("llama-3.1-70b", {"max_positions": 8192}),
             "Mixtral 8x7B": ("mixtral-8x7b", {}), "DeepSeek-V3": ("deepseek-v3", BF16),
             "gpt-oss-120b": ("gpt-oss-120b", {}), "gpt-oss-20b": ("gpt-oss-20b", {}),
             "Qwen3-235B-A22B": ("qwen3-235b-a22b", {}), "Llama 3 8B": ("llama-3-8b", {}),
             "Llama 3.1 8B": ("llama-3.1-8b", {}), "Llama 3.1 70B": ("llama-3.1-70b", {}),
             "Qwen2.5-7B": ("qwen2.5-7b", {}), "Llama 2 7B": ("llama-2-7b", {}), "Kimi K2": ("kimi-k2", BF16)}


def _widths(cfg) -> dict:
    return cfg.model_dump(exclude={"name", "source", "aliases"})


# kimi-k2's model_type (kimi_k2) is read as deepseek_v3, with a note (tests/test_hf_types.py checks the note)
@pytest.mark.filterwarnings("ignore:.*read as deepseek_v3:UserWarning")
@pytest.mark.parametrize("name", sorted(HF_BACKED))
def test_entries_equal_the_hf_config_they_come_from(name):
    stem, differ = HF_BACKED[name]
    hf = _widths(config_from_dict(json.loads((HF_DIR / f"{stem}.json").read_text()), stem))
    assert _widths(training_model(name)) == {**hf, **differ}


def test_every_entry_says_where_its_widths_come_from():
    entries = read_mapping(ROOT / "lmcost" / "data" / "measurements" / "training-models.yaml")
    assert [n for n, e in entries.items() if "skip" not in e and len(e.get("source", "")) < 20] == []
    assert all(len(e["skip"]) > 20 for e in entries.values() if "skip" in e)


def test_a_shipped_entry_is_the_shipped_model():
    assert NAMES["Llama 2 7B (FMS)"] == "shipped" and NAMES["Llama 2 13B (FMS)"] == "inline"
    assert training_model("Llama 2 7B (FMS)") == load_config("llama-2-7b")


def test_unknown_and_skipped_names_are_refused_with_the_reason():
    with pytest.raises(LmcostError) as e:
        training_model("Llama 5 1T")
    assert e.value.field == "model" and "not a model of the training-runs set" in e.value.what
    with pytest.raises(LmcostError) as e:
        training_model("bigscience/T0_3B")
    assert e.value.field == "model" and "encoder-decoder" in e.value.what
    assert NAMES["bigscience/mt0-xxl"].startswith("skip: an encoder-decoder")
    assert sum(kind.startswith("skip") for kind in NAMES.values()) == 4
