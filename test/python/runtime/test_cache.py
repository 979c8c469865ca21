"""The on-disk kernel cache (attnfuse.runtime.cache)."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
import torch
from conftest import assert_close_to_reference, make_qkv

import attnfuse as af
from attnfuse.lowering.triton import KernelInfo, TritonProgram
from attnfuse.runtime import cache
from attnfuse.runtime import compiler

SOURCE = '''"""A fake generated module."""

import triton
import triton.language as tl

VALUE = 42
'''

PROGRAM = TritonProgram(
    SOURCE,
    (KernelInfo(name="attention_fwd", roles=("q", "k", "v", "o", "lse"), grid="query_blocks",
                block_m=32, num_warps=4, num_stages=1),),
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh, writable cache directory for one test."""
    directory = tmp_path / "kernels"
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(directory))
    monkeypatch.setattr(cache, "_fallback_dir", None)
    return directory


class Counter:
    def __init__(self, program: TritonProgram = PROGRAM):
        self.calls = 0
        self.program = program

    def __call__(self) -> TritonProgram:
        self.calls += 1
        return self.program


def test_session_uses_a_temporary_cache_dir(attnfuse_cache_dir):
    assert os.environ["ATTNFUSE_CACHE_DIR"] == attnfuse_cache_dir
    assert cache.cache_dir() == Path(attnfuse_cache_dir)


def test_cache_dir_respects_environment(cache_dir):
    assert not cache_dir.exists()
    assert cache.cache_dir() == cache_dir
    assert cache_dir.is_dir()  # created on demand, nested parents included


