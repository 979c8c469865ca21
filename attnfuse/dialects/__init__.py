"""The two dialects: `attn` (what a variant computes) and `tile` (how one kernel computes it)."""

import re

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin
from xdsl.dialects.math import Math
from xdsl.ir import Dialect, Operation
from xdsl.parser import Parser
from xdsl.utils.lexer import Span
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
            raise ParseError(span, self._name_the_property(span, str(err)) or str(err)) from err

    def _name_the_property(self, span: Span, message: str) -> str | None:
        """xDSL's "X should be of base attribute T" for a property or attribute of the op at
        `span`, said with the name it was given under ("attn.softcap: property 'cap' must be a
        float attribute, got 3 : i64"), where exactly one of the op's properties of base T is
        written in its text; None where that cannot be told."""
        found = re.fullmatch(r"(.*) should be of base attribute ([\w.]+)", message, re.DOTALL)
        if found is None:
            return None
        text = span.input.content[span.start:self._current_token.span.start]
        # The op's name: what follows its results' `=` (a result may itself be named with dots).
        named = re.match(r'\s*(?:%[^=]*=\s*)?"?([A-Za-z_][\w$]*(?:\.[\w$]+)+)', text)
        op_type = None if named is None else self.ctx.get_optional_op(named.group(1))
        if op_type is None or not hasattr(op_type, "get_irdl_definition"):
            return None
        definition = op_type.get_irdl_definition()
        candidates = [name for name, field in {**definition.properties, **definition.attributes}.items()
                      if getattr(getattr(field.constr, "attr", None), "name", None) == found.group(2)
                      and re.search(rf"\b{re.escape(name)}\s*=", text)]
        if len(candidates) != 1:
            return None
        return (f"{named.group(1)}: property '{candidates[0]}' must be a {found.group(2)} attribute, "
                f"got {found.group(1)}")
