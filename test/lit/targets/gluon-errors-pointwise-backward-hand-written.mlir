// RUN: awk 'BEGIN { RS = "// -----\n" } NR == 1' %s | not attnfuse-opt -t gluon 2>&1 | filecheck %s --check-prefix=MIXED
// RUN: awk 'BEGIN { RS = "// -----\n" } NR == 2' %s | not attnfuse-opt -t gluon 2>&1 | filecheck %s --check-prefix=EARLIER
// RUN: awk 'BEGIN { RS = "// -----\n" } NR == 3' %s | not attnfuse-opt -t gluon 2>&1 | filecheck %s --check-prefix=ROLES
// (One section per run: the tool stops at a module's first error.)
// Hand-written tile IR of scheduled fused backwards under a pointwise normalizer that the
// Gluon backward's one probability step and one gradient step cannot print: the target says
// so at the op (dialects/backward_shape.py) instead of printing something else.
// MIXED-NOT: Traceback
// EARLIER-NOT: Traceback
// ROLES-NOT: Traceback

// ReLU in the masked loops, sigmoid in the full one: one step function cannot serve both.
// MIXED: {{[0-9]+}}:{{[0-9]+}}: error: the gluon target cannot lower attention_bwd_dkdv_dq (tile.map): every query loop normalizes alike (softmax from lse, or the same pointwise normalizer and derivative)
tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
  %dk_2, %dv_2 = tile.q_loop %q_start to %full_start masked iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores = tile.scores(%k_1) x(%q_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_1 = tile.mask %scores {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs = tile.relu_probs %scores_1 : !tile.tile<m x n x f32>
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.relu_grad %scores_1, %grad_probs : !tile.tile<m x n x f32>
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_scores, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_5, %dv_5 = tile.q_loop %full_start to %full_end iter_args(%dk_2, %dv_2) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores_2 = tile.scores(%k_1) x(%q_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %probs_1 = tile.map(%scores_2) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%a: f32):
      %one = arith.constant 1.000000e+00 : f32
      %na = arith.negf %a : f32
      %e = math.exp %na : f32
      %d = arith.addf %one, %e : f32
      %r = arith.divf %one, %d : f32
      tile.map_yield %r : f32
    }
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_1 = tile.map(%probs_1, %grad_probs_1) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%x: f32, %y: f32):
      %one1 = arith.constant 1.000000e+00 : f32
      %s1 = arith.subf %one1, %x : f32
      %m1 = arith.mulf %x, %s1 : f32
      %m2 = arith.mulf %y, %m1 : f32
      tile.map_yield %m2 : f32
    }
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
    %scores_3 = tile.scores(%k_1) x(%q_3) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_4 = tile.mask %scores_3 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs_2 = tile.relu_probs %scores_4 : !tile.tile<m x n x f32>
    %grad_probs_2 = tile.dot_transposed %v_1, %grad_out_2 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_2 = tile.relu_grad %scores_4, %grad_probs_2 : !tile.tile<m x n x f32>
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

// -----

