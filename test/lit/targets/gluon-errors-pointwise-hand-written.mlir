// RUN: not attnfuse-opt %s -p warp-specialize -t gluon 2>&1 | filecheck %s
// A hand-written pointwise-normalizer (ReLU) kernel whose data flow is not the flash shape's: the
// Gluon target refuses it with the op at fault, never printing something else.

// The diagonal loop's weights read the unmasked scores: its mask would be dropped.
// CHECK: error: the gluon target cannot lower attention_fwd (tile.relu_probs): a pointwise normalizer's ops must refine the previous tile, in order
tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>} {
  %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %acc = tile.zeros : !tile.tile<m x dv x f32>
  %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<>}
  %acc_1 = tile.kv_loop %kv_start to %full_end iter_args(%acc) : !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%acc_2: !tile.tile<m x dv x f32>):
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %probs = tile.relu_probs %scores : !tile.tile<m x n x f32>
    %acc_3 = tile.accumulate %acc_2, %probs, %v_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    tile.yield %acc_3 : !tile.tile<m x dv x f32>
  }
  %acc_4 = tile.kv_loop %full_end to %kv_end masked iter_args(%acc_1) : !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%acc_5: !tile.tile<m x dv x f32>):
    %k_2 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %scores_1 = tile.scores(%q_1) x(%k_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_2 = tile.mask %scores_1 {band = #attn.band<>} : !tile.tile<m x n x f32>
    %v_2 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %probs_1 = tile.relu_probs %scores_1 : !tile.tile<m x n x f32>
    %acc_6 = tile.accumulate %acc_5, %probs_1, %v_2 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    tile.yield %acc_6 : !tile.tile<m x dv x f32>
  }
  tile.store %acc_4, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.return
}
