// RUN: not attnfuse-opt %s -p 'place-rope{key=given}' 2>&1 | filecheck %s
// key=given on a key rotated at call-time positions: a given key reads no positions, so the
// pass refuses at the rotation (it used to produce IR its verifier then rejected).
// CHECK: place-rope-given-positions.mlir:[[# @LINE + 4]]:3: error: place-rope: key=given, but this key rotation reads call-time positions
// CHECK-NOT: Traceback
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %kp : !attn.positions<key>) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
