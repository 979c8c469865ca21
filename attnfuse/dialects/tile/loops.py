"""Loops over blocks: the band bounds (`tile.kv_bounds`, `tile.q_bounds`), the range loops
(`tile.kv_loop`, `tile.q_loop`), the block-list loops (`tile.sparse_kv_loop`,
`tile.sparse_q_loop`) and their terminator `tile.yield`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    IndexType,
    UnitAttr,
)
from xdsl.ir import (
    Region,
    SSAValue,
)
from xdsl.irdl import (
    AttrSizedOperandSegments,
    IRDLOperation,
    ParsePropInAttrDict,
    irdl_op_definition,
    lazy_traits_def,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import (
    HasParent,
    IsTerminator,
    Pure,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.attn import BandAttr
from attnfuse.dialects.tile.checks import kernel_of
from attnfuse.dialects.tile.scores import (
    FILTER_OPS,
    ScoresOp,
)
from attnfuse.dialects.tile.splits import KVSplitOp
from attnfuse.dialects.tile.traits import (
    BlockLoop,
)
from attnfuse.dialects.tile.types import (
    TensorType,
    TileType,
)


class _BandBounds(IRDLOperation):
    """What `tile.kv_bounds` and `tile.q_bounds` share: four index results splitting the
    loop's block range into `[start, full_start)` partial blocks, `[full_start, full_end)` full
    blocks (every pair kept: no mask work) and `[full_end, end)` partial blocks, computed from
    the mask band and the block sizes. Blocks outside `[start, end)` are empty and never
    visited. Each is legal only in the grid whose program rows it bounds against."""

    ALLOWED_GRIDS: ClassVar[tuple[str, ...]]
    OWNS: ClassVar[str]

    band = prop_def(BandAttr)
    start = result_def(IndexType)
    full_start = result_def(IndexType)
    full_end = result_def(IndexType)
    end = result_def(IndexType)

    assembly_format = "attr-dict"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, band: BandAttr):
        super().__init__(result_types=[IndexType()] * 4, properties={"band": band})

    def verify_(self) -> None:
        kernel = kernel_of(self)
        if kernel is not None and kernel.grid not in self.ALLOWED_GRIDS:
            raise VerifyException(f"{self.name} needs a kernel whose programs own {self.OWNS} blocks")


@irdl_op_definition
class KVBoundsOp(_BandBounds):
    """The key blocks a query block visits (in a `query_blocks` kernel; in a `kv_splits`
    kernel, those that any query of the sequence visits), split as `_BandBounds` says."""

    name = "tile.kv_bounds"
    ALLOWED_GRIDS: ClassVar[tuple[str, ...]] = ("query_blocks", "kv_splits")
    OWNS: ClassVar[str] = "query"


class _RangeLoop(IRDLOperation):
    """What `tile.kv_loop` and `tile.q_loop` share: a block range `[lower, upper)`, stepped by
    `block_n`, carrying `iter_args`; `masked` when its blocks may be partial."""

    traits = traits_def(BlockLoop())

    lower = operand_def(IndexType)
    upper = operand_def(IndexType)
    inits = var_operand_def(TileType)
    results_ = var_result_def(TileType)
    masked = opt_prop_def(UnitAttr)
    body = region_def("single_block")

    assembly_format = (
        "$lower `to` $upper (`masked` $masked^)? `iter_args` `(` $inits `)` attr-dict"
        " `:` type($inits) `->` type($results_) $body"
    )

    def __init__(
        self,
        lower: SSAValue,
        upper: SSAValue,
        inits: Sequence[SSAValue],
        body: Region,
        masked: bool,
    ):
        super().__init__(
            operands=[lower, upper, inits],
            result_types=[[v.type for v in inits]],
            properties={"masked": UnitAttr() if masked else None},
            regions=[body],
        )

    def verify_(self) -> None:
        _verify_loop(self, self.inits, self.results_)
        kernel = kernel_of(self)
        if kernel is not None and kernel.grid == "kv_splits":
            # Each split program must visit its own split only, or the merge would count
            # keys once per split.
            for bound in (self.lower, self.upper):
                if not isinstance(bound.owner, KVSplitOp):
                    raise VerifyException(f"{self.name} in a kv_splits kernel must loop over "
                                          "bounds clipped by tile.kv_split")


@irdl_op_definition
class KVLoopOp(_RangeLoop):
    """Loops over key blocks `[lower, upper)` in steps of `block_n`, carrying `iter_args`.

    With `masked`, the blocks may be partial: loads of loop rows are bounds-checked, and
    scores computed in the loop must go through a filter (`tile.mask`, `tile.document_mask`),
    which drops the keys past the sequence end (and may drop others). Without it, every
    visited block is full and in bounds.
    """

    name = "tile.kv_loop"


def _verify_loop(loop: IRDLOperation, inits: Sequence[SSAValue], results: Sequence[SSAValue]) -> None:
    """What every loop must satisfy: carried types agree, the body ends in tile.yield, and the
    kernel's programs own the blocks the loop does not walk (keys for key loops, queries for
    query loops)."""
    init_types = [v.type for v in inits]
    if [r.type for r in results] != init_types:
        raise VerifyException(f"{loop.name} results must have the types of its iter_args")
    block = loop.regions[0].block
    if list(block.arg_types) != init_types:
        raise VerifyException(f"{loop.name} body arguments must have the types of its iter_args")
    terminator = block.last_op
    if not isinstance(terminator, YieldOp):
        raise VerifyException(f"{loop.name} body must end in tile.yield")
    if [v.type for v in terminator.values] != init_types:
        raise VerifyException("tile.yield must yield the types of the loop's iter_args")
    if loop.properties.get("masked") is not None and any(isinstance(op, ScoresOp) for op in block.ops) \
            and not any(isinstance(op, FILTER_OPS) for op in block.ops):
        # Its blocks may be partial: entries past the sequence end load as 0 and are not keys
        # (or queries). The filters drop them (tile.mask by position, tile.document_mask by
        # the -1 id it reads there), so scores of such a loop go through one.
        raise VerifyException(f"{loop.name} is masked (its blocks may be partial) and computes scores: they must "
                              "go through tile.mask (or tile.document_mask), which drop the entries past the "
                              "sequence end")
    kernel = kernel_of(loop)
    if isinstance(loop, QUERY_LOOP_OPS):
        grids = ("key_blocks",)
    elif isinstance(loop, KVLoopOp):
        grids = ("query_blocks", "kv_splits")
    else:
        grids = ("query_blocks",)  # block lists are per query block
    if kernel is not None and kernel.grid not in grids:
        owner = "key" if grids == ("key_blocks",) else "query"
        raise VerifyException(f"{loop.name} needs a kernel whose programs own {owner} blocks")


class _ListLoop(IRDLOperation):
    """What `tile.sparse_kv_loop` and `tile.sparse_q_loop` share: entries `[0, count)` of a
    block-sparse list for the program's block, each a block index in units of `block_n`,
    carrying `iter_args`; `masked` as for the range loops. `LISTS` are the (blocks, count)
    role pairs the loop may read."""

    traits = traits_def(BlockLoop())

    LISTS: ClassVar[tuple[tuple[str, str], ...]] = ()

    blocks = operand_def(TensorType)
    count = operand_def(TensorType)
    inits = var_operand_def(TileType)
    results_ = var_result_def(TileType)
    masked = opt_prop_def(UnitAttr)
    body = region_def("single_block")

    assembly_format = (
        "$blocks `,` $count (`masked` $masked^)? `iter_args` `(` $inits `)` attr-dict"
        " `:` type($blocks) `,` type($count) `,` type($inits) `->` type($results_) $body"
    )

    def __init__(
        self,
        blocks: SSAValue,
        count: SSAValue,
        inits: Sequence[SSAValue],
        body: Region,
        masked: bool,
        *between: Sequence[SSAValue],
    ):
        """`between`: a subclass's operand groups after the count (before `inits`)."""
        super().__init__(
            operands=[blocks, count, *between, inits],
            result_types=[[v.type for v in inits]],
            properties={"masked": UnitAttr() if masked else None},
            regions=[body],
        )

    def verify_(self) -> None:
        _verify_loop(self, self.inits, self.results_)
        roles = tuple(
            t.role.data for t in (self.blocks.type, self.count.type) if isinstance(t, TensorType)
        )
        if roles not in self.LISTS:
            (full, full_count), (partial, partial_count) = self.LISTS
            raise VerifyException(
                f"{self.name[len('tile.'):]} reads a block list and its count: {full} and "
                f"{full_count}, or {partial} and {partial_count}"
            )


