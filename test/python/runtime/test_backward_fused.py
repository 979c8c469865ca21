"""The fused backward (`lower-to-tile{bwd-dq=fused}`, issue 17) through the real kernels.

`ATTNFUSE_BACKWARD=fused` with `af.compile(..., deterministic=False)` makes a training call's
program the fused one: the preprocess (softmax), `attention_bwd_dkdv_dq` (dK/dV adding each
block pair's dQ part into dq_acc with atomics) and `attention_bwd_dq_finish`. Gradients are
checked against the float64 reference with test_backward's bounds (`check_grads`), on tiny
shapes. `deterministic=True` (the default) and `torch.use_deterministic_algorithms` take the
same kernels with their adds in key-block order (`bwd-dq=ordered`, deterministic). A bias that
requires a gradient runs the dK/dV kernel's `_bias` copy, which also stores dbias.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("hypothesis")

from conftest import make_qkv
from test_backward import check_grads

import attnfuse as af
from attnfuse.errors import ArgumentError
from attnfuse.runtime.backward_choice import BACKWARD_ENV, backward_request
from attnfuse.runtime.reference import reference_gradients

pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("error::RuntimeWarning")]

FUSED = ["attention_bwd_dkdv_dq", "attention_bwd_dq_finish"]
SEPARATE = {"attention_bwd_dkdv", "attention_bwd_dq_delta"}


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.setenv(BACKWARD_ENV, "fused")


CASES = {
    "causal": (lambda: [af.causal()], {}),
    "window": (lambda: [af.sliding_window(9), af.causal()], {}),
    "alibi": (lambda: [af.alibi()], {}),
    "softcap": (lambda: [af.softcap(5.0)], {}),
    "rope-auto": (lambda: [af.rope(), af.causal()], {}),
    "rope-fused": (lambda: [af.rope(rotary_dim=16), af.causal()], {"placement": "fused"}),
    "gqa4-ragged": (lambda: [af.causal()], {"hq": 4, "hkv": 1, "nq": 37, "nk": 37}),
    "relu": (lambda: [af.relu()], {}),
    "lse-grad": (lambda: [af.causal()], {"lse_grad": True}),
    # GQA with Nq != Nk, both ragged: dq_acc's rows follow the loop's query head.
    "gqa2-nq-ne-nk": (lambda: [af.causal()], {"hq": 4, "hkv": 2, "nq": 29, "nk": 53}),
    # A head dim that is no power of two (padded columns, masked loads and adds).
    "head-dim-24": (lambda: [af.sliding_window(12)], {"d": 24}),
    # Interleaved RoPE over part of the head dim, pre-rotated (the backward rotates dK back).
    "rope-interleaved-partial": (lambda: [af.rope(rotary_dim=24, interleaved=True), af.causal()],
                                 {"hq": 4, "hkv": 2, "nq": 27, "nk": 40, "placement": "pre_rotated"}),
    # Relu with RoPE in bf16 (no delta, no preprocess; the rotation in the kernels).
    "relu-rope-bf16": (lambda: [af.rope(), af.relu()], {"dtype": torch.bfloat16, "placement": "fused"}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_gradients(fused, launched, name):
    """Every kernel the call ran is the fused backward's (no dQ kernel), and dq, dk, dv match
    the reference. Default shapes: Nq = 37 != Nk = 45, neither a multiple of the blocks."""
    blocks, options = CASES[name]
    spec = af.attention(*blocks())
    options = {"hq": 2, "nq": 37, "nk": 45, "d": 32} | options
    placement = options.pop("placement", "auto")
    fn = af.compile(spec, rope_placement=placement, deterministic=False)
    check_grads(spec, fn=fn, seed=3, placement=placement, **options)
    backward = [name for name in launched if name.startswith("attention_bwd")]
    assert backward[-2:] == FUSED and not SEPARATE & set(backward), backward


def test_fused_given_positions(fused, launched):
    """RoPE at call-time positions per batch (`q_positions=`, `k_positions=`), Llama-3 scaling."""
    spec = af.attention(af.rope(scaling=af.llama3_scaling(original_max_position=16)), af.causal())
    gen = torch.Generator().manual_seed(5)
    qp = torch.randint(0, 300, (2, 23), generator=gen)
    kp = torch.randint(0, 300, (2, 38), generator=gen)
    fn = af.compile(spec, rope_placement="pre_rotated", deterministic=False)
    check_grads(spec, fn=fn, b=2, hq=2, nq=23, nk=38, d=32, placement="pre_rotated", q_positions=qp, k_positions=kp)
    backward = [name for name in launched if name.startswith("attention_bwd")]
    assert backward[-2:] == FUSED and not SEPARATE & set(backward), backward


def test_fused_sigmoid(fused, launched):
    """Sigmoid attention (no delta, no preprocess), fp32, against the float64 reference's
    gradients directly (test_backward's emulation bound is written for softmax and relu)."""
    spec = af.attention(af.sigmoid(), af.causal())
    q, k, v = make_qkv(1, 2, None, 37, 45, 32, None, torch.float32, seed=9, requires_grad=True)
    out = af.compile(spec, deterministic=False)(q, k, v)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(10))
    out.backward(go)
    ref = reference_gradients(spec, q, k, v, go)
    for name, t in (("q", q), ("k", k), ("v", v)):
        err = (t.grad.double() - ref[name]).abs().max().item()
        assert err <= 2e-4 * ref[name].abs().max().item() + 1e-6, (name, err)
    assert [n for n in launched if n.startswith("attention_bwd")] == FUSED


