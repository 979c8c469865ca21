"""Launching a generated Gluon kernel with little host work per call.

Through the JIT (`kernel[grid](...)`) a Gluon launch binds and specializes its two dozen
arguments on every call: 157 us of host time for the fused backward on the H200 where a
portable kernel's direct launch takes 36 (bench/results/20261202T0233Z-gluon_backward_ab-
launch-host.log). `GluonRunner` launches through the JIT the first time for each
specialization of a call's arguments (what the caller says Triton specializes on: pointer
alignments, strides and the values of integers) and through the compiled kernel's own
launcher after that (`triton_launcher.direct_launcher`, which also turns the host-side TMA
descriptors into the kernel's descriptor arguments, as the JIT's launch does).

Turning a descriptor into its kernel argument (`cuTensorMapEncodeTiled`) is most of what is
left: Triton does it on every launch, for each of the backward's nine descriptors. Where
the launcher lets the encoding be done apart (`triton_launcher.descriptor_encoding`, Triton
3.6), a runner keeps a call's encoded descriptors by what they depend on (the caller's `key`:
each tensor's address, strides and shape) and a later call with the same tensors replays
them (`replay`) without building descriptors or checking the tensors again. A training loop
hands the same few addresses back call after call (PyTorch's caching allocator), so the
replay is the common case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnfuse.dialects import tile
from attnfuse.runtime.launch import MAX_RUNNERS, _launchable
from attnfuse.runtime.triton_launcher import direct_launcher

MAX_DESCRIBED = 256
"""Encoded descriptor sets kept per runner (one per set of tensor addresses seen): a model's
layers share one plan, each with its own activations, so this is more than MAX_RUNNERS."""


class GluonRunner:
    """The launches of one Gluon kernel over one grid with `num_warps` warps."""

    def __init__(self, kernel: Any, grid: tuple[int, ...], num_warps: int):
        self.kernel = kernel
        self.grid = grid
        self.num_warps = num_warps
        self.runners: dict[tuple, Callable[[list[object]], bool]] = {}
        self.described: dict[tuple, tuple[Callable[[list[object]], bool], list[object]]] = {}
        """By a call's `key`: its direct launcher taking encoded descriptors, and those."""
        params = kernel.params
        first = next((i for i, p in enumerate(params) if p.is_constexpr), len(params))
        # The trailing constexprs' values (their defaults: the printed kernel fixes them), which
        # the compiled kernel's launcher takes after the runtime arguments; None if the
        # parameters are not laid out that way (every launch then goes through the JIT).
        self.constexprs = (tuple(p.default for p in params[first:])
                           if all(p.is_constexpr for p in params[first:]) else None)
        self.runtime_params = first

    def replay(self, key: tuple, rest: list[object]) -> bool:
        """Launch again the call that `__call__` was given `key` for, its encoded descriptors
        followed by `rest` (this call's other runtime arguments); False, launching nothing,
        if there is no such call (or its launcher declines: another device, a launch hook)."""
        hit = self.described.get(key)
        return hit is not None and hit[0]([*hit[1], *rest])

    def __call__(self, args: list[object], scalars: tuple[object, ...], specialization: tuple,
                 descriptors: int = 0, key: tuple | None = None) -> None:
        """Launch with the runtime arguments `args` (descriptors, tensors and strides) and the
        plan's `scalars`; `specialization` keys the direct launcher: it must hold everything
        of the arguments the JIT may specialize on (`specialization_of`). With `key`, the
        first `descriptors` arguments are encoded once for `replay` under it: the key must
        determine them and this call's specialization (the tensors' addresses, strides and
        shapes; the plan fixes their dtypes)."""
        launch = self.runners.get(specialization)
        keep = key is not None and descriptors > 0
        if keep and launch is not None and getattr(launch, "encoded", None) is not None:
            # Encoded once, here, and launched with that encoding (not encoded again by the
            # launcher's wrapper).
            kept = self._keep(key, launch, args[:descriptors])
            if kept[0]([*kept[1], *args[descriptors:]]):
                return
        if launch is not None and launch(args):  # (under a launch hook: through the runner)
            return
        compiled = self.kernel[self.grid](*args, *scalars, num_warps=self.num_warps)
        if (launch is None and self.constexprs is not None and _launchable(compiled)
                and len(args) + len(scalars) == self.runtime_params):
            if len(self.runners) >= MAX_RUNNERS:
                self.runners.clear()
            grid = (*self.grid, *(1,) * (3 - len(self.grid)))
            launch = self.runners[specialization] = direct_launcher(compiled, grid, (*scalars, *self.constexprs))
            if keep and getattr(launch, "encoded", None) is not None:
                self._keep(key, launch, args[:descriptors])

    def _keep(self, key: tuple, launch: Any, descriptors: list[object]) -> tuple[Callable[[list[object]], bool], list[object]]:
        """Encodes `descriptors` for `launch` and keeps them under `key` (the oldest forgotten
        past MAX_DESCRIBED)."""
        while len(self.described) >= MAX_DESCRIBED:
            try:
                self.described.pop(next(iter(self.described)), None)
            except (StopIteration, RuntimeError):  # emptied or changed by another thread
                break
        kept = self.described[key] = (launch.encoded, launch.encode(descriptors))
        return kept


def pointer_arguments(roles: tuple[str, ...], skip: set[str], tensors: dict[str, Any]) -> tuple[list[object], list[Any]]:
    """The pointer arguments of a Gluon kernel's roles besides those in `skip` (which
    descriptors carry), as the portable target passes them: each tensor, then its strides
    (for a role with axes). Also the tensors alone (for `specialization_of`)."""
    args: list[object] = []
    pointed: list[Any] = []
    for role in roles:
        if role in skip:
            continue
        t = tensors[role]
        args.append(t)
        pointed.append(t)
        if tile.role_axes(role):
            args.extend(t.stride())
    return args, pointed


def specialization_of(descriptor_tensors: list[Any], pointer_tensors: list[Any]) -> tuple:
    """What a launch's direct launcher is keyed on: the tensors behind the descriptors (dtype,
    shape, strides, base alignment) and the pointer arguments (dtype, 16-byte alignment,
    strides). More than the JIT specializes on, so a replayed launch is always one the JIT
    would have compiled the same way."""
    return (tuple((t.dtype, tuple(t.shape), t.stride(), t.data_ptr() & 15) for t in descriptor_tensors),
            tuple((t.dtype, t.data_ptr() & 15, t.stride()) for t in pointer_tensors))


def call_key(tensors: list[Any]) -> tuple:
    """What a launch's encoded descriptors and specialization depend on, of its tensors: each
    one's address, strides, shape and dtype (`GluonRunner.replay`)."""
    return tuple((t.data_ptr(), t.stride(), t.shape, t.dtype) for t in tensors)


__all__ = ["GluonRunner", "call_key", "pointer_arguments", "specialization_of"]
