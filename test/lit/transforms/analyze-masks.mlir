// RUN: attnfuse-opt %s -p analyze-masks --split-input-file | filecheck %s
// RUN: attnfuse-opt %s -p analyze-masks,analyze-masks --split-input-file | filecheck %s

// causal: keys up to the query's position; the band has only an upper edge.
// CHECK-LABEL: @causal
// CHECK: attn.mask %s [#attn.causal] {band = #attn.band<upper = 0>}
attn.variant @causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// sliding_window(w): |q_pos - k_pos| < w is the band [-(w-1), w-1].
// CHECK-LABEL: @window
// CHECK: attn.mask %s [#attn.window<256>] {band = #attn.band<lower = -255, upper = 255>}
attn.variant @window(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.window<256>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// causal and window intersect: the usual causal band.
// CHECK-LABEL: @causal_window
// CHECK: attn.mask %s [#attn.causal, #attn.window<128>] {band = #attn.band<lower = -127, upper = 0>}
attn.variant @causal_window(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal, #attn.window<128>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// No predicate: every key is kept, the band is unbounded.
// CHECK-LABEL: @keep_all
// CHECK: attn.mask %s [] {band = #attn.band<>}
attn.variant @keep_all(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s []
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
