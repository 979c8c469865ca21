"""Generate the dialect reference pages, `docs/dialects/<dialect>.md`, from the definitions.

    python -m attnfuse.tools.dialect_docs           # (re)write the pages
    python -m attnfuse.tools.dialect_docs --check   # exit 1 if a page is stale

Each page is built from what xDSL itself knows about the dialect: the docstring of the module
that defines it, every attribute and type (name, docstring), and every op (docstring, then its
IRDL definition: operands, results, properties, attributes, regions, successors, declarative
assembly format, traits). The pages are therefore never hand-edited: a test runs `--check` so a
changed op definition fails until the pages are regenerated.

Output is deterministic: ops and attributes are sorted by name, constraints are spelled from
their structure (never a `repr` with an address), and nothing depends on dict order.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from xdsl.dialects.builtin import ArrayOfConstraint
from xdsl.ir import Attribute, Dialect, Operation, TypeAttribute
from xdsl.irdl import (
    AnyAttr,
    AnyOf,
    BaseAttr,
    EqIntConstraint,
    OptionalDef,
    RangeLengthConstraint,
    RangeOf,
    SingleBlockRegionDef,
    VariadicDef,
    VarConstraint,
)

from attnfuse.dialects import make_context

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS_DIR = REPO_ROOT / "docs" / "dialects"
REGENERATE = "python -m attnfuse.tools.dialect_docs"


# --------------------------------------------------------------------------------------------
# What to document
# --------------------------------------------------------------------------------------------


def dialects() -> list[Dialect]:
    """The AttnFuse dialects `make_context()` provides, by name: xDSL's own (builtin, and any
    other it supplies, such as arith) are left out.

    Asks for each *registered* dialect by name rather than reading the loaded ones, so that a
    dialect the context registers lazily (built on first use) is documented too.
    """
    ctx = make_context()
    found = [ctx.get_dialect(name) for name in sorted(ctx.registered_dialect_names)]
    return [d for d in found if not all(m.startswith("xdsl.") for m in defining_modules(d))]


def defining_modules(dialect: Dialect) -> list[str]:
    """The modules defining the dialect's ops, then its attributes, in registration order."""
    classes = [*dialect.operations, *dialect.attributes]
    return [cls.__module__ for cls in classes]


def own_doc(cls: type) -> str:
    """The cleaned docstring `cls` itself declares, or "" when it declares none.

    Not `inspect.getdoc`: that falls back to a base class's docstring (IRDLOperation's, for an
    undocumented op), and an attribute without one gets the `Name(*parameters)` signature that
    `dataclass` writes in its place; neither documents the class.
    """
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def undocumented_ops(ops: Iterable[type[Operation]]) -> list[str]:
    """The names of the ops in `ops` that have no docstring of their own, sorted."""
    return sorted(op.name for op in ops if not own_doc(op))


def home_module(dialect: Dialect) -> str:
    """The module defining the dialect: the one that defines its first registered op.

    Ops may live in other modules (a block's file defines its own op), so a module named after
    the dialect (`attnfuse.dialects.attn`) wins over the first op's when it defines an op or
    attribute, and so does a package named after it (`attnfuse.dialects.tile`, whose
    submodules each define a group of its ops).
    """
    modules = defining_modules(dialect)
    named = [m for m in modules if m.rsplit(".", 1)[-1] == dialect.name]
    packaged = [m.rsplit(".", 1)[0] for m in modules if m.rsplit(".", 2)[-2:-1] == [dialect.name]]
    return (named or packaged or modules)[0]


def module_doc(module: str) -> str:
    """The cleaned docstring of an imported module ("" if it has none)."""
    return inspect.cleandoc(sys.modules[module].__doc__ or "")


def summary(module: str) -> str:
    """': ' and the first paragraph of a module's docstring on one line, or "" without one.

    The paragraph, not the first line: docstrings wrap, so a first line can stop mid-sentence.
    """
    paragraph = module_doc(module).split("\n\n", 1)[0]
    return f": {' '.join(paragraph.split())}" if paragraph else ""


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def attr_ref(attr: type[Attribute]) -> str:
    """How a page names an attribute class: `!attn.query` / `#attn.band`, or the Python class
    name for builtin ones (whose short names, e.g. `array`, are ambiguous)."""
    if "." not in attr.name:
        return f"`{attr.__name__}`"
    sigil = "!" if issubclass(attr, TypeAttribute) else "#"
    return f"`{sigil}{attr.name}`"


def describe(constr: object) -> str:
    """A constraint in words, from its structure; unknown kinds fall back to their repr."""
    match constr:
        case RangeLengthConstraint(constraint=inner, length=EqIntConstraint(value=1)):
            return describe(inner)  # what a single operand/result is wrapped in
        case RangeOf(constr=inner):
            return describe(inner)
        case VarConstraint(name=name, constraint=inner):
            return f"{describe(inner)} (type variable `{name}`: one type wherever it appears)"
        case AnyOf(attr_constrs=options):
            return " or ".join(describe(option) for option in options)
        case BaseAttr(attr=attr):
            return attr_ref(attr)
        case ArrayOfConstraint(elem_range_constraint=elements):
            return f"array of {describe(elements)}"
        case AnyAttr():
            return "any"
    # Strip object addresses so that an unforeseen constraint still renders the same each run.
    return f"`{re.sub(r' at 0x[0-9a-f]+', '', repr(constr))}`"


