// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s
// Verifier errors of the ops for ALiBi, bias, ReLU and block-sparse loops.

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %fb, %pc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<partial_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):

    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: sparse_kv_loop reads a block list and its count: full_blocks and full_count, or partial_blocks and partial_count

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %fb, %fc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s1 = tile.alibi %s, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: the ALiBi operand must be the slopes tensor

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %fb, %fc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s1 = tile.add_bias %s, %slopes : !tile.tile<m x n x f32>, !tile.tensor<slopes>
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: the bias operand must be the bias tensor

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.zeros : !tile.tile<m x n x f32>
  %s1 = tile.alibi %x, %slopes : !tile.tile<m x n x f32>, !tile.tensor<slopes>
  tile.return
}
// CHECK: tile.alibi works on a key block: it belongs in a key loop

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %p = tile.relu_probs %x : !tile.tile<m x d x f16>
  tile.return
}
// CHECK: scores must be a m x n tile, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %slopes[program] : !tile.tensor<slopes> -> !tile.tile<m x f32>
  tile.return
}
// CHECK: a slopes tensor is not accessed by blocks

// -----

tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, rotary_dim = 32 : i64} {
  %a = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %j = tile.join %a, %a {pairs = #tile<pairs half>} : !tile.tile<m x half x f16> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: tile.join needs rotary_dim == head_dim, a power of two >= 32; got rotary_dim 32, head_dim 64

// -----

tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %j = tile.join %a, %a {pairs = "zigzag"} : !tile.tile<m x half x f16> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: "zigzag" should be of base attribute tile.pairs

// -----

tile.kernel @k(%q: !tile.tensor<q>, %rope_table: !tile.tensor<rope_table>, %k_positions: !tile.tensor<k_positions>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %r1, %r2 = tile.rotate %a, %a, %rope_table at %k_positions {positions = #tile<seq query>} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>, !tile.tensor<k_positions>
  tile.return
}
// CHECK: query rows are rotated at q_positions, got !tile.tensor<k_positions>

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %doc_ids: !tile.tensor<doc_ids>, %fb: !tile.tensor<full_blocks>, %fc: !tile.tensor<full_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %fb, %fc iter_args(%a) : !tile.tensor<full_blocks>, !tile.tensor<full_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s1 = tile.document_mask %s, %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: tile.document_mask belongs in a masked loop

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %bias: !tile.tensor<bias>, %pb: !tile.tensor<partial_blocks>, %pc: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.sparse_kv_loop %pb, %pc masked iter_args(%a) : !tile.tensor<partial_blocks>, !tile.tensor<partial_count>, !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>):
    %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %k_1 = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%q_1) x(%k_1) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s1 = tile.document_mask %s, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
    tile.yield %a0 : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: the document mask's operand must be the doc_ids tensor
