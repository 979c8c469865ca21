"""What a plan works out from a call-time tensor, kept per tensor object: the block lists of a
block-sparse layout, the largest |position| of RoPE positions.

A model passes the same few such tensors call after call (every layer of one kind shares one
layout, every layer the same positions), so a plan keeps what it derived from each, and a
call with an unchanged tensor neither checks it again nor derives it again: for a layout, a
sort, a sum and copies per call otherwise (the whole host cost of a block-sparse call on the
GPU); for positions, a reduction and a device synchronization.

An entry is reused only for the very tensor object it was made from, unchanged since: the
same in-place version counter (bumped by every in-place write, through any view, and by
`resize_`, `set_` and the other in-place metadata changes) and the same data pointer, shape,
strides, dtype and device (which `t.data = other` changes without a version bump). Another
object never matches, even one that shares the storage and version (a transpose) or the
address of a freed one. Writes that bypass the version counter (through `t.data`, or by a
kernel writing the memory directly) are not seen, as autograd does not see them either.

The entries hold *weak* references to the tensors: the cache never keeps one alive, and an
entry is dropped as soon as its tensor is freed. Holding the tensors themselves would keep
up to `TENSORS_PER_PLAN` dropped layouts' lists alive per plan (device memory that grows with
N^2 / block size^2), and identity alone is sound with weak references: a live referent is
never confused with a new object at its address.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

TENSORS_PER_PLAN = 8
"""Tensors a plan keeps entries for (per kind); a ninth evicts the oldest entry (a model's
layers use a handful of layouts, so alternating between them never rebuilds; more than this
many in rotation would rebuild as an LRU cache would, so the cheaper order is kept)."""


def tensor_state(t: torch.Tensor) -> tuple:
    """What an entry depends on besides the tensor's identity. An inference tensor (made
    under `torch.inference_mode()`) has no version counter: its state says so, and
    `TensorCache` keeps nothing for it."""
    version = None if t.is_inference() else t._version
    return (version, t.data_ptr(), t.shape, t.stride(), t.dtype, t.device)


@dataclass
class _Entry:
    ref: weakref.ref
    state: tuple
    values: dict[Hashable, Any] = field(default_factory=dict)
    """What was derived from the tensor, by what (for a layout: the forward's lists, or the
    backward's)."""


class TensorCache:
    """What one plan derived from the call-time tensors its calls passed, by tensor object
    (see the module's docstring for when an entry is reused)."""

    def __init__(self, capacity: int = TENSORS_PER_PLAN):
        self.capacity = capacity
        self._entries: dict[int, _Entry] = {}  # by id(tensor), oldest first

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, tensor: torch.Tensor) -> _Entry | None:
        """The entry of this very tensor object in its current state, or None."""
        key = id(tensor)
        entry = self._entries.get(key)
        if entry is None or entry.ref() is not tensor or entry.state != tensor_state(tensor):
            return None
        return entry

    def get(
        self,
        tensor: torch.Tensor,
        what: Hashable,
        build: Callable[[], Any],
        check: Callable[[], object] | None = None,
    ) -> Any:
        """`what` of `tensor`: cached, or `build()` and kept. A tensor not seen in its current
        state is first checked by `check()` (which raises for a bad one) and gets an entry;
        without `check`, `build()` is returned and not kept (the caller cannot vouch for the
        tensor). A `build()` that raises keeps nothing."""
        if tensor.is_inference():
            # In-place writes to it bump no version counter: nothing derived from it can be
            # known to be current at the next call.
            if check is not None:
                check()
            return build()
        entry = self._entry(tensor)
        if entry is None:
            if check is None:
                return build()
            check()
            entry = self._store(tensor)
        if what in entry.values:
            return entry.values[what]
        value = entry.values[what] = build()
        return value

    def _store(self, tensor: torch.Tensor) -> _Entry:
        key = id(tensor)
        self._entries.pop(key, None)
        while len(self._entries) >= self.capacity:
            del self._entries[next(iter(self._entries))]
        cache = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            # The tensor was freed: drop what was derived from it now.
            owner = cache()
            entry = owner._entries.get(key) if owner is not None else None
            if entry is not None and entry.ref is ref:
                owner._entries.pop(key, None)

        entry = _Entry(weakref.ref(tensor, forget), tensor_state(tensor))
        self._entries[key] = entry
        return entry
