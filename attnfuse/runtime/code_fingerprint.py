"""The code a compiled program depends on outside this package, as a hash for the compile
cache's key (`compiler._cache_key`): an out-of-tree block's op, its semantics, its lowering,
and whatever of the user's code and data they reach, so that an edited prototype never reuses
the kernels of its previous version (docs/architecture.md §10.1).

What is hashed is the code *as loaded* (the file may have changed since): of each module that
defines one of the program's op, trait or attribute classes, and of every module of the user's
that such a module reaches (transitively): by a name it holds (`import helper`, `from helper
import f`), or by an import inside one of its functions (`_imported_in`), a namespace
package's submodules included. A user's module is one outside this package, xDSL, the standard
library and installed packages (`_is_user_module`). Of each: the marshalled bytecode of its
functions and its classes' methods, and its data: numbers, strings and (nested) tuples,
lists, sets and dicts of them (`_loaded_code`). Objects of other kinds (instances, partials)
are not hashed.

The hash is the same in every process for the same code (no ids, no hash-seeded order), so a
later run finds the kernels an earlier one stored.
"""

from __future__ import annotations

import dis
import hashlib
import marshal
import re
import site
import sys
import sysconfig
from pathlib import Path
from types import CodeType, FunctionType, ModuleType

from xdsl.dialects.builtin import ModuleOp

from attnfuse.dialects.attribute_walk import op_attributes

_PLAIN = (bool, int, float, complex, str, bytes, type(None))

_SHELL_HISTORY = re.compile(r"^(In|Out|_+|_i+|_i\d+|_\d+|_oh|_ih|_dh)$")
"""Names an interactive shell (IPython, Jupyter) keeps in `__main__` for its history of inputs
and outputs: they change with every cell run, and no lowering reads them."""

MAX_DATA_DEPTH = 8
"""How deep nested data is followed (deeper items hash as `?`)."""


def foreign_fingerprint(module: ModuleOp) -> str:
    """A hash of the code of the program's ops defined outside this package and of the
    user's code and data it reaches (the module docstring)."""
    classes: set[type] = set()
    for op in module.walk():
        classes.add(type(op))
        classes.update(type(trait) for trait in getattr(op, "traits", ()))
        classes.update(type(attribute) for attribute in op_attributes(op))
    # Every module defining one (a notebook's `__main__` too), then the user modules they reach.
    pending = sorted({cls.__module__ for cls in classes if not cls.__module__.startswith(("attnfuse.", "xdsl."))})
    seen: set[str] = set()
    digest = hashlib.sha256()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        digest.update(name.encode())
        code = sys.modules.get(name)
        if code is None:
            # An op class whose module is not loaded (made by path without registering it):
            # its class's own code stands for it.
            for cls in sorted((c for c in classes if c.__module__ == name), key=lambda c: c.__qualname__):
                digest.update(_class_code(cls))
            continue
        digest.update(_loaded_code(code))
        pending.extend(sorted(_user_modules_reached(code) - seen))
    return digest.hexdigest()


def _library_roots() -> tuple[str, ...]:
    """Where the standard library and installed packages live: sysconfig's paths, the site
    and user site directories, and every `site-packages` / `dist-packages` on the path."""
    roots = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    # (An old virtualenv's site module has neither function.)
    site_dirs = getattr(site, "getsitepackages", list)()
    user_dir = getattr(site, "getusersitepackages", lambda: None)()
    roots.update(site_dirs if isinstance(site_dirs, list) else [])
    if isinstance(user_dir, str):
        roots.add(user_dir)
    roots.update(entry for entry in sys.path if Path(entry).name in ("site-packages", "dist-packages"))
    return tuple(sorted({str(Path(root).resolve()) for root in roots if root}))


_LIBRARY_ROOTS = _library_roots()


def _outside_libraries(path: str) -> bool:
    return not str(Path(path).resolve()).startswith(_LIBRARY_ROOTS)


def _is_user_module(name: str) -> bool:
    """Whether module `name` is loaded and a user's (a block module, a helper beside it): not
    this package, not xDSL, not built in and not under the libraries' directories. A namespace
    package (no file) is one when a directory of its path is."""
    if name == "attnfuse" or name.startswith(("attnfuse.", "xdsl.")) or name in ("xdsl", "builtins"):
        return False
    code = sys.modules.get(name)
    if code is None:
        return False  # not loaded: nothing to hash (a function of it is hashed where it is held)
    return _is_user_file(code)


def _is_user_file(code: ModuleType) -> bool:
    path = getattr(code, "__file__", None)
    if isinstance(path, str):
        return _outside_libraries(path)
    locations = getattr(code, "__path__", None)  # a namespace package
    try:
        return locations is not None and any(_outside_libraries(str(p)) for p in locations)
    except TypeError:
        return False


def _module_name_of(value: object) -> str | None:
    """The module an object held by a module comes from (itself, if a module), or None."""
    if isinstance(value, ModuleType):
        return value.__name__
    if isinstance(value, (type, FunctionType)):
        name = getattr(value, "__module__", None)
        return name if isinstance(name, str) else None
    return None


def _user_modules_reached(code: ModuleType) -> set[str]:
    """The user modules (`_is_user_module`) that `code` reaches: the modules it holds, the
    modules of the functions and classes it holds, a package's submodules, and the modules its
    functions import when they run (`_imported_in`)."""
    reached: set[str] = set()
    for value in list(vars(code).values()):
        name = _module_name_of(value)
        if name is not None and name != code.__name__ and _is_user_module(name):
            reached.add(name)
    for body in _own_code(code):
        for name in _imported_in(body):
            for candidate in _prefixes(name):
                if candidate != code.__name__ and _is_user_module(candidate):
                    reached.add(candidate)
    return reached


