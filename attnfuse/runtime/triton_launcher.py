"""Launching a compiled Triton kernel with no per-call work beyond the launch itself.

`compiled[grid]` (Triton's `CompiledKernel.__getitem__`) returns a runner that, on every call,
looks up the current device and its stream, builds the launch metadata for the launch hooks
(in Triton 3.6 the hooks are `HookChain`s, never None, so this runs on every launch), and
calls the kernel's `CudaLauncher`, which works out its scratch buffers before calling the C
launcher; the C launcher then calls the two (empty) hook chains. For a kernel launched with
the same grid and argument specialization call after call, all of that but the stream is the
same every time. `direct_launcher` builds a launch function that does only what varies:
it reads the current device and its raw stream (`torch._C._cuda_getCurrentRawStream`, what
Triton itself uses, so `torch.cuda.stream` contexts and CUDA-graph capture see the launch on
their stream) and calls the launcher with everything else fixed.

It is used only where the interface is the one this module was written against (the Triton
versions in `KNOWN_RUNNERS`, whose runner and launcher it reproduces); otherwise, and for
any launch while a launch hook is installed (a profiler such as proton), the launch goes
through Triton's own runner, unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
import triton

try:
    from triton import knobs
except ImportError:  # a Triton before its knobs module: launches go through its runner
    knobs = None

KNOWN_RUNNERS = ((3, 6), (3, 9))
"""Triton versions (major, minor) whose `CompiledKernel.__getitem__` runner calls
`self.run(gx, gy, gz, stream, self.function, self.packed_metadata, launch_metadata,
enter_hook, exit_hook, *args)`, and whose `launch_metadata` is None without an enter hook
(read in their sources: python/triton/compiler/compiler.py)."""

C_LAUNCHERS = ((3, 6),)
"""Triton versions whose NVIDIA `CudaLauncher.__call__` only allocates the scratch buffers
(none when their sizes are 0) and calls `self.launch(gx, gy, gz, stream, function,
launch_cooperative_grid, launch_pdl, global_scratch, profile_scratch, *rest)`: for these the
C launcher itself is called (backends/nvidia/driver.py). Triton 3.9's also sets up the
default profile scratch and GSan, so it is called as the runner calls it."""

current_device: Callable[[], int] | None = getattr(torch._C, "_cuda_getDevice", None)
"""The current CUDA device's index (what `torch.cuda.current_device` returns once CUDA is
initialized, which a compiled kernel's first launch has done)."""

raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)
"""The current stream of a device, as the handle the C launcher takes (Triton's
`driver.active.get_current_stream`)."""


def triton_version() -> tuple[int, int]:
    """The installed Triton's (major, minor); (0, 0) if its version string is unusual."""
    try:
        major, minor = triton.__version__.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def hooks_idle() -> bool:
    """Whether no launch hook is installed: each hook is None or an empty `HookChain`."""
    runtime = knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    # A plain function (an older way of installing a hook) has no `calls`: not idle.
    return (enter is None or not getattr(enter, "calls", True)) and (
        leave is None or not getattr(leave, "calls", True))


