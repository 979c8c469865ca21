// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 backward=false}' -t gluon 2>&1 | filecheck %s
// A pointwise normalizer has no online-softmax state: its kernel starts from tile.zeros.
// CHECK: error: the gluon target cannot lower attention_fwd (tile.zeros): expected q load, softmax init, key bounds, key loops, finalize, stores
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
