// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,lower-to-tile{bwd-dq=ordered head-dim=128}' | filecheck %s --check-prefix=IR
// The Gluon fused backward with its dQ adds in key-block order (bwd-dq=ordered: deterministic),
// under a sliding window, where a query block's first key block is not key block 0. The
// entry computes where the previous key block's query range ends (prev_q_end); the writer
// waits (acquire) for the previous key block's add where that block visits the query block,
// reduces, waits until the reduce's writes are done (not only its reads) and hands the block
// on (release).

// IR:      tile.kernel @attention_bwd_dkdv_dq({{.*}}%dq_acc: !tile.tensor<dq_acc>, %dq_order: !tile.tensor<dq_order>)
// IR:      tile.store_add %dq_part, %dq_acc[loop, all] in_order %dq_order : !tile.tile<n x d x f32> -> !tile.tensor<dq_acc>, !tile.tensor<dq_order>

// CHECK-LABEL: def attention_bwd_dkdv_dq_dq_write(dq_acc_desc, dq_bufs, dq_full, dq_empty, batch, kv_head, q_start, n_blocks, total, group_size, dq_order_ptr, stride_dq_order_b, stride_dq_order_h, stride_dq_order_n, block_id, prev_q_end, BLOCK_N: gl.constexpr, WRITER: gl.constexpr):
// Two writers (dq_writers = 2), each owning one staging buffer and every other step: writer 1
// starts one step on. The wait comes before the wait for the staged part (it overlaps the
// consumer's step); the buffer is freed once the reduce has read it, the block handed on once
// its writes are done; then two steps on.
// CHECK:         start_m = q_start + (n_blocks - 1) * BLOCK_N
// CHECK:         if WRITER > 0:
// CHECK-NEXT:        # The next step
// CHECK-NEXT:        wrap = head + 1 >= first_head + group_size
// CHECK:         for it in range(WRITER, total, 2):
// CHECK-NEXT:        b = WRITER
// CHECK-NEXT:        counter = dq_order_ptr + batch * stride_dq_order_b + head * stride_dq_order_h + start_m * stride_dq_order_n
// CHECK-NEXT:        if (block_id > 0) & (start_m < prev_q_end):
// CHECK-NEXT:            while gl.atomic_add(counter, 0, sem="acquire") != block_id:
// CHECK-NEXT:                pass
// CHECK-NEXT:        mbarrier.wait(dq_full.index(b), (it // 2) & 1)
// CHECK-NEXT:        tma_reduce_add(dq_acc_desc, [batch, head, start_m, 0], dq_bufs.index(b))
// CHECK-NEXT:        tma.store_wait(0)
// CHECK-NEXT:        mbarrier.arrive(dq_empty.index(b), count=1)
// CHECK-NEXT:        tma_writes_wait()
// CHECK-NEXT:        gl.atomic_xchg(counter, block_id + 1, sem="release")
// CHECK-NEXT:        # The next step
// CHECK-NEXT:        wrap = head + 1 >= first_head + group_size
// CHECK-NEXT:        head = gl.where(wrap, first_head, head + 1)
// CHECK-NEXT:        start_m = start_m - wrap.to(gl.int32) * BLOCK_N
// CHECK-NEXT:        # The next step
// CHECK-NEXT:        wrap = head + 1 >= first_head + group_size
// CHECK-NEXT:        head = gl.where(wrap, first_head, head + 1)
// CHECK-NEXT:        start_m = start_m - wrap.to(gl.int32) * BLOCK_N
// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK:         # tile.q_bounds: query blocks that visit this key block (band q_pos + [-255, 0])
// The previous key block's last key is this block's first minus one; its queries end 255 after.
// CHECK:         prev_q_end = tl.minimum(tl.minimum(block_id * BLOCK_M, n_k) - 1 - (n_k - n_q) + 256, n_q)
// CHECK:         (attention_bwd_dkdv_dq_dq_write, (dq_acc_desc, dq_bufs, dq_full, dq_empty, batch, kv_head, q_start, n_blocks, total, group_size, dq_order_ptr, stride_dq_order_b, stride_dq_order_h, stride_dq_order_n, block_id, prev_q_end, BLOCK_N, 0)),
// CHECK-NEXT:    (attention_bwd_dkdv_dq_dq_write, (dq_acc_desc, dq_bufs, dq_full, dq_empty, batch, kv_head, q_start, n_blocks, total, group_size, dq_order_ptr, stride_dq_order_b, stride_dq_order_h, stride_dq_order_n, block_id, prev_q_end, BLOCK_N, 1)),
// CHECK-NEXT:    ], [1, 1, 1], [24, 24, 24])
attn.variant @window(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal, #attn.window<256>]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
