// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=64 head-dim=64 block-m=16 block-n=64},fold-scale-into-exp' -t triton | filecheck %s
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=16 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=SMALL-PAGES
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=64 page-lookahead=0 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=IN-STEP
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=16 page-lookahead=0 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=IN-STEP-KEYS
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'lower-to-tile{decode=true kv-lens=true page-size=16 page-lookahead=2}' 2>&1 | filecheck %s --check-prefix=LOOKAHEAD-OPTION
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=128 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=BIG-PAGES
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=48 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=ODD-PAGES
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=64 hoist-page-rows=0 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=UNHOISTED
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=16 hoist-page-rows=0 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=UNHOISTED-KEYS
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'lower-to-tile{decode=true kv-lens=true page-size=16 hoist-page-rows=2}' 2>&1 | filecheck %s --check-prefix=HOIST-OPTION
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true merge-stages=3 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=MERGE-PIPELINED
// RUN: not attnfuse-opt %S/../inputs/rope.mlir -p 'lower-to-tile{decode=true merge-stages=0}' 2>&1 | filecheck %s --check-prefix=MERGE-STAGES-OPTION
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true kv-lens=true page-size=64 head-dim=64 block-m=16 block-n=64}' -t 'triton{interpreter=true}' | filecheck %s --check-prefix=INTERPRETER
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'analyze-masks,place-rope{query=fused key=fused},lower-to-tile{decode=true decode-pdl=0 head-dim=64 block-m=16 block-n=64}' -t triton | filecheck %s --check-prefix=NO-PDL

// The split decode kernel: one program per (batch x key/value head x row block, split); its
// rows are (query head, query) pairs; the key count is the sequence's; keys come from pages.
// Programmatic dependent launch (pdl, lower-to-tile's decode-pdl=1 by default): Triton's
// grid-dependency calls, imported once.
// CHECK:       from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
// CHECK-LABEL: def attention_decode(
// CHECK:       kv_lens_ptr,
// CHECK-NEXT:  block_table_ptr, stride_block_table_b, stride_block_table_n,
// CHECK-NEXT:  sm_scale, n_q, n_k, num_heads, group_size,
// CHECK-NEXT:  num_splits, split_len,
// A paged kernel takes the pools' page count: table entries are clamped to it.
// CHECK-NEXT:  num_pages,
// CHECK:       PAGE_SIZE: tl.constexpr = 64,
// The split kernel lets the merge launch first thing (the merge waits for it to complete).
// CHECK-NEXT:  ):
// CHECK-NEXT:  gdc_launch_dependents()
// CHECK-NEXT:  # Program grid
// CHECK:       split = tl.program_id(1)
// CHECK:       head = kv_head * group_size  # the group's first query head
// CHECK-NEXT:  n_k = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + batch), 0), n_k)  # this sequence's keys
// CHECK:       row_head = rows // n_q
// CHECK-NEXT:  row_query = rows % n_q
// CHECK-NEXT:  q_pos = row_query + (n_k - n_q)
// CHECK:       k_base = k_ptr + kv_head * stride_k_h
// CHECK:       o_part_base = o_part_ptr + batch * stride_o_part_b + head * stride_o_part_h + split * stride_o_part_s
// CHECK:       q_lo = tl.load(q_base + (row_head * stride_q_h + row_query * stride_q_n)[:, None] + (cols_half)[None, :] * stride_q_d
// CHECK:       tile.kv_split: only this program's split of the keys
// CHECK-NEXT:  split_lo = split * split_len
// A step's 64 keys lie in one 64-row page: one table entry per step, read a step ahead (the
// first step's before the loop), never past the sequence's keys; the ids are carried int32.
// The keys' rows in the step's page are the same every step (hoist-page-rows=1, the default):
// computed before the loop; a step adds its page's offset to offsets that do not change.
// CHECK:       page_ids = tl.load(block_table_base + split_start // PAGE_SIZE * stride_block_table_n, mask=split_start < n_k, other=0)
// CHECK-NEXT:  page_rows = tl.arange(0, BLOCK_N)
// CHECK-NEXT:  for start_n in range(split_start, split_full_end, BLOCK_N):
// CHECK:           next_page_ids = tl.load(block_table_base + (start_n + BLOCK_N) // PAGE_SIZE * stride_block_table_n, mask=start_n + BLOCK_N < n_k, other=0)
// An entry outside the pools is clamped into them: no read outside the pools.
// CHECK-NEXT:      pages = tl.minimum(tl.maximum(page_ids, 0), num_pages - 1).to(tl.int64)
// CHECK-NEXT:      # tile.load: k rows (loop)
// CHECK-NEXT:      k_lo = tl.load(k_base + (pages * stride_k_b) + ((page_rows * stride_k_n)[:, None] + (cols_half)[None, :] * stride_k_d))
// Keys rotate at their logical positions, not their page rows.
// CHECK:       tile.rotate: RoPE at key positions
// CHECK:       table_rows_1 = keys
// The step hands the next step its ids.
// CHECK:           page_ids = next_page_ids
// The partial loop reads its first step's ids itself.
// CHECK:       page_ids = tl.load(block_table_base + split_full_end // PAGE_SIZE * stride_block_table_n, mask=split_full_end < n_k, other=0)
// CHECK-NEXT:  page_rows = tl.arange(0, BLOCK_N)
// CHECK-NEXT:  for start_n in range(split_full_end, split_end, BLOCK_N):
// CHECK:       tl.store(o_part_base + (row_head * stride_o_part_h + row_query * stride_o_part_n)[:, None]

