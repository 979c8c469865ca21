// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics --parsing-diagnostics | filecheck %s
// The verifier's rules for #tile<schedule warp_specialized> kernels.

// CHECK: 'consumer_registers' belongs to a warp-specialized query_blocks kernel, not a key_blocks one
tile.kernel @attention_bwd_dkdv_dq(%k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64} {
  tile.return
}

// -----

// CHECK: a warp-specialized key_blocks kernel's consumer is one or two warpgroups of 64 keys: num_warps 4 or 8 and block_m = 16 * num_warps, got 8 and 64
tile.kernel @attention_bwd_dkdv_dq(%k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64} {
  tile.return
}

// -----

// CHECK: a warp-specialized kernel owns query blocks (grid query_blocks) or, the fused backward's, key blocks (grid key_blocks)
tile.kernel @attention_fwd_split(%q: !tile.tensor<q>) attributes {grid = #tile<grid kv_splits>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64} {
  tile.return
}

// -----

// CHECK: a warp-specialized kernel's consumers are whole warpgroups of 16 rows per warp: num_warps a multiple of 4 and block_m = 16 * num_warps, got 8 and 64
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64} {
  tile.return
}

// -----

// CHECK: a warp-specialized kernel needs an integer 'consumer_registers' in [24, 255]
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64} {
  tile.return
}

// -----

// CHECK: a warp-specialized kernel's buffers need 256 KB of shared memory (the query tile 64 KB, 2 stages of k and v 128 KB, the output buffer 64 KB), more than Hopper's 227 KB: fewer keys per step (block_n), stages or consumers, or no persistent grid
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = bf16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 256 : i64, head_dim_v = 256 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64, persistent = 1 : i64} {
  tile.return
}

// -----

// CHECK: 'producer_warps' belongs to a #tile<schedule ...> kernel
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, producer_warps = 1 : i64} {
  tile.return
}

// -----

// CHECK: 'persistent' belongs to a #tile<schedule ...> kernel
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, persistent = 1 : i64} {
  tile.return
}

// -----

// CHECK: 'persistent' is an integer 0 or 1 (one program per SM walking the tiles)
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64, persistent = 2 : i64} {
  tile.return
}

// -----

// CHECK: 'dq_writers' is an integer 1 or 2 (one writer warp per dQ staging buffer at most)
tile.kernel @attention_bwd_dkdv_dq(%k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 3 : i64} {
  tile.return
}

// -----

// CHECK: 'dq_writers' belongs to a warp-specialized key_blocks kernel (the fused backward)
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64, dq_writers = 2 : i64} {
  tile.return
}

// -----

// CHECK: 'dq_writers' belongs to a #tile<schedule ...> kernel
tile.kernel @attention_bwd_dkdv_dq(%k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, dq_writers = 2 : i64} {
  tile.return
}

// -----

// A consumer thread holds its share of the accumulator (64 x 128 fp32 over 128 threads: 64
// registers), the scores (64) and the probabilities (32): 160, more than 100.
// CHECK: a warp-specialized kernel's consumer threads need at least 160 registers (the output accumulator 64, the scores 64, the probabilities 32), more than their consumer_registers = 100
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 128 : i64, head_dim_v = 128 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 100 : i64} {
  tile.return
}

// -----

// CHECK: head_major is an attribute of a query_blocks kernel, not of a key_blocks one
tile.kernel @attention_bwd_dkdv(%k: !tile.tensor<k>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, head_major = 1 : i64} {
  tile.return
}

// -----

// CHECK: head_major must be 0 or 1, got 2
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, head_major = 2 : i64} {
  tile.return
}

// -----

// CHECK: head_major is the portable grid's: a #tile<schedule ...> kernel walks its own
tile.kernel @attention_fwd(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64, head_major = 1 : i64} {
  tile.return
}
