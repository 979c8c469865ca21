"""The Triton expression of each scalar op a `tile.map` body may hold (`arith`, `math`), and the
helper functions some of them call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import FloatAttr
from xdsl.ir import Operation

from attnfuse.dialects import tile
from attnfuse.errors import AttnFuseError

BINARY_OPERATORS: dict[type[Operation], str] = {
    arith.AddfOp: "+",
    arith.SubfOp: "-",
    arith.MulfOp: "*",
    arith.AndIOp: "&",  # on i1 (comparisons): Triton's boolean tiles take the bitwise operators
    arith.OrIOp: "|",
    arith.XOrIOp: "^",
}

CALLS: dict[type[Operation], str] = {
    math.ExpOp: "tl.exp",
    math.LogOp: "tl.log",
    math.SqrtOp: "tl.sqrt",
    math.AbsFOp: "tl.abs",
    math.TanhOp: "_tanh",
    math.FloorOp: "tl.floor",
}
"""Elementwise functions; `_tanh` is a helper of the generated module (`HELPERS`)."""

COMPARISONS = {"oeq": "==", "olt": "<", "ole": "<=", "ogt": ">", "oge": ">="}
"""`arith.cmpf` predicates (`tile.MAP_COMPARISONS`: ordered, false when either side is NaN,
as these operators are)."""

HELPERS = {
    "_tanh": '''@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1 loses digits near 0 (cancellation): use the series there.
    # Below 0.4 the odd series to x^11 is within an fp32 ulp; above, the form is within ~7 ulp.
    x2 = x * x
    series = x * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0 - x2 * (
        62.0 / 2835.0 - x2 * (1382.0 / 155925.0))))))
    return tl.where(tl.abs(x) < 0.4, series, 2.0 * tl.sigmoid(2.0 * x) - 1.0)
''',
}
"""Helper functions the printed kernels may call, printed once into the module if used."""


def _constant(op: arith.ConstantOp, operands: list[str]) -> str:
    value = op.value
    assert isinstance(value, FloatAttr)
    number = float(value.value.data)
    # As fp32, which the verifier's types say the body computes in: a constant past fp32's
    # range is inf there (never printed as a bare `inf`, which is not Python).
    return repr(number) if abs(number) <= 3.4028234663852886e38 else f'float("{number}")'


def _comparison(op: arith.CmpfOp, operands: list[str]) -> str:
    predicate = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
    if predicate not in COMPARISONS:
        raise AttnFuseError(f"the Triton target cannot print arith.cmpf {predicate}")
    return f"({operands[0]} {COMPARISONS[predicate]} {operands[1]})"


def _division(op: arith.DivfOp, operands: list[str]) -> str:
    """`arith.divf` as MLIR defines it, correctly rounded: `tl.div_rn` (Triton's `/` on an
    NVIDIA GPU is `div.full.f32`, up to 2 ulp off, which a `floor` of the quotient can turn
    into an off-by-one), unless its fastmath flags allow an approximation (`afn`, `arcp`,
    `fast`), which prints the faster `/`."""
    flags = op.fastmath.data if op.fastmath is not None else ()
    if tile.APPROXIMATE_DIVISION & set(flags):
        return f"({operands[0]} / {operands[1]})"
    return f"tl.div_rn({operands[0]}, {operands[1]})"


def _binary(symbol: str) -> Callable[[Operation, list[str]], str]:
    return lambda op, operands: f"({operands[0]} {symbol} {operands[1]})"


def _nan_propagating(fn: str) -> Callable[[Operation, list[str]], str]:
    # maximumf/minimumf propagate NaN (MLIR's semantics); tl.maximum alone would drop it.
    return lambda op, operands: f"{fn}({operands[0]}, {operands[1]}, propagate_nan=tl.PropagateNan.ALL)"


SCALAR_RULES: dict[type[Operation], Callable[[Any, list[str]], str]] = {
    arith.ConstantOp: _constant,
    **{op_type: _binary(symbol) for op_type, symbol in BINARY_OPERATORS.items()},
    arith.DivfOp: _division,
    arith.NegfOp: lambda op, operands: f"(-{operands[0]})",
    arith.MaximumfOp: _nan_propagating("tl.maximum"),
    arith.MinimumfOp: _nan_propagating("tl.minimum"),
    arith.CmpfOp: _comparison,
    arith.SelectOp: lambda op, operands: f"tl.where({operands[0]}, {operands[1]}, {operands[2]})",
    **{op_type: (lambda name: lambda op, operands: f"{name}({operands[0]})")(name)
       for op_type, name in CALLS.items()},
}
"""How each scalar op of a `tile.map` body prints, its operands already printed (applied to
tiles, every rule is elementwise). `tile.MAP_BODY_OPS` is what the verifier admits; a test
checks that each has a rule."""


def scalar_expression(op: Operation, operands: list[str], helpers: set[str]) -> str:
    """The Triton expression of one `arith`/`math` op of a map body (`SCALAR_RULES`); records
    the helpers it calls in `helpers`."""
    rule = SCALAR_RULES.get(type(op))
    if rule is None:
        raise AttnFuseError(f"the Triton target cannot print {op.name} in a tile.map body")
    if CALLS.get(type(op)) in HELPERS:
        helpers.add(CALLS[type(op)])
    return rule(op, operands)
