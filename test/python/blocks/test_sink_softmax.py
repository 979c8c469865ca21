"""An out-of-tree normalizer with a log-sum-exp whose partials do not merge through it:
`sink_softmax()` (`sink_softmax_block.py`), softmax with a sink of score 0,
`p = exp(s) / (1 + sum exp(s))`.

Split-KV decoding merges the splits' partial outputs through their log-sum-exps, which is exact
for softmax only: each split of this normalizer counts the sink once, so a split decode would
divide by `S + sum exp(s)` for S splits. The normalizer leaves `merges_splits` False, and every
call, decode-sized or not, must match the formula written out here in float64 (not the library's
reference). Its initial row sum is a constant `tile.map`, which the kernels must broadcast to a
tile (it printed as a Python scalar before).
"""

from __future__ import annotations

import pytest
import torch
from conftest import check_against_formula, make_qkv

import sink_softmax_block
from sink_softmax_block import sink_softmax

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def registered():
    register_block_module(sink_softmax_block)
    yield
    unregister_block_module(sink_softmax_block)


def sink_formula(q, k, v, *, causal: bool, kv_lens=None, logit: float = 0.0):
    """`sum_j exp(s_ij) v_j / (exp(logit) + sum_j exp(s_ij))` over the kept keys, in float64:
    causal is bottom-right aligned (query i of Nq sits at position L - Nq + i, L the
    sequence's keys)."""
    q, k, v = (t.double() for t in (q, k, v))
    b, hq, nq, d = q.shape
    k = k.repeat_interleave(hq // k.shape[1], dim=1)
    v = v.repeat_interleave(hq // v.shape[1], dim=1)
    s = q @ k.transpose(-1, -2) / d**0.5
    nk = k.shape[2]
    out = torch.empty(b, hq, nq, v.shape[-1], dtype=torch.float64)
    for batch in range(b):
        length = nk if kv_lens is None else int(kv_lens[batch])
        keys = torch.arange(nk)
        keep = keys[None, :] < length
        if causal:
            keep = keep & (keys[None, :] <= (length - nq + torch.arange(nq))[:, None])
        weights = torch.exp(s[batch]).masked_fill(~keep, 0.0)
        out[batch] = weights @ v[batch] / (torch.exp(torch.tensor(logit, dtype=torch.float64))
                                           + weights.sum(-1, keepdim=True))
    return out


@pytest.mark.parametrize("nq", [1, 4])
@pytest.mark.parametrize("cached", [False, True], ids=["plain", "kv_lens"])
def test_decode_sized_calls_match_the_formula(nq, cached):
    # Long enough that softmax's decode would split the keys (several programs per sequence).
    q, k, v = make_qkv(b=2, hq=4, hkv=2, nq=nq, nk=512, d=16, seed=3)
    fn = af.compile(af.attention(af.causal(), sink_softmax()))
    call = {}
    if cached:
        call["kv_lens"] = torch.tensor([512, 300], dtype=torch.int32)
    with torch.no_grad():
        out = fn(q, k, v, **call)
    expected = sink_formula(q, k, v, causal=True, kv_lens=call.get("kv_lens"))
    torch.testing.assert_close(out.double(), expected, rtol=2e-5, atol=2e-6)


def test_softmax_itself_still_splits():
    """The same shape decodes through the split kernels under softmax (so the test above
    covers the path it guards)."""
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=1, nk=512, d=16, seed=3)
    fn = af.compile(af.attention(af.causal(), af.softmax()))
    problem_calls = []
    original = type(fn).decodes

    def spy(self, problem, training):
        result = original(self, problem, training)
        problem_calls.append(result)
        return result

    type(fn).decodes = spy
    try:
        with torch.no_grad():
            fn(q, k, v)
    finally:
        type(fn).decodes = original
    assert problem_calls and all(problem_calls)


@pytest.mark.parametrize("nq, nk", [(24, 40), (72, 16)], ids=["nq<nk", "rows-without-keys"])
def test_training_matches_the_formula(nq, nk):
    """With Nq > Nk the first query block keeps no key (bottom-right causal): its rows are 0,
    their lse log(1) = 0, and the loop over key blocks never runs (the constant row sum must
    still be a tile)."""
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=nq, nk=nk, d=16, seed=5, requires_grad=True)
    spec = af.attention(af.causal(), sink_softmax())
    out, lse = spec(q, k, v, return_lse=True)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = sink_formula(qd, kd, vd, causal=True)
    torch.testing.assert_close(out.double(), expected.detach(), rtol=2e-5, atol=2e-6)
    s = (qd @ kd.repeat_interleave(2, dim=1).transpose(-1, -2) / 4.0).detach()
    keep = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq))[:, None]
    expected_lse = torch.log1p(torch.exp(s).masked_fill(~keep, 0.0).sum(-1))
    torch.testing.assert_close(lse.double(), expected_lse, rtol=2e-5, atol=2e-5)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad)
    expected.backward(grad.double())
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_which_normalizers_split_the_keys():
    """`partials_merge`: the package's normalizers declare it; a subclass that changes the
    forward (this sink, softmax's subclass with another `init_state`) does not inherit it; one
    that declares it again has it."""
    from dataclasses import dataclass

    from attnfuse.blocks.relu import ReluSemantics
    from attnfuse.blocks.sigmoid import SigmoidSemantics
    from attnfuse.blocks.softmax import SoftmaxSemantics
    from attnfuse.dialects.interfaces import partials_merge

    @dataclass(frozen=True)
    class DeclaredAgain(sink_softmax_block.SinkSoftmaxSemantics):
        merges_splits: bool = True

    assert partials_merge(SoftmaxSemantics()) and partials_merge(ReluSemantics())
    assert partials_merge(SigmoidSemantics())
    assert not partials_merge(sink_softmax_block.SinkSoftmaxSemantics())
    assert partials_merge(DeclaredAgain())


