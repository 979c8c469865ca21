"""The two dialects: `attn` (what a variant computes) and `tile` (how one kernel computes it)."""

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.math import Math
from xdsl.ir import Dialect, Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from attnfuse.dialects.tile import Tile


def dialects() -> tuple[Dialect, ...]:
    """Every dialect AttnFuse IR uses: builtin, arith and math (the bodies of `tile.map`),
    attn (assembled from its core and the blocks, `attnfuse.blocks.attn_dialect`) and tile."""
    from attnfuse.blocks import attn_dialect

    return (Builtin, Arith, Math, attn_dialect(), Tile)


def make_context() -> Context:
    """A context with every dialect of `dialects()` loaded: what AttnFuse's IR needs to parse."""
    ctx = Context()
    for dialect in dialects():
        ctx.load_dialect(dialect)
    return ctx


class OpLocatingParser(Parser):
    """A parser whose errors from constraints checked while an op is parsed (a property's
    type, an operand constraint of its format) are located at that op: xDSL raises them as
    `VerifyException`s without a place, and the op never exists for a verifier to name."""

    def parse_operation(self) -> Operation:
        span = self._current_token.span
        try:
            return super().parse_operation()
        except VerifyException as err:
            raise ParseError(span, str(err)) from err
