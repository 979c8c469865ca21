"""Block sparsity, `block_sparse(block_size)`: key j is kept for query i iff
`block_layout[i // bs, j // bs]` (per head when the layout has a head dim).

The layout is call-time data (`block_layout=`). The kernels never test it per entry: kernel
blocks lie inside layout blocks, so each kernel tile is kept or dropped whole (`tiles`), and
the runtime turns that into lists of the key (or query) blocks each program visits
(`attnfuse.runtime.block_lists`): time scales with the layout's density.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from xdsl.dialects.builtin import IntegerAttr, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import LayoutType, ScoresType
from attnfuse.dialects.interfaces import DataUse, KeyFilter
from attnfuse.dsl.blocks import Block
from attnfuse.errors import ArgumentError, CompositionError


MAX_BLOCK_SIZE = 2**30
"""The largest block size: a block of more positions than a sequence can have (int32 positions)
says nothing more, and the op's i64 attribute holds it."""


def valid_block_size(size: int) -> bool:
    """Whether `size` can be a layout's block: a power of two in [16, `MAX_BLOCK_SIZE`] (the
    one rule of `block_sparse()` and `attn.block_sparse`'s verifier)."""
    return 16 <= size <= MAX_BLOCK_SIZE and size & (size - 1) == 0


@dataclass(frozen=True)
class BlockSparseSemantics(KeyFilter):
    """What `attn.block_sparse` means: a block-granular filter read from a call-time layout."""

    rank: int = 101

    def block_size(self, op: Operation) -> int | None:
        assert isinstance(op, BlockSparseOp)
        return op.block_size.value.data

    def data(self, op: Operation) -> Sequence[DataUse]:
        return (DataUse("block_layout", argument="block_layout"),)

    def bind(self, op: Operation, use: DataUse, problem: Any, arguments: dict[str, Any]) -> Any:
        """The layout as `[H, rows, cols]` (H = 1 when shared by all heads), checked."""
        import torch

        block_size = self.block_size(op)
        layout = arguments.get("block_layout")
        if layout is None:
            raise ArgumentError(f"block_sparse({block_size}) needs block_layout= at call time")
        if not isinstance(layout, torch.Tensor):
            raise ArgumentError(f"block_layout must be a torch.Tensor, got {type(layout).__name__}")
        if layout.dtype != torch.bool:
            raise ArgumentError(f"block_layout must be a bool tensor, got {layout.dtype}")
        if layout.device != problem.device:
            raise ArgumentError(f"block_layout is on {layout.device}, but q is on {problem.device}")
        rows, cols = -(-problem.seq_q // block_size), -(-problem.seq_k // block_size)
        if layout.dim() == 2 and tuple(layout.shape) == (rows, cols):
            return layout[None]
        if layout.dim() == 3 and tuple(layout.shape) == (problem.heads_q, rows, cols):
            return layout
        raise ArgumentError(
            f"block_layout must have shape [{rows}, {cols}] or [{problem.heads_q}, {rows}, {cols}] "
            f"(ceil(N / {block_size}) blocks), got {list(layout.shape)}"
        )

    def tiles(self, op: Operation, data: Any, problem: Any, q_block: int, k_block: int) -> tuple[Any, Any]:
        """A kernel tile lies inside one layout block (the runtime caps tile sizes at the
        block size): it is visited, and full, iff the layout keeps that block."""
        import torch

        bs = self.block_size(op)
        assert bs is not None and q_block <= bs and k_block <= bs
        qb = torch.arange(-(-problem.seq_q // q_block), device=data.device)
        kb = torch.arange(-(-problem.seq_k // k_block), device=data.device)
        keep = data[:, (qb * q_block) // bs][:, :, (kb * k_block) // bs]
        return keep[None], keep[None]

    def evaluate(self, op: Operation, env: Any) -> Any:
        import torch

        layout = env.tensors.get("block_layout")
        if layout is None:
            raise ArgumentError("block_sparse needs block_layout= at call time")
        bs = self.block_size(op)
        rows = torch.arange(env.seq_q) // bs
        cols = torch.arange(env.seq_k) // bs
        keep = layout.cpu()[..., rows, :][..., cols]
        return keep[None] if keep.dim() == 3 else keep


@irdl_op_definition
class BlockSparseOp(IRDLOperation):
    """Drops key j for query i unless `layout[i // block_size, j // block_size]` (per head when
    the layout has a head dim). `block_size` is a power of two in [16, 2^30]."""

    name = "attn.block_sparse"

    input = operand_def(ScoresType)
    layout = operand_def(LayoutType)
    result = result_def(ScoresType)
    block_size = prop_def(IntegerAttr)

    assembly_format = "$input `,` $layout attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure(), BlockSparseSemantics())

    def __init__(self, scores: SSAValue, layout: SSAValue, block_size: int):
        super().__init__(
            operands=[scores, layout],
            result_types=[ScoresType()],
            properties={"block_size": IntegerAttr(block_size, i64)},
        )

    def verify_(self) -> None:
        bs = self.block_size.value.data
        if not valid_block_size(bs):
            raise VerifyException(f"block_sparse block_size must be a power of two in [16, 2^30], got {bs}")


@dataclass(frozen=True, repr=False)
class BlockSparse(Block):
    """Keep key j for query i iff `block_layout[i // block_size, j // block_size]`."""

    block_size: int = 0
    category: ClassVar[str] = "mask"
    arguments: ClassVar[tuple[Attribute, ...]] = (LayoutType(),)
    hint: ClassVar[str] = "kept"

    def __post_init__(self) -> None:
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or not valid_block_size(bs):
            raise CompositionError(
                f"block_sparse: block_size must be a power of two in [16, 2^30], got {bs!r}"
            )

    def build(self, variant: Any, value: SSAValue) -> Operation:
        layout = variant.argument(LayoutType())
        assert layout is not None
        return BlockSparseOp(value, layout, self.block_size)


def block_sparse(block_size: int) -> BlockSparse:
    """Keep the blocks `block_layout[i // bs, j // bs]` marks; pass `block_layout=` (bool
    `[ceil(Nq/bs), ceil(Nk/bs)]` or per head `[Hq, ...]`) at call time."""
    return BlockSparse(block_size)


OPS = (BlockSparseOp,)
