"""Memory of a training step as a framework holds it (lmcost.cost.train_memory): the fp32 loss, FSDP's
gathered buffers, allocated <= reserved <= the device figure, fits decided on the device figure, and what
torch's cross-entropy keeps, against autograd."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lmcost import load_config
from lmcost.apps.train import TrainSetup, train_step
from lmcost.basics.errors import LmcostError
from lmcost.cost.train_memory import MemoryFigures, generation, loss_fp32_bytes, resolve_framework
from lmcost.hardware.gpu import load_gpu
from lmcost.operators.parallel import Layout


def _step(model="tiny-gqa", gpu="h100", figures=None, framework=None, **kw):
    setup = TrainSetup(**{"gpus": 1, "seq": 64, "global_batch": 2, "micro_batch": 2, **kw})
    if framework is not None:  # TrainSetup's `framework` field belongs to the framework flag's change
        object.__setattr__(setup, "framework", framework)
    return train_step(load_config(model), load_gpu(gpu), setup, "roofline", memory_figures=figures)


def test_fp32_loss_bytes_by_hand():
    # tiny-gqa: V = 8000; tp = 2 cuts it to 4000 a GPU; b = 2, s = 64: n = 128 tokens; bf16 (B_a = 2).
    # Megatron's vocab-parallel cross-entropy: one fp32 [n, V/tp] copy kept, its gradient written in place,
    # cast back to bf16: 4 + 2 = 6 bytes an element, less the 2-byte log-probs activations already count:
    # 128 x 4000 x 4 = 2,048,000 bytes.
    step = _step(gpus=2, layout=Layout(tp=2))
    assert step.memory["loss_fp32_bytes"] == 128 * 4000 * 4 == 2_048_000
    # eager torch (log_softmax's fp32 output, nll_loss's fp32 gradient and log_softmax's fp32 gradient at
    # once): 3 x 4 = 12 bytes an element, less 2: 128 x 4000 x 10 = 5,120,000
    assert _step(gpus=2, layout=Layout(tp=2), framework="eager").memory["loss_fp32_bytes"] == 5_120_000
    # fp32 training: the casts are no-ops; eager keeps 3 x 4 bytes, 4 of them already counted
    assert loss_fp32_bytes(128, 4000, 4, 3) == 128 * 4000 * 8


def test_fsdp_prefetch_buffers_by_hand():
    # llama-3-8b under ZeRO-3 (auto: FSDP) on 8 GPUs: the largest unit is lm_head, 128,256 x 4,096 =
    # 525,336,576 parameters (a layer: 218,112,000; README). FSDP gathers the unit in use and prefetches
    # one more: 2 x 525,336,576 x 2 bytes (bf16 weights) = 2,101,346,304; the unsharded gradients of the
    # unit computed and the one in its reduce-scatter: the same, bf16 gradients under bf16-mixed.
    step = _step("llama-3-8b", gpus=8, seq=1024, global_batch=8, micro_batch=1, zero=3)
    mem = step.memory
    assert mem["framework"] == "fsdp"
    assert mem["gathered_params_bytes"] == 2 * 525_336_576 * 2 == 2_101_346_304
    assert mem["gathered_grads_bytes"] == 2_101_346_304
    # no prefetch: the unit in use alone
    figures = MemoryFigures(prefetch_layers={**MemoryFigures().prefetch_layers, "fsdp": 0})
    assert _step("llama-3-8b", figures=figures, gpus=8, seq=1024, global_batch=8, micro_batch=1,
                 zero=3).memory["gathered_params_bytes"] == 525_336_576 * 2
    # ZeRO-1 (auto: Megatron's distributed optimizer) gathers nothing and reduces in its grad buffer
    z1 = _step("llama-3-8b", gpus=8, seq=1024, global_batch=8, micro_batch=1, zero=1).memory
    assert z1["gathered_params_bytes"] == z1["grad_buckets_bytes"] == 0


def test_ddp_buckets_copy_the_gradients():
    # torch DDP without gradient_as_bucket_view holds a second copy of the gradients in its buckets
    mem = _step(gpus=2, global_batch=4, zero=0, framework="eager").memory
    assert mem["grad_buckets_bytes"] == mem["grads_bytes"] > 0


@pytest.mark.parametrize("zero,recompute,framework", [
    (0, "none", "auto"), (1, "full", "deepspeed"), (2, "selective", "fsdp"), (3, "none", "auto"), (3, "full", "deepspeed")])
def test_allocated_reserved_device_order(zero, recompute, framework):
    mem = _step(gpus=4, global_batch=8, zero=zero, recompute=recompute, framework=framework).memory
    assert mem["total_bytes"] < mem["allocated_bytes"] <= mem["reserved_bytes"] < mem["nvidia_smi_bytes"]
    # reserved: allocated rounded up to 2 MiB segments, plus 10% of the transient bytes (the prior)
    transient = mem["allocated_bytes"] - mem["model_states_bytes"]
    assert mem["reserved_bytes"] - mem["allocated_bytes"] >= 0.10 * transient
    assert mem["nvidia_smi_bytes"] == mem["reserved_bytes"] + mem["cuda_context_bytes"] + mem["nccl_bytes"]


def test_allocated_fits_but_reserved_does_not():
    gpu = load_gpu("h100")
    probe = _step().memory
    # a GPU whose usable bytes fall between the allocated peak and the device figure
    usable = (probe["allocated_bytes"] + probe["nvidia_smi_bytes"]) / 2
    small = gpu.model_copy(update={"memory_gb": usable / 2**30})
    setup = TrainSetup(gpus=1, seq=64, global_batch=2, micro_batch=2)
    step = train_step(load_config("tiny-gqa"), small, setup, "roofline")
    mem = step.memory
    assert mem["allocated_bytes"] <= mem["usable_bytes"] < mem["nvidia_smi_bytes"]
    assert not step.fits and step.to_dict()["fits"] is False
    assert mem["margin_bytes"] == pytest.approx(mem["usable_bytes"] - mem["nvidia_smi_bytes"]) and mem["margin_bytes"] < 0


def test_figures_and_names():
    assert generation("h100-sxm") == "hopper" and generation("a100-80gb") == "ampere" and generation("x") == "default"
    assert resolve_framework("auto", 3) == "fsdp" and resolve_framework("auto", 1) == "megatron"
    with pytest.raises(LmcostError, match="framework"):
        resolve_framework("jax", 1)
    # a fit tries values without editing code: a larger fragmentation raises reserved, not allocated
    base = _step().memory
    more = _step(figures=replace(MemoryFigures(), fragmentation=0.5)).memory
    assert more["allocated_bytes"] == base["allocated_bytes"] and more["reserved_bytes"] > base["reserved_bytes"]


@pytest.mark.torch
def test_cross_entropy_keeps_what_the_loss_term_counts():
    # Oracle: torch's autograd on a tiny vocabulary. transformers' ForCausalLMLoss upcasts the logits
    # (`logits.float()`) and calls F.cross_entropy, i.e. log_softmax + nll_loss.
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    n, V = 6, 11
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(n, V, generator=g).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, V, (n,), generator=g)
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = (t.dtype, tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        up = logits.float()
        loss = F.cross_entropy(up, target)
    # what cross_entropy keeps beyond the targets: one fp32 [n, V] tensor (log_softmax's output)
    kept = [s for s in saved.values() if s[0] == torch.float32 and s[1] == (n, V)]
    assert kept == [(torch.float32, (n, V))]
    grads = {}
    up.register_hook(lambda gr: grads.setdefault("fp32", gr))
    logits.register_hook(lambda gr: grads.setdefault("bf16", gr))
    loss.backward()
    # its gradient: fp32 [n, V] at the upcast, then bf16 [n, V] for lm_head's backward
    assert grads["fp32"].dtype == torch.float32 and grads["fp32"].shape == (n, V)
    assert grads["bf16"].dtype == torch.bfloat16 and grads["bf16"].shape == (n, V)
    # log_softmax's backward takes the saved output and nll_loss's gradient, both fp32 [n, V], and
    # writes a third: the 3 fp32 tensors of MemoryFigures.loss_fp32_tensors["eager"]
    lp = up.detach().requires_grad_().log_softmax(-1)
    seen = []
    lp.register_hook(lambda gr: seen.append((gr.dtype, tuple(gr.shape))))
    F.nll_loss(lp, target).backward()
    assert seen == [(torch.float32, (n, V))]
    assert MemoryFigures().loss_fp32_tensors["eager"] == 1 + len(seen) + 1
    per_element = max(4 * 3, 4 + 2)  # the working set, bytes an element
    assert loss_fp32_bytes(n, V, 2, 3) == n * V * (per_element - 2)
