"""bench/gluon_backward_probe.py's GPU checks, on the CPU: its float64 reference of attention's
gradients against autograd, and its check passing a right backward and failing a wrong one
(the kernels themselves need an H200: `python3 bench/gluon_backward_probe.py --out DIR`)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def probe():
    sys.path.insert(0, str(BENCH))
    try:
        import gluon_backward_probe

        yield gluon_backward_probe
    finally:
        sys.path.remove(str(BENCH))


def _autograd(q, k, v, do, causal):
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    s = qq @ kk.repeat_interleave(group, 1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).tril().logical_not(), -float("inf"))
    o = torch.softmax(s, -1) @ vv.repeat_interleave(group, 1)
    return (o, *torch.autograd.grad(o, (qq, kk, vv), do.double()))


@pytest.mark.parametrize("causal", [True, False])
def test_reference_matches_autograd(probe, causal):
    torch.manual_seed(0)
    q, do = torch.randn(2, 4, 48, 16), torch.randn(2, 4, 48, 16)
    k, v = torch.randn(2, 2, 48, 16), torch.randn(2, 2, 48, 16)
    o, lse, dq, dk, dv = probe.reference(q, k, v, do, causal)
    for got, want in zip((o, dq, dk, dv), _autograd(q, k, v, do, causal)):
        assert (got - want).abs().max().item() < 1e-10


class _Exact:
    """A stand-in for a variant's backward: the gradients from autograd in float32, one of
    them optionally scaled (a wrong kernel)."""

    wrong = None

    def __init__(self, name, q, k, v, o, lse, do, causal):
        self.inputs = (q, k, v, do, causal)

    def __call__(self):
        q, k, v, do, causal = self.inputs
        _, dq, dk, dv = _autograd(q, k, v, do, causal)
        grads = {"dq": dq, "dk": dk, "dv": dv}
        if self.wrong:
            grads[self.wrong] = grads[self.wrong] * 1.05
        return tuple(grads[n].to(q.dtype) for n in ("dq", "dk", "dv"))


@pytest.mark.parametrize("wrong", [None, "dq", "dk", "dv"])
def test_check_passes_a_right_backward_and_fails_a_wrong_one(probe, monkeypatch, tmp_path, wrong):
    monkeypatch.setattr(probe, "DEVICE", "cpu")
    monkeypatch.setattr(probe, "DTYPE", torch.float32)
    monkeypatch.setattr(probe, "CHECKS", [(True, 1, 4, 2, 128)])
    monkeypatch.setattr(probe, "CASES", [])
    # No cuDNN on the CPU: the calibration records the error and the 2e-2 floor applies;
    # AttnFuse's calibration (interpreted Triton here) is left out for time.
    monkeypatch.setattr(probe, "_attnfuse_grads", lambda *args: 1 / 0)
    refs = tmp_path / "refs.pt"
    probe.prepare_references(str(refs))
    monkeypatch.setattr(_Exact, "wrong", wrong)
    monkeypatch.setattr(probe, "Backward", _Exact)
    (row,) = probe.check_variant("wg2_tma", str(refs))
    assert row["ok"] is (wrong is None)
    if wrong:
        assert row[f"err_{wrong}"] > row[f"tol_{wrong}"]
