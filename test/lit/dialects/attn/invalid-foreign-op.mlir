// RUN: not attnfuse-opt %s 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p canonicalize-attn,analyze-masks,place-rope,lower-to-tile 2>&1 | filecheck %s
// An op of another dialect in a variant's body is an error at that op, not at the variant
// (the passes read attn ops only; canonicalization would erase it silently).
// CHECK-NOT: Traceback
// CHECK: invalid-foreign-op.mlir:[[# @LINE + 4]]:3: error: 'arith.constant' inside attn.variant: a variant's body holds attn ops only
// CHECK-NOT: tile.kernel
attn.variant @v(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = arith.constant 1.0 : f32
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
