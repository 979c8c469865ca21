"""The `tile` dialect: *how* one fused kernel computes an attention variant.

A `tile.kernel` is one GPU program launched over a grid. Each program owns a block of rows
(`block_m` query rows for a forward kernel) of one (batch, head) pair, loads blocks of the
operands into registers, loops over key blocks (`tile.kv_loop`), and stores its results:

    tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, ...)
        attributes {grid = "query_blocks", block_m = 64 : i64, block_n = 64 : i64, ...} {
      %q_lo = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
      ...
      %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<upper = 0>}
      %acc, %row_max, %row_sum = tile.kv_loop %full_end to %end masked iter_args(...) {
        ...
      }
      tile.store %out, %o[program, all] : ...
      tile.return
    }

Tile types name their dimensions symbolically: `m` (the program's rows, `block_m`), `n` (the
key rows of one loop step, `block_n`), `d` / `dv` (the query-key and value head dims), `half`
(half the rotary width) and `pass` (the dims after the rotary width). Block shapes, warps and
pipeline stages are kernel attributes, so a tuner sets them without touching the program.

The dialect is general enough for the kernels AttnFuse needs: a forward kernel, the
pre-rotation kernels (`grid = "query_blocks"` or `"key_blocks"`, no loop), and, with new
grids, backward kernels that own key blocks and split-KV decode kernels that own key ranges.
Nothing in it is Triton syntax: `attnfuse.lowering.triton` prints it as Triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import (
    ArrayAttr,
    Float32Type,
    FloatAttr,
    FunctionType,
    IndexType,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    UnitAttr,
    bf16,
    f16,
    f32,
    f64,
    i1,
    i64,
)
from xdsl.dialects.utils import EnumAttribute, parse_func_op_like, print_func_op_like
from xdsl.ir import (
    Attribute,
    SpacedOpaqueSyntaxAttribute,
    Block,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    AnyOf,
    AttrSizedOperandSegments,
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_attr_definition,
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
from xdsl.parser import AttrParser, Parser
from xdsl.printer import Printer
from xdsl.traits import (
    HasParent,
    IsolatedFromAbove,
    IsTerminator,
    Pure,
    SymbolOpInterface,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from attnfuse.dialects.attn import BandAttr
from attnfuse.dialects.dominance import check_defined_before_use

# --------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------


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
the key block that adds into the block's rows next, for a `tile.store_add` in key-block order),
and, for key-block programs, the transposed lists `*_q_blocks` / `*_q_count`
`[B, H, key blocks, ...]` (query blocks per key block).
Decoding adds `kv_lens` `[B]` (int32: sequence `b` has keys `j < kv_lens[b]`; a kernel with
this parameter reads its key count per batch, clamped to `[0, Nk]`), `block_table`
`[B, pages]` (int32: a paged cache's pages in sequence order; with it the key-row operands
are page pools `[pages, Hkv, page_size, D]`, see `KernelOp`), and a split kernel's partial
results `o_part` `[B, Hq, splits, Nq, Dv]` and `lse_part` `[B, Hq, splits, Nq]` (fp32).
A cache append writes `k_cache`, `v_cache` (`[B, Hkv, L_max, D]`, or page pools with a
`block_table`). `split_counts` (int32, one per (batch, key/value head, row block), zero
between calls) counts the split programs that have stored their partials
(`tile.merge_last_split`)."""

BLOCK_LIST_ROLES = tuple(role for role in TENSOR_AXES if role.endswith(("_blocks", "_count")))
"""The block lists and their lengths: indexed by (batch, head, the program's block)."""

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


# --------------------------------------------------------------------------------------------
# Helpers for verifiers
# --------------------------------------------------------------------------------------------


def _tile(value: SSAValue, what: str) -> TileType:
    if not isinstance(value.type, TileType):
        raise VerifyException(f"{what} must be a !tile.tile, got {value.type}")
    return value.type


def _expect_shape(value: SSAValue, shape: tuple[str, ...], what: str) -> TileType:
    ty = _tile(value, what)
    if ty.shape != shape:
        raise VerifyException(
            f"{what} must be a {' x '.join(shape)} tile, got {' x '.join(ty.shape)}"
        )
    return ty


def _enclosing(op: Operation, kind: type[Operation]) -> Operation | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, kind):
        parent = parent.parent_op()
    return parent


def _expect_role(value: SSAValue, roles: str | tuple[str, ...], message: str) -> None:
    """Raises `message` unless `value` is a tensor bound to one of `roles`."""
    wanted = (roles,) if isinstance(roles, str) else roles
    if not isinstance(value.type, TensorType) or role_kind(value.type.role.data) not in wanted:
        raise VerifyException(message)


def _enclosing_loop(op: Operation) -> Operation | None:
    """The innermost key loop (`tile.kv_loop` or `tile.sparse_kv_loop`) around `op`."""
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, LOOP_OPS):
        parent = parent.parent_op()
    return parent


def _kernel_of(op: Operation) -> KernelOp | None:
    kernel = _enclosing(op, KernelOp)
    return kernel if isinstance(kernel, KernelOp) else None


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------

GRIDS = {
    "query_blocks": "one program per (batch x query head, query block)",
    "key_blocks": "one program per (batch x key/value head, key block)",
    "kv_splits": "one program per (batch x key/value head x block of the group's query rows, "
                 "split of the key range)",
    "appended_keys": "one program per (batch x key/value head, block of new keys)",
}
"""Launch grids. The grid fixes the orientation of score tiles: in a `query_blocks` kernel
the program's rows are queries and a loop's rows are keys, so scores are `query x key`; in a
`key_blocks` kernel (the dK/dV backward) the program's rows are keys and a loop's rows are
queries, so every score-shaped tile is transposed, `key x query`. Ops that need positions
(masks, ALiBi, bias, RoPE) read the orientation from the grid.

A `kv_splits` kernel (split-KV decoding) is oriented as `query_blocks`, but its program's
rows are the (query head, query) pairs of every query head that shares one key/value head
(row `r` is query `r % Nq` of the group's head `r // Nq`), so K and V are read once per
group, and its programs split the key range: program `(.., s)` visits the keys of split
`s` only (`tile.kv_split`) and writes its partial output and log-sum-exp (`o_part`,
`lse_part`), which `tile.merge_splits` combines.

An `appended_keys` kernel (a cache append) owns a block of new keys of one (batch, key/value
head): its row `r` is the key at cache position `kv_lens[batch] + r`, which is its position
(for RoPE) and the row it is stored at in `k_cache` / `v_cache` (through the block table of
a paged cache); rows past the cache's capacity are not written."""


