// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize{persistent=true}' -t gluon | filecheck %s --check-prefix=PERSISTENT
// An additive bias in the Gluon forward: a consumer loads the block's bias tile through the
// bias's pointer and strides (broadcast axes have stride 0) right after issuing the block's
// q @ k^T, so the loads run beside the product; the score step adds it. The load points
// `bias_base` at its tile's (batch, head) slice itself, so the persistent grid's per-tile
// coordinates reach it as the plain grid's do.

// The load, in the scores' layout: entries outside the sequences read 0 (masked or discarded afterwards).
// CHECK:      def attention_fwd_bias(start_n, row_start, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, n_q, n_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
// CHECK:          keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
// CHECK:          bias_base = bias_ptr + batch * stride_bias_b + head * stride_bias_h
// CHECK:          bias_tile = tl.load(bias_base + rows[:, None] * stride_bias_n + keys[None, :] * stride_bias_d, mask=row_in_bounds[:, None] & key_in_bounds[None, :], other=0.0)
// CHECK-NEXT:     return bias_tile

// One step for both key loops: the bias is added before the diagonal loop's mask.
// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, bias_tile, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          scores = scores * sm_scale
// CHECK-NEXT:     # tile.add_bias: bias[batch, head, query, key], loaded beside the block's product
// CHECK-NEXT:     scores = scores + bias_tile.to(tl.float32)
// CHECK-NEXT:     if start_n >= bound_1:
// CHECK-NEXT:         # tile.mask
// CHECK:          # tile.softmax_update
// CHECK-NOT:      tile.softmax_update

// The consumer loads block j's bias between issuing S_j (and P_{j-1} @ v_{j-1}) and waiting for S_j.
// CHECK:      def attention_fwd_consume(o_desc, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d,
// CHECK:          scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(0))
// CHECK-NEXT:     bias_tile = attention_fwd_bias(start_n, row_start, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, n_q, n_k, ROWS, BLOCK_N, S_LAYOUT)
// CHECK-NEXT:     scores = warpgroup_mma_wait(0, deps=(scores,))
// CHECK:              acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(prev)), acc, is_async=True)
// CHECK-NEXT:         bias_tile = attention_fwd_bias(start_n, row_start, batch, head,
// CHECK:              scores = warpgroup_mma_wait(1, deps=(scores,))
// CHECK:              probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, bias_tile, ROWS, BLOCK_N, S_LAYOUT)

// PERSISTENT:      def attention_fwd_bias(
// PERSISTENT:      def attention_fwd_consume(
// PERSISTENT:          for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
// PERSISTENT:              bias_tile = attention_fwd_bias(start_n, row_start, batch, head,
// PERSISTENT:                  bias_tile = attention_fwd_bias(start_n, row_start, batch, head,
// PERSISTENT:                  scores = warpgroup_mma_wait(1, deps=(scores,))
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias) -> !attn.output {
  %s = attn.scores %q, %k
  %b = attn.add_bias %s, %bias
  %m = attn.mask %b [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
