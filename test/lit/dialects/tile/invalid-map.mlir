// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s
// The verifiers of tile.map (its body is scalar f32 arithmetic the targets can print),
// and what the tile passes set: unscaled scores, block_order, shared_offsets.

// A map body holds only the scalar ops the targets translate.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %y = math.sin %x : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: tile.map bodies hold only

// -----

// A body reads only its arguments and its own values.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %c = arith.constant 2.0 : f32
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %y = arith.mulf %x, %c : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: reads a value defined outside it

// -----

// Comparisons are ordered (false on NaN): `one` is not.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %b = arith.cmpf one, %x, %x : f32
    %y = arith.select %b, %x, %x : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: tile.map comparisons are oeq, olt, ole, ogt, oge, got one

// -----

// Constants are f32 floats.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %t = arith.constant true
    %y = arith.select %t, %x, %x : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: tile.map constants are f32 floats

// -----

// A finite constant beyond f32's range is inf once parsed (xDSL rounds it to the type): +inf
// in a score can only give NaN rows, so it is refused, as is NaN.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %c = arith.constant 5.0e+49 : f32
    %y = arith.mulf %x, %c : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: tile.map constant inf: a map body's constants are f32, finite or -inf (a dropped entry)

// -----

tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    %c = arith.constant 0x7FC00000 : f32
    %y = arith.addf %x, %c : f32
    tile.map_yield %y : f32
  }
  tile.return
}
// CHECK: tile.map constant nan: a map body's constants are f32

// -----

// The result is f32.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f16> {
  ^bb0(%x: f32):
    tile.map_yield %x : f32
  }
  tile.return
}
// CHECK: tile.map computes in f32, got a f16 result

// -----

// Tile operands have the result's shape.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %r1 = tile.zeros : !tile.tile<m x n x f32>
  %r = tile.map(%r1) : (!tile.tile<m x n x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32):
    tile.map_yield %x : f32
  }
  tile.return
}
// CHECK: map operand 0 is a m x n tile, the result m x dv: operands must have the result's shape

// -----

// One f32 body argument per operand.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %z = tile.zeros : !tile.tile<m x dv x f32>
  %r = tile.map(%z) : (!tile.tile<m x dv x f32>) -> !tile.tile<m x dv x f32> {
  ^bb0(%x: f32, %y: f32):
    tile.map_yield %x : f32
  }
  tile.return
}
// CHECK: tile.map's body takes one f32 argument per operand

// -----

// block_order is a #tile<order ...>.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = "descending"} {

  tile.return
}
// CHECK: block_order must be a #tile<order ...>

// -----

// shared_offsets names two of the kernel's roles.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, shared_offsets = ["do", "q"]} {

  tile.return
}
// CHECK: shared_offsets names two of the kernel's tensor roles (follower, leader)

// -----

// Unscaled scores (fold-scale-into-exp) may reach only exponentials that apply the scale.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %q_blk = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %acc = tile.zeros : !tile.tile<m x dv x f32>
  %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<>}
  %a2 = tile.kv_loop %start to %end masked iter_args(%acc) : !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a: !tile.tile<m x dv x f32>):
    %k_blk = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %scores = tile.scores(%q_blk) x(%k_blk) {unscaled} : (!tile.tile<m x d x f16>) x (!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %p = tile.relu_probs %scores : !tile.tile<m x n x f32>
    tile.yield %a : !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: unscaled scores must reach only exponentials that apply their scale (unscaled_scores, the same scale), but tile.relu_probs reads them

// -----

// A block of a [B, H, N, D] operand names its columns.
tile.kernel @k(%q: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %q_rows = tile.load %q[program] : !tile.tensor<q> -> !tile.tile<m x f16>
  tile.return
}
// CHECK: a q block needs columns: one of all, half_lo, half_hi, even, odd, pass

// -----

// An entry's positions and head describe a key block: they belong in a key loop.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %q_pos = tile.pair_position {axis = #tile<seq query>} : !tile.tile<m x n x f32>
  tile.return
}
// CHECK: tile.pair_position works on a key block: it belongs in a key loop

// -----

// They are shaped as the block's scores.
tile.kernel @k(%o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %head = tile.query_head : !tile.tile<m x f32>
  tile.return
}
// CHECK: query_head result

// -----

// Their entries are f32 (positions and heads as map operands).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<>}
  %a2, %m2, %s2 = tile.kv_loop %start to %end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a: !tile.tile<m x dv x f32>, %rm: !tile.tile<m x f32>, %rs: !tile.tile<m x f32>):
    %p = tile.pair_position {axis = #tile<seq key>} : !tile.tile<m x n x f16>
    tile.yield %a, %rm, %rs : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: tile.pair_position gives an f32 tile
