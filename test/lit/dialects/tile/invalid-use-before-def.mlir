// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p fold-scale-into-exp -t triton 2>&1 | filecheck %s
// A tile kernel whose key loop reads the loaded v (tile.accumulate) before the load defining it: the
// kernel's verifier checks that every value is defined before its uses, in its block or in one
// enclosing it (dialects/dominance.py), located at the reader, instead of the printer emitting
// code that reads an undefined name (an internal compiler error before).
// CHECK-NOT: Traceback
// CHECK-NOT: internal compiler error
// CHECK: invalid-use-before-def.mlir:[[# @LINE + 11]]:{{[0-9]+}}: error: 'tile.accumulate' reads %v before it is defined: a body defines each value before its uses
builtin.module {
  tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>} {
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<>}
    %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %kv_start to %full_end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_2: !tile.tile<m x dv x f32>, %row_max_2: !tile.tile<m x f32>, %row_sum_2: !tile.tile<m x f32>):
      %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %probs, %row_max_3, %row_sum_3, %alpha = tile.softmax_update %scores, %row_max_2, %row_sum_2 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_3 = tile.accumulate %acc_2, %probs, %v_1 rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      tile.yield %acc_3, %row_max_3, %row_sum_3 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %acc_4, %row_max_4, %row_sum_4 = tile.kv_loop %full_end to %kv_end masked iter_args(%acc_1, %row_max_1, %row_sum_1) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_5: !tile.tile<m x dv x f32>, %row_max_5: !tile.tile<m x f32>, %row_sum_5: !tile.tile<m x f32>):
      %k_2 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores_1 = tile.scores(%q_1) x(%k_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %scores_2 = tile.mask %scores_1 {band = #attn.band<>} : !tile.tile<m x n x f32>
      %v_2 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs_1, %row_max_6, %row_sum_6, %alpha_1 = tile.softmax_update %scores_2, %row_max_5, %row_sum_5 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_6 = tile.accumulate %acc_5, %probs_1, %v_2 rescaled %alpha_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_6, %row_max_6, %row_sum_6 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %out, %lse_1 = tile.softmax_finalize %acc_4, %row_max_4, %row_sum_4 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
    tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
    tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
    tile.return
  }
}

