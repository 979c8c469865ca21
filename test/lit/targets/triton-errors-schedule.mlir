// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false},warp-specialize{consumers=3}' -t triton 2>&1 | filecheck %s
// Three consumer warpgroups own 192 rows per program, which `tl.arange` cannot span: the
// portable target says so instead of printing a kernel Triton rejects.
// CHECK: error: the Triton target cannot print attention_fwd: its 192 rows per program are a warp-specialized schedule's (print it with -t gluon)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
