"""A band mask defined outside the package with no op of its own (`lookahead_block.py`:
`#attn.lookahead<n>`, `k_pos <= q_pos + n`), registered through `ATTRIBUTES` alone; and a
block whose op takes the name of an op the dialect already has, refused when its program is
built (its text would parse as the other op).

The kernels are checked against the mask written out here in float64, not the library's
reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
from conftest import check_against_formula, make_qkv
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_attr_definition, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

import lookahead_block
from lookahead_block import lookahead

import attnfuse as af
from attnfuse.blocks import register_block_module, unregister_block_module
from attnfuse.blocks.masks import MaskOp
from attnfuse.dialects.attn import MaskPredicate, ScoresType
from attnfuse.dialects.interfaces import ScoreModifier
from attnfuse.dsl.blocks import Block
from attnfuse.errors import CompositionError

pytestmark = pytest.mark.interpreter


@pytest.fixture(autouse=True)
def registered():
    register_block_module(lookahead_block)
    yield
    unregister_block_module(lookahead_block)


def lookahead_formula(q, k, v, steps: int):
    """Softmax attention over keys `j <= i + (Nk - Nq) + steps` (bottom-right aligned), in
    float64, GQA by repeating the key/value heads."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    nq, nk = q.shape[2], k.shape[2]
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    keep = torch.arange(nk)[None, :] <= (nk - nq + torch.arange(nq) + steps)[:, None]
    return torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("steps", [0, 5, 40])
def test_kernels_match_the_mask(steps):
    q, k, v = make_qkv(b=1, hq=4, hkv=2, nq=40, nk=48, d=16, seed=2, requires_grad=True)
    check_against_formula(af.attention(lookahead(steps)), lambda q, k, v: lookahead_formula(q, k, v, steps),
                          q, k, v, seed=3)


def test_intersects_with_package_masks_and_parses_back():
    """Its band meets causal's in analyze-masks (lookahead 7 and causal: causal), and the
    program's text parses back to the same kernels."""
    spec = af.attention(af.causal(), lookahead(7))
    assert "#attn.lookahead<7>" in spec.ir()
    q, k, v = make_qkv(b=1, hq=2, nq=33, nk=33, d=16, seed=4)
    expected = lookahead_formula(q, k, v, 0)
    torch.testing.assert_close(spec(q, k, v).double(), expected, rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(af.compile(spec.ir())(q, k, v).double(), expected, rtol=2e-5, atol=2e-6)


def test_bad_steps():
    with pytest.raises(CompositionError, match="lookahead: steps must be an int"):
        lookahead(-1)


@dataclass(frozen=True)
class _Doubling(ScoreModifier):
    rank: int = 30

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        raise AssertionError("never lowered: the program is refused when built")

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        return 2 * scores


@irdl_op_definition
class _ClashingSoftcapOp(IRDLOperation):
    """An op a block author names like the package's `attn.softcap`, with another meaning."""

    name = "attn.softcap"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), _Doubling())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[ScoresType()])


@dataclass(frozen=True, repr=False)
class _Clashing(Block):
    category: ClassVar[str] = "modifier"
    hint: ClassVar[str] = "doubled"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return _ClashingSoftcapOp(value)


def test_an_op_named_like_another_is_refused():
    """Unregistered, the block's op would print as `attn.softcap` and parse back as the
    package's soft-capping: a different program under the same text."""
    with pytest.raises(CompositionError, match=r"builds attn.softcap as .*_ClashingSoftcapOp, but the attn dialect's "
                                                r"attn.softcap is attnfuse.blocks.softcap.SoftcapOp"):
        af.attention(_Clashing()).ir()


def test_the_compile_cache_key_holds_the_predicate_code(monkeypatch):
    """The predicate's `band()` is the block's whole meaning, and it lives in an attribute, not
    an op: an edit to it must change the compile cache's key as an op's would."""
    from attnfuse.runtime.code_fingerprint import foreign_fingerprint
    from attnfuse.runtime.program import as_program

    def fingerprint() -> str:
        return foreign_fingerprint(as_program(af.attention(af.causal(), lookahead(3))).module((False, False)))

    before = fingerprint()
    assert before == fingerprint()
    monkeypatch.setattr(lookahead_block.LookaheadAttr, "band", lambda self: (None, self.steps.data + 1))
    assert fingerprint() != before


@irdl_attr_definition
class _ClashingCausalAttr(MaskPredicate):
    """A predicate a block author names like the package's `#attn.causal`, with another band."""

    name = "attn.causal"

    def band(self) -> tuple[int | None, int | None]:
        return (None, 3)


@dataclass(frozen=True, repr=False)
class _ClashingMask(Block):
    category: ClassVar[str] = "mask"
    hint: ClassVar[str] = "kept"

    def build(self, variant: Any, value: SSAValue) -> Operation:
        return MaskOp(value, [_ClashingCausalAttr()])


def test_a_predicate_named_like_another_is_refused():
    """Its text, `#attn.causal`, would parse back as the package's causal predicate."""
    with pytest.raises(CompositionError, match=r"builds attn.causal as .*_ClashingCausalAttr, but the attn "
                                                r"dialect's attn.causal is attnfuse.blocks.masks.CausalAttr"):
        af.attention(_ClashingMask()).ir()
