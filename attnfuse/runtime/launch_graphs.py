"""Replaying a call's launches of several kernels as one CUDA graph.

A training step's backward launches two or three kernels, a split decode two, each through
Python and Triton's C launcher: on the H100's host about 14 us per backward launch
(`python3 bench/host_overhead.py --launches`), where PyTorch's own kernels launch from C++.
At small sizes that host time is the step's time. A CUDA graph of the same launches replays
with one driver call.

A graph fixes everything its kernels were launched with: the grid and scalars (fixed per
plan), and the tensors' addresses, strides and dtypes. `LaunchGraphs` keys its graphs by
those of every tensor the launches read or write, so a replay launches exactly what the
launches would, on the same memory; a call with other tensors launches directly (and a
training loop hands back the same addresses step after step: PyTorch's caching allocator
reuses the blocks of the step before). A key is captured the second time it comes, so that a
call whose tensors are never the same again pays only the key. Capture records the launches
on a side stream (nothing runs while capturing); the graph is then replayed on the caller's
stream, as a launch would run there.

The direct launches are kept wherever a graph could differ from them or cannot be made:
inside a CUDA graph capture of the caller's (whose graph records the launches themselves),
under a Triton launch hook (a profiler that would miss replayed kernels), with another
device current than the plan's, for a Triton without `knobs` (whose hooks this module cannot
read), under an allocator other than PyTorch's caching one (`cudaMallocAsync`, whose
statistics cannot show a launch allocating), for keys past `MAX_GRAPHS`, after a capture failed for the schedule or allocated
memory (a Gluon launch copying an input a descriptor cannot cover: the copy would stay
reserved in the graph's pool for as long as the graph lives), and where
`ATTNFUSE_LAUNCH_GRAPHS=off`.

Captures are serialized by a lock and recorded on one stream per device, as
`torch.cuda.graph` records on one of PyTorch's pooled streams: work another thread puts on
that same stream while a capture runs would be recorded too. A capture that fails leaves
PyTorch's allocator as a failed `torch.cuda.graph` capture does.
"""

from __future__ import annotations

import operator
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from attnfuse.errors import ArgumentError
from attnfuse.runtime.triton_launcher import current_device, hooks_idle, knobs

LAUNCH_GRAPHS_ENV = "ATTNFUSE_LAUNCH_GRAPHS"
"""on (default; also 1, true): a schedule of several launches replays as a CUDA graph where
`LaunchGraphs` allows; off (0, false): every launch goes through the launcher."""

_SETTINGS = {"on": True, "1": True, "true": True, "off": False, "0": False, "false": False}


def _launch_graphs_setting() -> bool:
    value = os.environ.get(LAUNCH_GRAPHS_ENV, "on").strip().lower() or "on"
    if value not in _SETTINGS:
        raise ArgumentError(f"{LAUNCH_GRAPHS_ENV} must be on or off (1 or 0), got {value!r}")
    return _SETTINGS[value]


ENABLED = _launch_graphs_setting()
"""`ATTNFUSE_LAUNCH_GRAPHS`, read once, when the runtime's call path is first imported (a bad
value is an `ArgumentError` there, naming the variable); the benchmarks set this to compare."""

MAX_GRAPHS = 256
"""Graphs kept per schedule (one per set of tensors seen twice): a model's layers share a
plan, each with its own activations, and a training step's backward and a decode step visit
them in a cycle. Past this many, new keys launch directly: dropping graphs to make room would
capture on every call of a cycle longer than the cache (a capture and its instantiation cost
more than the launches it saves)."""

_capturing: Callable[[], bool] | None = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_side_streams: dict[int, Any] = {}
_capture_lock = threading.Lock()
"""One capture at a time in this process: they share each device's side stream."""


def _side_stream(device: int) -> Any:
    """A stream of `device` to capture on (capture needs a stream other than the default)."""
    stream = _side_streams.get(device)
    if stream is None:
        stream = _side_streams[device] = torch.cuda.Stream(device)
    return stream


