// Input for dialects/attn/invalid-band-range.mlir: a hand-written band beyond int32's reach.
attn.variant @wide_band(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal] {band = #attn.band<lower = -2000000000, upper = 0>}
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}
