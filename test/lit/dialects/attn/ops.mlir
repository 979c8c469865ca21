// RUN: attnfuse-opt %s | filecheck %s
// RUN: %roundtrip | filecheck %s
// Every attn op and attribute prints in its custom form and survives a generic round trip.

// CHECK-LABEL: attn.variant @everything(%q: !attn.query, %k: !attn.key, %v: !attn.value) -> !attn.output {
attn.variant @everything(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  // CHECK-NEXT: %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  // CHECK-NEXT: %kr = attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.key
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, placement = #attn<placement pre_rotated>} : !attn.key
  // CHECK-NEXT: %s = attn.scores %qr, %kr {scale = 1.250000e-01 : f64}
  %s = attn.scores %qr, %kr {scale = 1.250000e-01 : f64}
  // CHECK-NEXT: %m = attn.mask %s [#attn.causal, #attn.window<128>] {band = #attn.band<lower = -127, upper = 0>}
  %m = attn.mask %s [#attn.causal, #attn.window<128>] {band = #attn.band<lower = -127, upper = 0>}
  // CHECK-NEXT: %f = attn.mask %m []
  %f = attn.mask %m []
  // CHECK-NEXT: %p = attn.softmax %f
  %p = attn.softmax %f
  // CHECK-NEXT: %o = attn.pv %p, %v
  %o = attn.pv %p, %v
  // CHECK-NEXT: attn.yield %o
  attn.yield %o
}

// CHECK-LABEL: attn.variant @interleaved_partial
attn.variant @interleaved_partial(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  // CHECK: attn.rope %q {theta = 5.000000e+05 : f64, rotary_dim = 32 : i64, interleaved} : !attn.query
  %qr = attn.rope %q {theta = 5.000000e+05 : f64, rotary_dim = 32 : i64, interleaved} : !attn.query
  %kr = attn.rope %k {theta = 5.000000e+05 : f64, rotary_dim = 32 : i64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  // CHECK: attn.mask %s [] {band = #attn.band<>}
  %m = attn.mask %s [] {band = #attn.band<>}
  // CHECK: attn.mask %m [#attn.window<4>] {band = #attn.band<lower = -3, upper = 3>}
  %w = attn.mask %m [#attn.window<4>] {band = #attn.band<lower = -3, upper = 3>}
  %p = attn.softmax %w
  %o = attn.pv %p, %v
  attn.yield %o
}

// A key that arrives rotated (a KV cache's): #attn<placement given>.
// CHECK-LABEL: attn.variant @given_key
attn.variant @given_key(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>) -> !attn.output {
  // CHECK-NEXT: %qr = attn.rope %q at %qp {theta = 5.000000e+05 : f64, placement = #attn<placement fused>} : !attn.query, !attn.positions<query>
  %qr = attn.rope %q at %qp {theta = 5.000000e+05 : f64, placement = #attn<placement fused>} : !attn.query, !attn.positions<query>
  // CHECK-NEXT: %kr = attn.rope %k {theta = 5.000000e+05 : f64, placement = #attn<placement given>} : !attn.key
  %kr = attn.rope %k {theta = 5.000000e+05 : f64, placement = #attn<placement given>} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// CHECK-LABEL: attn.variant @data_blocks(%q: !attn.query, %k: !attn.key, %v: !attn.value, %bias: !attn.bias, %layout: !attn.layout) -> !attn.output {
attn.variant @data_blocks(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias, %layout : !attn.layout) -> !attn.output {
  // CHECK-NEXT: %qr = attn.rope %q {theta = 5.000000e+05 : f64, llama3_scaling = [8.000000e+00 : f64, 1.000000e+00 : f64, 4.000000e+00 : f64, 8.192000e+03 : f64]} : !attn.query
  %qr = attn.rope %q {theta = 5.000000e+05 : f64, llama3_scaling = [8.000000e+00 : f64, 1.000000e+00 : f64, 4.000000e+00 : f64, 8.192000e+03 : f64]} : !attn.query
  %s = attn.scores %qr, %k
  // CHECK: %a = attn.alibi %s
  %a = attn.alibi %s
  // CHECK-NEXT: %a2 = attn.alibi %a {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
  %a2 = attn.alibi %a {slopes = [5.000000e-01 : f64, 2.500000e-01 : f64]}
  // CHECK-NEXT: %b = attn.add_bias %a2, %bias
  %b = attn.add_bias %a2, %bias
  // CHECK-NEXT: %m = attn.block_sparse %b, %layout {block_size = 64 : i64}
  %m = attn.block_sparse %b, %layout {block_size = 64 : i64}
  // CHECK-NEXT: %p = attn.relu %m
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// Call-time RoPE positions: extra variant arguments, read by attn.rope.
// CHECK-LABEL: attn.variant @given_positions(%q: !attn.query, %k: !attn.key, %v: !attn.value, %qp: !attn.positions<query>, %kp: !attn.positions<key>) -> !attn.output {
attn.variant @given_positions(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>, %kp : !attn.positions<key>) -> !attn.output {
  // CHECK-NEXT: %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  // CHECK-NEXT: %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// The soft-cap and the sigmoid normalizer, with and without its bias.
// CHECK-LABEL: attn.variant @pointwise(%q: !attn.query, %k: !attn.key, %v: !attn.value) -> !attn.output {
attn.variant @pointwise(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  // CHECK:      %c = attn.softcap %s {cap = 5.000000e+01 : f64}
  %c = attn.softcap %s {cap = 5.000000e+01 : f64}
  // CHECK-NEXT: %p = attn.sigmoid %c {bias = -2.000000e+00 : f64}
  %p = attn.sigmoid %c {bias = -2.000000e+00 : f64}
  %o = attn.pv %p, %v
  attn.yield %o
}

// CHECK-LABEL: attn.variant @default_bias
attn.variant @default_bias(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  // CHECK:      %p = attn.sigmoid %s{{$}}
  %p = attn.sigmoid %s
  %o = attn.pv %p, %v
  attn.yield %o
}

// Documents: attn.document reads the variant's !attn.doc_ids argument (after the layout).
// CHECK-LABEL: attn.variant @documents(%q: !attn.query, %k: !attn.key, %v: !attn.value, %layout: !attn.layout, %doc_ids: !attn.doc_ids) -> !attn.output {
attn.variant @documents(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  // CHECK: %d = attn.document %s, %doc_ids
  %d = attn.document %s, %doc_ids
  // CHECK-NEXT: %m = attn.block_sparse %d, %layout {block_size = 32 : i64}
  %m = attn.block_sparse %d, %layout {block_size = 32 : i64}
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