def _is_power_of_two(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


HOPPER_SHARED_BYTES = 232448
"""Shared memory one program of an sm_90 SM may take (227 KB): what a warp-specialized
forward's buffers must fit (`KernelOp.verify_forward_resources`)."""


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One GPU kernel: its tensor parameters, launch grid and tuning attributes.

    Attributes: `grid` (see `GRIDS`), `block_m` (rows a program owns), `block_n` (key rows per
    loop step), `num_warps`, `num_stages` (software-pipelining depth), `head_dim`,
    `head_dim_v`, optional `rotary_dim`, `element_type` (the inputs' type), optional
    `block_order` (`#tile<order ...>`, ascending when absent), optional `shared_offsets`
    (`["do", "q"]`, set by `share-offsets`: when the runtime finds the two roles' row and
    column strides equal, the first role's loop loads reuse the second's offsets),
    optional `page_size` and optional `page_lookahead` (a paged kernel's key loops read the
    block-table entries of a step this many steps ahead: 1, the default when absent, reads
    the next step's entries during a step, so no K/V address waits on a table load in its
    own step and the loads software-pipeline like a contiguous cache's; 0 reads them in the
    step that uses them), optional `hoist_page_rows` (1, the default when absent: where a
    step's keys start a page or lie in one, each key's row in its page is the same every
    step and is computed once before the loop, and a step's table entries are indexed from
    its first key; 0: both from each key's position, every step), on a kernel that merges split partials optional `merge_stages`
    (the software-pipelining depth of its loop over the splits; 1, not pipelined, when
    absent), on a split decode's two kernels optional `pdl` (1: they overlap through
    programmatic dependent launch: the `kv_splits` kernel lets the kernel after it, the merge,
    launch while it runs, and the merge kernel, launched as its dependent, waits for it to
    complete before reading any partial result; 0, the default when absent: an ordinary
    launch after the split kernel has finished), and optional `schedule` (`#tile<schedule
    ...>`, with the integer attributes `producer_warps`, `consumer_registers` and optional
    `persistent`, or on the fused backward `producer_warps` and optional `dq_writers`; see
    `ScheduleAttr`).

    A kernel with a `kv_lens` parameter reads its key count per batch (`kv_lens[batch]`,
    clamped to the cache's length); one with a `block_table` parameter (and a `page_size`)
    reads a paged cache: its key-row operands (k, v) are page pools
    `[pages, Hkv, page_size, D]` and key `j` of batch `b` is row `j % page_size` of page
    `block_table[b, j // page_size]`. Both change only how rows are addressed and counted;
    positions (masks, ALiBi, RoPE) stay the logical key index `j`.
    """

    name = "tile.kernel"

    body = region_def("single_block")
    sym_name = prop_def(SymbolNameConstraint())
    function_type = prop_def(FunctionType)

    traits = traits_def(IsolatedFromAbove(), SymbolOpInterface())

    INT_ATTRS: ClassVar[tuple[str, ...]] = (
        "block_m",
        "block_n",
        "num_warps",
        "num_stages",
        "head_dim",
        "head_dim_v",
    )

    def __init__(
        self,
        name: str,
        roles: Sequence[str],
        *,
        grid: str,
        element_type: Attribute,
        config: dict[str, int],
    ):
        arg_types = [TensorType(role) for role in roles]
        super().__init__(
            properties={
                "sym_name": StringAttr(name),
                "function_type": FunctionType.from_lists(arg_types, []),
            },
            attributes={
                "grid": GridAttr(Grid(grid)),
                "element_type": element_type,
                **{key: IntegerAttr(value, i64) for key, value in config.items()},
            },
            regions=[Region(Block(arg_types=arg_types))],
        )
        for arg, role in zip(self.body.block.args, roles):
            arg.name_hint = role

    def int_attr(self, key: str) -> int | None:
        """An integer attribute, or None when absent."""
        attr = self.attributes.get(key)
        return attr.value.data if isinstance(attr, IntegerAttr) else None

    def get(self, key: str) -> int:
        """A required integer attribute (the verifier guarantees it)."""
        value = self.int_attr(key)
        assert value is not None, key
        return value

    @property
    def grid(self) -> str:
        attr = self.attributes["grid"]
        assert isinstance(attr, GridAttr)
        return attr.data

    @property
    def elem(self) -> str:
        return element_type_name(self.attributes["element_type"])

    @property
    def rotary_dim(self) -> int:
        """The rotary width: the `rotary_dim` attribute, or the head dim when absent."""
        value = self.int_attr("rotary_dim")
        return self.get("head_dim") if value is None else value

    @property
    def block_order(self) -> str:
        """`ascending` or `descending` (see `BlockOrderAttr`)."""
        attr = self.attributes.get("block_order")
        return attr.data if isinstance(attr, BlockOrderAttr) else BlockOrder.ASCENDING

    @property
    def schedule(self) -> str | None:
        """`warp_specialized`, or None for the portable schedule (see `ScheduleAttr`)."""
        attr = self.attributes.get("schedule")
        return attr.data if isinstance(attr, ScheduleAttr) else None

    @property
    def page_lookahead(self) -> int:
        """How many steps ahead a paged kernel's key loops read block-table entries (1 when
        the attribute is absent)."""
        value = self.int_attr("page_lookahead")
        return 1 if value is None else value

    @property
    def hoist_page_rows(self) -> int:
        """1 when a paged kernel's key loops compute the keys' rows in their pages once
        before the loop (where steps start pages or lie in one), 0 when every step computes
        them from the keys' positions (1 when the attribute is absent)."""
        value = self.int_attr("hoist_page_rows")
        return 1 if value is None else value

    @property
    def pdl(self) -> int:
        """1 when the kernel takes part in a split decode's programmatic dependent launch
        (the `pdl` attribute; 0 when absent)."""
        return self.int_attr("pdl") or 0

    @property
    def shared_offsets(self) -> tuple[str, ...] | None:
        """(follower, leader) roles whose loop loads may share offsets, or None."""
        attr = self.attributes.get("shared_offsets")
        if attr is None:
            return None
        if not isinstance(attr, ArrayAttr) or not all(isinstance(a, StringAttr) for a in attr.data):
            raise VerifyException(f"shared_offsets must be an array of role names, got {attr}")
        return tuple(a.data for a in attr.data)

    @property
    def roles(self) -> list[str]:
        """The tensor parameters' roles, in order."""
        return [t.role.data for t in self.function_type.inputs.data if isinstance(t, TensorType)]

    def argument(self, role: str) -> SSAValue:
        """The block argument bound to a tensor role."""
        return self.body.block.args[self.roles.index(role)]

    def _smallest(self, key: str) -> int:
        """The smallest `block_m` / `block_n`: 16, `tl.dot`'s smallest operand side; a split
        merge's rows multiply nothing, so it may own a single query row (the merge kernel
        of one-token decoding)."""
        if key == "block_m" and any(isinstance(op, MergeSplitsOp) for op in self.body.walk()):
            return 1
        return 16

    def verify_(self) -> None:
        grid = self.attributes.get("grid")
        if not isinstance(grid, GridAttr):
            raise VerifyException(f"kernel grid must be one of {', '.join(GRIDS)}")
        for key in self.INT_ATTRS:
            if self.int_attr(key) is None:
                raise VerifyException(f"kernel needs an integer attribute '{key}'")
        # A warp-specialized kernel's rows are whole consumer warpgroups (verify_schedule):
        # three of them own 192 rows.
        sized = ("block_n",) if isinstance(self.attributes.get("schedule"), ScheduleAttr) else ("block_m", "block_n")
        for key in sized:
            if not (_is_power_of_two(self.get(key)) and self.get(key) >= self._smallest(key)):
                raise VerifyException(f"{key} must be a power of two >= {self._smallest(key)}, got {self.get(key)}")
        if self.get("num_warps") not in (1, 2, 4, 8, 12, 16) or (self.get("num_warps") == 12 and "schedule" not in self.attributes):
            # 12 only for three warp-specialized consumers (verify_schedule).
            raise VerifyException(f"num_warps must be 1, 2, 4, 8 or 16, got {self.get('num_warps')}")
        if self.get("num_stages") < 1:
            raise VerifyException(f"num_stages must be >= 1, got {self.get('num_stages')}")
        for key in ("head_dim", "head_dim_v"):
            if not 1 <= self.get(key) <= 256:
                raise VerifyException(f"{key} must be in [1, 256], got {self.get(key)}")
        rotary = self.int_attr("rotary_dim")
        if rotary is not None and (rotary <= 0 or rotary % 2 or rotary > self.get("head_dim")):
            raise VerifyException(
                f"rotary_dim must be even and in (0, head_dim={self.get('head_dim')}], got {rotary}"
            )
        element_type_name(self.attributes.get("element_type", StringAttr("none")))
        check_defined_before_use(self)
        args = self.function_type.inputs.data
        if not all(isinstance(t, TensorType) for t in args):
            raise VerifyException("kernel parameters must all be !tile.tensor")
        if len(set(self.roles)) != len(self.roles):
            raise VerifyException("each tensor role may be bound to one kernel parameter only")
        if tuple(self.body.block.arg_types) != tuple(args):
            raise VerifyException("entry block arguments must match the kernel's parameters")
        if self.function_type.outputs.data:
            raise VerifyException("a kernel returns nothing: it writes its output tensors")
        order = self.attributes.get("block_order")
        if order is not None and not isinstance(order, BlockOrderAttr):
            raise VerifyException(f"block_order must be a #tile<order ...>, got {order}")
        self.verify_schedule()
        page_size = self.int_attr("page_size")
        paged = "block_table" in self.roles
        if paged != (page_size is not None):
            raise VerifyException(
                "a kernel reading a paged cache has a block_table parameter and an integer "
                "'page_size' attribute, both or neither"
            )
        if page_size is not None and page_size < 1:
            raise VerifyException(f"page_size must be >= 1, got {page_size}")
        merge_stages = self.attributes.get("merge_stages")
        if merge_stages is not None and (self.int_attr("merge_stages") or 0) < 1:
            raise VerifyException(f"merge_stages must be an integer >= 1, got {self.int_attr('merge_stages')}")
        lookahead = self.attributes.get("page_lookahead")
        if lookahead is not None:
            if not paged:
                raise VerifyException("page_lookahead is an attribute of a paged kernel (one with a block_table parameter)")
            if self.int_attr("page_lookahead") not in (0, 1):
                raise VerifyException(f"page_lookahead must be 0 or 1, got {self.int_attr('page_lookahead')}")
        if self.attributes.get("hoist_page_rows") is not None:
            if not paged:
                raise VerifyException("hoist_page_rows is an attribute of a paged kernel (one with a block_table parameter)")
            if self.int_attr("hoist_page_rows") not in (0, 1):
                raise VerifyException(f"hoist_page_rows must be 0 or 1, got {self.int_attr('hoist_page_rows')}")
        self.verify_pdl()
        if paged and "kv_lens" not in self.roles:
            raise VerifyException("a paged kernel needs a kv_lens parameter: the pages hold no length")
        if self.grid == "appended_keys" and "kv_lens" not in self.roles:
            raise VerifyException("an appended_keys kernel needs a kv_lens parameter: the new keys go after the cached ones")
        if paged and self.grid == "key_blocks":
            raise VerifyException("a paged cache is accessed by query_blocks, kv_splits and "
                                  "appended_keys kernels only")
        if self.shared_offsets is not None:
            missing = [r for r in self.shared_offsets if r not in self.roles]
            if len(self.shared_offsets) != 2 or missing:
                raise VerifyException(
                    "shared_offsets names two of the kernel's tensor roles (follower, leader), "
                    f"got {list(self.shared_offsets)}"
                )

    def verify_pdl(self) -> None:
        """`pdl` belongs to the two kernels of a split decode merged by a second kernel: the
        `kv_splits` kernel (the primary) and the one that merges its partials
        (`tile.merge_splits`, the dependent). A split kernel that merges its own splits
        (`tile.merge_last_split`) has no dependent kernel to launch early."""
        if self.attributes.get("pdl") is None:
            return
        value = self.int_attr("pdl")
        if value not in (0, 1):
            raise VerifyException(f"pdl must be 0 or 1, got {self.attributes['pdl'] if value is None else value}")
        walk = list(self.body.walk())
        if self.grid == "kv_splits":
            if any(isinstance(op, MergeLastSplitOp) for op in walk):
                raise VerifyException("pdl: a kv_splits kernel that merges its own splits "
                                      "(tile.merge_last_split) has no dependent kernel to launch early")
            return
        if not any(isinstance(op, MergeSplitsOp) for op in walk):
            raise VerifyException("pdl is an attribute of a split decode's kernels: a kv_splits "
                                  "kernel or the kernel that merges its partials (tile.merge_splits)")

    def verify_schedule(self) -> None:
        schedule = self.attributes.get("schedule")
        if schedule is None:
            for key in ("producer_warps", "consumer_registers", "persistent", "dq_writers"):
                if key in self.attributes:
                    raise VerifyException(f"'{key}' belongs to a #tile<schedule ...> kernel")
            return
        if not isinstance(schedule, ScheduleAttr):
            raise VerifyException(f"schedule must be a #tile<schedule ...>, got {schedule}")
        if self.grid == "key_blocks":
            self.verify_backward_schedule()
            return
        if self.grid != "query_blocks":
            raise VerifyException("a warp-specialized kernel owns query blocks (grid query_blocks) or, "
                                  "the fused backward's, key blocks (grid key_blocks)")
        warps, producers, registers = self.get("num_warps"), self.int_attr("producer_warps"), self.int_attr("consumer_registers")
        if warps % 4 or self.get("block_m") != 16 * warps:
            raise VerifyException(
                "a warp-specialized kernel's consumers are whole warpgroups of 16 rows per warp: "
                f"num_warps a multiple of 4 and block_m = 16 * num_warps, got {warps} and {self.get('block_m')}"
            )
        if producers is None or producers < 1:
            raise VerifyException("a warp-specialized kernel needs an integer 'producer_warps' >= 1")
        if registers is None or not 24 <= registers <= 255:
            raise VerifyException("a warp-specialized kernel needs an integer 'consumer_registers' in [24, 255]")
        if "persistent" in self.attributes and self.int_attr("persistent") not in (0, 1):
            raise VerifyException("'persistent' is an integer 0 or 1 (one program per SM walking the tiles)")
        if "dq_writers" in self.attributes:
            raise VerifyException("'dq_writers' belongs to a warp-specialized key_blocks kernel (the fused backward)")
        self.verify_forward_resources()

    def verify_forward_resources(self) -> None:
        """A warp-specialized forward fits a Hopper SM: its shared memory
        (`verify_forward_shared_memory`) and its consumers' registers
        (`verify_forward_registers`)."""
        self.verify_forward_shared_memory()
        self.verify_forward_registers()

    def verify_forward_registers(self) -> None:
        """A consumer thread's `consumer_registers` hold at least its share of the tiles it
        keeps across a key step: the output accumulator (64 rows x head_dim_v, fp32), the
        scores (64 x block_n, fp32) and their probabilities (64 x block_n, 16-bit), over a
        warpgroup's 128 threads. A lower bound (indices, row statistics and addresses come
        on top): a schedule below it cannot be allocated (ptxas: "Insufficient registers",
        as three consumers' 160 registers at head dim 256)."""
        keys, dim_v, registers = self.get("block_n"), self.get("head_dim_v"), self.int_attr("consumer_registers")
        parts = {"the output accumulator": 64 * dim_v, "the scores": 64 * keys, "the probabilities": 64 * keys // 2}
        needed = sum(parts.values()) // 128
        if registers is not None and needed > registers:
            listed = ", ".join(f"{what} {n // 128}" for what, n in parts.items())
            raise VerifyException(
                f"a warp-specialized kernel's consumer threads need at least {needed} registers ({listed}), "
                f"more than their consumer_registers = {registers}: fewer consumers (more registers each), "
                "or more consumer_registers")

    def verify_forward_shared_memory(self) -> None:
        """A warp-specialized forward's buffers fit a Hopper SM's shared memory
        (`HOPPER_SHARED_BYTES`): the query tile (block_m x head_dim), `num_stages` blocks of k
        (block_n x head_dim) and of v (block_n x head_dim_v), and with `persistent` an output
        buffer of its own (block_m x head_dim_v); 16-bit elements. (The printer's barriers and
        scratch take a few hundred bytes more; the buffers come in steps of kilobytes.)"""
        rows, keys, stages = self.get("block_m"), self.get("block_n"), self.get("num_stages")
        dim, dim_v = self.get("head_dim"), self.get("head_dim_v")
        parts = {"the query tile": rows * dim, f"{stages} stages of k and v": stages * keys * (dim + dim_v)}
        if self.int_attr("persistent") == 1:
            parts["the output buffer"] = rows * dim_v
        needed = 2 * sum(parts.values())
        if needed > HOPPER_SHARED_BYTES:
            listed = ", ".join(f"{what} {2 * n // 1024} KB" for what, n in parts.items())
            raise VerifyException(
                f"a warp-specialized kernel's buffers need {needed // 1024} KB of shared memory ({listed}), "
                f"more than Hopper's {HOPPER_SHARED_BYTES // 1024} KB: fewer keys per step (block_n), "
                "stages or consumers" + (", or no persistent grid" if "the output buffer" in parts else ""))

    def verify_backward_schedule(self) -> None:
        """A warp-specialized `key_blocks` kernel (the fused backward): one consumer partition
        of `num_warps` (4 or 8: one or two warpgroups of 64 keys, so `block_m = 16 *
        num_warps`) and a loader of `producer_warps`; the consumer is the kernel's own
        partition, which takes the registers the others leave (no `consumer_registers`);
        optional `dq_writers` (1 when absent): the warps issuing the `tile.store_add`s, 1 or 2
        (each owning one of the two dQ staging buffers, so every other step)."""
        warps, producers = self.get("num_warps"), self.int_attr("producer_warps")
        if warps not in (4, 8) or self.get("block_m") != 16 * warps:
            raise VerifyException(
                "a warp-specialized key_blocks kernel's consumer is one or two warpgroups of 64 keys: "
                f"num_warps 4 or 8 and block_m = 16 * num_warps, got {warps} and {self.get('block_m')}"
            )
        if producers is None or producers < 1:
            raise VerifyException("a warp-specialized kernel needs an integer 'producer_warps' >= 1")
        for key in ("consumer_registers", "persistent"):
            if key in self.attributes:
                raise VerifyException(f"'{key}' belongs to a warp-specialized query_blocks kernel, not a key_blocks one")
        if "dq_writers" in self.attributes and self.int_attr("dq_writers") not in (1, 2):
            raise VerifyException("'dq_writers' is an integer 1 or 2 (one writer warp per dQ staging buffer at most)")

    @classmethod
    def parse(cls, parser: Parser) -> KernelOp:
        name, inputs, outputs, region, extra, _arg_attrs, _res_attrs = parse_func_op_like(
            parser, reserved_attr_names=("sym_name", "function_type")
        )
        op = cls.create(
            properties={
                "sym_name": StringAttr(name),
                "function_type": FunctionType.from_lists(inputs, outputs),
            },
            attributes=dict(extra.data) if extra is not None else {},
            regions=[region],
        )
        return op

    def print(self, printer: Printer) -> None:
        print_func_op_like(
            printer,
            self.sym_name,
            self.function_type,
            self.body,
            self.attributes,
            reserved_attr_names=("sym_name", "function_type"),
        )


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Ends a kernel."""

    name = "tile.return"
    assembly_format = "attr-dict"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(KernelOp)))


# --------------------------------------------------------------------------------------------
# Memory: block loads and stores
# --------------------------------------------------------------------------------------------

ROW_SOURCES = tuple(r.value for r in Rows)
"""Which rows a load or store touches: the program's own row block, or the current key
block of the enclosing `tile.kv_loop`."""

COLUMN_PARTS = tuple(c.value for c in Columns)
"""Which columns: all of them, one element of every rotary pair (the first or second half
for half-split RoPE, even or odd dims for interleaved), or the dims after the rotary width.
Loading a pair's elements as separate tiles lets the rotation run without register shuffles."""


VALUE_WIDTH_ROLES = ("v", "o", "do", "dv", "o_part", "v_cache")
"""Roles whose columns are the value head dim `dv` rather than `d`."""


def _column_dim(role: str, cols: str) -> str:
    if cols == "all":
        return "dv" if role in VALUE_WIDTH_ROLES else "d"
    return "pass" if cols == "pass" else "half"


def _parse_block_ref(parser: Parser) -> tuple[str, str | None]:
    """`[rows, cols]` or `[rows]`."""
    parser.parse_punctuation("[")
    rows = parser.parse_identifier()
    if rows not in ROW_SOURCES:
        parser.raise_error(f"rows must be one of {', '.join(ROW_SOURCES)}, got '{rows}'")
    cols = parser.parse_identifier() if parser.parse_optional_punctuation(",") else None
    if cols is not None and cols not in COLUMN_PARTS:
        parser.raise_error(f"columns must be one of {', '.join(COLUMN_PARTS)}, got '{cols}'")
    parser.parse_punctuation("]")
    return rows, cols


def _verify_block_ref(op: Operation, role: str, rows: str, cols: str | None) -> None:
    # rows and cols are enum attributes: only their combination with the role needs checking.
    if rows == "loop" and _enclosing_loop(op) is None:
        raise VerifyException("loop rows can only be accessed inside a tile.kv_loop or tile.q_loop")
    if role not in BLOCK_ROLES:
        raise VerifyException(f"a {role} tensor is not accessed by blocks")
    kernel = _kernel_of(op)
    if kernel is not None:
        axis = "query" if role in QUERY_ROW_ROLES else "key"
        if axis != rows_axis(kernel.grid, rows):
            raise VerifyException(
                f"{role} rows are {axis} rows, but the {rows} rows of a {kernel.grid} kernel "
                f"are {rows_axis(kernel.grid, rows)} rows"
            )
    if kernel is not None:
        # A split kernel's rows see only part of the keys: it stores partial results, which
        # only a merge (`tile.merge_splits`) turns into the output.
        splits = kernel.grid == "kv_splits"
        if role in ("o_part", "lse_part") and not splits:
            raise VerifyException(f"{role} blocks are accessed only by kv_splits kernels")
        if splits and role in ("o", "lse"):
            raise VerifyException(f"a kv_splits kernel stores partial results (o_part, lse_part), not {role}")
        appending = kernel.grid == "appended_keys"
        if role in ("k_cache", "v_cache") and not appending:
            raise VerifyException(f"{role} blocks are accessed only by appended_keys kernels")
        if appending and role not in ("k", "v", "k_cache", "v_cache"):
            raise VerifyException(
                f"an appended_keys kernel reads the new k and v and writes k_cache and v_cache, not {role}")
    # Operands and gradients have a column axis (`d`); per-row statistics have none.
    if role_axes(role).endswith("d"):
        if cols is None:
            raise VerifyException(f"a {role} block needs columns: one of {', '.join(COLUMN_PARTS)}")
    elif cols is not None:
        raise VerifyException(f"a {role} tensor has no columns to select")


def expected_tile_shape(role: str, rows: str, cols: str | None) -> tuple[str, ...]:
    """The symbolic shape of a `[rows, cols]` block of a tensor of `role`."""
    row_dim = "m" if rows == "program" else "n"
    return (row_dim,) if cols is None else (row_dim, _column_dim(role, cols))


@irdl_op_definition
class LoadOp(IRDLOperation):
    """Loads a block of a tensor into a tile: `[rows, cols]` of the program's (batch, head).

    Rows past the tensor's length and columns past its width read as 0, so ragged sizes
    never read out of bounds. The tile has the kernel's element type (fp32 for the per-row
    statistics of `FP32_ROLES`). q and k (`WIDENABLE_ROLES`) may also be widened to f32 on
    load: a kernel that needs exact score products (see `ScoresOp`) reads them so.
    """

    name = "tile.load"

    source = operand_def(TensorType)
    result = result_def(TileType)
    rows = prop_def(RowsAttr)
    cols = opt_prop_def(ColumnsAttr)

    traits = traits_def(Pure())

    def __init__(self, source: SSAValue, rows: str, cols: str | None, result_type: TileType):
        super().__init__(
            operands=[source],
            result_types=[result_type],
            properties={
                "rows": RowsAttr(Rows(rows)),
                "cols": None if cols is None else ColumnsAttr(Columns(cols)),
            },
        )

    @property
    def role(self) -> str:
        assert isinstance(self.source.type, TensorType)
        return self.source.type.role.data

    def verify_(self) -> None:
        cols = None if self.cols is None else self.cols.data
        _verify_block_ref(self, self.role, self.rows.data, cols)
        expected = expected_tile_shape(self.role, self.rows.data, cols)
        ty = _expect_shape(self.result, expected, "loaded tile")
        kernel = _kernel_of(self)
        if self.role in FP32_ROLES and ty.elem != "f32":
            raise VerifyException(f"a loaded {self.role} tile must have element type f32, got {ty.elem}")
        if kernel is not None and self.role not in FP32_ROLES and ty.elem != kernel.elem:
            widenable = self.role in WIDENABLE_ROLES
            if not (widenable and ty.elem == "f32"):
                raise VerifyException(
                    f"a loaded {self.role} tile must have element type {kernel.elem}"
                    + (" (or be widened to f32)" if widenable else "") + f", got {ty.elem}"
                )

    @classmethod
    def parse(cls, parser: Parser) -> LoadOp:
        unresolved = parser.parse_unresolved_operand()
        rows, cols = _parse_block_ref(parser)
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        source_type = parser.parse_type()
        parser.parse_punctuation("->")
        result_type = parser.parse_type()
        if not isinstance(result_type, TileType):
            parser.raise_error(f"tile.load produces a !tile.tile, got {result_type}")
        source = parser.resolve_operand(unresolved, source_type)
        op = cls(source, rows, cols, result_type)
        op.attributes |= attrs
        return op

    def print(self, printer: Printer) -> None:
        cols = "" if self.cols is None else f", {self.cols.data}"
        printer.print_string(" ")
        printer.print_operand(self.source)
        printer.print_string(f"[{self.rows.data}{cols}]")
        printer.print_op_attributes(self.attributes)
        printer.print_string(f" : {self.source.type} -> {self.result.type}")


class _BlockWrite(IRDLOperation):
    """What `tile.store` and `tile.store_add` share: a tile written into `[rows, cols]` of a
    tensor, addressed as `tile.load` addresses it, with its syntax
    `value, dest[rows, cols] : tile -> tensor` (`tile.store_add` also
    `value, dest[rows, cols] in_order order : tile -> tensor, tensor`)."""

    VALUE_NAME: ClassVar[str]
    """What the verifier calls the written tile."""

    value = operand_def(TileType)
    dest = operand_def(TensorType)
    rows = prop_def(RowsAttr)
    cols = opt_prop_def(ColumnsAttr)

    def __init__(self, value: SSAValue, dest: SSAValue, rows: str, cols: str | None):
        super().__init__(
            operands=[value, dest],
            properties={
                "rows": RowsAttr(Rows(rows)),
                "cols": None if cols is None else ColumnsAttr(Columns(cols)),
            },
        )

    @property
    def role(self) -> str:
        assert isinstance(self.dest.type, TensorType)
        return self.dest.type.role.data

    def verify_(self) -> None:
        cols = None if self.cols is None else self.cols.data
        _verify_block_ref(self, self.role, self.rows.data, cols)
        _expect_shape(self.value, expected_tile_shape(self.role, self.rows.data, cols), self.VALUE_NAME)

    ORDERABLE: ClassVar[bool] = False
    """Whether the op takes an optional `in_order %tensor` clause (its `order` operand)."""

    @classmethod
    def parse(cls, parser: Parser) -> _BlockWrite:
        unresolved_value = parser.parse_unresolved_operand()
        parser.parse_punctuation(",")
        unresolved_dest = parser.parse_unresolved_operand()
        rows, cols = _parse_block_ref(parser)
        unresolved_order = None
        if cls.ORDERABLE and parser.parse_optional_keyword("in_order") is not None:
            unresolved_order = parser.parse_unresolved_operand()
        attrs = parser.parse_optional_attr_dict()
        parser.parse_punctuation(":")
        value_type = parser.parse_type()
        parser.parse_punctuation("->")
        dest_type = parser.parse_type()
        order = None
        if unresolved_order is not None:
            parser.parse_punctuation(",")
            order = parser.resolve_operand(unresolved_order, parser.parse_type())
        value = parser.resolve_operand(unresolved_value, value_type)
        dest = parser.resolve_operand(unresolved_dest, dest_type)
        op = cls(value, dest, rows, cols, *([order] if cls.ORDERABLE else []))
        op.attributes |= attrs
        return op

    def print(self, printer: Printer) -> None:
        cols = "" if self.cols is None else f", {self.cols.data}"
        order = getattr(self, "order", None) if self.ORDERABLE else None
        printer.print_string(" ")
        printer.print_operand(self.value)
        printer.print_string(", ")
        printer.print_operand(self.dest)
        printer.print_string(f"[{self.rows.data}{cols}]")
        if order is not None:
            printer.print_string(" in_order ")
            printer.print_operand(order)
        printer.print_op_attributes(self.attributes)
        printer.print_string(f" : {self.value.type} -> {self.dest.type}")
        if order is not None:
            printer.print_string(f", {order.type}")


@irdl_op_definition
class StoreOp(_BlockWrite):
    """Stores a tile into `[rows, cols]` of a tensor, converting to the tensor's type; rows
    and columns past the tensor's bounds are not written."""

    name = "tile.store"
    VALUE_NAME: ClassVar[str] = "stored tile"


@irdl_op_definition
class RotateOp(IRDLOperation):
    """Rotates rotary pairs in registers: `(a, b) -> (a cos - b sin, a sin + b cos)`.

    `lo` and `hi` hold the two elements of each pair (see `COLUMN_PARTS`); the angle of row r,
    pair t is `pos(r) * theta^(-2t/r)`, with `pos` a query position (`row + Nk - Nq`) or a key
    position (`row`), or read from `given_positions` (call-time positions); its cos and sin come from the runtime's `rope_table` (computed once per
    length: a table row costs two loads, far less than evaluating cos and sin per element).
    The rotation is done in fp32. With `inverse`, rotates by `-angle` (the transpose, for
    gradients).
    """

    name = "tile.rotate"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    lo = operand_def(T)
    hi = operand_def(T)
    table = operand_def(TensorType)
    given_positions = opt_operand_def(TensorType)
    lo_out = result_def(T)
    hi_out = result_def(T)
    positions = prop_def(SeqAxisAttr)
    inverse = opt_prop_def(UnitAttr)

    assembly_format = (
        "$lo `,` $hi `,` $table (`at` $given_positions^)? attr-dict `:` type($lo) `,` type($table)"
        " (`,` type($given_positions)^)?"
    )
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(
        self,
        lo: SSAValue,
        hi: SSAValue,
        table: SSAValue,
        positions: str,
        given_positions: SSAValue | None = None,
        inverse: bool = False,
    ):
        super().__init__(
            operands=[lo, hi, table, [] if given_positions is None else [given_positions]],
            result_types=[lo.type, hi.type],
            properties={
                "positions": SeqAxisAttr(SeqAxis(positions)),
                "inverse": UnitAttr() if inverse else None,
            },
        )

    def verify_(self) -> None:
        lo = _tile(self.lo, "rotated lo")
        if self.hi.type != lo or self.lo_out.type != lo or self.hi_out.type != lo:
            raise VerifyException("rotated tiles and results must all have one type")
        if len(lo.shape) != 2 or lo.shape[1] != "half":
            raise VerifyException(f"rotated tiles must be <rows x half>, got {' x '.join(lo.shape)}")
        _expect_role(self.table, "rope_table", "the table operand must be the rope_table tensor")
        kernel = _kernel_of(self)
        if kernel is not None:
            rows = "program" if lo.shape[0] == "m" else "loop"
            axis = rows_axis(kernel.grid, rows)
            if axis != self.positions.data:
                raise VerifyException(
                    f"{self.positions.data} positions, but the {rows} rows of a {kernel.grid} "
                    f"kernel are {axis} rows"
                )
        if self.given_positions is not None:
            expected = "q_positions" if self.positions.data == "query" else "k_positions"
            _expect_role(
                self.given_positions,
                expected,
                f"{self.positions.data} rows are rotated at {expected}, got "
                f"{self.given_positions.type}",
            )


PAIR_LAYOUTS = ("half", "interleaved")
"""How `tile.join` and `tile.split` lay out the two elements of each rotary pair."""


def pairs_fill_tiles(rotary_dim: int | None, head_dim: int) -> bool:
    """Whether the rotary pairs' halves fill their tiles exactly, so that a full-width tile can
    be joined from, or split into, them: the rotation covers the head dim (`rotary_dim` None
    means all of it), a power of two >= 32."""
    return rotary_dim in (None, head_dim) and head_dim >= 32 and head_dim & (head_dim - 1) == 0


def _verify_pair_layout(op: Operation, pairs: str) -> None:
    """What `tile.join` and `tile.split` need of their pair layout and kernel."""
    if pairs not in PAIR_LAYOUTS:
        raise VerifyException(f"pairs must be half or interleaved, got '{pairs}'")
    kernel = _kernel_of(op)
    if kernel is not None and not pairs_fill_tiles(kernel.rotary_dim, kernel.get("head_dim")):
        raise VerifyException(
            f"{op.name} needs rotary_dim == head_dim, a power of two >= 32; got "
            f"rotary_dim {kernel.rotary_dim}, head_dim {kernel.get('head_dim')}"
        )


@irdl_op_definition
class JoinOp(IRDLOperation):
    """Reassembles the two elements of every rotary pair into one full-width tile: the first
    and second halves side by side (`half`), or alternating (`interleaved`). Done once per
    program on the rotated query, it lets every key step use one full-width matrix product
    against a pre-rotated key instead of one product per part. Needs a rotary width equal to
    the head dim, a power of two >= 32 (so both halves fill their tiles exactly)."""

    name = "tile.join"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    lo = operand_def(T)
    hi = operand_def(T)
    result = result_def(TileType)
    pairs = prop_def(PairsAttr)

    assembly_format = "$lo `,` $hi attr-dict `:` type($lo) `->` type($result)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, lo: SSAValue, hi: SSAValue, pairs: str):
        lo_type = lo.type
        assert isinstance(lo_type, TileType)
        result = TileType((lo_type.shape[0], "d"), lo_type.element_type)
        super().__init__(
            operands=[lo, hi], result_types=[result], properties={"pairs": PairsAttr(Pairs(pairs))}
        )

    def verify_(self) -> None:
        lo = _tile(self.lo, "joined lo")
        if len(lo.shape) != 2 or lo.shape[1] != "half":
            raise VerifyException(f"joined tiles must be <rows x half>, got {' x '.join(lo.shape)}")
        _expect_shape(self.result, (lo.shape[0], "d"), "joined tile")
        if _tile(self.result, "joined tile").element_type != lo.element_type:
            raise VerifyException("tile.join keeps the element type of its operands")
        _verify_pair_layout(self, self.pairs.data)


@irdl_op_definition
class SplitOp(IRDLOperation):
    """The inverse of `tile.join`: splits a full-width tile into the two elements of every
    rotary pair (`half`: the first and second halves; `interleaved`: even and odd dims). Done
    once per program on an accumulated gradient, it lets the backward keep full-width
    accumulators (one matrix product per step) and still apply the rotation's transpose
    elementwise at the end. Same width restriction as `tile.join`."""

    name = "tile.split"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(TileType)
    lo = result_def(T)
    hi = result_def(T)
    pairs = prop_def(PairsAttr)

    assembly_format = "$input attr-dict `:` type($input) `->` type($lo)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue, pairs: str):
        ty = value.type
        assert isinstance(ty, TileType)
        half = TileType((ty.shape[0], "half"), ty.element_type)
        super().__init__(operands=[value], result_types=[half, half], properties={"pairs": PairsAttr(Pairs(pairs))})

    def verify_(self) -> None:
        ty = _tile(self.input, "split tile")
        if len(ty.shape) != 2 or ty.shape[1] != "d":
            raise VerifyException(f"a split tile must be <rows x d>, got {' x '.join(ty.shape)}")
        _expect_shape(self.lo, (ty.shape[0], "half"), "split halves")
        if _tile(self.lo, "split halves").element_type != ty.element_type:
            raise VerifyException("tile.split keeps the element type of its operand")
        _verify_pair_layout(self, self.pairs.data)


@irdl_op_definition
class ScoresOp(IRDLOperation):
    """`s = scale * sum_p q_p @ k_p^T`: the scores of the program's query rows against the
    loop's key rows, summed over matching column parts (fp32 accumulation). `scale` is static
    when given, else the kernel's `sm_scale` argument. With `unscaled` (set by
    `fold-scale-into-exp`) the product is left unscaled and every consumer, an exponential
    marked `unscaled_scores`, applies the scale where it multiplies anyway.

    Parts of the kernel's element type are multiplied at that precision. f32 parts in an
    f16/bf16 kernel are multiplied far more exactly than element-type parts (the Triton
    printer sums three half-precision products of split operands: about 2^-16 |q| |k| in
    bf16, `KernelEmitter.split_products`): the backward of
    ReLU attention with RoPE reads its rotated operands that way, because relu's derivative
    jumps at s = 0 and rounding the rotated q and k would move scores across it."""

    name = "tile.scores"

    queries = var_operand_def(TileType)
    keys = var_operand_def(TileType)
    result = result_def(TileType)
    scale = opt_prop_def(FloatAttr)
    unscaled = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(), ParsePropInAttrDict())
    assembly_format = (
        "`(` $queries `)` `x` `(` $keys `)` attr-dict `:` `(` type($queries) `)` `x`"
        " `(` type($keys) `)` `->` type($result)"
    )
    traits = traits_def(Pure())

    def __init__(
        self, queries: Sequence[SSAValue], keys: Sequence[SSAValue], scale: float | None = None
    ):
        super().__init__(
            operands=[queries, keys],
            result_types=[TileType(("m", "n"), f32)],
            properties={"scale": None if scale is None else FloatAttr(scale, f64)},
        )

    def verify_(self) -> None:
        if not self.queries or len(self.queries) != len(self.keys):
            raise VerifyException(
                f"scores needs as many query parts as key parts (at least one), got "
                f"{len(self.queries)} and {len(self.keys)}"
            )
        for i, (q, k) in enumerate(zip(self.queries, self.keys)):
            qt, kt = _tile(q, f"query part {i}"), _tile(k, f"key part {i}")
            if len(qt.shape) != 2 or qt.shape[0] != "m":
                raise VerifyException(f"query part {i} must be <m x _>, got {' x '.join(qt.shape)}")
            if len(kt.shape) != 2 or kt.shape[0] != "n":
                raise VerifyException(f"key part {i} must be <n x _>, got {' x '.join(kt.shape)}")
            if qt.shape[1] != kt.shape[1]:
                raise VerifyException(
                    f"query part {i} and key part {i} contract different dims: "
                    f"{qt.shape[1]} vs {kt.shape[1]}"
                )
            if qt.element_type != kt.element_type:
                raise VerifyException(f"query part {i} and key part {i} differ in element type")
        _expect_shape(self.result, ("m", "n"), "scores")
        if self.scale is not None and not self.scale.value.data > 0:
            raise VerifyException(f"scores scale must be positive, got {self.scale.value.data}")
        if self.unscaled is not None:
            for user, operand in scale_consumers(self.result):
                if not (isinstance(user, EXPONENTIAL_OPS) and operand is user.scores
                        and user.unscaled_scores is not None and user.scale == self.scale):
                    raise VerifyException(
                        f"unscaled scores must reach only exponentials that apply their scale "
                        f"(unscaled_scores, the same scale), but {user.name} reads them"
                    )


@irdl_op_definition
class MaskOp(IRDLOperation):
    """Sets the scores of dropped keys to -inf: keys outside `band` around each query's
    position, and keys past the sequence end. Only partial key blocks need it, so it may only
    appear in a `masked` loop."""

    name = "tile.mask"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)
    band = prop_def(BandAttr)

    assembly_format = "$input attr-dict `:` type($input)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, band: BandAttr):
        super().__init__(operands=[scores], result_types=[scores.type], properties={"band": band})

    def verify_(self) -> None:
        _expect_shape(self.input, ("m", "n"), "masked scores")
        if self.result.type != self.input.type:
            raise VerifyException("tile.mask keeps the type of its input")
        loop = _enclosing_loop(self)
        if loop is None or loop.properties.get("masked") is None:
            raise VerifyException("tile.mask belongs in a masked tile.kv_loop or tile.q_loop")


@irdl_op_definition
class DocumentMaskOp(IRDLOperation):
    """Sets to -inf the scores of pairs whose query and key lie in different documents:
    kept iff `doc_ids[q_pos] == doc_ids[key] >= 0` (`doc_ids` `[B, Nk]`; a negative id is
    padding, and a query position outside `[0, Nk)` has no document). Only partial blocks
    need it (the runtime's lists mark the blocks one document fills as full), so it may only
    appear in a `masked` loop; it reads the positions in either grid's orientation."""

    name = "tile.document_mask"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    doc_ids = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $doc_ids attr-dict `:` type($input) `,` type($doc_ids)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, doc_ids: SSAValue):
        super().__init__(operands=[scores, doc_ids], result_types=[scores.type])

    def verify_(self) -> None:
        _expect_shape(self.input, ("m", "n"), "document-masked scores")
        _expect_role(self.doc_ids, "doc_ids", "the document mask's operand must be the doc_ids tensor")
        loop = _enclosing_loop(self)
        if loop is None or loop.properties.get("masked") is None:
            raise VerifyException("tile.document_mask belongs in a masked loop")


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
        kernel = _kernel_of(self)
        if kernel is not None and kernel.grid not in self.ALLOWED_GRIDS:
            raise VerifyException(f"{self.name} needs a kernel whose programs own {self.OWNS} blocks")


