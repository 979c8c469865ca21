"""Every attribute an op carries, nested ones included: what the compile cache fingerprints
(an attribute defined outside the package is part of a program's meaning: a mask predicate's
`band()`) and what the DSL checks against the registered dialect (`build_ir.check_op_name`)."""

from __future__ import annotations

from collections.abc import Iterator

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr
from xdsl.ir import Attribute, Operation, ParametrizedAttribute


def nested_attributes(attribute: Attribute) -> Iterator[Attribute]:
    """`attribute` and the attributes inside it (array elements, dictionary values, the
    parameters of a parametrized attribute), depth first."""
    yield attribute
    if isinstance(attribute, ArrayAttr):
        inner = attribute.data
    elif isinstance(attribute, DictionaryAttr):
        inner = tuple(attribute.data.values())
    elif isinstance(attribute, ParametrizedAttribute):
        inner = attribute.parameters
    else:
        inner = ()
    for part in inner:
        if isinstance(part, Attribute):
            yield from nested_attributes(part)


def op_attributes(op: Operation) -> Iterator[Attribute]:
    """Every attribute of `op`'s properties and attribute dictionary, nested ones included."""
    for attribute in (*op.properties.values(), *op.attributes.values()):
        yield from nested_attributes(attribute)


__all__ = ["nested_attributes", "op_attributes"]
