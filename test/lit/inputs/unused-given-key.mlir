// Input for transforms/lower-to-tile-append.mlir: a given key rotation nothing reads.

attn.variant @unused(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement given>} : !attn.key
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