@irdl_op_definition
class SparseKVLoopOp(_ListLoop):
    """Loops over the key blocks a block-sparse layout lists for the program's query block:
    entries `[0, count)` of `blocks[head, query block]`, each a key-block index (in units of
    `block_n`). Empty blocks are not in the list, so time scales with the layout's density.
    `masked` as for `tile.kv_loop`."""

    name = "tile.sparse_kv_loop"

    LISTS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("full_blocks", "full_count"),
        ("partial_blocks", "partial_count"),
    )


@irdl_op_definition
class QBoundsOp(_BandBounds):
    """The query blocks that visit the program's key block (in a `key_blocks` kernel), split
    as `_BandBounds` says: full query blocks keep every key of the block."""

    name = "tile.q_bounds"
    ALLOWED_GRIDS: ClassVar[tuple[str, ...]] = ("key_blocks",)
    OWNS: ClassVar[str] = "key"


@irdl_op_definition
class QLoopOp(_RangeLoop):
    """Loops over query blocks `[lower, upper)` in steps of `block_n`, for every query head
    that shares the program's key/value head (GQA: the group's gradients are summed here, in
    a fixed order, so the result is deterministic), carrying `iter_args`. `masked` as for
    `tile.kv_loop`: loads of loop rows are bounds-checked and `tile.mask` may drop pairs."""

    name = "tile.q_loop"


