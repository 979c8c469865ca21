"""Printing block loads and stores (`tile.load`, `tile.store`) and the RoPE ops on loaded blocks
(`tile.rotate`, `tile.join`, `tile.split`)."""

from __future__ import annotations

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import COLUMN_COMMENT, EmitterCore
from attnfuse.lowering.triton.program import padded


class MemoryEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints block loads and stores and the RoPE ops on
    loaded blocks."""

    def emit_load(self, op: tile.LoadOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        what = COLUMN_COMMENT.get(cols or "", "one value per row")
        self.emit(f"# tile.load: {role} rows ({op.rows.data}), {what}")
        # Padded rows read 0, except the log-sum-exp: +inf there makes exp(s - lse) = 0, so
        # no probability is ever formed on a row past the sequence end.
        other = 'float("inf")' if role == "lse" else "0.0"
        masking = f", mask={mask}, other={other}" if mask else ""
        assert isinstance(op.result.type, tile.TileType)
        widened = op.result.type.elem == "f32" and role not in tile.FP32_ROLES and self.elem != "f32"
        widen = ".to(tl.float32)" if widened else ""
        name = self.namer.define(op.result)
        if self.shared_offsets is not None and role == self.shared_offsets[0] and op.rows.data == "loop":
            # Same strides as the leader (the runtime checked): its offsets, its strides.
            leader = self.shared_offsets[1]
            leader_ptrs, _ = self.block_pointer(leader, op.rows.data, cols)
            shared_ptrs = f"{role}_base" + leader_ptrs.removeprefix(f"{leader}_base")
            self.emit("if SHARED_OFFSETS:")
            self.emit(f"    {name} = tl.load({shared_ptrs}{masking}){widen}")
            self.emit("else:")
            self.emit(f"    {name} = tl.load({ptrs}{masking}){widen}")
            return
        self.emit(f"{name} = tl.load({ptrs}{masking}){widen}")

    def emit_store(self, op: tile.StoreOp) -> None:
        role = op.role
        cols = None if op.cols is None else op.cols.data
        ptrs, mask = self.block_pointer(role, op.rows.data, cols)
        self.emit(f"# tile.store: {role} rows ({op.rows.data})" + (f", {COLUMN_COMMENT[cols]}" if cols else ""))
        masking = f", mask={mask}" if mask else ""
        value = f"{self.namer[op.value]}.to({role}_ptr.dtype.element_ty)"
        self.emit(f"tl.store({ptrs}, {value}{masking})")

    def positions(self, op: tile.RotateOp) -> tuple[str, str | None]:
        """(positions of the rotated rows, their in-bounds mask or None)."""
        assert isinstance(op.lo.type, tile.TileType)
        if op.lo.type.shape[0] == "n":
            loop = self.loop_vars[-1]
            return loop.position, loop.mask or None
        if self.grid == "appended_keys":
            return "k_pos", "row_in_bounds"
        return ("q_pos" if op.positions.data == "query" else "rows"), "row_in_bounds"

    def position_rows(self, op: tile.RotateOp) -> str:
        """The row indices of the rotated rows (call-time positions are indexed by row)."""
        assert isinstance(op.lo.type, tile.TileType)
        return self.loop_vars[-1].index if op.lo.type.shape[0] == "n" else self.query_rows

    def emit_rotate(self, op: tile.RotateOp) -> None:
        lo, hi = self.namer[op.lo], self.namer[op.hi]
        self.emit(f"# tile.rotate: RoPE at {op.positions.data} positions, in fp32, pairs ({lo}, {hi})")
        cos, sin, table_rows = (self.namer.fresh(n) for n in ("cos", "sin", "table_rows"))
        a, b = self.namer.fresh(f"{lo}_f32"), self.namer.fresh(f"{hi}_f32")
        pos, row_mask = self.positions(op)
        if op.given_positions is not None:
            role = self.role_of(op.given_positions)
            # Given positions are indexed by row (query i or key j), not by default position.
            rows = self.position_rows(op)
            pos = self.namer.fresh(f"{role}_rows")
            masking = f", mask={row_mask}, other=0" if row_mask else ""
            self.emit(f"{pos} = tl.load({role}_base + {rows} * stride_{role}_n{masking})")
        col_mask = "(cols_half < ROT_HALF)[None, :]" if padded(self.rot_half) != self.rot_half else None
        masks = [m for m in (row_mask and f"{row_mask}[:, None]", col_mask) if m]
        masking = f", mask={' & '.join(masks)}" if masks else ""
        # Query positions are negative when Nq > Nk (and given ones may be):
        # cos(-x) = cos(x), sin(-x) = -sin(x).
        negative = op.positions.data == "query" or op.given_positions is not None
        self.emit(f"{table_rows} = {'tl.abs(' + pos + ')' if negative else pos}")
        if op.given_positions is not None:
            # The runtime sizes the table for the positions it read (once per tensor and
            # version); a write it cannot see (through .data) could put one past the end. The
            # table is contiguous [2, L, R/2], so its strides give L: clamped, such a position
            # is rotated wrong but never read out of bounds (|int64 min| stays negative).
            self.emit(f"{table_rows} = tl.maximum(tl.minimum({table_rows}, "
                      f"stride_rope_table_c // stride_rope_table_n - 1), 0)")
        ptrs = f"rope_table_ptr + {table_rows}[:, None] * stride_rope_table_n + cols_half[None, :] * stride_rope_table_d"
        self.emit(f"{cos} = tl.load({ptrs}{masking + ', other=1.0' if masking else ''})")
        self.emit(f"{sin} = tl.load({ptrs} + stride_rope_table_c{masking + ', other=0.0' if masking else ''})")
        sign = []
        if negative:
            sign.append(f"tl.where({pos} < 0, -1.0, 1.0)[:, None]")
        if op.inverse is not None:
            sign.append("-1.0")
        if sign:
            self.emit(f"{sin} = {sin} * {' * '.join(sign)}")
        self.emit(f"{a} = {lo}.to(tl.float32)")
        self.emit(f"{b} = {hi}.to(tl.float32)")
        # Back to the input type for the tensor cores (the interpreter's bf16 path keeps fp32:
        # its fp32 -> bf16 conversion truncates instead of rounding).
        lo_cast = "" if self.upcast_dots else f".to({lo}.dtype)"
        hi_cast = "" if self.upcast_dots else f".to({hi}.dtype)"
        self.emit(f"{self.namer.define(op.lo_out)} = ({a} * {cos} - {b} * {sin}){lo_cast}")
        self.emit(f"{self.namer.define(op.hi_out)} = ({a} * {sin} + {b} * {cos}){hi_cast}")

    def emit_join(self, op: tile.JoinOp) -> None:
        lo, hi = self.namer[op.lo], self.namer[op.hi]
        assert isinstance(op.lo.type, tile.TileType)
        rows = "BLOCK_M" if op.lo.type.shape[0] == "m" else "BLOCK_N"
        joined = f"tl.join({lo}, {hi})"  # [rows, half, 2]: pairs side by side
        if op.pairs.data == "half":
            # [rows, 2, half]: all first elements, then all second elements.
            joined = f"tl.permute({joined}, (0, 2, 1))"
            what = "halves side by side"
        else:
            what = "pair elements alternating"
        self.emit(f"# tile.join: back to full width ({what}), once per program")
        self.emit(f"{self.namer.define(op.result)} = tl.reshape({joined}, ({rows}, BLOCK_D))")

    def emit_split(self, op: tile.SplitOp) -> None:
        value = self.namer[op.input]
        assert isinstance(op.input.type, tile.TileType)
        rows = "BLOCK_M" if op.input.type.shape[0] == "m" else "BLOCK_N"
        lo, hi = self.namer.define(op.lo), self.namer.define(op.hi)
        if op.pairs.data == "half":
            self.emit("# tile.split: full width into the halves of the rotary pairs, once per program")
            pairs = f"tl.permute(tl.reshape({value}, ({rows}, 2, BLOCK_HALF)), (0, 2, 1))"
        else:
            self.emit("# tile.split: full width into even and odd dims, once per program")
            pairs = f"tl.reshape({value}, ({rows}, BLOCK_HALF, 2))"
        self.emit(f"{lo}, {hi} = tl.split({pairs})")
