"""A modifier that is not additive, from one file outside the package: `score_scale(factor)`,
`s <- s * factor` (`score_scale_block.py`, beside this file).

Where the user puts it among ALiBi and a bias is part of the variant's meaning (scaling before
ALiBi is not scaling after it), so specs that differ only there are different variants, each
compiled and run as written (not one answered with the other's kernels), while moves the
algebra allows (a filter anywhere; ALiBi and the bias swapped) still give one variant. The
interpreted kernels are checked against the float64 reference and a formula written by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from conftest import assert_close_to_reference, check_forward_backward, make_qkv
from xdsl.dialects.builtin import FloatAttr, f64
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def, prop_def
from xdsl.irdl import result_def, traits_def
from xdsl.traits import Pure

import score_scale_block
from score_scale_block import score_scale

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module
from attnfuse.dialects.attn import ScoresType
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import ArgumentError, IRError
from attnfuse.runtime.compiler import CompileKey, lower_spec
from attnfuse.runtime.config import TileConfig

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def registered():
    register_block_module(score_scale_block)
    yield
    unregister_block_module(score_scale_block)


def test_orders_that_mean_different_things_are_different_specs():
    scale = score_scale(1.7)
    assert af.attention(scale, af.alibi()) != af.attention(af.alibi(), scale)
    assert af.attention(scale, af.additive_bias()) != af.attention(af.additive_bias(), scale)
    # Moves the algebra allows: a filter anywhere, ALiBi and the bias swapped.
    assert af.attention(scale, af.causal(), af.alibi()) == af.attention(af.causal(), scale, af.alibi())
    assert hash(af.attention(scale, af.causal(), af.alibi())) == hash(af.attention(af.causal(), scale, af.alibi()))
    assert (af.attention(af.alibi(), af.additive_bias(), scale, af.relu())
            == af.attention(af.relu(), af.additive_bias(), af.alibi(), scale))
    assert af.attention(af.alibi(), af.additive_bias(), scale) != af.attention(af.alibi(), scale, af.additive_bias())
    # The soft-cap applies first (its own stage) whatever the user writes.
    assert af.attention(scale, af.softcap(20.0)) == af.attention(af.softcap(20.0), scale)


def alibi_formula(q, k, v, factor, scale_first):
    """softmax of the scaled dot product with ALiBi added and the scores multiplied by
    `factor`, before ALiBi (`scale_first`) or after, in float64."""
    heads, nq, nk, d = q.shape[1], q.shape[2], k.shape[2], q.shape[3]
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], dtype=torch.float64)
    distance = torch.arange(nk, dtype=torch.float64)[None, :] - (torch.arange(nq, dtype=torch.float64)[:, None] + nk - nq)
    alibi = slopes.view(1, -1, 1, 1) * distance
    s = (s * factor + alibi) if scale_first else (s + alibi) * factor
    return torch.softmax(s, -1) @ v.double()


def test_each_order_runs_its_own_kernels():
    """Both orders compiled and called in one process: each output is its own formula's
    (they differ by far more than the tolerance), forward and backward."""
    q, k, v = make_qkv(1, 2, 2, 24, 40, 16, seed=3)
    factor = 2.5
    first = af.attention(score_scale(factor), af.alibi())
    second = af.attention(af.alibi(), score_scale(factor))
    expected = [alibi_formula(q, k, v, factor, True), alibi_formula(q, k, v, factor, False)]
    assert (expected[0] - expected[1]).abs().max() > 1e-2
    for spec, formula in zip((first, second), expected):
        assert (spec(q, k, v).double() - formula).abs().max() < 1e-5, spec
        assert (af.compile(spec)(q, k, v).double() - formula).abs().max() < 1e-5, spec
        check_forward_backward(spec, q, k, v)


@pytest.mark.parametrize("normalizer", [af.relu(), af.sigmoid(), af.softmax()], ids=["relu", "sigmoid", "softmax"])
def test_kernels_forward_backward(normalizer):
    q, k, v = make_qkv(1, 2, 1, 29, 37, 16, seed=5)
    check_forward_backward(af.attention(af.causal(), af.alibi(), score_scale(0.6), normalizer), q, k, v)


@dataclass(frozen=True)
class ForwardOnlySemantics(score_scale_block.ScoreScaleSemantics):
    """score_scale's semantics without its vjp: the default's (an additive modifier's)."""

    vjp = ScoreModifier.vjp

    @staticmethod
    def factor(op):
        return op.factor.value.data


@irdl_op_definition
class ForwardOnlyScaleOp(IRDLOperation):
    """`attn.score_scale` without a derivative."""

    name = "attn.forward_only_scale"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    factor = prop_def(FloatAttr)
    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), ForwardOnlySemantics())

    def __init__(self, scores, factor):
        super().__init__(operands=[scores], result_types=[ScoresType()], properties={"factor": FloatAttr(factor, f64)})


@dataclass(frozen=True, repr=False)
class ForwardOnlyScale(Block):
    factor: float = 1.0
    category: ClassVar[str] = "modifier"

    def build(self, variant, value):
        return ForwardOnlyScaleOp(value, self.factor)


def test_a_modifier_without_a_derivative_runs_forward_only():
    """A modifier that is not additive and defines no vjp: the default `vjp` (derivative 1)
    refuses it rather than compute a wrong gradient. Its variant still runs forward (its
    programs have no backward kernels), and a call that autograd would record is refused
    naming the op; `lower-to-tile` asked for a backward refuses it, at the op."""
    assert not ForwardOnlySemantics().has_derivative and score_scale_block.ScoreScaleSemantics().has_derivative
    spec = af.attention(ForwardOnlyScale(2.5), af.alibi(), af.causal())
    q, k, v = make_qkv(1, 2, 2, 20, 28, 16, seed=4)
    reference = af.reference_attention(af.attention(score_scale(2.5), af.alibi(), af.causal()), q, k, v)
    assert_close_to_reference(spec(q, k, v), reference, torch.float32)
    leaf = q.clone().requires_grad_()
    with torch.no_grad():
        assert_close_to_reference(spec(leaf, k, v), reference, torch.float32)
    with pytest.raises(ArgumentError, match="'attn.forward_only_scale' has no derivative"):
        spec(leaf, k, v)
    # Traced, the call is refused at the forward too (not at the backward it would reach).
    with pytest.raises(ArgumentError, match="'attn.forward_only_scale' has no derivative"):
        torch.compile(lambda q: spec(q, k, v), backend="aot_eager")(leaf)
    with pytest.raises(af.AttnFuseError, match="'attn.forward_only_scale' is not additive .* must define vjp") as err:
        lower_spec(spec, CompileKey(16, 16, "f32", TileConfig(16, 16, 4, 1), None))
    assert isinstance(err.value.__cause__, IRError) and isinstance(err.value.__cause__.op, ForwardOnlyScaleOp)
