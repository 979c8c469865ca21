// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// A region left open at the end of the input.
// CHECK: diagnostics-parse-unclosed.mlir:[[# @LINE + 7]]:1: error: expected an operation or '}' closing the region, got the end of the input
// CHECK-NOT: in block definition
attn.variant @unclosed(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
