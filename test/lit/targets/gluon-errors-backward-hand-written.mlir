// RUN: not attnfuse-opt %s -t gluon 2>&1 | filecheck %s
// Hand-written tile IR of a scheduled fused backward whose first loop adds the dQ part of the
// probability gradient (dP^T), not of the score gradient: the Gluon target says so at the op
// instead of printing the probe's schedule over it.
// CHECK-NOT: Traceback
// CHECK: gluon-errors-backward-hand-written.mlir:{{[0-9]+}}:{{[0-9]+}}: error: the gluon target cannot lower attention_bwd_dkdv_dq (tile.dot_lhs_transposed): dQ part = dS k of the block's gradient and keys
tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
  %dk_2, %dv_2 = tile.q_loop %q_start to %full_start masked iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_1 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_1 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores = tile.scores(%k_1) x(%q_1) {unscaled} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_1 = tile.mask %scores {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs = tile.recompute_probs %scores_1, %lse_1 {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_probs, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_5, %dv_5 = tile.q_loop %full_start to %full_end iter_args(%dk_2, %dv_2) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_2 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_2 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores_2 = tile.scores(%k_1) x(%q_2) {unscaled} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %probs_1 = tile.recompute_probs %scores_2, %lse_2 {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_1 = tile.softmax_grad %probs_1, %grad_probs_1, %delta_2 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %dv_7 = tile.accumulate %dv_6, %probs_1, %grad_out_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_7 = tile.accumulate %dk_6, %grad_scores_1, %q_2 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part_1 = tile.dot_lhs_transposed %grad_scores_1, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_7, %dv_7 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_8, %dv_8 = tile.q_loop %full_end to %q_end masked iter_args(%dk_5, %dv_5) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_9: !tile.tile<m x d x f32>, %dv_9: !tile.tile<m x dv x f32>):
    %q_3 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_2 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_3 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_3 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores_3 = tile.scores(%k_1) x(%q_3) {unscaled} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_4 = tile.mask %scores_3 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs_2 = tile.recompute_probs %scores_4, %lse_3 {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs_2 = tile.dot_transposed %v_1, %grad_out_2 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_2 = tile.softmax_grad %probs_2, %grad_probs_2, %delta_3 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %dv_10 = tile.accumulate %dv_9, %probs_2, %grad_out_2 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_10 = tile.accumulate %dk_9, %grad_scores_2, %q_3 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part_2 = tile.dot_lhs_transposed %grad_scores_2, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part_2, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_10, %dv_10 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_11 = tile.apply_scale %dk_8 : !tile.tile<m x d x f32>
  tile.store %dk_11, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.store %dv_8, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.return
}
