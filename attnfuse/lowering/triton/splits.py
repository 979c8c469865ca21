"""Printing split-KV decoding: `tile.kv_split` and the merges of the splits' partial results
(`tile.merge_splits`, `tile.merge_last_split`)."""

from __future__ import annotations

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import EmitterCore
from attnfuse.lowering.triton.program import LN2, LOG2E, MAX_SPLITS_PER_STEP, MERGE_STEP_VALUES, padded


class SplitEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints split-KV decoding's split and merges."""

    def emit_kv_split(self, op: tile.KVSplitOp) -> None:
        self.emit("# tile.kv_split: only this program's split of the keys")
        self.emit("split_lo = split * split_len")
        self.emit("split_hi = split_lo + split_len")
        for value, result in zip(op.operands, op.results):
            self.emit(f"{self.namer.define(result)} = tl.minimum(tl.maximum({self.namer[value]}, split_lo), split_hi)")

    def splits_per_step(self) -> int:
        """Splits a merge step loads at once: as many as keep a step's partial
        outputs, `[BLOCK_M, SPLITS, BLOCK_DV]` fp32, at `MERGE_STEP_VALUES`, at most
        `MAX_SPLITS_PER_STEP`; a power of two. The merge kernel (one query row per program)
        takes every split of a decode in one step, so its time is one round trip to L2, not
        one per split."""
        rows, width = self.kernel.get("block_m"), padded(self.head_dim_v)
        return max(1, min(MAX_SPLITS_PER_STEP, MERGE_STEP_VALUES // (rows * width)))

    def emit_split_merge(self, role_o: str, o_base: str, o_rows: str, role_lse: str | None,
                         lse_base: str | None, lse_rows: str | None, out: str, lse: str | None,
                         load_options: str = "") -> None:
        """The loop over the splits that merges their partial results (`tile.merge_splits`,
        `tile.merge_last_split`), `splits_per_step()` splits a step: with an lse
        (softmax), each split's output weighted by `exp(lse_s - lse)`, online over the steps;
        without, summed. The partials of split `s` and row offset `r` (`o_rows`, `lse_rows`:
        per-row offsets) are at `o_base + s * stride_s + r + column * stride_d`; `out` (and
        `lse`) name the results."""
        per_step = self.splits_per_step()
        self.emit(f"{out} = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)")
        columns = " & (cols_dv < HEAD_DIM_V)[None, None, :]" if padded(self.head_dim_v) != self.head_dim_v else ""

        def step_loads() -> None:
            self.emit(f"splits = step + tl.arange(0, {per_step})  # the step's splits")
            self.emit("split_rows = row_in_bounds[:, None] & (splits < num_splits)[None, :]")
            self.emit(f"split_out = tl.load({o_base} + (splits * stride_{role_o}_s)[None, :, None]"
                      f" + ({o_rows})[:, None, None] + (cols_dv * stride_{role_o}_d)[None, None, :],"
                      f" mask=split_rows[:, :, None]{columns}, other=0.0{load_options})")

        if role_lse is None:
            self.emit(f"for step in {self.splits_range(per_step)}:")
            self.indent += 1
            step_loads()
            self.emit(f"{out} += tl.sum(split_out, 1)")
            self.indent -= 1
            return
        assert lse is not None and lse_base is not None and lse_rows is not None
        merged_max, total = self.namer.fresh("merged_max"), self.namer.fresh("merged_sum")
        self.emit(f"{merged_max} = tl.full([BLOCK_M], float(\"-inf\"), dtype=tl.float32)")
        self.emit(f"{total} = tl.zeros([BLOCK_M], dtype=tl.float32)")
        self.emit(f"for step in {self.splits_range(per_step)}:")
        self.indent += 1
        step_loads()
        self.emit(f"split_lse = tl.load({lse_base} + (splits * stride_{role_lse}_s)[None, :] + ({lse_rows})[:, None],"
                  f" mask=split_rows, other=float(\"-inf\"){load_options})")
        self.emit(f"new_max = tl.maximum({merged_max}, tl.max(split_lse, 1))")
        self.emit("# Splits with no kept key (lse -inf) weigh 0; subtract 0 while every split so far is empty.")
        self.emit("safe_max = tl.where(new_max == float(\"-inf\"), 0.0, new_max)")
        self.emit(f"rescale = tl.math.exp2(({merged_max} - safe_max) * {LOG2E})")
        self.emit(f"weight = tl.math.exp2((split_lse - safe_max[:, None]) * {LOG2E})")
        self.emit(f"{out} = {out} * rescale[:, None] + tl.sum(split_out * weight[:, :, None], 1)")
        self.emit(f"{total} = {total} * rescale + tl.sum(weight, 1)")
        self.emit(f"{merged_max} = new_max")
        self.indent -= 1
        has_keys = self.namer.fresh("has_keys")
        self.emit(f"{has_keys} = {total} != 0.0")
        self.emit(f"{out} = {out} / tl.where({has_keys}, {total}, 1.0)[:, None]")
        self.emit(f"{lse} = tl.where({has_keys}, {merged_max} + tl.math.log2(tl.where({has_keys}, {total}, 1.0)) * {LN2}, float(\"-inf\"))")

    def splits_range(self, per_step: int) -> str:
        """The iteration over the merge's steps (`per_step` splits each): software-pipelined
        `merge_stages` deep (`tl.range`: its loads are not products' operands, which Triton
        pipelines only in a loop that asks), so a step's partials are in flight while earlier
        ones merge."""
        stages = self.kernel.int_attr("merge_stages") or 1
        if stages > 1:
            return f"tl.range(0, num_splits, {per_step}, num_stages={stages})"
        return f"range(0, num_splits, {per_step})"

    def value_column_mask(self) -> str:
        """` & (cols_dv < HEAD_DIM_V)[None, :]` where the value dim is padded, else ""."""
        return " & (cols_dv < HEAD_DIM_V)[None, :]" if padded(self.head_dim_v) != self.head_dim_v else ""

    def emit_merge_last_split(self, op: tile.MergeLastSplitOp) -> None:
        o_role, lse_role = self.role_of(op.o_part), self.role_of(op.lse_part)
        counts = self.role_of(op.split_counts)
        self.emit("# tile.merge_last_split: the last split program of these rows merges every split's partials")
        # Every thread's partial stores are issued before the count, which releases them to
        # the program that sees the final count (the atomic is acq_rel at GPU scope).
        self.emit("tl.debug_barrier()")
        self.emit(f"count_ptr = {counts}_ptr + tl.program_id(0)  # one count per (batch, kv head, row block)")
        self.emit("arrived = tl.atomic_add(count_ptr, 1)")
        self.emit("if arrived == num_splits - 1:")
        self.indent += 1

        def rows_of(role: str) -> str:
            return f"(row_head * stride_{role}_h + row_query * stride_{role}_n)"

        def all_splits(role: str) -> str:
            return f"{role}_ptr + batch * stride_{role}_b + head * stride_{role}_h"

        o_mask = f"row_in_bounds[:, None]{self.value_column_mask()}"
        weighted = op.weighted is not None
        out = self.namer.fresh("merged")
        lse = self.namer.fresh("merged_lse") if weighted else None
        # Other programs wrote the partials: read them past L1 (.cg), where no stale copy is.
        self.emit_split_merge(o_role, all_splits(o_role), rows_of(o_role),
                              lse_role if weighted else None, all_splits(lse_role) if weighted else None,
                              rows_of(lse_role) if weighted else None, out, lse, ', cache_modifier=".cg"')
        if lse is not None:
            out_lse = self.role_of(op.lse)  # type: ignore[arg-type]
            self.emit(f"tl.store({out_lse}_base + {rows_of(out_lse)}, {lse}, mask=row_in_bounds)")
        o_out = self.role_of(op.o)
        self.emit(f"tl.store({o_out}_base + {rows_of(o_out)}[:, None] + cols_dv[None, :] * stride_{o_out}_d, "
                  f"{out}.to({o_out}_ptr.dtype.element_ty), mask={o_mask})")
        self.emit("tl.atomic_xchg(count_ptr, 0)  # ready for the next call")
        self.indent -= 1

    def emit_merge_splits(self, op: tile.MergeSplitsOp) -> None:
        o_role, lse_role = self.role_of(op.o_part), self.role_of(op.lse_part)
        out, lse = self.namer.define(op.output), self.namer.define(op.lse)
        o_rows = f"rows * stride_{o_role}_n"
        if self.pdl:
            # Launched as the split kernel's dependent, the merge may start while that kernel
            # runs: nothing before this line reads memory, and this waits for the split
            # kernel's whole grid to complete, its partials visible.
            self.emit("gdc_wait()  # pdl: the split kernel has completed; its partials are visible")
        if op.weighted is None:
            self.emit("# tile.merge_splits: a pointwise normalizer's outputs are sums over keys: add them")
            self.emit_split_merge(o_role, f"{o_role}_base", o_rows, None, None, None, out, None)
            self.emit(f"{lse} = tl.zeros([BLOCK_M], dtype=tl.float32)  # no log-sum-exp")
            return
        self.emit("# tile.merge_splits: weight each split's output by exp(lse_s - lse), online over the splits")
        self.emit_split_merge(o_role, f"{o_role}_base", o_rows, lse_role, f"{lse_role}_base",
                              f"rows * stride_{lse_role}_n", out, lse)
