// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s
// Verifier errors of the fused backward's ops (tile.dot_lhs_transposed, tile.store_add).

// The left operand is a score-shaped f32 tile.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.zeros : !tile.tile<m x n x f16>
    %p = tile.dot_lhs_transposed %g, %kb : !tile.tile<m x n x f16>, !tile.tile<m x d x f16> -> !tile.tile<n x d x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}left operand must be f32, got f16

// -----

// The right operand's rows are the program's.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.zeros : !tile.tile<m x n x f32>
    %kn = tile.zeros : !tile.tile<n x d x f16>
    %p = tile.dot_lhs_transposed %g, %kn : !tile.tile<m x n x f32>, !tile.tile<n x d x f16> -> !tile.tile<n x d x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}right operand must be <m x _>, got n x d

// -----

// The right operand has the kernel's element type (or f32).
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.zeros : !tile.tile<m x n x f32>
    %kb16 = tile.zeros : !tile.tile<m x d x bf16>
    %p = tile.dot_lhs_transposed %g, %kb16 : !tile.tile<m x n x f32>, !tile.tile<m x d x bf16> -> !tile.tile<n x d x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}right operand must have the kernel's element type f16 (or be widened to f32), got bf16

// -----

// The product is n x (the right operand's columns), f32.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %g = tile.zeros : !tile.tile<m x n x f32>
    %p = tile.dot_lhs_transposed %g, %kb : !tile.tile<m x n x f32>, !tile.tile<m x d x f16> -> !tile.tile<n x half x f32>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}product must be a n x d tile, got n x half

// -----

// store_add adds into dq_acc only.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq[loop, all] : !tile.tile<n x d x f32> -> !tile.tensor<dq>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.store_add adds into the dq_acc tensor, not !tile.tensor<dq>

// -----

// The added tile has the block's shape.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<m x d x f32>
    tile.store_add %p, %dq_acc[loop, all] : !tile.tile<m x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}added tile must be a n x d tile, got m x d

// -----

// The added tile is f32.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f16>
    tile.store_add %p, %dq_acc[loop, all] : !tile.tile<n x d x f16> -> !tile.tensor<dq_acc>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}an added tile must have element type f32, got f16

// -----

// dq_acc rows are query rows: the program rows of a key_blocks kernel are keys.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<m x d x f32>
    tile.store_add %p, %dq_acc[program, all] : !tile.tile<m x d x f32> -> !tile.tensor<dq_acc>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}dq_acc rows are query rows, but the program rows of a key_blocks kernel are key rows


// -----

// Adds in key-block order are ordered by the dq_order tensor's counters.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %kb = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x f16>
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %lse : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<lse>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.store_add orders its adds by the dq_order tensor, not !tile.tensor<lse>

// -----

// Only a key_blocks kernel's loop rows can be added in key-block order.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %p = tile.zeros : !tile.tile<m x d x f32>
  tile.store_add %p, %dq_acc[program, all] in_order %dq_order : !tile.tile<m x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
  tile.return
}
// CHECK: {{^}}tile.store_add in key-block order adds the loop's query rows of a key_blocks kernel

// -----

// A block list's loop sends a query block key blocks that need not be consecutive: adds in
// key-block order there take their turns from the loop's ranks, which this loop lacks.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>, %full_q_blocks: !tile.tensor<full_q_blocks>, %full_q_count: !tile.tensor<full_q_count>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %full_q_blocks, %full_q_count iter_args(%a) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.store_add in key-block order in a tile.sparse_q_loop needs the loop's ranks (the key blocks a block list sends to a query block need not be consecutive)

// -----

// A list's ranks are its own: the full list's loop cannot read the partial list's.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>, %full_q_blocks: !tile.tensor<full_q_blocks>, %full_q_count: !tile.tensor<full_q_count>, %partial_q_rank: !tile.tensor<partial_q_rank>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %r = tile.sparse_q_loop %full_q_blocks, %full_q_count ranks %partial_q_rank : !tile.tensor<partial_q_rank> iter_args(%a) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}the ranks of full_q_blocks are full_q_rank, not !tile.tensor<partial_q_rank>

// -----

// A program waits for the key block before its own: the blocks must start in ascending order.
tile.kernel @k(%k: !tile.tensor<k>, %dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>) attributes {grid = #tile<grid key_blocks>, block_order = #tile<order descending>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a = tile.zeros : !tile.tile<m x d x f32>
  %s0, %s1, %s2, %s3 = tile.q_bounds {band = #attn.band<upper = 0>}
  %r = tile.q_loop %s0 to %s1 iter_args(%a) : !tile.tile<m x d x f32> -> !tile.tile<m x d x f32> {
  ^bb0(%a0: !tile.tile<m x d x f32>):
    %p = tile.zeros : !tile.tile<n x d x f32>
    tile.store_add %p, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>
    tile.yield %a0 : !tile.tile<m x d x f32>
  }
  tile.return
}
// CHECK: {{^}}tile.store_add in key-block order needs the kernel's blocks in ascending order (a program waits for the key block before its own)
