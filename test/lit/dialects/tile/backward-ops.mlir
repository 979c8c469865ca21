// RUN: attnfuse-opt %s | attnfuse-opt | filecheck %s
// RUN: %roundtrip | filecheck %s
// The backward tile ops print in their custom form and survive a print-parse round trip
// (custom and generic), each in a kernel of the grid it belongs to: tile.row_dot (preprocess),
// tile.q_bounds / tile.q_loop / tile.sparse_q_loop / tile.dot_transposed /
// tile.recompute_probs and tile.softmax_grad along <n> / tile.relu_grad / tile.apply_scale /
// tile.split + tile.rotate inverse in key_blocks kernels (programs own key blocks), and
// tile.recompute_probs / tile.softmax_grad along <m>, tile.store_scores and an interleaved
// tile.split in a query_blocks kernel.

// The preprocess: delta = rowsum(dO * O), fp32, from operands of the input type.
// CHECK-LABEL: tile.kernel @bwd_preprocess(%o: !tile.tensor<o>, %do: !tile.tensor<do>, %delta: !tile.tensor<delta>) attributes {grid = #tile<grid query_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 32 : i64} {
tile.kernel @bwd_preprocess(%o: !tile.tensor<o>, %do: !tile.tensor<do>, %delta: !tile.tensor<delta>) attributes {grid = #tile<grid query_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 64 : i64, head_dim_v = 32 : i64} {
  // CHECK-NEXT: %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x bf16>
  %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x bf16>
  // CHECK-NEXT: %grad_out = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x bf16>
  %grad_out = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x bf16>
  // CHECK-NEXT: %d = tile.row_dot %grad_out, %out : !tile.tile<m x dv x bf16> -> !tile.tile<m x f32>
  %d = tile.row_dot %grad_out, %out : !tile.tile<m x dv x bf16> -> !tile.tile<m x f32>
  // CHECK-NEXT: tile.store %d, %delta[program] : !tile.tile<m x f32> -> !tile.tensor<delta>
  tile.store %d, %delta[program] : !tile.tile<m x f32> -> !tile.tensor<delta>
  // CHECK-NEXT: tile.return
  tile.return
// CHECK-NEXT: }
}

