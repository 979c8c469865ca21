// Input for tools/diagnostics.mlir: the error is in the second chunk; its line counts from
// the start of the file.
attn.variant @ok(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

attn.variant @bad(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.nope %q, %k
}
