// RUN: attnfuse-opt %s --split-input-file -p 'canonicalize-attn,analyze-masks,place-rope,lower-to-tile{head-dim=64}' | filecheck %s

// Documents under causal: every kernel walks the runtime's block lists (full tiles, then
// partial ones), reads doc_ids, and tests the documents only in partial tiles, after the band.
// CHECK-LABEL: tile.kernel @attention_fwd(
// CHECK-SAME:    %doc_ids: !tile.tensor<doc_ids>, %full_blocks: !tile.tensor<full_blocks>, %full_count: !tile.tensor<full_count>, %partial_blocks: !tile.tensor<partial_blocks>, %partial_count: !tile.tensor<partial_count>)
// CHECK:         tile.sparse_kv_loop %full_blocks, %full_count iter_args
// CHECK-NOT:       tile.document_mask
// CHECK:         tile.sparse_kv_loop %partial_blocks, %partial_count masked
// CHECK:           %[[M:.*]] = tile.mask %{{.*}} {band = #attn.band<upper = 0>}
// CHECK-NEXT:      tile.document_mask %[[M]], %doc_ids : !tile.tile<m x n x f32>, !tile.tensor<doc_ids>
// CHECK:         tile.softmax_finalize
// The dQ kernel walks the same lists; dK/dV walks the transposed ones.
// CHECK-LABEL: tile.kernel @attention_bwd_dq_delta(
// CHECK:         tile.sparse_kv_loop %partial_blocks, %partial_count masked
// CHECK:           tile.document_mask
// CHECK-LABEL: tile.kernel @attention_bwd_dkdv(
// CHECK-SAME:    %doc_ids: !tile.tensor<doc_ids>, %full_q_blocks: !tile.tensor<full_q_blocks>
// CHECK:         tile.sparse_q_loop %full_q_blocks, %full_q_count iter_args
// CHECK-NOT:       tile.document_mask
// CHECK:         tile.sparse_q_loop %partial_q_blocks, %partial_q_count masked
// CHECK:           tile.document_mask
attn.variant @doc(%q : !attn.query, %k : !attn.key, %v : !attn.value, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %m = attn.mask %d [#attn.causal]
  %p = attn.softmax %m
  %o = attn.pv %p, %v
  attn.yield %o
}

// -----

// With a block-sparse layout too: one set of lists (the runtime intersects both filters'
// tiles), and the document test in partial tiles; the bias is added before any filter.
// CHECK-LABEL: tile.kernel @attention_fwd(
// CHECK-SAME:    %bias: !tile.tensor<bias>, %doc_ids: !tile.tensor<doc_ids>, %full_blocks: !tile.tensor<full_blocks>
// CHECK:         tile.sparse_kv_loop %partial_blocks, %partial_count masked
// CHECK:           %[[B:.*]] = tile.add_bias
// CHECK-NEXT:      %[[M:.*]] = tile.mask %[[B]]
// CHECK-NEXT:      tile.document_mask %[[M]], %doc_ids
attn.variant @both(%q : !attn.query, %k : !attn.key, %v : !attn.value, %bias : !attn.bias, %layout : !attn.layout, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %l = attn.block_sparse %d, %layout {block_size = 64 : i64}
  %b = attn.add_bias %l, %bias
  %p = attn.relu %b
  %o = attn.pv %p, %v
  attn.yield %o
}