// dK/dV over key blocks: q_bounds splits the query range; the lse and delta vectors run
// along the loop rows (<n>); a static apply_scale, then split + inverse rotation of dK.
// CHECK-LABEL: tile.kernel @bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 32 : i64, num_warps = 8 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
tile.kernel @bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 32 : i64, num_warps = 8 : i64, num_stages = 3 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  // CHECK-NEXT: %k = tile.load %k_rot[program, all] : !tile.tensor<k_rot> -> !tile.tile<m x d x f16>
  %k = tile.load %k_rot[program, all] : !tile.tensor<k_rot> -> !tile.tile<m x d x f16>
  // CHECK-NEXT: %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
  // CHECK-NEXT: %dk0 = tile.zeros : !tile.tile<m x d x f32>
  %dk0 = tile.zeros : !tile.tile<m x d x f32>
  // CHECK-NEXT: %dv0 = tile.zeros : !tile.tile<m x dv x f32>
  %dv0 = tile.zeros : !tile.tile<m x dv x f32>
  // CHECK-NEXT: %start, %fs, %fe, %end = tile.q_bounds {band = #attn.band<lower = -127, upper = 0>}
  %start, %fs, %fe, %end = tile.q_bounds {band = #attn.band<lower = -127, upper = 0>}
  // CHECK-NEXT: %dk1, %dv1 = tile.q_loop %start to %fs masked iter_args(%dk0, %dv0) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  %dk1, %dv1 = tile.q_loop %start to %fs masked iter_args(%dk0, %dv0) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  // CHECK-NEXT: ^bb0(%a: !tile.tile<m x d x f32>, %b: !tile.tile<m x dv x f32>):
  ^bb0(%a: !tile.tile<m x d x f32>, %b: !tile.tile<m x dv x f32>):
    // CHECK-NEXT: %q = tile.load %q_rot[loop, all] : !tile.tensor<q_rot> -> !tile.tile<n x d x f16>
    %q = tile.load %q_rot[loop, all] : !tile.tensor<q_rot> -> !tile.tile<n x d x f16>
    // CHECK-NEXT: %g = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %g = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    // CHECK-NEXT: %l = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %l = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    // CHECK-NEXT: %dl = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %dl = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    // CHECK-NEXT: %s = tile.scores(%k) x(%q) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s = tile.scores(%k) x(%q) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %s1 = tile.mask %s {band = #attn.band<lower = -127, upper = 0>} : !tile.tile<m x n x f32>
    %s1 = tile.mask %s {band = #attn.band<lower = -127, upper = 0>} : !tile.tile<m x n x f32>
    // CHECK-NEXT: %p = tile.recompute_probs %s1, %l : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %p = tile.recompute_probs %s1, %l : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    // CHECK-NEXT: %dp = tile.dot_transposed %v_1, %g : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %dp = tile.dot_transposed %v_1, %g : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %ds = tile.softmax_grad %p, %dp, %dl : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %ds = tile.softmax_grad %p, %dp, %dl : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    // CHECK-NEXT: %b1 = tile.accumulate %b, %p, %g : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %b1 = tile.accumulate %b, %p, %g : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    // CHECK-NEXT: %a1 = tile.accumulate %a, %ds, %q : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %a1 = tile.accumulate %a, %ds, %q : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    // CHECK-NEXT: tile.yield %a1, %b1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
    tile.yield %a1, %b1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  // CHECK-NEXT: }
  }
  // CHECK-NEXT: %dk2, %dv2 = tile.q_loop %fs to %fe iter_args(%dk1, %dv1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  %dk2, %dv2 = tile.q_loop %fs to %fe iter_args(%dk1, %dv1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  // CHECK-NEXT: ^bb0(%dk_f: !tile.tile<m x d x f32>, %dv_f: !tile.tile<m x dv x f32>):
  ^bb0(%dk_f: !tile.tile<m x d x f32>, %dv_f: !tile.tile<m x dv x f32>):
    // CHECK-NEXT: %q_f = tile.load %q_rot[loop, all] : !tile.tensor<q_rot> -> !tile.tile<n x d x f16>
    %q_f = tile.load %q_rot[loop, all] : !tile.tensor<q_rot> -> !tile.tile<n x d x f16>
    // CHECK-NEXT: %g_f = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    %g_f = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
    // CHECK-NEXT: %l_f = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    %l_f = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
    // CHECK-NEXT: %dl_f = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    %dl_f = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
    // CHECK-NEXT: %s_f = tile.scores(%k) x(%q_f) {scale = 1.250000e-01 : f64} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s_f = tile.scores(%k) x(%q_f) {scale = 1.250000e-01 : f64} : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %p_f = tile.recompute_probs %s_f, %l_f : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %p_f = tile.recompute_probs %s_f, %l_f : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    // CHECK-NEXT: %dp_f = tile.dot_transposed %v_1, %g_f : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %dp_f = tile.dot_transposed %v_1, %g_f : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %ds_f = tile.softmax_grad %p_f, %dp_f, %dl_f : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    %ds_f = tile.softmax_grad %p_f, %dp_f, %dl_f : !tile.tile<m x n x f32>, !tile.tile<n x f32>
    // CHECK-NEXT: %dv_f1 = tile.accumulate %dv_f, %p_f, %g_f : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %dv_f1 = tile.accumulate %dv_f, %p_f, %g_f : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    // CHECK-NEXT: %dk_f1 = tile.accumulate %dk_f, %ds_f, %q_f : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dk_f1 = tile.accumulate %dk_f, %ds_f, %q_f : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    // CHECK-NEXT: tile.yield %dk_f1, %dv_f1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
    tile.yield %dk_f1, %dv_f1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  // CHECK-NEXT: }
  }
  // CHECK-NEXT: %dk3 = tile.apply_scale %dk2 {scale = 1.250000e-01 : f64} : !tile.tile<m x d x f32>
  %dk3 = tile.apply_scale %dk2 {scale = 1.250000e-01 : f64} : !tile.tile<m x d x f32>
  // CHECK-NEXT: %dk_lo, %dk_hi = tile.split %dk3 {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  %dk_lo, %dk_hi = tile.split %dk3 {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  // CHECK-NEXT: %dk_lo_1, %dk_hi_1 = tile.rotate %dk_lo, %dk_hi, %rope_table {positions = #tile<seq key>, inverse} : !tile.tile<m x half x f32>, !tile.tensor<rope_table>
  %dk_lo_1, %dk_hi_1 = tile.rotate %dk_lo, %dk_hi, %rope_table {positions = #tile<seq key>, inverse} : !tile.tile<m x half x f32>, !tile.tensor<rope_table>
  // CHECK-NEXT: tile.store %dk_lo_1, %dk[program, half_lo] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
  tile.store %dk_lo_1, %dk[program, half_lo] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
  // CHECK-NEXT: tile.store %dk_hi_1, %dk[program, half_hi] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
  tile.store %dk_hi_1, %dk[program, half_hi] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
  // CHECK-NEXT: tile.store %dv2, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.store %dv2, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  // CHECK-NEXT: tile.return
  tile.return
// CHECK-NEXT: }
}

