// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=64 block-m=64 block-n=32 num-warps=4 num-stages=3},fold-scale-into-exp,share-offsets,warp-specialize' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=128},warp-specialize{block-n=64 stages=3 consumer-warps=4 max-registers=232}' | filecheck %s --check-prefix=OPTS
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{head-dim=64},warp-specialize' | filecheck %s --check-prefix=FUSED

// With RoPE pre-applied, warp-specialize schedules the flash-shaped forward (over q_rot, k_rot): whole-warpgroup consumers of 16 rows per
// warp, its own tile sizes and pipeline depth; the backward kernels keep the portable schedule.
// CHECK:      tile.kernel @attention_fwd(
// CHECK-SAME: block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64
// CHECK-SAME: schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, max_registers = 168 : i64
// CHECK:      tile.kernel @attention_bwd_dq_delta(
// CHECK-NOT:  schedule
// CHECK-SAME: block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 3 : i64
// CHECK:      tile.kernel @attention_bwd_dkdv(
// CHECK-NOT:  schedule = #tile
// CHECK-SAME: {

// The options set the schedule's sizes: 4 consumer warps own 64 rows.
// OPTS:       tile.kernel @attention_fwd(
// OPTS-SAME:  block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64
// OPTS-SAME:  producer_warps = 1 : i64, max_registers = 232 : i64

// Fused RoPE rotates q and k in the kernel: not flash-shaped, left alone.
// FUSED:      tile.kernel @attention_fwd(
// FUSED-NOT:  schedule
// FUSED-SAME: {
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
