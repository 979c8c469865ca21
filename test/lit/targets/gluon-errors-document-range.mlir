// RUN: not attnfuse-opt %s -p warp-specialize -t gluon 2>&1 | filecheck %s
// RUN: attnfuse-opt %s -t triton | filecheck %s --check-prefix=PORTABLE
// Hand-written tile IR: a document filter in a key loop over a *range* (tile.kv_loop), not over
// the runtime's document lists. The Gluon schedule takes document ids only with their lists
// (flash_shape: `doc_ids` is a listed kernel's role), so warp-specialize leaves this kernel
// alone and the Gluon target refuses it, located, instead of printing a kernel that walks
// blocks the ids were never listed for; the portable target prints it as written.
// CHECK-NOT: Traceback
// CHECK: error: the gluon target cannot lower attention_fwd: role doc_ids has no place in the schedule
// PORTABLE: # tile.document_mask: keep pairs in one document
builtin.module {
  tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %doc_ids: !tile.tensor<doc_ids>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>} {
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<>}
    %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %kv_start to %full_end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_2: !tile.tile<m x dv x f32>, %row_max_2: !tile.tile<m x f32>, %row_sum_2: !tile.tile<m x f32>):
      %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs, %row_max_3, %row_sum_3, %alpha = tile.softmax_update %scores, %row_max_2, %row_sum_2 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_3 = tile.accumulate %acc_2, %probs, %v_1 rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_3, %row_max_3, %row_sum_3 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %acc_4, %row_max_4, %row_sum_4 = tile.kv_loop %full_end to %kv_end masked iter_args(%acc_1, %row_max_1, %row_sum_1) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_5: !tile.tile<m x dv x f32>, %row_max_5: !tile.tile<m x f32>, %row_sum_5: !tile.tile<m x f32>):
      %k_2 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores_1 = tile.scores(%q_1) x(%k_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %scores_2 = tile.mask %scores_1 {band = #attn.band<>} : !tile.tile<m x n x f32>
      %scores_3 = tile.document_mask %scores_2, %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
      %v_2 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs_1, %row_max_6, %row_sum_6, %alpha_1 = tile.softmax_update %scores_3, %row_max_5, %row_sum_5 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_6 = tile.accumulate %acc_5, %probs_1, %v_2 rescaled %alpha_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_6, %row_max_6, %row_sum_6 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %out, %lse_1 = tile.softmax_finalize %acc_4, %row_max_4, %row_sum_4 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
    tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
    tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
    tile.return
  }
}