// Block-sparse ReLU dK/dV: full query blocks, then the partial ones (masked); no lse, no delta.
// CHECK-LABEL: tile.kernel @bwd_dkdv_sparse(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>) attributes {grid = #tile<grid key_blocks>, element_type = f32, block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64} {
tile.kernel @bwd_dkdv_sparse(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %fqb: !tile.tensor<full_q_blocks>, %fqc: !tile.tensor<full_q_count>, %pqb: !tile.tensor<partial_q_blocks>, %pqc: !tile.tensor<partial_q_count>) attributes {grid = #tile<grid key_blocks>, element_type = f32, block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64} {
  // CHECK-NEXT: %k_blk = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f32>
  %k_blk = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f32>
  // CHECK-NEXT: %v_blk = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f32>
  %v_blk = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f32>
  // CHECK-NEXT: %dk_init = tile.zeros : !tile.tile<m x d x f32>
  %dk_init = tile.zeros : !tile.tile<m x d x f32>
  // CHECK-NEXT: %dv_init = tile.zeros : !tile.tile<m x dv x f32>
  %dv_init = tile.zeros : !tile.tile<m x dv x f32>
  // CHECK-NEXT: %dk_full, %dv_full = tile.sparse_q_loop %fqb, %fqc iter_args(%dk_init, %dv_init) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  %dk_full, %dv_full = tile.sparse_q_loop %fqb, %fqc iter_args(%dk_init, %dv_init) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  // CHECK-NEXT: ^bb0(%dk_a: !tile.tile<m x d x f32>, %dv_a: !tile.tile<m x dv x f32>):
  ^bb0(%dk_a: !tile.tile<m x d x f32>, %dv_a: !tile.tile<m x dv x f32>):
    // CHECK-NEXT: %q_a = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f32>
    %q_a = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f32>
    // CHECK-NEXT: %g_a = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f32>
    %g_a = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f32>
    // CHECK-NEXT: %s_a = tile.scores(%k_blk) x(%q_a) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    %s_a = tile.scores(%k_blk) x(%q_a) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %p_a = tile.relu_probs %s_a : !tile.tile<m x n x f32>
    %p_a = tile.relu_probs %s_a : !tile.tile<m x n x f32>
    // CHECK-NEXT: %dp_a = tile.dot_transposed %v_blk, %g_a : !tile.tile<m x dv x f32>, !tile.tile<n x dv x f32> -> !tile.tile<m x n x f32>
    %dp_a = tile.dot_transposed %v_blk, %g_a : !tile.tile<m x dv x f32>, !tile.tile<n x dv x f32> -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %ds_a = tile.relu_grad %s_a, %dp_a : !tile.tile<m x n x f32>
    %ds_a = tile.relu_grad %s_a, %dp_a : !tile.tile<m x n x f32>
    // CHECK-NEXT: %dv_a1 = tile.accumulate %dv_a, %p_a, %g_a : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    %dv_a1 = tile.accumulate %dv_a, %p_a, %g_a : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    // CHECK-NEXT: %dk_a1 = tile.accumulate %dk_a, %ds_a, %q_a : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f32>
    %dk_a1 = tile.accumulate %dk_a, %ds_a, %q_a : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f32>
    // CHECK-NEXT: tile.yield %dk_a1, %dv_a1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
    tile.yield %dk_a1, %dv_a1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  // CHECK-NEXT: }
  }
  // CHECK-NEXT: %dk_part, %dv_part = tile.sparse_q_loop %pqb, %pqc masked iter_args(%dk_full, %dv_full) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  %dk_part, %dv_part = tile.sparse_q_loop %pqb, %pqc masked iter_args(%dk_full, %dv_full) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
  // CHECK-NEXT: ^bb0(%dk_b: !tile.tile<m x d x f32>, %dv_b: !tile.tile<m x dv x f32>):
  ^bb0(%dk_b: !tile.tile<m x d x f32>, %dv_b: !tile.tile<m x dv x f32>):
    // CHECK-NEXT: %q_b = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f32>
    %q_b = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f32>
    // CHECK-NEXT: %g_b = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f32>
    %g_b = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f32>
    // CHECK-NEXT: %s_b = tile.scores(%k_blk) x(%q_b) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    %s_b = tile.scores(%k_blk) x(%q_b) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %s_b1 = tile.mask %s_b {band = #attn.band<>} : !tile.tile<m x n x f32>
    %s_b1 = tile.mask %s_b {band = #attn.band<>} : !tile.tile<m x n x f32>
    // CHECK-NEXT: %p_b = tile.relu_probs %s_b1 : !tile.tile<m x n x f32>
    %p_b = tile.relu_probs %s_b1 : !tile.tile<m x n x f32>
    // CHECK-NEXT: %dp_b = tile.dot_transposed %v_blk, %g_b : !tile.tile<m x dv x f32>, !tile.tile<n x dv x f32> -> !tile.tile<m x n x f32>
    %dp_b = tile.dot_transposed %v_blk, %g_b : !tile.tile<m x dv x f32>, !tile.tile<n x dv x f32> -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %ds_b = tile.relu_grad %s_b1, %dp_b : !tile.tile<m x n x f32>
    %ds_b = tile.relu_grad %s_b1, %dp_b : !tile.tile<m x n x f32>
    // CHECK-NEXT: %dv_b1 = tile.accumulate %dv_b, %p_b, %g_b : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    %dv_b1 = tile.accumulate %dv_b, %p_b, %g_b : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    // CHECK-NEXT: %dk_b1 = tile.accumulate %dk_b, %ds_b, %q_b : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f32>
    %dk_b1 = tile.accumulate %dk_b, %ds_b, %q_b : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f32>
    // CHECK-NEXT: tile.yield %dk_b1, %dv_b1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
    tile.yield %dk_b1, %dv_b1 : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
  // CHECK-NEXT: }
  }
  // CHECK-NEXT: %dk_scaled = tile.apply_scale %dk_part : !tile.tile<m x d x f32>
  %dk_scaled = tile.apply_scale %dk_part : !tile.tile<m x d x f32>
  // CHECK-NEXT: tile.store %dk_scaled, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  tile.store %dk_scaled, %dk[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dk>
  // CHECK-NEXT: tile.store %dv_part, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  tile.store %dv_part, %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
  // CHECK-NEXT: tile.return
  tile.return