class LaunchGraphs:
    """The CUDA graphs of one schedule of launches (callables taking a call's tensors by role),
    by the tensors of `roles` they were captured with (see the module's docstring)."""

    def __init__(self, launches: Sequence[Callable[[dict[str, torch.Tensor]], None]],
                 roles: Sequence[str], device: torch.device,
                 new_graph: Callable[[], Any] | None = None):
        self.launches = tuple(launches)
        roles = tuple(sorted(set(roles)))
        getter = operator.itemgetter(*roles)
        self._tensors = getter if len(roles) > 1 else (lambda tensors: (getter(tensors),))
        self.usable = (device.type == "cuda" and len(self.launches) > 1 and knobs is not None
                       and _capturing is not None and current_device is not None and _native_allocator())
        self.device = device.index if device.index is not None else 0
        self.new_graph = new_graph or torch.cuda.CUDAGraph
        """What makes a graph (tests stand one in)."""
        self.graphs: dict[tuple, Any] = {}
        self.seen: set[tuple] = set()
        self.failed: str | None = None
        """Why a capture failed for this schedule (its launches go direct from then on)."""

    def key(self, tensors: dict[str, torch.Tensor]) -> tuple:
        """What a graph of these launches fixes of `tensors`: each role's address, strides and
        dtype (the scalars and grids are the plan's)."""
        parts: list[object] = []
        add = parts.append
        for t in self._tensors(tensors):
            add(t.data_ptr())
            add(t.stride())
            add(t.dtype)
        return tuple(parts)

    def __call__(self, tensors: dict[str, torch.Tensor]) -> bool:
        """Runs the launches for `tensors` through a graph: replayed if one was captured with
        these tensors, else captured now if they were seen once before. False, running
        nothing, where the caller should launch directly."""
        if not (ENABLED and self.usable) or self.failed is not None:
            return False
        if _capturing() or not hooks_idle() or current_device() != self.device:  # type: ignore[misc]
            return False
        key = self.key(tensors)
        graph = self.graphs.get(key)
        if graph is None:
            if key not in self.seen:
                if len(self.seen) >= 4 * MAX_GRAPHS:
                    self.seen.clear()
                self.seen.add(key)
                return False
            if len(self.graphs) >= MAX_GRAPHS:
                return False
            graph = self._capture(tensors)
            if graph is None:
                return False
            self.graphs[key] = graph
        graph.replay()
        return True

    def _capture(self, tensors: dict[str, torch.Tensor]) -> Any:
        """A graph of the launches with `tensors`, recorded on a side stream; None (and
        `failed` set) if capture fails, where the caller launches directly, which raises what
        the launch raises."""
        graph = self.new_graph()
        with _capture_lock:
            try:
                with torch.cuda.stream(_side_stream(self.device)):
                    # relaxed: a launch that loads its kernel (after the launcher's cache was
                    # cleared, say) may call what a stricter mode refuses while capturing.
                    graph.capture_begin(capture_error_mode="relaxed")
                    try:
                        # Counted inside the capture: beginning and ending one allocate for
                        # the graph itself (the CUDA generator's graph-safe state, on the
                        # first capture), which is not a launch copying an input.
                        allocations = _allocations(self.device)
                        for launch in self.launches:
                            launch(tensors)
                        allocated = _allocations(self.device) != allocations
                    finally:
                        graph.capture_end()
            except Exception as err:  # noqa: BLE001 - any failure keeps the direct launches
                self.failed = f"{type(err).__name__}: {err}"
                return None
            if allocated:
                self.failed = "a launch allocated memory while captured (a copy of an input)"
                return None
        return graph


def _native_allocator() -> bool:
    """Whether PyTorch's own caching allocator serves CUDA memory: its statistics count the
    allocations a capture checks (`_allocations`); `cudaMallocAsync` fills in bytes only, so
    there a launch copying an input could not be told apart and the launches go direct."""
    backend = getattr(torch.cuda, "get_allocator_backend", None)
    try:
        return backend is not None and backend() == "native"
    except (RuntimeError, AttributeError):  # a build without CUDA: nothing is usable anyway
        return False


def _allocations(device: int) -> int:
    """How many blocks PyTorch's allocator has handed out on `device` so far (a count that only
    grows, so a launch that allocates and frees a copy while captured is seen too: the
    freed block stays reserved in the graph's pool)."""
    return torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)


__all__ = ["ENABLED", "LAUNCH_GRAPHS_ENV", "MAX_GRAPHS", "LaunchGraphs"]
