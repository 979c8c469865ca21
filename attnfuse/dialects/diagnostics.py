"""Diagnostics for IR text: where an op was parsed, which op fails its verifier, and xDSL's
messages said in AttnFuse's words. Shared by `attnfuse-opt` (tools/opt.py) and
`af.compile(text)` (runtime/program.py)."""

import re
from collections.abc import Iterable

from xdsl.context import Context
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException
from xdsl.utils.lexer import Span

WRONG_BASE = re.compile(r"(.*) should be of base attribute ([\w.]+)", re.DOTALL)
"""xDSL's message for a property or attribute of the wrong kind: the value, then the kind."""


class OpLocatingParser(Parser):
    """A parser whose errors from constraints checked while an op is parsed (a property's
    type, an operand constraint of its format) are located at that op: xDSL raises them as
    `VerifyException`s without a place, and the op never exists for a verifier to name.
    Given `locations`, it records where each op it parses starts (by the op's id), so that a
    verifier's error can be located later (`location_of`)."""

    def __init__(self, ctx: Context, text: str, name: str = "<unknown>",
                 locations: dict[int, Span] | None = None):
        super().__init__(ctx, text, name)
        self.locations = locations

    def parse_operation(self) -> Operation:
        span = self._current_token.span
        try:
            op = super().parse_operation()
        except VerifyException as err:
            raise ParseError(span, self._name_the_property(span, str(err)) or str(err)) from err
        if self.locations is not None:
            self.locations[id(op)] = span
        return op

    def _name_the_property(self, span: Span, message: str) -> str | None:
        """xDSL's "X should be of base attribute T" for a property or attribute of the op at
        `span`, said with the name it was given under ("attn.softcap: property 'cap' must be a
        float attribute, got 3 : i64"), where exactly one of the op's properties of base T is
        written in its text; None where that cannot be told."""
        found = WRONG_BASE.fullmatch(message)
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
        return wrong_type_message(named.group(1), "property", candidates[0], found)


def innermost_failing_op(ops: Iterable[Operation]) -> tuple[Operation, str] | None:
    """Of `ops` and everything nested in them, the innermost op whose own verifier fails, and
    its message (`first_line`); None if every one verifies.

    Innermost first: a parent's verifier may read its children (a variant reads its rotations'
    properties) and fail obscurely where the child reports the real problem. Any exception
    counts as a failure: this runs while an error is being reported."""
    found: list[tuple[int, Operation, str]] = []
    for top in ops:
        for op in top.walk():
            try:
                op.verify(verify_nested_ops=False)
            except Exception as err:  # noqa: BLE001 - reporting, never re-raising
                depth, parent = 0, op.parent_op()
                while parent is not None:
                    depth, parent = depth + 1, parent.parent_op()
                message = first_line(err)
                found.append((depth, op, wrong_typed_property(op, message) or message))
    if not found:
        return None
    _depth, op, message = max(found, key=lambda f: f[0])
    return op, message


def wrong_typed_property(op: Operation, message: str) -> str | None:
    """xDSL's "X should be of base attribute T" from `op`'s verifier, said with the name of the
    one property or attribute of `op` that holds X ("attn.softcap: property 'cap' must be a
    float attribute, got "big"", as `OpLocatingParser` says it of an op's custom form); None
    for any other message, or where no single one holds it."""
    found = WRONG_BASE.fullmatch(message)
    if found is None:
        return None
    held = [(kind, name) for kind, values in (("property", op.properties), ("attribute", op.attributes))
            for name, value in values.items() if str(value) == found.group(1)]
    if len(held) != 1:
        return None
    kind, name = held[0]
    return wrong_type_message(op.name, kind, name, found)


def wrong_type_message(op_name: str, kind: str, name: str, found: re.Match[str]) -> str:
    """"attn.softcap: property 'cap' must be a float attribute, got 3 : i64", from a
    `WRONG_BASE` match of xDSL's message."""
    return f"{op_name}: {kind} '{name}' must be a {found.group(2)} attribute, got {found.group(1)}"


def first_line(err: BaseException) -> str:
    """An error's message without xDSL's "Operation does not verify" wrapping (and the IR it
    prints after it): its first line."""
    text = str(err).strip()
    match = re.search(r"Operation does not verify: (.*)", text)
    if match:
        return match.group(1).strip()
    return text.splitlines()[0] if text else type(err).__name__


def location_of(op: Operation | None, locations: dict[int, Span]) -> str | None:
    """`name:line:col` where `op` (or the nearest op enclosing it) was parsed, per `locations`
    (`OpLocatingParser`'s); None if none of them was."""
    while op is not None:
        span = locations.get(id(op))
        if span is not None:
            return str(span.get_location())
        op = op.parent_op()
    return None