@irdl_op_definition
class KVBoundsOp(_BandBounds):
    """The key blocks a query block visits (in a `query_blocks` kernel; in a `kv_splits`
    kernel, those that any query of the sequence visits), split as `_BandBounds` says."""

    name = "tile.kv_bounds"
    ALLOWED_GRIDS: ClassVar[tuple[str, ...]] = ("query_blocks", "kv_splits")
    OWNS: ClassVar[str] = "query"


@irdl_op_definition
class KVSplitOp(IRDLOperation):
    """Clips a key-block range (`tile.kv_bounds`' four bounds) to the program's split of the
    key range, in a `kv_splits` kernel: split `s` holds keys `[s * split_len, (s + 1) *
    split_len)`, `split_len` a call-time multiple of `block_n`, so a block that was full
    stays full and one that was partial stays partial. A split past a sequence's keys gets
    empty ranges, and its program stores an empty partial result (0 and lse -inf)."""

    name = "tile.kv_split"

    start = operand_def(IndexType)
    full_start = operand_def(IndexType)
    full_end = operand_def(IndexType)
    end = operand_def(IndexType)
    split_start = result_def(IndexType)
    split_full_start = result_def(IndexType)
    split_full_end = result_def(IndexType)
    split_end = result_def(IndexType)

    assembly_format = "$start `,` $full_start `,` $full_end `,` $end attr-dict"
    traits = traits_def(Pure())

    def __init__(self, start: SSAValue, full_start: SSAValue, full_end: SSAValue, end: SSAValue):
        super().__init__(operands=[start, full_start, full_end, end], result_types=[IndexType()] * 4)

    def verify_(self) -> None:
        kernel = _kernel_of(self)
        if kernel is not None and kernel.grid != "kv_splits":
            raise VerifyException("tile.kv_split needs a kv_splits kernel")


