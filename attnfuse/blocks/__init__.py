"""The building blocks, one file each.

Every module here defines one block completely: its DSL constructor (`af.alibi(...)`), its
`attn` op with verifier, and, through the interfaces of `attnfuse/dialects/interfaces.py`,
its algebra, its lowering to tile ops, its derivative, the call-time tensors it reads and its
float64 meaning. Nothing else in the package names a block: the passes, the runtime and the
reference ask the ops. Adding a block is adding a module here (found by `block_modules`)
and exporting its constructor from `attnfuse/__init__.py`.

The core every variant is built around (`attn.rope`, `attn.scores`, `attn.pv`) lives in
`attnfuse/dialects/attn.py` and `attnfuse/dsl/blocks.py`.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import re
from functools import cache
from types import ModuleType

from xdsl.ir import Dialect

from attnfuse.errors import CompositionError


_REGISTERED: list[ModuleType] = []
"""Block modules from outside this package (`register_block_module`), in registration order."""


@cache
def _package_modules() -> tuple[ModuleType, ...]:
    names = sorted(info.name for info in pkgutil.iter_modules(__path__) if not info.name.startswith("_"))
    return tuple(importlib.import_module(f"{__name__}.{name}") for name in names)


def block_modules() -> tuple[ModuleType, ...]:
    """Every block module of this package, imported, in name order, then the modules
    registered from outside it."""
    return (*_package_modules(), *_REGISTERED)


_GENERATION = [0]
"""Bumped whenever the registered modules change: what parsed program text is cached under
(`registry_generation`), so that text parsed before a change is parsed again after it."""


def registry_generation() -> int:
    """A number that changes whenever `register_block_module` or `unregister_block_module`
    changes the dialect."""
    return _GENERATION[0]


def block_module_problem(module: ModuleType) -> str | None:
    """Why `module` cannot join the `attn` dialect, or None. It lists its ops in `OPS` and its
    attributes in `ATTRIBUTES` (a module that only adds a mask predicate, a band mask built
    from `attn.mask`, has no op: `ATTRIBUTES` alone is enough). Refused: neither, an entry that
    is not an IRDL op (or attribute), a name outside the `attn.` namespace, or a name the
    dialect already has for another class (a core one, a package block's or another registered
    module's; a class another module defines and this one lists again is the same op)."""
    from xdsl.ir import Attribute
    from xdsl.irdl import IRDLOperation

    from attnfuse.dialects.attn import CORE_ATTRIBUTES, CORE_OPS

    ops = getattr(module, "OPS", ())
    attributes = getattr(module, "ATTRIBUTES", ())
    if not hasattr(module, "OPS") and not hasattr(module, "ATTRIBUTES"):
        return ("the module defines no OPS: a block module lists its ops in OPS (a non-empty tuple; "
                "or its attributes in ATTRIBUTES, for a module that adds only a mask predicate)")
    if not isinstance(ops, (tuple, list)) or not isinstance(attributes, (tuple, list)) or not (ops or attributes):
        return (f"OPS must list the module's ops (a non-empty tuple; or ATTRIBUTES its attributes, "
                f"for a module that adds only a mask predicate), got OPS = {ops!r}")
    # The names of every other module's ops and attributes (a module registered again, after
    # a reload, may keep its own), with their classes: a module may list a class another
    # module defines and lists (a block split over two files), which is one op, not two.
    others = [m for m in block_modules() if m is not module]
    taken_ops = {op.name: op for op in CORE_OPS} | {op.name: op for m in others for op in getattr(m, "OPS", ())}
    taken_attributes = ({a.name: a for a in CORE_ATTRIBUTES}
                        | {a.name: a for m in others for a in getattr(m, "ATTRIBUTES", ())})
    for entries, base, kind, taken in ((ops, IRDLOperation, "op", taken_ops),
                                       (attributes, Attribute, "attribute", taken_attributes)):
        listing = "OPS" if kind == "op" else "ATTRIBUTES"
        for entry in entries:
            if not (isinstance(entry, type) and issubclass(entry, base) and isinstance(getattr(entry, "name", None), str)):
                return f"{listing} holds {entry!r}, not an IRDL {kind} class"
            if not entry.name.startswith("attn."):
                return f"{kind} {entry.name!r} must be named attn.<name> (it joins the attn dialect)"
            other = taken.get(entry.name, entry)
            if other is not entry and entry.__module__ == module.__name__ and (
                    (other.__module__, other.__qualname__) == (entry.__module__, entry.__qualname__)):
                # The same class, defined again (importlib.reload of its module), while another
                # registered module still lists the old one (a block split over two files).
                return (f"{kind} {entry.name!r} is still listed, as it was before a reload, by another "
                        f"registered module: reload and register that module too (or unregister it)")
            if other is not entry:
                return (f"{kind} {entry.name!r} is already defined in the attn dialect (a core {kind}, a "
                        f"block's, or another registered module's): give it a name of its own")
            taken[entry.name] = entry
    return None


def registered_op(name: str) -> type | None:
    """The op class the `attn` dialect parses `name` as (core, package block or registered
    module), or None."""
    return next((op for op in attn_dialect().operations if op.name == name), None)


def registered_attribute(name: str) -> type | None:
    """The attribute class the `attn` dialect parses `#name` as, or None."""
    return next((attr for attr in attn_dialect().attributes if attr.name == name), None)


def register_block_module(module: ModuleType) -> None:
    """Adds a block module that lives outside this package (a research prototype, a test)
    to the `attn` dialect: laid out as a module here (§10.1 of docs/architecture.md), its
    `OPS` and `ATTRIBUTES` are registered by every context made after the call, so its op
    parses in `af.compile(text)` and `attnfuse-opt`-style tools run in this process. Its
    source joins the compile cache's fingerprint, so an edit never reuses stale kernels.
    Registering a module again (after `importlib.reload`) takes its current `OPS`; program
    text parsed before is parsed again. A `CompositionError` if the module cannot join the
    dialect (`block_module_problem`)."""
    if module in _package_modules():
        return
    problem = block_module_problem(module)
    if problem is not None:
        raise CompositionError(f"block module {getattr(module, '__file__', None) or module.__name__}: {problem}")
    if module not in _REGISTERED:
        _REGISTERED.append(module)
    # Registered again (after `importlib.reload`, say): its current OPS replace the old ones.
    _changed()


def unregistered_op_hint(message: str, remedy: str) -> str:
    """What to add to a parse error that names an `attn.` op the dialect does not have (xDSL's
    "Operation attn.x is not registered"): that an op of a block defined outside the package
    parses once its module is registered, and how (`remedy`); where modules are registered,
    the ops they define whose names are closest (a typo in the program or in the module).
    Empty for any other message."""
    found = re.search(r"Operation (attn\.[\w.]+) is not registered", message)
    if not found:
        return ""
    # Unique classes: a block split over two files lists its op in both.
    defined = [op.name for op in dict.fromkeys(op for module in _REGISTERED for op in getattr(module, "OPS", ()))]
    if not defined:
        return f" (if it is the op of a block defined outside the package: {remedy})"
    close = difflib.get_close_matches(found.group(1), defined, n=3, cutoff=0.6)
    listed = ", ".join(close or defined[:8]) + ("" if close or len(defined) <= 8 else ", ...")
    kind = "closest" if close else "ops"
    return (f" (the registered block modules define {len(defined)} op(s); {kind}: {listed}; if it is "
            f"the op of another block defined outside the package: {remedy})")


def unregister_block_module(module: ModuleType) -> None:
    """Removes a module `register_block_module` added (nothing if it was not registered)."""
    if module in _REGISTERED:
        _REGISTERED.remove(module)
        _changed()


def _changed() -> None:
    attn_dialect.cache_clear()
    _GENERATION[0] += 1


@cache
def attn_dialect() -> Dialect:
    """The `attn` dialect: the core ops and types, and every block's ops and attributes
    (each block module lists them in `OPS` and, if it has any, `ATTRIBUTES`)."""
    from attnfuse.dialects.attn import CORE_ATTRIBUTES, CORE_OPS

    # A class listed by two modules (one re-exporting the other's op) is registered once.
    ops = dict.fromkeys(CORE_OPS)
    attributes = dict.fromkeys(CORE_ATTRIBUTES)
    for module in block_modules():
        ops.update(dict.fromkeys(getattr(module, "OPS", ())))
        attributes.update(dict.fromkeys(getattr(module, "ATTRIBUTES", ())))
    return Dialect("attn", list(ops), list(attributes))


__all__ = ["attn_dialect", "block_module_problem", "block_modules", "register_block_module", "registered_attribute", "registered_op",
           "registry_generation", "unregister_block_module"]
