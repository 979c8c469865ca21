// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false block-m=128 block-n=128},warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false block-m=128 block-n=128},warp-specialize{consumers=3}' | filecheck %s --check-prefix=OTHER
// A block-sparse forward on the Gluon target (flash_shape's listed kernels): the two
// tile.sparse_kv_loop (full blocks, then partial ones) are one pipelined range of steps. The
// schedule keeps the lowered 128 x 128 tiles (the lists name them): two consumers; each step
// takes its key block from its list (`_block_start`), and the step function tells the
// partial blocks' masks by the step's index against the full list's count (bound_1).

// CHECK:      def attention_fwd_block_start(j, full_blocks_base, stride_full_blocks_d, partial_blocks_base, stride_partial_blocks_d, bound_1, BLOCK_N: gl.constexpr):
// CHECK-NEXT:     # tile.sparse_kv_loop: the step's entry of its list
// CHECK-NEXT:     if j < bound_1:
// CHECK-NEXT:         block = tl.load(full_blocks_base + j * stride_full_blocks_d)
// CHECK-NEXT:     else:
// CHECK-NEXT:         block = tl.load(partial_blocks_base + (j - bound_1) * stride_partial_blocks_d)
// CHECK-NEXT:     return block * BLOCK_N
// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, step, row_start, bound_1,
// CHECK:          if step >= bound_1:
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK:      def attention_fwd_load(
// CHECK:          start_n = attention_fwd_block_start(j, full_blocks_base, stride_full_blocks_d, partial_blocks_base, stride_partial_blocks_d, bound_1, BLOCK_N)
// CHECK-NEXT:     mbarrier.wait(k_empty.index(stage), phase ^ 1)
// CHECK:      def attention_fwd_consume(
// CHECK:          start_n = attention_fwd_block_start(0,
// CHECK-NEXT:     step = 0
// CHECK:              start_n = attention_fwd_block_start(j,
// CHECK-NEXT:         step = j
// CHECK:      def attention_fwd(
// CHECK:          BLOCK_M: gl.constexpr = 128,
// CHECK-NEXT:     BLOCK_N: gl.constexpr = 128,
// CHECK:          full_blocks_base = full_blocks_ptr + batch * stride_full_blocks_b + head * stride_full_blocks_h + block_id * stride_full_blocks_n
// CHECK:          count_0 = tl.load(full_count_base)
// CHECK:          count_1 = tl.load(partial_count_base)
// CHECK-NEXT:     n_blocks = count_0 + count_1
// CHECK-NEXT:     bound_1 = count_0
// CHECK:          ], [4, 1], [240, 24])

// Options asking for other tiles than the lists' leave the kernel to the portable schedule.
// OTHER:      tile.kernel @attention_fwd(
// OTHER-NOT:  schedule = #tile<schedule warp_specialized>
// OTHER:      tile.return
attn.variant @sparse_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %l = attn.block_sparse %m, %layout {block_size = 128 : i64}
  %p = attn.softmax %l
  %o = attn.pv %p, %v
  attn.yield %o
}
