// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// A property of the wrong type in an op's generic form fails when the op is verified (xDSL
// builds the op first): located at the op, and named as in the custom form.
// CHECK: diagnostics-verify-property.mlir:[[# @LINE + 3]]:3: error: attn.softcap: property 'cap' must be a float attribute, got "big"
attn.variant @bad_property(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = "attn.softcap"(%s) <{cap = "big"}> : (!attn.scores) -> !attn.scores
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}
