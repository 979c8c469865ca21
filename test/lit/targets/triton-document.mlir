// RUN: attnfuse-opt %s -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64},fold-scale-into-exp,share-offsets' -t triton | filecheck %s
// Documents in Triton: the lists are indexed by (batch, head, the program's block); the ids
// by batch (a shared [Nk] has batch stride 0); partial tiles compare the query's and the
// key's ids after the band, in either grid's orientation.

// CHECK-LABEL: def attention_fwd(
// CHECK:         doc_ids_ptr, stride_doc_ids_b, stride_doc_ids_n,
// CHECK:         doc_ids_base = doc_ids_ptr + batch * stride_doc_ids_b
// CHECK-NEXT:    full_blocks_base = full_blocks_ptr + batch * stride_full_blocks_b + head * stride_full_blocks_h + block_id * stride_full_blocks_n
// CHECK:         for entry in range(0, full_count):
// CHECK-NOT:       tile.document_mask
// CHECK:         for entry in range(0, partial_count):
// CHECK:           keep = key_in_bounds[None, :] & (keys[None, :] <= q_pos[:, None])
// CHECK:           # tile.document_mask: keep pairs in one document (negative ids are padding)
// CHECK-NEXT:      doc_q = tl.load(doc_ids_base + q_pos * stride_doc_ids_n, mask=(q_pos >= 0) & (q_pos < n_k), other=-1)
// CHECK-NEXT:      doc_k = tl.load(doc_ids_base + keys * stride_doc_ids_n, mask=keys < n_k, other=-1)
// CHECK-NEXT:      keep_1 = (doc_q[:, None] == doc_k[None, :]) & (doc_k[None, :] >= 0)
// CHECK-NEXT:      scores_3 = tl.where(keep_1, scores_2, float("-inf"))

// dK/dV: program rows are keys, loop rows queries; the transposed lists are per query head.
// CHECK-LABEL: def attention_bwd_dkdv(
// CHECK:         for head_in_group in range(0, group_size):
// CHECK:           partial_q_blocks_base = partial_q_blocks_ptr + batch * stride_partial_q_blocks_b + head * stride_partial_q_blocks_h + block_id * stride_partial_q_blocks_n
// CHECK:             doc_q = tl.load(doc_ids_base + q_pos * stride_doc_ids_n, mask=(q_pos >= 0) & (q_pos < n_k), other=-1)
// CHECK-NEXT:        doc_k = tl.load(doc_ids_base + rows * stride_doc_ids_n, mask=rows < n_k, other=-1)
// CHECK-NEXT:        keep_1 = (doc_q[None, :] == doc_k[:, None]) & (doc_k[:, None] >= 0)
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}
