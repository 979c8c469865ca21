// Input for transforms/lower-to-tile-decode-errors.mlir: RoPE with a causal mask.

attn.variant @rope(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
