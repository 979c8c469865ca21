// RUN: attnfuse-opt %s --split-input-file --parsing-diagnostics | filecheck %s
// Parameters given to a parameterless attn type or mask predicate: a parse error at the
// token (attn.CountedParameters), one per split.

// A parameterless type given parameters: a parse error at the token.
attn.variant @typed(%q : !attn.query<3>, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.query takes no parameters, got 1

// -----

attn.variant @predicate(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal<3>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.causal takes no parameters, got 1
