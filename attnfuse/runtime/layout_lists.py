"""The block lists of the layouts a plan's calls pass, kept per layout object.

A model passes the same few layout tensors call after call (every layer of one kind shares
one), so a plan keeps the lists it built for each, and a call with an unchanged layout
neither checks it again nor rebuilds its lists (a sort, a sum and copies per call otherwise,
the whole host cost of a block-sparse call on the GPU).

An entry is reused only for the very tensor object it was built from, unchanged since: the
same in-place version counter (bumped by every in-place write, through any view, and by
`resize_`, `set_` and the other in-place metadata changes) and the same data pointer, shape,
strides, dtype and device (which `t.data = other` changes without a version bump). Another
object never matches, even one that shares the storage and version (a transpose) or the
address of a freed one. Writes that bypass the version counter (through `t.data`, or by a
kernel writing the memory directly) are not seen, as autograd does not see them either.

The entries hold *weak* references to the layouts: the cache never keeps a layout alive,
and an entry's lists are dropped as soon as its layout is freed. Holding the tensors
themselves would keep up to `LAYOUTS_PER_PLAN` dropped layouts' lists alive per plan (device
memory that grows with N^2 / block size^2), and identity alone is sound with weak references:
a live referent is never confused with a new object at its address.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

LAYOUTS_PER_PLAN = 8
"""Layouts a plan keeps lists for; a ninth evicts the least recently used (a model's layers
use a handful, so alternating between them never rebuilds)."""


def layout_state(layout: torch.Tensor) -> tuple:
    """What an entry's lists depend on besides the layout's identity."""
    return (layout._version, layout.data_ptr(), layout.shape, layout.stride(), layout.dtype,
            layout.device)


@dataclass
class _Entry:
    ref: weakref.ref
    state: tuple
    lists: dict[bool, dict[str, torch.Tensor]] = field(default_factory=dict)
    """By `backward`: the forward's lists, or the backward's."""


class LayoutLists:
    """The block lists of the layouts one plan's calls passed, by layout object (see the
    module's docstring for when an entry is reused)."""

    def __init__(self, capacity: int = LAYOUTS_PER_PLAN):
        self.capacity = capacity
        self._entries: dict[int, _Entry] = {}  # by id(layout), least recently used first

    def __len__(self) -> int:
        return len(self._entries)

    def _entry(self, layout: torch.Tensor) -> _Entry | None:
        """The entry of this very layout object in its current state, or None."""
        key = id(layout)
        entry = self._entries.get(key)
        if entry is None or entry.ref() is not layout or entry.state != layout_state(layout):
            return None
        if next(reversed(self._entries)) != key:  # most recently used last
            self._entries[key] = self._entries.pop(key)
        return entry

    def get(
        self,
        layout: torch.Tensor,
        backward: bool,
        build: Callable[[], dict[str, torch.Tensor]],
        check: Callable[[], object] | None = None,
    ) -> dict[str, torch.Tensor]:
        """The forward's (or the backward's) lists of `layout`: cached, or `build()` and kept.
        A layout not seen in its current state is first checked by `check()` (which raises
        for a bad one) and gets an entry; without `check`, its lists are built and not kept."""
        entry = self._entry(layout)
        if entry is None:
            if check is None:
                return build()
            check()
            entry = self._store(layout)
        lists = entry.lists.get(backward)
        if lists is None:
            lists = entry.lists[backward] = build()
        return lists

    def _store(self, layout: torch.Tensor) -> _Entry:
        key = id(layout)
        self._entries.pop(key, None)
        while len(self._entries) >= self.capacity:
            del self._entries[next(iter(self._entries))]
        cache = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            # The layout was freed: drop its lists now (its address may be reused at once).
            owner = cache()
            entry = owner._entries.get(key) if owner is not None else None
            if entry is not None and entry.ref is ref:
                owner._entries.pop(key, None)

        entry = _Entry(weakref.ref(layout, forget), layout_state(layout))
        self._entries[key] = entry
        return entry