@irdl_op_definition
class MergeLastSplitOp(IRDLOperation):
    """In a `kv_splits` kernel, after the program stored its partial results: the last of the
    split programs of its rows to get here (counted in `split_counts`, which it resets to 0)
    merges every split's partials, as `tile.merge_splits` does, and stores the output `o`
    (and, with `weighted`, `lse`). One kernel instead of a split kernel and a merge kernel:
    no second launch, and the merge runs as soon as the last split is done."""

    name = "tile.merge_last_split"

    o_part = operand_def(TensorType)
    lse_part = operand_def(TensorType)
    split_counts = operand_def(TensorType)
    o = operand_def(TensorType)
    lse = opt_operand_def(TensorType)
    weighted = opt_prop_def(UnitAttr)

    irdl_options = (AttrSizedOperandSegments(), ParsePropInAttrDict())
    assembly_format = (
        "$o_part `,` $lse_part `,` $split_counts `into` $o (`,` $lse^)? (`weighted` $weighted^)? attr-dict"
        " `:` type($o_part) `,` type($lse_part) `,` type($split_counts) `,` type($o) (`,` type($lse)^)?"
    )

    def __init__(self, o_part: SSAValue, lse_part: SSAValue, split_counts: SSAValue, o: SSAValue,
                 lse: SSAValue | None, weighted: bool):
        super().__init__(
            operands=[o_part, lse_part, split_counts, o, [lse] if lse is not None else []],
            properties={"weighted": UnitAttr() if weighted else None},
        )

    def verify_(self) -> None:
        for value, role in ((self.o_part, "o_part"), (self.lse_part, "lse_part"),
                            (self.split_counts, "split_counts"), (self.o, "o")):
            _expect_role(value, role, f"tile.merge_last_split's operands are o_part, lse_part, split_counts, o and lse; got another role for {role}")
        if self.lse is not None:
            _expect_role(self.lse, "lse", "tile.merge_last_split stores its lse into an lse tensor")
        if (self.lse is not None) != (self.weighted is not None):
            raise VerifyException("tile.merge_last_split stores an lse exactly when it is weighted (softmax)")
        kernel = _kernel_of(self)
        if kernel is not None and kernel.grid != "kv_splits":
            raise VerifyException("tile.merge_last_split needs a kv_splits kernel")


