// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 backward=false}' -t triton | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize' -t gluon | filecheck %s --check-prefix=GLUON
// The online softmax's state as both targets print it (docs/semantics.md, "Additive bias";
// attn.SOFTMAX_FLOOR = -2^23): the row max starts at the floor, not -inf, so the step has no
// select for a row with no kept key yet and a row whose scores all lie far below the floor
// weighs nothing; finalize takes a row sum under fp32's smallest normal number for an empty
// row's, with a negated `<` so that a NaN sum stays NaN. Both carry the row max in base-2
// units (the max of the scores times the exponent's factor, the product each weight's exponent
// takes): the floor times log2(e).

// CHECK:      row_max = tl.full([BLOCK_M], -12102203.161561485, dtype=tl.float32)
// CHECK:      row_max_new = tl.maximum(row_max, tl.max(scores, 1) * 1.4426950408889634)
// CHECK-NEXT: probs = tl.math.exp2(scores * 1.4426950408889634 - row_max_new[:, None])
// CHECK-NEXT: alpha = tl.math.exp2(row_max - row_max_new)
// CHECK-NOT:  row_max_safe
// CHECK:      has_keys = ~(row_sum < 1.1754943508222875e-38)
// CHECK-NEXT: row_sum_safe = tl.where(has_keys, row_sum, 1.0)

// GLUON:      def attention_fwd_step(
// GLUON:          row_max_new = tl.maximum(row_max, tl.max(scores, 1) * {{.*}})
// GLUON-NEXT:     probs = tl.math.exp2(scores * {{.*}} - row_max_new[:, None])
// GLUON-NEXT:     alpha = tl.math.exp2(row_max - row_max_new)
// GLUON:      def attention_fwd_consume(
// GLUON:          row_max = gl.full([ROWS], -12102203.161561485, gl.float32, layout=gl.SliceLayout(1, S_LAYOUT))  # the softmax's floor
// GLUON:          has_keys = ~(row_sum < 1.1754943508222875e-38)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %p = attn.softmax %s
  %o = attn.pv %p, %v
  attn.yield %o
}