def test_fused_half(fused, launched):
    """bf16 operands: dS is rounded to K's type for the dQ part, as for dK."""
    spec = af.attention(af.rope(), af.causal())
    fn = af.compile(spec, deterministic=False)
    check_grads(spec, fn=fn, hq=2, nq=24, nk=40, d=32, dtype=torch.bfloat16)
    assert launched[-2:] == FUSED


def _backward_kernels(fn, launched) -> list[str]:
    q, k, v = make_qkv(1, 2, None, 20, 20, 16, None, torch.float32, seed=5, requires_grad=True)
    launched.clear()
    fn(q, k, v).sum().backward()
    return [name for name in launched if name.startswith("attention_bwd")]


def test_deterministic_takes_the_ordered_backward(fused, launched):
    """deterministic=True (the default) never runs the unordered fused backward: asked for
    the fused one, it gets its adds in key-block order."""
    spec = af.attention(af.causal())
    fn = af.compile(spec)
    assert _backward_kernels(fn, launched)[-2:] == FUSED
    assert "dq_order" in fn.last.source


def test_deterministic_algorithms_take_the_ordered_backward(fused, launched):
    """torch.use_deterministic_algorithms(True) overrides deterministic=False: ordered adds."""
    spec = af.attention(af.causal())
    fn = af.compile(spec, deterministic=False)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert _backward_kernels(fn, launched)[-2:] == FUSED
        assert "dq_order" in fn.last.source
    finally:
        torch.use_deterministic_algorithms(previous)
    assert _backward_kernels(fn, launched)[-2:] == FUSED  # allowed again: unordered
    assert "dq_order" not in fn.last.source


def test_separate_and_auto(monkeypatch, launched):
    """ATTNFUSE_BACKWARD=separate, and auto on the CPU (no Gluon backward), keep the split."""
    spec = af.attention(af.causal())
    for request in ("separate", "auto"):
        monkeypatch.setenv(BACKWARD_ENV, request)
        assert not set(FUSED) & set(_backward_kernels(af.compile(spec, deterministic=False), launched))


