"""The dialect reference pages (`docs/dialects/`) are current, and every op is documented.

The pages are generated from the op definitions by `attnfuse.tools.dialect_docs`; these tests
fail when an op changed without the pages being regenerated, or when an op has no docstring.
"""

from __future__ import annotations

from xdsl.irdl import IRDLOperation, irdl_op_definition

from attnfuse.tools import dialect_docs as dd


def test_pages_are_current():
    stale = [dd.shown(path) for path in dd.stale_pages()]
    assert not stale, f"stale dialect pages {stale}: regenerate them with `{dd.REGENERATE}`"


def test_check_reports_a_stale_page(tmp_path, capsys):
    # The check itself works: fresh pages pass, an edited one fails and is named.
    dd.write_pages(tmp_path)
    assert dd.main(["--check", "--out-dir", str(tmp_path)]) == 0
    (tmp_path / "attn.md").write_text("# hand-edited\n")
    assert dd.main(["--check", "--out-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "attn.md is stale" in err and dd.REGENERATE in err


def test_every_op_has_a_docstring():
    ops = [op for dialect in dd.dialects() for op in dialect.operations]
    assert {"attn", "tile"} <= {dialect.name for dialect in dd.dialects()}
    assert dd.undocumented_ops(ops) == [], "add a class docstring to these ops"


def test_undocumented_ops_reports_an_op_without_a_docstring():
    # getdoc would hand the undocumented op IRDLOperation's docstring: the helper must not.
    @irdl_op_definition
    class UndocumentedOp(IRDLOperation):
        name = "fake.undocumented"

    @irdl_op_definition
    class DocumentedOp(IRDLOperation):
        """Documented."""

        name = "fake.documented"

    assert dd.undocumented_ops([DocumentedOp, UndocumentedOp]) == ["fake.undocumented"]


def test_attn_page_names_every_attn_op():
    (attn,) = [dialect for dialect in dd.dialects() if dialect.name == "attn"]
    path = dd.DOCS_DIR / "attn.md"
    assert path.is_file(), f"{dd.shown(path)} is missing: generate it with `{dd.REGENERATE}`"
    page = path.read_text(encoding="utf-8")
    missing = sorted(op.name for op in attn.operations if f"## `{op.name}`" not in page)
    assert not missing, f"{dd.shown(path)} lacks {missing}: regenerate it with `{dd.REGENERATE}`"