// The merge: each split's output weighted by exp(lse_s - lse).
// CHECK-LABEL: def attention_merge(
// One query row per program (block_m 1), all of its splits (up to 64 at head dim 64) loaded in
// one step; unpipelined by default (merge-stages=1).
// CHECK:       BLOCK_M: tl.constexpr = 1,
// Launched as the split kernel's dependent, the merge reads nothing before it waits for it.
// CHECK-NOT:   tl.load
// CHECK:       lse_base = lse_ptr + batch * stride_lse_b + head * stride_lse_h
// CHECK-NEXT:  gdc_wait()
// CHECK-NEXT:  # tile.merge_splits
// CHECK:       for step in range(0, num_splits, 64):
// CHECK-NEXT:      splits = step + tl.arange(0, 64)
// CHECK-NEXT:      split_rows = row_in_bounds[:, None] & (splits < num_splits)[None, :]
// CHECK-NEXT:      split_out = tl.load(o_part_base + (splits * stride_o_part_s)[None, :, None] + (rows * stride_o_part_n)[:, None, None] + (cols_dv * stride_o_part_d)[None, None, :], mask=split_rows[:, :, None], other=0.0)
// CHECK-NEXT:      split_lse = tl.load(lse_part_base + (splits * stride_lse_part_s)[None, :] + (rows * stride_lse_part_n)[:, None], mask=split_rows, other=float("-inf"))
// CHECK-NEXT:      new_max = tl.maximum(merged_max, tl.max(split_lse, 1))
// CHECK:           weight = tl.math.exp2((split_lse - safe_max[:, None]) * 1.4426950408889634)
// CHECK-NEXT:      out = out * rescale[:, None] + tl.sum(split_out * weight[:, :, None], 1)

// Pages smaller than a step: one table entry per key, none read past the sequence. Steps start
// pages, so each key's row in its page, and its entry's distance from the step's first, are the
// same every step: no division or remainder per key in the loop.
// SMALL-PAGES:      page_ids = tl.load(block_table_base + (split_start // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE) * stride_block_table_n, mask=split_start + tl.arange(0, BLOCK_N) < n_k, other=0)
// SMALL-PAGES-NEXT: page_rows = tl.arange(0, BLOCK_N) % PAGE_SIZE
// SMALL-PAGES-NEXT: for start_n in range(split_start, split_full_end, BLOCK_N):
// SMALL-PAGES:          next_page_ids = tl.load(block_table_base + ((start_n + BLOCK_N) // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE) * stride_block_table_n, mask=keys + BLOCK_N < n_k, other=0)
// SMALL-PAGES-NEXT:     pages = tl.minimum(tl.maximum(page_ids, 0), num_pages - 1).to(tl.int64)
// SMALL-PAGES-NEXT:     # tile.load: k rows (loop)
// SMALL-PAGES-NEXT:     k_lo = tl.load(k_base + (pages * stride_k_b + page_rows * stride_k_n)[:, None] + (cols_half)[None, :] * stride_k_d)
// SMALL-PAGES-NOT:      keys % PAGE_SIZE
// SMALL-PAGES:          page_ids = next_page_ids

// Pages larger than a step: the step's first row in its page joins the page's offset.
// BIG-PAGES:            k_lo = tl.load(k_base + (pages * stride_k_b + start_n % PAGE_SIZE * stride_k_n) + ((page_rows * stride_k_n)[:, None] + (cols_half)[None, :] * stride_k_d))
// Pages that neither divide nor are multiples of a step: each key's page and row from its position.
// ODD-PAGES-NOT:        page_rows = tl.arange
// ODD-PAGES:            next_page_ids = tl.load(block_table_base + ((keys + BLOCK_N) // PAGE_SIZE) * stride_block_table_n, mask=keys + BLOCK_N < n_k, other=0)
// ODD-PAGES:            page_rows = keys % PAGE_SIZE

