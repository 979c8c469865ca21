// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 backward=false},warp-specialize' | filecheck %s
// warp-specialize schedules the flash shape's pointwise form (a ReLU or sigmoid kernel carrying
// only its accumulator) and kernels that read an additive bias; a kernel walking block lists
// keeps the portable schedule.

// CHECK:      tile.kernel @attention_fwd(
// CHECK-SAME: schedule = #tile<schedule warp_specialized>
// CHECK:        %acc = tile.zeros
// CHECK:        tile.relu_probs
// CHECK:        tile.store %{{.*}}, %o[program, all]
// CHECK-NEXT:   tile.return
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// CHECK:      tile.kernel @attention_fwd(
// CHECK-SAME: %bias: !tile.tensor<bias>
// CHECK-SAME: schedule = #tile<schedule warp_specialized>
// CHECK:        tile.add_bias
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// CHECK:      tile.kernel @attention_fwd(
// CHECK-NOT:  schedule
// CHECK-SAME: {
// CHECK:        tile.sparse_kv_loop
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %l = attn.block_sparse %s, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
