// RUN: not attnfuse-opt %s -t gluon 2>&1 | filecheck %s
// Hand-written tile IR of a scheduled fused backward over block lists (documents) whose loops
// walk the partial query blocks' list before the full ones': the schedule walks the full
// list's entries first and tells a step's masks by its index against the full list's count,
// so it would run the partial blocks unmasked. The Gluon target says so at the loop instead.
// CHECK-NOT: Traceback
// CHECK: gluon-errors-backward-listed-hand-written.mlir:{{[0-9]+}}:{{[0-9]+}}: error: the gluon target cannot lower attention_bwd_dkdv_dq (tile.sparse_q_loop): the block lists are walked full blocks (unmasked) then partial blocks (masked), each once
tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>, %doc_ids: !tile.tensor<doc_ids>, %full_q_blocks: !tile.tensor<full_q_blocks>, %full_q_count: !tile.tensor<full_q_count>, %partial_q_blocks: !tile.tensor<partial_q_blocks>, %partial_q_count: !tile.tensor<partial_q_count>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %dk_5, %dv_5 = tile.sparse_q_loop %partial_q_blocks, %partial_q_count masked iter_args(%dk_1, %dv_1) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_2 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_2 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores_1 = tile.scores(%k_1) x(%q_2) {unscaled} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_2 = tile.mask %scores_1 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %scores_3 = tile.document_mask %scores_2, %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
    %probs_1 = tile.recompute_probs %scores_3, %lse_2 {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_1 = tile.softmax_grad %probs_1, %grad_probs_1, %delta_2 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %dv_7 = tile.accumulate %dv_6, %probs_1, %grad_out_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_7 = tile.accumulate %dk_6, %grad_scores_1, %q_2 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part_1 = tile.dot_lhs_transposed %grad_scores_1, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_7, %dv_7 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_2, %dv_2 = tile.sparse_q_loop %full_q_blocks, %full_q_count iter_args(%dk_5, %dv_5) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %lse_1 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %delta_1 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %scores = tile.scores(%k_1) x(%q_1) {unscaled} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %probs = tile.recompute_probs %scores, %lse_1 {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_scores, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_8 = tile.apply_scale %dk_2 : !tile.tile<m x d x f32>
  tile.store %dk_8, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.store %dv_2, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.return
}
