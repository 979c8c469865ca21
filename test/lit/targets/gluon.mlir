// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 block-m=128 block-n=128 backward=false},fold-scale-into-exp,share-offsets' -t gluon | filecheck %s
// The Gluon target prints a flash-shaped forward as a warp-specialized Hopper kernel: one
// score-step function per key loop (printed by the portable target's op printers), a TMA
// loader partition, a consumer partition running warpgroup MMAs, and the entry kernel.

// CHECK:      from triton.experimental.gluon.language.nvidia.hopper import (
// CHECK:      tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

// Soft-capping calls the tanh helper, printed once as a Gluon function.
// CHECK:      @gluon.jit
// CHECK-NEXT: def _tanh(x):

// The full key blocks: scale, soft-cap, online softmax; no mask.
// CHECK:      def attention_fwd_step_0(scores, row_max, row_sum, start_n, block_id, sm_scale, n_q, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
// CHECK:          scores = scores * sm_scale
// CHECK-NEXT:     # tile.map over (scores), entry by entry
// CHECK-NEXT:     scores = (_tanh((scores / 30.0)) * 30.0)
// CHECK-NOT:      tile.mask
// CHECK:          probs = tl.math.exp2(
// CHECK:          return probs, alpha, row_max, row_sum

// The diagonal blocks: the same, then the causal mask and the key bounds.
// CHECK:      def attention_fwd_step_1(
// CHECK:          key_in_bounds = keys < n_k
// CHECK:          keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None])
// CHECK:          return probs_1, alpha_1, row_max, row_sum

// The producer: q once, then k and v of every block into the ring, behind empty barriers.
// CHECK:      def attention_fwd_load(
// CHECK:          tma_load(q_desc, [q_row, 0], q_bar, q_smem)
// CHECK:          for j in range(n_blocks):
// CHECK:              mbarrier.wait(k_empty.index(stage), phase ^ 1)
// CHECK:              tma_load(k_desc, [kv_row + start_n, 0], k_ready.index(stage), k_bufs.index(stage))
// CHECK:              tma_load(v_desc, [kv_row + start_n, 0], v_ready.index(stage), v_bufs.index(stage))

// The consumers pick each block's step by the loop bounds; S_j overlaps P_{j-1} @ v_{j-1}.
// CHECK:      def attention_fwd_consume(
// CHECK:          for j in range(1, n_blocks):
// CHECK:              scores = warpgroup_mma(q_smem, k_bufs.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
// CHECK:              acc = warpgroup_mma(p_op, v_bufs.index(prev), acc, is_async=True)
// CHECK-NEXT:         # Groups complete in issue order: one outstanding means S_j is done.
// CHECK-NEXT:         scores = warpgroup_mma_wait(1, deps=(scores,))
// CHECK-NEXT:         mbarrier.arrive(k_empty.index(stage), count=1)
// CHECK-NEXT:         if start_n < bound_1:
// CHECK-NEXT:             probs, alpha, row_max, row_sum = attention_fwd_step_0(
// CHECK-NEXT:         else:
// CHECK-NEXT:             probs, alpha, row_max, row_sum = attention_fwd_step_1(
// CHECK-NEXT:         acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))

// The entry: descriptors first, then the other roles as the portable target passes them.
// CHECK:      def attention_fwd(
// CHECK-NEXT:     q_desc,
// CHECK-NEXT:     k_desc,
// CHECK-NEXT:     v_desc,
// CHECK-NEXT:     o_desc,
// CHECK-NEXT:     lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n,
// CHECK-NEXT:     sm_scale,
// CHECK:          full_end = tl.minimum(tl.maximum(full_end, full_start), kv_end)
// CHECK:          ], [1], [24])
// CHECK:          lse = tl.where(has_keys, row_max + tl.math.log2(row_sum_safe) * 0.6931471805599453, float("-inf"))
// CHECK:          tma_store(o_desc, [q_row, 0], q_smem)

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 3.000000e+01 : f64}
  %m = attn.mask %c [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
