"""Test helpers for the recurrent families (lmcost.model.hf.rnn): their tiny configs and a view of the models
whose forward returns no cache.

transformers' RecurrentGemmaForCausalLM returns no ``past_key_values``: it builds a DynamicCache for its
attention layers inside the forward and keeps each recurrent block's states on the block (``conv1d_state``
[b, lru_width, conv1d_width - 1] in the model dtype, ``rg_lru.recurrent_states`` [b, lru_width] in fp32).
:func:`adapt` wraps such a model so that a prefill returns a cache object holding both (its ``layers``, as
tests/test_hybrid.py's ``_cache_nbytes`` reads them) and a decode step given it continues from it, as
``model(ids, past_key_values=cache)`` does for every other family.
"""

from __future__ import annotations

from types import SimpleNamespace

#: Tiny configs on top of tests/test_flop_oracle.py's TINY widths: RecurrentGemma with a recurrent block
#: (an RG-LRU width of 48, unlike hidden_size 64, in 4 blocks of 12) then a local attention layer (a window
#: of 64, past every test's context).
TINY = {"recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=48, attention_window_size=64)}


class _HeldStates:
    """The cache of a RecurrentGemma forward: the DynamicCache's layers and, per recurrent block, its states
    (read when asked, as the blocks replace their tensors at each step)."""

    def __init__(self, cache, model):
        self.cache, self.model = cache, model

    @property
    def layers(self):
        blocks = [layer.temporal_block for layer in self.model.model.layers]
        return list(self.cache.layers) + [SimpleNamespace(conv=b.conv1d_state, state=b.rg_lru.recurrent_states)
                                          for b in blocks if hasattr(b, "rg_lru")]


class _WithCache:
    """RecurrentGemmaForCausalLM called as a model that returns its cache (see the module docstring)."""

    def __init__(self, model):
        self.model = model

    def to(self, dtype):
        self.model.to(dtype)
        return self

    def parameters(self):
        return self.model.parameters()

    def forward(self, ids, past_key_values=None, use_cache=True):
        from transformers import DynamicCache

        held = past_key_values or _HeldStates(DynamicCache(config=self.model.config), self.model)
        if past_key_values is None:
            for layer in self.model.model.layers:  # a fresh sequence: the blocks allocate new states
                if hasattr(layer.temporal_block, "rg_lru"):
                    layer.temporal_block.conv1d_state = None
        out = self.model(ids, cache=held.cache, use_cache=True)
        return SimpleNamespace(logits=out.logits, past_key_values=held)

    __call__ = forward


def adapt(model_type: str, model):
    """``model`` as the tests call it: RecurrentGemma wrapped to return its cache; any other as it is."""
    return _WithCache(model) if model_type == "recurrent_gemma" else model
