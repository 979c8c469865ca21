// RUN: attnfuse-opt %s | filecheck %s
// RUN: %roundtrip | filecheck %s
// RUN: attnfuse-opt %s -t triton | filecheck %s --check-prefix=TRITON
// tile.map, tile.seq_len, tile.pair_position and tile.query_head, the unscaled scores of
// fold-scale-into-exp, and the kernel's block_order and shared_offsets: custom forms, a
// generic round trip, and their Triton.

// CHECK-LABEL: tile.kernel @maps
// CHECK-SAME: block_order = #tile<order descending>, shared_offsets = ["do", "q"]
tile.kernel @maps(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %do: !tile.tensor<do>) attributes {grid = #tile<grid query_blocks>, element_type = f16, block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 2 : i64, head_dim = 64 : i64, head_dim_v = 64 : i64, block_order = #tile<order descending>, shared_offsets = ["do", "q"]} {
  %q_blk = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
  %acc, %row_max, %row_sum = tile.softmax_init : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  %start, %full_start, %full_end, %end = tile.kv_bounds {band = #attn.band<>}
  %a2, %m2, %s2 = tile.kv_loop %start to %end iter_args(%acc, %row_max, %row_sum) : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> -> !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32> {
  ^bb0(%a: !tile.tile<m x dv x f32>, %rm: !tile.tile<m x f32>, %rs: !tile.tile<m x f32>):
    %k_blk = tile.load %k[loop, all] : !tile.tensor<k> -> !tile.tile<n x d x f16>
// CHECK: tile.scores(%q_blk) x(%k_blk) {unscaled}
    %scores = tile.scores(%q_blk) x(%k_blk) {unscaled} : (!tile.tile<m x d x f16>) x (!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
// CHECK-NEXT: tile.softmax_update %scores, %rm, %rs {unscaled_scores}
    %probs, %nm, %ns, %alpha = tile.softmax_update %scores, %rm, %rs {unscaled_scores} : !tile.tile<m x n x f32>, !tile.tile<m x f32>
// CHECK-NEXT: %num_keys = tile.seq_len {axis = #tile<seq key>} : f32
    %num_keys = tile.seq_len {axis = #tile<seq key>} : f32
// CHECK-NEXT: %w = tile.map(%probs, %num_keys) : (!tile.tile<m x n x f32>, f32) -> !tile.tile<m x n x f32> {
    %w = tile.map(%probs, %num_keys) : (!tile.tile<m x n x f32>, f32) -> !tile.tile<m x n x f32> {
    ^bb1(%x: f32, %n: f32):
// CHECK:        arith.constant 2.000000e+00 : f32
      %c = arith.constant 2.000000e+00 : f32
      %y = arith.mulf %x, %c : f32
      %l = math.log %n : f32
      %z = arith.subf %y, %l : f32
// CHECK:        math.tanh
      %t = math.tanh %z : f32
// CHECK-NEXT:   arith.cmpf ogt
      %b = arith.cmpf ogt, %t, %x : f32
      %r = arith.select %b, %t, %x : f32
// CHECK:        tile.map_yield %r : f32
      tile.map_yield %r : f32
    }
// CHECK:      %q_pos = tile.pair_position {axis = #tile<seq query>} : !tile.tile<m x n x f32>
// CHECK-NEXT: %k_pos = tile.pair_position {axis = #tile<seq key>} : !tile.tile<m x n x f32>
// CHECK-NEXT: %head = tile.query_head : !tile.tile<m x n x f32>
    %q_pos = tile.pair_position {axis = #tile<seq query>} : !tile.tile<m x n x f32>
    %k_pos = tile.pair_position {axis = #tile<seq key>} : !tile.tile<m x n x f32>
    %head = tile.query_head : !tile.tile<m x n x f32>
    %w2 = tile.map(%w, %q_pos, %k_pos, %head) : (!tile.tile<m x n x f32>, !tile.tile<m x n x f32>, !tile.tile<m x n x f32>, !tile.tile<m x n x f32>) -> !tile.tile<m x n x f32> {
    ^bb2(%x2: f32, %qp: f32, %kp: f32, %h: f32):
      %d = arith.subf %kp, %qp : f32
      %dh = arith.mulf %d, %h : f32
      %y2 = arith.addf %x2, %dh : f32
      %fl = math.floor %d : f32
      %zero = arith.constant 0.000000e+00 : f32
      %near = arith.cmpf oeq, %fl, %zero : f32
      %past = arith.cmpf ogt, %d, %zero : f32
      %either = arith.ori %near, %past : i1
      %both = arith.andi %near, %past : i1
      %one = arith.xori %either, %both : i1
      %y3 = arith.select %one, %y2, %x2 : f32
      tile.map_yield %y3 : f32
    }
    %v_blk = tile.load %v[loop, all] : !tile.tensor<v> -> !tile.tile<n x dv x f16>
    %a3 = tile.accumulate %a, %w2, %v_blk rescaled %alpha : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>, !tile.tile<m x f32>
    tile.yield %a3, %nm, %ns : !tile.tile<m x dv x f32>, !tile.tile<m x f32>, !tile.tile<m x f32>
  }
  %out, %l2 = tile.softmax_finalize %a2, %m2, %s2 : !tile.tile<m x dv x f32>, !tile.tile<m x f32>
  tile.store %out, %o[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<o>
  tile.return
}


// TRITON: def _tanh(x):
// TRITON: def maps(
// TRITON: SHARED_OFFSETS: tl.constexpr = False,
// TRITON: block_id = tl.num_programs(1) - 1 - tl.program_id(1)
// The unscaled scores meet the exponential with sm_scale folded in.
// TRITON: (sm_scale * 1.4426950408889634)
// TRITON: num_keys = n_k * 1.0
// Values used once are inlined, the others named.
// TRITON: t = _tanh(((probs * 2.0) - tl.log(num_keys)))
// TRITON-NEXT: w = tl.where((t > probs), t, probs)
// Each entry's positions and query head, broadcast over the block, as f32.
// TRITON:      q_pos_1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + q_pos[:, None]
// TRITON-NEXT: # tile.pair_position: each entry's key position, as f32
// TRITON-NEXT: k_pos_1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + keys[None, :]
// TRITON-NEXT: # tile.query_head: each entry's query head, as f32
// TRITON-NEXT: head_1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32) + head
// TRITON:      d = (k_pos_1 - q_pos_1)
// TRITON:      near = (tl.floor(d) == 0.0)
// TRITON-NEXT: past = (d > 0.0)
// TRITON-NEXT: w2 = tl.where(((near | past) ^ (near & past)), (w + (d * head_1)), w)
