// RUN: not attnfuse-opt %s -p warp-specialize -t gluon 2>&1 | filecheck %s
// Hand-written tile IR of a forward whose masked loop adds the raw scores to the masked,
// soft-capped ones: the warp-specialized step prints every tile of the score chain as the one
// variable `scores`, so by then the raw tile is gone. The shape analysis (flash_shape's
// refining_chain, which the backward's analysis shares) refuses it at the map, and
// warp-specialize leaves the kernel to the portable schedule instead of printing
// `scores + scores`.
// CHECK-NOT: Traceback
// CHECK: error: the gluon target cannot lower attention_fwd (tile.map): a map of the scores may read the tile it refines, but no earlier score tile
builtin.module {
  tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, block_order = #tile<order descending>} {
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
    %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %kv_start to %full_end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_2: !tile.tile<m x dv x f32>, %row_max_2: !tile.tile<m x f32>, %row_sum_2: !tile.tile<m x f32>):
      %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %scores_1 = tile.map(%scores) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
      ^bb0(%0: f32):
        %1 = arith.constant 2.000000e+01 : f32
        %2 = arith.divf %0, %1 : f32
        %3 = math.tanh %2 : f32
        %4 = arith.mulf %3, %1 : f32
        tile.map_yield %4 : f32
      }
      %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs, %row_max_3, %row_sum_3, %alpha = tile.softmax_update %scores_1, %row_max_2, %row_sum_2 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_3 = tile.accumulate %acc_2, %probs, %v_1 rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_3, %row_max_3, %row_sum_3 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %acc_4, %row_max_4, %row_sum_4 = tile.kv_loop %full_end to %kv_end masked iter_args(%acc_1, %row_max_1, %row_sum_1) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_5: !tile.tile<m x dv x f32>, %row_max_5: !tile.tile<m x f32>, %row_sum_5: !tile.tile<m x f32>):
      %k_2 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores_2 = tile.scores(%q_1) x(%k_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %scores_3 = tile.map(%scores_2) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
      ^bb0(%5: f32):
        %6 = arith.constant 2.000000e+01 : f32
        %7 = arith.divf %5, %6 : f32
        %8 = math.tanh %7 : f32
        %9 = arith.mulf %8, %6 : f32
        tile.map_yield %9 : f32
      }
      %scores_4 = tile.mask %scores_3 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
      %scores_5 = tile.map(%scores_4, %scores_2) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
      ^bb0(%x: f32, %y: f32):
        %z = arith.addf %x, %y : f32
        tile.map_yield %z : f32
      }
      %v_2 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs_1, %row_max_6, %row_sum_6, %alpha_1 = tile.softmax_update %scores_5, %row_max_5, %row_sum_5 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_6 = tile.accumulate %acc_5, %probs_1, %v_2 rescaled %alpha_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_6, %row_max_6, %row_sum_6 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %out, %lse_1 = tile.softmax_finalize %acc_4, %row_max_4, %row_sum_4 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
    tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
    tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
    tile.return
  }
}