BIAS_CASES = {
    # A full-size bias that requires a gradient: the `_bias` dK/dV kernel stores dbias.
    "full-grad": (lambda: [af.additive_bias(), af.causal()], (1, 2, 37, 45), True, {}),
    # Broadcast over batch and query rows (strides 0), GQA: dbias is summed onto the shape.
    "broadcast-gqa-grad": (lambda: [af.additive_bias(), af.causal()], (1, 4, 1, 45), True,
                           {"b": 2, "hq": 4, "hkv": 2}),
    # A bias without a gradient (a padding mask as a Hugging Face model passes it): the plain
    # fused dK/dV kernel, no dbias store.
    "no-grad": (lambda: [af.additive_bias(), af.causal()], (1, 1, 37, 45), False, {}),
    # RoPE and ALiBi around the bias: the VJP chain passes dS through both.
    "rope-alibi-grad": (lambda: [af.rope(), af.additive_bias(), af.alibi()], (1, 2, 37, 45), True,
                        {"placement": "pre_rotated"}),
}


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("name", list(BIAS_CASES))
def test_fused_bias(monkeypatch, launched, name, ordered):
    """An additive bias in the fused backward: dq, dk, dv and dbias against the reference; the
    call runs the fused kernels, the `_bias` dK/dV copy exactly when the bias requires a
    gradient (it then never runs the separate dQ-bias kernel)."""
    monkeypatch.setenv(BACKWARD_ENV, "ordered" if ordered else "fused")
    blocks, shape, grad, options = BIAS_CASES[name]
    spec = af.attention(*blocks())
    options = dict(options)
    placement = options.pop("placement", "auto")
    bias = torch.randn(*shape, generator=torch.Generator().manual_seed(7)).requires_grad_(grad)
    fn = af.compile(spec, rope_placement=placement, deterministic=ordered)
    check_grads(spec, fn=fn, bias=bias, placement=placement, seed=4, **options)
    backward = [n for n in launched if n.startswith("attention_bwd")]
    dkdv = "attention_bwd_dkdv_dq_bias" if grad else "attention_bwd_dkdv_dq"
    assert backward[-2:] == [dkdv, "attention_bwd_dq_finish"], backward
    assert not SEPARATE & set(backward) and "attention_bwd_dq_bias" not in backward, backward
    assert ("dq_order" in fn.last.source) == ordered
    if not grad:
        assert bias.grad is None


def test_bad_requests(monkeypatch):
    with pytest.raises(ArgumentError, match="deterministic"):
        af.compile(af.attention(af.causal()), deterministic="yes")
    monkeypatch.setenv(BACKWARD_ENV, "fast")
    with pytest.raises(ArgumentError, match=BACKWARD_ENV):
        backward_request()


def test_deterministic_algorithms_turned_on_before_the_backward(fused):
    """A forward planned with the fused backward, then deterministic algorithms turned on:
    its backward would run atomics, so it raises instead (as PyTorch's own
    non-deterministic ops do)."""
    fn = af.compile(af.attention(af.causal()), deterministic=False)
    q, k, v = (t.requires_grad_() for t in make_qkv(1, 2, nq=20, nk=20, d=16, seed=5))
    out = fn(q, k, v)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(af.AttnFuseError, match="use_deterministic_algorithms"):
            out.sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)


def test_deterministic_is_fixed_for_the_object():
    fn = af.compile(af.attention(af.causal()), deterministic=False)
    assert fn.deterministic is False
    with pytest.raises(AttributeError):
        fn.deterministic = True  # its plans and operators are keyed on it


# -- adds in key-block order (`bwd-dq=ordered`) ---------------------------------------------

ORDERED_CASES = ["causal", "window", "gqa2-nq-ne-nk", "rope-fused", "head-dim-24", "lse-grad", "relu-rope-bf16"]
"""The variants whose ordered backward runs through the interpreter: causal and windowed
bands (a query block's first key block waits for none), GQA with Nq != Nk, RoPE in the loops
(a counter per column part), padded columns, a log-sum-exp gradient, relu in bf16."""


@pytest.mark.parametrize("name", ORDERED_CASES)
def test_ordered_gradients(monkeypatch, launched, name):
    """`ATTNFUSE_BACKWARD=ordered` (the default deterministic=True): the fused kernels, their
    adds in key-block order (`dq_order`), gradients as the reference's. Small blocks (16 rows),
    so that every query block is added into by several key blocks and, under a window, a
    later query block's first key block is not the first of all."""
    monkeypatch.setenv(BACKWARD_ENV, "ordered")
    blocks, options = CASES[name]
    spec = af.attention(*blocks())
    options = {"hq": 2, "nq": 37, "nk": 45, "d": 32} | options
    placement = options.pop("placement", "auto")
    config = af.TileConfig(16, 16, 4, 1)
    fn = af.compile(spec, rope_placement=placement, config=config)
    check_grads(spec, fn=fn, seed=3, placement=placement, config=config, **options)
    backward = [name for name in launched if name.startswith("attention_bwd")]
    assert backward[-2:] == FUSED and not SEPARATE & set(backward), backward
    assert "dq_order" in fn.last.source


