"""lmcost.profiling.trace on a CUDA trace missing GPU-side annotations (torch 2.11 + CUDA 13 on the lent H200
exported a ``gpu_user_annotation`` span for the innermost scope only, so no step scope, and no operator, was
measured): a CPU scope without one takes the kernels its launches started, tied by ``args.correlation``. The trace below is written by hand;
the times asserted are sums of its kernel durations."""

import pytest

from lmcost.profiling.trace import gpu_annotations, scope_times, step_times

pytestmark = pytest.mark.torch  # lmcost.profiling is the torch-importing part


def _trace(with_gpu_spans=False):
    ev = [
        # host: the step scope 0-100 us, inside it q_proj 10-20 (launch corr 1 at 12) and down 30-40 (launches 2, 3)
        dict(name="lmcost.decode.0", cat="user_annotation", ph="X", ts=0.0, dur=100.0, pid=1, tid=7),
        dict(name="attn.q_proj", cat="user_annotation", ph="X", ts=10.0, dur=10.0, pid=1, tid=7),
        dict(name="cudaLaunchKernel", cat="cuda_runtime", ph="X", ts=12.0, dur=3.0, pid=1, tid=7, args=dict(correlation=1)),
        dict(name="ffn.down", cat="user_annotation", ph="X", ts=30.0, dur=10.0, pid=1, tid=7),
        dict(name="cudaLaunchKernel", cat="cuda_runtime", ph="X", ts=31.0, dur=3.0, pid=1, tid=7, args=dict(correlation=2)),
        dict(name="cuLaunchKernel", cat="cuda_driver", ph="X", ts=35.0, dur=3.0, pid=1, tid=7, args=dict(correlation=3)),
        # device: kernels run later than their launches, on stream 7 of device 0
        dict(name="nvjet_gemm", cat="kernel", ph="X", ts=50.0, dur=8.0, pid=0, tid=7, args=dict(correlation=1)),
        dict(name="nvjet_gemm", cat="kernel", ph="X", ts=60.0, dur=5.0, pid=0, tid=7, args=dict(correlation=2)),
        dict(name="splitk_reduce", cat="kernel", ph="X", ts=66.0, dur=1.5, pid=0, tid=7, args=dict(correlation=3)),
    ]
    if with_gpu_spans:
        ev.append(dict(name="attn.q_proj", cat="gpu_user_annotation", ph="X", ts=49.0, dur=20.0, pid=0, tid=7))
    return dict(traceEvents=ev, lmcost={})


def test_scopes_take_the_kernels_their_launches_started():
    df = scope_times(_trace(), {"attn.q_proj", "ffn.down"}).set_index("name")
    assert df.loc["attn.q_proj", "measured_time_s"] == pytest.approx(8.0e-6)      # kernel 1
    assert df.loc["ffn.down", "measured_time_s"] == pytest.approx(6.5e-6)         # kernels 2 and 3: 5 + 1.5 us
    # the step's GPU span runs from the first kernel (50 us) to the end of the last (67.5 us)
    assert step_times(_trace()) == {"decode": {0: pytest.approx(17.5e-6)}}


def test_only_the_innermost_scope_with_a_gpu_span():
    # As the H200 trace had it: attn.q_proj has a GPU span (49-69 us, holding kernels 1-3 here), the step none.
    # The given span is used as it is (all three kernels: 14.5 us); the step gets one from its launches' kernels
    # (50-67.5 us), widened to cover the inner GPU span it overlaps (49-69 us): 20 us.
    t = _trace(with_gpu_spans=True)
    df = scope_times(t, {"attn.q_proj"}).set_index("name")
    assert df.loc["attn.q_proj", "measured_time_s"] == pytest.approx(14.5e-6)
    assert step_times(t) == {"decode": {0: pytest.approx(20.0e-6)}}


def test_a_trace_with_every_gpu_span_is_left_as_it_is():
    t = _trace(with_gpu_spans=True)
    t["traceEvents"] = [e for e in t["traceEvents"] if e["name"] not in ("lmcost.decode.0", "ffn.down")]
    assert gpu_annotations(t["traceEvents"]) is t["traceEvents"]
