"""Every scalar op the tile dialect admits in a `tile.map` body has a Triton rule: the
verifier's list (`tile.MAP_BODY_OPS`) and the printer's (`SCALAR_RULES`) must not drift apart."""

from __future__ import annotations

import pytest

from attnfuse.dialects import tile
from attnfuse.lowering import triton


@pytest.mark.parametrize("op_type", tile.MAP_BODY_OPS, ids=lambda t: t.name)
def test_every_admitted_op_prints(op_type):
    assert op_type in triton.SCALAR_RULES, f"{op_type.name} passes the verifier but has no Triton rule"


def test_comparisons_agree():
    assert set(triton.COMPARISONS) == set(tile.MAP_COMPARISONS)


@pytest.mark.parametrize("flags, printed", [
    (None, "tl.div_rn(a, b)"),
    ([], "tl.div_rn(a, b)"),
    (["nnan"], "tl.div_rn(a, b)"),
    (["afn"], "(a / b)"),
    (["arcp"], "(a / b)"),
    ("fast", "(a / b)"),
])
def test_division_is_correctly_rounded_unless_its_flags_allow_less(flags, printed):
    """`arith.divf` means the correctly rounded quotient: `tl.div_rn` (Triton's `/` on an
    NVIDIA GPU is up to 2 ulp off, and `floor(a / b)` of integers can then miss by one);
    the fast `/` only where fastmath allows an approximation."""
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import f32
    from xdsl.ir import Block

    a, b = Block(arg_types=[f32, f32]).args
    attribute = None if flags is None else arith.FastMathFlagsAttr(
        flags if isinstance(flags, str) else [arith.FastMathFlag(flag) for flag in flags])
    assert triton.scalar_expression(arith.DivfOp(a, b, attribute), ["a", "b"], set()) == printed
