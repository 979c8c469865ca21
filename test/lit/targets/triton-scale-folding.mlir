// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,lower-to-tile,fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// The printer leaves scores unscaled when they reach nothing but masks and exponentials: the
// positive scale goes into the exponential's FMA (one multiply per score less) and into the
// row max, kept in base-2 units (once per row). Scores that anything else reads (ALiBi, a bias, relu) are scaled
// where they are computed.

// A static scale is folded as a constant: log2(e) * 0.5, in the forward and the backward.
// CHECK-LABEL: def attention_fwd(
// CHECK:           scores = tl.dot(q, tl.trans(k))
// CHECK-NEXT:      # (the scale, 0.5, is applied where the scores meet the exponential)
// CHECK:           row_max_new = tl.maximum(row_max, tl.max(scores, 1) * 0.7213475204444817)
// CHECK:           probs = tl.math.exp2(scores * 0.7213475204444817 - row_max_new[:, None])
// CHECK-LABEL: def attention_bwd_dkdv(
// CHECK-NOT:       * 0.5  # static scale
// CHECK:           probs = tl.math.exp2(scores_1 * 0.7213475204444817 - (lse_safe_1 * 1.4426950408889634)[None, :])
// CHECK-LABEL: def attention_bwd_dq(
// CHECK-NOT:       * 0.5  # static scale
// CHECK:           probs = tl.math.exp2(scores * 0.7213475204444817 - (lse_safe_1 * 1.4426950408889634)[:, None])
attn.variant @static_scale(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k {scale = 5.000000e-01 : f64}
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// ALiBi adds to the scaled scores: the scale stays where the scores are computed.
// CHECK-LABEL: def attention_fwd(
// CHECK:           scores = tl.dot(q, tl.trans(k))
// CHECK-NEXT:      scores = scores * sm_scale
// CHECK:           row_max_new = tl.maximum(row_max, tl.max(
// CHECK-NOT:       sm_scale
// CHECK:           probs = tl.math.exp2({{.*}} * 1.4426950408889634 - row_max_new[:, None])
attn.variant @alibi(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
