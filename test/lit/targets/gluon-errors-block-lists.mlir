// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 backward=false},warp-specialize' -t gluon 2>&1 | filecheck %s
// A kernel walking document lists: its block lists have a schedule (gluon-block-sparse.mlir),
// its per-entry document filter (tile.document_mask) has no place in the score step: the
// Gluon target refuses it with the op at fault (the runtime then runs the portable kernel).
// CHECK-NOT: Traceback
// CHECK: error: the gluon target cannot lower attention_fwd (tile.document_mask): score ops are masks, maps, ALiBi, biases and scales, then the load of v
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
