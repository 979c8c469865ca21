"""Printing the loops over blocks: band bounds (`tile.kv_bounds`, `tile.q_bounds`), range and
list loops, the paged cache's page reads, and `tile.yield`."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.ir import Operation

from attnfuse.dialects import tile
from attnfuse.lowering.triton.core import EmitterCore, LoopRows
from attnfuse.lowering.triton.program import plus


class LoopEmitter(EmitterCore):
    """The part of `KernelEmitter` that prints band bounds, loops over blocks and the paged
    cache's page reads."""

    def emit_band_range(self, op: tile.KVBoundsOp | tile.QBoundsOp, first: str, last: str,
                        lower: int | None, upper: int | None, length: str) -> None:
        """The loop's block range for program rows at positions `first..last`, which keep
        loop rows at positions `row + [lower, upper]` of `length` loop rows, split into
        partial / full / partial blocks (`tile.loops._BandBounds`)."""
        start, full_start, full_end, end = (self.namer.define(r) for r in op.results)
        # Clamp at 0 before dividing: integer division of negatives differs between the GPU
        # (truncation) and the interpreter (floor).
        if lower is None:
            self.emit(f"{start} = 0")
            self.emit(f"{full_start} = 0")
        else:
            self.emit(f"{start} = tl.maximum({plus(first, lower)}, 0) // BLOCK_N * BLOCK_N")
            self.emit(f"{full_start} = (tl.maximum({plus(last, lower)}, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N")
        if upper is None:
            self.emit(f"{end} = {length}")
            self.emit(f"{full_end} = {length} // BLOCK_N * BLOCK_N")
        else:
            self.emit(f"{end} = tl.minimum({plus(last, upper + 1)}, {length})")
            self.emit(f"{full_end} = tl.maximum(tl.minimum({plus(first, upper + 1)}, {length}), 0) // BLOCK_N * BLOCK_N")
        self.emit("# Full blocks lie inside [start, end); blocks outside it are empty and skipped.")
        self.emit(f"{full_start} = tl.minimum(tl.maximum({full_start}, {start}), {end})")
        self.emit(f"{full_end} = tl.minimum(tl.maximum({full_end}, {full_start}), {end})")

    def emit_kv_bounds(self, op: tile.KVBoundsOp) -> None:
        lower, upper = op.band.bounds
        if self.grid == "kv_splits":
            self.emit(f"# tile.kv_bounds: key blocks the sequence's queries visit (band q_pos + [{lower}, {upper}])")
            self.emit("q_first = n_k - n_q  # position of the first query")
            self.emit("q_last = n_k - 1")
        else:
            self.emit(f"# tile.kv_bounds: key blocks this query block visits (band q_pos + [{lower}, {upper}])")
            self.emit("q_first = block_id * BLOCK_M + (n_k - n_q)  # position of the block's first query")
            self.emit("q_last = q_first + (BLOCK_M - 1)")
        self.emit_band_range(op, "q_first", "q_last", lower, upper, "n_k")

    def emit_kv_loop(self, op: tile.KVLoopOp) -> None:
        masked = op.masked is not None
        kind = "partial key blocks: masked and bounds-checked" if masked else "full key blocks: no mask work"
        self.emit(f"# tile.kv_loop over {kind}")
        lo, hi = self.namer[op.lower], self.namer[op.upper]
        ahead = self.paged and self.kernel.page_lookahead > 0

        def prelude() -> None:
            if ahead:
                self.emit_first_pages(lo)
            if self.page_rows_hoisted:
                self.emit_page_rows()

        self.emit_block_loop(op, f"for start_n in range({lo}, {hi}, BLOCK_N):", [], masked,
                             prelude=prelude if self.paged else None, pages_ahead=ahead)

    def emit_q_loop(self, op: tile.QLoopOp) -> None:
        masked = op.masked is not None
        kind = "partial query blocks: masked and bounds-checked" if masked else "full query blocks: no mask work"
        self.emit(f"# tile.q_loop over {kind}, for each query head of this key/value head")
        lo, hi = self.namer[op.lower], self.namer[op.upper]
        self.emit_block_loop(op, f"for start_m in range({lo}, {hi}, BLOCK_N):", [], masked)

    def emit_block_loop(
        self, op: Operation, header: str, first: list[str], masked: bool,
        prelude: Callable[[], None] | None = None, pages_ahead: bool = False,
    ) -> None:
        """A loop over key blocks (`query_blocks` kernels) or over query blocks of every query
        head of the GQA group (`key_blocks` kernels): `prelude` (run once per head), `header`,
        the statements `first` that set the step's start, the row indices (bounds-checked when
        `masked`), then the body; loop-carried values keep one name. A paged kernel's key
        step reads its pages from the block table, or with `pages_ahead` (the prelude read
        the first step's, `emit_first_pages`) the next step's, carried to it."""
        block = op.regions[0].block
        carried = [self.namer[v] for v in op.operands if isinstance(v.type, tile.TileType)]
        for arg, name in zip(block.args, carried):
            self.namer.alias(arg, name)
        over_queries = isinstance(op, tile.QUERY_LOOP_OPS)
        opened = 0
        if over_queries:
            self.emit("for head_in_group in range(0, group_size):")
            self.indent += 1
            opened += 1
            self.emit_query_head_bases()
        if prelude is not None:
            prelude()
        self.emit(header)
        self.indent += 1
        opened += 1
        for line in first:
            self.emit(line)
        # Loops are never nested, so each loop can reuse the names of its row indices.
        if over_queries:
            self.emit("start_m = tl.multiple_of(start_m, BLOCK_N)")
            self.emit("queries = start_m + tl.arange(0, BLOCK_N)")
            rows = LoopRows("queries", "query_in_bounds" if masked else "", "q_pos")
            if masked:
                self.emit("query_in_bounds = queries < n_q")
            self.emit("q_pos = queries + (n_k - n_q)")
        else:
            self.emit("start_n = tl.multiple_of(start_n, BLOCK_N)")
            self.emit("keys = start_n + tl.arange(0, BLOCK_N)")
            rows = LoopRows("keys", "key_in_bounds" if masked else "", "keys")
            if masked:
                self.emit("key_in_bounds = keys < n_k")
            if self.paged:
                self.emit_next_pages() if pages_ahead else self.emit_pages(masked)
        self.loop_vars.append(rows)
        self.emit_block(block)
        self.loop_vars.pop()
        if pages_ahead:
            self.emit("page_ids = next_page_ids  # the next step's, read during this one")
        self.indent -= opened
        for result, name in zip(op.results, carried):
            self.namer.alias(result, name)

    @property
    def page_per_step(self) -> bool:
        """Whether a key step's keys lie in one page (the page size is a multiple of the
        step), so the step reads one table entry, not one per key."""
        return self.kernel.get("page_size") % self.kernel.get("block_n") == 0

    @property
    def page_rows_hoisted(self) -> bool:
        """Whether a key step's rows in their pages are the same every step and computed
        once before the loop (`hoist_page_rows`): its keys start pages (the page size divides
        the step, which starts at a multiple of BLOCK_N) or lie in one page."""
        page, step = self.kernel.get("page_size"), self.kernel.get("block_n")
        return bool(self.kernel.hoist_page_rows) and (page % step == 0 or step % page == 0)

    def emit_page_rows(self) -> None:
        """Before a paged key loop with hoisted rows: each step key's row in its page
        (`page_rows`), relative to the step's first row when the step lies in one page."""
        if self.page_per_step:
            self.emit("page_rows = tl.arange(0, BLOCK_N)  # from the step's first row in its page")
        else:
            self.emit("page_rows = tl.arange(0, BLOCK_N) % PAGE_SIZE  # steps start pages: the same every step")

    def table_load(self, keys: str, per_step: str) -> str:
        """The load of the pages of the step whose keys are `keys` (its first key
        `per_step` when a step's keys lie in one page), masked to the sequence's keys: a
        table's entries past the sequence may hold anything (-1), or lie past its end.
        With hoisted rows a step's entries are indexed from its first key."""
        if self.page_per_step:
            first = f"({per_step})" if " " in per_step else per_step
            return (f"tl.load(block_table_base + {first} // PAGE_SIZE * stride_block_table_n, "
                    f"mask={per_step} < n_k, other=0)")
        if self.page_rows_hoisted:
            first = f"({per_step})" if " " in per_step else per_step
            return (f"tl.load(block_table_base + ({first} // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE)"
                    f" * stride_block_table_n, mask={keys} < n_k, other=0)")
        return (f"tl.load(block_table_base + (({keys}) // PAGE_SIZE) * stride_block_table_n, "
                f"mask={keys} < n_k, other=0)")

    def emit_first_pages(self, lo: str) -> None:
        """Before a paged key loop whose steps read their pages a step ahead: the first
        step's page ids (starting at key `lo`)."""
        self.emit("# Paged cache: key j is row j % PAGE_SIZE of page block_table[batch, j // PAGE_SIZE].")
        self.emit("# Each step reads the next step's page ids, so no K/V address waits on a table load of its")
        self.emit("# own step and the K/V loads pipeline as a contiguous cache's do; the first step's come here.")
        self.emit(f"page_ids = {self.table_load(f'{lo} + tl.arange(0, BLOCK_N)', lo)}")

    def emit_next_pages(self) -> None:
        """A paged key step that reads its pages ahead: the next step's page ids
        (`next_page_ids`, carried to it as `page_ids`), this step's pages and the row of each
        of its keys in its page. The ids stay int32 until used: Triton schedules a load
        whose result a loop carries as is together with its next-step user, one step
        ahead of it (widened first, the load would go to the user's step)."""
        self.emit(f"next_page_ids = {self.table_load('keys + BLOCK_N', 'start_n + BLOCK_N')}")
        self.emit(f"pages = {self.pool_page('page_ids')}  # int64 offsets: a pool can pass 2**31 elements")
        if not self.page_rows_hoisted:
            self.emit("page_rows = keys % PAGE_SIZE")

    def emit_pages(self, masked: bool) -> None:
        """A paged kernel's key step that reads its own page ids (`page_lookahead` 0, or a
        loop whose next step is not known ahead): the page and the row in it of each key
        (`pages`, `page_rows`), from this sequence's block table. Keys past the sequence
        read no table entry (a table's unused entries may hold anything)."""
        self.emit("# Paged cache: key j is row j % PAGE_SIZE of page block_table[batch, j // PAGE_SIZE].")
        if self.page_per_step:
            # The step's keys lie in one page: one table entry, read once. A step past the
            # sequence's last key is partial and its loads are masked, so its entry (maybe
            # past the table's used part) is never followed.
            entry = "start_n // PAGE_SIZE"
            guard = ", mask=start_n < n_k, other=0" if masked else ""
            ids = f"tl.load(block_table_base + {entry} * stride_block_table_n{guard})"
        else:
            guard = ", mask=key_in_bounds, other=0" if masked else ""
            entries = ("(start_n // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE)" if self.page_rows_hoisted
                       else "(keys // PAGE_SIZE)")
            ids = f"tl.load(block_table_base + {entries} * stride_block_table_n{guard})"
        self.emit(f"pages = {self.pool_page(ids)}")
        if not self.page_rows_hoisted:
            self.emit("page_rows = keys % PAGE_SIZE")

    def emit_yield(self, op: tile.YieldOp) -> None:
        loop = op.parent_op()
        assert isinstance(loop, tile.LOOP_OPS)
        targets = [self.namer[v] for v in loop.inits]
        values = [self.namer[v] for v in op.values]
        if targets != values:
            self.emit(f"{', '.join(targets)} = {', '.join(values)}")

    def emit_sparse_kv_loop(self, op: tile.SparseKVLoopOp | tile.SparseQLoopOp) -> None:
        masked = op.masked is not None
        blocks, count = self.role_of(op.blocks), self.role_of(op.count)
        kind = "partial: masked and bounds-checked" if masked else "full: no mask work"
        over = "query" if isinstance(op, tile.SparseQLoopOp) else "key"
        self.emit(f"# {op.name} over the {over} blocks the layout lists ({kind})")
        count_name = self.namer.fresh(f"{count}")
        start = "start_m" if over == "query" else "start_n"
        first = [f"{start} = tl.load({blocks}_base + entry * stride_{blocks}_d) * BLOCK_N"]
        ranks = op.ranks if isinstance(op, tile.SparseQLoopOp) else None
        if ranks is not None:
            role = self.role_of(ranks)
            first.append(f"rank = tl.load({role}_base + entry * stride_{role}_d)  # this key block's turn at the query block")
        self.emit_block_loop(op, f"for entry in range(0, {count_name}):", first, masked,
                             prelude=lambda: self.emit(f"{count_name} = tl.load({count}_base)"))


    def emit_q_bounds(self, op: tile.QBoundsOp) -> None:
        lower, upper = op.band.bounds
        self.emit(f"# tile.q_bounds: query blocks that visit this key block (band q_pos + [{lower}, {upper}])")
        # The query rows whose positions equal the block's first and last keys. Seen from the
        # key rows, a query row is kept at `key - (Nk - Nq) + [-upper, -lower]`.
        self.emit("diag_first = block_id * BLOCK_M - (n_k - n_q)")
        self.emit("diag_last = tl.minimum(block_id * BLOCK_M + BLOCK_M, n_k) - 1 - (n_k - n_q)")
        self.emit_band_range(op, "diag_first", "diag_last", None if upper is None else -upper,
                             None if lower is None else -lower, "n_q")
        self.emit("# A ragged last key block has padded rows: every query block is partial for it.")
        full_start, full_end = (self.namer[r] for r in op.results[1:3])
        self.emit(f"{full_end} = tl.where(block_id * BLOCK_M + BLOCK_M <= n_k, {full_end}, {full_start})")
        if self.ordered_adds:
            self.emit_previous_block_end(op)
