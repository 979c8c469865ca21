// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{bwd-dq=fused head-dim=128},fold-scale-into-exp,warp-specialize' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{bwd-dq=fused head-dim=128},warp-specialize{backward=false}' | filecheck %s --check-prefix=OFF
// RUN: not attnfuse-opt %s --split-input-file -p 'warp-specialize{bwd-block-n=128}' 2>&1 | filecheck %s --check-prefix=OPTION
// RUN: not attnfuse-opt %s --split-input-file -p 'warp-specialize{bwd-dq-writers=3}' 2>&1 | filecheck %s --check-prefix=WRITERS
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{bwd-dq=ordered head-dim=128},warp-specialize' | filecheck %s --check-prefix=ORDERED
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{bwd-dq=ordered head-dim=128},warp-specialize{bwd-dq-writers=1}' | filecheck %s --check-prefix=ONE
// RUN: attnfuse-opt %S/../inputs/bias-variant.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{bwd-dq=ordered head-dim=128},fold-scale-into-exp,warp-specialize' | filecheck %s --check-prefix=BIAS

// An additive bias: both fused dK/dV kernels are scheduled, the plain one (the bias added in the
// score step) and `_bias` (which also stores dS as the bias gradient, `tile.store_scores` among
// the VJP ops); the preprocess and the dQ finish keep the portable schedule.
// BIAS:       tile.kernel @attention_bwd_preprocess(
// BIAS-NOT:   schedule
// BIAS-SAME:  {
// BIAS:       tile.kernel @attention_bwd_dkdv_dq(
// BIAS-SAME:  %bias: !tile.tensor<bias>)
// BIAS-SAME:  schedule = #tile<schedule warp_specialized>
// BIAS:       tile.kernel @attention_bwd_dkdv_dq_bias(
// BIAS-SAME:  %bias: !tile.tensor<bias>, %dbias: !tile.tensor<dbias>)
// BIAS-SAME:  schedule = #tile<schedule warp_specialized>
// BIAS:         tile.store_scores
// BIAS:       tile.kernel @attention_bwd_dq_finish(
// BIAS-NOT:   schedule
// BIAS-SAME:  {

// warp-specialize schedules the fused backward's dK/dV/dQ kernel (backward_shape): 128 keys in
// two consumer warpgroups (8 warps), 64 queries a step, two ring stages, one loader warp, no
// consumer_registers (the consumer is the kernel's own partition), one dQ writer warp for
// unordered adds and two for adds in key-block order (bwd-dq=ordered; bwd-dq-writers overrides);
// the preprocess and the dQ finish keep the portable schedule. RoPE by halves (pre-rotated q
// and k) is scheduled too.
// CHECK:      tile.kernel @attention_bwd_preprocess(
// CHECK-NOT:  schedule
// CHECK-SAME: {
// CHECK:      tile.kernel @attention_bwd_dkdv_dq(
// CHECK-SAME: block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64
// CHECK-SAME: schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64}
// ORDERED:    tile.kernel @attention_bwd_dkdv_dq(
// ORDERED-SAME: schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 2 : i64}
// ONE:        tile.kernel @attention_bwd_dkdv_dq(
// ONE-SAME:   schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, dq_writers = 1 : i64}
// CHECK:      tile.kernel @attention_bwd_dq_finish(
// CHECK-NOT:  schedule
// CHECK-SAME: {
// OFF:        tile.kernel @attention_bwd_dkdv_dq(
// OFF-NOT:    schedule
// OFF-SAME:   {
// OPTION-NOT: Traceback
// OPTION:     error: warp-specialize: bwd-block-n must be 64 (the schedule's shared memory fits that at head dim 128), got 128
// WRITERS-NOT: Traceback
// WRITERS:    error: warp-specialize: bwd-dq-writers must be 1 or 2 (one per dQ staging buffer; 0: by the adds' order), got 3
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

// Interleaved RoPE is scheduled too (the epilogue views dK's staged bytes as pairs); a
// partial rotary width is not: its loops read q and k by parts.
// CHECK:      tile.kernel @attention_bwd_dkdv_dq(
// CHECK-SAME: schedule = #tile<schedule warp_specialized>
attn.variant @rope_interleaved(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, interleaved} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// CHECK:      tile.kernel @attention_bwd_dkdv_dq(
// CHECK-SAME: rotary_dim = 64 : i64
// CHECK-NOT:  schedule
// CHECK-SAME: {
attn.variant @rope_partial(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, rotary_dim = 64 : i64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, rotary_dim = 64 : i64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
