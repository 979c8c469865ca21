// RUN: attnfuse-opt %s | filecheck %s --check-prefix=PARSE
// RUN: not attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile' 2>&1 | filecheck %s
// RUN: not attnfuse-opt %s -p 'analyze-masks,convert-attn-to-tile{backward=false decode=true}' 2>&1 | filecheck %s
// A module may hold several variants, and the attn passes run on each; lower-to-tile names
// its kernels attention_fwd, rotate_key, ... (the runtime and the targets find them by name),
// so it refuses a second variant at that variant rather than redefining the first's kernels.
// PARSE: attn.variant @first
// PARSE: attn.variant @second
// CHECK: lower-to-tile-two-variants.mlir:[[# @LINE + 9]]:1: error: lower-to-tile: a module holds one attn.variant, got 2: lower @second from a module of its own
// CHECK-NOT: Redefinition
attn.variant @first(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
attn.variant @second(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %o = attn.pv %p, %v
  attn.yield %o
}
