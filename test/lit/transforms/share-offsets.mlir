// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=64},share-offsets' | filecheck %s
// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=pre_rotated key=pre_rotated},lower-to-tile{head-dim=64 head-dim-v=32},share-offsets' | filecheck %s --check-prefix=DV

// The dK/dV kernel loads full rows of dO and of the rotated q in its query loop: dO's loads
// may reuse q_rot's offsets. Query-block kernels are left alone.
// CHECK-NOT:   shared_offsets
// CHECK:       tile.kernel @attention_bwd_dkdv
// CHECK-SAME:    shared_offsets = ["do", "q_rot"]
// CHECK-NOT:   shared_offsets
// With another value head dim the rows differ in width: nothing is shared.
// DV-NOT:      shared_offsets
attn.variant @rope(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
