// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s
// Verifier errors of the split decode's ops and of the cache attributes.

tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %s2, %fs2, %fe2, %e2 = tile.kv_split %s, %fs, %fe, %e
  tile.return
}
// CHECK: tile.kv_split needs a kv_splits kernel

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out, %lse = tile.merge_splits %o_part, %lse_part weighted : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.return
}
// CHECK: tile.merge_splits needs a query_blocks kernel

// -----

tile.kernel @k(%o: !tile.tensor<o>, %lse_part: !tile.tensor<lse_part>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out, %lse = tile.merge_splits %o, %lse_part weighted : !tile.tensor<o>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.return
}
// CHECK: tile.merge_splits merges an o_part tensor

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  tile.store %z, %o_part[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o_part>
  tile.return
}
// CHECK: o_part blocks are accessed only by kv_splits kernels

// -----

tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  tile.store %z, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.return
}
// CHECK: a kv_splits kernel stores partial results (o_part, lse_part), not o

// -----

tile.kernel @k(%kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.return
}
// CHECK: a kernel reading a paged cache has a block_table parameter and an integer 'page_size' attribute, both or neither

// -----

tile.kernel @k(%block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_size = 16 : i64} {
  tile.return
}
// CHECK: a paged kernel needs a kv_lens parameter: the pages hold no length

// -----

tile.kernel @k(%kv_lens: !tile.tensor<kv_lens>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_lookahead = 1 : i64} {
  tile.return
}
// CHECK: page_lookahead is an attribute of a paged kernel (one with a block_table parameter)

// -----

tile.kernel @k(%kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_size = 16 : i64, page_lookahead = 2 : i64} {
  tile.return
}
// CHECK: page_lookahead must be 0 or 1, got 2

// -----

tile.kernel @k(%kv_lens: !tile.tensor<kv_lens>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, hoist_page_rows = 1 : i64} {
  tile.return
}
// CHECK: hoist_page_rows is an attribute of a paged kernel (one with a block_table parameter)

// -----

tile.kernel @k(%kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_size = 16 : i64, hoist_page_rows = 2 : i64} {
  tile.return
}
// CHECK: hoist_page_rows must be 0 or 1, got 2

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, merge_stages = 0 : i64} {
  tile.return
}
// CHECK: merge_stages must be an integer >= 1, got 0

// -----

tile.kernel @k(%fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %fb, %fc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: tile.sparse_kv_loop needs a kernel whose programs own query blocks

// -----

tile.kernel @k(%k: !tile.tensor<k>, %kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_size = 16 : i64} {
  tile.return
}
// CHECK: a paged cache is accessed by query_blocks, kv_splits and appended_keys kernels only

// -----

tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r = tile.kv_loop %s to %e masked iter_args(%a) : !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: tile.kv_loop in a kv_splits kernel must loop over bounds clipped by tile.kv_split

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out, %none = tile.merge_splits %o_part, %lse_part : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.store %none, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
  tile.return
}
// CHECK: an unweighted tile.merge_splits has no log-sum-exp: its lse result must not be used

// -----

tile.kernel @k(%k_cache: !tile.tensor<k_cache>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x d x f32>
  tile.store %z, %k_cache[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<k_cache>
  tile.return
}
// CHECK: k_cache blocks are accessed only by appended_keys kernels

// -----

tile.kernel @k(%k: !tile.tensor<k>) attributes {grid = #tile<grid appended_keys>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.return
}
// CHECK: an appended_keys kernel needs a kv_lens parameter: the new keys go after the cached ones

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %c: !tile.tensor<split_counts>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.merge_last_split %o_part, %lse_part, %c into %o, %lse weighted : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<o>, !tile.tensor<lse>
  tile.return
}
// CHECK: tile.merge_last_split needs a kv_splits kernel

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %c: !tile.tensor<split_counts>, %o: !tile.tensor<o>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.merge_last_split %o_part, %lse_part, %c into %o weighted : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<o>
  tile.return
}
// CHECK: tile.merge_last_split stores an lse exactly when it is weighted (softmax)

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %out, %l = tile.merge_splits %o_part, %lse weighted : !tile.tensor<o_part>, !tile.tensor<lse> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.return
}
// CHECK: tile.merge_splits reads an lse_part tensor

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %c: !tile.tensor<split_counts>, %q: !tile.tensor<q>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.merge_last_split %o_part, %lse_part, %c into %q : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<q>
  tile.return
}
// CHECK: tile.merge_last_split's operands are o_part, lse_part, split_counts, o and lse; got another role for o

// -----

tile.kernel @k(%dk: !tile.tensor<dk>, %kv_lens: !tile.tensor<kv_lens>) attributes {grid = #tile<grid appended_keys>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x d x f32>
  tile.store %x, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.return
}
// CHECK: an appended_keys kernel reads the new k and v and writes k_cache and v_cache, not dk

// -----

// Below 16 rows only for a merge: other kernels' rows are tl.dot operands.
tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 1 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.return
}
// CHECK: block_m must be a power of two >= 16, got 1

// -----

// pdl: only on a split decode's two kernels (the kv_splits kernel, the merge), and 0 or 1.
tile.kernel @k(%q: !tile.tensor<q>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, pdl = 1 : i64} {
  tile.return
}
// CHECK: pdl is an attribute of a split decode's kernels: a kv_splits kernel or the kernel that merges its partials (tile.merge_splits)

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, pdl = 2 : i64} {
  tile.return
}
// CHECK: pdl must be 0 or 1, got 2

// -----

tile.kernel @k(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %c: !tile.tensor<split_counts>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, pdl = 1 : i64} {
  tile.merge_last_split %o_part, %lse_part, %c into %o, %lse weighted : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<o>, !tile.tensor<lse>
  tile.return
}
// CHECK: pdl: a kv_splits kernel that merges its own splits (tile.merge_last_split) has no dependent kernel to launch early
