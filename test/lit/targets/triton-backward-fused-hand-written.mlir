// RUN: attnfuse-opt %s -t triton | filecheck %s

// Hand-written fused-backward IR prints as it says, not as lower-to-tile would have built it:
// the dQ part here is the probabilities' (p^T)^T K, not the score gradient's, and it is added
// into dq_acc twice. (One unmasked query loop; lower-to-tile's kernels are in
// triton-backward-fused.mlir.)
// CHECK:      dq_part = tl.dot(tl.trans(probs.to(k.dtype)), k)
// CHECK-NEXT: # tile.store_add
// CHECK-NEXT: tl.atomic_add(dq_acc_base + queries[:, None] * stride_dq_acc_n + (cols_d)[None, :] * stride_dq_acc_d, dq_part, sem="relaxed")
// CHECK-NEXT: # tile.store_add
// CHECK-NEXT: tl.atomic_add(dq_acc_base + queries[:, None] * stride_dq_acc_n + (cols_d)[None, :] * stride_dq_acc_d, dq_part, sem="relaxed")
// CHECK-NOT:  tl.atomic_add

builtin.module {
  tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64, shared_offsets = ["do", "q"]} {
    %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
    %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
    %dk_1 = tile.zeros : !tile.tile<m x d x f32>
    %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
    %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
    %dk_5, %dv_5 = tile.q_loop %full_start to %full_end iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
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
      %dq_part_1 = tile.dot_lhs_transposed %probs_1, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
      tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
      tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
      tile.yield %dk_7, %dv_7 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
    }
    %dk_11 = tile.apply_scale %dk_5 : !tile.tile<m x d x f32>
    tile.store %dk_11, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
    tile.store %dv_5, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
    tile.return
  }
}
