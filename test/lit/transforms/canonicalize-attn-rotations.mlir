// RUN: attnfuse-opt %s -p canonicalize-attn | filecheck %s
// RUN: attnfuse-opt %s -p canonicalize-attn,canonicalize-attn | filecheck %s
// The rotations are independent: written key first, they canonicalize to the DSL's order
// (query first), so equal programs give equal canonical IR (the compile cache's key).
// CHECK: attn.variant @key_first
// CHECK-NEXT: %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
// CHECK-NEXT: %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
// CHECK-NEXT: %s = attn.scores %qr, %kr
attn.variant @key_first(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>) -> !attn.output {
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
