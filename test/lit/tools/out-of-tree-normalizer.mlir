// RUN: attnfuse-opt --block-module %S/../../python/blocks/sink_softmax_block.py %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t triton | filecheck %s
// RUN: not attnfuse-opt --block-module %S/../../python/blocks/sink_softmax_block.py %s -p "canonicalize-attn,analyze-masks,place-rope,lower-to-tile{decode=true}" 2>&1 | filecheck %s --check-prefix=DECODE
// A normalizer defined outside the package (sink_softmax: softmax with a sink of score 0,
// one file beside its pytest tests). Its initial row max (the sink's score, in base-2 units)
// and row sum are tile.maps whose bodies ignore their operand: the printed kernel broadcasts
// the constants to the operand's shape, so the loop carries [BLOCK_M] tiles, not Python
// scalars. Its partials over disjoint key sets do not
// merge through their log-sum-exps (each would count the sink), so it leaves merges_splits
// False and split decode kernels refuse it at the op.

// CHECK-NOT:  Traceback
// CHECK:      def attention_fwd(
// CHECK:      row_max = tl.where(True, 0.0, row_zero)
// CHECK:      row_sum = tl.where(True, 1.0, row_zero)
// CHECK:      for
// DECODE:     out-of-tree-normalizer.mlir:[[# @LINE + 4]]:3: error: {{.*}}attn.sink_softmax does not say its outputs over disjoint key sets merge exactly (Normalizer.merges_splits)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.sink_softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