@irdl_op_definition
class MergeSplitsOp(IRDLOperation):
    """Combines the partial results of a split kernel (`o_part`, `lse_part`) for the
    program's query rows, exactly: with `weighted` (softmax), each split's output is
    weighted by `exp(lse_s - lse)`, `lse = log(sum_s exp(lse_s))`, and a row no split kept
    a key for gets `o = 0`, `lse = -inf`; without it (pointwise normalizers, whose outputs
    are sums over keys) the outputs add and there is no lse (`lse` is then 0 and must not
    be stored). Loops over the call's splits itself; in a `query_blocks` kernel."""

    name = "tile.merge_splits"

    o_part = operand_def(TensorType)
    lse_part = operand_def(TensorType)
    weighted = opt_prop_def(UnitAttr)
    output = result_def(TileType)
    lse = result_def(TileType)

    assembly_format = (
        "$o_part `,` $lse_part (`weighted` $weighted^)? attr-dict `:` type($o_part) `,` "
        "type($lse_part) `->` type($output) `,` type($lse)"
    )
    irdl_options = (ParsePropInAttrDict(),)

    def __init__(self, o_part: SSAValue, lse_part: SSAValue, weighted: bool):
        super().__init__(
            operands=[o_part, lse_part],
            result_types=[TileType(("m", "dv"), f32), TileType(("m",), f32)],
            properties={"weighted": UnitAttr() if weighted else None},
        )

    def verify_(self) -> None:
        _expect_role(self.o_part, "o_part", "tile.merge_splits merges an o_part tensor")
        _expect_role(self.lse_part, "lse_part", "tile.merge_splits reads an lse_part tensor")
        _verify_f32_state([(self.output, ("m", "dv"), "merged output"), (self.lse, ("m",), "merged lse")])
        kernel = _kernel_of(self)
        if kernel is not None and kernel.grid != "query_blocks":
            raise VerifyException("tile.merge_splits needs a query_blocks kernel")
        if self.weighted is None and next(iter(self.lse.uses), None) is not None:
            raise VerifyException("an unweighted tile.merge_splits has no log-sum-exp: its lse "
                                  "result must not be used")


