"""Two-batch overlap's schedule and DeepEP's SMs (lmcost.cost.wide_ep): the stage pairing worked by hand on a
step with linear parts, the SM share from DeepEP's figure over the GPU's SMs, and the metamorphic case that an
all-to-all holding no SMs (f = 0) leaves a communication-bound step at its all-to-alls plus the fill."""

from types import SimpleNamespace

import numpy as np
import pytest

from lmcost.cost import wide_ep
from lmcost.cost.engine_step import _Table
from lmcost.cost.wide_ep import DEEPEP_HT_SMS, WideEP, sm_share


def _stub(a: float, e: float, comm: float, layers: int = 2):
    """A WideEP under nccl (imbalance 1: dispatch = combine = comm / 2) and a step whose non-expert compute,
    experts and collectives cost a, e and comm seconds per token (tables linear in the tokens)."""
    xs = np.array([0, 1, 2, 4])
    parts = {"gemm.compute": a * xs, "experts.compute": e * xs, "comm": comm * xs}
    step = SimpleNamespace(tokens=_Table(xs, parts), scales={g: 1.0 for g in parts}, gpu=None)
    wide = object.__new__(WideEP)
    wide.kernel, wide.tbo, wide.layers = "nccl", True, layers
    wide.shape = dict(imbalance=1.0)
    return wide, step


def test_stages_worked_by_hand(monkeypatch):
    # T = 2: halves of 1 token. a0 = a1 = 1, e0 = e1 = 3, d0 = d1 = b0 = b1 = 3 (comm 6 a token), L = 2.
    # f = 0: st(1,3) + st(3,3) + st(3,3) + 1/2 st(1,3) + (1 + 3)/2 = 3 + 3 + 3 + 1.5 + 2 = 12.5
    # = M2 + a0 / L: the all-to-alls back to back and the first attention alone (the model before the stages:
    # max(C2, M2) + min(C2, M2) / 2L = 12 + 8/4 = 14).
    # No TBO: C + M = (1 + 3) x 2 + 6 x 2 = 20.
    wide, step = _stub(1.0, 3.0, 6.0)
    plain, run = wide.step_s(step, np.array([2]))
    assert float(plain[0]) == pytest.approx(20.0)
    assert float(run[0]) == pytest.approx(12.5)
    # f = 0.25: st(3, 3) = max(3, 3 + 0.75) = 3.75 twice; st(1, 3) = max(3, 1.75) = 3: 3 + 3.75 + 3.75 + 1.5 + 2 = 14
    monkeypatch.setattr(wide_ep, "sm_share", lambda kernel, gpu: 0.25)
    assert float(wide.step_s(step, np.array([2]))[1][0]) == pytest.approx(14.0)


def test_compute_bound_stages_lose_f_times_the_all_to_all(monkeypatch):
    # metamorphic: where every stage's compute exceeds its all-to-all, SMs held (f) cost exactly f x the
    # all-to-alls beside compute: D0 + D1 + B0 + B1 (L-1)/L = 1 + 1 + 1 + 0.5 = 3.5 here (comm 2 a token, L = 2)
    wide, step = _stub(4.0, 5.0, 2.0)
    base = float(wide.step_s(step, np.array([2]))[1][0])
    monkeypatch.setattr(wide_ep, "sm_share", lambda kernel, gpu: 0.2)
    assert float(wide.step_s(step, np.array([2]))[1][0]) - base == pytest.approx(0.2 * 3.5)


def test_sm_share_is_deepeps_sms_over_the_gpus():
    from lmcost.hardware.gpu import load_gpu

    h100 = load_gpu("h100")
    assert sm_share("deepep-ht", h100) == pytest.approx(24 / 132)  # DeepEP README's set_num_sms(24); H100 SXM 132 SMs
    assert DEEPEP_HT_SMS == 24
    assert sm_share("deepep-ll", h100) == 0.0  # hook-based: no SM held while waiting
    assert sm_share("nccl", h100) == 0.0
    assert sm_share("deepep-ht", SimpleNamespace(efficiency=None)) == 0.0


@pytest.mark.parametrize("a2a, share", [("deepep-ht", 24 / 132), ("deepep-ll", 0.0)])
def test_json_carries_the_sm_share_under_tbo(a2a, share):
    # the run's wide_ep.step names the SM share its TBO charged (DeepEP's 24 of the H100's 132, or none), and
    # the time TBO saved is the step without TBO less the staged one at the same tokens
    from lmcost.apps.serve import ServeRequest, prepare
    from lmcost.apps.serve_wide_ep import summary

    s = prepare(ServeRequest(model="deepseek-v3", gpu="h100", dtype="fp8", engine="sglang", ep=32, dp=32,
                             a2a=a2a, tbo=True), max_context=128)
    out = summary(s.wide_ep, 512.0)["step"]
    assert out["comm_sm_share"] == pytest.approx(share)
    plain, run = s.wide_ep["model"].step_s(s.wide_ep["step"], np.array([512.0]))
    assert out["overlap_saved_s"] == pytest.approx(float(plain[0] - run[0]))
    off = prepare(ServeRequest(model="deepseek-v3", gpu="h100", dtype="fp8", engine="sglang", ep=32, dp=32, a2a=a2a),
                  max_context=128)
    assert "comm_sm_share" not in summary(off.wide_ep, 512.0)["step"]