def test_documents_with_kv_lens_need_the_split_kernels():
    """document() with kv_lens= runs only on the split decode kernels, which this normalizer
    cannot take: refused with what is missing, not with "needs a decode-sized call"."""
    q, k, v = make_qkv(b=1, hq=2, nq=1, nk=32, d=16, seed=1)
    fn = af.compile(af.attention(af.document(), sink_softmax()))
    call = {"kv_lens": torch.tensor([20], dtype=torch.int32), "doc_ids": torch.zeros(32, dtype=torch.int32)}
    with torch.no_grad(), pytest.raises(af.ArgumentError, match="needs the split decode kernels, which "
                                                               "attn.sink_softmax cannot take"):
        fn(q, k, v, **call)


def test_a_reloaded_block_module_must_be_registered_again():
    """After `importlib.reload`, the module's op is another class under the same name: the
    message says to register the module again (not to rename the op). The module's original
    classes are put back after, for the other tests in this process."""
    import importlib

    from attnfuse.errors import CompositionError

    original = dict(vars(sink_softmax_block))
    af.attention(sink_softmax()).ir()  # the dialect now holds the module's op class
    try:
        spec = af.attention(importlib.reload(sink_softmax_block).sink_softmax())
        with pytest.raises(CompositionError, match="its module was reloaded\\): register the module again"):
            spec.ir()
        register_block_module(sink_softmax_block)
        assert "attn.sink_softmax" in spec.ir()
    finally:
        vars(sink_softmax_block).update(original)
        register_block_module(sink_softmax_block)


@pytest.mark.parametrize("logit", [1.5, -3.0, 40.0])
@pytest.mark.parametrize("nq", [1, 24])
def test_a_sink_logit_starts_the_row_max_in_base_two_units(logit, nq):
    """A sink of another score starts the online softmax's row max at `logit * log2(e)`, the
    units `tile.softmax_update` carries (`Normalizer.init_state`): forward (the one-pass decode
    at Nq = 1, the plain kernel at 24) and gradients as the formula's. A start in natural units
    was off by 0.065 at logit 2."""
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=nq, nk=40, d=16, seed=7, requires_grad=True)
    check_against_formula(af.attention(af.causal(), sink_softmax(logit)),
                          lambda q, k, v: sink_formula(q, k, v, causal=True, logit=logit), q, k, v, seed=2)
