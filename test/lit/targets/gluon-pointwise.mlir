// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false},warp-specialize{persistent=true}' -t gluon | filecheck %s --check-prefix=PERSISTENT
// RUN: sed 's/attn.sigmoid/attn.relu/' %s | attnfuse-opt -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 element-type=f16 backward=false},warp-specialize{consumers=3}' -t gluon | filecheck %s --check-prefix=RELU
// A pointwise normalizer (here sigmoid, under a causal band) is flash-shaped without the
// softmax's state: the step turns the scores into weights and returns them alone, the consumer
// adds p @ v to an accumulator it never rescales, and o is that accumulator (no finalize, no lse).

// The scale and the causal mask as in a softmax kernel, then sigmoid(s - ln(Nk)) in place.
// CHECK:      def attention_fwd_step(scores, start_n, row_start, bound_1, sm_scale, n_q, n_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          scores = scores * sm_scale
// CHECK-NEXT:     if start_n >= bound_1:
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK:          num_keys = n_k * 1.0
// CHECK-NEXT:     # tile.map over (scores, num_keys), entry by entry
// CHECK-NEXT:     scores = (1.0 / (1.0 + tl.exp((-(scores + (-tl.log(num_keys)))))))
// CHECK-NEXT:     return scores
// CHECK-NOT:      tile.softmax_update

// No row statistics and no rescale anywhere in the consumer, down to its store of acc.
// CHECK:      def attention_fwd_consume(o_desc, q_bufs,
// CHECK-NOT:      {{row_max|row_sum|alpha|lse_ptr}}
// CHECK:          probs = attention_fwd_step(scores, start_n, row_start, bound_1, sm_scale, n_q, n_k, ROWS, BLOCK_N, S_LAYOUT)
// CHECK-NOT:      {{row_max|row_sum|alpha|lse_ptr}}
// CHECK:          # tile.accumulate of block j-1 (acc + p @ v), issued behind S_j.
// CHECK-NEXT:     scores = warpgroup_mma(q_tile,
// CHECK-NEXT:     acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(prev)), acc, is_async=True)
// CHECK-NOT:      {{row_max|row_sum|alpha|lse_ptr}}
// CHECK:          q_tile.store(acc.to(dtype))

// ReLU at head dim 64 (three consumers): relu(s) / Nk, NaN kept, as the portable target prints it.
// RELU:      def attention_fwd_step(scores, start_n, row_start, bound_1, sm_scale, n_q, n_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// RELU:          # tile.relu_probs: relu(s) / Nk (dropped keys are -inf: weight 0)
// RELU-NEXT:     scores = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL) / n_k
// RELU-NEXT:     return scores
// RELU:      def attention_fwd_consume(o_desc, q_bufs,
// RELU-NOT:      {{row_max|alpha|lse_ptr}}
// RELU:          q_tile.store(acc.to(dtype))
// RELU:      ], [4, 4, 1], [160, 160, 24])

// The persistent grid's consumer is the same per tile.
// PERSISTENT:      def attention_fwd_consume(o_desc, q_bufs,
// PERSISTENT-NOT:      {{row_max|row_sum|alpha|lse_ptr}}
// PERSISTENT:          probs = attention_fwd_step(
// PERSISTENT-NOT:      {{row_max|row_sum|alpha|lse_ptr}}
// PERSISTENT:          o_tile.store(acc.to(dtype))
attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.sigmoid %m
  %o = attn.pv %p, %v
  attn.yield %o
}
