"""Block loads and stores (`tile.load`, `tile.store`) and the RoPE ops that work on loaded
blocks (`tile.rotate`, `tile.join`, `tile.split`)."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import (
    UnitAttr,
)
from xdsl.ir import (
    Operation,
    SSAValue,
)
from xdsl.irdl import (
    BaseAttr,
    IRDLOperation,
    ParsePropInAttrDict,
    VarConstraint,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import (
    Pure,
)
from xdsl.utils.exceptions import VerifyException

from attnfuse.dialects.tile.checks import (
    enclosing_loop,
    expect_role,
    expect_shape,
    expect_tile,
    kernel_of,
)
from attnfuse.dialects.tile.types import (
    BLOCK_ROLES,
    FP32_ROLES,
    QUERY_ROW_ROLES,
    WIDENABLE_ROLES,
    Columns,
    ColumnsAttr,
    Pairs,
    PairsAttr,
    Rows,
    RowsAttr,
    SeqAxis,
    SeqAxisAttr,
    TensorType,
    TileType,
    role_axes,
    rows_axis,
)

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
    if rows == "loop" and enclosing_loop(op) is None:
        raise VerifyException("loop rows can only be accessed inside a tile.kv_loop or tile.q_loop")
    if role not in BLOCK_ROLES:
        raise VerifyException(f"a {role} tensor is not accessed by blocks")
    kernel = kernel_of(op)
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
        if cols == "pass" and kernel.rotary_dim == kernel.get("head_dim"):
            # The dims after the rotary width: none unless the kernel says rotary_dim < head_dim.
            raise VerifyException(
                f"pass columns are the dims after the rotary width: the kernel needs a rotary_dim "
                f"below its head_dim ({kernel.get('head_dim')})")
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
        ty = expect_shape(self.result, expected, "loaded tile")
        kernel = kernel_of(self)
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


class BlockWrite(IRDLOperation):
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
        expect_shape(self.value, expected_tile_shape(self.role, self.rows.data, cols), self.VALUE_NAME)

    ORDERABLE: ClassVar[bool] = False
    """Whether the op takes an optional `in_order %tensor` clause (its `order` operand)."""

    @classmethod
    def parse(cls, parser: Parser) -> BlockWrite:
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
class StoreOp(BlockWrite):
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
    gradients). A given position past the table's last row (one the runtime did not see when it
    sized the table) is read as that last row: the table is never read out of bounds.
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
        lo = expect_tile(self.lo, "rotated lo")
        if self.hi.type != lo or self.lo_out.type != lo or self.hi_out.type != lo:
            raise VerifyException("rotated tiles and results must all have one type")
        if len(lo.shape) != 2 or lo.shape[1] != "half":
            raise VerifyException(f"rotated tiles must be <rows x half>, got {' x '.join(lo.shape)}")
        expect_role(self.table, "rope_table", "the table operand must be the rope_table tensor")
        kernel = kernel_of(self)
        if kernel is not None:
            if kernel.int_attr("rotary_dim") is None and kernel.get("head_dim") % 2:
                # The pairs cover the whole head (a given rotary_dim is checked with the
                # header): an odd dim would be in no pair, and left out of the scores.
                raise VerifyException(
                    f"the kernel rotates its whole head (no rotary_dim), and head_dim "
                    f"{kernel.get('head_dim')} is odd: rotary pairs need an even width"
                )
            rows = "program" if lo.shape[0] == "m" else "loop"
            axis = rows_axis(kernel.grid, rows)
            if axis != self.positions.data:
                raise VerifyException(
                    f"{self.positions.data} positions, but the {rows} rows of a {kernel.grid} "
                    f"kernel are {axis} rows"
                )
        if self.given_positions is not None:
            expected = "q_positions" if self.positions.data == "query" else "k_positions"
            expect_role(
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
    kernel = kernel_of(op)
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
        lo = expect_tile(self.lo, "joined lo")
        if len(lo.shape) != 2 or lo.shape[1] != "half":
            raise VerifyException(f"joined tiles must be <rows x half>, got {' x '.join(lo.shape)}")
        expect_shape(self.result, (lo.shape[0], "d"), "joined tile")
        if expect_tile(self.result, "joined tile").element_type != lo.element_type:
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
        ty = expect_tile(self.input, "split tile")
        if len(ty.shape) != 2 or ty.shape[1] != "d":
            raise VerifyException(f"a split tile must be <rows x d>, got {' x '.join(ty.shape)}")
        expect_shape(self.lo, (ty.shape[0], "half"), "split halves")
        if expect_tile(self.lo, "split halves").element_type != ty.element_type:
            raise VerifyException("tile.split keeps the element type of its operand")
        _verify_pair_layout(self, self.pairs.data)
