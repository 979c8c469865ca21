"""Running kernels on Triton's CPU interpreter whatever mode `triton.language` loaded in.

Triton decides interpreter-or-GPU per decorated function, from `TRITON_INTERPRET` at
decoration time. AttnFuse decorates its own generated modules for the right target
(`cache.triton_target`), but `triton.language`'s own helpers (`tl.max`, `tl.sum`,
`tl.sigmoid`, ...) are decorated once, when `triton.language` is first imported. When that
happened in GPU mode (torch._dynamo and transformers import it, and so may the user), those
helpers are `JITFunction`s, and a kernel running on the interpreter that calls one fails with
"Cannot call @triton.jit'd outside of the scope of a kernel".

`interpreting()` closes that gap: while an AttnFuse kernel runs on the interpreter (in this
thread), calling a `JITFunction` runs it through the interpreter, as it would have had
`triton.language` been imported in interpreter mode. Everywhere else `JITFunction.__call__`
behaves as Triton wrote it (it raises): GPU compilation never calls it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

from triton.runtime.errors import InterpreterError
from triton.runtime.interpreter import InterpretedFunction, _patch_lang
from triton.runtime.jit import JITFunction

_state = threading.local()
_install_lock = threading.Lock()
_triton_call = JITFunction.__call__


def _call_through_interpreter(self: JITFunction, *args, **kwargs):
    """`JITFunction.__call__` while `interpreting()`: the function's interpreted twin."""
    if not getattr(_state, "depth", 0):
        return _triton_call(self, *args, **kwargs)
    twin = self.__dict__.get("_attnfuse_interpreted")
    if twin is None:
        twin = InterpretedFunction(self.fn)
        self.__dict__["_attnfuse_interpreted"] = twin
    # What `InterpretedFunction.__call__` does, except that the builtins it patches for the
    # helper (`tl.core`'s, for `triton.language.standard`'s helpers) are restored afterwards:
    # Triton leaves them patched, harmless when everything is interpreted, but here a later
    # GPU compile in the same process would meet the interpreter's stand-ins.
    scope = _patch_lang(twin.fn)
    try:
        return twin.rewrite()(*args, **kwargs)
    except Exception as err:
        raise InterpreterError(repr(err)) from err
    finally:
        scope.restore()


def _install() -> None:
    with _install_lock:
        if JITFunction.__call__ is not _call_through_interpreter:
            JITFunction.__call__ = _call_through_interpreter


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """The scope of an interpreted kernel launch (see the module docstring)."""
    _install()
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def runs_interpreted(device: object) -> bool:
    """Whether kernels for tensors on `device` run on the interpreter: off the GPU always, and
    on it too when the user asked for the interpreter (`TRITON_INTERPRET=1`), as Triton
    itself then runs every kernel (`triton.language`'s helpers are interpreted ones then,
    which a GPU compile could not call)."""
    return getattr(device, "type", device) != "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def truncates_to_bf16(dtype: torch.dtype, device: object) -> bool:
    """Whether a kernel writing `dtype` on `device` would truncate instead of round: bf16 data
    whose kernels run in Triton's interpreter, which converts fp32 -> bf16 by truncation
    (triton-lang/triton#11584); GPUs round. Where the runtime stores bf16 data later calls
    read again, it keeps such data in fp32 or rounds it with torch."""
    return dtype == torch.bfloat16 and runs_interpreted(device)


def is_interpreted(kernel: object) -> bool:
    """Whether `kernel` is a kernel decorated for Triton's CPU interpreter."""
    return isinstance(kernel, InterpretedFunction)