def _prefixes(name: str) -> list[str]:
    """`a.b.c` -> `a`, `a.b`, `a.b.c` (an import loads each)."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported_in(body: CodeType) -> set[str]:
    """The absolute module names a function's code (and its nested functions') imports."""
    names: set[str] = set()
    stack = [body]
    while stack:
        current = stack.pop()
        previous: list[dis.Instruction] = []
        for instruction in dis.get_instructions(current):
            if instruction.opname == "IMPORT_NAME":
                # The level (0: absolute) is the constant loaded two instructions before.
                level = previous[-2].argval if len(previous) >= 2 else 0
                if level == 0 and isinstance(instruction.argval, str):
                    names.add(instruction.argval)
            previous.append(instruction)
        stack.extend(c for c in current.co_consts if isinstance(c, CodeType))
    return names


def _own_code(code: ModuleType) -> list[CodeType]:
    """The code objects of the module's own functions and its classes' methods."""
    return [body for _name, member in _own_members(code) for _suffix, body in _member_codes(member)]


def _own_members(code: ModuleType) -> list[tuple[str, object]]:
    """(name, object) of what the module defines itself, its classes' attributes named
    `Class.attribute`, in name order."""
    members: list[tuple[str, object]] = []
    for name, value in sorted(vars(code).items(), key=lambda item: item[0]):
        if isinstance(value, type) and value.__module__ == code.__name__:
            members += [(f"{name}.{attribute}", member)
                        for attribute, member in sorted(vars(value).items(), key=lambda item: item[0])]
        elif isinstance(value, FunctionType) and value.__module__ == code.__name__:
            members.append((name, value))
    return members


def _member_codes(member: object) -> list[tuple[str, CodeType]]:
    """(suffix, bytecode) of a function, a static or class method, or a property's accessors
    (`.fget`, `.fset`); nothing for anything else."""
    target = getattr(member, "__func__", member)
    if isinstance(target, property):
        return [(f".{name}", body) for name in ("fget", "fset")
                for _suffix, body in _member_codes(getattr(target, name))]
    body = getattr(target, "__code__", None) if isinstance(target, FunctionType) else None
    return [("", body)] if isinstance(body, CodeType) else []


def _code_bytes(body: CodeType) -> bytes:
    """A function's bytecode, without where it was defined (a file moved keeps its kernels)."""
    return marshal.dumps(body.replace(co_filename="", co_firstlineno=1))


def _member_parts(name: str, member: object) -> list[bytes]:
    """What is hashed of one member: its bytecode, else its data (`_data_text`), else nothing."""
    codes = _member_codes(member)
    if codes:
        return [f"{name}{suffix}".encode() + _code_bytes(body) for suffix, body in codes]
    text = _data_text(member)
    return [] if text is None else [f"{name}={text}".encode()]


def _class_code(cls: type) -> bytes:
    """A class's own code and data: what stands for an op class whose module is not loaded."""
    return b"\n".join(part for attribute, member in sorted(vars(cls).items(), key=lambda item: item[0])
                      for part in _member_parts(f"{cls.__qualname__}.{attribute}", member))


def _loaded_code(code: ModuleType) -> bytes:
    """The module's code as loaded: the bytecode of its own functions and its classes' methods
    (static and class methods, properties' accessors) and of a function imported from a module
    that is not loaded (a file run by path, which no walk reaches), and its data
    (`_data_text`), which a lowering may read. An interactive session's history is left out."""
    interactive = code.__name__ == "__main__" and getattr(code, "__file__", None) is None
    own = dict(_own_members(code))
    parts: list[bytes] = []
    for name, value in sorted(vars(code).items(), key=lambda item: item[0]):
        if (interactive and _SHELL_HISTORY.match(name)) or name.startswith("__"):
            continue
        if isinstance(value, FunctionType) and value.__module__ not in sys.modules:
            own.setdefault(name, value)
        elif name not in own and not isinstance(value, type) and (text := _data_text(value)) is not None:
            parts.append(f"{name}={text}".encode())
    for name, member in sorted(own.items(), key=lambda item: item[0]):
        parts += _member_parts(name, member)
    return b"\n".join(parts)


def _data_text(value: object, depth: int = 0, within: frozenset[int] = frozenset(),
               memo: dict[int, str | None] | None = None) -> str | None:
    """A text that changes when `value`'s data does: plain values by `repr`; tuples, lists,
    sets and dicts by their items' (sets and dicts in a fixed order; a container inside itself
    as `<cycle>`, one met twice read once); a function by its bytecode's hash. None for
    anything else (an object with no data of its own to a lowering), and `?` for items nested
    past `MAX_DATA_DEPTH`."""
    if isinstance(value, _PLAIN):
        return repr(value)
    if isinstance(value, FunctionType):
        codes = _member_codes(value)
        return None if not codes else f"code:{hashlib.sha256(_code_bytes(codes[0][1])).hexdigest()[:16]}"
    if not isinstance(value, (tuple, list, set, frozenset, dict)):
        return None
    if depth >= MAX_DATA_DEPTH:
        return "?"
    if id(value) in within:
        return "<cycle>"
    memo = {} if memo is None else memo
    if id(value) in memo:
        return memo[id(value)]
    inner = within | {id(value)}

    def item(x: object) -> str:
        return _data_text(x, depth + 1, inner, memo) or "?"

    if isinstance(value, (tuple, list)):
        text = f"{type(value).__name__}({', '.join(item(x) for x in value)})"
    elif isinstance(value, (set, frozenset)):
        text = f"set({', '.join(sorted(item(x) for x in value))})"
    else:
        text = f"dict({', '.join(sorted(f'{item(k)}: {item(v)}' for k, v in value.items()))})"
    memo[id(value)] = text
    return text


__all__ = ["foreign_fingerprint"]
