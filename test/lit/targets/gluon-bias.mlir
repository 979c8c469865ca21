// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize' -t gluon | filecheck %s
// An additive bias in the Gluon forward: the score step reads the block's bias through its
// pointer and strides (broadcast dims have stride 0), under the same bounds the portable
// kernel uses. The step points `bias_base` at its tile's (batch, head) slice itself, so the
// persistent grid's per-tile coordinates reach it the same way.

// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          bias_base = bias_ptr + batch * stride_bias_b + head * stride_bias_h
// A full key block needs no key bounds; a block of the diagonal loop does, and then its mask.
// CHECK:          if start_n < bound_1:
// CHECK:              bias_block = tl.load(bias_base + rows[:, None] * stride_bias_n + keys[None, :] * stride_bias_d, mask=row_in_bounds[:, None], other=0.0).to(tl.float32)
// CHECK-NEXT:         scores = scores + bias_block
// CHECK-NEXT:     elif start_n >= bound_1:
// CHECK:              bias_block = tl.load(bias_base + rows[:, None] * stride_bias_n + keys[None, :] * stride_bias_d, mask=row_in_bounds[:, None] & key_in_bounds[None, :], other=0.0).to(tl.float32)
// CHECK-NEXT:         scores = scores + bias_block
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// The softmax step once, after both.
// CHECK:          # tile.softmax_update
// CHECK-NOT:      tile.softmax_update

// The consumer passes its tile's coordinates and the bias's pointer and strides to the step.
// CHECK:      def attention_fwd_consume(o_desc, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d,
// CHECK:          probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, ROWS, BLOCK_N, S_LAYOUT)
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %m = attn.mask %b [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