// A sigmoid map that also reads the raw scores under the mask's result: the step prints every
// score tile as `scores`, so the raw tile is gone by then.
// EARLIER: {{[0-9]+}}:{{[0-9]+}}: error: the gluon target cannot lower attention_bwd_dkdv_dq (tile.map): a map of the scores may read the tile it refines, but no earlier score tile
tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<>}
  %dk_2, %dv_2 = tile.q_loop %q_start to %full_end iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores = tile.scores(%k_1) x(%q_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %num_keys = tile.seq_len {axis = #tile<seq key>} : f32
    %probs = tile.map(%scores, %scores) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%0: f32, %1: f32):
      %2 = math.exp %1 : f32
      %3 = arith.negf %2 : f32
      %4 = arith.addf %0, %3 : f32
      %5 = arith.constant 1.000000e+00 : f32
      %6 = arith.negf %4 : f32
      %7 = math.exp %6 : f32
      %8 = arith.addf %5, %7 : f32
      %9 = arith.divf %5, %8 : f32
      tile.map_yield %9 : f32
    }
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.map(%probs, %grad_probs) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%10: f32, %11: f32):
      %12 = arith.constant 1.000000e+00 : f32
      %13 = arith.subf %12, %10 : f32
      %14 = arith.mulf %10, %13 : f32
      %15 = arith.mulf %11, %14 : f32
      tile.map_yield %15 : f32
    }
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_scores, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_5, %dv_5 = tile.q_loop %full_end to %q_end masked iter_args(%dk_2, %dv_2) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores_1 = tile.scores(%k_1) x(%q_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_2 = tile.mask %scores_1 {band = #attn.band<>} : !tile.tile<m x n x f32>
    %num_keys_1 = tile.seq_len {axis = #tile<seq key>} : f32
    %probs_1 = tile.map(%scores_2, %scores_1) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%16: f32, %17: f32):
      %18 = math.exp %17 : f32
      %19 = arith.negf %18 : f32
      %20 = arith.addf %16, %19 : f32
      %21 = arith.constant 1.000000e+00 : f32
      %22 = arith.negf %20 : f32
      %23 = math.exp %22 : f32
      %24 = arith.addf %21, %23 : f32
      %25 = arith.divf %21, %24 : f32
      tile.map_yield %25 : f32
    }
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_1 = tile.map(%probs_1, %grad_probs_1) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb0(%26: f32, %27: f32):
      %28 = arith.constant 1.000000e+00 : f32
      %29 = arith.subf %28, %26 : f32
      %30 = arith.mulf %26, %29 : f32
      %31 = arith.mulf %27, %30 : f32
      tile.map_yield %31 : f32
    }
    %dv_7 = tile.accumulate %dv_6, %probs_1, %grad_out_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_7 = tile.accumulate %dk_6, %grad_scores_1, %q_2 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part_1 = tile.dot_lhs_transposed %grad_scores_1, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part_1, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_7, %dv_7 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_8 = tile.apply_scale %dk_5 : !tile.tile<m x d x f32>
  tile.store %dk_8, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.store %dv_5, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.return
}

// -----

// lse and delta among the roles of a kernel whose loops read neither: the launch passes their
// descriptors by role, so it would shift every argument after them.
// ROLES: {{[0-9]+}}:{{[0-9]+}}: error: the gluon target cannot lower attention_bwd_dkdv_dq: role lse has no place in the schedule
tile.kernel @attention_bwd_dkdv_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %dq_acc: !tile.tensor<dq_acc>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64} {
  %k_1 = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %dk_1 = tile.zeros : !tile.tile<m x d x f32>
  %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
  %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
  %dk_2, %dv_2 = tile.q_loop %q_start to %full_start masked iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_3: !tile.tile<m x d x f32>, %dv_3: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores = tile.scores(%k_1) x(%q_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_1 = tile.mask %scores {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs = tile.relu_probs %scores_1 : !tile.tile<m x n x f32>
    %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores = tile.relu_grad %scores_1, %grad_probs : !tile.tile<m x n x f32>
    %dv_4 = tile.accumulate %dv_3, %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dk_4 = tile.accumulate %dk_3, %grad_scores, %q_1 : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_part = tile.dot_lhs_transposed %grad_scores, %k_1 : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.store_add %dq_part, %dq_acc[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %dk_4, %dv_4 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  }
  %dk_5, %dv_5 = tile.q_loop %full_start to %full_end iter_args(%dk_2, %dv_2) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  ^bb0(%dk_6: !tile.tile<m x d x f32>, %dv_6: !tile.tile<m x dv x f32>):
    %q_2 = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
    %grad_out_1 = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %scores_2 = tile.scores(%k_1) x(%q_2) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %probs_1 = tile.relu_probs %scores_2 : !tile.tile<m x n x f32>
    %grad_probs_1 = tile.dot_transposed %v_1, %grad_out_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_1 = tile.relu_grad %scores_2, %grad_probs_1 : !tile.tile<m x n x f32>
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
    %scores_3 = tile.scores(%k_1) x(%q_3) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores_4 = tile.mask %scores_3 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %probs_2 = tile.relu_probs %scores_4 : !tile.tile<m x n x f32>
    %grad_probs_2 = tile.dot_transposed %v_1, %grad_out_2 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %grad_scores_2 = tile.relu_grad %scores_4, %grad_probs_2 : !tile.tile<m x n x f32>
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
