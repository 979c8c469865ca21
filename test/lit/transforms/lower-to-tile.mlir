// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{key=fused},lower-to-tile{head-dim=64 block-m=128 block-n=64 num-warps=8 num-stages=3}' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{key=pre_rotated},lower-to-tile{head-dim=64}' | filecheck %s --check-prefix=PRE

// Causal RoPE, both rotations fused: one kernel. q and k are loaded as the two halves of
// each rotary pair and rotated in registers; only blocks crossing the diagonal are masked.
// FUSED:      tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>)
// FUSED-SAME: grid = #tile<grid query_blocks>, element_type = f16, block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64, head_dim = 64 : i64
// FUSED-NEXT:   %q_lo = tile.load %q[program, half_lo]
// FUSED-NEXT:   %q_hi = tile.load %q[program, half_hi]
// FUSED-NEXT:   %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>}
// FUSED-NEXT:   %acc, %row_max, %row_sum = tile.softmax_init
// FUSED-NEXT:   %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
// The blocks fully below the diagonal: no mask.
// FUSED-NEXT:   tile.kv_loop %kv_start to %full_end iter_args
// FUSED:          tile.load %k[loop, half_lo]
// FUSED:          tile.rotate {{.*}} {positions = #tile<seq key>}
// FUSED:          tile.scores(%q_lo_rot, %q_hi_rot) x(
// FUSED-NOT:      tile.mask
// FUSED:          tile.softmax_update
// FUSED:          tile.accumulate
// FUSED:          tile.yield
// The diagonal blocks: masked.
// FUSED:        tile.kv_loop %full_end to %kv_end masked iter_args
// FUSED:          tile.mask {{.*}} {band = #attn.band<upper = 0>}
// FUSED:        tile.softmax_finalize
// FUSED-NEXT:   tile.store %out, %o[program, all]
// FUSED-NEXT:   tile.store %lse_1, %lse[program]
// FUSED-NEXT:   tile.return

