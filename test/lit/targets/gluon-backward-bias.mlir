// RUN: attnfuse-opt %S/../inputs/bias-variant.mlir -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{bwd-dq=ordered head-dim=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// The Gluon fused backward with an additive bias (lowering/gluon_backward.py). Both dK/dV
// kernels are scheduled: attention_bwd_dkdv_dq (the bias added to each step's scores) and
// attention_bwd_dkdv_dq_bias, which also stores dS as the full-size bias gradient. Each step's
// bias block is loaded right after the step's two products are issued (keys down, queries
// across, as the scores s^T are), so the loads run beside them.

// The load, in the scores' layout, with int64 offsets; outside the sequences it reads 0.
// CHECK-LABEL: def attention_bwd_dkdv_dq_load_bias(start_m, n_start, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, n_q, n_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK-NEXT:    batch = batch.to(tl.int64)
// CHECK-NEXT:    head = head.to(tl.int64)
// CHECK-NEXT:    rows = n_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_LAYOUT))
// CHECK:         bias_base = bias_ptr + batch * stride_bias_b + head * stride_bias_h
// CHECK:         bias_tile = tl.load(bias_base + queries[None, :] * stride_bias_n + rows[:, None] * stride_bias_d, mask=row_in_bounds[:, None] & query_in_bounds[None, :], other=0.0)
// CHECK-NEXT:    return bias_tile

// The step adds it after the scale, before the masks (one step for both loops).
// CHECK-LABEL: def attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, n_start, bound_1, sm_scale, n_q, n_k, bias_tile,
// CHECK:         scores = scores * sm_scale
// CHECK-NEXT:    # tile.add_bias: bias[batch, head, query, key], loaded beside the block's product
// CHECK-NEXT:    scores = scores + bias_tile.to(tl.float32)
// CHECK-NEXT:    if start_m < bound_1:

// The plain kernel stores no gradient.
// CHECK-LABEL: def attention_bwd_dkdv_dq_grads(probs, grad_probs, delta, start_m, n_start, bound_1, sm_scale, n_q, n_k, BLOCK_M
// CHECK-NOT:     tl.store
// CHECK:         return grad_scores

// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(
// CHECK:         scores = warpgroup_mma(k_tile, q_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
// CHECK-NEXT:    grad_probs = warpgroup_mma(v_tile, do_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
// CHECK-NEXT:    bias_tile = attention_bwd_dkdv_dq_load_bias(start_m, n_start, batch, head, bias_ptr, stride_bias_b, stride_bias_h, stride_bias_n, stride_bias_d, n_q, n_k, BLOCK_M, BLOCK_N, S_LAYOUT)
// CHECK:         probs = attention_bwd_dkdv_dq_probs(scores, lse_log2, start_m, n_start, bound_1, sm_scale, n_q, n_k, bias_tile, BLOCK_M, BLOCK_N, S_LAYOUT)

// The bias-gradient kernel: the gradient step stores dS^T at (query, key) = (column, row),
// masked by both sequence ends in both loops, so the loops' steps stay one.
// CHECK-LABEL: def attention_bwd_dkdv_dq_bias_grads(probs, grad_probs, delta, start_m, n_start, bound_1, sm_scale, n_q, n_k, batch, head, dbias_ptr, stride_dbias_b, stride_dbias_h, stride_dbias_n, stride_dbias_d,
// CHECK:         grad_scores = probs * (grad_probs - delta[None, :])
// CHECK-NEXT:    # tile.store_scores: dbias[batch, head, query, key] for this block
// CHECK-NEXT:    dbias_base = dbias_ptr + batch.to(tl.int64) * stride_dbias_b + head.to(tl.int64) * stride_dbias_h
// CHECK-NEXT:    tl.store(dbias_base + queries[None, :] * stride_dbias_n + rows[:, None] * stride_dbias_d, grad_scores.to(dbias_ptr.dtype.element_ty), mask=row_in_bounds[:, None] & query_in_bounds[None, :])
// CHECK-NEXT:    return grad_scores
// CHECK-LABEL: def attention_bwd_dkdv_dq_bias_consume(
// CHECK:         grad_scores = attention_bwd_dkdv_dq_bias_grads(probs, grad_probs, delta, start_m, n_start, bound_1, sm_scale, n_q, n_k, batch, head, dbias_ptr, stride_dbias_b, stride_dbias_h, stride_dbias_n, stride_dbias_d, BLOCK_M, BLOCK_N, S_LAYOUT)
// The entry takes the bias's and its gradient's pointers after dk's and the counters'.
// CHECK-LABEL: def attention_bwd_dkdv_dq_bias(
// CHECK:         dq_order_ptr,
// CHECK:         bias_ptr,
// CHECK:         dbias_ptr,
// CHECK:         sm_scale,