def test_cache_dir_default_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("ATTNFUSE_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(cache, "_fallback_dir", None)
    assert cache.cache_dir() == tmp_path / ".cache" / "attnfuse"


def test_store_writes_source_and_sidecar(cache_dir):
    path = cache.store("abc123", PROGRAM)
    assert path == cache_dir / "abc123.py"
    assert path.read_text() == SOURCE
    meta = json.loads((cache_dir / "abc123.json").read_text())
    assert "sha256" in meta and meta["kernels"][0]["name"] == "attention_fwd"
    # No temporary files left behind.
    assert sorted(p.name for p in cache_dir.iterdir()) == ["abc123.json", "abc123.py"]


def test_lookup_round_trip(cache_dir):
    assert cache.lookup("abc123") is None
    cache.store("abc123", PROGRAM)
    found = cache.lookup("abc123")
    assert found is not None
    program, path = found
    assert program == PROGRAM
    assert path == cache_dir / "abc123.py"


def test_get_or_build_builds_once(cache_dir):
    build = Counter()
    program, path = cache.get_or_build("k1", build)
    assert build.calls == 1 and program == PROGRAM and path.exists()
    program2, path2 = cache.get_or_build("k1", build)
    assert build.calls == 1, "a valid entry must be reused"
    assert program2 == PROGRAM and path2 == path


CORRUPTIONS = {
    "py-truncated": lambda d: (d / "k.py").write_text(SOURCE[: len(SOURCE) // 2]),
    "py-empty": lambda d: (d / "k.py").write_text(""),
    "py-edited": lambda d: (d / "k.py").write_text(SOURCE.replace("42", "43")),
    "py-missing": lambda d: (d / "k.py").unlink(),
    "py-binary": lambda d: (d / "k.py").write_bytes(b"\xff\xfe\x00garbage"),
    "json-truncated": lambda d: (d / "k.json").write_text((d / "k.json").read_text()[:20]),
    "json-empty": lambda d: (d / "k.json").write_text(""),
    "json-missing": lambda d: (d / "k.json").unlink(),
    "json-not-object": lambda d: (d / "k.json").write_text("[1, 2, 3]"),
    "json-wrong-hash": lambda d: (d / "k.json").write_text(
        json.dumps({**json.loads((d / "k.json").read_text()), "sha256": "0" * 64})
    ),
    "json-no-kernels": lambda d: (d / "k.json").write_text(
        json.dumps({"sha256": json.loads((d / "k.json").read_text())["sha256"]})
    ),
    "json-bad-kernel-fields": lambda d: (d / "k.json").write_text(
        json.dumps({"sha256": json.loads((d / "k.json").read_text())["sha256"], "kernels": [{"nom": 1}]})
    ),
    "json-kernels-not-list": lambda d: (d / "k.json").write_text(
        json.dumps({"sha256": json.loads((d / "k.json").read_text())["sha256"], "kernels": 5})
    ),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_entry_is_detected_and_rebuilt(cache_dir, corruption):
    cache.store("k", PROGRAM)
    CORRUPTIONS[corruption](cache_dir)
    assert cache.lookup("k") is None, f"{corruption} must read as a missing entry"
    build = Counter()
    program, path = cache.get_or_build("k", build)
    assert build.calls == 1
    assert program == PROGRAM
    assert path.read_text() == SOURCE
    # The rebuilt entry is valid again.
    assert cache.lookup("k") == (PROGRAM, path)


def test_unwritable_dir_falls_back_with_warning(tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running with privileges that ignore directory permissions (root)")
        monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(locked))
        monkeypatch.setattr(cache, "_fallback_dir", None)
        with pytest.warns(RuntimeWarning, match="not writable"):
            directory = cache.cache_dir()
        assert directory != locked
        assert os.access(directory, os.W_OK)
        # Entries go to the fallback and are found there.
        path = cache.store("fb", PROGRAM)
        assert path.parent == directory
        assert cache.lookup("fb") == (PROGRAM, path)
        assert list(locked.iterdir()) == []
        # The warning is given once, not on every access.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert cache.cache_dir() == directory
    finally:
        locked.chmod(0o700)


def test_permission_error_falls_back(tmp_path, monkeypatch):
    """The unwritable-directory case for users the chmod test cannot run as (root): the
    write probe fails with EACCES."""
    target = tmp_path / "denied"
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(target))
    monkeypatch.setattr(cache, "_fallback_dir", None)
    real = cache.tempfile.NamedTemporaryFile

    def deny(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == target:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(cache.tempfile, "NamedTemporaryFile", deny)
    with pytest.warns(RuntimeWarning, match="not writable"):
        directory = cache.cache_dir()
    assert directory != target and os.access(directory, os.W_OK)
    path = cache.store("denied-entry", PROGRAM)
    assert path.parent == directory
    assert cache.lookup("denied-entry") == (PROGRAM, path)


def test_cache_dir_that_is_a_file_falls_back(tmp_path, monkeypatch):
    """A path that cannot be a directory (a regular file is in the way) also falls back;
    this one fails for root too."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.setattr(cache, "_fallback_dir", None)
    with pytest.warns(RuntimeWarning, match="not writable"):
        directory = cache.cache_dir()
    assert directory.is_dir() and os.access(directory, os.W_OK)


# --------------------------------------------------------------------------------------------
# End to end: compiled kernels go through the disk cache
# --------------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_compile_writes_entries_and_reuses_them(cache_dir):
    # A variant no other test compiles, so the in-memory cache cannot hide the disk cache.
    spec = af.attention(af.sliding_window(777), af.causal())
    q, k, v = make_qkv(1, 1, nq=20, d=16, seed=1)
    out = spec(q, k, v)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v), torch.float32)
    entries = sorted(p.name for p in cache_dir.iterdir())
    py = [n for n in entries if n.endswith(".py")]
    js = [n for n in entries if n.endswith(".json")]
    assert len(py) == 1 and len(js) == 1
    assert py[0][:-3] == js[0][:-5]
    key = py[0][:-3]
    program, path = cache.lookup(key)
    assert "@triton.jit" in program.source
    assert program.source == af.compile(spec).program_for(q, k, v).source


@pytest.mark.interpreter
def test_corrupted_kernel_source_is_rebuilt_end_to_end(cache_dir, monkeypatch):
    spec = af.attention(af.sliding_window(778))
    q, k, v = make_qkv(1, 1, nq=20, d=16, seed=2)
    spec(q, k, v)
    (py,) = cache_dir.glob("*.py")
    good = py.read_text()
    py.write_text(good[: len(good) // 3])  # truncated, as by a crash mid-write
    # Forget the in-memory compilation so the disk entry is read again.
    compiler.forget_compiled()
    for name in [m for m in list(__import__("sys").modules) if m.startswith("attnfuse_generated_")]:
        monkeypatch.delitem(__import__("sys").modules, name)
    fn = af.compile(spec)
    out = fn(q, k, v)
    assert_close_to_reference(out, af.reference_attention(spec, q, k, v), torch.float32)
    assert py.read_text() == good, "the truncated entry must be rewritten"


@pytest.mark.interpreter
def test_different_head_dims_get_different_entries(cache_dir):
    spec = af.attention(af.sliding_window(779))
    for d in (16, 32):
        q, k, v = make_qkv(1, 1, nq=8, d=d, seed=d)
        spec(q, k, v)
    assert len(list(cache_dir.glob("*.py"))) == 2
    assert len(list(cache_dir.glob("*.json"))) == 2


def test_a_changed_source_under_the_same_key_is_imported_anew(cache_dir):
    # A printer patched at run time (a test, a developer's experiment) gives a new source under
    # the key of the unpatched one: the module must be the new source's, not a memo of the old.
    key = "same-key-" + "0" * 40
    modules = []
    for answer in (1, 2):
        source = f"ANSWER = {answer}\n"
        path = cache.store(key, TritonProgram(source, ()))
        modules.append(cache.load_module(path, key, interpret=True, source=source))
    assert [m.ANSWER for m in modules] == [1, 2]
    again = cache.load_module(path, key, interpret=True, source="ANSWER = 2\n")
    assert again is modules[1], "the same source is imported once"


@pytest.mark.parametrize("edited", ["lowering/triton/core.py", "dialects/tile/scores.py", "lowering/gluon.py",
                                    "transforms/lower_to_tile.py"])
def test_the_compiler_fingerprint_sees_every_compiler_file(tmp_path, edited):
    """An edit to any file of the compiler, in a subpackage too (the printer's and the tile
    dialect's modules), changes the fingerprint in the cache key, so no kernel printed by the
    old code is reused. Checked on a copy of the package."""
    import shutil

    root = tmp_path / "attnfuse"
    shutil.copytree(Path(af.__file__).parent, root, ignore=shutil.ignore_patterns("__pycache__"))
    before = compiler.package_fingerprint(root)
    assert compiler.package_fingerprint(root) == before
    with open(root / edited, "a") as source:
        source.write("\n# edited\n")
    assert compiler.package_fingerprint(root) != before
