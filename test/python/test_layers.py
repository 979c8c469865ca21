"""The layers depend one way (DESIGN.md: DSL -> IR -> passes -> tile -> Triton -> runtime):
checked on the source's import statements, wherever in a module they are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attnfuse

PACKAGE = Path(attnfuse.__file__).parent

FORBIDDEN = {
    "dsl": ("attnfuse.runtime", "attnfuse.transforms", "attnfuse.lowering"),
    "dialects": ("attnfuse.runtime", "attnfuse.transforms", "attnfuse.lowering", "attnfuse.dsl"),
    "transforms": ("attnfuse.runtime", "attnfuse.lowering", "attnfuse.dsl"),
    "lowering": ("attnfuse.runtime", "attnfuse.transforms", "attnfuse.dsl", "attnfuse.blocks"),
    "runtime": ("attnfuse.dsl",),
    "blocks": ("attnfuse.runtime", "attnfuse.transforms", "attnfuse.lowering"),
}
"""For each layer, the packages it must never import."""

SANCTIONED = {("dsl/spec.py", "attnfuse.runtime.api")}
"""The one way a lower layer reaches the runtime: a spec runs itself (`spec(q, k, v)`) through
`runtime.api.compiled_form`, imported inside the call, so the DSL loads no runtime until a spec
is called (it went through the package's lazy `attnfuse.compile` before, which the check could
not see; the direct import is what lets torch.compile trace a spec's first call)."""


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` statement of `path` names."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_one_way(layer):
    offenders = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / layer).glob("*.py"))
        for name in imported_modules(path)
        if name.startswith(FORBIDDEN[layer]) and (str(path.relative_to(PACKAGE)), name) not in SANCTIONED
    }
    assert not offenders, sorted(offenders)


def test_the_check_sees_imports_inside_functions(tmp_path):
    """A lazy import counts: the check must not be fooled by moving an import into a body."""
    module = tmp_path / "lazy.py"
    module.write_text("def f():\n    from attnfuse.runtime.api import compile\n")
    assert "attnfuse.runtime.api" in imported_modules(module)
