// RUN: attnfuse-opt %s --split-input-file -p canonicalize-attn | filecheck %s

// A soft-cap commutes with no additive modifier: canonicalize-attn leaves ALiBi and the bias
// on their side of it, and still orders each side (alibi before add_bias) and sinks masks.
// CHECK-LABEL: attn.variant @capped
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %[[A:.*]] = attn.alibi %s
// CHECK-NEXT:    %[[B:.*]] = attn.add_bias %[[A]], %bias
// CHECK-NEXT:    %[[C:.*]] = attn.softcap %[[B]] {cap = 2.000000e+00 : f64}
// CHECK-NEXT:    %{{.*}} = attn.mask %[[C]] [#attn.causal]
// CHECK-NEXT:    %p = attn.softmax
attn.variant @capped(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %m = attn.mask %b [#attn.causal]
  %a = attn.alibi %m
  %c = attn.softcap %a {cap = 2.0 : f64}
  %p = attn.softmax %c
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// The DSL's order (the cap first) is kept: nothing crosses it.
// CHECK-LABEL: attn.variant @dsl_order
// CHECK-NEXT:    %s = attn.scores %q, %k
// CHECK-NEXT:    %[[C:.*]] = attn.softcap %s
// CHECK-NEXT:    %[[A:.*]] = attn.alibi %[[C]]
attn.variant @dsl_order(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 2.0 : f64}
  %a = attn.alibi %c
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
