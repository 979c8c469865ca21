// RUN: attnfuse-opt %S/../inputs/given-key.mlir -p 'lower-to-tile{append=true kv-lens=true page-size=16 head-dim=64}' | filecheck %s
// RUN: attnfuse-opt %S/../inputs/given-key.mlir -p 'lower-to-tile{append=true kv-lens=true page-size=16 head-dim=64}' -t triton | filecheck %s --check-prefix=TRITON
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'place-rope,lower-to-tile{append=true kv-lens=true head-dim=64}' | filecheck %s --check-prefix=UNROTATED
// RUN: not attnfuse-opt %S/../inputs/given-key.mlir -p 'lower-to-tile{append=true}' 2>&1 | filecheck %s --check-prefix=LENGTHS
// RUN: attnfuse-opt %S/../inputs/unused-given-key.mlir -p 'lower-to-tile{append=true kv-lens=true head-dim=64}' | filecheck %s --check-prefix=UNUSED

// The cache append of a variant whose keys arrive rotated: one kernel on the appended_keys
// grid rotates each new key at its cache position and stores it and its value there.
// CHECK:      tile.kernel @append_kv(%k: !tile.tensor<k>, %v: !tile.tensor<v>, %k_cache: !tile.tensor<k_cache>, %v_cache: !tile.tensor<v_cache>, %kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>, %rope_table: !tile.tensor<rope_table>)
// CHECK-SAME: grid = #tile<grid appended_keys>
// CHECK:      tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>}
// CHECK:      tile.store %k_lo_rot, %k_cache[program, half_lo]
// CHECK:      tile.store %k_hi_rot, %k_cache[program, half_hi]
// CHECK:      tile.store %v_1, %v_cache[program, all]
// CHECK-NOT:  tile.kernel

// TRITON:      sm_scale, n_q, n_k, num_heads, group_size,
// TRITON-NEXT: num_pages,
// TRITON:      k_pos = cached + rows  # each new key's position: where it is written
// TRITON:      page_ids = tl.load(block_table_base + (k_pos // PAGE_SIZE) * stride_block_table_n, mask=row_in_bounds, other=0)
// A key whose table entry lies outside the pools is not written.
// TRITON-NEXT: row_in_bounds = row_in_bounds & (page_ids >= 0) & (page_ids < num_pages)
// TRITON-NEXT: pages = page_ids.to(tl.int64)
// TRITON:      table_rows = k_pos
// TRITON:      tl.store(k_cache_base + (pages * stride_k_cache_b + page_rows * stride_k_cache_n)[:, None]

// A variant whose kernels rotate keys themselves has a cache of unrotated keys: a copy.
// UNROTATED:     tile.kernel @append_kv(%k: !tile.tensor<k>, %v: !tile.tensor<v>, %k_cache: !tile.tensor<k_cache>, %v_cache: !tile.tensor<v_cache>, %kv_lens: !tile.tensor<kv_lens>)
// UNROTATED-NOT: tile.rotate
// UNROTATED:     tile.store %k_1, %k_cache[program, all]

// LENGTHS: error: lower-to-tile: append=true needs kv-lens=true: the new keys go after each sequence's cached ones

// A given rotation that the scores do not read rotates nothing: the cache stores k as given.
// UNUSED:     tile.kernel @append_kv(%k: !tile.tensor<k>, %v: !tile.tensor<v>, %k_cache: !tile.tensor<k_cache>, %v_cache: !tile.tensor<v_cache>, %kv_lens: !tile.tensor<kv_lens>)
// UNUSED-NOT: tile.rotate
