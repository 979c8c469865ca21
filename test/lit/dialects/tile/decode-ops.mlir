// RUN: attnfuse-opt %s | filecheck %s
// RUN: %roundtrip | filecheck %s
// The split decode's ops, and the cache roles, round-trip through the generic form.

// CHECK: tile.kernel @decode(%q: !tile.tensor<q>, %o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, {{.*}}page_size = 32 : i64}
// CHECK: %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
// CHECK: %s2, %fs2, %fe2, %e2 = tile.kv_split %s, %fs, %fe, %e
// CHECK: tile.store %z, %o_part[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o_part>
// CHECK: tile.store %l, %lse_part[program] : !tile.tile<m x f32> -> !tile.tensor<lse_part>
tile.kernel @decode(%q: !tile.tensor<q>, %o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %kv_lens: !tile.tensor<kv_lens>, %block_table: !tile.tensor<block_table>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, page_size = 32 : i64} {
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %s2, %fs2, %fe2, %e2 = tile.kv_split %s, %fs, %fe, %e
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %l = tile.zeros : !tile.tile<m x f32>
  tile.store %z, %o_part[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o_part>
  tile.store %l, %lse_part[program] : !tile.tile<m x f32> -> !tile.tensor<lse_part>
  tile.return
}

// A merge multiplies nothing: its programs may own a single query row (block_m 1). It may be
// launched as the split kernel's programmatic dependent (pdl).
// CHECK: tile.kernel @merge
// CHECK-SAME: pdl = 1 : i64
// CHECK: %out, %lse_1 = tile.merge_splits %o_part, %lse_part weighted : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
// CHECK: %sum, %none = tile.merge_splits %o_part, %lse_part : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
tile.kernel @merge(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 1 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, pdl = 1 : i64} {
  %out, %lse_1 = tile.merge_splits %o_part, %lse_part weighted : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  %sum, %none = tile.merge_splits %o_part, %lse_part : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
  tile.return
}

// CHECK: tile.kernel @merge_in_place
// CHECK: tile.merge_last_split %o_part, %lse_part, %counts into %o, %lse weighted : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<o>, !tile.tensor<lse>
tile.kernel @merge_in_place(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %counts: !tile.tensor<split_counts>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  tile.merge_last_split %o_part, %lse_part, %counts into %o, %lse weighted : !tile.tensor<o_part>, !tile.tensor<lse_part>, !tile.tensor<split_counts>, !tile.tensor<o>, !tile.tensor<lse>
  tile.return
}

// CHECK: tile.kernel @append(%k: !tile.tensor<k>, %k_cache: !tile.tensor<k_cache>, %kv_lens: !tile.tensor<kv_lens>) attributes {grid = #tile<grid appended_keys>
// CHECK: tile.store %x, %k_cache[program, all]
tile.kernel @append(%k: !tile.tensor<k>, %k_cache: !tile.tensor<k_cache>, %kv_lens: !tile.tensor<kv_lens>) attributes {grid = #tile<grid appended_keys>, element_type = f16, block_m = 16 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  tile.store %x, %k_cache[program, all] : !tile.tile<m x d x f16> -> !tile.tensor<k_cache>
  tile.return
}
