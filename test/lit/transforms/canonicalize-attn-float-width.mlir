// RUN: attnfuse-opt %s --split-input-file -p canonicalize-attn | filecheck %s
// A float written at f32 is the same number at f64, the width the Python API writes: the
// canonical form writes it so, and the program prints (and caches) as the DSL's does.

// CHECK:      attn.rope %q {theta = 5.000000e+05 : f64} : !attn.query
// CHECK:      attn.rope %k {theta = 5.000000e+05 : f64} : !attn.key
// CHECK:      attn.softcap %s {cap = 3.000000e+01 : f64}
attn.variant @narrow(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 5.0e+05 : f32} : !attn.query
  %kr = attn.rope %k {theta = 5.0e+05 : f32} : !attn.key
  %s = attn.scores %qr, %kr
  %c = attn.softcap %s {cap = 3.0e+01 : f32}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// An f32 that is not a short decimal keeps its value exactly (xDSL rounded it to f32 when it
// was parsed; that float is exact at f64).
// CHECK:      attn.softcap %s {cap = 0.10000000149011612 : f64}
attn.variant @inexact(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 0.1 : f32}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Floats in an array (ALiBi's slopes) too.
// CHECK:      attn.alibi %s {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
attn.variant @slopes(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = [5.0e-01 : f32, 2.5e-01 : f32]}
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
