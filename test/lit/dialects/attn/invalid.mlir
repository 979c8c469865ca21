// RUN: attnfuse-opt %s --split-input-file --verify-diagnostics | filecheck %s
// Each attn verifier error, one per split.

attn.variant @two_normalizers(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %p2 = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: a variant needs exactly one normalizer, found 2

// -----

attn.variant @no_scores(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %s2 = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: a variant needs exactly one attn.scores

// -----

attn.variant @mismatched_rope(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: the query and key rotations must use the same theta, rotary_dim and layout

// -----

attn.variant @twice_rotated(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %q1 = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %q2 = attn.rope %q1 {theta = 1.000000e+04 : f64} : !attn.query
  %s = attn.scores %q2, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.query is rotated more than once

// -----

attn.variant @odd_rotary(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, rotary_dim = 7 : i64} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope rotary_dim must be positive, even and below 2^31, got 7

// -----

attn.variant @bad_theta(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = -1.000000e+00 : f64} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope theta must be a finite number > 1, got -1.0

// -----

attn.variant @theta_one(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+00 : f64} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope theta must be a finite number > 1, got 1.0

// -----

attn.variant @bad_placement(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, placement = "sideways"} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// A placement is an enum attribute (#attn<placement fused>), not a string.
// CHECK: "sideways" should be of base attribute attn.placement

// -----

attn.variant @bad_scale(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k {scale = 0.000000e+00 : f64}
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: scores scale must be positive, got 0.0

// -----

// Positive, but 0 in fp32, where the kernels scale.
attn.variant @subnormal_scale(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k {scale = 1.000000e-46 : f64}
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: scores scale must lie in [1.18e-38, 2.36e+38] (kernels scale in fp32), got 1e-46

// -----

attn.variant @wrong_band(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal] {band = #attn.band<lower = -4, upper = 0>}
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: band (-4, 0) does not match the predicates' band (None, 0)

// -----

attn.variant @not_a_predicate(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [42 : i64]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: mask predicate expected, got 42 : i64

// -----

attn.variant @bad_signature(%q : !attn.query, %k : !attn.key, %v : !attn.value, %w : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.variant takes (!attn.query, !attn.key, !attn.value) then optionally, in this order, !attn.bias, !attn.layout, !attn.doc_ids, !attn.positions<query>, !attn.positions<key>; got (!attn.query, !attn.key, !attn.value, !attn.value)

// -----

attn.variant @rope_on_value(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %vr = attn.rope %v {theta = 1.000000e+04 : f64} : !attn.value
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %vr
  attn.yield %o
}
// CHECK: Unexpected attribute !attn.value


// -----

attn.variant @bad_block_size(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.block_sparse %s, %layout {block_size = 24 : i64}
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: block_sparse block_size must be a power of two in [16, 2^30], got 24

// -----

attn.variant @empty_slopes(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s {slopes = []}
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: alibi slopes, when given, must list one slope per head

// -----

attn.variant @bad_scaling(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, llama3_scaling = [8.000000e+00 : f64, 4.000000e+00 : f64, 1.000000e+00 : f64, 8.192000e+03 : f64]} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope llama3_scaling: high_freq_factor must exceed low_freq_factor, got 1.0 <= 4.0

// -----

attn.variant @tiny_scaling_factor(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, llama3_scaling = [1.000000e-40 : f64, 1.000000e+00 : f64, 4.000000e+00 : f64, 8.192000e+03 : f64]} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope llama3_scaling: factor must be at least 1.26e-29 (2^32 / the largest fp32 number: a smaller one makes the fp32 angles of large positions inf), got 1e-40

// -----

attn.variant @three_scaling_values(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, llama3_scaling = [8.000000e+00 : f64, 1.000000e+00 : f64, 4.000000e+00 : f64]} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope llama3_scaling: must be [factor, low_freq_factor, high_freq_factor, original_max_position], got 3 values

// -----

attn.variant @two_normalizers_relu(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.relu %s
  %p2 = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: a variant needs exactly one normalizer, found 2

// -----

attn.variant @extra_args_out_of_order(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.variant takes (!attn.query, !attn.key, !attn.value) then optionally, in this order, !attn.bias, !attn.layout, !attn.doc_ids, !attn.positions<query>, !attn.positions<key>; got (!attn.query, !attn.key, !attn.value, !attn.layout, !attn.bias)

// -----

attn.variant @wrong_positions(%q : !attn.query, %k : !attn.key, %v : !attn.value, %kp : !attn.positions<key>) -> !attn.output {
  %qr = attn.rope %q at %kp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<key>
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rotating query rows needs !attn.positions<query>, got !attn.positions<key>

// -----

attn.variant @given_query(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, placement = #attn<placement given>} : !attn.query
  %s = attn.scores %qr, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope placement given applies only to the key (a KV cache stores keys rotated); the query is rotated by the kernels

// -----

attn.variant @given_key_at_positions(%q : !attn.query, %k : !attn.key, %v : !attn.value, %kp : !attn.positions<key>) -> !attn.output {
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64, placement = #attn<placement given>} : !attn.key, !attn.positions<key>
  %s = attn.scores %q, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: rope placement given reads no positions: the key arrives rotated

// -----

// attn.document reads document ids, not a layout.
attn.variant @document_of_layout(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %d = "attn.document"(%s, %layout) : (!attn.scores, !attn.layout) -> !attn.scores
  %p = attn.softmax %d
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: operand 'doc_ids' at position 1 does not verify:
// CHECK-NEXT: !attn.layout should be of base attribute attn.doc_ids

// -----

// The doc_ids argument comes after the layout and before the positions.
attn.variant @doc_ids_order(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: attn.variant takes (!attn.query, !attn.key, !attn.value) then optionally, in this order, !attn.bias, !attn.layout, !attn.doc_ids, !attn.positions<query>, !attn.positions<key>; got (!attn.query, !attn.key, !attn.value, !attn.doc_ids, !attn.layout)

// -----

attn.variant @foreign_op(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = arith.constant 1.0 : f32
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
// CHECK: 'arith.constant' inside attn.variant: a variant's body holds attn ops only

