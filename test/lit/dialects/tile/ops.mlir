// RUN: attnfuse-opt %s | filecheck %s
// RUN: %roundtrip | filecheck %s
// Every tile op and type prints in its custom form and survives a generic round trip.

// CHECK-LABEL: tile.kernel @rotate_key(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, rotary_dim = 32 : i64} {
tile.kernel @rotate_key(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, rotary_dim = 32 : i64} {
  // CHECK-NEXT: %k_even = tile.load %k[program, even] : !tile.tensor<k> -> !tile.tile<m x half x bf16>
  %k_even = tile.load %k[program, even] : !tile.tensor<k> -> !tile.tile<m x half x bf16>
  // CHECK-NEXT: %k_odd = tile.load %k[program, odd] : !tile.tensor<k> -> !tile.tile<m x half x bf16>
  %k_odd = tile.load %k[program, odd] : !tile.tensor<k> -> !tile.tile<m x half x bf16>
  // CHECK-NEXT: %a, %b = tile.rotate %k_even, %k_odd, %rope_table {positions = #tile<seq key>, inverse} : !tile.tile<m x half x bf16>, !tile.tensor<rope_table>
  %a, %b = tile.rotate %k_even, %k_odd, %rope_table {positions = #tile<seq key>, inverse} : !tile.tile<m x half x bf16>, !tile.tensor<rope_table>
  // CHECK-NEXT: tile.store %a, %k_rot[program, even] : !tile.tile<m x half x bf16> -> !tile.tensor<k_rot>
  tile.store %a, %k_rot[program, even] : !tile.tile<m x half x bf16> -> !tile.tensor<k_rot>
  // CHECK-NEXT: %k_pass = tile.load %k[program, pass] : !tile.tensor<k> -> !tile.tile<m x pass x bf16>
  %k_pass = tile.load %k[program, pass] : !tile.tensor<k> -> !tile.tile<m x pass x bf16>
  // CHECK-NEXT: tile.return
  tile.return
}

// CHECK-LABEL: tile.kernel @attention_fwd
tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64} {
  // CHECK-NEXT: %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  // CHECK-NEXT: %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  // CHECK-NEXT: %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<lower = -255, upper = 0>}
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<lower = -255, upper = 0>}
  // CHECK-NEXT: %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %s to %fs masked iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  %acc_1, %row_max_1, %row_sum_1 = tile.kv_loop %s to %fs masked iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    // CHECK: %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    // CHECK-NEXT: %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %scores = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    // CHECK-NEXT: %kept = tile.mask %scores {band = #attn.band<lower = -255, upper = 0>} : !tile.tile<m x n x f32>
    %kept = tile.mask %scores {band = #attn.band<lower = -255, upper = 0>} : !tile.tile<m x n x f32>
    // CHECK-NEXT: %p, %m1, %l1, %alpha = tile.softmax_update %kept, %m0, %l0 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    %p, %m1, %l1, %alpha = tile.softmax_update %kept, %m0, %l0 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    // CHECK: %a1 = tile.accumulate %a0, %p, %v_1 rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
    %a1 = tile.accumulate %a0, %p, %v_1 rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
    // CHECK-NEXT: %a2 = tile.accumulate %a1, %p, %v_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    %a2 = tile.accumulate %a1, %p, %v_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
    // CHECK-NEXT: tile.yield %a2, %m1, %l1 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
    tile.yield %a2, %m1, %l1 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  // CHECK: %out, %lse_1 = tile.softmax_finalize %acc_1, %row_max_1, %row_sum_1 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  %out, %lse_1 = tile.softmax_finalize %acc_1, %row_max_1, %row_sum_1 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  // CHECK-NEXT: tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  // CHECK-NEXT: tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
  tile.store %lse_1, %lse[program] : !tile.tile<m x f32> -> !tile.tensor<lse>
  tile.return
}

// CHECK-LABEL: tile.kernel @sparse_relu
tile.kernel @sparse_relu(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>) attributes {grid = #tile<grid query_blocks>, element_type = f32, block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64} {
  %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f32>
  // CHECK: %acc = tile.zeros : !tile.tile<m x dv x f32>
  %acc = tile.zeros : !tile.tile<m x dv x f32>
  // CHECK-NEXT: %acc_1 = tile.sparse_kv_loop %fb, %fc iter_args(%acc) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  %acc_1 = tile.sparse_kv_loop %fb, %fc iter_args(%acc) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f32>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    // CHECK: %s1 = tile.alibi %s, %slopes : !tile.tile<m x n x f32>, !tile.tensor<slopes>
    %s1 = tile.alibi %s, %slopes : !tile.tile<m x n x f32>, !tile.tensor<slopes>
    // CHECK-NEXT: %s2 = tile.add_bias %s1, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    %s2 = tile.add_bias %s1, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    // CHECK-NEXT: %p = tile.relu_probs %s2 : !tile.tile<m x n x f32>
    %p = tile.relu_probs %s2 : !tile.tile<m x n x f32>
    %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f32>
    %a1 = tile.accumulate %a0, %p, %v_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    tile.yield %a1 : !tile.tile<m x dv x f32>
  }
  tile.store %acc_1, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.return
}

// CHECK-LABEL: tile.kernel @join
tile.kernel @join(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.load %q[program, even] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %b = tile.load %q[program, odd] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  // CHECK: %j = tile.join %a, %b {pairs = #tile<pairs interleaved>} : !tile.tile<m x half x f16> -> !tile.tile<m x d x f16>
  %j = tile.join %a, %b {pairs = #tile<pairs interleaved>} : !tile.tile<m x half x f16> -> !tile.tile<m x d x f16>
  tile.return
}

// CHECK-LABEL: tile.kernel @documents
tile.kernel @documents(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %doc_ids: !tile.tensor<doc_ids>, %pb: !tile.tensor<partial_blocks>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f32, block_m = 32 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64, head_dim = 16 : i64, head_dim_v = 16 : i64} {
  %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f32>
  %acc = tile.zeros : !tile.tile<m x dv x f32>
  %acc_1 = tile.sparse_kv_loop %pb, %pc masked iter_args(%acc) : !tile.tensor<partial_blocks>, !tile.tensor<partial_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f32>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f32>) x(!tile.tile<n x d x f32>) -> !tile.tile<m x n x f32>
    %sm = tile.mask %s {band = #attn.band<>} : !tile.tile<m x n x f32>
    // CHECK: %s1 = tile.document_mask %sm, %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
    %s1 = tile.document_mask %sm, %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
    %p = tile.relu_probs %s1 : !tile.tile<m x n x f32>
    %v_1 = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f32>
    %a1 = tile.accumulate %a0, %p, %v_1 : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f32>
    tile.yield %a1 : !tile.tile<m x dv x f32>
  }
  tile.store %acc_1, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.return
}

// A head-major grid (`head_major = 1`) round-trips beside the block order.
// CHECK-LABEL: tile.kernel @head_major_fwd(%q: !tile.tensor<q>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>, head_major = 1 : i64} {
tile.kernel @head_major_fwd(%q: !tile.tensor<q>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>, head_major = 1 : i64} {
  // CHECK-NEXT: %x = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
  %x = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
  // CHECK-NEXT: tile.store %x, %o[program, all] : !tile.tile<m x dv x f16> -> !tile.tensor<o>
  tile.store %x, %o[program, all] : !tile.tile<m x dv x f16> -> !tile.tensor<o>
  // CHECK-NEXT: tile.return
  tile.return
}
