// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{key=pre_rotated},lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// Query rotated in registers, key pre-rotated: the rotated halves are joined once, and each
// key step is a single full-width product.

// CHECK:      def attention_fwd(
// CHECK:      q_lo_rot = (q_lo_f32 * cos - q_hi_f32 * sin).to(q_lo.dtype)
// CHECK:      # tile.join: back to full width (halves side by side), once per program
// CHECK-NEXT: q_rot = tl.reshape(tl.permute(tl.join(q_lo_rot, q_hi_rot), (0, 2, 1)), (BLOCK_M, BLOCK_D))
// CHECK:      for start_n in range(kv_start, full_end, BLOCK_N):
// CHECK:          k = tl.load(k_rot_base + keys[:, None] * stride_k_rot_n + (cols_d)[None, :] * stride_k_rot_d)
// CHECK-NEXT:     # tile.scores
// CHECK-NEXT:     scores = tl.dot(q_rot, tl.trans(k))
// CHECK-NEXT:     # (the scale, sm_scale, is applied where the scores meet the exponential)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
