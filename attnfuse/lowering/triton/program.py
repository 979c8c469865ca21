"""What printing a module gives the runtime: the Triton source and, per kernel, `KernelInfo` (its
roles, grid and launch parameters); and small helpers of the printed expressions."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import FloatAttr

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

MERGE_STEP_VALUES = 8192
"""The fp32 partial outputs a split merge's step aims at, `[BLOCK_M, splits, BLOCK_DV]`: 64
registers a thread at four warps (a step holds one split at least, so a 64-row program at head
dim 256 holds 16384)."""
MAX_SPLITS_PER_STEP = 64


def plus(expr: str, offset: int) -> str:
    """`expr + offset`, written the way a person would."""
    if offset == 0:
        return expr
    return f"{expr} + {offset}" if offset > 0 else f"{expr} - {-offset}"


def scale_expression(scale: FloatAttr | None) -> str:
    """A score scale in the generated code: the static value, or the kernel's `sm_scale`."""
    return "sm_scale" if scale is None else repr(scale.value.data)


def padded(width: int) -> int:
    """The power-of-two tile width holding `width` columns: at least 16 for `tl.dot`."""
    size = 16
    while size < width:
        size *= 2
    return size


@dataclass(frozen=True)
class KernelInfo:
    """How to launch one generated kernel."""

    name: str
    roles: tuple[str, ...]
    grid: str
    block_m: int
    num_warps: int
    num_stages: int
    shared_offsets: tuple[str, str] | None = None
    """(follower, leader): the kernel has a `SHARED_OFFSETS` constexpr; when the runtime sets
    it (the two roles' row and column strides are equal), the follower's loop loads use the
    leader's offsets (`tile.kernel`'s `shared_offsets`, set by `share-offsets`)."""
    splits: bool = False
    """The kernel takes `num_splits, split_len` after `group_size`: a split decode kernel
    (`kv_splits` grid) or the merge of its partial results."""
    paged: bool = False
    """The kernel reads or writes page pools (a `block_table` role) and takes `num_pages`, the
    pools' page count, after the other scalars: the bound its block-table entries are clamped
    to (or, in a cache append, checked against)."""
    head_major: bool = False
    """The grid is one axis of (batch x head) x blocks, heads outermost (`tile.kernel`'s
    `head_major`): the runtime launches `(batch x heads x blocks, 1)`."""
    launch_pdl: bool = False
    """The kernel is launched as a programmatic dependent of the kernel before it (Triton's
    `launch_pdl`): a split decode's merge printed with `pdl = 1` for a GPU, which waits for
    the split kernel (`gdc_wait`) before reading its partials."""


@dataclass(frozen=True)
class TritonProgram:
    """A generated Triton module: its source and how to launch each kernel in it."""

    source: str
    kernels: tuple[KernelInfo, ...]

    def kernel(self, name: str) -> KernelInfo:
        for info in self.kernels:
            if info.name == name:
                return info
        raise KeyError(name)


GDC_FUNCTIONS = ("gdc_launch_dependents", "gdc_wait")
"""Triton's grid-dependency control (`triton.language.extra.cuda`, Triton 3.6 and later),
imported by a module whose kernels are printed with `pdl` (`KernelEmitter.pdl`)."""