def direct_launcher(
    compiled: Any, grid: tuple[int, int, int], trailing: tuple[object, ...]
) -> Callable[[list[object]], bool]:
    """A function `launch(args)` that launches `compiled` (the compiled kernel the JIT just
    launched, its handles loaded) over `grid` with a call's runtime arguments `args`
    (pointers, as ints or tensors, and strides) followed by `trailing` (the scalars and
    constexpr values), on the current stream. It returns False, launching nothing, when the
    current device is not the one `compiled` was loaded on (the caller launches through the
    JIT, which loads it there). Without a known interface it calls Triton's runner. Its
    `path` says which it calls: "c" (the C launcher), "launcher" (the `CudaLauncher`) or
    "runner"."""
    runner = compiled[grid]
    version = triton_version()
    device_of, stream_of = current_device, raw_stream
    if (version not in KNOWN_RUNNERS or device_of is None or stream_of is None
            or knobs is None or not hasattr(knobs, "runtime")
            or not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata"))):
        def via_runner(args: list[object]) -> bool:
            runner(*args, *trailing)
            return True
        via_runner.path = "runner"  # type: ignore[attr-defined]
        return via_runner

    device = device_of()  # the JIT loads a kernel on the current device
    gx, gy, gz = grid
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    c_launch = _c_launch(run) if version in C_LAUNCHERS else None

    if c_launch is not None:
        cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl

        def launch(args: list[object]) -> bool:
            current = device_of()
            if current != device:
                return False
            if not hooks_idle():
                runner(*args, *trailing)
                return True
            # CudaLauncher.__call__ with no scratch: the C launcher, hooks and metadata None.
            c_launch(gx, gy, gz, stream_of(current), function, cooperative, pdl, None, None,
                     packed, None, None, None, *args, *trailing)
            return True
        launch.path = "c"  # type: ignore[attr-defined]
        encoding = descriptor_encoding(c_launch)
        if encoding is not None:
            bare, encode = encoding

            def launch_encoded(args: list[object]) -> bool:
                # As `launch`, with the leading descriptors already encoded (`encode`); under a
                # launch hook it declines, since the runner takes the descriptors themselves.
                current = device_of()
                if current != device or not hooks_idle():
                    return False
                bare(gx, gy, gz, stream_of(current), function, cooperative, pdl, None, None,
                     packed, None, None, None, *args, *trailing)
                return True
            launch.encoded = launch_encoded  # type: ignore[attr-defined]
            launch.encode = encode  # type: ignore[attr-defined]
        return launch

    def launch(args: list[object]) -> bool:
        current = device_of()
        if current != device:
            return False
        if not hooks_idle():
            runner(*args, *trailing)
            return True
        # The runner's call, with the launch metadata it makes without an enter hook (None)
        # and no hooks to call.
        run(gx, gy, gz, stream_of(current), function, packed, None, None, None, *args, *trailing)
        return True
    launch.path = "launcher"  # type: ignore[attr-defined]
    return launch


def descriptor_encoding(c_launch: Any) -> tuple[Callable[..., None], Callable[[list[Any]], list[object]]] | None:
    """For a kernel with host-side TMA descriptors as its leading arguments, the C launcher
    (Triton 3.6's `wrap_handle_tensordesc` wraps it in `inner`, which encodes every
    descriptor on every launch: `make_tensordesc_arg`, a `cuTensorMapEncodeTiled` each) and a
    function `encode(descriptors)` giving the arguments that wrapper would pass for them, so
    that a caller may encode a call's descriptors once and launch with them again. None for
    any other launcher (no descriptors, another Triton): read from the wrapper's closure and
    globals, and only where they are exactly what Triton 3.6's driver.py has."""
    code, closure = getattr(c_launch, "__code__", None), getattr(c_launch, "__closure__", None)
    if code is None or not closure or code.co_name != "inner":
        return None
    cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in closure)))
    bare, indices, metadata = (cells.get(name) for name in ("launcher", "tensordesc_indices", "tensordesc_meta"))
    encode_one = getattr(c_launch, "__globals__", {}).get("make_tensordesc_arg")
    if not callable(bare) or not isinstance(indices, set) or not isinstance(metadata, list) or encode_one is None:
        return None
    if indices != set(range(len(metadata))):
        return None  # descriptors that do not lead the runtime arguments
    if not all(isinstance(meta, dict) for meta in metadata):
        # Not lowered to TMA descriptors: the wrapper passes the tensors themselves, which a
        # kept encoding would hold alive.
        return None
    try:
        if len(inspect.signature(encode_one).parameters) != 2:
            return None
    except (TypeError, ValueError):
        return None

    def encode(descriptors: list[Any]) -> list[object]:
        if len(descriptors) != len(metadata):
            raise ValueError(f"{len(descriptors)} descriptors for a kernel of {len(metadata)}")
        encoded: list[object] = []
        for descriptor, meta in zip(descriptors, metadata):
            encoded.extend(encode_one(descriptor, meta))
        return encoded
    return bare, encode


def _c_launch(run: Any) -> Callable[..., None] | None:
    """The C launcher of a `CudaLauncher` that needs no scratch buffers, or None."""
    cls = type(run)
    if cls.__name__ != "CudaLauncher" or cls.__module__ != "triton.backends.nvidia.driver":
        return None
    names = ("launch", "launch_cooperative_grid", "launch_pdl", "global_scratch_size",
             "profile_scratch_size")
    if not all(hasattr(run, name) for name in names):
        return None
    if run.global_scratch_size or run.profile_scratch_size:
        return None  # scratch is allocated per launch, by CudaLauncher.__call__
    return run.launch
