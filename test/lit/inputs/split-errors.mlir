// Input for tools/diagnostics-split.mlir: chunks 1 and 3 are wrong, chunk 2 is right. As
// mlir-opt does, every chunk runs: each wrong one is reported (%zz here is no use of it), the right one is printed.
attn.variant @first(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %zz
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

attn.variant @second(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

attn.variant @third(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.window<0>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