@irdl_op_definition
class SparseQLoopOp(_ListLoop):
    """Loops over the query blocks a block list gives the program's key block
    (`blocks[head, key block]`, entries `[0, count)`, in units of `block_n`), for every query
    head of the program's key/value head. `masked` as for `tile.kv_loop`.

    `ranks %r` (the list's `*_q_rank`, entry for entry: how many lower key blocks visit the
    entry's query block) is each entry's turn at its query block's counter, which a
    `tile.store_add` in key-block order inside the loop waits for: the key blocks a list
    sends to a query block need not be consecutive, so the turn cannot be computed from the
    key block as a band's loop computes it."""

    name = "tile.sparse_q_loop"

    LISTS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("full_q_blocks", "full_q_count"),
        ("partial_q_blocks", "partial_q_count"),
    )
    RANKS: ClassVar[dict[str, str]] = {"full_q_blocks": "full_q_rank", "partial_q_blocks": "partial_q_rank"}
    """The rank list that goes with each block list."""

    # Redeclared: IRDL orders a subclass's own operands before the inherited ones.
    blocks = operand_def(TensorType)
    count = operand_def(TensorType)
    ranks = opt_operand_def(TensorType)
    inits = var_operand_def(TileType)

    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    assembly_format = (
        "$blocks `,` $count (`ranks` $ranks^ `:` type($ranks))? (`masked` $masked^)? `iter_args` `(` $inits `)`"
        " attr-dict `:` type($blocks) `,` type($count) `,` type($inits) `->` type($results_) $body"
    )

    def __init__(
        self,
        blocks: SSAValue,
        count: SSAValue,
        inits: Sequence[SSAValue],
        body: Region,
        masked: bool,
        ranks: SSAValue | None = None,
    ):
        super().__init__(blocks, count, inits, body, masked, [] if ranks is None else [ranks])

    def verify_(self) -> None:
        super().verify_()
        if self.ranks is None:
            return
        blocks = self.blocks.type.role.data  # type: ignore[union-attr]
        expected = self.RANKS[blocks]
        if not isinstance(self.ranks.type, TensorType) or self.ranks.type.role.data != expected:
            raise VerifyException(f"the ranks of {blocks} are {expected}, not {self.ranks.type}")


KEY_LOOP_OPS = (KVLoopOp, SparseKVLoopOp)
"""Loops over key blocks (in `query_blocks` kernels)."""

QUERY_LOOP_OPS = (QLoopOp, SparseQLoopOp)
"""Loops over query blocks and the query heads of a key/value head (in `key_blocks` kernels)."""

LOOP_OPS = KEY_LOOP_OPS + QUERY_LOOP_OPS
"""Ops whose body runs once per loop block."""


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a loop body with the next values of its iter_args."""

    name = "tile.yield"

    values = var_operand_def(TileType)
    assembly_format = "$values attr-dict `:` type($values)"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(*LOOP_OPS)))

    def __init__(self, values: Sequence[SSAValue]):
        super().__init__(operands=[values])