class _RangeLoop(IRDLOperation):
    """What `tile.kv_loop` and `tile.q_loop` share: a block range `[lower, upper)`, stepped by
    `block_n`, carrying `iter_args`; `masked` when its blocks may be partial."""

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
        kernel = _kernel_of(self)
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
    kernel = _kernel_of(loop)
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
    ):
        super().__init__(
            operands=[blocks, count, inits],
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
    """Loops over the query blocks a block-sparse layout lists for the program's key block
    (`blocks[head, key block]`, entries `[0, count)`, in units of `block_n`), for every query
    head of the program's key/value head. `masked` as for `tile.kv_loop`."""

    name = "tile.sparse_q_loop"

    LISTS: ClassVar[tuple[tuple[str, str], ...]] = (
        ("full_q_blocks", "full_q_count"),
        ("partial_q_blocks", "partial_q_count"),
    )


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


def _verify_loop_scores(op: Operation, scores: SSAValue, what: str) -> None:
    _expect_shape(scores, ("m", "n"), what)
    if _enclosing_loop(op) is None:
        raise VerifyException(f"{op.name} works on a key block: it belongs in a key loop")


@irdl_op_definition
class AlibiOp(IRDLOperation):
    """`s += slope[head] * (key_pos - q_pos)` for the loop's key block; slopes are a tensor
    of one fp32 value per query head."""

    name = "tile.alibi"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    slopes = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $slopes attr-dict `:` type($input) `,` type($slopes)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, slopes: SSAValue):
        super().__init__(operands=[scores, slopes], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_loop_scores(self, self.input, "ALiBi scores")
        _expect_role(self.slopes, "slopes", "the ALiBi operand must be the slopes tensor")


@irdl_op_definition
class AddBiasOp(IRDLOperation):
    """`s += bias[batch, head, rows, keys]` for the program's rows and the loop's key block
    (out-of-bounds entries read as 0: they are masked or discarded)."""

    name = "tile.add_bias"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    bias = operand_def(TensorType)
    result = result_def(T)

    assembly_format = "$input `,` $bias attr-dict `:` type($input) `,` type($bias)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, bias: SSAValue):
        super().__init__(operands=[scores, bias], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_loop_scores(self, self.input, "biased scores")
        _expect_role(self.bias, "bias", "the bias operand must be the bias tensor")


@irdl_op_definition
class ReluProbsOp(IRDLOperation):
    """ReLU attention weights `p = relu(s) / Nk` (dropped keys, at -inf, give 0)."""

    name = "tile.relu_probs"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)

    assembly_format = "$input attr-dict `:` type($input)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue):
        super().__init__(operands=[scores], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_f32_state([(self.input, ("m", "n"), "scores")])


@irdl_op_definition
class ZerosOp(IRDLOperation):
    """A tile of zeros."""

    name = "tile.zeros"

    result = result_def(TileType)
    assembly_format = "attr-dict `:` type($result)"
    traits = traits_def(Pure())

    def __init__(self, result_type: TileType):
        super().__init__(result_types=[result_type])


@irdl_op_definition
class SoftmaxInitOp(IRDLOperation):
    """Initial online-softmax state: accumulator 0, row max at the softmax's floor
    (`attn.SOFTMAX_FLOOR`, not -inf: a row whose scores all lie far below it gets no weight, and
    the step needs no test for a row with no kept key yet), row sum 0."""

    name = "tile.softmax_init"

    acc = result_def(TileType)
    row_max = result_def(TileType)
    row_sum = result_def(TileType)

    assembly_format = "attr-dict `:` type($acc) `,` type($row_max) `,` type($row_sum)"
    traits = traits_def(Pure())

    def __init__(self):
        super().__init__(
            result_types=[TileType(("m", "dv"), f32), TileType(("m",), f32), TileType(("m",), f32)]
        )

    def verify_(self) -> None:
        _expect_shape(self.acc, ("m", "dv"), "accumulator")
        _expect_shape(self.row_max, ("m",), "row max")
        _expect_shape(self.row_sum, ("m",), "row sum")


def _verify_f32_state(values: Sequence[tuple[SSAValue, tuple[str, ...], str]]) -> None:
    for value, shape, what in values:
        ty = _expect_shape(value, shape, what)
        if ty.elem != "f32":
            raise VerifyException(f"{what} must be f32, got {ty.elem}")


@irdl_op_definition
class SoftmaxUpdateOp(IRDLOperation):
    """One online-softmax step over a block of scores.

    `row_max' = max(row_max, rowmax(s))`, `p = exp(s - row_max')` (0 for dropped keys: the row
    max is never -inf, `tile.softmax_init`), `alpha = exp(row_max - row_max')`,
    `row_sum' = alpha * row_sum + rowsum(p)`.
    """

    name = "tile.softmax_update"

    S: ClassVar = VarConstraint("S", BaseAttr(TileType))
    R: ClassVar = VarConstraint("R", BaseAttr(TileType))
    scores = operand_def(S)
    row_max = operand_def(R)
    row_sum = operand_def(R)
    probs = result_def(S)
    new_row_max = result_def(R)
    new_row_sum = result_def(R)
    alpha = result_def(R)
    unscaled_scores = opt_prop_def(UnitAttr)
    """The scores arrive unscaled (`tile.scores ... unscaled`): the step multiplies them by
    `scale` (static when given, else `sm_scale`) inside its exponential and row max."""
    scale = opt_prop_def(FloatAttr)

    assembly_format = "$scores `,` $row_max `,` $row_sum attr-dict `:` type($scores) `,` type($row_max)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, row_max: SSAValue, row_sum: SSAValue):
        super().__init__(
            operands=[scores, row_max, row_sum],
            result_types=[scores.type, row_max.type, row_max.type, row_max.type],
        )

    def verify_(self) -> None:
        _verify_f32_state(
            [
                (self.scores, ("m", "n"), "scores"),
                (self.row_max, ("m",), "row max"),
                (self.row_sum, ("m",), "row sum"),
                (self.probs, ("m", "n"), "probabilities"),
                (self.alpha, ("m",), "rescale factor"),
            ]
        )


@irdl_op_definition
class AccumulateOp(IRDLOperation):
    """`acc' = acc * alpha + p @ v`: adds a loop block's weighted rows to the accumulator
    (`p` is converted to `v`'s type for the matrix product; accumulation is fp32; a `v`
    widened to f32 in an f16/bf16 kernel is rounded back to the kernel's type for it, so
    every such product runs at the element type's precision and tensor-core rate). Without
    `alpha` the accumulator is not rescaled. `acc` is `m x c` and `v` is `n x c` for any column
    dim `c`: the forward's `p @ V`, and the backward's `dS @ K` (dQ), `P^T @ dO` (dV) and
    `dS^T @ Q` (dK), per column part."""

    name = "tile.accumulate"

    A: ClassVar = VarConstraint("A", BaseAttr(TileType))
    acc = operand_def(A)
    probs = operand_def(TileType)
    value = operand_def(TileType)
    alpha = opt_operand_def(TileType)
    result = result_def(A)

    assembly_format = (
        "$acc `,` $probs `,` $value (`rescaled` $alpha^)? attr-dict"
        " `:` type($acc) `,` type($probs) `,` type($value) (`,` type($alpha)^)?"
    )
    traits = traits_def(Pure())

    def __init__(
        self, acc: SSAValue, probs: SSAValue, value: SSAValue, alpha: SSAValue | None = None
    ):
        super().__init__(
            operands=[acc, probs, value, [] if alpha is None else [alpha]],
            result_types=[acc.type],
        )

    def verify_(self) -> None:
        acc = _tile(self.acc, "accumulator")
        if len(acc.shape) != 2 or acc.shape[0] != "m":
            raise VerifyException(f"accumulator must be <m x _>, got {' x '.join(acc.shape)}")
        _verify_f32_state(
            [(self.acc, acc.shape, "accumulator"), (self.probs, ("m", "n"), "probabilities")]
        )
        _expect_shape(self.value, ("n", acc.shape[1]), "value block")
        if self.alpha is not None:
            _verify_f32_state([(self.alpha, ("m",), "rescale factor")])
        if self.result.type != self.acc.type:
            raise VerifyException("tile.accumulate keeps the accumulator's type")


@irdl_op_definition
class SoftmaxFinalizeOp(IRDLOperation):
    """`o = acc / row_sum` and `lse = row_max + log(row_sum)`; a row with no kept key gets
    `o = 0` and `lse = -inf` (never NaN)."""

    name = "tile.softmax_finalize"

    A: ClassVar = VarConstraint("A", BaseAttr(TileType))
    R: ClassVar = VarConstraint("R", BaseAttr(TileType))
    acc = operand_def(A)
    row_max = operand_def(R)
    row_sum = operand_def(R)
    output = result_def(A)
    lse = result_def(R)

    assembly_format = "$acc `,` $row_max `,` $row_sum attr-dict `:` type($acc) `,` type($row_max)"
    traits = traits_def(Pure())

    def __init__(self, acc: SSAValue, row_max: SSAValue, row_sum: SSAValue):
        super().__init__(
            operands=[acc, row_max, row_sum], result_types=[acc.type, row_max.type]
        )

    def verify_(self) -> None:
        _verify_f32_state(
            [
                (self.acc, ("m", "dv"), "accumulator"),
                (self.row_max, ("m",), "row max"),
                (self.row_sum, ("m",), "row sum"),
                (self.output, ("m", "dv"), "output"),
                (self.lse, ("m",), "log-sum-exp"),
            ]
        )


# --------------------------------------------------------------------------------------------
# Backward
# --------------------------------------------------------------------------------------------


def _verify_row_vector(op: Operation, scores: SSAValue, vector: SSAValue, what: str) -> None:
    """A per-query vector (lse, delta) must run along the query axis of the score tile: the
    program's rows (`m`) in a `query_blocks` kernel, the loop's rows (`n`) in a `key_blocks`
    one."""
    _verify_f32_state([(scores, ("m", "n"), "scores")])
    ty = _tile(vector, what)
    if ty.elem != "f32" or ty.shape not in (("m",), ("n",)):
        raise VerifyException(f"{what} must be an f32 <m> or <n> tile, got {ty}")
    kernel = _kernel_of(op)
    if kernel is not None:
        wanted = ("m",) if kernel.grid == "query_blocks" else ("n",)
        if ty.shape != wanted:
            raise VerifyException(
                f"{what} must run along the query axis, <{wanted[0]}> in a {kernel.grid} kernel"
            )


@irdl_op_definition
class RowDotOp(IRDLOperation):
    """`delta = rowsum(a * b)` in fp32: the softmax backward's `rowsum(dO * O)`, in the
    preprocess kernel or in the dQ kernel that forms delta itself."""

    name = "tile.row_dot"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("m",), f32)])

    def verify_(self) -> None:
        ty = _tile(self.lhs, "row_dot operand")
        if len(ty.shape) != 2 or ty.shape[0] != "m":
            raise VerifyException(f"row_dot operands must be <m x _>, got {' x '.join(ty.shape)}")
        _verify_f32_state([(self.result, ("m",), "row dot")])


