// RUN: attnfuse-opt %s | attnfuse-opt | filecheck %s
// RUN: %roundtrip | filecheck %s
// The fused backward's ops print in their custom form and survive a print-parse round trip:
// tile.dot_lhs_transposed (dS^T transposed times K) and tile.store_add (into dq_acc's loop rows; unordered, and in key-block order).
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.zeros : !tile.tile<m x n x f32>
    %p = tile.dot_lhs_transposed %g, %kb : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK:      %p = tile.dot_lhs_transposed %g, %kb : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
// CHECK-NEXT: tile.store_add %p, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>

// tile.store_add in key-block order: the in_order clause and the dq_order tensor's type.
tile.kernel @k_ordered(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK-LABEL: tile.kernel @k_ordered(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>)
// CHECK:       tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>

// tile.store_add in key-block order in a loop over a block list: the loop's `ranks` clause
// (each entry's turn at its query block) and its type, beside the list, before `masked`.
tile.kernel @k_ordered_listed(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>, %pqr: !tile.tensor<partial_q_rank>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %pqb, %pqc ranks %pqr : !tile.tensor<partial_q_rank> masked iter_args(%a) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK-LABEL: tile.kernel @k_ordered_listed(
// CHECK:       %r = tile.sparse_q_loop %pqb, %pqc ranks %pqr : !tile.tensor<partial_q_rank> masked iter_args(%a) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
// CHECK:         tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
