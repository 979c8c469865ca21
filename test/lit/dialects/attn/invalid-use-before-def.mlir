// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile -t triton 2>&1 | filecheck %s
// A variant's body is one block in order: a value read before the op that defines it is an
// error at the reader (xDSL's verifier checks no dominance; the passes, the interpreter and
// the reference walk the body once, in order), not a program the compiler reorders.
// CHECK-NOT: Traceback
// CHECK: invalid-use-before-def.mlir:[[# @LINE + 3]]:3: error: 'attn.softmax' reads %s before it is defined: a body defines each value before its uses
// CHECK-NOT: def attention_fwd
attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %p = attn.softmax %s
  %s = attn.scores %q, %k
  %o = attn.pv %p, %v
  attn.yield %o
}
