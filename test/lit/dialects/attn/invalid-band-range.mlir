// RUN: not attnfuse-opt %s 2>&1 | filecheck %s --check-prefix=WINDOW
// RUN: not attnfuse-opt %S/../../inputs/wide-band.mlir 2>&1 | filecheck %s --check-prefix=BAND
// Kernels add band offsets to positions in int32: a window of 2**31 - 1 overflowed there and
// kept the wrong keys. Windows above 2**30 + 1 and band offsets beyond +-2**30 are refused,
// located where they are written.
// WINDOW: invalid-band-range.mlir:[[# @LINE + 3]]:45: error: window size must be at most 1073741825 (its band offsets are added to positions in int32), got 2147483647
attn.variant @wide(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.window<2147483647>]
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}
// BAND: wide-band.mlir:4:3: error: band lower offset must lie in [-1073741824, 1073741824] (kernels add it to positions in int32), got -2000000000
