// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64 element-type=f16 block-m=128 block-n=128 backward=false},fold-scale-into-exp,share-offsets,warp-specialize{consumers=3}' -t gluon | filecheck %s
// A sliding window has three key loops (masked, full, masked): one step function, whose
// first and last loops share one mask and so one runtime test; three consumers.

// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, bound_2, sm_scale, n_q, n_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          key_in_bounds = keys < n_k
// CHECK-NEXT:     # tile.scores: q @ k^T came from warpgroup_mma (fp32)
// CHECK-NEXT:     # (the scale, sm_scale, is applied where the scores meet the exponential)
// CHECK-NEXT:     if (start_n < bound_1) | (start_n >= bound_2):
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [-127, 0] and inside the sequence
// CHECK-NEXT:         keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None]) & (keys[None, :] >= q_pos[:, None] - 127)
// CHECK-NEXT:         scores = tl.where(keep, scores, float("-inf"))
// CHECK-NEXT:     # tile.softmax_update: online softmax step
// CHECK-NOT:      tile.mask
// CHECK:          return probs, alpha, row_max, row_sum
// CHECK-NOT:  def attention_fwd_step
// CHECK:          probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, bound_2, sm_scale, n_q, n_k, ROWS, BLOCK_N, S_LAYOUT)
// CHECK:          BLOCK_M: gl.constexpr = 192,
// CHECK:          CONSUMERS: gl.constexpr = 3,
// CHECK:          (attention_fwd_consume, ({{.*}}, full_start, full_end, sm_scale, n_q, n_k, 2, ROWS, BLOCK_N, HEAD_DIM, STAGES)),
// CHECK:      ], [4, 4, 1], [160, 160, 24])

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal, #attn.window<128>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
