// RUN: not attnfuse-opt --allow-unregistered-dialect %s 2>&1 | filecheck %s
// An op of an unregistered dialect has none of the tile dialect's traits (xDSL would say it has every
// trait): unscaled scores it reads are refused with a diagnostic, never an internal error.

// CHECK-NOT: internal compiler error
// CHECK:     unregistered-user.mlir:[[# @LINE + 8]]:5: error: unscaled scores must reach only exponentials that apply their scale
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %o: !tile.tensor<o>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %q_blk = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %acc = tile.zeros : !tile.tile<m x dv x f32>
  %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<>}
  %a2 = tile.kv_loop %start to %end masked iter_args(%acc) : !tile.tile<m x dv x f32> -> !tile.tile<m x dv x f32> {
  ^bb0(%a: !tile.tile<m x dv x f32>):
    %k_blk = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %scores = tile.scores(%q_blk) x(%k_blk) {unscaled} : (!tile.tile<m x d x f16>) x (!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %p = "foo.use"(%scores) : (!tile.tile<m x n x f32>) -> !tile.tile<m x n x f32>
    tile.yield %a : !tile.tile<m x dv x f32>
  }
  tile.return
}
