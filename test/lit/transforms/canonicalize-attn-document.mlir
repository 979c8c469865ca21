// RUN: attnfuse-opt %s -p canonicalize-attn | filecheck %s

// attn.document is a filter of rank 102: it sinks below every modifier and after the band
// mask (100) and a block-sparse layout (101), wherever it was written.
// CHECK-LABEL: attn.variant @order
// CHECK:         %[[S:.*]] = attn.scores
// CHECK-NEXT:    %[[A:.*]] = attn.alibi %[[S]]
// CHECK-NEXT:    %[[M:.*]] = attn.mask %[[A]] [#attn.causal]
// CHECK-NEXT:    %[[L:.*]] = attn.block_sparse %[[M]], %layout {block_size = 32 : i64}
// CHECK-NEXT:    %[[D:.*]] = attn.document %[[L]], %doc_ids
// CHECK-NEXT:    attn.softmax %[[D]]
attn.variant @order(%q : !attn.query, %k : !attn.key, %v : !attn.value, %layout : !attn.layout, %doc_ids : !attn.doc_ids) -> !attn.output {
  %s = attn.scores %q, %k
  %d = attn.document %s, %doc_ids
  %l = attn.block_sparse %d, %layout {block_size = 32 : i64}
  %m = attn.mask %l [#attn.causal]
  %a = attn.alibi %m
  %p = attn.softmax %a
  %o = attn.pv %p, %v
  attn.yield %o
}