def kind(field: object) -> str:
    """' (optional)' / ' (variadic)' for a field definition of that arity, else ''."""
    if isinstance(field, OptionalDef):
        return " (optional)"
    if isinstance(field, VariadicDef):
        return " (variadic)"
    return ""


def field_line(name: str, field: object) -> str:
    """One bullet of an op's field list: name, arity, constraint (and default or block kind)."""
    if hasattr(field, "entry_args"):  # a region: its constraint is on the entry block's args
        blocks = "single block" if isinstance(field, SingleBlockRegionDef) else "any blocks"
        constraint = f"{blocks}, entry arguments: {describe(field.entry_args)}"
    elif hasattr(field, "constr"):
        constraint = describe(field.constr)
    else:  # a successor: nothing to constrain
        constraint = "a block"
    default = getattr(field, "default_value", None)
    suffix = f", default `{default}`" if default is not None else ""
    return f"- `{name}`{kind(field)}: {constraint}{suffix}"


def render_attribute(attr: type[Attribute]) -> str:
    """The section of one attribute or type."""
    what = "Type" if issubclass(attr, TypeAttribute) else "Attribute"
    lines = [f"## {attr_ref(attr)}", "", f"{what}, class `{attr.__name__}`."]
    if doc := own_doc(attr):
        lines += ["", doc]
    return "\n".join(lines)


def render_op(op: type[Operation], home: str) -> str:
    """The section of one op; `home` is its dialect's module. An op outside it is named with
    its module's summary; one in a submodule of a dialect package, with its module only."""
    op_def = op.get_irdl_definition()
    lines = [f"## `{op.name}`", "", f"Op, class `{op.__name__}`."]
    if op.__module__.startswith(home + "."):
        lines += ["", f"Defined in `{op.__module__}`."]
    elif op.__module__ != home:
        lines += ["", f"Defined in `{op.__module__}`{summary(op.__module__)}"]
    if doc := own_doc(op):
        lines += ["", doc]
    fields = {
        "Operands": op_def.operands,
        "Results": op_def.results,
        "Properties": sorted(op_def.properties.items()),
        "Attributes": sorted(op_def.attributes.items()),
        "Regions": op_def.regions,
        "Successors": op_def.successors,
    }
    for title, defs in fields.items():
        if defs:
            lines += ["", f"**{title}**", ""] + [field_line(name, d) for name, d in defs]
    if op_def.assembly_format:
        lines += ["", "**Assembly format**", "", "```", op_def.assembly_format, "```"]
    traits = sorted(type(trait).__name__ for trait in op_def.traits)
    if traits:
        lines += ["", "**Traits**: " + ", ".join(f"`{t}`" for t in traits)]
    return "\n".join(lines)


def render_dialect(dialect: Dialect) -> str:
    """The whole page of one dialect."""
    home = home_module(dialect)
    sections = [
        f"# The `{dialect.name}` dialect",
        f"<!-- Generated by `{REGENERATE}` from `{home}`: do not edit. -->",
        module_doc(home),
    ]
    sections += [render_attribute(a) for a in sorted(dialect.attributes, key=lambda a: a.name)]
    sections += [render_op(op, home) for op in sorted(dialect.operations, key=lambda o: o.name)]
    return "\n\n".join(s for s in sections if s) + "\n"


def pages() -> dict[str, str]:
    """File name -> content of every page, one per dialect."""
    return {f"{d.name}.md": render_dialect(d) for d in dialects()}


# --------------------------------------------------------------------------------------------
# Writing and checking
# --------------------------------------------------------------------------------------------


def write_pages(out_dir: Path = DOCS_DIR) -> list[Path]:
    """Write every page into `out_dir`; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in pages().items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_pages(out_dir: Path = DOCS_DIR) -> list[Path]:
    """The pages in `out_dir` that are missing or differ from what `write_pages` would write."""
    stale = []
    for name, text in pages().items():
        path = out_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
    return stale


def shown(path: Path) -> str:
    """A path as messages print it: relative to the repository when inside it."""
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: write the pages, or with `--check` report stale ones (exit 1)."""
    parser = argparse.ArgumentParser(description="Generate the dialect reference pages.")
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    parser.add_argument("--out-dir", type=Path, default=DOCS_DIR, help="default: docs/dialects")
    args = parser.parse_args(argv)
    out_dir = args.out_dir.resolve()
    if not args.check:
        for path in write_pages(out_dir):
            print(f"wrote {shown(path)}")
        return 0
    stale = stale_pages(out_dir)
    command = REGENERATE if out_dir == DOCS_DIR else f"{REGENERATE} --out-dir {out_dir}"
    for path in stale:
        print(f"{shown(path)} is stale: regenerate it with `{command}`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
