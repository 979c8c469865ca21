// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=64 block-m=64 block-n=32 num-warps=4 num-stages=3},fold-scale-into-exp,share-offsets,warp-specialize' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=128},warp-specialize{block-n=64 stages=3 consumers=1 consumer-registers=232}' | filecheck %s --check-prefix=OPTS
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{head-dim=64},warp-specialize' | filecheck %s --check-prefix=FUSED
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=64},warp-specialize{consumers=3}' | filecheck %s --check-prefix=THREE
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=128},warp-specialize{persistent=true}' | filecheck %s --check-prefix=PERSISTENT
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=256},warp-specialize' | filecheck %s --check-prefix=D256
// RUN: not attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=256},warp-specialize{block-n=128}' 2>&1 | filecheck %s --check-prefix=TOO-BIG
// RUN: not attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=256},warp-specialize{consumers=3}' 2>&1 | filecheck %s --check-prefix=TOO-FEW-REGISTERS

// With RoPE pre-applied, warp-specialize schedules the flash-shaped forward (over q_rot, k_rot):
// two consumer warpgroups of 64 rows, 128-key blocks, two stages; the backward kernels keep the
// portable schedule.
// CHECK:      tile.kernel @attention_fwd(
// CHECK-SAME: block_m = 128 : i64, block_n = 128 : i64, num_warps = 8 : i64, num_stages = 2 : i64
// CHECK-SAME: schedule = #tile<schedule warp_specialized>, producer_warps = 1 : i64, consumer_registers = 240 : i64
// CHECK-NOT:  persistent
// CHECK:      tile.kernel @attention_bwd_dq_delta(
// CHECK-NOT:  schedule
// CHECK-SAME: block_m = 64 : i64, block_n = 32 : i64, num_warps = 4 : i64, num_stages = 3 : i64
// CHECK:      tile.kernel @attention_bwd_dkdv(
// CHECK-NOT:  schedule = #tile
// CHECK-SAME: {

// The options set the schedule's sizes: one consumer warpgroup owns 64 rows.
// OPTS:       tile.kernel @attention_fwd(
// OPTS-SAME:  block_m = 64 : i64, block_n = 64 : i64, num_warps = 4 : i64, num_stages = 3 : i64
// OPTS-SAME:  producer_warps = 1 : i64, consumer_registers = 232 : i64

// Three consumers own 192 rows (not a power of two: the verifier allows it for this schedule).
// THREE:      tile.kernel @attention_fwd(
// THREE-SAME: block_m = 192 : i64, block_n = 128 : i64, num_warps = 12 : i64
// THREE-SAME: consumer_registers = 160 : i64

// A persistent grid: the kernel says so (no attribute without the option: CHECK-NOT above).
// PERSISTENT:      tile.kernel @attention_fwd(
// PERSISTENT-SAME: consumer_registers = 240 : i64, persistent = 1 : i64
// PERSISTENT:      tile.kernel @attention_bwd_dq_delta(
// PERSISTENT-NOT:  persistent
// PERSISTENT-SAME: {

// At head dim 256 the default is 64-key blocks: two stages of 128-key k and v blocks would not
// fit shared memory beside the query tile.
// D256:      tile.kernel @attention_fwd(
// D256-SAME: block_m = 128 : i64, block_n = 64 : i64, num_warps = 8 : i64, num_stages = 2 : i64
// D256-SAME: schedule = #tile<schedule warp_specialized>
// TOO-BIG:   error: a warp-specialized kernel's buffers need 320 KB of shared memory (the query tile 64 KB, 2 stages of k and v 256 KB), more than Hopper's 227 KB
// Three consumers get 160 registers a thread: at head dim 256 the accumulator alone takes 128.
// TOO-FEW-REGISTERS: error: a warp-specialized kernel's consumer threads need at least 176 registers (the output accumulator 128, the scores 32, the probabilities 16), more than their consumer_registers = 160: fewer consumers (more registers each), or more consumer_registers

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
