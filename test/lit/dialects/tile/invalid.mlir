// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics --verify-diagnostics | filecheck %s
// Each tile verifier error (and tile type parse error), one per split.

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x q x f16>
  tile.return
}
// CHECK: unknown tile dimension 'q'

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x n x f16>
  tile.return
}
// CHECK: a tile has one or two dimensions, got 3

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f64>
  tile.return
}
// CHECK: tile element type must be one of f16, bf16, f32, got 'f64'

// -----

tile.kernel @k(%q: !tile.tensor<query>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: unknown tensor role 'query'

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = "diagonal", element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: kernel grid must be one of query_blocks, key_blocks

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: kernel needs an integer attribute 'num_stages'

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 48 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: block_m must be a power of two >= 16, got 48

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 3 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: num_warps must be 1, 2, 4, 8 or 16, got 3

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 0 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: num_stages must be >= 1, got 0

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 512 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: head_dim must be in [1, 256], got 512

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, rotary_dim = 80 : i64} {

  tile.return
}
// CHECK: rotary_dim must be even and in (0, head_dim=64], got 80

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = i32, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: unsupported tile element type i32

// -----

tile.kernel @k(%q: !tile.tensor<q>, %q2: !tile.tensor<q>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: each tensor role may be bound to one kernel parameter only

// -----

tile.kernel @k(%q: !tile.tensor<q>, %x: index) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {

  tile.return
}
// CHECK: kernel parameters must all be !tile.tensor

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
  tile.return
}
// CHECK: loaded tile must be a m x d tile, got n x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: loaded tile must be a m x dv tile, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: loaded tile must be a m x half tile, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x bf16>
  tile.return
}
// CHECK: a loaded q tile must have element type f16 (or be widened to f32), got bf16

// -----

// Only q and k may be widened (for exact score products).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f32>
  tile.return
}
// CHECK: a loaded o tile must have element type f16, got f32

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[loop, all] : !tile.tensor<q> -> !tile.tile<n x d x f16>
  tile.return
}
// CHECK: loop rows can only be accessed inside a tile.kv_loop

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[diagonal, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: rows must be one of program, loop, got 'diagonal'

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, middle] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  tile.return
}
// CHECK: columns must be one of all, half_lo, half_hi, even, odd, pass, got 'middle'

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %lse[program, all] : !tile.tensor<lse> -> !tile.tile<m x f32>
  tile.return
}
// CHECK: a lse tensor has no columns to select

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %rope_table[program] : !tile.tensor<rope_table> -> !tile.tile<m x f32>
  tile.return
}
// CHECK: a rope_table tensor is not accessed by blocks

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  tile.store %x, %o[program, all] : !tile.tile<m x d x f16> -> !tile.tensor<o>
  tile.return
}
// CHECK: stored tile must be a m x dv tile, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %a, %b = tile.rotate %x, %x, %rope_table {positions = #tile<seq query>} : !tile.tile<m x d x f16>, !tile.tensor<rope_table>
  tile.return
}
// CHECK: rotated tiles must be <rows x half>, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %a, %b = tile.rotate %x, %x, %rope_table {positions = "value"} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>
  tile.return
}
// CHECK: "value" should be of base attribute tile.seq

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %x = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %a, %b = tile.rotate %x, %x, %q {positions = #tile<seq query>} : !tile.tile<m x half x f16>, !tile.tensor<q>
  tile.return
}
// CHECK: the table operand must be the rope_table tensor

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r:3 = tile.kv_loop %s to %e masked iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %y = tile.load %k[loop, half_lo] : !tile.tensor<k> -> !tile.tile<n x half x f16>
    %s1 = tile.scores(%x) x(%y) : (!tile.tile<m x d x f16>) x(!tile.tile<n x half x f16>) -> !tile.tile<m x n x f32>
    tile.yield %a0, %m0, %l0 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: query part 0 and key part 0 contract different dims: d vs half

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r:3 = tile.kv_loop %s to %e masked iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %s1 = tile.scores(%x) x(%x) : (!tile.tile<m x d x f16>) x(!tile.tile<m x d x f16>) -> !tile.tile<m x n x f32>
    tile.yield %a0, %m0, %l0 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: key part 0 must be <n x _>, got m x d

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r:3 = tile.kv_loop %s to %e masked iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %y = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s1 = tile.scores(%x, %x) x(%y) : (!tile.tile<m x d x f16>, !tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    tile.yield %a0, %m0, %l0 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: scores needs as many query parts as key parts (at least one), got 2 and 1

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r:3 = tile.kv_loop %s to %e iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    %x = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
    %y = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s1 = tile.scores(%x) x(%y) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %s2 = tile.mask %s1 {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
    tile.yield %a0, %m0, %l0 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: tile.mask belongs in a masked tile.kv_loop

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  %r:3 = tile.kv_loop %s to %e masked iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    tile.yield %a0, %m0, %a0 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x dv x f32>
  }
  tile.return
}
// CHECK: tile.yield must yield the types of the loop's iter_args

