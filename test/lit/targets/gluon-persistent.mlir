// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 block-m=128 block-n=128 backward=false},fold-scale-into-exp,share-offsets,warp-specialize{persistent=true}' -t gluon | filecheck %s
// A persistent kernel (one program per SM walking the tiles): a tile function with the key
// bounds and the head's ALiBi slope, and partitions that loop over the program's tiles with
// the k/v ring's position running on across them.

// Tile t: batch x head t % batch_heads, the last query blocks first (causal: most keys).
// CHECK:      def attention_fwd_tile(t, n_q, n_k, num_heads, group_size, batch_heads, slopes_ptr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
// CHECK-NEXT:     n_row_blocks = (n_q + BLOCK_M - 1) // BLOCK_M
// CHECK-NEXT:     batch_head = t % batch_heads
// CHECK-NEXT:     block_id = n_row_blocks - 1 - t // batch_heads
// CHECK:          slope = tl.load(slopes_ptr + head)
// CHECK:          # tile.kv_bounds: key blocks this query block visits (band q_pos + [None, 0])
// CHECK:          n_blocks = (kv_end - kv_start + BLOCK_N - 1) // BLOCK_N
// CHECK-NEXT:     return batch, head, kv_head, q_start, kv_start, n_blocks, full_end, slope

// CHECK:      def attention_fwd_step(

// The producer: a consumer's q once its buffer is free, then k and v at the ring's position.
// CHECK:      def attention_fwd_load(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_bars, q_empty, k_ready, k_empty, v_ready, v_empty, n_q, n_k, num_heads, group_size, batch_heads, slopes_ptr, CONSUMERS: gl.constexpr,
// CHECK:          for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
// CHECK-NEXT:         batch, head, kv_head, q_start, kv_start, n_blocks, bound_1, slope = attention_fwd_tile(t, n_q, n_k, num_heads, group_size, batch_heads, slopes_ptr, BLOCK_M, BLOCK_N)
// CHECK-NEXT:         if n_blocks > 0:
// CHECK-NEXT:             mbarrier.wait(q_empty.index(0), (q_count & 1) ^ 1)
// CHECK:                  c = kv_count + j
// CHECK-NEXT:             stage = c % STAGES
// CHECK:                      mbarrier.wait(q_empty.index(w), (q_count & 1) ^ 1)
// CHECK:              kv_count += n_blocks
// CHECK-NEXT:         if n_blocks > 0:
// CHECK-NEXT:             q_count += 1

// A consumer: per tile, q at its tile's phase; the key loop and the last product under one test of
// n_blocks (P first defined by block 0's step); q released after the last S; o through its own buffer.
// CHECK:      def attention_fwd_consume(o_desc, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n, slopes_ptr, q_bufs, o_bufs,
// CHECK:          for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
// CHECK:                  mbarrier.wait(q_bars.index(WG), q_count & 1)
// CHECK:                  probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, row_start, bound_1, sm_scale, n_q, n_k, slope, ROWS, BLOCK_N, S_LAYOUT)
// CHECK:                  mbarrier.wait(always, 0)
// CHECK-NEXT:             acc, p_op = warpgroup_mma_wait(0, deps=(acc, p_op))
// CHECK:                      p_op = p_next
// CHECK-NEXT:             # Every S product of this tile is done: the producer may copy the next tile's q.
// CHECK-NEXT:             mbarrier.arrive(q_empty.index(WG), count=1)
// CHECK:                  tma_store(o_desc, [batch, head, row_start, 0], o_smem)
// CHECK:              kv_count += n_blocks

// The entry: batch_heads after group_size, an o buffer per consumer, a q_empty barrier per consumer.
// CHECK:      def attention_fwd(
// CHECK:          group_size,
// CHECK-NEXT:     batch_heads,
// CHECK:          o_bufs = gl.allocate_shared_memory(dtype, [CONSUMERS, 1, 1, ROWS, HEAD_DIM], o_desc.layout)
// CHECK:          mbarrier.init(q_empty.index(c), count=1)
// CHECK:          mbarrier.arrive(always, count=1)
// CHECK:      ], [4, 1], [240, 24])

attn.variant @attention(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %a = attn.alibi %s
  %m = attn.mask %a [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