@irdl_op_definition
class DotTransposedOp(IRDLOperation):
    """`r = a @ b^T` in fp32, for `a` over the program's rows and `b` over the loop's rows:
    the backward's `dP = dO @ V^T` (or `dP^T = V @ dO^T` in a `key_blocks` kernel)."""

    name = "tile.dot_transposed"

    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("m", "n"), f32)])

    def verify_(self) -> None:
        lhs, rhs = _tile(self.lhs, "left operand"), _tile(self.rhs, "right operand")
        if len(lhs.shape) != 2 or lhs.shape[0] != "m":
            raise VerifyException(f"left operand must be <m x _>, got {' x '.join(lhs.shape)}")
        if len(rhs.shape) != 2 or rhs.shape[0] != "n" or rhs.shape[1] != lhs.shape[1]:
            raise VerifyException(
                f"right operand must be <n x {lhs.shape[1]}>, got {' x '.join(rhs.shape)}"
            )
        if lhs.element_type != rhs.element_type:
            raise VerifyException("dot_transposed operands differ in element type")
        _verify_f32_state([(self.result, ("m", "n"), "product")])


@irdl_op_definition
class DotLhsTransposedOp(IRDLOperation):
    """`r = a^T @ b` in fp32, for `a` (`m x n`, f32) over (program rows, loop rows) and `b`
    (`m x c`) over the program's rows: the fused backward's `dQ` part `dS K` of one block
    pair in a `key_blocks` kernel, whose score-shaped tiles are transposed (`dS^T` is
    `key x query`), so the result is `n x c`, over the loop's (query) rows. `a` is rounded
    to `b`'s element type for the product, as `tile.accumulate` rounds its probabilities
    (a `b` widened to f32 in an f16/bf16 kernel is rounded back to the kernel's type
    first), so the product runs at the element type's precision and tensor-core rate."""

    name = "tile.dot_lhs_transposed"

    lhs = operand_def(TileType)
    rhs = operand_def(TileType)
    result = result_def(TileType)

    assembly_format = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)"
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        rhs_type = _tile(rhs, "right operand")
        cols = rhs_type.shape[-1]
        super().__init__(operands=[lhs, rhs], result_types=[TileType(("n", cols), f32)])

    def verify_(self) -> None:
        _verify_f32_state([(self.lhs, ("m", "n"), "left operand")])
        rhs = _tile(self.rhs, "right operand")
        if len(rhs.shape) != 2 or rhs.shape[0] != "m":
            raise VerifyException(f"right operand must be <m x _>, got {' x '.join(rhs.shape)}")
        kernel = _kernel_of(self)
        if kernel is not None and rhs.elem not in (kernel.elem, "f32"):
            raise VerifyException(
                f"right operand must have the kernel's element type {kernel.elem} (or be widened "
                f"to f32), got {rhs.elem}")
        _verify_f32_state([(self.result, ("n", rhs.shape[1]), "product")])


@irdl_op_definition
class StoreAddOp(_BlockWrite):
    """Adds an fp32 tile into `[rows, cols]` of an fp32 accumulator tensor (`dq_acc`), as
    `tile.store` addresses those rows (in a `key_blocks` kernel the loop's rows are the loop's
    query block of the loop's query head); rows and columns past the tensor's bounds are not
    touched. Programs add into the same rows concurrently (atomics, or TMA reduce-add): without
    `in_order` the sum's order, and so its last bits, is not deterministic.

    With `in_order %dq_order` the programs' adds into each query block are made in the order
    of their key blocks, so the sum, and dQ, is the same bit for bit from run to run: before
    its add, a program waits until the key block before its own has added into the block, if
    that key block visits it (the key blocks that visit a query block are consecutive: the
    first of them waits for none); after the add it hands the block on. The handover is the
    block's counter in `dq_order` (its first row's: the next key block to add), which must be
    0 when the kernel starts. A program waits only for programs of lower key blocks, which
    the GPU starts before it."""

    name = "tile.store_add"
    VALUE_NAME: ClassVar[str] = "added tile"
    ORDERABLE: ClassVar[bool] = True

    # Redeclared: IRDL orders a subclass's own operands before the inherited ones.
    value = operand_def(TileType)
    dest = operand_def(TensorType)
    order = opt_operand_def(TensorType)

    def __init__(self, value: SSAValue, dest: SSAValue, rows: str, cols: str | None,
                 order: SSAValue | None = None):
        IRDLOperation.__init__(
            self,
            operands=[value, dest, [] if order is None else [order]],
            properties={
                "rows": RowsAttr(Rows(rows)),
                "cols": None if cols is None else ColumnsAttr(Columns(cols)),
            },
        )

    @property
    def ordered(self) -> bool:
        """Whether the adds are made in key-block order (deterministic)."""
        return self.order is not None

    def verify_(self) -> None:
        _expect_role(self.dest, "dq_acc", f"tile.store_add adds into the dq_acc tensor, not {self.dest.type}")
        super().verify_()
        elem = _tile(self.value, self.VALUE_NAME).elem
        if elem != "f32":
            raise VerifyException(f"an added tile must have element type f32, got {elem}")
        if self.order is not None:
            _expect_role(self.order, "dq_order", f"tile.store_add orders its adds by the dq_order tensor, not {self.order.type}")
            kernel = _kernel_of(self)
            if self.rows.data != "loop" or (kernel is not None and kernel.grid != "key_blocks"):
                raise VerifyException("tile.store_add in key-block order adds the loop's query rows of a "
                                      "key_blocks kernel")
            # Each key block hands a query block to the next: consecutive visitors (a band's
            # ranges, not a block list's), and key blocks in ascending program order, so that
            # a program waits only for programs the GPU started before it.
            if isinstance(self.parent_op(), SparseQLoopOp):
                raise VerifyException("tile.store_add in key-block order cannot add in a tile.sparse_q_loop: "
                                      "the key blocks a block list sends to a query block need not be consecutive")
            if kernel is not None and kernel.block_order == BlockOrder.DESCENDING:
                raise VerifyException("tile.store_add in key-block order needs the kernel's blocks in ascending "
                                      "order (a program waits for the key block before its own)")


@irdl_op_definition
class RecomputeProbsOp(IRDLOperation):
    """Softmax probabilities from the forward's log-sum-exp: `p = exp(s - lse)`, 0 for
    dropped pairs and for rows with no kept key (`lse = -inf`, never NaN)."""

    name = "tile.recompute_probs"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    scores = operand_def(T)
    lse = operand_def(TileType)
    result = result_def(T)
    unscaled_scores = opt_prop_def(UnitAttr)
    """As `tile.softmax_update`'s: the exponential applies the scores' scale."""
    scale = opt_prop_def(FloatAttr)

    assembly_format = "$scores `,` $lse attr-dict `:` type($scores) `,` type($lse)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, lse: SSAValue):
        super().__init__(operands=[scores, lse], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_row_vector(self, self.scores, self.lse, "log-sum-exp")


@irdl_op_definition
class SoftmaxGradOp(IRDLOperation):
    """The gradient of the scores through softmax: `dS = P * (dP - delta)`, with `delta` the
    per-query `rowsum(dO * O)` (minus any gradient of the log-sum-exp)."""

    name = "tile.softmax_grad"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    probs = operand_def(T)
    grad_probs = operand_def(T)
    delta = operand_def(TileType)
    result = result_def(T)

    assembly_format = "$probs `,` $grad_probs `,` $delta attr-dict `:` type($probs) `,` type($delta)"
    traits = traits_def(Pure())

    def __init__(self, probs: SSAValue, grad_probs: SSAValue, delta: SSAValue):
        super().__init__(operands=[probs, grad_probs, delta], result_types=[probs.type])

    def verify_(self) -> None:
        _verify_row_vector(self, self.probs, self.delta, "delta")


@irdl_op_definition
class ReluGradOp(IRDLOperation):
    """The gradient of the scores through ReLU attention: `dS = dP / Nk` where `s > 0`, else
    0 (dropped pairs, at -inf, get 0)."""

    name = "tile.relu_grad"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    scores = operand_def(T)
    grad_probs = operand_def(T)
    result = result_def(T)

    assembly_format = "$scores `,` $grad_probs attr-dict `:` type($scores)"
    traits = traits_def(Pure())

    def __init__(self, scores: SSAValue, grad_probs: SSAValue):
        super().__init__(operands=[scores, grad_probs], result_types=[scores.type])

    def verify_(self) -> None:
        _verify_f32_state([(self.scores, ("m", "n"), "scores")])


@irdl_op_definition
class ApplyScaleOp(IRDLOperation):
    """`x * scale`: the score scale (static when given, else the kernel's `sm_scale`) applied
    once to an accumulated gradient (`dQ`, `dK`) instead of to every score gradient."""

    name = "tile.apply_scale"

    T: ClassVar = VarConstraint("T", BaseAttr(TileType))
    input = operand_def(T)
    result = result_def(T)
    scale = opt_prop_def(FloatAttr)

    irdl_options = (ParsePropInAttrDict(),)
    assembly_format = "$input attr-dict `:` type($input)"
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue, scale: float | None = None):
        super().__init__(
            operands=[value],
            result_types=[value.type],
            properties={"scale": None if scale is None else FloatAttr(scale, f64)},
        )

    def verify_(self) -> None:
        _verify_f32_state([(self.input, _tile(self.input, "scaled tile").shape, "scaled tile")])
        if self.scale is not None and not self.scale.value.data > 0:
            raise VerifyException(f"scale must be positive, got {self.scale.value.data}")


