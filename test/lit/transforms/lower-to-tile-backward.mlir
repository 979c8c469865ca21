// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-rope=as_forward}' | filecheck %s --check-prefix=ASFWD
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{backward=false}' | filecheck %s --check-prefix=NOBWD
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{block-m=128 block-n=64 num-warps=8 num-stages=3}' | filecheck %s --check-prefix=INHERIT
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{block-m=128 block-n=64 num-warps=8 num-stages=3 bwd-block-m=64 bwd-block-n=32 bwd-num-warps=4 bwd-num-stages=1}' | filecheck %s --check-prefix=TUNED
// RUN: not attnfuse-opt %s -p 'lower-to-tile{bwd-rope=bogus}' 2>&1 | filecheck %s --check-prefix=BOGUS

// The backward kernels lower-to-tile emits after the forward kernel.

// An unknown bwd-rope is a one-line option error, pointing at the value (no traceback, nothing
// after it).
// BOGUS-NOT:  Traceback
// BOGUS:      {{^}}<pass-pipeline>:1:24: error: lower-to-tile: bwd-rope must be pre_rotated or as_forward, got 'bogus'{{$}}
// BOGUS-NOT:  {{.}}

// RoPE + causal, default (bwd-rope=pre_rotated): although the forward fuses both rotations, the
// backward reads rotated copies, so both rotation kernels are emitted first. The dK/dV kernel
// owns key blocks: q_bounds splits the query range into partial (masked), full and partial
// (masked) query blocks. Accumulators stay full width; at the end dK is split into the halves
// of the rotary pairs and rotated back (the rotation's transpose).
// CHECK:       {{^}}builtin.module {
// CHECK-NEXT:    tile.kernel @rotate_query(%q: !tile.tensor<q>, %q_rot: !tile.tensor<q_rot>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>
// CHECK-NEXT:      %q_lo = tile.load %q[program, half_lo]
// CHECK-NEXT:      %q_hi = tile.load %q[program, half_hi]
// CHECK-NEXT:      %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>} : !tile.tile<m x half x f16>
// CHECK-NEXT:      tile.store %q_lo_rot, %q_rot[program, half_lo]
// CHECK-NEXT:      tile.store %q_hi_rot, %q_rot[program, half_hi]
// CHECK-NEXT:      tile.return
// CHECK-NEXT:    }
// CHECK-NEXT:    tile.kernel @rotate_key(%k: !tile.tensor<k>, %k_rot: !tile.tensor<k_rot>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>
// CHECK:           tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>} : !tile.tile<m x half x f16>
// CHECK:         tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %rope_table: !tile.tensor<rope_table>)
// The preprocess: delta = rowsum(dO * O).
// CHECK:         tile.kernel @attention_bwd_preprocess(%o: !tile.tensor<o>, %do: !tile.tensor<do>, %delta: !tile.tensor<delta>) attributes {grid = #tile<grid query_blocks>
// CHECK-NEXT:      %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
// CHECK-NEXT:      %grad_out = tile.load %do[program, all] : !tile.tensor<do> -> !tile.tile<m x dv x f16>
// CHECK-NEXT:      %delta_1 = tile.row_dot %grad_out, %out : !tile.tile<m x dv x f16> -> !tile.tile<m x f32>
// CHECK-NEXT:      tile.store %delta_1, %delta[program] : !tile.tile<m x f32> -> !tile.tensor<delta>
// CHECK-NEXT:      tile.return
// CHECK-NEXT:    }
// The dQ kernel launched before dK/dV in place of the preprocess: it also reads O, forms its
// rows' delta from the dO block it loads anyway, stores it for dK/dV, and uses it.
// CHECK-NEXT:    tile.kernel @attention_bwd_dq_delta(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %o: !tile.tensor<o>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>
// CHECK-NEXT:      %q = tile.load %q_rot[program, all] : !tile.tensor<q_rot> -> !tile.tile<m x d x f16>
// CHECK-NEXT:      %grad_out = tile.load %do[program, all]
// CHECK-NEXT:      %lse_1 = tile.load %lse[program] : !tile.tensor<lse> -> !tile.tile<m x f32>
// CHECK-NEXT:      %out = tile.load %o[program, all] : !tile.tensor<o> -> !tile.tile<m x dv x f16>
// CHECK-NEXT:      %delta_1 = tile.row_dot %grad_out, %out : !tile.tile<m x dv x f16> -> !tile.tile<m x f32>
// CHECK-NEXT:      tile.store %delta_1, %delta[program] : !tile.tile<m x f32> -> !tile.tensor<delta>
// CHECK-NEXT:      %dq_1 = tile.zeros : !tile.tile<m x d x f32>
// CHECK:             tile.softmax_grad %probs, %grad_probs, %delta_1
// CHECK:           tile.return
// CHECK-NEXT:    }
// CHECK-NEXT:    tile.kernel @attention_bwd_dkdv(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>
// CHECK-NEXT:      %k = tile.load %k_rot[program, all] : !tile.tensor<k_rot> -> !tile.tile<m x d x f16>
// CHECK-NEXT:      %v_1 = tile.load %v[program, all] : !tile.tensor<v> -> !tile.tile<m x dv x f16>
// CHECK-NEXT:      %dk_1 = tile.zeros : !tile.tile<m x d x f32>
// CHECK-NEXT:      %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
// CHECK-NEXT:      %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
// Partial query blocks before the full ones: masked.
// CHECK-NEXT:      [[DK1:%dk_[0-9]+]], [[DV1:%dv_[0-9]+]] = tile.q_loop %q_start to %full_start masked iter_args(%dk_1, %dv_1) : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
// CHECK-NEXT:      ^bb0([[DKA:%dk_[0-9]+]]: !tile.tile<m x d x f32>, [[DVA:%dv_[0-9]+]]: !tile.tile<m x dv x f32>):
// CHECK-NEXT:        %q = tile.load %q_rot[loop, all] : !tile.tensor<q_rot> -> !tile.tile<n x d x f16>
// CHECK-NEXT:        %grad_out = tile.load %do[loop, all] : !tile.tensor<do> -> !tile.tile<n x dv x f16>
// CHECK-NEXT:        %lse_1 = tile.load %lse[loop] : !tile.tensor<lse> -> !tile.tile<n x f32>
// CHECK-NEXT:        %delta_1 = tile.load %delta[loop] : !tile.tensor<delta> -> !tile.tile<n x f32>
// CHECK-NEXT:        %scores = tile.scores(%k) x(%q) : (!tile.tile<m x d x f16>) x(!tile.tile<n x d x f16>) -> !tile.tile<m x n x f32>
// CHECK-NEXT:        %scores_1 = tile.mask %scores {band = #attn.band<upper = 0>} : !tile.tile<m x n x f32>
// CHECK-NEXT:        %probs = tile.recompute_probs %scores_1, %lse_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
// CHECK-NEXT:        %grad_probs = tile.dot_transposed %v_1, %grad_out : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
// CHECK-NEXT:        %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
// CHECK-NEXT:        [[DVB:%dv_[0-9]+]] = tile.accumulate [[DVA]], %probs, %grad_out : !tile.tile<m x dv x f32>, !tile.tile<m x n x f32>, !tile.tile<n x dv x f16>
// CHECK-NEXT:        [[DKB:%dk_[0-9]+]] = tile.accumulate [[DKA]], %grad_scores, %q : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
// CHECK-NEXT:        tile.yield [[DKB]], [[DVB]] : !tile.tile<m x d x f32>, !tile.tile<m x dv x f32>
// CHECK-NEXT:      }
// Full query blocks: no mask.
// CHECK-NEXT:      [[DK2:%dk_[0-9]+]], [[DV2:%dv_[0-9]+]] = tile.q_loop %full_start to %full_end iter_args([[DK1]], [[DV1]])
// CHECK-NEXT:      ^bb0
// CHECK-NEXT:        tile.load %q_rot[loop, all]
// CHECK-NOT:         tile.mask
// CHECK:             tile.recompute_probs
// CHECK-NOT:         tile.mask
// CHECK:             tile.yield
// CHECK-NEXT:      }
// The ragged tail of the query range: masked again.
// CHECK-NEXT:      [[DK3:%dk_[0-9]+]], [[DV3:%dv_[0-9]+]] = tile.q_loop %full_end to %q_end masked iter_args([[DK2]], [[DV2]])
// CHECK-NEXT:      ^bb0
// CHECK-NEXT:        tile.load %q_rot[loop, all]
// CHECK:             tile.mask {{.*}} {band = #attn.band<upper = 0>}
// CHECK:             tile.yield
// CHECK-NEXT:      }
// CHECK-NEXT:      [[DKS:%dk_[0-9]+]] = tile.apply_scale [[DK3]] : !tile.tile<m x d x f32>
// CHECK-NEXT:      %dk_lo, %dk_hi = tile.split [[DKS]] {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
// CHECK-NEXT:      %dk_lo_1, %dk_hi_1 = tile.rotate %dk_lo, %dk_hi, %rope_table {positions = #tile<seq key>, inverse} : !tile.tile<m x half x f32>, !tile.tensor<rope_table>
// CHECK-NEXT:      tile.store %dk_lo_1, %dk[program, half_lo] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
// CHECK-NEXT:      tile.store %dk_hi_1, %dk[program, half_hi] : !tile.tile<m x half x f32> -> !tile.tensor<dk>
// CHECK-NEXT:      tile.store [[DV3]], %dv[program, all] : !tile.tile<m x dv x f32> -> !tile.tensor<dv>
// CHECK-NEXT:      tile.return
// CHECK-NEXT:    }
// dQ owns query blocks and walks key blocks like the forward, reading the rotated copies; lse
// and delta run along the program's rows.
// CHECK-NEXT:    tile.kernel @attention_bwd_dq(%q_rot: !tile.tensor<q_rot>, %k_rot: !tile.tensor<k_rot>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid query_blocks>
// CHECK-NEXT:      %q = tile.load %q_rot[program, all] : !tile.tensor<q_rot> -> !tile.tile<m x d x f16>
// CHECK-NEXT:      %grad_out = tile.load %do[program, all]
// CHECK-NEXT:      %lse_1 = tile.load %lse[program] : !tile.tensor<lse> -> !tile.tile<m x f32>
// CHECK-NEXT:      %delta_1 = tile.load %delta[program] : !tile.tensor<delta> -> !tile.tile<m x f32>
// CHECK-NEXT:      %dq_1 = tile.zeros : !tile.tile<m x d x f32>
// CHECK-NEXT:      %kv_start, %full_start, %full_end, %kv_end = tile.kv_bounds {band = #attn.band<upper = 0>}
// CHECK-NEXT:      [[DQ1:%dq_[0-9]+]] = tile.kv_loop %kv_start to %full_end iter_args(%dq_1)
// CHECK-NEXT:      ^bb0
// CHECK-NEXT:        %k = tile.load %k_rot[loop, all] : !tile.tensor<k_rot> -> !tile.tile<n x d x f16>
// CHECK-NOT:         tile.rotate
// CHECK:             %probs = tile.recompute_probs %scores, %lse_1 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
// CHECK-NEXT:        %grad_probs = tile.dot_transposed %grad_out, %v_1 : !tile.tile<m x dv x f16>, !tile.tile<n x dv x f16> -> !tile.tile<m x n x f32>
// CHECK-NEXT:        %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
// CHECK-NEXT:        tile.accumulate {{%dq_[0-9]+}}, %grad_scores, %k : !tile.tile<m x d x f32>, !tile.tile<m x n x f32>, !tile.tile<n x d x f16>
// CHECK:           [[DQ2:%dq_[0-9]+]] = tile.kv_loop %full_end to %kv_end masked iter_args([[DQ1]])
// CHECK-NOT:         tile.rotate
// CHECK:           [[DQS:%dq_[0-9]+]] = tile.apply_scale [[DQ2]] : !tile.tile<m x d x f32>
// CHECK-NEXT:      %dq_lo, %dq_hi = tile.split [[DQS]] {pairs = #tile<pairs half>} : !tile.tile<m x d x f32> -> !tile.tile<m x half x f32>
// CHECK-NEXT:      %dq_lo_1, %dq_hi_1 = tile.rotate %dq_lo, %dq_hi, %rope_table {positions = #tile<seq query>, inverse} : !tile.tile<m x half x f32>
// CHECK-NEXT:      tile.store %dq_lo_1, %dq[program, half_lo]
// CHECK-NEXT:      tile.store %dq_hi_1, %dq[program, half_hi]
// CHECK-NEXT:      tile.return
// CHECK-NEXT:    }
// CHECK-NEXT:  }