// -----

// A masked loop's blocks may be partial: scores it computes must go through tile.mask, which
// drops the entries past the sequence end (without it they would enter the softmax as keys).
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %qb = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<>}
  %r:3 = tile.kv_loop %s to %e masked iter_args(%a, %mx, %sm) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a0: !tile.tile<m x dv x f32>, %m0: !tile.tile<m x f32>, %l0: !tile.tile<m x f32>):
    %kb = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %sc = tile.scores(%qb) x(%kb) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %p, %m1, %l1, %al = tile.softmax_update %sc, %m0, %l0 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    tile.yield %a0, %m1, %l1 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: tile.kv_loop is masked (its blocks may be partial) and computes scores: they must go through tile.mask

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %s, %fs, %fe, %e = tile.kv_bounds {band = #attn.band<upper = 0>}
  tile.return
}
// CHECK: tile.kv_bounds needs a kernel whose programs own query blocks

// -----

tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %a, %mx, %sm = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %o1, %l1 = tile.softmax_finalize %a, %mx, %sm : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  %o2, %l2 = tile.softmax_finalize %o1, %o1, %o1 : !tile.tile<m x dv x f32>, !tile.tile<m x dv x f32>
  tile.return
}
// CHECK: row max must be a m tile, got m x dv

// -----

// A non-integer rotary_dim (read as absent, it rotated the whole head dim).
tile.kernel @k(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>) attributes {grid = #tile<grid key_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, rotary_dim = 3.200000e+01 : f64} {
  %k_pass = tile.load %k[program, pass] : !tile.tensor<k> -> !tile.tile<m x pass x bf16>
  tile.return
}
// CHECK: kernel attribute 'rotary_dim' must be an integer

// -----

// No grid: reported at the kernel (the ops inside skip a kernel whose header cannot be read).
tile.kernel @k(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>) attributes {element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %k_pass = tile.load %k[program, all] : !tile.tensor<k> -> !tile.tile<m x d x bf16>
  tile.return
}
// CHECK: kernel grid must be one of

// -----

// pass columns in a kernel whose rotary width is its head dim.
tile.kernel @k(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>) attributes {grid = #tile<grid key_blocks>, element_type = bf16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %k_pass = tile.load %k[program, pass] : !tile.tensor<k> -> !tile.tile<m x pass x bf16>
  tile.return
}
// CHECK: pass columns are the dims after the rotary width: the kernel needs a rotary_dim below its head_dim (64)

// -----

// An exponential told its scores are unscaled, over scores tile.scores already scaled.
tile.kernel @k(%q: !tile.tensor<q>, %k: !tile.tensor<k>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64} {
  %q_blk = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %acc, %m0, %l0 = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<>}
  %m2, %l2 = tile.kv_loop %start to %end masked iter_args(%m0, %l0) : !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%m: !tile.tile<m x f32>, %l: !tile.tile<m x f32>):
    %k_blk = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
    %s = tile.scores(%q_blk) x(%k_blk) : (!tile.tile<m x d x f16>) x (!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
    %kept = tile.mask %s {band = #attn.band<>} : !tile.tile<m x n x f32>
    %p, %mn, %ln, %alpha = tile.softmax_update %kept, %m, %l {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<m x f32>
    tile.yield %mn, %ln : !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  tile.return
}
// CHECK: tile.softmax_update is marked unscaled_scores, so its scores must come (through tile.mask or tile.document_mask only) from a tile.scores marked unscaled with the same scale

// -----

// A rotation over the whole head (no rotary_dim) at an odd head dim: the last dim is in no pair.
tile.kernel @k(%q: !tile.tensor<q>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 16 : i64, block_n = 16 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 3 : i64, head_dim_v = 3 : i64} {
  %q_lo = tile.load %q[program, half_lo] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %q_hi = tile.load %q[program, half_hi] : !tile.tensor<q> -> !tile.tile<m x half x f16>
  %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>
  tile.return
}
// CHECK: the kernel rotates its whole head (no rotary_dim), and head_dim 3 is odd: rotary pairs need an even width
