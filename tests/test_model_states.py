"""Model states of a training step (issue 16): weights, gradients, master copy and optimizer states.

Oracles: (1) Llama-3.1-70B worked by hand; (2) the state tensors ``torch.optim`` allocates for the
reference decoder (AdamW, SGD with momentum, Adafactor, Muon + AdamW), exactly; (3) torch's own ZeRO-1
(``ZeroRedundancyOptimizer``) and FSDP2 (``fully_shard``) in 3 gloo processes on the CPU: per-rank
parameter, gradient and optimizer-state bytes, exactly; (4) LoRA against a hand-made adapter wrapper,
QLoRA's bits per parameter by hand.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from lmcost.basics.errors import LmcostError
from lmcost.model.loading import load_config
from lmcost.cost.optimizers import (
    QLORA_BITS_PER_PARAM,
    LoRA,
    model_states,
    nf4_bytes,
    param_tensors,
    zero1_partition,
)
from lmcost.operators.parallel import Layout
from lmcost.cost.params import param_counts
from oracles import fsdp2_local_rows, fsdp2_shard_numel

pytestmark = pytest.mark.torch

TINY = ("tiny-gqa", "tiny-moe", "tiny-mla")

# ---------------------------------------------------------------------------------------------------
# (1) By hand: Llama-3.1-70B
#
# d = 8192, L = 80, h = 64, h_kv = 8, d_h = 128, d_ff = 28672, V = 128256, untied.
# per layer: W_q 8192*8192 = 67,108,864; W_k, W_v 8192*1024 = 8,388,608 each; W_o 67,108,864;
#            gate, up, down 3*8192*28672 = 704,643,072; 2 norms 16,384 -> 855,654,400
# 80 layers 68,452,352,000 + embed and lm_head 2*128256*8192 = 2,101,346,304 + final norm 8,192
P70 = 70_553_706_496
TENSORS70 = 80 * 9 + 3  # per layer 7 matrices + 2 norms; embed, lm_head, final norm


@cache
def _cfg(name):
    return load_config(name)


def test_70b_mixed_adamw_is_16_bytes_per_param():
    cfg = _cfg("llama-3.1-70b")
    assert param_counts(cfg)["total"] == P70
    s = model_states(cfg, Layout(), optimizer="adamw", precision="bf16-mixed")
    # bf16 weights 2 + bf16 grads 2 + fp32 master 4 + fp32 exp_avg 4 + exp_avg_sq 4 = 16 B/param: the sum,
    # not the max of the parts (2 + 2 + 12, Rajbhandari et al. 2020 section 3.1, K = 12: not 4x the weights)
    assert (s.weights_bytes, s.grads_bytes, s.master_bytes, s.optimizer_bytes) == (2 * P70, 2 * P70,
                                                                                                4 * P70, 8 * P70)
    assert s.total_bytes == 16 * P70 == 1_128_859_303_936
    assert s.step_bytes == 4 * TENSORS70  # one 0-dim fp32 step per tensor, on the CPU: not in the total
    # Megatron's fp32 main grads: 2 + 4 + 4 + 8 = 18
    assert model_states(cfg, precision="bf16-mixed-fp32-grads").total_bytes == 18 * P70
    assert model_states(cfg, precision="fp32").total_bytes == 16 * P70       # 4 + 4 + 8, no master
    assert model_states(cfg, precision="bf16").total_bytes == 8 * P70        # 2 + 2 + 4
    # SGD with momentum: one buffer, 2 + 2 + 4 + 4 = 12; Muon the same on the hidden matrices
    assert model_states(cfg, optimizer="sgd").total_bytes == 12 * P70
    outer = 2 * 128256 * 8192 + 8192 + 80 * 2 * 8192  # embed, lm_head and norms stay on AdamW
    assert model_states(cfg, optimizer="muon").optimizer_bytes == 4 * (P70 - outer) + 8 * outer
    # Adam 8-bit: every tensor has >= 4096 elements and a multiple of 256: 2 + 8/256 B/param + 2 KiB of maps
    assert model_states(cfg, optimizer="adam8bit").optimizer_bytes == 2 * P70 + 8 * P70 // 256 + 2048


def test_70b_zero_stages_divide():
    cfg = _cfg("llama-3.1-70b")
    assert P70 % 64 == 0
    n = P70 // 64
    z = {k: model_states(cfg, Layout(dp=64), zero=k).total_bytes for k in range(4)}
    assert z[0] == 16 * P70                            # DDP: all replicated
    assert z[1] == 2 * P70 + 2 * P70 + 12 * n          # master + moments sharded
    assert z[2] == 2 * P70 + 14 * n                    # + gradients
    assert z[3] == 16 * n == 17_638_426_624            # + weights: 16 P / 64
    # Megatron-LM's distributed optimizer, bf16 params and fp32 grads: 6 + 12/d bytes per parameter
    assert model_states(cfg, Layout(dp=64), precision="bf16-mixed-fp32-grads", zero=1).total_bytes == 6 * P70 + 12 * n
    # FSDP2 shards each tensor on dim 0: every dim 0 here (8192, 1024, 28672, 128256) is a multiple of 64
    assert model_states(cfg, Layout(dp=64), zero=3, sharding="fsdp2").total_bytes == 16 * n


def test_zero_over_tp_pp_and_experts():
    cfg = _cfg("tiny-moe")
    stages = param_tensors(cfg, Layout(tp=2, pp=2))
    assert len(stages) == 2
    # EP over attention-DP: experts already split over ep = 4 of the dp = 4 ranks, ZeRO has none left to cut
    lay = Layout(dp=4, ep=4)
    one = model_states(cfg, lay, zero=0)
    zero1 = model_states(cfg, lay, zero=1)
    experts = sum(t.numel * t.count for t in param_tensors(cfg, lay)[0] if t.role.startswith("moe.expert."))
    dense = one.trainable_params - experts
    assert zero1.optimizer_bytes == 8 * experts + 8 * math.ceil(dense / 4)


def test_bad_inputs_name_their_field():
    cfg = _cfg("tiny-gqa")
    for kwargs, field in ((dict(optimizer="lion"), "optimizer"), (dict(precision="fp8-mixed"), "precision"),
                          (dict(zero=4), "zero"), (dict(zero=1, sharding="fsdp2"), "sharding"),
                          (dict(lora=LoRA(8, targets=("attn.kv_a_proj",))), "lora.targets")):
        with pytest.raises(LmcostError) as e:
            model_states(cfg, **kwargs)
        assert e.value.field == field
    with pytest.raises(LmcostError, match="^lora.targets: "):
        LoRA(8, targets=("qq",))
    with pytest.raises(LmcostError, match="^lora.rank: "):
        LoRA(0)


# ---------------------------------------------------------------------------------------------------
# (2) torch.optim oracle: the state tensors torch allocates for the reference decoder

torch = pytest.importorskip("torch")


def _nbytes(t):
    return t.numel() * t.element_size()


def _state_bytes(opts):
    return sum(_nbytes(v) for o in opts for st in o.state.values() for v in st.values() if torch.is_tensor(v))


def _hidden(name, p):
    return p.ndim == 2 and name.split(".")[0] not in ("embed", "pos_embed", "lm_head")


@cache
def _trained(name):
    """The fp32 reference decoder of ``name`` with every gradient filled by one backward (tiny-moe: by
    hand, so that experts no token of a small batch is routed to still get a gradient and states, as
    every expert does in a real step)."""
    from lmcost.profiling.decoder import build_decoder

    cfg = _cfg(name)
    torch.manual_seed(0)
    m = build_decoder(cfg, max_batch=2, max_context=8, mla_mode="naive").trainable()
    if cfg.moe is None:
        ids = torch.randint(0, cfg.vocab_size, (2, 8))
        torch.nn.functional.cross_entropy(m(ids, 0).flatten(0, 1), ids.flatten()).backward()
    else:
        for p in m.parameters():
            p.grad = torch.randn_like(p)
    return m


def _make(kind, model):
    named = list(model.named_parameters())
    params = [p for _, p in named]
    if kind == "adamw":
        return [torch.optim.AdamW(params)]
    if kind == "sgd":
        return [torch.optim.SGD(params, lr=0.1, momentum=0.9)]
    if kind == "adafactor":
        return [torch.optim.Adafactor(params)]
    # muon: Muon on the 2-D matrices inside the layers, AdamW on the rest
    return [torch.optim.Muon([p for n, p in named if _hidden(n, p)]),
            torch.optim.AdamW([p for n, p in named if not _hidden(n, p)])]


@pytest.mark.parametrize("name", TINY)
def test_tensor_shapes_match_the_decoder(name):
    model = _trained(name)
    ours = Counter(t.shape for t in param_tensors(_cfg(name))[0] for _ in range(t.count))
    assert ours == Counter(tuple(p.shape) for p in model.parameters())


@pytest.mark.parametrize("name", TINY)
# muon's Newton-Schulz steps take 15-90 s on a busy 2-core machine: the slow tier
@pytest.mark.parametrize("kind", ["adamw", "sgd", "adafactor", pytest.param("muon", marks=pytest.mark.slow)])
def test_torch_optim_state_bytes_exact(name, kind):
    model = _trained(name)
    opts = _make(kind, model)
    for o in opts:
        o.step()
    s = model_states(_cfg(name), optimizer=kind, precision="fp32")
    assert _state_bytes(opts) == s.optimizer_bytes + s.step_bytes
    assert sum(_nbytes(p.grad) for p in model.parameters()) == s.grads_bytes
    assert sum(_nbytes(p) for p in model.parameters()) == s.weights_bytes
    assert s.master_bytes == 0


def test_torch_optim_by_hand_tiny_gqa():
    # tiny-gqa: 19,468,800 params in 39 tensors (4 layers x 9 + embed, lm_head, final norm)
    P, T = 19_468_800, 39
    cfg = _cfg("tiny-gqa")
    assert model_states(cfg, optimizer="adamw", precision="fp32").optimizer_bytes == 8 * P
    assert model_states(cfg, optimizer="adamw", precision="fp32").step_bytes == 4 * T
    # Adafactor: a matrix [r, c] keeps r + c; per layer wq 512+512, wk/wv 128+512 each, wo 1024,
    # gate/up 1408+512 each, down 512+1408, 2 norms 512 each -> 1024+1280+1024+5760+1024 = 10,112;
    # x4 = 40,448; embed and lm_head 8000+512 each = 17,024; final norm 512 -> 57,984 fp32 + 39 steps
    s = model_states(cfg, optimizer="adafactor", precision="fp32")
    assert (s.optimizer_bytes, s.step_bytes) == (4 * 57_984, 4 * T)


# ---------------------------------------------------------------------------------------------------
# (3) gloo oracle: ZeroRedundancyOptimizer (ZeRO-1) and FSDP2 fully_shard (ZeRO-3), 3 CPU processes

WORLD = 3


def _storage_bytes(tensors):
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _sharded_worker(rank, world, port, out):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from lmcost.profiling.decoder import build_decoder

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        cfg = load_config("tiny-gqa")
        ids = torch.randint(0, cfg.vocab_size, (1, 4), generator=torch.Generator().manual_seed(rank))

        def step(model, opt):
            torch.nn.functional.cross_entropy(model(ids, 0).flatten(0, 1), ids.flatten()).backward()
            opt.step()

        rec = {}
        # ZeRO-1: every rank holds the whole model and gradients, states of the parameters it owns
        m = build_decoder(cfg, max_batch=1, max_context=4).trainable()
        opt = ZeroRedundancyOptimizer(list(m.parameters()), optimizer_class=torch.optim.AdamW)
        step(m, opt)
        rec["zero1"] = dict(params=_storage_bytes(m.parameters()), grads=sum(_nbytes(p.grad) for p in m.parameters()),
                            states=_state_bytes([opt.optim]), sizes=[p.numel() for p in m.parameters()])
        # FSDP2: each block its own group, the root the embedding, final norm and lm_head
        m = build_decoder(cfg, max_batch=1, max_context=4).trainable()
        for block in m.layers:
            fully_shard(block)
        fully_shard(m)
        opt = torch.optim.AdamW(m.parameters())
        step(m, opt)
        params = list(m.parameters())

        def local(v):
            return v.to_local() if hasattr(v, "to_local") else v

        rec["fsdp2"] = dict(params=_storage_bytes([p.to_local() for p in params]),
                            grads=_storage_bytes([p.grad.to_local() for p in params]),
                            states=sum(_nbytes(local(v)) for st in opt.state.values() for v in st.values()),
                            shapes=[list(p.shape) for p in params])
        Path(out, f"rank{rank}.json").write_text(json.dumps(rec))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    from lmcost.profiling.distributed import _free_port, _run

    out = tmp_path_factory.mktemp("sharded")
    _run(WORLD, (WORLD, _free_port(), str(out)), timeout_s=120, target=_sharded_worker)
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.distributed
def test_zero1_matches_zero_redundancy_optimizer(sharded):
    cfg = _cfg("tiny-gqa")
    sizes = sharded[0]["zero1"]["sizes"]
    owners = zero1_partition(sizes, WORLD)
    assert sorted(i for r in owners for i in r) == list(range(len(sizes)))
    for r, rec in enumerate(sharded):
        z = rec["zero1"]
        assert z["params"] == z["grads"] == 4 * sum(sizes)  # replicated
        # AdamW fp32: exp_avg + exp_avg_sq 8 B/param + a 4 B step per owned tensor
        assert z["states"] == sum(8 * sizes[i] + 4 for i in owners[r])
    s = model_states(cfg, Layout(dp=WORLD), optimizer="adamw", precision="fp32", zero=1, sharding="greedy")
    assert s.optimizer_bytes + s.step_bytes == max(rec["zero1"]["states"] for rec in sharded)
    assert s.weights_bytes == s.grads_bytes == sharded[0]["zero1"]["params"]
    # not exactly 1/dp of the states: whole tensors go to ranks
    assert len({rec["zero1"]["states"] for rec in sharded}) > 1


@pytest.mark.distributed
def test_fsdp2_matches_fully_shard(sharded):
    cfg = _cfg("tiny-gqa")
    shapes = [tuple(s) for s in sharded[0]["fsdp2"]["shapes"]]
    padded = sum(fsdp2_shard_numel(s, WORLD) for s in shapes)
    for r, rec in enumerate(sharded):
        f = rec["fsdp2"]
        # parameters and gradients: padded to ceil(dim0/3) rows per tensor on every rank (8000 -> 2667,
        # 128 -> 43, 1408 -> 470, 512 -> 171); optimizer states: the rows the rank really has
        assert f["params"] == f["grads"] == 4 * padded
        assert f["states"] == sum(8 * fsdp2_local_rows(s[0], WORLD, r) * math.prod(s[1:]) + 4 for s in shapes)
    s = model_states(cfg, Layout(dp=WORLD), optimizer="adamw", precision="fp32", zero=3, sharding="fsdp2")
    f0 = sharded[0]["fsdp2"]  # rank 0 holds the most
    assert (s.weights_bytes, s.grads_bytes, s.optimizer_bytes + s.step_bytes) == (f0["params"], f0["grads"],
                                                                                              f0["states"])
    # the flat form (DeepSpeed): ceil(P/3) per rank, a little under FSDP2's per-tensor padding
    flat = model_states(cfg, Layout(dp=WORLD), optimizer="adamw", precision="fp32", zero=3)
    assert flat.weights_bytes == 4 * math.ceil(19_468_800 / 3) <= s.weights_bytes


# ---------------------------------------------------------------------------------------------------
# (4) LoRA and QLoRA


def test_lora_trainable_params_against_a_wrapper():
    cfg = _cfg("tiny-gqa")
    model = _trained("tiny-gqa")
    r = 8
    # hand-made LoRA on q, k, v, o: A [r, d_in], B [d_out, r] beside each weight [d_out, d_in]
    adapters = []
    for layer in model.layers:
        for w in (layer.attn.wq, layer.attn.wk, layer.attn.wv, layer.attn.wo):
            d_out, d_in = w.shape
            adapters += [torch.nn.Parameter(torch.zeros(r, d_in)), torch.nn.Parameter(torch.zeros(d_out, r))]
    # per layer: q 8*(512+512) + k 8*(512+128) + v 8*(512+128) + o 8*(512+512) = 26,624; x4 = 106,496
    assert sum(a.numel() for a in adapters) == 106_496
    s = model_states(cfg, lora=LoRA(r), precision="fp32")
    assert s.trainable_params == 106_496
    assert s.frozen_params == 19_468_800
    for a in adapters:
        a.grad = torch.ones_like(a)
    opt = torch.optim.AdamW(adapters)
    opt.step()
    assert _state_bytes([opt]) == s.optimizer_bytes + s.step_bytes
    assert s.grads_bytes == 4 * 106_496
    assert s.weights_bytes == 2 * 19_468_800 + 4 * 106_496  # bf16 frozen base + fp32 adapters
    # mixed precision: bf16 adapters + fp32 master, grads and moments: 16 B per trainable parameter
    m = model_states(cfg, lora=LoRA(r))
    assert m.total_bytes == 2 * 19_468_800 + 16 * 106_496


def test_qlora_bits_per_param():
    # NF4 4 bits + one uint8 absmax per 64 weights (8/64) + one fp32 absmax per 256 of those (32/16384)
    assert QLORA_BITS_PER_PARAM == 4 + 0.125 + 0.001953125 == 4.126953125
    n = 64 * 256 * 4
    # 65,536 weights: 32,768 B of codes + 1,024 uint8 absmax + 4 fp32 absmax = n * 4.127 bits / 8, plus
    # the per-tensor offset (4 B), nested code map (1,024 B) and NF4 code (64 B)
    assert nf4_bytes(n) == n * QLORA_BITS_PER_PARAM / 8 + 1092 == 32_768 + 1_024 + 16 + 1_092
    cfg = _cfg("tiny-gqa")
    q = model_states(cfg, lora=LoRA(8, base_dtype="int4"))
    b = model_states(cfg, lora=LoRA(8))
    # the 4 layers' 7 matrices go to NF4; embed, lm_head and the norms stay bf16
    mats = [t for t in param_tensors(cfg)[0] if len(t.shape) == 2 and not t.role.startswith(("embed", "lm_head"))]
    assert b.weights_bytes - q.weights_bytes == sum(t.count * (2 * t.numel - nf4_bytes(t.numel)) for t in mats)
    assert q.trainable_params == b.trainable_params
