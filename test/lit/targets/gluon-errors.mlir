// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{head-dim=128 backward=false}' -t gluon 2>&1 | filecheck %s
// What the Gluon schedule does not cover is refused with the op at fault, never printed as
// something else (the runtime then runs the portable kernel).

// A rotation in the kernel: the query is loaded as rotary halves.
// CHECK: error: the gluon target cannot lower attention_fwd (tile.load): the query must be loaded whole (no rotation in the kernel)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
