// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{key=fused},lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// RUN: attnfuse-opt %S/../inputs/rope.mlir -p 'canonicalize-attn,analyze-masks,place-rope{key=fused},lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' -t triton | filecheck %s --check-prefix=DEFAULT

// RoPE at call-time positions: each rotation reads its rows' positions, and clamps the table
// row to the table (its length from the contiguous [2, L, R/2] table's strides), so a position
// the runtime did not see (a write through .data) never reads past the table. Rotations at the
// default positions (the second run, inputs/rope.mlir) need no clamp: the table covers
// max(Nq, Nk).
// DEFAULT:     # tile.rotate: RoPE at query positions
// DEFAULT-NOT: stride_rope_table_c //
// CHECK:      def attention_fwd(
// CHECK:        # tile.rotate: RoPE at query positions, in fp32, pairs (q_lo, q_hi)
// CHECK-NEXT:   q_positions_rows = tl.load(q_positions_base + rows * stride_q_positions_n, mask=row_in_bounds, other=0)
// CHECK-NEXT:   table_rows = tl.abs(q_positions_rows)
// CHECK-NEXT:   table_rows = tl.maximum(tl.minimum(table_rows, stride_rope_table_c // stride_rope_table_n - 1), 0)
// CHECK-NEXT:   cos = tl.load(rope_table_ptr + table_rows[:, None] * stride_rope_table_n
// CHECK:          # tile.rotate: RoPE at key positions, in fp32, pairs (k_lo, k_hi)
// CHECK:          table_rows_1 = tl.maximum(tl.minimum(table_rows_1, stride_rope_table_c // stride_rope_table_n - 1), 0)
// CHECK:      def attention_bwd_dkdv(
// CHECK:        table_rows{{.*}} = tl.maximum(tl.minimum(table_rows{{.*}}, stride_rope_table_c // stride_rope_table_n - 1), 0)
attn.variant @given(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>, %kp : !attn.positions<key>) -> !attn.output {
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %s = attn.scores %qr, %kr
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
