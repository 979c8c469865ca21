"""Printing `tile.map` (its scalar body as one Triton expression per op) and `tile.seq_len`."""

from __future__ import annotations

from xdsl.dialects import arith
from xdsl.ir import SSAValue

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import EmitterCore
from attnfuse.lowering.triton.scalars import scalar_expression


class ElementwiseEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints `tile.map` and `tile.seq_len`."""

    def emit_seq_len(self, op: tile.SeqLenOp) -> None:
        length = "n_q" if op.axis.data == "query" else "n_k"
        self.emit(f"# tile.seq_len: {length} as f32")
        # `* 1.0`, not `.to()`: Triton passes an integer argument equal to 1 as a constant.
        self.emit(f"{self.namer.define(op.result, 'num_' + op.axis.data + 's')} = {length} * 1.0")

    def emit_pair_position(self, op: tile.PairPositionOp) -> None:
        axis = op.axis.data
        self.emit(f"# tile.pair_position: each entry's {axis} position, as f32")
        self.emit_index_tile(op.result, self.oriented()["q_pos" if axis == "query" else "k_pos"])

    def emit_query_head(self, op: tile.QueryHeadOp) -> None:
        self.emit("# tile.query_head: each entry's query head, as f32")
        # A split decode's rows span the group's query heads (row r is head `head + r // Nq`);
        # other kernels' programs (or, over the GQA group, loop steps) own one.
        self.emit_index_tile(op.result, "(head + row_head)[:, None]" if self.grid == "kv_splits" else "head")

    def emit_index_tile(self, result: SSAValue, index: str) -> None:
        """`result`, the block's f32 tile of `index` (broadcast from a row or column, or a
        scalar): program rows by loop rows, as every kernel orients its score tiles."""
        self.emit(f"{self.namer.define(result)} = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + {index}")

    def emit_map(self, op: tile.MapOp) -> None:
        block = op.body.block
        operands = [self.namer[v] for v in op.inputs]
        self.emit(f"# tile.map over ({', '.join(operands)}), entry by entry")
        names: dict[SSAValue, str] = dict(zip(block.args, operands))
        # Entries that vary over the tile: those computed from a tile operand. A body that
        # yields anything else (a constant, a function of scalar operands) computes a scalar,
        # which is broadcast to the result's shape: the result is a tile whatever its body.
        varying = {arg for arg, value in zip(block.args, op.inputs) if isinstance(value.type, tile.TileType)}
        for inner in block.ops:
            if isinstance(inner, tile.MapYieldOp):
                value = names[inner.value]
                if inner.value not in varying:
                    like = operands[next(i for i, v in enumerate(op.inputs) if isinstance(v.type, tile.TileType))]
                    value = f"tl.where(True, {value}, {like})  # the same value at every entry of {like}'s shape"
                self.emit(f"{self.namer.define(op.result)} = {value}")
                return
            if any(v in varying for v in inner.operands):
                varying.update(inner.results)
            expression = scalar_expression(inner, [names[v] for v in inner.operands], self.helpers)
            result = inner.results[0]
            if isinstance(inner, arith.ConstantOp) or result.has_one_use():
                names[result] = expression  # inlined where it is used
                continue
            name = self.namer.fresh(result.name_hint or "entry")
            self.emit(f"{name} = {expression}")
            names[result] = name
