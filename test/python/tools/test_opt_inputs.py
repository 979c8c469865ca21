"""attnfuse-opt's inputs and targets: stdin (no file, or `-`), files of any name, and only the
targets that print AttnFuse IR (xDSL's others printed nothing and exited 0)."""

from __future__ import annotations

import contextlib
import io
import sys

import pytest

from attnfuse.tools.opt import main

VARIANT = """attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
"""


def run(args: list[str], stdin: str = "") -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of one in-process run."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(args)
    finally:
        sys.stdin = old
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("args", [[], ["-"]])
def test_stdin(args):
    code, out, err = run([*args, "-p", "canonicalize-attn"], VARIANT)
    assert (code, err) == (0, "")
    assert "attn.variant @attention" in out


def test_stdin_error_is_located():
    code, _out, err = run(["-"], VARIANT.replace("attn.scores", "attn.scorez"))
    assert code == 1
    assert err.startswith("stdin:2:")
    assert "attn.scorez is not registered" in err


@pytest.mark.parametrize("suffix", [".txt", ".ir", ""])
def test_any_file_name_is_mlir(tmp_path, suffix):
    path = tmp_path / f"variant{suffix}"
    path.write_text(VARIANT)
    code, out, err = run([str(path)])
    assert (code, err) == (0, "")
    assert "attn.softmax %s" in out


@pytest.mark.parametrize("target", ["wgsl", "csl", "wat", "llvm", "x86-asm"])
def test_only_attnfuse_targets(tmp_path, target):
    path = tmp_path / "variant.mlir"
    path.write_text(VARIANT)
    code, out, err = run([str(path), "-t", target])
    assert code == 1 and out == ""
    assert err.startswith("attnfuse-opt: error: ") and err.count("\n") == 1, err
    assert "invalid choice" in err and "(choose from mlir, triton, gluon)" in err


def test_mlir_target_prints_ir(tmp_path):
    path = tmp_path / "variant.mlir"
    path.write_text(VARIANT)
    code, out, _err = run([str(path), "-t", "mlir"])
    assert code == 0 and "attn.pv %p, %v" in out
