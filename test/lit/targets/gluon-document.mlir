// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=128 element-type=bf16 backward=false block-m=128 block-n=128},fold-scale-into-exp,warp-specialize' -t gluon | filecheck %s
// A document forward on the Gluon target: its key loops walk the document lists (full
// blocks, which one document fills, then partial ones) as one pipelined range of steps, as a
// block-sparse kernel's do (gluon-block-sparse.mlir). tile.document_mask is a filter of the
// partial blocks, like the causal mask: the step runs both only from the partial list's
// first entry on (step >= bound_1), on ids read through the sequence's base, which the
// consumer points at its batch. The scale is folded through both filters into the
// exponential, in every step alike.

// CHECK:      def attention_fwd_step(scores, row_max, row_sum, start_n, step, row_start, bound_1, sm_scale, n_q, n_k, doc_ids_base, stride_doc_ids_n, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, S_LAYOUT: gl.constexpr):
// CHECK-NOT:      scores = scores * sm_scale
// CHECK:          if step >= bound_1:
// CHECK-NEXT:         # tile.mask: keep keys in q_pos + [None, 0] and inside the sequence
// CHECK-NEXT:         keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None])
// CHECK-NEXT:         scores = tl.where(keep, scores, float("-inf"))
// CHECK-NEXT:         # tile.document_mask: keep pairs in one document (negative ids are padding)
// CHECK-NEXT:         doc_q = tl.load(doc_ids_base + q_pos * stride_doc_ids_n, mask=(q_pos >= 0) & (q_pos < n_k), other=-1)
// CHECK-NEXT:         doc_k = tl.load(doc_ids_base + keys * stride_doc_ids_n, mask=keys < n_k, other=-1)
// CHECK-NEXT:         keep_1 = (doc_q[:, None] == doc_k[None, :]) & (doc_k[None, :] >= 0)
// CHECK-NEXT:         scores = tl.where(keep_1, scores, float("-inf"))
// CHECK-NEXT:     # tile.softmax_update
// CHECK-NEXT:     row_max_new = tl.maximum(row_max, tl.max(scores, 1) * (sm_scale * 1.4426950408889634))
// CHECK:      def attention_fwd_consume(o_desc, lse_ptr, stride_lse_b, stride_lse_h, stride_lse_n, doc_ids_ptr, stride_doc_ids_b, stride_doc_ids_n,
// CHECK:          row_start = q_start + WG * ROWS
// CHECK-NEXT:     doc_ids_base = doc_ids_ptr + batch * stride_doc_ids_b
// CHECK:          probs, alpha, row_max, row_sum = attention_fwd_step(scores, row_max, row_sum, start_n, step, row_start, bound_1, sm_scale, n_q, n_k, doc_ids_base, stride_doc_ids_n, ROWS, BLOCK_N, S_LAYOUT)
// CHECK:      def attention_fwd(
// CHECK:          doc_ids_ptr,
// CHECK-NEXT:     stride_doc_ids_b,
// CHECK-NEXT:     stride_doc_ids_n,
// CHECK:          BLOCK_M: gl.constexpr = 128,
// CHECK-NEXT:     BLOCK_N: gl.constexpr = 128,
// CHECK:          CONSUMERS: gl.constexpr = 2,
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
