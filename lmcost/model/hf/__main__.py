"""``python -m lmcost.model.hf``: the list of accepted and refused Hugging Face model types that the README carries
between its hf-types markers (tests/test_hf_types.py checks that it does)."""

from lmcost.model.hf.families import accepted_types
from lmcost.model.hf.verdicts import types_markdown

print(types_markdown(accepted_types()))
