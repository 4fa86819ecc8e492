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
TINY = {"recurrent_gemma": dict(block_types=["recurrent", "attention"], lru_width=48, attention_window_size=64),
        # RWKV: its time mixing as wide as hidden_size (the default config's derived 4096 stays in its to_dict)
        "rwkv": dict(attention_hidden_size=64),
        # xLSTM: hidden 128 (its derived embedding_dim and num_blocks set to match), 4 heads of q/k 16 and v 32
        # (widths multiples of 64, as xLSTMCache needs); TINY's chunk_size 8: 12 tokens are a chunk and 4 steps
        "xlstm": dict(hidden_size=128, embedding_dim=128, num_blocks=2, num_heads=4)}


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


class _View:
    """A transformers model behind a forward that takes and returns its cache as ``past_key_values``."""

    def __init__(self, model):
        self.model = model

    def to(self, dtype):
        self.model.to(dtype)
        return self

    def parameters(self):
        return self.model.parameters()


class _WithCache(_View):
    """RecurrentGemmaForCausalLM called as a model that returns its cache (see the module docstring)."""

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


class _RwkvState:
    """RWKV's cache: the five state tensors [b, hidden_size, n_layers] RwkvModel returns (the time and channel
    mixing's previous x in the model dtype; the WKV numerator, denominator and max in fp32), as one layer."""

    def __init__(self, state):
        self.state = state

    @property
    def layers(self):
        return [SimpleNamespace(**{f"s{i}": t for i, t in enumerate(self.state)})]


class _RwkvWithCache(_View):
    """RwkvForCausalLM called as a model that takes and returns its cache as ``past_key_values`` (its forward
    names it ``state``, and drops a ``past_key_values`` unread)."""

    def forward(self, ids, past_key_values=None, use_cache=True):
        import torch

        if past_key_values is None or ids.shape[1] > 1:
            out = self.model(ids, state=past_key_values.state if past_key_values is not None else None, use_cache=True)
            return SimpleNamespace(logits=out.logits, past_key_values=_RwkvState(out.state))
        # A decode step, one sequence at a time: transformers 5.24's RwkvSelfAttention/RwkvFeedForward take the
        # cached x_prev as [b, d] and mix it with x [b, 1, d], which broadcasts to [b, b, d] for b > 1 (b² rows
        # through every projection, logits [b, b, V]); for one sequence it is [1, 1, d], as the model means.
        # Each step updates its rows of the state in place (the slices are views).
        state = past_key_values.state
        logits = [self.model(ids[i:i + 1], state=[t[i:i + 1] for t in state], use_cache=True).logits
                  for i in range(ids.shape[0])]
        return SimpleNamespace(logits=torch.cat(logits), past_key_values=past_key_values)

    __call__ = forward


class _XlstmState:
    """xLSTM's cache (xLSTMCache): per layer the mLSTM's C, n and m (its rnn_state), in the model dtype."""

    def __init__(self, cache):
        self.cache = cache

    @property
    def layers(self):
        return [SimpleNamespace(c=c, n=n, m=m) for c, n, m in self.cache.rnn_state.values()]


class _XlstmWithCache(_View):
    """xLSTMForCausalLM called as a model that takes and returns its cache as ``past_key_values`` (its forward
    names it ``cache`` and returns it as ``cache``)."""

    def forward(self, ids, past_key_values=None, use_cache=True):
        out = self.model(ids, cache=past_key_values.cache if past_key_values is not None else None, use_cache=True)
        return SimpleNamespace(logits=out.logits, past_key_values=_XlstmState(out.cache))

    __call__ = forward


def adapt(model_type: str, model):
    """``model`` as the tests call it: RecurrentGemma, RWKV and xLSTM wrapped to take and return their cache as
    ``past_key_values``; any other as it is."""
    return {"recurrent_gemma": _WithCache, "rwkv": _RwkvWithCache,
            "xlstm": _XlstmWithCache}.get(model_type, lambda m: m)(model)
