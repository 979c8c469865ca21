// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 backward=false},warp-specialize' -t gluon 2>&1 | filecheck %s
// A kernel walking a layout's block lists (block_sparse) has no warp-specialized schedule: the
// Gluon target refuses it with the op at fault (the runtime then runs the portable kernel).
// CHECK: error: the gluon target cannot lower attention_fwd (tile.sparse_kv_loop): expected q load, softmax init, key bounds, key loops, finalize, stores
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %l = attn.block_sparse %s, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
