// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// A property of the wrong type fails while the op is parsed: located at the op, and named.
// CHECK: diagnostics-parse-property.mlir:[[# @LINE + 2]]:3: error: attn.rope: property 'theta' must be a float attribute, got "big"
attn.variant @bad_property(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = "big"} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
