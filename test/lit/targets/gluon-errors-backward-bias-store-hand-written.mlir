// RUN: not attnfuse-opt %s -t gluon 2>&1 | filecheck %s
// Hand-written tile IR of a scheduled fused backward with a bias gradient whose first loop
// stores dS after soft-capping's VJP has refined the gradient tile, but stores the tile from
// before it (%grad_scores). The Gluon step refines one gradient tile in place, so that tile no
// longer exists there: the target refuses the kernel at the store, located, rather than storing
// the refined tile.
// CHECK-NOT: Traceback
// CHECK: gluon-errors-backward-bias-store-hand-written.mlir:[[# @LINE + 37]]:5: error: the gluon target cannot lower attention_bwd_dkdv_dq_bias (tile.store_scores): a gradient store reads the gradient tile as the VJP ops have refined it at that point
tile.kernel @attention_bwd_dkdv_dq_bias(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<>}
  %dk_2, %dv_2 = tile.q_loop %q_start to %full_end iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_1 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_1 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores = tile.scores(%k_1) x(%q_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_1 = tile.map(%scores) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%0: f32):
      %1 = arith.constant 3.000000e+01 : f32
      %2 = arith.divf %0, %1 fastmath<afn> : f32
      %3 = math.tanh %2 : f32
      %4 = arith.mulf %3, %1 : f32
      tile.map_yield %4 : f32
    }
    %scores_2 = tile.add_bias %scores_1, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    %probs = tile.recompute_probs %scores_2, %lse_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_scores_1 = tile.map(%scores, %grad_scores) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%5: f32, %6: f32):
      %7 = arith.constant 3.000000e+01 : f32
      %8 = arith.divf %5, %7 fastmath<afn> : f32
      %9 = math.tanh %8 : f32
      %10 = arith.constant 1.000000e+00 : f32
      %11 = arith.mulf %9, %9 : f32
      %12 = arith.subf %10, %11 : f32
      %13 = arith.mulf %6, %12 : f32
      tile.map_yield %13 : f32
    }
    tile.store_scores %grad_scores, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores_1, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_scores_1, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_5, %dv_5 = tile.q_loop %full_end to %q_end masked iter_args(%dk_2, %dv_2) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_2 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_2 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores_3 = tile.scores(%k_1) x(%q_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_4 = tile.map(%scores_3) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%14: f32):
      %15 = arith.constant 3.000000e+01 : f32
      %16 = arith.divf %14, %15 fastmath<afn> : f32
      %17 = math.tanh %16 : f32
      %18 = arith.mulf %17, %15 : f32
      tile.map_yield %18 : f32
    }
    %scores_5 = tile.add_bias %scores_4, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    %scores_6 = tile.mask %scores_5 {band = #attn.band<>} : !tile.tile<m x n x f32>
    %probs_1 = tile.recompute_probs %scores_6, %lse_2 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_2 = tile.softmax_grad %probs_1, %grad_probs_1, %delta_2 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    tile.store_scores %grad_scores_2, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
    %grad_scores_3 = tile.map(%scores_3, %grad_scores_2) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%19: f32, %20: f32):
      %21 = arith.constant 3.000000e+01 : f32
      %22 = arith.divf %19, %21 fastmath<afn> : f32
      %23 = math.tanh %22 : f32
      %24 = arith.constant 1.000000e+00 : f32
      %25 = arith.mulf %23, %23 : f32
      %26 = arith.subf %24, %25 : f32
      %27 = arith.mulf %20, %26 : f32
      tile.map_yield %27 : f32
    }
    %dv_7 = tile.accumulate %dv_6, %probs_1, %grad_out_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_7 = tile.accumulate %dk_6, %grad_scores_3, %q_2 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part_1 = tile.dot_lhs_transposed %grad_scores_3, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_7, %dv_7 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_8 = tile.apply_scale %dk_5 : !tile.tile<m x d x f32>
  tile.store %dk_8, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.store %dv_5, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.return
}