@irdl_op_definition
class StoreScoresOp(IRDLOperation):
    """Stores a score-shaped tile into a `[B, H, Nq, Nk]` tensor (the bias gradient) at the
    (query, key) pairs of the current block, in the grid's orientation; pairs past either
    sequence end are not written."""

    name = "tile.store_scores"

    value = operand_def(TileType)
    dest = operand_def(TensorType)

    assembly_format = "$value `,` $dest attr-dict `:` type($value) `,` type($dest)"

    def __init__(self, value: SSAValue, dest: SSAValue):
        super().__init__(operands=[value, dest])

    def verify_(self) -> None:
        _verify_loop_scores(self, self.value, "stored scores")
        _expect_role(self.dest, "dbias", "tile.store_scores writes the dbias tensor")


FILTER_OPS = (MaskOp, DocumentMaskOp)
"""Score ops that only drop entries (set them to -inf, whatever the scale), and only where a
loop is `masked`: a band's positions, a document filter's ids."""


def scale_consumers(scores: SSAValue) -> list[tuple[Operation, SSAValue]]:
    """The ops that read a block of scores, looking through the filters (`FILTER_OPS`, which
    keep a dropped score at -inf however it is scaled), with the value each reads."""
    users: list[tuple[Operation, SSAValue]] = []
    for use in scores.uses:
        if isinstance(use.operation, FILTER_OPS):
            users += scale_consumers(use.operation.result)
        else:
            users.append((use.operation, scores))
    return users


# --------------------------------------------------------------------------------------------
# Generic elementwise computation
# --------------------------------------------------------------------------------------------

@irdl_op_definition
class SeqLenOp(IRDLOperation):
    """The call's query (`Nq`) or key (`Nk`) sequence length as an f32 scalar, for the bodies
    of `tile.map` (sigmoid attention's default bias `-ln(Nk)`, say)."""

    name = "tile.seq_len"

    axis = prop_def(SeqAxisAttr)
    result = result_def(BaseAttr(Float32Type))

    assembly_format = "attr-dict `:` type($result)"
    irdl_options = (ParsePropInAttrDict(),)
    traits = traits_def(Pure())

    def __init__(self, axis: str):
        super().__init__(result_types=[f32], properties={"axis": SeqAxisAttr(SeqAxis(axis))})


MAP_BODY_OPS: tuple[type[Operation], ...] = (
    arith.ConstantOp, arith.AddfOp, arith.SubfOp, arith.MulfOp, arith.DivfOp, arith.NegfOp,
    arith.MaximumfOp, arith.MinimumfOp, arith.CmpfOp, arith.SelectOp,
    math.ExpOp, math.LogOp, math.SqrtOp, math.AbsFOp, math.TanhOp,
)
"""The scalar ops a `tile.map` body may hold (what the targets translate)."""

MAP_COMPARISONS = ("oeq", "olt", "ole", "ogt", "oge")
"""The `arith.cmpf` predicates a body may use: ordered ones, false when either side is NaN."""


def _verify_map_body_op(op: Operation, defined: set[SSAValue]) -> None:
    """One body op: of `MAP_BODY_OPS`, on values defined inside the body, f32 (or i1 from a
    comparison), constants f32, comparisons ordered."""
    if not isinstance(op, MAP_BODY_OPS):
        names = ", ".join(sorted(t.name for t in MAP_BODY_OPS))
        raise VerifyException(f"tile.map bodies hold only {names}; got {op.name}")
    for value in op.operands:
        if value not in defined:
            raise VerifyException(f"{op.name} in a tile.map body reads a value defined outside it")
    if isinstance(op, arith.ConstantOp) and not (
        isinstance(op.value, FloatAttr) and op.value.type == f32
    ):
        raise VerifyException(f"tile.map constants are f32 floats, got {op.value}")
    if isinstance(op, arith.CmpfOp):
        predicate = arith.CMPF_COMPARISON_OPERATIONS[op.predicate.value.data]
        if predicate not in MAP_COMPARISONS:
            raise VerifyException(
                f"tile.map comparisons are {', '.join(MAP_COMPARISONS)}, got {predicate}"
            )
    for result in op.results:
        wanted = i1 if isinstance(op, arith.CmpfOp) else f32
        if result.type != wanted:
            raise VerifyException(f"{op.name} in a tile.map body must give {wanted}, got {result.type}")


@irdl_op_definition
class MapOp(IRDLOperation):
    """Applies a scalar function to every entry of its tile operands: `r[x] = f(a[x], b[x], ...)`.

    The body is a region of `arith` and `math` ops on f32 scalars (as `linalg.generic`'s), one
    block argument per operand, ending in `tile.map_yield`; f32 scalar operands (a
    `tile.seq_len`, say) are the same for every entry. Every tile operand has the result's
    shape; the result is f32. A pointwise score modifier or normalizer needs no tile op of its
    own: it lowers to a `tile.map` (soft-capping is `cap * tanh(s / cap)`).
    """

    name = "tile.map"

    inputs = var_operand_def(AnyOf.get(TileType, Float32Type))
    result = result_def(TileType)
    body = region_def("single_block")

    assembly_format = "`(` $inputs `)` attr-dict `:` `(` type($inputs) `)` `->` type($result) $body"
    traits = traits_def(Pure())

    def __init__(self, inputs: Sequence[SSAValue], body: Region, result_type: TileType):
        super().__init__(operands=[inputs], result_types=[result_type], regions=[body])

    def verify_(self) -> None:
        result = _tile(self.result, "map result")
        if result.elem != "f32":
            raise VerifyException(f"tile.map computes in f32, got a {result.elem} result")
        if not any(isinstance(v.type, TileType) for v in self.inputs):
            raise VerifyException("tile.map needs at least one tile operand")
        for i, value in enumerate(self.inputs):
            if isinstance(value.type, TileType) and value.type.shape != result.shape:
                raise VerifyException(
                    f"map operand {i} is a {' x '.join(value.type.shape)} tile, the result "
                    f"{' x '.join(result.shape)}: operands must have the result's shape"
                )
            if isinstance(value.type, TileType) and value.type.elem != "f32":
                raise VerifyException(f"map operand {i} is a {value.type.elem} tile: maps compute in f32")
        block = self.body.block
        if len(block.args) != len(self.inputs) or any(a.type != f32 for a in block.args):
            raise VerifyException("tile.map's body takes one f32 argument per operand")
        defined: set[SSAValue] = set(block.args)
        for op in block.ops:
            if isinstance(op, MapYieldOp):
                if op.value not in defined:
                    raise VerifyException("tile.map_yield yields a value defined outside the body")
                continue
            _verify_map_body_op(op, defined)
            defined |= set(op.results)
        if not isinstance(block.last_op, MapYieldOp):
            raise VerifyException("tile.map's body must end in tile.map_yield")


@irdl_op_definition
class MapYieldOp(IRDLOperation):
    """Ends a `tile.map` body with the entry's value."""

    name = "tile.map_yield"

    value = operand_def(BaseAttr(Float32Type))
    assembly_format = "$value attr-dict `:` type($value)"
    traits = lazy_traits_def(lambda: (IsTerminator(), HasParent(MapOp)))

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])


EXPONENTIAL_OPS = (SoftmaxUpdateOp, RecomputeProbsOp)
"""Ops that exponentiate scores, and so can apply their scale in the same multiply."""


Tile = Dialect(
    "tile",
    [
        KernelOp,
        ReturnOp,
        LoadOp,
        StoreOp,
        RotateOp,
        ScoresOp,
        MaskOp,
        DocumentMaskOp,
        KVBoundsOp,
        KVSplitOp,
        KVLoopOp,
        MergeSplitsOp,
        MergeLastSplitOp,
        YieldOp,
        SoftmaxInitOp,
        SoftmaxUpdateOp,
        AccumulateOp,
        SoftmaxFinalizeOp,
        SparseKVLoopOp,
        AlibiOp,
        AddBiasOp,
        ReluProbsOp,
        ZerosOp,
        JoinOp,
        SplitOp,
        QBoundsOp,
        QLoopOp,
        SparseQLoopOp,
        RowDotOp,
        DotTransposedOp,
        DotLhsTransposedOp,
        StoreAddOp,
        RecomputeProbsOp,
        SoftmaxGradOp,
        ReluGradOp,
        ApplyScaleOp,
        StoreScoresOp,
        SeqLenOp,
        MapOp,
        MapYieldOp,
    ],
    [TileType, TensorType, TileDimAttr, GridAttr, BlockOrderAttr, ScheduleAttr, RowsAttr, ColumnsAttr, SeqAxisAttr, PairsAttr],
)
"""The tile dialect."""

__all__ = [
    "COLUMN_PARTS",
    "ELEMENT_TYPES",
    "FILTER_OPS",
    "GRIDS",
    "KEY_LOOP_OPS",
    "KEY_ROW_ROLES",
    "LOOP_OPS",
    "QUERY_LOOP_OPS",
    "QUERY_ROW_ROLES",
    "TENSOR_AXES",
    "BLOCK_LIST_ROLES",
    "AccumulateOp",
    "AddBiasOp",
    "AlibiOp",
    "ApplyScaleOp",
    "DocumentMaskOp",
    "DotLhsTransposedOp",
    "DotTransposedOp",
    "JoinOp",
    "KVBoundsOp",
    "KVLoopOp",
    "KVSplitOp",
    "MergeLastSplitOp",
    "MergeSplitsOp",
    "KernelOp",
    "LoadOp",
    "MapOp",
    "MapYieldOp",
    "SeqLenOp",
    "MaskOp",
    "QBoundsOp",
    "QLoopOp",
    "RecomputeProbsOp",
    "ReluGradOp",
    "ReluProbsOp",
    "ReturnOp",
    "RotateOp",
    "RowDotOp",
    "ScoresOp",
    "SoftmaxFinalizeOp",
    "SoftmaxGradOp",
    "SoftmaxInitOp",
    "SoftmaxUpdateOp",
    "SparseKVLoopOp",
    "SparseQLoopOp",
    "SplitOp",
    "StoreAddOp",
    "StoreOp",
    "StoreScoresOp",
    "TensorType",
    "Tile",
    "TileType",
    "YieldOp",
    "ZerosOp",
    "pairs_fill_tiles",
]
