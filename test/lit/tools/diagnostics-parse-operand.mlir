// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// A token where an op's syntax has ended: xDSL's message (" in block definition", a missing
// block label) is replaced by what was expected and found.
// CHECK: diagnostics-parse-operand.mlir:[[# @LINE + 4]]:26: error: expected an operation or '}' closing the region, got ','
// CHECK-NOT: Traceback
// CHECK-NOT: in block definition
attn.variant @extra_operand(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
