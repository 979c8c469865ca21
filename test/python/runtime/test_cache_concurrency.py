"""The kernel cache under concurrency and faults, end to end.

- Four processes (multiprocessing, 'spawn') released together by a barrier compile and run the
  same variants against one fresh `ATTNFUSE_CACHE_DIR`, each checking its output against the
  reference. Afterwards the directory holds exactly one valid entry per compile key (`<key>.py`
  and `<key>.json` whose sha256 matches) and no temporary or probe file. A second run starts
  from a truncated entry (a writer that crashed) that the racing processes must detect and
  rebuild.
- A cache directory that cannot be written falls back to a private temporary directory with a
  RuntimeWarning, and the kernels still compute the right thing.

This module imports nothing of attnfuse (or torch) at the top: the spawned children import it
to unpickle their target, and each child sets `ATTNFUSE_CACHE_DIR` *before* importing attnfuse.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest

PROCESSES = 4
# Upper bounds only (a passing run takes a fraction): four children import torch and compile
# in Triton's interpreter at once, beside pytest's other workers, on CI's two cores; a loaded
# machine once took past the earlier 240 s.
BARRIER_TIMEOUT_S = 300
RESULT_TIMEOUT_S = 600


def _variants():
    """(name, spec, compile options, call data) of the variants every child runs. Imported
    lazily: the module must not import attnfuse at the top."""
    import torch

    import attnfuse as af

    g = torch.Generator().manual_seed(1)
    return [
        # Unusual parameters, so that no other test of the session shares these compile keys.
        ("rope+causal pre_rotated", af.attention(af.rope(theta=4321.0), af.causal()),
         {"rope_placement": "pre_rotated"}, {}),
        ("window+alibi+bias", af.attention(af.sliding_window(4242), af.alibi(), af.additive_bias()),
         {}, {"bias": torch.randn(1, 2, 1, 24, generator=g)}),
        ("relu+block_sparse", af.attention(af.relu(), af.block_sparse(16)), {},
         {"block_layout": torch.tensor([[True, False], [True, True]])}),
    ]


def _inputs():
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 20, 16, generator=g)
    k = torch.randn(1, 2, 24, 16, generator=g)
    v = torch.randn(1, 2, 24, 16, generator=g)
    return q, k, v


def compile_keys() -> dict[str, str]:
    """The on-disk cache key of each variant for `_inputs()` (the parent's view)."""
    import attnfuse as af
    from attnfuse.runtime import compiler
    from attnfuse.runtime.inputs import check_inputs

    keys = {}
    q, k, v = _inputs()
    for name, spec, options, _data in _variants():
        fn = af.compile(spec, **options)
        key = fn.compile_key(check_inputs(spec, q, k, v))
        keys[name] = compiler._cache_key(spec, key, True)
    return keys


def _child(index: int, cache_dir: str, barrier, results) -> None:
    """One racing process: set the cache dir, import attnfuse, wait for the others, compile and
    run every variant, check it against the reference, report."""
    attnfuse_was_imported = "attnfuse" in sys.modules
    os.environ["ATTNFUSE_CACHE_DIR"] = cache_dir
    try:
        import torch

        import attnfuse as af
        from attnfuse.blocks.relu import Relu
        from attnfuse.runtime import cache, compiler

        q, k, v = _inputs()
        variants = _variants()
        barrier.wait(BARRIER_TIMEOUT_S)
        started = time.time()
        digests = {}
        with warnings.catch_warnings():
            # A fallback to a private cache directory would make the race meaningless.
            warnings.filterwarnings("error", message="AttnFuse cache directory", category=RuntimeWarning)
            for name, spec, options, data in variants:
                fn = af.compile(spec, **options)
                if spec.block(Relu) is not None:
                    out = fn(q, k, v, **data)
                else:
                    out = fn(q, k, v, return_lse=True, **data)[0]
                ref = af.reference_attention(spec, q, k, v, **data)
                err = (out.double() - ref).abs().max().item()
                if not err <= 1e-4:
                    raise AssertionError(f"{name}: max abs error {err:.3e} against the reference")
                key = fn.compile_key(fn.plan(q, k, v).problem)
                digests[name] = compiler.generate_program(spec, key, True)[2]
        results.put({
            "index": index, "ok": True, "digests": digests,
            "cache_dir": str(cache.cache_dir()), "imported_early": attnfuse_was_imported,
            "seconds": time.time() - started, "error": "",
        })
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put({"index": index, "ok": False, "error": traceback.format_exc(),
                     "imported_early": attnfuse_was_imported})


def _race(cache_dir: Path) -> list[dict]:
    """Runs PROCESSES children against `cache_dir`; returns their reports."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(i, str(cache_dir), barrier, results), name=f"attnfuse-cache-{i}")
        for i in range(PROCESSES)
    ]
    for child in children:
        child.start()
    reports = []
    try:
        deadline = time.time() + RESULT_TIMEOUT_S
        while len(reports) < PROCESSES and time.time() < deadline:
            try:
                reports.append(results.get(timeout=1.0))
            except queue.Empty:
                if all(c.exitcode is not None for c in children) and results.empty():
                    break  # every child is gone: no more reports can come
        assert len(reports) == PROCESSES, (
            f"{len(reports)} of {PROCESSES} children reported; exit codes "
            + ", ".join(f"{c.name}: {c.exitcode}" for c in children)
        )
        for child in children:
            child.join(timeout=30)
            assert child.exitcode == 0, f"{child.name} exited with {child.exitcode}"
    finally:
        for child in children:
            if child.is_alive():
                child.kill()  # only the children started here
                child.join(timeout=5)
    return reports


def assert_one_valid_entry_per_key(cache_dir: Path, keys: set[str]) -> None:
    names = sorted(p.name for p in cache_dir.iterdir())
    expected = sorted([f"{k}.py" for k in keys] + [f"{k}.json" for k in keys])
    leftovers = [n for n in names if n.startswith(".")]
    assert not leftovers, f"temporary or probe files left behind: {leftovers}"
    assert names == expected, f"cache holds {names}, expected one .py and one .json per key {sorted(keys)}"
    for key in keys:
        source = (cache_dir / f"{key}.py").read_text()
        meta = json.loads((cache_dir / f"{key}.json").read_text())
        assert meta["sha256"] == hashlib.sha256(source.encode()).hexdigest(), f"{key}: sha256 mismatch"
        assert meta["kernels"] and "@triton.jit" in source


@pytest.mark.interpreter
@pytest.mark.parametrize("start", ["fresh", "truncated-entry"])
def test_processes_compile_the_same_variants_at_once(tmp_path, start):
    cache_dir = tmp_path / "shared-cache"
    keys = compile_keys()
    if start == "truncated-entry":
        # A previous writer crashed after the sidecar but mid-way through the source: the
        # children must all read it as missing, rebuild it and agree on the result.
        cache_dir.mkdir()
        key = keys["rope+causal pre_rotated"]
        (cache_dir / f"{key}.py").write_text("import triton\n@triton.ji")
        (cache_dir / f"{key}.json").write_text(json.dumps({"sha256": "0" * 64, "kernels": []}))
    reports = _race(cache_dir)
    failures = [r for r in reports if not r["ok"]]
    assert not failures, "\n\n".join(f"child {r['index']}:\n{r['error']}" for r in failures)
    assert sorted(r["index"] for r in reports) == list(range(PROCESSES))
    for r in reports:
        assert not r["imported_early"], "attnfuse was imported before ATTNFUSE_CACHE_DIR was set"
        assert r["cache_dir"] == str(cache_dir), "a child fell back to another cache directory"
        assert r["digests"] == keys, "children disagree with the parent on the compile keys"
    assert_one_valid_entry_per_key(cache_dir, set(keys.values()))


# --------------------------------------------------------------------------------------------
# A cache directory that cannot be written
# --------------------------------------------------------------------------------------------


def _deny_writes_under(monkeypatch, target: Path) -> None:
    """Every temporary file the cache would create in `target` (the write probe and the
    entries' temp files) fails with EACCES, as in a read-only directory (root ignores chmod)."""
    from attnfuse.runtime import cache

    real_named, real_mkstemp = cache.tempfile.NamedTemporaryFile, cache.tempfile.mkstemp

    def denied(directory) -> bool:
        return directory is not None and Path(directory).resolve() == target.resolve()

    def named(*args, dir=None, **kwargs):
        if denied(dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return real_named(*args, dir=dir, **kwargs)

    def mkstemp(*args, dir=None, **kwargs):
        if denied(dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(cache.tempfile, "NamedTemporaryFile", named)
    monkeypatch.setattr(cache.tempfile, "mkstemp", mkstemp)


@pytest.mark.interpreter
@pytest.mark.parametrize("how", ["probe-denied", "chmod"])
def test_read_only_cache_dir_falls_back_end_to_end(tmp_path, monkeypatch, how):
    import torch
    from conftest import assert_close_to_reference, make_qkv

    import attnfuse as af
    from attnfuse.runtime import cache

    target = tmp_path / "read-only"
    target.mkdir()
    if how == "chmod":
        target.chmod(0o500)
        if os.access(target, os.W_OK):
            target.chmod(0o700)
            pytest.skip("running with privileges that ignore directory permissions (root)")
    else:
        _deny_writes_under(monkeypatch, target)
    monkeypatch.setenv("ATTNFUSE_CACHE_DIR", str(target))
    monkeypatch.setattr(cache, "_fallback_dir", None)
    fallback = None
    try:
        # Variants no other test compiles, so the in-memory caches cannot hide the disk cache.
        spec = af.attention(af.sliding_window(5151 if how == "chmod" else 5150), af.causal(), af.alibi())
        q, k, v = make_qkv(1, 2, nq=20, d=16, seed=21)
        with pytest.warns(RuntimeWarning, match="not writable"):
            out = spec(q, k, v)
        assert_close_to_reference(out, af.reference_attention(spec, q, k, v), torch.float32)
        fallback = cache.cache_dir()
        assert fallback != target and os.access(fallback, os.W_OK)
        assert list(target.iterdir()) == [], "nothing may be written to the read-only directory"
        (py,) = fallback.glob("*.py")
        meta = json.loads(py.with_suffix(".json").read_text())
        assert meta["sha256"] == hashlib.sha256(py.read_text().encode()).hexdigest()
        # Warned once: a second new variant compiles silently into the same fallback.
        other = af.attention(af.sliding_window(6161 if how == "chmod" else 6160))
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out2 = other(q, k, v)
        assert_close_to_reference(out2, af.reference_attention(other, q, k, v), torch.float32)
        assert len(list(fallback.glob("*.py"))) == 2
    finally:
        target.chmod(0o700)
        if fallback is not None and fallback != target:
            shutil.rmtree(fallback, ignore_errors=True)