// hoist-page-rows=0: the earlier form, every step derives each key's page and row from its position.
// UNHOISTED-NOT:        page_rows = tl.arange
// UNHOISTED:            next_page_ids = tl.load(block_table_base + (start_n + BLOCK_N) // PAGE_SIZE * stride_block_table_n, mask=start_n + BLOCK_N < n_k, other=0)
// UNHOISTED-NEXT:       pages = tl.minimum(tl.maximum(page_ids, 0), num_pages - 1).to(tl.int64)
// UNHOISTED-NEXT:       page_rows = keys % PAGE_SIZE
// UNHOISTED-NEXT:       # tile.load: k rows (loop)
// UNHOISTED-NEXT:       k_lo = tl.load(k_base + (pages * stride_k_b + page_rows * stride_k_n)[:, None]
// UNHOISTED-KEYS:       page_ids = tl.load(block_table_base + ((split_start + tl.arange(0, BLOCK_N)) // PAGE_SIZE) * stride_block_table_n, mask=split_start + tl.arange(0, BLOCK_N) < n_k, other=0)
// UNHOISTED-KEYS:       next_page_ids = tl.load(block_table_base + ((keys + BLOCK_N) // PAGE_SIZE) * stride_block_table_n, mask=keys + BLOCK_N < n_k, other=0)
// UNHOISTED-KEYS-NEXT:  pages = tl.minimum(tl.maximum(page_ids, 0), num_pages - 1).to(tl.int64)
// UNHOISTED-KEYS-NEXT:  page_rows = keys % PAGE_SIZE
// HOIST-OPTION: error: lower-to-tile: hoist-page-rows must be 0 or 1, got 2

// page-lookahead=0: each step reads its own ids (per step with 64-row pages, per key with
// 16-row ones); the full loop's steps lie inside the sequence and need no mask.
// IN-STEP-NOT:      page_ids
// IN-STEP:          for start_n in range(split_start, split_full_end, BLOCK_N):
// IN-STEP:              pages = tl.minimum(tl.maximum(tl.load(block_table_base + start_n // PAGE_SIZE * stride_block_table_n), 0), num_pages - 1).to(tl.int64)
// IN-STEP-NEXT:         # tile.load: k rows (loop)
// IN-STEP-NOT:          page_ids
// IN-STEP:          for start_n in range(split_full_end, split_end, BLOCK_N):
// IN-STEP:              pages = tl.minimum(tl.maximum(tl.load(block_table_base + start_n // PAGE_SIZE * stride_block_table_n, mask=start_n < n_k, other=0), 0), num_pages - 1).to(tl.int64)
// IN-STEP-NOT:          page_ids
// IN-STEP-KEYS-NOT:     page_ids
// IN-STEP-KEYS:         pages = tl.minimum(tl.maximum(tl.load(block_table_base + (start_n // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE) * stride_block_table_n), 0), num_pages - 1).to(tl.int64)
// IN-STEP-KEYS-NOT:     page_ids
// IN-STEP-KEYS:         pages = tl.minimum(tl.maximum(tl.load(block_table_base + (start_n // PAGE_SIZE + tl.arange(0, BLOCK_N) // PAGE_SIZE) * stride_block_table_n, mask=key_in_bounds, other=0), 0), num_pages - 1).to(tl.int64)
// IN-STEP-KEYS-NOT:     page_ids

// LOOKAHEAD-OPTION: error: lower-to-tile: page-lookahead must be 0 or 1, got 2

// merge-stages=N pipelines the loop over the merge's steps itself (Triton pipelines loads that
// feed no product only in a loop that asks): a later step's partials load while one merges.
// MERGE-PIPELINED-LABEL: def attention_merge(
// MERGE-PIPELINED:       for step in tl.range(0, num_splits, 64, num_stages=3):
// MERGE-PIPELINED-NEXT:      splits = step + tl.arange(0, 64)
// MERGE-STAGES-OPTION: error: lower-to-tile: merge-stages must be >= 1, got 0

// Triton's CPU interpreter cannot run the grid-dependency calls (and runs kernels one by one):
// a kernel printed for it leaves them out, pdl = 1 or not.
// INTERPRETER-NOT: gdc_
// INTERPRETER:     def attention_merge(
// INTERPRETER-NOT: gdc_
// decode-pdl=0: ordinary launches, no grid-dependency calls.
// NO-PDL-NOT:      gdc_
// NO-PDL:          def attention_merge(
// NO-PDL-NOT:      gdc_