// With the key pre-rotated: a rotation kernel over key blocks, and the attention kernel
// reads its output. The rotated query halves are joined back to full width once, so each key
// step is one full-width product.
// PRE:      tile.kernel @rotate_key(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>
// PRE:        tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>}
// PRE:        tile.store %k_lo_rot, %k_rot[program, half_lo]
// PRE:        tile.store %k_hi_rot, %k_rot[program, half_hi]
// PRE:      tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k_rot: !tile.tensor<k_rot>
// PRE:        %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>}
// PRE-NEXT:   %q_rot = tile.join %q_lo_rot, %q_hi_rot {pairs = #tile<pairs half>} : !tile.tile<m x half x f16> -> !tile.tile<m x d x f16>
// PRE:        tile.load %k_rot[loop, all]
// PRE-NEXT:   tile.scores(%q_rot) x(
// PRE-NOT:    positions = #tile<seq key>
// PRE:        tile.return
attn.variant @rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Interleaved, partial rotary width: even and odd dims, plus the pass-through dims.
// FUSED:       {{^}}builtin.module
// FUSED:       tile.kernel @attention_fwd
// FUSED-SAME:  rotary_dim = 32 : i64
// FUSED:         %q_even = tile.load %q[program, even] : !tile.tensor<q> -> !tile.tile<m x half x f16>
// FUSED-NEXT:    %q_odd = tile.load %q[program, odd]
// FUSED-NEXT:    %q_pass = tile.load %q[program, pass] : !tile.tensor<q> -> !tile.tile<m x pass x f16>
// FUSED:         tile.scores(%q_even_rot, %q_odd_rot, %q_pass) x(
// PRE:         {{^}}builtin.module
// PRE:         tile.kernel @rotate_key
// PRE:         %k_pass = tile.load %k[program, pass]
// PRE-NEXT:    tile.store %k_pass, %k_rot[program, pass]
attn.variant @interleaved(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, interleaved} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, rotary_dim = 32 : i64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// No mask, no rotation: whole-width tiles; full blocks, then the ragged tail (masked).
// A static scale travels to tile.scores.
// FUSED:       {{^}}builtin.module
// FUSED:       tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>)
// FUSED:         %q_1 = tile.load %q[program, all] : !tile.tensor<q> -> !tile.tile<m x d x f16>
// FUSED:         tile.kv_bounds {band = #attn.band<>}
// FUSED-NEXT:    tile.kv_loop %kv_start to %full_end iter_args
// FUSED:           tile.scores(%q_1) x(%k_1) {scale = 5.000000e-01 : f64}
// FUSED:         tile.kv_loop %full_end to %kv_end masked iter_args
// FUSED:           tile.mask {{.*}} {band = #attn.band<>}
attn.variant @dense(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k {scale = 5.000000e-01 : f64}
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// A causal window has a lower edge too: partial blocks before the full ones get a loop.
// FUSED:       {{^}}builtin.module
// FUSED:       tile.kernel @attention_fwd
// FUSED:         tile.kv_bounds {band = #attn.band<lower = -255, upper = 0>}
// FUSED-NEXT:    tile.kv_loop %kv_start to %full_start masked iter_args
// FUSED:         tile.kv_loop %full_start to %full_end iter_args
// FUSED:         tile.kv_loop %full_end to %kv_end masked iter_args
attn.variant @window(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.mask %s [#attn.causal]
  %w = attn.mask %c [#attn.window<256>]
  %p = attn.softmax %w
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Block-sparse relu attention with ALiBi and a bias: the layout's listed key blocks are
// visited in two sparse loops (full ones unmasked, partial ones masked); relu carries only
// the accumulator, which is the output (no log-sum-exp).
// FUSED:       {{^}}builtin.module
// FUSED:       tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %slopes: !tile.tensor<slopes>, %bias: !tile.tensor<bias>, %full_blocks: !tile.tensor<full_blocks>, %full_count: !tile.tensor<full_count>, %partial_blocks: !tile.tensor<partial_blocks>, %partial_count: !tile.tensor<partial_count>)
// FUSED:         %acc = tile.zeros : !tile.tile<m x dv x f32>
// FUSED-NEXT:    %acc_1 = tile.sparse_kv_loop %full_blocks, %full_count iter_args(%acc)
// FUSED:           tile.alibi %scores, %slopes
// FUSED-NEXT:      tile.add_bias %scores_1, %bias
// FUSED-NOT:       tile.mask
// FUSED:           tile.relu_probs
// FUSED:           tile.accumulate %acc_2, %probs, %v_1 :
// FUSED:         tile.sparse_kv_loop %partial_blocks, %partial_count masked iter_args(%acc_1)
// FUSED:           tile.mask {{.*}} {band = #attn.band<upper = 0>}
// FUSED:         tile.store %acc_4, %o[program, all]
// FUSED-NEXT:    tile.return
attn.variant @sparse(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %l = attn.block_sparse %m, %layout {block_size = 128 : i64}
  %a = attn.alibi %l
  %b = attn.add_bias %a, %bias
  %p = attn.relu %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Call-time positions: the rotation reads them (rows index the positions tensor).
// FUSED:       {{^}}builtin.module
// FUSED:       tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>, %q_positions: !tile.tensor<q_positions>, %k_positions: !tile.tensor<k_positions>)
// FUSED:         tile.rotate %q_lo, %q_hi, %rope_table at %q_positions {positions = #tile<seq query>} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>, !tile.tensor<q_positions>
// FUSED:         tile.rotate %k_lo, %k_hi, %rope_table at %k_positions {positions = #tile<seq key>}
// PRE:         {{^}}builtin.module
// PRE:         tile.kernel @rotate_key(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>, %rope_table: !tile.tensor<rope_table>, %k_positions: !tile.tensor<k_positions>)
// PRE:         tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>, %q_positions: !tile.tensor<q_positions>)
attn.variant @given(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>, %kp : !attn.positions<key>) -> !attn.output {
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