@pytest.mark.parametrize("nq", [33, 34], ids=["last-block-1-row", "last-block-2-rows"])
def test_ordered_column_parts_with_a_ragged_last_block(monkeypatch, launched, nq):
    """RoPE fused in the loops adds the dQ part by column parts; they share the query block's
    counter (its first row), so a last query block of 1 or 2 rows addresses no counter past
    n_q, with several heads (whose counters follow each other)."""
    monkeypatch.setenv(BACKWARD_ENV, "ordered")
    spec = af.attention(af.rope(rotary_dim=16), af.causal())
    config = af.TileConfig(16, 16, 4, 1)
    fn = af.compile(spec, rope_placement="fused", config=config)
    check_grads(spec, fn=fn, hq=3, nq=nq, nk=nq + 8, d=32, placement="fused", config=config)
    assert [n for n in launched if n.startswith("attention_bwd")][-2:] == FUSED


LISTED_CASES = {
    # Two sorted documents under causal.
    "documents-causal": (lambda: [af.document(), af.causal()],
                         lambda g: {"doc_ids": torch.tensor([0] * 20 + [1] * 25)}, {}),
    # Padding in the middle and document 3 in two places: a key block of document 3 visits
    # the first and the last query blocks, not those between (visitors not consecutive).
    "documents-unsorted": (lambda: [af.document()],
                           lambda g: {"doc_ids": torch.tensor([3] * 7 + [-1] * 5 + [1] * 20 + [3] * 13)}, {}),
    # Per-batch documents, GQA, Nq != Nk.
    "documents-gqa-batched": (lambda: [af.document(), af.causal()],
                              lambda g: {"doc_ids": torch.tensor([[0] * 30 + [1] * 23, [2] * 9 + [5] * 44])},
                              {"b": 2, "hq": 4, "hkv": 2, "nq": 37, "nk": 53}),
    # A block layout per head, random: each head's key blocks take their own turns.
    "block-sparse-heads": (lambda: [af.block_sparse(16), af.causal()],
                           lambda g: {"block_layout": torch.rand(2, 3, 3, generator=g) > 0.4}, {}),
}


@pytest.mark.parametrize("request_", ["ordered", "fused"])
@pytest.mark.parametrize("name", list(LISTED_CASES))
def test_block_lists_take_the_fused_backward(monkeypatch, launched, request_, name):
    """Block lists (documents, block sparsity): the key blocks visiting a query block need not
    be consecutive, so the ordered adds take each entry's turn from the lists' ranks
    (`*_q_rank`); the interpreter checks every turn (an add out of turn is NaN). Small blocks,
    so that query blocks have several visitors. Gradients as the float64 reference's."""
    monkeypatch.setenv(BACKWARD_ENV, request_)
    blocks, data, options = LISTED_CASES[name]
    spec = af.attention(*blocks())
    options = {"b": 1, "hq": 2, "hkv": None, "nq": 45, "nk": 45} | options
    kwargs = data(torch.Generator().manual_seed(2))
    q, k, v = make_qkv(options["b"], options["hq"], options["hkv"], options["nq"], options["nk"], 32, None,
                       torch.float32, seed=4, requires_grad=True)
    fn = af.compile(spec, deterministic=request_ == "ordered", config=af.TileConfig(16, 16, 4, 1))
    out = fn(q, k, v, **kwargs)
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    out.backward(go)
    ref = reference_gradients(spec, q, k, v, go, **kwargs)
    for grad_name, t in (("q", q), ("k", k), ("v", v)):
        err = (t.grad.double() - ref[grad_name]).abs().max().item()
        assert err <= 2e-4 * ref[grad_name].abs().max().item() + 1e-6, (grad_name, err)
    backward = [n for n in launched if n.startswith("attention_bwd")]
    assert backward[-2:] == FUSED and not SEPARATE & set(backward), backward
    assert ("rank = tl.load(" in fn.last.source) == (request_ == "ordered")