// bwd-rope=as_forward: no rotation kernels; the backward rotates in registers where the forward
// does: the program's keys once, each loop block's queries inside the q_loop, accumulating dK
// in the two halves of the rotary pairs (no split); dK is rotated back at the end.
// ASFWD:       {{^}}builtin.module {
// ASFWD-NEXT:    tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// ASFWD-NOT:     tile.kernel @rotate_
// ASFWD:         tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %rope_table: !tile.tensor<rope_table>) attributes {grid = #tile<grid key_blocks>
// ASFWD-NEXT:      %k_lo = tile.load %k[program, half_lo] : !tile.tensor<k> -> !tile.tile<m x half x f16>
// ASFWD-NEXT:      %k_hi = tile.load %k[program, half_hi] : !tile.tensor<k> -> !tile.tile<m x half x f16>
// ASFWD-NEXT:      %k_lo_rot, %k_hi_rot = tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>} : !tile.tile<m x half x f16>, !tile.tensor<rope_table>
// ASFWD-NEXT:      %v_1 = tile.load %v[program, all]
// ASFWD-NEXT:      %dk_lo = tile.zeros : !tile.tile<m x half x f32>
// ASFWD-NEXT:      %dk_hi = tile.zeros : !tile.tile<m x half x f32>
// ASFWD-NEXT:      %dv_1 = tile.zeros : !tile.tile<m x dv x f32>
// ASFWD-NEXT:      %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<upper = 0>}
// ASFWD-NEXT:      tile.q_loop %q_start to %full_start masked iter_args(%dk_lo, %dk_hi, %dv_1) : !tile.tile<m x half x f32>, !tile.tile<m x half x f32>, !tile.tile<m x dv x f32> ->
// ASFWD-NEXT:      ^bb0([[LO:%dk_lo_[0-9]+]]: !tile.tile<m x half x f32>, [[HI:%dk_hi_[0-9]+]]: !tile.tile<m x half x f32>, {{%dv_[0-9]+}}: !tile.tile<m x dv x f32>):
// ASFWD-NEXT:        %q_lo = tile.load %q[loop, half_lo] : !tile.tensor<q> -> !tile.tile<n x half x f16>
// ASFWD-NEXT:        %q_hi = tile.load %q[loop, half_hi] : !tile.tensor<q> -> !tile.tile<n x half x f16>
// ASFWD-NEXT:        %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>} : !tile.tile<n x half x f16>, !tile.tensor<rope_table>
// ASFWD:             %scores = tile.scores(%k_lo_rot, %k_hi_rot) x(%q_lo_rot, %q_hi_rot) : (!tile.tile<m x half x f16>, !tile.tile<m x half x f16>) x(!tile.tile<n x half x f16>, !tile.tile<n x half x f16>) -> !tile.tile<m x n x f32>
// ASFWD-NEXT:        tile.mask %scores
// ASFWD:             tile.accumulate [[LO]], %grad_scores, %q_lo_rot : !tile.tile<m x half x f32>, !tile.tile<m x n x f32>, !tile.tile<n x half x f16>
// ASFWD-NEXT:        tile.accumulate [[HI]], %grad_scores, %q_hi_rot : !tile.tile<m x half x f32>, !tile.tile<m x n x f32>, !tile.tile<n x half x f16>
// ASFWD:           tile.q_loop %full_start to %full_end iter_args
// ASFWD:             tile.rotate {{.*}} {positions = #tile<seq query>} : !tile.tile<n x half x f16>
// ASFWD:           tile.q_loop %full_end to %q_end masked iter_args
// ASFWD:             tile.rotate {{.*}} {positions = #tile<seq query>} : !tile.tile<n x half x f16>
// ASFWD-NOT:       tile.split
// ASFWD:           [[LOS:%dk_lo_[0-9]+]] = tile.apply_scale {{%dk_lo_[0-9]+}} : !tile.tile<m x half x f32>
// ASFWD-NEXT:      [[HIS:%dk_hi_[0-9]+]] = tile.apply_scale {{%dk_hi_[0-9]+}} : !tile.tile<m x half x f32>
// ASFWD-NEXT:      [[LOR:%dk_lo_[0-9]+]], [[HIR:%dk_hi_[0-9]+]] = tile.rotate [[LOS]], [[HIS]], %rope_table {positions = #tile<seq key>, inverse}
// ASFWD-NEXT:      tile.store [[LOR]], %dk[program, half_lo]
// ASFWD-NEXT:      tile.store [[HIR]], %dk[program, half_hi]
// ASFWD-NEXT:      tile.store {{%dv_[0-9]+}}, %dv[program, all]
// ASFWD-NEXT:      tile.return
// ASFWD:         tile.kernel @attention_bwd_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>,
// ASFWD-NEXT:      %q_lo = tile.load %q[program, half_lo]
// ASFWD-NEXT:      %q_hi = tile.load %q[program, half_hi]
// ASFWD-NEXT:      %q_lo_rot, %q_hi_rot = tile.rotate %q_lo, %q_hi, %rope_table {positions = #tile<seq query>} : !tile.tile<m x half x f16>
// ASFWD:           %dq_lo = tile.zeros : !tile.tile<m x half x f32>
// ASFWD-NEXT:      %dq_hi = tile.zeros : !tile.tile<m x half x f32>
// ASFWD:           tile.kv_loop %kv_start to %full_end iter_args(%dq_lo, %dq_hi)
// ASFWD:             tile.rotate %k_lo, %k_hi, %rope_table {positions = #tile<seq key>} : !tile.tile<n x half x f16>
// ASFWD:             tile.scores(%q_lo_rot, %q_hi_rot) x(%k_lo_rot, %k_hi_rot)
// ASFWD-NOT:       tile.split
// ASFWD:           tile.rotate {{.*}} {positions = #tile<seq query>, inverse} : !tile.tile<m x half x f32>
// ASFWD-NEXT:      tile.store {{.*}}, %dq[program, half_lo]
// ASFWD-NEXT:      tile.store {{.*}}, %dq[program, half_hi]
// ASFWD-NEXT:      tile.return