// CHECK-NEXT: }
}

// dQ with a bias gradient over query blocks: lse and delta along <m>, dS stored into dbias
// inside the key loop; the accumulator split into even/odd dims for the inverse rotation.
// CHECK-LABEL: tile.kernel @bwd_dq_bias(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 32 : i64, head_dim_v = 64 : i64, rotary_dim = 32 : i64} {
tile.kernel @bwd_dq_bias(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 32 : i64, head_dim_v = 64 : i64, rotary_dim = 32 : i64} {
  // CHECK-NEXT: %q_blk = tile.load %q_rot[program, all] : !tile.tensor<q_rot> -> !tile.tile<m x d x f16>
  %q_blk = tile.load %q_rot[program, all] : !tile.tensor<q_rot> -> !tile.tile<m x d x f16>
  // CHECK-NEXT: %g_blk = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
  %g_blk = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
  // CHECK-NEXT: %lse_blk = tile.load %lse[program] : !tile.tensor<lse> -> !tile.tile<m x f32>
  %lse_blk = tile.load %lse[program] : !tile.tensor<lse> -> !tile.tile<m x f32>
  // CHECK-NEXT: %delta_blk = tile.load %delta[program] : !tile.tensor<delta> -> !tile.tile<m x f32>
  %delta_blk = tile.load %delta[program] : !tile.tensor<delta> -> !tile.tile<m x f32>
  // CHECK-NEXT: %dq_init = tile.zeros : !tile.tile<m x d x f32>
  %dq_init = tile.zeros : !tile.tile<m x d x f32>
  // CHECK-NEXT: %kv_start, %kv_fs, %kv_fe, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
  %kv_start, %kv_fs, %kv_fe, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
  // CHECK-NEXT: %dq_acc = tile.kv_loop %kv_fe to %kv_end masked iter_args(%dq_init) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  %dq_acc = tile.kv_loop %kv_fe to %kv_end masked iter_args(%dq_init) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  // CHECK-NEXT: ^bb0(%dq_c: !tile.tile<m x d x f32>):
  ^bb0(%dq_c: !tile.tile<m x d x f32>):
    // CHECK-NEXT: %k_c = tile.load %k_rot[loop, all] : !tile.tensor<k_rot> -> !tile.tile<n x d x f16>
    %k_c = tile.load %k_rot[loop, all] : !tile.tensor<k_rot> -> !tile.tile<n x d x f16>
    // CHECK-NEXT: %v_c = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %v_c = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    // CHECK-NEXT: %s_c = tile.scores(%q_blk) x(%k_c) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s_c = tile.scores(%q_blk) x(%k_c) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %s_c1 = tile.add_bias %s_c, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    %s_c1 = tile.add_bias %s_c, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    // CHECK-NEXT: %s_c2 = tile.mask %s_c1 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    %s_c2 = tile.mask %s_c1 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    // CHECK-NEXT: %p_c = tile.recompute_probs %s_c2, %lse_blk : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    %p_c = tile.recompute_probs %s_c2, %lse_blk : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    // CHECK-NEXT: %dp_c = tile.dot_transposed %g_blk, %v_c : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    %dp_c = tile.dot_transposed %g_blk, %v_c : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %ds_c = tile.softmax_grad %p_c, %dp_c, %delta_blk : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    %ds_c = tile.softmax_grad %p_c, %dp_c, %delta_blk : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    // CHECK-NEXT: tile.store_scores %ds_c, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
    tile.store_scores %ds_c, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
    // CHECK-NEXT: %dq_c1 = tile.accumulate %dq_c, %ds_c, %k_c : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    %dq_c1 = tile.accumulate %dq_c, %ds_c, %k_c : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
    // CHECK-NEXT: tile.yield %dq_c1 : !tile.tile<m x d x f32>
    tile.yield %dq_c1 : !tile.tile<m x d x f32>
  // CHECK-NEXT: }
  }
  // CHECK-NEXT: %dq_scaled = tile.apply_scale %dq_acc : !tile.tile<m x d x f32>
  %dq_scaled = tile.apply_scale %dq_acc : !tile.tile<m x d x f32>
  // CHECK-NEXT: %dq_even, %dq_odd = tile.split %dq_scaled {pairs = #tile<pairs interleaved>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  %dq_even, %dq_odd = tile.split %dq_scaled {pairs = #tile<pairs interleaved>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
  // CHECK-NEXT: %dq_even_1, %dq_odd_1 = tile.rotate %dq_even, %dq_odd, %rope_table {positions = #tile<seq query>, inverse} : !tile.tile<m x half x f32>, !tile.tensor<rope_table>
  %dq_even_1, %dq_odd_1 = tile.rotate %dq_even, %dq_odd, %rope_table {positions = #tile<seq query>, inverse} : !tile.tile<m x half x f32>, !tile.tensor<rope_table>
  // CHECK-NEXT: tile.store %dq_even_1, %dq[program, even] : !tile.tile<m x half x f32> -> !tile.tensor<dq>
  tile.store %dq_even_1, %dq[program, even] : !tile.tile<m x half x f32> -> !tile.tensor<dq>
  // CHECK-NEXT: tile.store %dq_odd_1, %dq[program, odd] : !tile.tile<m x half x f32> -> !tile.tensor<dq>
  tile.store %dq_odd_1, %dq[program, odd] : !tile.tile<m x half x f32> -> !tile.tensor<dq>
  // CHECK-NEXT: tile.return
  tile.return
// CHECK-NEXT: }
}
