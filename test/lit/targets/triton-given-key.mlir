// RUN: attnfuse-opt %S/../inputs/given-key.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// A given key rotation in Triton: the keys are loaded and multiplied as passed, and dK is
// stored as accumulated. Only the query (and dQ, by the transpose) is rotated.

// CHECK-NOT:  def rotate_key(
// CHECK:      def rotate_query(
// CHECK:        # tile.rotate: RoPE at query positions, in fp32, pairs (q_lo, q_hi)
// CHECK:      def attention_fwd(
// CHECK-NEXT:     q_ptr, stride_q_b, stride_q_h, stride_q_n, stride_q_d,
// CHECK-NEXT:     k_ptr, stride_k_b, stride_k_h, stride_k_n, stride_k_d,
// CHECK:        # tile.rotate: RoPE at query positions, in fp32, pairs (q_lo, q_hi)
// CHECK:          # tile.load: k rows (loop), all columns
// CHECK-NOT:      # tile.rotate
// CHECK:          # tile.scores: q @ k^T
// CHECK:      def attention_bwd_dkdv(
// CHECK:        # tile.load: k rows (program), all columns
// CHECK:        dk_1 = dk * sm_scale
// CHECK-NEXT:   # tile.store: dk rows (program), all columns
// CHECK-NOT:  RoPE at key positions
