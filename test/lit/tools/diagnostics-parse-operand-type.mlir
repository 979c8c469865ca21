// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// An operand type the op's format constrains (attn.rope rotates a query or a key), checked
// while the op is parsed: located at the op, not at the top of the file.
// CHECK: diagnostics-parse-operand-type.mlir:[[# @LINE + 2]]:3: error: Unexpected attribute !attn.value
attn.variant @rotated_value(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %vr = attn.rope %v {theta = 1.000000e+04 : f64} : !attn.value
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %vr
  attn.yield %o
}
