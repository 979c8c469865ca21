// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s
// The verifier of tile.map: its body is scalar f32 arithmetic the targets can print.

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
