// RUN: attnfuse-opt --block-module %S/../../python/blocks/sink_window_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile | filecheck %s
// RUN: attnfuse-opt --block-module %S/../../python/blocks/sink_window_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t triton | filecheck %s --check-prefix=TRITON
// RUN: attnfuse-opt --block-module %S/../../python/blocks/sink_window_block.py %S/../../python/blocks/chained_sink_windows.mlir -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile{backward=false} | filecheck %s --check-prefix=CHAINED
// An element-wise filter (sink_window: StreamingLLM's sinks and recent window, in one file
// beside its pytest tests; docs/architecture.md §10.1) is neither a band nor block lists: no
// block is full for it, so every kernel walks the band's blocks in one masked loop, where the
// filter's test (a map of the entries' positions) follows the band's mask.

// CHECK-LABEL: tile.kernel @attention_fwd(
// CHECK-NOT:   tile.kv_loop {{.*}} iter_args
// CHECK:       tile.kv_loop %kv_start to %kv_end masked
// CHECK:       tile.mask %scores {band = #attn.band<upper = 0>}
// CHECK-NEXT:  %q_position = tile.pair_position {axis = #tile<seq query>}
// CHECK-NEXT:  %k_position = tile.pair_position {axis = #tile<seq key>}
// CHECK-NEXT:  tile.map(%scores_1, %q_position, %k_position)
// CHECK:       arith.cmpf olt
// CHECK:       arith.select
// CHECK-NOT:   tile.kv_loop
// CHECK:       tile.softmax_finalize
// CHECK-LABEL: tile.kernel @attention_bwd_dkdv(
// CHECK:       tile.q_loop %q_start to %q_end masked
// CHECK-NOT:   tile.q_loop
// CHECK:       tile.return

// Hand-written IR with two chained filters and an unused one: each filter on the chain tests
// the entries (each window with its own sink count; canonicalize-attn sorts the two, which
// commute, by their attributes: window 8 first), the unused one tests nothing.
// CHAINED-LABEL: tile.kernel @attention_fwd(
// CHAINED:       tile.kv_loop %kv_start to %kv_end masked
// CHAINED:       arith.constant 8.000000e+00 : f32
// CHAINED:       arith.constant 2.560000e+02 : f32
// CHAINED-NOT:   arith.constant 7.700000e+01 : f32
// CHAINED:       tile.softmax_finalize

// TRITON-LABEL: def attention_fwd(
// TRITON-NOT:   full: no mask work
// TRITON:       def attention_bwd_preprocess(

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %w = attn.sink_window %s {sinks = 4 : i64, window = 256 : i64}
  %m = attn.mask %w [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
