"""A block author's mistake for tools/out-of-tree-block.mlir: `attn.score_offset` defined
without its interface (no `ScoreModifier` among its traits), so the passes could not know it."""

from xdsl.dialects.builtin import FloatAttr
from xdsl.irdl import IRDLOperation, ParsePropInAttrDict, irdl_op_definition, operand_def, prop_def, result_def
from xdsl.irdl import traits_def
from xdsl.traits import Pure

from attnfuse.dialects.attn import ScoresType


@irdl_op_definition
class ScoreOffsetWithoutRoleOp(IRDLOperation):
    """`attn.score_offset` without its semantics."""

    name = "attn.score_offset"
    input = operand_def(ScoresType)
    result = result_def(ScoresType)
    offset = prop_def(FloatAttr)
    assembly_format = "$input attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())


OPS = (ScoreOffsetWithoutRoleOp,)
