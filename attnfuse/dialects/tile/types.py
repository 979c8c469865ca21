"""The tile dialect's types and enum attributes: `!tile.tile` (a register tile with symbolic
dimensions), `!tile.tensor` (a kernel parameter bound to a role), and the roles' axes."""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import (
    ArrayAttr,
    StringAttr,
    bf16,
    f16,
    f32,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    ParametrizedAttribute,
    SpacedOpaqueSyntaxAttribute,
    TypeAttribute,
)
from xdsl.irdl import (
    irdl_attr_definition,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

ELEMENT_TYPES: dict[str, Attribute] = {"f16": f16, "bf16": bf16, "f32": f32}
"""Element types a tile can hold: the kernel's input type, or f32 for accumulators."""


class TileDim(StrEnum):
    """A symbolic tile dimension (see the module docstring)."""

    M = "m"
    N = "n"
    D = "d"
    DV = "dv"
    HALF = "half"
    PASS = "pass"


@irdl_attr_definition
class TileDimAttr(EnumAttribute[TileDim], SpacedOpaqueSyntaxAttribute):
    """`#tile<dim m>`: one dimension of a `!tile.tile` (printed there as `m`)."""

    name = "tile.dim"


TILE_DIMS = tuple(d.value for d in TileDim)
"""Symbolic tile dimensions: program rows, loop rows, head dims, rotary half, pass-through."""


class Grid(StrEnum):
    """A kernel's launch grid (see `GRIDS`)."""

    QUERY_BLOCKS = "query_blocks"
    KEY_BLOCKS = "key_blocks"
    KV_SPLITS = "kv_splits"
    APPENDED_KEYS = "appended_keys"


@irdl_attr_definition
class GridAttr(EnumAttribute[Grid], SpacedOpaqueSyntaxAttribute):
    """`#tile<grid query_blocks>`: whose blocks a kernel's programs own."""

    name = "tile.grid"


class BlockOrder(StrEnum):
    """The order in which a grid's row blocks are handed to programs."""

    ASCENDING = "ascending"
    DESCENDING = "descending"


@irdl_attr_definition
class BlockOrderAttr(EnumAttribute[BlockOrder], SpacedOpaqueSyntaxAttribute):
    """`#tile<order descending>`: program `i` of a kernel's grid owns row block `i`
    (ascending) or the `i`-th block from the end (descending: under a causal mask the last
    query blocks are the longest, and starting the longest programs first shortens the
    launch's tail)."""

    name = "tile.order"


class Schedule(StrEnum):
    """How a kernel's work is laid out over its warps, beyond what `num_warps` says."""

    WARP_SPECIALIZED = "warp_specialized"


@irdl_attr_definition
class ScheduleAttr(EnumAttribute[Schedule], SpacedOpaqueSyntaxAttribute):
    """`#tile<schedule warp_specialized>` (set by `warp-specialize`): a flash-shaped forward
    kernel whose loads run in a producer partition of `producer_warps` warps, issuing TMA
    copies into a ring of `num_stages` shared-memory buffers per operand, while `num_warps / 4`
    consumer partitions, one warpgroup of 64 query rows each (`block_m = 16 * num_warps`), run
    the products as warpgroup MMAs and overlap each block's score step with the previous
    block's P @ V (and with each other's products). `consumer_registers` is what each consumer
    thread gets. `persistent = 1` (0 when absent): one program per SM walks the (query block,
    batch x head) tiles, longest first under `block_order = descending`, the producer copying
    the next tile's blocks while the consumers finish the current one. The Gluon target prints these kernels; the portable target prints one whose
    `block_m` is a power of two as any other and refuses the others (three consumers own 192
    rows); the runtime's portable launch is compiled from the unscheduled IR.

    On the fused backward's `key_blocks` kernel (`attention_bwd_dkdv_dq`): a loader partition
    of `producer_warps` copies k and v once and q, dO, lse and delta of each query block into
    the ring; the consumer, the kernel's own `num_warps` (one or two warpgroups of 64 keys,
    `block_m = 16 * num_warps`), runs the five products per block; `dq_writers` writer warps
    (1 when absent, or 2: each takes every other step) issue the `tile.store_add`s as TMA
    reduce-adds (`lowering/gluon_backward.py`)."""

    name = "tile.schedule"


class Rows(StrEnum):
    """Which rows a load or store touches (see `ROW_SOURCES`)."""

    PROGRAM = "program"
    LOOP = "loop"


@irdl_attr_definition
class RowsAttr(EnumAttribute[Rows], SpacedOpaqueSyntaxAttribute):
    """`#tile<rows program>` (printed in a block reference as `[program, ...]`)."""

    name = "tile.rows"


class Columns(StrEnum):
    """Which columns a load or store touches (see `COLUMN_PARTS`)."""

    ALL = "all"
    HALF_LO = "half_lo"
    HALF_HI = "half_hi"
    EVEN = "even"
    ODD = "odd"
    PASS = "pass"


@irdl_attr_definition
class ColumnsAttr(EnumAttribute[Columns], SpacedOpaqueSyntaxAttribute):
    """`#tile<cols half_lo>` (printed in a block reference as `[..., half_lo]`)."""

    name = "tile.cols"


class SeqAxis(StrEnum):
    """The query or the key sequence."""

    QUERY = "query"
    KEY = "key"


@irdl_attr_definition
class SeqAxisAttr(EnumAttribute[SeqAxis], SpacedOpaqueSyntaxAttribute):
    """`#tile<seq query>`: positions of query rows or of key rows; a sequence's length."""

    name = "tile.seq"


class Pairs(StrEnum):
    """How RoPE pairs dims: the two halves of the rotary width, or even and odd dims."""

    HALF = "half"
    INTERLEAVED = "interleaved"


@irdl_attr_definition
class PairsAttr(EnumAttribute[Pairs], SpacedOpaqueSyntaxAttribute):
    """`#tile<pairs half>`."""

    name = "tile.pairs"


def element_type_name(elem: Attribute) -> str:
    """The short name (`f16`, `bf16`, `f32`) of a tile element type."""
    for name, ty in ELEMENT_TYPES.items():
        if elem == ty:
            return name
    raise VerifyException(f"unsupported tile element type {elem}")


@irdl_attr_definition
class TileType(ParametrizedAttribute, TypeAttribute):
    """`!tile.tile<m x d x f16>`: a block of values held in registers.

    One or two symbolic dimensions, then the element type.
    """

    name = "tile.tile"

    dims: ArrayAttr[TileDimAttr]
    element_type: Attribute

    def __init__(self, dims: Sequence[str], element_type: Attribute):
        super().__init__(ArrayAttr([TileDimAttr(TileDim(d)) for d in dims]), element_type)

    @property
    def shape(self) -> tuple[str, ...]:
        """The symbolic dimensions, outermost first."""
        return tuple(d.data for d in self.dims.data)

    @property
    def elem(self) -> str:
        """The element type's short name."""
        return element_type_name(self.element_type)

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            words: list[str] = []
            while True:
                words.append(parser.parse_identifier())
                if parser.parse_optional_keyword("x") is None:
                    break
        if len(words) < 2:
            parser.raise_error("a tile needs at least one dimension and an element type")
        *dims, elem = words
        if elem not in ELEMENT_TYPES:
            parser.raise_error(f"tile element type must be one of f16, bf16, f32, got '{elem}'")
        for dim in dims:
            if dim not in TILE_DIMS:
                parser.raise_error(
                    f"unknown tile dimension '{dim}' (expected one of {', '.join(TILE_DIMS)})"
                )
        return (ArrayAttr([TileDimAttr(TileDim(d)) for d in dims]), ELEMENT_TYPES[elem])

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{' x '.join(self.shape)} x {self.elem}>")

    def verify(self) -> None:
        shape = self.shape
        if not 1 <= len(shape) <= 2:
            raise VerifyException(f"a tile has one or two dimensions, got {len(shape)}")
        for dim in shape:
            if dim not in TILE_DIMS:
                raise VerifyException(
                    f"unknown tile dimension '{dim}' (expected one of {', '.join(TILE_DIMS)})"
                )
        element_type_name(self.element_type)


TENSOR_AXES: dict[str, str] = {
    "q": "bhnd",
    "k": "bhnd",
    "v": "bhnd",
    "o": "bhnd",
    "q_rot": "bhnd",
    "k_rot": "bhnd",
    "lse": "bhn",
    "rope_table": "cnd",
    "q_positions": "bn",
    "k_positions": "bn",
    "slopes": "",
    "bias": "bhnd",
    "doc_ids": "bn",
    "full_blocks": "bhnd",
    "full_count": "bhn",
    "partial_blocks": "bhnd",
    "partial_count": "bhn",
    # Backward: the output gradient, the per-row delta = rowsum(dO * O), the input gradients,
    # the full-size bias gradient, and block-sparse query-block lists per key block.
    "do": "bhnd",
    "delta": "bhn",
    "dq": "bhnd",
    "dk": "bhnd",
    "dv": "bhnd",
    "dbias": "bhnd",
    "dq_acc": "bhnd",
    "dq_order": "bhn",
    "full_q_blocks": "bhnd",
    "full_q_count": "bhn",
    "partial_q_blocks": "bhnd",
    "partial_q_count": "bhn",
    "full_q_rank": "bhnd",
    "partial_q_rank": "bhnd",
    # Decoding: per-sequence key counts, a paged cache's page lists, and the partial results
    # of a split key range (one per split `s`), which a merge kernel combines.
    "kv_lens": "",
    "block_table": "bn",
    "o_part": "bhsnd",
    "lse_part": "bhsn",
    # A cache append: the KV cache (contiguous or page pools) the new k and v are written to.
    "k_cache": "bhnd",
    "v_cache": "bhnd",
    "split_counts": "",
}
"""Kernel tensor parameters by role, with the axes the kernel indexes them by (each axis
gets a stride argument; an empty string means a contiguous vector):
`[B, H, N, D]` operands; the log-sum-exp `[B, Hq, Nq]`; the rotary table
`[2, positions, rotary_dim / 2]` (cos, then sin, of each position's angle per pair);
call-time RoPE positions `[B, N]` (a shared `[N]` has batch stride 0); ALiBi slopes `[Hq]`; the additive bias `[B, Hq, Nq, Nk]` (broadcast
through zero strides); document ids `[B, Nk]` (a shared `[Nk]` has batch stride 0); and the
block lists of listed filters (block sparsity, documents), key-block lists
`[B, H, query blocks, entries]` with their lengths `[B, H, query blocks]` (`full_*`: blocks
needing no mask, `partial_*`: masked; shared ones have zero strides).
Backward kernels add `do` (dL/dO), `delta` `[B, Hq, Nq]` (rowsum(dO * O), fp32), the
gradients `dq`, `dk`, `dv`, `dbias` `[B, Hq, Nq, Nk]` (before reduction over broadcast dims),
the fused backward's `dq_acc` `[B, Hq, Nq, D]` (fp32, zeroed before the dK/dV kernel adds
each block pair's unscaled `dS K` into it with `tile.store_add`), its `dq_order` `[B, Hq,
Nq]` (int32, zeroed with it: the counter of a query block, at the block's first row, holds
the key block that adds into the block's rows next, or, under block lists, how many key blocks
have added, for a `tile.store_add` in key-block order),
and, for key-block programs, the transposed lists `*_q_blocks` / `*_q_count`
`[B, H, key blocks, ...]` (query blocks per key block), with, for adds in key-block order,
`*_q_rank` beside each list (int32, entry for entry: how many lower key blocks visit the
entry's query block, the entry's turn at its counter in `dq_order`).
Decoding adds `kv_lens` `[B]` (int32: sequence `b` has keys `j < kv_lens[b]`; a kernel with
this parameter reads its key count per batch, clamped to `[0, Nk]`), `block_table`
`[B, pages]` (int32: a paged cache's pages in sequence order; with it the key-row operands
are page pools `[pages, Hkv, page_size, D]`, see `KernelOp`), and a split kernel's partial
results `o_part` `[B, Hq, splits, Nq, Dv]` and `lse_part` `[B, Hq, splits, Nq]` (fp32).
A cache append writes `k_cache`, `v_cache` (`[B, Hkv, L_max, D]`, or page pools with a
`block_table`). `split_counts` (int32, one per (batch, key/value head, row block), zero
between calls) counts the split programs that have stored their partials
(`tile.merge_last_split`)."""

BLOCK_LIST_ROLES = tuple(role for role in TENSOR_AXES if role.endswith(("_blocks", "_count", "_rank")))
"""The block lists, their lengths and their entries' ranks: indexed by (batch, head, the
program's block)."""

TENSOR_ROLES: dict[str, int] = {role: max(1, len(axes)) for role, axes in TENSOR_AXES.items()}
"""The rank of each role's tensor."""

INDEXED_ROLES = ("slopes", "bias", "dbias")
"""Kinds of call-time data of which a kernel may read several tensors (two `attn.alibi` ops
with different slopes): the first is bound to the kind's name, the next to `slopes_1`, ..."""


def role_kind(role: str) -> str:
    """The kind of a tensor role (`slopes_1` is a `slopes`), which fixes its axes and rank."""
    if role in TENSOR_AXES:
        return role
    base, _, index = role.rpartition("_")
    if base in INDEXED_ROLES and index.isdigit():
        return base
    raise KeyError(role)


def role_axes(role: str) -> str:
    """The axes a kernel indexes a tensor of `role` by (see `TENSOR_AXES`)."""
    return TENSOR_AXES[role_kind(role)]

BLOCK_ROLES = ("q", "k", "v", "o", "q_rot", "k_rot", "lse", "do", "delta", "dq", "dk", "dv",
               "dq_acc", "o_part", "lse_part", "k_cache", "v_cache")
"""Roles accessed by `tile.load` / `tile.store` blocks of rows."""

QUERY_ROW_ROLES = ("q", "q_rot", "o", "lse", "do", "delta", "dq", "dq_acc", "o_part", "lse_part")
"""Block roles whose rows are queries; the others (k, k_rot, v, dk, dv) have key rows."""


def rows_axis(grid: str, rows: str) -> str:
    """Whether the program's or the loop's rows of a kernel on `grid` are queries or keys."""
    program = "key" if grid in ("key_blocks", "appended_keys") else "query"
    loop = "query" if grid in ("key_blocks", "appended_keys") else "key"
    return program if rows == "program" else loop


KEY_ROW_ROLES = tuple(role for role in BLOCK_ROLES if role not in QUERY_ROW_ROLES)
"""Block roles whose rows are keys, indexed by the key/value head."""

FP32_ROLES = ("lse", "delta", "o_part", "lse_part", "dq_acc")
"""Block roles that are fp32 whatever the kernel's element type (per-row statistics, split
partials, and the fused backward's dQ accumulator)."""
WIDENABLE_ROLES = ("q", "k", "q_rot", "k_rot")
"""Operand roles a kernel may load widened to f32 (for score products far more exact than
products of element-type operands)."""


@irdl_attr_definition
class TensorType(ParametrizedAttribute, TypeAttribute):
    """`!tile.tensor<q>`: a tensor in global memory, passed to the kernel by role.

    The role fixes its rank and its index layout: `[batch, head, row, col]` for operands.
    The runtime binds a torch tensor to each role and passes its strides.
    """

    name = "tile.tensor"

    role: StringAttr

    def __init__(self, role: str):
        super().__init__(StringAttr(role))

    @property
    def rank(self) -> int:
        return TENSOR_ROLES[role_kind(self.role.data)]

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        with parser.in_angle_brackets():
            return (StringAttr(parser.parse_identifier()),)

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.role.data}>")

    def verify(self) -> None:
        try:
            role_kind(self.role.data)
        except KeyError:
            raise VerifyException(
                f"unknown tensor role '{self.role.data}' "
                f"(expected one of {', '.join(TENSOR_ROLES)})"
            ) from None
