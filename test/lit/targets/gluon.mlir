// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 block-m=128 block-n=128 backward=false},fold-scale-into-exp,share-offsets,warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=256 element-type=bf16 block-m=128 block-n=128 backward=false},fold-scale-into-exp,share-offsets,warp-specialize' -t gluon | filecheck %s --check-prefix=D256
// The Gluon target prints a flash-shaped forward as a warp-specialized Hopper kernel: one
// score-step function (printed by the portable target's op printers), a TMA
// loader partition, a consumer partition running warpgroup MMAs, and the entry kernel.

// At head dim 256 the schedule's default is 64-key blocks (what fits shared memory), and the
// PV product's instruction spans the whole head dim.
// D256:      instr_shape=[16, HEAD_DIM, 16]
// D256:      BLOCK_N: gl.constexpr = 64,
// D256-NEXT: HEAD_DIM: gl.constexpr = 256,

// CHECK:      from triton.experimental.gluon.language.nvidia.hopper import (
// CHECK:      tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
// Descriptors cover [B, H, N, D] with [1, 1, rows, D] blocks; the products read 2-D views.
// CHECK:      def tile_2d(buffer):

// Soft-capping calls the tanh helper, printed once as a Gluon function.
// CHECK:      @gluon.jit
// CHECK-NEXT: def _tanh(x):

// One step function for every key loop: the scale and the soft-cap once, the causal mask and
// the key bounds only for a block of the diagonal loop (a runtime test of its start), then
// the online softmax once.
// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK:          rows = row_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, S_LAYOUT))
// CHECK:          keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_LAYOUT))
// CHECK-NEXT:     key_in_bounds = keys < n_k
// CHECK:          scores = scores * sm_scale
// CHECK-NEXT:     # tile.map over (scores), entry by entry
// CHECK-NEXT:     scores = (_tanh((scores / 30.0)) * 30.0)
// CHECK-NEXT:     if start_n >= bound_1:
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK-NEXT:         keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None])
// CHECK-NEXT:         scores = tl.where(keep, scores, float("-inf"))
// The row max is kept in base-2 units: no log2(e) multiply per row on the way to the exponentials.
// CHECK-NEXT:     # tile.softmax_update: online softmax step, the row max in base-2 units
// CHECK-NEXT:     row_max_new = tl.maximum(row_max, tl.max(scores, 1) * 1.4426950408889634)
// CHECK:          probs = tl.math.exp2(scores * 1.4426950408889634 - row_max_new[:, None])
// CHECK-NEXT:     alpha = tl.math.exp2(row_max - row_max_new)
// CHECK:          return probs, alpha, row_max, row_sum
// CHECK-NOT:  def attention_fwd_step

// The producer: each consumer's q tile once, then k and v of every block into the ring.
// CHECK:      def attention_fwd_load(
// CHECK:          tma_load(q_desc, [batch, head, q_start, 0], q_bars.index(0), q_bufs.index(0))
// CHECK:          for j in range(n_blocks):
// CHECK:              mbarrier.wait(k_empty.index(stage), phase ^ 1)
// CHECK:              tma_load(k_desc, [batch, kv_head, start_n, 0], k_ready.index(stage), k_bufs.index(stage))
// CHECK:                  tma_load(q_desc, [batch, head, q_start + c * ROWS, 0], q_bars.index(c), q_bufs.index(c))
// CHECK:              tma_load(v_desc, [batch, kv_head, start_n, 0], v_ready.index(stage), v_bufs.index(stage))

// A consumer warpgroup picks each block's step by the loop bounds; S_j overlaps P_{j-1} @ v_{j-1};
// it finalizes and stores its own rows. P is first defined by block 0's step, and the key loop
// and the last product sit under the same test of n_blocks (no zeros P before it: ptxas then
// copied P's registers every step).
// CHECK:      def attention_fwd_consume(o_desc, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n, q_bufs,
// CHECK-NOT:      p_op = gl.zeros
// CHECK:          if n_blocks > 0:
// CHECK:              p_op = gl.convert_layout(probs.to(dtype), P_LAYOUT)
// CHECK-NEXT:         for j in range(1, n_blocks):
// CHECK:              scores = warpgroup_mma(q_tile, tile_2d(k_bufs.index(stage)).permute((1, 0)), s_zero, use_acc=False, is_async=True)
// CHECK-NEXT:         acc = warpgroup_mma(p_op, tile_2d(v_bufs.index(prev)), acc, is_async=True)
// CHECK-NEXT:         # Groups complete in issue order: one outstanding means S_j is done.
// CHECK-NEXT:         scores = warpgroup_mma_wait(1, deps=(scores,))
// CHECK-NEXT:         mbarrier.arrive(k_empty.index(stage), count=1)
// CHECK-NEXT:         probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, ROWS, BLOCK_N, S_LAYOUT)
// CHECK:              mbarrier.wait(q_bars.index(WG), 0)
// CHECK-NEXT:         acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
// CHECK:              p_op = p_next
// CHECK-NEXT:         last = (n_blocks - 1) % STAGES
// CHECK:          lse = tl.where(has_keys, (row_max + tl.math.log2(row_sum_safe)) * 0.6931471805599453, float("-inf"))
// CHECK:          tl.store(lse_ptr + batch * stride_lse_b + head * stride_lse_h + rows * stride_lse_n, lse, mask=row_in_bounds)
// CHECK:              tma_store(o_desc, [batch, head, row_start, 0], q_smem)

// The entry: descriptors first, then the other roles as the portable target passes them; one
// partition per consumer warpgroup (the first is the kernel's own warps), then the producer.
// CHECK:      def attention_fwd(
// CHECK-NEXT:     q_desc,
// CHECK-NEXT:     k_desc,
// CHECK-NEXT:     v_desc,
// CHECK-NEXT:     o_desc,
// CHECK-NEXT:     lse_ptr,
// CHECK:          CONSUMERS: gl.constexpr = 2,
// CHECK:          full_end = tl.minimum(tl.maximum(full_end, full_start), kv_end)
// CHECK:          mbarrier.init(k_empty.index(i), count=CONSUMERS)
// CHECK:          gl.warp_specialize([
// CHECK-NEXT:         (attention_fwd_consume, ({{.*}}, 0, ROWS, BLOCK_N, HEAD_DIM, STAGES)),
// CHECK-NEXT:         (attention_fwd_consume, ({{.*}}, 1, ROWS, BLOCK_N, HEAD_DIM, STAGES)),
// CHECK-NEXT:         (attention_fwd_load, (
// CHECK-NEXT:     ], [4, 1], [240, 24])

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 3.000000e+01 : f64}
  %m = attn.mask %c [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
