// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false}' -t gluon 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false},warp-specialize{consumers=4}' -t gluon 2>&1 | filecheck %s --check-prefix=OPTION
// The target prints the schedule warp-specialize decided, never one of its own.
// CHECK: error: the gluon target prints warp-specialized kernels: attention_fwd has no #tile<schedule warp_specialized> (run warp-specialize first)
// OPTION: <pass-pipeline>:1:{{[0-9]+}}: error: warp-specialize: consumers must be 1, 2 or 3 warpgroups (0: the default), got 4
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
