// RUN: attnfuse-opt %s -t triton | filecheck %s
// RUN: attnfuse-opt %s -t triton | python -c "import ast, sys; ast.parse(sys.stdin.read())"

// SSA names print as Python identifiers that mean what the IR says: a keyword, a built-in or
// a name with `-` or `.` is renamed, and a value never takes a name the printed code writes
// or reads itself (the split merge's `splits`, its loop's rows; the tile width `BLOCK_N`).
// CHECK-LABEL: def attention_fwd(
// CHECK:       BLOCK_N_1 = tl.dot(
// A division without fastmath flags is correctly rounded (tl.div_rn), as arith.divf means.
// CHECK:       v_for = (_tanh(tl.div_rn(BLOCK_N_1, 5.0)) * 5.0)
// CHECK:       a_b = tl.where(keep, v_for, float("-inf"))
// CHECK:       scores_x = tl.math.exp2(
// CHECK:       acc = tl.dot(probs_1.to(v_1.dtype), v_1, acc=acc * scores_x[:, None])
// CHECK:       v_float = acc / row_sum_safe[:, None]
// CHECK:       tl.store(o_base + {{.*}}, v_float.to(o_ptr.dtype.element_ty)
// CHECK-LABEL: def attention_merge(
// CHECK:       splits_1 = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
// CHECK:       for step in range(0, num_splits, 64):
// CHECK-NEXT:      splits = step + tl.arange(0, 64)
// CHECK:           splits_1 = splits_1 * rescale[:, None] + tl.sum(split_out * weight[:, :, None], 1)
// CHECK:       tl.store(o_base + {{.*}}, splits_1.to(o_ptr.dtype.element_ty)

builtin.module {
  tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>} {
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
    %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %kv_start to %full_end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
    ^bb0(%acc_2: !tile.tile<m x dv x f32>, %row_max_2: !tile.tile<m x f32>, %row_sum_2: !tile.tile<m x f32>):
      %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
      %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %scores_1 = tile.map(%scores) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
      ^bb0(%0: f32):
        %1 = arith.constant 5.000000e+00 : f32
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
      %BLOCK_N = tile.scores(%q_1) x(%k_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
      %for = tile.map(%BLOCK_N) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
      ^bb0(%5: f32):
        %6 = arith.constant 5.000000e+00 : f32
        %7 = arith.divf %5, %6 : f32
        %8 = math.tanh %7 : f32
        %9 = arith.mulf %8, %6 : f32
        tile.map_yield %9 : f32
      }
      %a-b = tile.mask %for {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
      %v_2 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
      %probs_1, %row_max_6, %row_sum_6, %scores.x = tile.softmax_update %a-b, %row_max_5, %row_sum_5 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
      %acc_6 = tile.accumulate %acc_5, %probs_1, %v_2 rescaled %scores.x : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
      tile.yield %acc_6, %row_max_6, %row_sum_6 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    }
    %float, %lse_1 = tile.softmax_finalize %acc_4, %row_max_4, %row_sum_4 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
    tile.store %float, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
    tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
    tile.return
  }
  tile.kernel @attention_merge(%o_part: !tile.tensor<o_part>, %lse_part: !tile.tensor<lse_part>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 1 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>, merge_stages = 1 : i64, pdl = 1 : i64} {
    %splits, %lse_1 = tile.merge_splits %o_part, %lse_part weighted : !tile.tensor<o_part>, !tile.tensor<lse_part> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>
    tile.store %splits, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
    tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
    tile.return
  }
}