// backward=false: the forward kernel only; no rotation kernels either (the forward fuses them).
// NOBWD:       {{^}}builtin.module {
// NOBWD-NEXT:    tile.kernel @attention_fwd(
// NOBWD-NOT:     tile.kernel
// NOBWD:       {{^}}//{{ }}-----

// The backward options default to the forward's.
// INHERIT:     tile.kernel @rotate_query({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64
// INHERIT:     tile.kernel @attention_fwd({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64
// INHERIT:     tile.kernel @attention_bwd_preprocess({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64
// INHERIT:     tile.kernel @attention_bwd_dkdv({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64
// INHERIT:     tile.kernel @attention_bwd_dq({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64

// bwd-* options tune the backward kernels only.
// TUNED:       tile.kernel @attention_fwd({{.*}}block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 3 : i64
// TUNED:       tile.kernel @attention_bwd_preprocess({{.*}}block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64
// TUNED:       tile.kernel @attention_bwd_dkdv({{.*}}block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64
// TUNED:       tile.kernel @attention_bwd_dq({{.*}}block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 1 : i64
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

// ReLU attention needs neither the log-sum-exp nor delta: no preprocess kernel, no lse or
// delta parameters; the weights are recomputed with relu_probs and the score gradient is
// relu_grad. Without a mask, the full query blocks come first, then the ragged tail (masked).
// CHECK:       {{^}}//{{ }}-----
// CHECK-NEXT:  {{^}}builtin.module {
// CHECK-NEXT:    tile.kernel @attention_fwd(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %o: !tile.tensor<o>) attributes
// CHECK-NOT:     tile.kernel @attention_bwd_preprocess
// CHECK-NOT:     tile.kernel @attention_bwd_dq_delta
// CHECK:         tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>) attributes {grid = #tile<grid key_blocks>
// CHECK:           %q_start, %full_start, %full_end, %q_end = tile.q_bounds {band = #attn.band<>}
// CHECK-NEXT:      tile.q_loop %q_start to %full_end iter_args
// CHECK-NOT:         recompute_probs
// CHECK-NOT:         softmax_grad
// CHECK:             %scores = tile.scores(%k_1) x(%q_1)
// CHECK-NEXT:        %probs = tile.relu_probs %scores : !tile.tile<m x n x f32>
// CHECK-NEXT:        %grad_probs = tile.dot_transposed %v_1, %grad_out
// CHECK-NEXT:        %grad_scores = tile.relu_grad %scores, %grad_probs : !tile.tile<m x n x f32>
// CHECK-NEXT:        tile.accumulate {{%dv_[0-9]+}}, %probs, %grad_out
// CHECK-NEXT:        tile.accumulate {{%dk_[0-9]+}}, %grad_scores, %q_1
// CHECK:           tile.q_loop %full_end to %q_end masked iter_args
// CHECK:             %scores_2 = tile.mask %scores_1 {band = #attn.band<>}
// CHECK-NEXT:        tile.relu_probs %scores_2
// CHECK-NEXT:        tile.dot_transposed
// CHECK-NEXT:        tile.relu_grad %scores_2,
// CHECK:           tile.apply_scale
// CHECK-NEXT:      tile.store {{%dk_[0-9]+}}, %dk[program, all]
// CHECK-NEXT:      tile.store {{%dv_[0-9]+}}, %dv[program, all]
// CHECK:         tile.kernel @attention_bwd_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %dq: !tile.tensor<dq>) attributes {grid = #tile<grid query_blocks>
// CHECK-NOT:       recompute_probs
// CHECK-NOT:       softmax_grad
// CHECK:           tile.relu_grad
// CHECK-NOT:       tile.kernel
// CHECK:       {{^}}//{{ }}-----
// NOBWD:       {{^}}builtin.module {
// NOBWD-NEXT:    tile.kernel @attention_fwd(
// NOBWD-NOT:     tile.kernel
// NOBWD:       {{^}}//{{ }}-----
attn.variant @relu(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Additive bias: the backward kernels add the bias (transposed in the key_blocks kernel), and a
// second dQ kernel, attention_bwd_dq_bias, also stores dS into the bias gradient; the plain
// dQ kernel stores nothing but dQ.
// CHECK:         tile.kernel @attention_bwd_preprocess(
// CHECK:         tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %bias: !tile.tensor<bias>) attributes {grid = #tile<grid key_blocks>
// CHECK:             %scores_1 = tile.add_bias %scores, %bias : !tile.tile<m x n x f32>, !tile.tensor<bias>
// CHECK-NEXT:        %probs = tile.recompute_probs %scores_1, %lse_1 : !tile.tile<m x n x f32>, !tile.tile<n x f32>
// CHECK-NOT:         tile.store_scores
// CHECK:         tile.kernel @attention_bwd_dq(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>) attributes {grid = #tile<grid query_blocks>
// CHECK-NOT:       tile.store_scores
// CHECK:         tile.kernel @attention_bwd_dq_bias(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dq: !tile.tensor<dq>, %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>) attributes {grid = #tile<grid query_blocks>
// CHECK:           tile.kv_loop %kv_start to %full_end iter_args
// CHECK:             %scores_1 = tile.add_bias %scores, %bias
// CHECK-NEXT:        %probs = tile.recompute_probs %scores_1, %lse_1 : !tile.tile<m x n x f32>, !tile.tile<m x f32>
// CHECK-NEXT:        %grad_probs = tile.dot_transposed %grad_out, %v_1
// CHECK-NEXT:        %grad_scores = tile.softmax_grad %probs, %grad_probs, %delta_1
// CHECK-NEXT:        tile.store_scores %grad_scores, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
// CHECK-NEXT:        tile.accumulate {{%dq_[0-9]+}}, %grad_scores, %k_1
// CHECK:           tile.kv_loop %full_end to %kv_end masked iter_args
// CHECK:             tile.mask
// CHECK:             %grad_scores_1 = tile.softmax_grad
// CHECK-NEXT:        tile.store_scores %grad_scores_1, %dbias : !tile.tile<m x n x f32>, !tile.tensor<dbias>
// CHECK:           tile.apply_scale
// CHECK-NEXT:      tile.store {{%dq_[0-9]+}}, %dq[program, all]
// CHECK-NEXT:      tile.return
// CHECK-NOT:     tile.kernel
// CHECK:       {{^}}//{{ }}-----
// NOBWD:       {{^}}builtin.module {
// NOBWD-NEXT:    tile.kernel @attention_fwd(
// NOBWD-NOT:     tile.kernel
// NOBWD:       {{^}}//{{ }}-----
attn.variant @bias(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Block-sparse: the dK/dV kernel walks the query blocks listed for its key block: the full
// ones (no mask), then the partial ones (masked); dQ walks the forward's key-block lists.
// CHECK:         tile.kernel @attention_bwd_dkdv(%q: !tile.tensor<q>, %k: !tile.tensor<k>, %v: !tile.tensor<v>, %do: !tile.tensor<do>, %lse: !tile.tensor<lse>, %delta: !tile.tensor<delta>, %dk: !tile.tensor<dk>, %dv: !tile.tensor<dv>, %full_q_blocks: !tile.tensor<full_q_blocks>, %full_q_count: !tile.tensor<full_q_count>, %partial_q_blocks: !tile.tensor<partial_q_blocks>, %partial_q_count: !tile.tensor<partial_q_count>) attributes {grid = #tile<grid key_blocks>
// CHECK-NOT:       tile.q_bounds
// CHECK:           [[SDK:%dk_[0-9]+]], [[SDV:%dv_[0-9]+]] = tile.sparse_q_loop %full_q_blocks, %full_q_count iter_args(%dk_1, %dv_1) : !tile.tensor<full_q_blocks>, !tile.tensor<full_q_count>, !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> -> !tile.tile<m x d x f32>, !tile.tile<m x dv x f32> {
// CHECK-NOT:         tile.mask
// CHECK:             tile.recompute_probs {{.*}} : !tile.tile<m x n x f32>, !tile.tile<n x f32>
// CHECK-NOT:         tile.mask
// CHECK:           tile.sparse_q_loop %partial_q_blocks, %partial_q_count masked iter_args([[SDK]], [[SDV]]) : !tile.tensor<partial_q_blocks>, !tile.tensor<partial_q_count>,
// CHECK:             tile.mask {{.*}} {band = #attn.band<>}
// CHECK:         tile.kernel @attention_bwd_dq(
// CHECK-SAME:      %full_blocks: !tile.tensor<full_blocks>, %full_count: !tile.tensor<full_count>, %partial_blocks: !tile.tensor<partial_blocks>, %partial_count: !tile.tensor<partial_count>) attributes {grid = #tile<grid query_blocks>
// CHECK:           tile.sparse_kv_loop %full_blocks, %full_count iter_args
// CHECK:           tile.sparse_kv_loop %partial_blocks, %partial_count masked iter_args
// NOBWD:       {{^}}builtin.module {
// NOBWD-NEXT:    tile.kernel @attention_fwd(
// NOBWD-NOT:     tile.kernel
attn.variant @sparse(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %l = attn.block_sparse %s, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
