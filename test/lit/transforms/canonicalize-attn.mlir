// RUN: attnfuse-opt %s -p canonicalize-attn --split-input-file | filecheck %s

// Adjacent masks merge into one, predicates sorted; the empty mask (full) disappears.
// CHECK-LABEL: attn.variant @merge
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %{{.*}} = attn.mask %s [#attn.causal, #attn.window<64>]
// CHECK-NEXT:    %p = attn.softmax %{{.*}}
attn.variant @merge(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %f = attn.mask %s []
  %w = attn.mask %f [#attn.window<64>]
  %c = attn.mask %w [#attn.causal]
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Duplicate predicates are removed and windows intersect to the narrowest.
// CHECK-LABEL: attn.variant @dedupe
// CHECK:         attn.mask %s [#attn.causal, #attn.window<16>]{{$}}
attn.variant @dedupe(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.window<32>, #attn.causal, #attn.window<16>, #attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// A variant that is already canonical is left alone; rotations are untouched.
// CHECK-LABEL: attn.variant @canonical
// CHECK-NEXT:    %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
// CHECK-NEXT:    %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
// CHECK-NEXT:    %s = attn.scores %qr, %kr
// CHECK-NEXT:    %m = attn.mask %s [#attn.causal]
attn.variant @canonical(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Only a full mask: the scores flow straight into the normalizer.
// CHECK-LABEL: attn.variant @only_full
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %p = attn.softmax %s
attn.variant @only_full(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %f = attn.mask %s []
  %p = attn.softmax %f
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Score modifications move above masks (alibi before add_bias, mask before block_sparse);
// the masks, now adjacent, merge.
// CHECK-LABEL: attn.variant @order
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %{{.*}} = attn.alibi %s
// CHECK-NEXT:    %{{.*}} = attn.add_bias %{{.*}}, %bias
// CHECK-NEXT:    %{{.*}} = attn.mask %{{.*}} [#attn.causal, #attn.window<16>]
// CHECK-NEXT:    %{{.*}} = attn.block_sparse %{{.*}}, %layout {block_size = 64 : i64}
// CHECK-NEXT:    %p = attn.softmax
attn.variant @order(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.mask %s [#attn.causal]
  %b = attn.add_bias %c, %bias
  %l = attn.block_sparse %b, %layout {block_size = 64 : i64}
  %a = attn.alibi %l
  %w = attn.mask %a [#attn.window<16>]
  %p = attn.softmax %w
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// An op whose result nothing reads is erased.
// CHECK-LABEL: attn.variant @unused
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %p = attn.softmax %s
attn.variant @unused(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %b = attn.alibi %a
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// The mask moves below the modifiers as itself (its name, and its location for later
// diagnostics, stay with it), once the dead second reader of its result is erased.
// CHECK-LABEL: attn.variant @moved
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %a = attn.alibi %s
// CHECK-NEXT:    %c = attn.softcap %a {cap = 3.000000e+01 : f64}
// CHECK-NEXT:    %m = attn.mask %c [#attn.causal]
// CHECK-NEXT:    %p = attn.softmax %m
attn.variant @moved(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %dead = attn.add_bias %m, %bias
  %a = attn.alibi %m
  %c = attn.softcap %a {cap = 3.000000e+01 : f64}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Two commuting ops of one rank (two ALiBi terms, other slopes) sort by their attributes: the
// programs that write them in either order print alike (interfaces.canonical_order).
// CHECK-LABEL: attn.variant @tie_first
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %[[A:.*]] = attn.alibi %s {slopes = [2.500000e-01 : f64, 1.250000e-01 : f64]}
// CHECK-NEXT:    %[[B:.*]] = attn.alibi %[[A]] {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
// CHECK-NEXT:    attn.softmax %[[B]]
attn.variant @tie_first(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
  %b = attn.alibi %a {slopes = [2.500000e-01 : f64, 1.250000e-01 : f64]}
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// CHECK-LABEL: attn.variant @tie_second
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %[[A:.*]] = attn.alibi %s {slopes = [2.500000e-01 : f64, 1.250000e-01 : f64]}
// CHECK-NEXT:    %[[B:.*]] = attn.alibi %[[A]] {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
// CHECK-NEXT:    attn.softmax %[[B]]
attn.variant @tie_second(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = [2.500000e-01 : f64, 1.250000e-01 : f64]}
  %b = attn.alibi %a {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
  %p = attn.softmax %b
  %o = attn.pv %p, %v
  attn.yield %o
}
