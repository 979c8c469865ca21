// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope{query=fused key=fused},lower-to-tile{bwd-dq=fused bwd-block-m=64 bwd-block-n=32},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// The Triton of the fused backward (bwd-dq=fused) for causal RoPE (pre-rotated q and k). In
// the dK/dV kernel's loop over the GQA group's query heads, dq_acc's base moves with the
// query head (as q's and do's do); each block pair's dQ part (dS^T)^T K, rounded to K's type
// for the product, is added into dq_acc's loop rows with relaxed atomics, masked on ragged
// query rows in the partial blocks only. The finish kernel scales dq_acc once (fold-scale
// leaves the scale to it: dq_acc holds dS K of unscaled scores), rotates back and stores dQ.

// CHECK-LABEL: def attention_bwd_dkdv_dq(
// CHECK:         dq_acc_ptr, stride_dq_acc_b, stride_dq_acc_h, stride_dq_acc_n, stride_dq_acc_d,
// CHECK:         for head_in_group in range(0, group_size):
// CHECK-NEXT:      head = kv_head * group_size + head_in_group
// CHECK:           dq_acc_base = dq_acc_ptr + batch * stride_dq_acc_b + head * stride_dq_acc_h
// CHECK:             dq_part = tl.dot(tl.trans(grad_scores.to(k.dtype)), k)
// CHECK-NEXT:        # tile.store_add: added into dq_acc rows (loop), all columns (atomics: unordered)
// CHECK-NEXT:        tl.atomic_add(dq_acc_base + queries[:, None] * stride_dq_acc_n + (cols_d)[None, :] * stride_dq_acc_d, dq_part, mask=query_in_bounds[:, None], sem="relaxed")
// CHECK:             dq_part_1 = tl.dot(tl.trans(grad_scores_1.to(k.dtype)), k)
// CHECK:             tl.atomic_add(dq_acc_base + queries[:, None] * stride_dq_acc_n + (cols_d)[None, :] * stride_dq_acc_d, dq_part_1, sem="relaxed")
// CHECK:             tl.atomic_add({{.*}}, dq_part_2, mask=query_in_bounds[:, None], sem="relaxed")
// CHECK:         dk_1 = dk * sm_scale
// CHECK-LABEL: def attention_bwd_dq_finish(
// CHECK-NEXT:    dq_acc_ptr, stride_dq_acc_b, stride_dq_acc_h, stride_dq_acc_n, stride_dq_acc_d,
// CHECK-NEXT:    dq_ptr, stride_dq_b, stride_dq_h, stride_dq_n, stride_dq_d,
// CHECK-NEXT:    rope_table_ptr,
// CHECK:         dq_acc = tl.load(dq_acc_base + rows[:, None] * stride_dq_acc_n + (cols_d)[None, :] * stride_dq_acc_d, mask=row_in_bounds[:, None], other=0.0)
// CHECK-NEXT:    # tile.apply_scale: times the score scale (sm_scale)
// CHECK-NEXT:    dq = dq_acc * sm_scale
// CHECK:         tl.store(dq_base + rows[:, None] * stride_dq_n + (cols_half)[None, :] * stride_dq_d, dq_lo_1.to(dq_ptr.dtype.element_ty), mask=row_in_bounds[:, None])
// CHECK-NOT:   def attention_bwd_dq(
attn.variant @rope_causal(%q : !attn.query, %k : !attn.key, %v : !attn.value) -> !attn.output {
  %qr = attn.rope %q {theta = 1.000000e+04 : f64} : !attn.query
  %kr = attn.rope %k {theta = 1.000000e+04 : f64} : !attn.key
  %s = attn.scores %qr, %kr
  %m = attn.mask %s [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
