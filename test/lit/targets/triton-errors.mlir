// RUN: not attnfuse-opt %s -t triton 2>&1 | filecheck %s
// The Triton target prints tile kernels only: before lower-to-tile there is none.
// CHECK: error: no tile.kernel to print: run lower-to-tile first
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
