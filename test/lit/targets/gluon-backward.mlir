// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=fused head-dim=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// The Gluon target's fused backward (lowering/gluon_backward.py). Causal: one pipelined
// range over the three query loops, whose masks run under a test of the step's start; the
// score step and the gradient step are the portable printers' code; the dQ parts go to the
// writer partition's TMA reduce-adds; dK and dV leave by TMA stores.

// CHECK-LABEL: def attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, n_start, bound_1, bound_2, sm_scale, n_q, n_k,
// lse's guards run with the masks, under the masked loops' test; a full step runs its own, for
// rows with no weight (scores all far below the softmax's floor: lse = -inf).
// CHECK-NOT:     lse_log2 = gl.where
// CHECK:         if (start_m < bound_1) | (start_m >= bound_2):
// CHECK-NEXT:        # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK-NEXT:        keep = query_in_bounds[None, :] & row_in_bounds[:, None] & (rows[:, None] <= q_pos[None, :])
// CHECK-NEXT:        scores = tl.where(keep, scores, float("-inf"))
// CHECK:             lse_log2 = gl.where(query_in_bounds & (lse_log2 != float("-inf")), lse_log2, float("inf"))
// CHECK-NEXT:    elif (start_m >= bound_1) & (start_m < bound_2):
// CHECK-NEXT:        # A row with no weight (lse = -inf: below the softmax's floor, or no kept key) gives 0.
// CHECK-NEXT:        lse_log2 = gl.where(lse_log2 == float("-inf"), float("inf"), lse_log2)
// CHECK-NEXT:    # tile.recompute_probs: p = exp(s - lse)
// CHECK-NEXT:    probs = tl.math.exp2(scores * (sm_scale * 1.4426950408889634) - lse_log2[None, :])
// CHECK-NEXT:    return probs
// CHECK-LABEL: def attention_bwd_dkdv_dq_grads(probs, grad_probs, delta,
// CHECK-NOT:     delta = gl.where
// CHECK:         grad_scores = probs * (grad_probs - delta[None, :])
// CHECK-NEXT:    return grad_scores
// CHECK-LABEL: def attention_bwd_dkdv_dq_load(
// Each head's rows of the flat lse / delta start at a multiple of 4 (16 bytes, where TMA may start).
// CHECK:         n_rows = (n_q + 3) // 4 * 4
// CHECK:           row = (batch * num_heads * group_size + head) * n_rows + start_m
// CHECK:         tma_load(lse_desc, [row], ready.index(stage), lse_bufs.index(stage))
// Unordered (bwd-dq=fused): the writer reduces each part as it comes.
// CHECK-LABEL: def attention_bwd_dkdv_dq_dq_write(
// CHECK-NOT:     dq_order
// CHECK:         tma_reduce_add(dq_acc_desc, [batch, head, start_m, 0], dq_bufs.index(b))
// CHECK-NEXT:    tma.store_wait(0)
// CHECK-NEXT:    mbarrier.arrive(dq_empty.index(b), count=1)
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// Each step's head and query block are carried from step to step (no division by n_blocks):
// the query blocks from the last down, every head of the group at each.
// CHECK:         first_head = kv_head * group_size
// CHECK-NEXT:    head = first_head
// CHECK-NEXT:    start_m = q_start + (n_blocks - 1) * BLOCK_N
// CHECK-NEXT:    for it in range(total):
// CHECK-NOT:         // n_blocks
// CHECK:         scores = warpgroup_mma(k_tile, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
// CHECK-NEXT:    grad_probs = warpgroup_mma(v_tile, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
// lse is scaled to log2 units as it is loaded, while the products run (the probe's way).
// CHECK:         lse_log2 = lse_bufs.index(stage).load(gl.SliceLayout(0, S_LAYOUT)) * 1.4426950408889634
// CHECK:         probs = attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, n_start, bound_1, bound_2,
// CHECK:         dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
// CHECK:         grad_scores = attention_bwd_dkdv_dq_grads(probs, grad_probs, delta,
// CHECK:         dk = warpgroup_mma(ds_op, q_s, dk, is_async=True)
// CHECK:         dq_part = warpgroup_mma(ds_smem.permute((1, 0)), k_tile, dq_zero, use_acc=False, is_async=True)
// CHECK:         tile_2d(dq_bufs.index(b)).store(dq_part)
// CHECK:             wrap = head + 1 >= first_head + group_size
// CHECK-NEXT:        head = gl.where(wrap, first_head, head + 1)
// CHECK-NEXT:        start_m = start_m - wrap.to(gl.int32) * BLOCK_N
// CHECK:         dk_1 = dk * sm_scale
// CHECK:         tma_store(dk_desc, [batch, kv_head, n_start, 0], k_smem)
// CHECK:         tma_store(dv_desc, [batch, kv_head, n_start, 0], v_smem)
// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK:         n_blocks = (q_end - q_start + BLOCK_N - 1) // BLOCK_N
// CHECK:         gl.warp_specialize([
// CHECK-NEXT:        (attention_bwd_dkdv_dq_consume,
// CHECK-NEXT:        (attention_bwd_dkdv_dq_load,
// CHECK-NEXT:        (attention_bwd_dkdv_dq_dq_write,
// CHECK:         # Not warp-specialized (printed by -t triton): attention_bwd_preprocess, attention_bwd_dq_finish
attn.variant @causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// RoPE (pre-rotated q and k): dK is rotated back by halves, through the dQ staging buffers
// (waited free), and stored from registers; dV still leaves by TMA.
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK:         mbarrier.wait(dq_empty.index(0), ((total - 0 + 1) // 2 - 1) & 1)
// CHECK-NEXT:    mbarrier.wait(dq_empty.index(1), ((total - 1 + 1) // 2 - 1) & 1)
// CHECK-NEXT:    halves = reinterpret_shared(dq_bufs, gl.float32, [BLOCK_M, HEAD_DIM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
// CHECK-NEXT:    halves.store(dk_1)
// CHECK:         dk_lo = halves.slice(0, ROT_HALF, dim=1).load(EPI_LAYOUT)
// CHECK-NEXT:    dk_hi = halves.slice(ROT_HALF, ROT_HALF, dim=1).load(EPI_LAYOUT)
// CHECK:         sin = sin * -1.0
// CHECK:         tl.store(dk_base + rows[:, None] * stride_dk_n + (ROT_HALF + cols_half)[None, :] * stride_dk_d, dk_hi_1.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK-NOT:     tma_store(dk_desc
// CHECK:         tma_store(dv_desc, [batch, kv_head, n_start, 0], v_smem)
attn.variant @rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Interleaved RoPE: dK's pairs are even and odd dims, loaded whole per thread from the staging
// buffers and split in registers (a layout change that moves nothing); they are stored at even
// and odd columns.
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK:         halves.store(dk_1)
// CHECK-NEXT:    thread_barrier()
// CHECK-NEXT:    pairs = halves.load(gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0]))
// CHECK-NEXT:    dk_lo, dk_hi = gl.split(gl.reshape(pairs, [BLOCK_M, ROT_HALF, 2]))
// CHECK-NEXT:    dk_lo = gl.convert_layout(dk_lo, EPI_LAYOUT, assert_trivial=True)
// CHECK-NEXT:    dk_hi = gl.convert_layout(dk_hi, EPI_LAYOUT, assert_trivial=True)
// CHECK-NOT:     halves.slice
// CHECK:         tl.store(dk_base + rows[:, None] * stride_dk_n + (2 * cols_half)[None, :] * stride_dk_d, dk_even.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK:         tl.store(dk_base + rows[:, None] * stride_dk_n + (2 * cols_half + 1)[None, :] * stride_dk_d, dk_odd.to(dk_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK-NOT:     tma_store(dk_desc
// CHECK:         tma_store(dv_desc, [batch, kv_head, n_start, 0], v_smem)
attn.variant @rope_interleaved_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64, interleaved} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64, interleaved} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// RoPE at call-time positions (a Hugging Face model's position_ids): the consumer takes the
// positions' pointers (the queries' are dQ's, in the finish kernel), and dK turns back at
// each key row's given position, loaded in the epilogue from the program's batch.
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK-SAME:    q_positions_ptr, stride_q_positions_b, stride_q_positions_n, k_positions_ptr, stride_k_positions_b, stride_k_positions_n,
// CHECK:         k_positions_base = k_positions_ptr + batch * stride_k_positions_b{{$}}
// CHECK-NOT:     q_positions_base
// CHECK:         # tile.rotate: RoPE at key positions, in fp32, pairs (dk_lo, dk_hi)
// CHECK-NEXT:    k_positions_rows = tl.load(k_positions_base + rows * stride_k_positions_n, mask=row_in_bounds, other=0)
// CHECK-NEXT:    table_rows = tl.abs(k_positions_rows)
// CHECK-NOT:     q_positions_base
// CHECK-LABEL: def attention_bwd_dkdv_dq(
attn.variant @rope_causal_positions(%q : !attn.query, %k : !attn.key, %v : !attn.value, %qp : !attn.positions<query>, %kp : !attn.positions<key>) -> !attn.output {
  %qr = attn.rope %q at %qp {theta = 1.000000e+04 : f64} : !attn.query, !attn.positions<query>
  %kr = attn.rope %k at %kp {theta = 1.000000e+04 : f64} : !attn.key, !attn.positions<key>
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// Soft-capping: its VJP reads the map's input (the scaled scores), which the probability step
// keeps as primal_1_0 before the map refines `scores`, and hands to the gradient step.
// CHECK-LABEL: def attention_bwd_dkdv_dq_probs(
// CHECK:         scores = scores * sm_scale
// CHECK-NEXT:    primal_1_0 = scores  # read in the gradient step
// CHECK-NEXT:    # tile.map over (scores), entry by entry
// CHECK-NEXT:    scores = (_tanh((scores / 20.0)) * 20.0)
// The map is not a mask: the full loop keeps lse's guard against rows with no finite score.
// CHECK:         elif (start_m >= bound_1) & (start_m < bound_2):
// CHECK:             lse_log2 = gl.where(lse_log2 == float("-inf"), float("inf"), lse_log2)
// CHECK:         return probs, primal_1_0
// CHECK-LABEL: def attention_bwd_dkdv_dq_grads(probs, grad_probs, delta, primal_1_0,
// CHECK:         entry_1 = _tanh((primal_1_0 / 20.0))
// CHECK-NEXT:    grad_scores = (grad_scores * (1.0 - (entry_1 * entry_1)))
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK:         probs, primal_1_0 = attention_bwd_dkdv_dq_probs(
// CHECK:         grad_scores = attention_bwd_dkdv_dq_grads(probs, grad_probs, delta, primal_1_0,
attn.variant @softcap(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %c = attn.softcap %s {cap = 2.000000e+01 : f64}
  %m = attn.mask %c [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
