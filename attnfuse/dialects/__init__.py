"""The two dialects: `attn` (what a variant computes) and `tile` (how one kernel computes it)."""

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.math import Math
from xdsl.ir import Dialect

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
