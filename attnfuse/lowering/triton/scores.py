"""Printing the score ops: `tile.scores` (and its split products and scale), the filters
(`tile.mask`, `tile.document_mask`) and the modifiers `tile.alibi` and `tile.add_bias`."""

from __future__ import annotations

from xdsl.ir import SSAValue

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import TRITON_TYPES, EmitterCore
from attnfuse.lowering.triton.program import LOG2E, plus, scale_expression


class ScoreEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints the scores, their filters and the score
    modifiers that read positions or tensors."""

    def emit_scores(self, op: tile.ScoresOp) -> None:
        name = self.namer.define(op.result)
        self.emit("# tile.scores: q @ k^T summed over column parts, fp32 accumulation")
        products: list[tuple[str, str]] = []
        for q, k in zip(op.queries, op.keys):
            assert isinstance(q.type, tile.TileType)
            if q.type.elem == "f32" and self.elem != "f32" and not self.upcast_dots:
                products += self.split_products(q, k)
            else:
                products.append((self.dot_operand(self.namer[q]), self.dot_operand(self.namer[k])))
        for i, (q_op, k_op) in enumerate(products):
            acc = f", acc={name}" if i else ""
            self.emit(f"{name} = tl.dot({q_op}, tl.trans({k_op}){acc}{self.dot_options()})")
        self.emit_score_scale(name, op)

    def emit_score_scale(self, name: str, op: tile.ScoresOp) -> None:
        """Multiplies the product `name` by the scale of `op` (or says it is folded into the
        exponential: `fold-scale-into-exp`)."""
        scale = scale_expression(op.scale)
        if op.unscaled is not None:
            self.emit(f"# (the scale, {scale}, is applied where the scores meet the exponential)")
        elif op.scale is None:
            self.emit(f"{name} = {name} * sm_scale")
        else:
            self.emit(f"{name} = {name} * {scale}  # static scale")

    @staticmethod
    def exponent_factor(op: tile.SoftmaxUpdateOp | tile.RecomputeProbsOp) -> str:
        """What an exponential multiplies its scores by: log2(e), times the scale when they
        arrive unscaled (`fold-scale-into-exp`)."""
        if op.unscaled_scores is None:
            return repr(LOG2E)
        if op.scale is None:
            return f"(sm_scale * {LOG2E})"
        return repr(float(op.scale.value.data) * LOG2E)

    def split_products(self, q: SSAValue, k: SSAValue) -> list[tuple[str, str]]:
        """The element-type products whose fp32 sum is q @ k^T of widened (fp32) operands, on
        the tensor cores' native half-precision path. Each operand is split into its rounding
        to the element type (head) and the rounding of the remainder (rest), and the products
        that matter are summed smallest first: rest x head, head x rest, head x head. The
        error is about 2^-16 |q| |k| in bf16; in fp16 about 2^-22 |q| |k| for elements of
        magnitude 2^-3 and more, less exact below (the remainder turns subnormal).

        An operand loaded straight from an element-type tensor (a widened `tile.load`, such as
        the columns RoPE leaves alone) is its own head: its remainder is 0, so its rest
        products are not emitted.

        Why not `input_precision="tf32x3"` on the fp32 operands: Triton 3.6 on the H200
        miscompiled a dK/dV kernel that fed one widened operand to a tf32x3 product and its
        rounding to a half-precision product (wrong dK, then an illegal memory access;
        bench/results/20261129T1700Z-gpu_check_backward-relu-tf32x3.log)."""
        elem = TRITON_TYPES[self.elem]
        heads: dict[SSAValue, str] = {}
        rests: dict[SSAValue, str | None] = {}
        for value in (q, k):
            name = self.namer[value]
            heads[value] = self.namer.fresh(f"{name}_head")
            self.emit(f"{heads[value]} = {name}.to({elem})")
            if isinstance(value.owner, tile.LoadOp):
                rests[value] = None  # element-type data widened: exact in its head
            else:
                rests[value] = self.namer.fresh(f"{name}_rest")
                self.emit(f"{rests[value]} = ({name} - {heads[value]}.to(tl.float32)).to({elem})")
        products = [(rests[q], heads[k]), (heads[q], rests[k]), (heads[q], heads[k])]
        return [(a, b) for a, b in products if a is not None and b is not None]

    def emit_mask(self, op: tile.MaskOp) -> None:
        loop = self.loop_vars[-1]
        pair = self.oriented()
        lower, upper = op.band.bounds
        conds = [f"{loop.mask}[None, :]"] if loop.mask else []
        if self.grid == "key_blocks":
            # Program rows are keys: padded rows of a ragged last key block are dropped too,
            # so that nothing (ALiBi at far positions, say) overflows on them.
            conds.append("row_in_bounds[:, None]")
        if upper is not None:
            conds.append(f"({pair['k_pos']} <= {plus(pair['q_pos'], upper)})")
        if lower is not None:
            conds.append(f"({pair['k_pos']} >= {plus(pair['q_pos'], lower)})")
        self.emit(f"# tile.mask: keep keys in q_pos + [{lower}, {upper}] and inside the sequence")
        keep = self.namer.fresh("keep")
        self.emit(f"{keep} = {' & '.join(conds) if conds else 'True'}")
        self.emit(f"{self.namer.define(op.result)} = tl.where({keep}, {self.namer[op.input]}, float(\"-inf\"))")

    def emit_document_mask(self, op: tile.DocumentMaskOp) -> None:
        loop = self.loop_vars[-1]
        role = self.role_of(op.doc_ids)
        # Query positions and key indices as vectors, and how each broadcasts to the tile.
        if self.grid != "key_blocks":
            queries, keys, q_axis, k_axis = "q_pos", loop.index, "[:, None]", "[None, :]"
        else:
            queries, keys, q_axis, k_axis = loop.position, "rows", "[None, :]", "[:, None]"
        doc_q, doc_k = self.namer.fresh("doc_q"), self.namer.fresh("doc_k")
        self.emit("# tile.document_mask: keep pairs in one document (negative ids are padding)")
        # A query position outside [0, n_k) (a padded row, or Nq > Nk) has no document.
        self.emit(f"{doc_q} = tl.load({role}_base + {queries} * stride_{role}_n, "
                  f"mask=({queries} >= 0) & ({queries} < n_k), other=-1)")
        self.emit(f"{doc_k} = tl.load({role}_base + {keys} * stride_{role}_n, mask={keys} < n_k, other=-1)")
        keep = self.namer.fresh("keep")
        self.emit(f"{keep} = ({doc_q}{q_axis} == {doc_k}{k_axis}) & ({doc_k}{k_axis} >= 0)")
        self.emit(f"{self.namer.define(op.result)} = tl.where({keep}, {self.namer[op.input]}, float(\"-inf\"))")

    def emit_alibi(self, op: tile.AlibiOp) -> None:
        pair = self.oriented()
        self.emit("# tile.alibi: slope * (k_pos - q_pos)")
        self.emit(
            f"{self.namer.define(op.result)} = {self.namer[op.input]}"
            f" + {self.slope(self.role_of(op.slopes))} * ({pair['k_pos']} - {pair['q_pos']}).to(tl.float32)"
        )

    def score_pointers(self, role: str) -> str:
        """Pointers to `role[batch, head, i, j]` for the current block's (query, key) pairs."""
        pair = self.oriented()
        if self.grid == "kv_splits":
            queries = f"(row_head * stride_{role}_h + row_query * stride_{role}_n)[:, None]"
            return f"{role}_base + {queries} + {pair['k_idx']} * stride_{role}_d"
        return f"{role}_base + {pair['q_idx']} * stride_{role}_n + {pair['k_idx']} * stride_{role}_d"

    def bias_block(self, role: str) -> str:
        """The load of `role[batch, head, query, key]` for the current block's pairs, broadcast
        through its strides; 0 outside the sequences (those entries are masked or discarded)."""
        return f"tl.load({self.score_pointers(role)}, mask={self.block_bounds()}, other=0.0)"

    def emit_add_bias(self, op: tile.AddBiasOp) -> None:
        block = self.namer.fresh("bias_block")
        role = self.role_of(op.bias)
        self.emit(f"# tile.add_bias: {role}[batch, head, query, key], broadcast through its strides")
        self.emit(f"{block} = {self.bias_block(role)}.to(tl.float32)")
        self.emit(f"{self.namer.define(op.result)} = {self.namer[op.input]} + {block}")
