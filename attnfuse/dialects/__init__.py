"""The two dialects: `attn` (what a variant computes) and `tile` (how one kernel computes it)."""

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin

from attnfuse.dialects.attn import Attn
from attnfuse.dialects.tile import Tile


def make_context() -> Context:
    """A context with builtin, attn and tile loaded: what AttnFuse's IR needs to parse."""
    ctx = Context()
    for dialect in (Builtin, Attn, Tile):
        ctx.load_dialect(dialect)
    return ctx
