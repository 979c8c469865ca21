"""The kernel cache: generated source on disk, loaded modules in memory.

An entry is the generated Triton source (`<key>.py`) and a sidecar (`<key>.json`) holding the
launch information and the source's SHA-256. Writes go to a temporary file renamed into
place, so a reader never sees half an entry; an entry whose hash does not match is treated as
missing and rebuilt. The directory is `$ATTNFUSE_CACHE_DIR`, else `~/.cache/attnfuse`; if it
cannot be written, a private temporary directory is used, with a warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

from attnfuse.lowering.triton import KernelInfo, TritonProgram

_fallback_dir: Path | None = None
_lock = threading.Lock()


def cache_dir() -> Path:
    """The directory entries are written to (created if needed)."""
    global _fallback_dir
    wanted = Path(os.environ.get("ATTNFUSE_CACHE_DIR") or Path.home() / ".cache" / "attnfuse")
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=wanted, prefix=".probe-", delete=True)
        probe.close()
        return wanted
    except OSError as err:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="attnfuse-cache-"))
            warnings.warn(
                f"AttnFuse cache directory {wanted} is not writable ({err}); using {_fallback_dir}",
                RuntimeWarning,
                stacklevel=3,
            )
        return _fallback_dir


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def store(key: str, program: TritonProgram) -> Path:
    """Writes an entry (source, then sidecar) and returns the source's path."""
    directory = cache_dir()
    source_path = directory / f"{key}.py"
    _atomic_write(source_path, program.source)
    meta = {"sha256": _digest(program.source), "kernels": [asdict(k) for k in program.kernels]}
    _atomic_write(directory / f"{key}.json", json.dumps(meta, indent=1))
    return source_path


def lookup(key: str) -> tuple[TritonProgram, Path] | None:
    """The stored entry for `key`, or None if absent, truncated or corrupted."""
    directory = cache_dir()
    source_path, meta_path = directory / f"{key}.py", directory / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        source = source_path.read_text()
        if not isinstance(meta, dict) or meta.get("sha256") != _digest(source):
            return None
        kernels = tuple(
            KernelInfo(**{**k, "roles": tuple(k["roles"]),
                          "shared_offsets": k.get("shared_offsets") and tuple(k["shared_offsets"])})
            for k in meta["kernels"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return TritonProgram(source, kernels), source_path


@contextlib.contextmanager
def triton_target(interpret: bool) -> Iterator[None]:
    """Within it, `@triton.jit` makes interpreter kernels (`interpret`) or GPU ones.

    Triton reads `TRITON_INTERPRET` when a function is decorated, not when `triton` is
    imported, so the choice is made per generated module, whatever imported Triton first
    (torch._dynamo, transformers, the user) and whatever the variable says elsewhere in the
    process. The variable is restored afterwards: AttnFuse never changes it for other code.
    """
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


def load_module(path: Path, key: str, interpret: bool, source: str | None = None) -> ModuleType:
    """Imports a generated source file (Triton needs kernels to live in a real file), its
    kernels decorated for the CPU interpreter (`interpret`) or for the GPU. A module is
    imported once per process and name; the name carries `source`'s digest when it is given,
    so a source that differs under the same key (a printer patched at run time) is imported
    anew rather than answered by the earlier module (a key that is itself a digest of the
    source needs none)."""
    tag = f"_{_digest(source)[:16]}" if source is not None else ""
    name = f"attnfuse_generated_{key[:24]}{tag}_{'interp' if interpret else 'gpu'}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # The lock also keeps two threads from setting the variable at once.
    with _lock, triton_target(interpret):
        spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def get_or_build(key: str, build: Callable[[], TritonProgram]) -> tuple[TritonProgram, Path]:
    """The cached entry for `key`, building and storing it first if needed."""
    found = lookup(key)
    if found is not None:
        return found
    program = build()
    return program, store(key, program)
