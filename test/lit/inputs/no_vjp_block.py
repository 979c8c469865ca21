"""A block author's mistake for tools/out-of-tree-lowering-errors.mlir: `attn.square_scores`,
a modifier that is not additive (`s <- s * s`) and defines no `vjp`, lowered with the
backward. Reported at the op (canonicalize-attn moves it, not a copy, so its location stays)."""

from dataclasses import dataclass
from typing import Any

from xdsl.dialects import arith
from xdsl.ir import Operation, SSAValue
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, result_def, traits_def
from xdsl.traits import Pure

from attnfuse.dialects.attn import ScoresType
from attnfuse.dialects.interfaces import ScoreModifier


@dataclass(frozen=True)
class SquareScoresSemantics(ScoreModifier):
    """`s <- s * s`, with no derivative of its own."""

    additive: bool = False
    rank: int = 30

    def lower(self, op: Operation, kernel: Any, scores: SSAValue) -> SSAValue:
        def body(b: Any, args: Any) -> SSAValue:
            (s,) = args
            return b.insert(arith.MulfOp(s, s)).result

        return kernel.scalar_map([scores], "scores", body)

    def evaluate(self, op: Operation, scores: Any, env: Any) -> Any:
        return scores * scores


@irdl_op_definition
class SquareScoresOp(IRDLOperation):
    """Squares each score."""

    name = "attn.square_scores"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    assembly_format = "$input attr-dict"
    traits = traits_def(Pure(), SquareScoresSemantics())


OPS = (SquareScoresOp,)
