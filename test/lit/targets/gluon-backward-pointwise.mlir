// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{bwd-dq=fused head-dim=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// RUN: sed 's/attn.relu/attn.sigmoid/' %s | attnfuse-opt -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{bwd-dq=ordered head-dim=64},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s --check-prefix=SIGMOID
// The Gluon target's fused backward under a pointwise normalizer (dialects/backward_shape.py):
// no row statistics anywhere (no lse or delta descriptors, buffers or loads); the probability
// step ends in the normalizer's op, the gradient step starts with its derivative.

// ReLU under a causal band: the derivative reads the refined scores (after the mask), which
// the probability step keeps as primal_0_0 after the masked loops' mask, in a piece that every
// loop shares, and hands to the gradient step.
// CHECK-LABEL: def attention_bwd_dkdv_dq_probs(scores, start_m, n_start,
// CHECK:         scores = scores * sm_scale
// CHECK-NEXT:    if (start_m < bound_1) | (start_m >= bound_2):
// CHECK:             scores = tl.where(keep, scores, float("-inf"))
// CHECK-NEXT:    primal_0_0 = scores  # read in the gradient step
// CHECK-NEXT:    # tile.relu_probs: relu(s) / Nk (dropped keys are -inf: weight 0)
// CHECK-NEXT:    probs = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL) / n_k
// CHECK-NEXT:    return probs, primal_0_0
// CHECK-LABEL: def attention_bwd_dkdv_dq_grads(probs, grad_probs, primal_0_0, start_m,
// CHECK:         # tile.relu_grad: dS = dP / Nk where s > 0
// CHECK-NEXT:    grad_scores = tl.where(primal_0_0 > 0.0, grad_probs, 0.0) / n_k
// CHECK-NEXT:    return grad_scores
// CHECK-LABEL: def attention_bwd_dkdv_dq_load(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_bar,
// CHECK:         step_bytes: gl.constexpr = (q_desc.block_type.nbytes + do_desc.block_type.nbytes)
// CHECK-NOT:     {{\blse|\bdelta}}
// CHECK:         tma_load(do_desc, [batch, head, start_m, 0], ready.index(stage), do_bufs.index(stage))
// CHECK-NOT:     {{\blse|\bdelta}}
// CHECK-LABEL: def attention_bwd_dkdv_dq_consume(dk_desc, dv_desc, dk_ptr, stride_dk_b, stride_dk_h, stride_dk_n, stride_dk_d, k_smem, v_smem, q_bufs, do_bufs, ds_smem,
// CHECK-NOT:     {{\blse|\bdelta}}
// CHECK:         probs, primal_0_0 = attention_bwd_dkdv_dq_probs(scores, start_m,
// CHECK-NEXT:    # tile.accumulate: dV += p^T dO
// CHECK-NEXT:    p_op = gl.convert_layout(probs.to(dtype), A_LAYOUT)
// CHECK-NEXT:    dv = warpgroup_mma(p_op, do_s, dv, is_async=True)
// CHECK-NEXT:    grad_probs = warpgroup_mma_wait(1, deps=(grad_probs,))
// CHECK-NEXT:    grad_scores = attention_bwd_dkdv_dq_grads(probs, grad_probs, primal_0_0, start_m,
// CHECK-NOT:     {{\blse|\bdelta}}
// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK-NEXT:    q_desc,
// CHECK-NEXT:    k_desc,
// CHECK-NEXT:    v_desc,
// CHECK-NEXT:    do_desc,
// CHECK-NEXT:    dk_desc,
// CHECK-NEXT:    dv_desc,
// CHECK-NEXT:    dq_acc_desc,
// CHECK-NEXT:    dk_ptr,
// CHECK-NOT:     {{\blse|\bdelta}}
// CHECK:         (attention_bwd_dkdv_dq_load, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_bufs, do_bufs, kv_bar,

// Sigmoid, ordered adds, head dim 64: the derivative is a map of p^T and dP^T, so nothing but
// p^T crosses from one step to the other; sigmoid(s - ln(Nk)) reads its seq_len scalar in the
// probability step.
// SIGMOID-LABEL: def attention_bwd_dkdv_dq_probs(scores, start_m,
// SIGMOID:         num_keys = n_k * 1.0
// SIGMOID-NEXT:    # tile.map over (scores, num_keys), entry by entry
// SIGMOID-NEXT:    probs = (1.0 / (1.0 + tl.exp((-(scores + (-tl.log(num_keys)))))))
// SIGMOID-NEXT:    return probs
// SIGMOID-LABEL: def attention_bwd_dkdv_dq_grads(probs, grad_probs, start_m,
// SIGMOID:         grad_scores = (grad_probs * (probs * (1.0 - probs)))
// SIGMOID-NEXT:    return grad_scores
// SIGMOID-LABEL: def attention_bwd_dkdv_dq_dq_write(
// SIGMOID:         while gl.atomic_add(counter, 0, sem="acquire") != block_id:
// SIGMOID-LABEL: def attention_bwd_dkdv_dq(
// SIGMOID-NOT:     {{\blse|\bdelta}}
// SIGMOID:       ], [1, 1, 1], [24, 24, 24])
attn.variant @relu_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %s = attn.scores %q, %k
  %m = attn.mask %s [#attn.causal]
  %p = attn.relu %m
  %o = attn.pv %p, %v
  attn.yield %o
}
