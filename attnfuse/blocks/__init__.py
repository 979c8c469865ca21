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

import importlib
import pkgutil
from functools import cache
from types import ModuleType

from xdsl.ir import Dialect


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


def register_block_module(module: ModuleType) -> None:
    """Adds a block module that lives outside this package (a research prototype, a test)
    to the `attn` dialect: laid out as a module here (§10.1 of docs/architecture.md), its
    `OPS` and `ATTRIBUTES` are registered by every context made after the call, so its op
    parses in `af.compile(text)` and `attnfuse-opt`-style tools run in this process. Its
    source joins the compile cache's fingerprint, so an edit never reuses stale kernels."""
    if module not in _REGISTERED and module not in _package_modules():
        _REGISTERED.append(module)
        attn_dialect.cache_clear()


def unregister_block_module(module: ModuleType) -> None:
    """Removes a module `register_block_module` added (nothing if it was not registered)."""
    if module in _REGISTERED:
        _REGISTERED.remove(module)
        attn_dialect.cache_clear()


@cache
def attn_dialect() -> Dialect:
    """The `attn` dialect: the core ops and types, and every block's ops and attributes
    (each block module lists them in `OPS` and, if it has any, `ATTRIBUTES`)."""
    from attnfuse.dialects.attn import CORE_ATTRIBUTES, CORE_OPS

    ops = list(CORE_OPS)
    attributes = list(CORE_ATTRIBUTES)
    for module in block_modules():
        ops += getattr(module, "OPS", ())
        attributes += getattr(module, "ATTRIBUTES", ())
    return Dialect("attn", ops, attributes)


__all__ = ["attn_dialect", "block_modules", "register_block_module", "unregister_block_module"]
